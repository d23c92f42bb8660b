"""Fence algebra (issue 27): timeline points in merges, a fence in any number of
merges, wait_any / wait_all.  The first tests port the Linux kernel's sync
selftests (tools/testing/selftests/sync: sync_merge, sync_wait,
sync_stress_merge) onto hostless objects."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
import uuid

import pytest

import hostless as hl
from hostless import Status


@pytest.fixture
def dom():
    d = hl.Domain.create(f"hl_fa_{uuid.uuid4().hex[:8]}", fences=1 << 16, unlink_on_close=True)
    yield d
    assert d.check() == []
    d.close()


# ------------------------------------------------------------ sync selftests
def test_merge_same_fence_many_times(dom):
    """sync_merge: one fence gates any number of merges (sync_file's rule)."""
    f = dom.fence()
    merged = [dom.merge([f]) for _ in range(50)] + [dom.merge([f, f]) for _ in range(5)]
    assert not any(m.done for m in merged)
    f.signal()
    assert all(m.wait(timeout=1) == Status.SUCCESS for m in merged)
    for m in merged:
        m.release()
    assert dom.check() == []


def test_fence_in_many_merges_failure_and_release(dom):
    f = dom.fence()
    others = [dom.fence() for _ in range(6)]
    ms = [dom.merge([f, g]) for g in others]
    for m in ms[::2]:
        m.release()  # released composites leave the shared child alone
    f.signal(Status.ERROR)
    for g in others:
        g.signal()
    for m in ms[1::2]:
        assert m.wait(timeout=1) == Status.ERROR  # first failure wins
    assert dom.check() == []


def test_points_on_one_timeline_merge_to_the_later(dom):
    """sync_merge: merging points of one timeline gives the later point."""
    t = dom.timeline()
    m = dom.merge([t.point(3), t.point(5)])
    assert len(m._inner.leaves) == 1 and m._inner.leaves[0].value == 5
    t.signal(3)
    assert not m.done
    t.signal(5)
    assert m.wait(timeout=1) == Status.SUCCESS


def test_points_on_three_timelines(dom):
    """sync_merge: a merge over three timelines completes only after the third."""
    a, b, c = dom.timeline(), dom.timeline(), dom.timeline()
    m = dom.merge([dom.merge([a.point(1), b.point(2)]), c.point(3)])
    assert len(m._inner.leaves) == 3  # flattened, as sync_file does
    a.signal(1)
    b.signal(2)
    c.signal(2)
    with pytest.raises(TimeoutError):
        m.wait(timeout=0.02)
    c.signal(3)
    assert m.wait(timeout=1) == Status.SUCCESS


def test_point_and_fence_mix_first_failure(dom):
    t, f = dom.timeline(), dom.fence()
    m = dom.merge([t.point(4), f])
    t.fail(Status.CANCEL)
    f.signal(Status.ERROR)
    assert m.wait(timeout=1) == Status.CANCEL


def test_point_already_reached_at_birth(dom):
    t = dom.timeline(7)
    assert dom.merge([t.point(7)]).wait(timeout=1) == Status.SUCCESS
    assert dom.merge([t.point(0), dom.merge([t.point(2)])]).wait(timeout=1) == Status.SUCCESS


def test_point_released_timeline_cancels_only_without_composite_reference(dom):
    t = dom.timeline()
    m = dom.merge([t.point(2)])
    t.release()  # the composite holds its own reference: still pending, still completes
    assert not m.done
    t2 = m._inner.leaves[0].timeline
    t2.signal(2)
    assert m.wait(timeout=1) == Status.SUCCESS


@pytest.mark.slow
def test_stress_merge_32_timelines_32768_merges(dom):
    """sync_stress_merge at full size: 32 timelines, 32768 random merges; the
    composite completes exactly when every timeline reaches its highest
    merged point."""
    rng = random.Random(27)
    tls = [dom.timeline() for _ in range(32)]
    top = [0] * 32
    t0 = time.monotonic()
    fence = dom.merge([tls[0].point(1)])
    top[0] = 1
    for _ in range(32768):
        i, v = rng.randrange(32), rng.randrange(1, 64)
        nxt = dom.merge([fence, tls[i].point(v)])
        fence.release()
        fence = nxt
        top[i] = max(top[i], v)
    assert len(fence._inner.leaves) == sum(1 for v in top if v)
    order = [i for i in range(32) if top[i]]
    rng.shuffle(order)
    for k, i in enumerate(order):
        for v in range(1, top[i] + 1):
            assert not fence.done
            tls[i].signal(v)
        if k < len(order) - 1:
            assert not fence.done
    assert fence.wait(timeout=1) == Status.SUCCESS
    assert time.monotonic() - t0 < 240  # a guard against a quadratic path, not a figure
    fence.release()


# ------------------------------------------------------------ wait_any / wait_all
def test_wait_any_mix(dom):
    f, t = dom.fence(), dom.timeline()
    objs = [f, t.point(2), dom.merge([t.point(3)])]
    with pytest.raises(TimeoutError):
        hl.wait_any(objs, timeout=0.02)
    threading.Timer(0.05, t.signal, (2,)).start()
    r = hl.wait_any(objs, timeout=5)
    assert (r.index, r.status, r.ok) == (1, Status.SUCCESS, True) and r.obj is objs[1]
    f.signal(Status.ERROR)
    r = hl.wait_any(objs, timeout=1)
    assert (r.index, r.status, r.ok) == (0, Status.ERROR, False)


def test_wait_all(dom):
    f, t = dom.fence(), dom.timeline()
    objs = [f, t.point(2)]
    f.signal()
    with pytest.raises(TimeoutError, match="1 of 2"):
        hl.wait_all(objs, timeout=0.02)
    threading.Timer(0.05, t.fail, (Status.ERROR,)).start()
    res = hl.wait_all(objs, timeout=5)
    assert [(c.index, c.status) for c in res] == [(0, Status.SUCCESS), (1, Status.ERROR)]


def test_wait_any_many_objects_and_two_domains(dom):
    other = hl.Domain.create(f"hl_fa2_{uuid.uuid4().hex[:8]}", unlink_on_close=True)
    try:
        fs = [dom.fence() for _ in range(200)]
        g = other.fence()
        objs = [*fs, g]
        threading.Timer(0.05, g.signal).start()
        assert hl.wait_any(objs, timeout=5).index == 200
        fs[150].signal()
        assert hl.wait_any(objs, timeout=5).index == 150
    finally:
        other.close()


def test_wait_bad_input(dom):
    t = dom.timeline()
    with pytest.raises(ValueError):
        hl.wait_any([])
    with pytest.raises(TypeError, match="point"):
        hl.wait_any([t])
    with pytest.raises(TypeError, match="point"):
        dom.merge([t])
    with pytest.raises(ValueError):
        t.point(-1)
    f = dom.fence()
    f.release()
    with pytest.raises(hl.InvalidHandle):
        hl.wait_all([f])


def test_wait_any_one_call_path(dom):
    """hl.wait_any's one C call (a list of held Fences and Points of one domain):
    the timeout's checks, its error message, the Completed it builds, and the
    general path for what it does not take (a generator, a released fence)."""
    f, t = dom.fence(), dom.timeline(1)
    objs = [f, t.point(2), t.point(1)]
    r = hl.wait_any(objs, timeout=0)
    assert type(r) is hl.Completed and tuple(r) == (2, objs[2], Status.SUCCESS) and r.ok
    assert r == hl.wait_any(x for x in objs)  # not a list: the general path, the same answer
    for bad, exc in ((-1, ValueError), (float("nan"), ValueError), ("1", TypeError)):
        with pytest.raises(exc):
            hl.wait_any(objs[:2], timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError, match="none of 2 objects completed within 0.01 s"):
        hl.wait_any(objs[:2], timeout=0.01)
    g = dom.fence()
    g.release()
    with pytest.raises(hl.InvalidHandle):
        hl.wait_any([f, g], timeout=0)


def test_wait_any_list_changed_during_the_wait(dom):
    """The list may change while the wait sleeps (the GIL is released): the
    Completed names the object waited for, not what is at its index later.
    Fails on the first version (items[i] read after the wait: IndexError)."""
    f0, f1 = dom.fence(), dom.fence()
    objs: list[hl.Fence] = [f0, f1]

    def change() -> None:
        objs.clear()
        f1.signal(Status.ERROR)

    threading.Timer(0.05, change).start()
    r = hl.wait_any(objs, timeout=5)
    assert (r.index, r.obj, r.status) == (1, f1, Status.ERROR) and objs == []


def test_wait_any_ctrl_c(dom):
    f = dom.fence()
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        hl.wait_any([f, dom.timeline().point(1)])
    assert time.monotonic() - t0 < 2


def test_async(dom):
    t, f = dom.timeline(), dom.fence()
    m = dom.merge([t.point(1), f])

    async def main():
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, t.signal, 1)
        r = await hl.wait_any_async([f, t.point(1)], timeout=5)
        assert r.index == 1
        assert await t.point(1) == Status.SUCCESS
        loop.call_later(0.02, f.signal)
        res = await hl.wait_all_async([m, f, t.point(1)], timeout=5)
        assert [c.status for c in res] == [Status.SUCCESS] * 3
        with pytest.raises(TimeoutError):
            await hl.wait_any_async([dom.fence()], timeout=0.02)

    asyncio.run(main())


def test_publish_point_and_packet_waits(dom):
    t = dom.timeline()
    dom.publish("cam/frame5", t.point(5))
    p = dom.lookup("cam/frame5")
    assert isinstance(p, hl.Point) and p.value == 5 and p.timeline.handle == t.handle
    with pytest.raises(hl.NameTaken):
        dom.publish("cam/frame5", t.point(6))
    dom.publish("cam/frame5", t.point(6), replace=True)
    assert dom.lookup("cam/frame5").value == 6
    f = dom.fence()
    w = hl.packet_waits(t.point(5), f)
    assert w == {"wait": (t.handle, f.handle), "wait_value": (5, 0)}
    pkt = hl.Packet(hl.PacketType.BARRIER, **w)
    assert pkt.wait_value == (5, 0)
