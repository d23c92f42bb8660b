"""hl.wait_any / hl.wait_all as one C call (binding/waits.c) and Point's C base
(binding/point.c): the plain call over a list or tuple of Fences and Points of one
domain reads the objects from their structs and waits in the engine; anything else
takes the Python general path.  Each test says whether it fails on the code before
(ddc1902^) or covers the new path (the same answers as the general path)."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import uuid
import weakref

import pytest

import hostless as hl
from hostless import Status


@pytest.fixture
def dom():
    d = hl.Domain.create(f"hl_w1_{uuid.uuid4().hex[:8]}", unlink_on_close=True)
    yield d
    assert d.check() == []
    d.close()


# ------------------------------------------------------------ bad input
def test_an_object_that_only_looks_like_a_point_is_refused(dom):
    """Fails on the old code: its one-call path took any object with ``timeline`` and
    ``value`` attributes (a getattr each) and waited on it, where the general path and the
    docs say TypeError for what is not a Fence or Point."""
    t = dom.timeline(5)

    class Duck:
        timeline = t
        value = 1

    for fn in (hl.wait_any, hl.wait_all):
        with pytest.raises(TypeError, match="expected a Fence or a timeline Point"):
            fn([Duck()], timeout=0)
        with pytest.raises(TypeError, match="expected a Fence or a timeline Point"):
            fn([dom.fence(), Duck()], timeout=0)


def test_timeline_point_on_what_is_not_a_timeline(dom):
    """Fails on the old code: Timeline.point's fast path checked the value only, so
    ``hl.Timeline.point(fence, 1)`` made a Point on a Fence."""
    f = dom.fence()
    with pytest.raises(TypeError, match="on a Timeline"):
        hl.Timeline.point(f, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on a Timeline"):
        hl.Point(timeline=f, value=1)  # type: ignore[arg-type]
    t = dom.timeline()
    assert hl.Point(timeline=t, value=3) == t.point(value=3) == t.point(3)
    with pytest.raises(TypeError):
        t.point()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        t.point(1, 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        t.point(val=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("fn", [hl.wait_any, hl.wait_all])
def test_bad_input_each_kind(dom, fn):
    """Covers the new path's hand-over: every kind of bad input gets the general path's
    error (the one-call path takes none of them)."""
    t, f = dom.timeline(), dom.fence()
    with pytest.raises(ValueError, match="nothing to wait for"):
        fn([])
    with pytest.raises(ValueError, match="nothing to wait for"):
        fn(())
    for bad in (1, None, "f", t):
        with pytest.raises(TypeError):
            fn([f, bad], timeout=0)
    g = dom.fence()
    g.release()
    with pytest.raises(hl.InvalidHandle):
        fn([f, g], timeout=0)
    t2 = dom.timeline()
    p = t2.point(1)
    t2.release()
    with pytest.raises(hl.InvalidHandle):
        fn((f, p), timeout=0)
    for bad_t, exc in ((-1, ValueError), (float("nan"), ValueError), ("1", TypeError)):
        with pytest.raises(exc):
            fn([f, t.point(1)], timeout=bad_t)
    with pytest.raises(TypeError):
        fn([f], 1, 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        fn([f], timeot=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        fn([f], 1, timeout=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        fn()  # type: ignore[call-arg]


@pytest.mark.parametrize("fn", [hl.wait_any, hl.wait_all])
def test_closed_domain(fn):
    """A closed domain is DomainClosed on the new path as on the general path."""
    d = hl.Domain.create(f"hl_w1c_{uuid.uuid4().hex[:8]}", unlink_on_close=True)
    f, t = d.fence(), d.timeline(3)
    objs = [f, t.point(1)]
    d.close()
    with pytest.raises(hl.DomainClosed):
        fn(objs, timeout=0)
    with pytest.raises(hl.DomainClosed):
        fn(tuple(objs), timeout=0)


# ------------------------------------------------------------ the same answers
def test_tuple_and_keywords_take_the_one_call_path(dom):
    """Covers the new path: a tuple (the old one-call path took lists only) and keyword
    arguments give what a list gives."""
    f, t = dom.fence(), dom.timeline(2)
    objs = (f, t.point(3), t.point(2))
    r = hl.wait_any(objs, timeout=0)
    assert type(r) is hl.Completed and tuple(r) == (2, objs[2], Status.SUCCESS)
    assert hl.wait_any(objs=objs, timeout=0) == hl.wait_any(list(objs), 0) == r
    f.signal(Status.ERROR)
    t.signal(3)
    res = hl.wait_all(objs=objs, timeout=1)
    assert [tuple(c) for c in res] == [
        (0, f, Status.ERROR),
        (1, objs[1], Status.SUCCESS),
        (2, objs[2], Status.SUCCESS),
    ]
    assert all(type(c) is hl.Completed for c in res) and type(res) is list


def test_duplicates(dom):
    """Covers the new path: the same object several times is waited on as listed."""
    f, t = dom.fence(), dom.timeline()
    p = t.point(2)
    objs = [p, f, p, f, t.point(2)]
    with pytest.raises(TimeoutError, match="none of 5"):
        hl.wait_any(objs, timeout=0.01)
    f.signal()
    assert hl.wait_any(objs, timeout=1).index == 1
    with pytest.raises(
        TimeoutError, match=r"2 of 5 objects completed within 0.01 s \(the first pending: index 0\)"
    ):
        hl.wait_all(objs, timeout=0.01)
    t.signal(2)
    assert hl.wait_any(objs, timeout=1).index == 0
    assert [(c.index, c.obj, c.status) for c in hl.wait_all(objs, timeout=1)] == [
        (i, o, Status.SUCCESS) for i, o in enumerate(objs)
    ]


def test_mixed_domains_and_many_objects(dom):
    """Covers the hand-over: objects of two domains, or more than one engine wait holds,
    go to the general path and give the same answers."""
    other = hl.Domain.create(f"hl_w1o_{uuid.uuid4().hex[:8]}", unlink_on_close=True)
    try:
        f, g, t = dom.fence(), other.fence(), other.timeline()
        objs = (f, g, t.point(1))
        threading.Timer(0.05, t.signal, (1,)).start()
        assert hl.wait_any(objs, timeout=5).index == 2
        f.signal()
        g.signal(Status.CANCEL)
        assert [c.status for c in hl.wait_all(objs, timeout=5)] == [
            Status.SUCCESS,
            Status.CANCEL,
            Status.SUCCESS,
        ]
        many = tuple(dom.fence() for _ in range(200))
        many[199].signal()
        assert hl.wait_any(many, timeout=1).index == 199
        for m in many[:199]:
            m.signal()
        assert len(hl.wait_all(many, timeout=1)) == 200
    finally:
        other.close()


def test_wait_all_list_changed_during_the_wait(dom):
    """Covers the new path: wait_all keeps the objects it waits on while the GIL is
    released; the list cleared meanwhile changes nothing in the answer."""
    f0, f1 = dom.fence(), dom.fence()
    objs: list[hl.Fence] = [f0, f1]
    f0.signal()

    def change() -> None:
        objs.clear()
        f1.signal(Status.ERROR)

    threading.Timer(0.05, change).start()
    res = hl.wait_all(objs, timeout=5)
    assert [(c.index, c.obj, c.status) for c in res] == [(0, f0, Status.SUCCESS), (1, f1, Status.ERROR)]


def test_wait_all_ctrl_c(dom):
    """Covers the new path: Ctrl-C ends hl.wait_all's one call within a few ms."""
    f = dom.fence()
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        hl.wait_all([dom.timeline().point(1), f])
    assert time.monotonic() - t0 < 2


def test_wait_released_by_another_thread_during_the_wait(dom):
    """Covers the new path: a fence released while the wait sleeps is InvalidHandle or
    CANCEL (the last reference's release cancels it), never a hang or a wait on a reused slot."""
    for fn in (hl.wait_any, hl.wait_all):
        f = dom.fence()
        threading.Timer(0.05, f.release).start()
        try:
            r = fn([f], timeout=5)
        except hl.InvalidHandle:
            pass
        else:
            c = r if isinstance(r, hl.Completed) else r[0]
            assert c.status == Status.CANCEL


def test_threads_share_a_list(dom):
    """Covers the new path: many threads waiting on one list while it is signalled."""
    t = dom.timeline()
    fs = [dom.fence() for _ in range(7)]
    errors: list[BaseException] = []
    seen: list[int] = []

    def waiter() -> None:
        try:
            for v in range(1, 51):
                r = hl.wait_any([*fs, t.point(v)], timeout=10)
                assert r.index == 7 and r.status == Status.SUCCESS
                seen.append(v)
            hl.wait_all((t.point(50), t.point(1)), timeout=10)
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    ths = [threading.Thread(target=waiter) for _ in range(6)]
    for th in ths:
        th.start()
    for v in range(1, 51):
        t.signal(v)
        time.sleep(0.0005)
    for th in ths:
        th.join(20)
    assert not errors and len(seen) == 6 * 50


# ------------------------------------------------------------ Point's C base
def test_point_keeps_its_timeline_and_is_collected():
    """Covers point.c: a Point holds its Timeline (the timeline lives while a point of it
    does), a cycle through a Point is collected, and points are immutable value objects."""
    d = hl.Domain.create(f"hl_w1p_{uuid.uuid4().hex[:8]}", unlink_on_close=True)
    try:
        t = d.timeline()
        p = t.point(4)
        wr = weakref.ref(t)
        del t
        gc.collect()
        assert wr() is not None and p.timeline is wr()

        class Big(int):
            pass

        class Sentinel:
            pass

        v = Big(7)
        q = hl.Point(p.timeline, v)
        v.back = q  # type: ignore[attr-defined]  # a cycle through the Point: q -> v -> q
        v.sentinel = Sentinel()  # type: ignore[attr-defined]
        ws = weakref.ref(v.sentinel)  # type: ignore[attr-defined]
        del v, q
        gc.collect()
        assert ws() is None  # the collector saw through the Point's fields
        with pytest.raises(AttributeError):
            p.timeline = None  # type: ignore[misc]
        with pytest.raises(AttributeError):
            del p.value  # type: ignore[misc]
        assert isinstance(p, hl.Point) and {p, p.timeline.point(4)} == {p}
        p.timeline.release()
    finally:
        d.close()


@pytest.mark.parametrize("fn", [hl.wait_any, hl.wait_all])
def test_nan_timeout_on_every_path(dom, fn):
    """Fails on the old code for wait_all (a NaN timeout passed `timeout < 0` and became a
    TimeoutError 'within nan s'): ValueError on the one-call path and the general path alike."""
    f = dom.fence()
    for objs in ([f], (f,), iter([f])):
        with pytest.raises(ValueError, match="timeout must be >= 0"):
            fn(objs, timeout=float("nan"))
