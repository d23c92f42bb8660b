"""hl.WaitSet: the prepared wait_any / wait_all over fences and timeline points of
one domain (issue 27's "wait_any over 8 objects" at the cost of one call).  Each
test fails on the code before WaitSet existed (AttributeError: no hl.WaitSet)."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid

import pytest

import hostless as hl
from conftest import SLACK, kill_child, read_line, spawn_child
from hostless import Status


@pytest.fixture
def dom():
    d = hl.Domain.create(f"hl_ws_{uuid.uuid4().hex[:8]}", watchdog_interval=0.02, unlink_on_close=True)
    yield d
    assert d.check() == []
    d.close()


def test_any_mix_of_fences_points_and_merges(dom):
    f, t = dom.fence(), dom.timeline()
    m = dom.merge([t.point(3), dom.fence()])
    ws = hl.WaitSet([f, t.point(2), m])
    assert len(ws) == 3 and ws.objs == [f, t.point(2), m]
    with pytest.raises(TimeoutError, match="none of 3 objects completed within 0.02 s"):
        ws.wait_any(timeout=0.02)
    assert [ws.status(i) for i in range(3)] == [Status.ACTIVE] * 3
    threading.Timer(0.05, t.signal, (2,)).start()
    i = ws.wait_any(5)
    assert i == 1 and type(i) is int and ws.status(1) == Status.SUCCESS
    c = ws.completed(1)
    assert (c.index, c.obj, c.status, c.ok) == (1, t.point(2), Status.SUCCESS, True)
    f.signal(Status.ERROR)
    assert ws.wait_any(timeout=1) == 0  # the first complete one in the set's order
    assert ws.status(0) == Status.ERROR and not ws.completed(-3).ok
    m.release()


def test_set_value_moves_a_point(dom):
    t, f = dom.timeline(), dom.fence()
    ws = hl.WaitSet([f, t.point(1)])
    for v in range(1, 50):
        ws.set_value(1, v)
        assert ws.value(1) == v and ws.objs[1] == t.point(v)
        with pytest.raises(TimeoutError):
            ws.wait_any(timeout=0)
        t.signal(v)
        assert ws.wait_any(timeout=1) == 1
    assert ws.value(0) == 0
    with pytest.raises(ValueError, match="fence"):
        ws.set_value(0, 3)
    with pytest.raises(ValueError, match="2\\*\\*62"):
        ws.set_value(1, 1 << 62)
    with pytest.raises(ValueError, match="2\\*\\*62"):
        ws.set_value(1, -1)
    with pytest.raises(TypeError):
        ws.set_value(1, True)
    with pytest.raises(IndexError):
        ws.set_value(2, 1)
    with pytest.raises(IndexError):
        ws.status(-3)
    assert ws.value(1) == 49  # nothing moved by the failures


def test_wait_all(dom):
    f, t = dom.fence(), dom.timeline()
    ws = hl.WaitSet([f, t.point(2)])
    f.signal()
    with pytest.raises(TimeoutError, match="1 of 2 objects completed within 0.02 s"):
        ws.wait_all(timeout=0.02)
    threading.Timer(0.05, t.fail, (Status.ERROR,)).start()
    assert ws.wait_all(timeout=5) is None
    assert [ws.status(0), ws.status(1)] == [Status.SUCCESS, Status.ERROR]


def test_agrees_with_wait_any_on_random_states(dom):
    """The index wait_any's one-call path picks and its status, on random mixes and states."""
    rng = random.Random(7)
    for _ in range(60):
        objs: list[hl.Waitable] = []
        for _k in range(rng.randint(1, 9)):
            if rng.random() < 0.5:
                f = dom.fence()
                if rng.random() < 0.3:
                    f.signal(rng.choice([Status.SUCCESS, Status.ERROR, Status.CANCEL]))
                objs.append(f)
            else:
                t = dom.timeline(rng.randint(0, 3))
                if rng.random() < 0.2:
                    t.fail(Status.ERROR)
                objs.append(t.point(rng.randint(1, 4)))
        ws = hl.WaitSet(objs)
        try:
            ref = hl.wait_any(objs, timeout=0)
        except TimeoutError:
            with pytest.raises(TimeoutError):
                ws.wait_any(timeout=0)
        else:
            i = ws.wait_any(timeout=0)
            assert (i, ws.status(i)) == (ref.index, ref.status)
            assert ws.completed(i) == ref
        for o in objs:
            (o if isinstance(o, hl.Fence) else o.timeline).release()


def test_bad_input(dom):
    other = hl.Domain.create(f"hl_ws2_{uuid.uuid4().hex[:8]}", unlink_on_close=True)
    try:
        t = dom.timeline()
        with pytest.raises(ValueError, match="nothing to wait for"):
            hl.WaitSet([])
        with pytest.raises(TypeError, match="point"):
            hl.WaitSet([t])
        with pytest.raises(TypeError):
            hl.WaitSet([object()])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="one domain"):
            hl.WaitSet([t.point(1), other.fence()])
        with pytest.raises(ValueError, match="at most 127"):
            hl.WaitSet([t.point(v) for v in range(128)])
        f = dom.fence()
        f.release()
        with pytest.raises(hl.InvalidHandle):
            hl.WaitSet([f])
        ws = hl.WaitSet([t.point(1)])
        for bad, exc in ((-1, ValueError), (float("nan"), ValueError), ("1", TypeError)):
            with pytest.raises(exc):
                ws.wait_any(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            ws.wait_any(1, 2)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            ws.wait_any(tmo=1)  # type: ignore[call-arg]
    finally:
        other.close()


def test_a_released_object_is_invalid_handle_not_a_reused_slot(dom):
    f, g = dom.fence(), dom.fence()
    ws = hl.WaitSet([f, g])
    g.release()
    for _ in range(20):  # the slot may be reused meanwhile: the set must not wait on it
        dom.fence().signal()
    with pytest.raises(hl.InvalidHandle, match="object 1 of the WaitSet"):
        ws.wait_any(timeout=0)
    with pytest.raises(hl.InvalidHandle):
        ws.wait_all(timeout=0)
    with pytest.raises(hl.InvalidHandle):
        ws.status(0)
    f.signal()
    assert f.wait(0) == Status.SUCCESS


def test_closed_domain(dom):
    other = hl.Domain.create(f"hl_ws3_{uuid.uuid4().hex[:8]}", unlink_on_close=True)
    ws = hl.WaitSet([other.fence()])
    other.close()
    with pytest.raises((hl.DomainClosed, hl.InvalidHandle)):
        ws.wait_any(timeout=0)


def test_ctrl_c(dom):
    ws = hl.WaitSet([dom.fence(), dom.timeline().point(1)])
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        ws.wait_any()
    assert time.monotonic() - t0 < 2
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        ws.wait_all()


def test_signalled_by_another_process(dom):
    """Round trips with a peer that signals a timeline; the set follows it with set_value."""
    t = dom.timeline()
    idle = [dom.fence() for _ in range(7)]
    child = spawn_child(
        """
        d = hl.Domain.open(sys.argv[1], watchdog_interval=0)
        t = d.import_timeline(int(sys.argv[2]))
        print("ready", flush=True)
        for i in range(1, 201):
            t.signal(i)
        print("done", flush=True)
        d.close()
        """,
        dom.name,
        t.handle,
    )
    try:
        assert read_line(child) == "ready"
        ws = hl.WaitSet([*idle, t.point(1)])
        for i in range(1, 201):
            ws.set_value(7, i)
            assert ws.wait_any(timeout=SLACK) == 7
        assert read_line(child) == "done"
        assert child.wait(SLACK) == 0
    finally:
        kill_child(child)


def test_peer_killed_wakes_the_set_with_owner_died(dom):
    """SIGKILL of the owner of every object of the set: the sleeping wait_any wakes with one of
    them (OWNER_DIED, from recovery) well before its timeout; wait_all returns too."""
    child = spawn_child(
        """
        d = hl.Domain.open(sys.argv[1], watchdog_interval=0)
        f, t = d.fence(), d.timeline(5)
        print(f.handle, t.handle, flush=True)
        time.sleep(60)
        """,
        dom.name,
    )
    try:
        fh, th = map(int, read_line(child).split())
        f, t = dom.import_fence(fh), dom.import_timeline(th)
        ws = hl.WaitSet([t.point(6), f])
        got: list[object] = []

        def wait() -> None:
            try:
                got.append(ws.wait_any(timeout=30))
            except BaseException as e:  # noqa: BLE001 (reported by the assert below)
                got.append(e)

        th_ = threading.Thread(target=wait)
        th_.start()
        time.sleep(0.1)
        t_kill = time.monotonic()
        kill_child(child)
        th_.join(30)
        assert got and got[0] in (0, 1), got
        assert time.monotonic() - t_kill < SLACK
        assert ws.wait_all(timeout=SLACK) is None
        assert (ws.status(0), ws.status(1)) == (Status.OWNER_DIED, Status.OWNER_DIED)
        f.release()
        t.release()
        dom.reap()
    finally:
        kill_child(child)


def test_point_checks_on_its_fast_path(dom):
    """Timeline.point and Point() build without their full checks when the value is a plain int
    in range: everything else still gets the checks' errors."""
    t = dom.timeline()
    assert t.point(5) == hl.Point(t, 5) and t.point(5).timeline is t
    assert t.point((1 << 62) - 1).value == (1 << 62) - 1
    bads = ((-1, ValueError), (1 << 62, ValueError), (True, TypeError), (1.0, TypeError), ("1", TypeError))
    for bad, exc in bads:
        with pytest.raises(exc):
            t.point(bad)  # type: ignore[arg-type]
        with pytest.raises(exc):
            hl.Point(t, bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on a Timeline"):
        hl.Point(dom.fence(), 1)  # type: ignore[arg-type]

    class Big(int):
        pass

    assert hl.Point(t, Big(3)).value == 3  # an int subclass: accepted, as before
    with pytest.raises(AttributeError):
        t.point(1).value = 2  # type: ignore[misc]
