"""Fences: signal, wait, release, handles, merge, device stores and asyncio."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import hostless as hl
from conftest import (
    SLACK,
    assert_all_free,
    domain_of_another_tag,
    fence_table,
    ident,
    live_slots,
    needs_test_hooks,
    new_at,
    notifier_asleep,
    notifier_asleep_async,
    run_child,
    slot_index,
    wait_asleep,
)
from hostless._abi import C

S = hl.Status
FINAL = [S.SUCCESS, S.ERROR, S.CANCEL, S.OWNER_DIED, S(64), S(100), S(2**32 - 1)]


def handle_parts(h: int) -> tuple[int, int, int, int]:
    """tag, kind, gen24, index of a handle."""
    return h >> 56, (h >> 48) & 0xFF, (h >> 24) & 0xFFFFFF, (h & 0xFFFFFF) - 1


# --------------------------------------------------------------------- basics


def test_fence_handle_and_status(dom: hl.Domain) -> None:
    f = dom.fence()
    tag, kind, gen, idx = handle_parts(f.handle)
    assert tag == int(dom.header()["tag"])
    assert kind == int(C.KIND_FENCE)
    assert gen != 0 and 0 <= idx < 256
    assert f.status is S.ACTIVE
    assert not f.done and not f.merged
    assert "ACTIVE" in repr(f)
    f.signal()
    assert f.status is S.SUCCESS and f.done
    assert f.wait() is S.SUCCESS
    assert f.wait(0) is S.SUCCESS
    f.release()
    assert "released" in repr(f)
    assert dom.check() == []


def test_fence_constructor_is_private() -> None:
    with pytest.raises(TypeError):
        hl.Fence()


@pytest.mark.parametrize("status", FINAL, ids=lambda s: s.name)
def test_every_final_status(dom: hl.Domain, peer: hl.Domain, status: hl.Status) -> None:
    f = dom.fence()
    g = peer.import_fence(f.handle)
    f.signal(status)
    assert f.status == status and g.status == status
    assert g.wait(1) == status
    assert g.wait(0) == status
    assert isinstance(g.wait(0), hl.Status)
    assert g.status.failed == (status != S.SUCCESS)
    # the completion word is the status itself (a device waits for word >= 1)
    assert int(fence_table(dom)["word"][slot_index(f.handle)]) == int(status)


def test_custom_status_values() -> None:
    assert S(100).name == "CUSTOM_100"
    assert int(S(2**32 - 1)) == 2**32 - 1
    assert S(64).failed and not S.SUCCESS.failed and not S.ACTIVE.failed
    for bad in (0, 5, 8, 63, 2**32):
        with pytest.raises(ValueError):
            S(bad)


def test_signal_with_plain_int(dom: hl.Domain) -> None:
    f = dom.fence()
    f.signal(12345)
    assert f.status == 12345 and f.status.name == "CUSTOM_12345"


@pytest.mark.parametrize("bad", [0, 1, 5, 8, 63, 2**32, 2**40])
def test_invalid_status(dom: hl.Domain, bad: int) -> None:
    f = dom.fence()
    with pytest.raises(ValueError):
        f.signal(bad)
    assert f.status is S.ACTIVE  # nothing was stored
    f.signal()


@pytest.mark.parametrize("bad", [-1, -(2**63), 2**64, 2**70])
def test_invalid_status_out_of_u64(dom: hl.Domain, bad: int) -> None:
    """Statuses outside the u64 range are invalid statuses too: ValueError, not
    OverflowError (the first core let PyLong_AsUnsignedLongLong's error escape;
    Timeline.fail still does, see test_timeline.test_fail_status_out_of_u64)."""
    f = dom.fence()
    with pytest.raises(ValueError):
        f.signal(bad)
    assert f.status is S.ACTIVE


def test_already_signaled(dom: hl.Domain, peer: hl.Domain) -> None:
    f = dom.fence()
    g = peer.import_fence(f.handle)
    g.signal(S.ERROR)
    for s in (S.SUCCESS, S.ERROR, S.CANCEL, S(70)):
        with pytest.raises(hl.AlreadySignaled):
            f.signal(s)
        with pytest.raises(hl.AlreadySignaled):
            g.signal(s)
    with pytest.raises(hl.AlreadySignaled):
        f.cancel()
    assert f.status is S.ERROR


def test_cancel(dom: hl.Domain) -> None:
    f = dom.fence()
    f.cancel()
    assert f.wait(0) is S.CANCEL


def test_wait_timeout(dom: hl.Domain) -> None:
    f = dom.fence()
    with pytest.raises(TimeoutError):
        f.wait(0)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        f.wait(0.05)
    assert 0.04 <= time.monotonic() - t0 < 2
    with pytest.raises(TimeoutError):
        f.wait(0.01, spin=0)
    with pytest.raises(ValueError):
        f.wait(-1)


def test_wait_wakes_on_signal_from_thread(dom: hl.Domain, peer: hl.Domain) -> None:
    f = dom.fence()
    g = peer.import_fence(f.handle)
    got: list[object] = []
    th = threading.Thread(target=lambda: got.append(g.wait(30, spin=0)))
    th.start()
    wait_asleep(dom, f, 1, [ident(th)])  # the signal must wake a sleeper, not meet a spinner
    t0 = time.monotonic()
    f.signal(S(77))
    th.join(30)
    assert got == [S(77)]
    # woken by the signal, not by the wait's own 30 s timeout (bound: SLACK, the suite's slack)
    assert time.monotonic() - t0 < SLACK


def test_many_threads_wait_one_fence(dom: hl.Domain) -> None:
    f = dom.fence()
    got: list[object] = []
    ths = [threading.Thread(target=lambda: got.append(f.wait(5))) for _ in range(8)]
    for th in ths:
        th.start()
    wait_asleep(dom, f, 8, [ident(th) for th in ths])  # all eight asleep: one signal wakes them all
    f.signal(S.ERROR)
    for th in ths:
        th.join(5)
    assert got == [S.ERROR] * 8


# --------------------------------------------------------------------- ownership


def test_owner_other_participant(dom: hl.Domain, domain_name: str) -> None:
    other = hl.Domain.open(domain_name)
    f = dom.fence(owner=other.participant_id)
    part = next(p for p in dom.participants if p.id == other.participant_id)
    g = dom.fence(owner=part)
    assert int(fence_table(dom)["owner"][slot_index(f.handle)]) == ((other.participant_id >> 8) << 8) | (
        (other.participant_id & 0xFF) + 1
    )
    other.close()  # the owner leaves without signaling: OWNER_LEFT (ABI 6: leaving is not dying)
    assert f.wait(1) is S.OWNER_LEFT
    assert g.wait(1) is S.OWNER_LEFT
    with pytest.raises(ValueError):
        dom.fence(owner=other.participant_id)  # no longer alive
    assert dom.check() == []


@pytest.mark.parametrize("bad", [-1, True, "me", 1.5])
def test_owner_bad_type(dom: hl.Domain, bad: object) -> None:
    with pytest.raises(TypeError):
        dom.fence(owner=bad)  # type: ignore[arg-type]


def test_owner_not_a_participant(dom: hl.Domain) -> None:
    with pytest.raises(ValueError):
        dom.fence(owner=200)  # slot index 200: outside a 16-participant table
    with pytest.raises(ValueError):
        dom.fence(owner=(dom.participant_id + (5 << 8)))  # wrong incarnation
    with pytest.raises(ValueError):
        dom.timeline(owner=3)  # a free participant slot
    assert live_slots(dom) == 0


# --------------------------------------------------------------------- release and handles


def test_release_and_double_release(dom: hl.Domain) -> None:
    f = dom.fence()
    f.release()
    with pytest.raises(hl.InvalidHandle):
        f.release()
    for call in (lambda: f.status, f.signal, f.cancel, lambda: f.wait(0), lambda: dom.merge([f])):
        with pytest.raises(hl.InvalidHandle):
            call()
    with pytest.raises(hl.InvalidHandle):
        dom._core.release(f.handle)  # the core refuses a handle it does not hold
    assert live_slots(dom) == 0


def test_context_manager_releases(dom: hl.Domain) -> None:
    with dom.fence() as f:
        f.signal()
    with pytest.raises(hl.InvalidHandle):
        _ = f.status
    with dom.fence() as g:
        g.release()  # released inside: __exit__ must not fail
    assert live_slots(dom) == 0


def test_stale_handle_after_slot_reuse(dom: hl.Domain) -> None:
    f = dom.fence()
    h = f.handle
    f.signal()
    f.release()
    with pytest.raises(hl.InvalidHandle):
        dom.import_fence(h)
    g = dom.fence()
    assert slot_index(g.handle) != slot_index(h), "a freed slot is not reused at once (round-robin)"
    for _ in range(300):  # a lap of the 256-slot table brings the slot back
        if slot_index(g.handle) == slot_index(h):
            break
        g.release()
        g = dom.fence()
    assert slot_index(g.handle) == slot_index(h)
    assert g.handle != h
    with pytest.raises(hl.InvalidHandle):
        dom.import_fence(h)
    assert g.status is S.ACTIVE  # the new object is not the old one
    t = None
    g.release()
    t = dom.timeline()
    for _ in range(300):
        if slot_index(t.handle) == slot_index(h):
            break
        t.release()
        t = dom.timeline()
    assert slot_index(t.handle) == slot_index(h)
    with pytest.raises(hl.InvalidHandle):
        dom.import_fence(h)
    with pytest.raises(hl.InvalidHandle):
        dom.import_timeline(g.handle)


def test_forged_handles(dom: hl.Domain) -> None:
    f = dom.fence()
    h = f.handle
    tag, kind, gen, idx = handle_parts(h)
    forged = [
        h ^ (1 << 24),  # other generation
        h ^ (0x5 << 56) if tag ^ 5 else h ^ (0x6 << 56),  # other tag
        (h & ~(0xFF << 48)) | (7 << 48),  # unknown kind
        (h & ~(0xFF << 48)) | (int(C.KIND_MERGED) << 48),  # right slot, wrong kind
        h & ~0xFFFFFF,  # index field 0
        (h & ~0xFFFFFF) | 257,  # index 256: outside the table
        (h & ~0xFFFFFF) | 0xFFFFFF,
        (h & ~0xFFFFFF) | (idx + 2),  # a free slot
        1,
        2**64 - 1,
    ]
    for bad in forged:
        with pytest.raises(hl.InvalidHandle):
            dom.import_fence(bad)
    for bad in (0, -1, 2**64, 2**80):
        with pytest.raises(hl.InvalidHandle):
            dom.import_fence(bad)
        with pytest.raises(hl.InvalidHandle):
            dom.import_timeline(bad)
    for bad in ("0x1", 1.0, None, True, b"\x01"):
        with pytest.raises(hl.InvalidHandle):
            dom.import_fence(bad)  # type: ignore[arg-type]
    assert issubclass(hl.InvalidHandle, ValueError)
    assert f.status is S.ACTIVE
    assert dom.check() == []


def test_foreign_handle(dom: hl.Domain, make_name) -> None:  # type: ignore[no-untyped-def]
    other = domain_of_another_tag(dom, make_name, fences=256)
    try:
        f = other.fence()
        t = other.timeline()
        mine = new_at(dom.fence, slot_index(f.handle))
        with pytest.raises(hl.InvalidHandle):
            dom.import_fence(f.handle)
        with pytest.raises(hl.InvalidHandle):
            dom.import_timeline(t.handle)
        with pytest.raises(hl.InvalidHandle):
            dom.merge([f])  # a Fence of another domain object
        assert mine.status is S.ACTIVE
    finally:
        other.close()


def test_kind_mismatch(dom: hl.Domain) -> None:
    f = dom.fence()
    t = dom.timeline()
    m = dom.merge([f])
    with pytest.raises(hl.InvalidHandle):
        dom.import_fence(t.handle)
    with pytest.raises(hl.InvalidHandle):
        dom.import_timeline(f.handle)
    with pytest.raises(hl.InvalidHandle):
        dom.import_timeline(m.handle)
    # the kind bits of a handle are checked against the slot, not only the handle
    as_tl = (f.handle & ~(0xFF << 48)) | (int(C.KIND_TIMELINE) << 48)
    with pytest.raises(hl.InvalidHandle):
        dom.import_timeline(as_tl)
    as_f = (t.handle & ~(0xFF << 48)) | (int(C.KIND_FENCE) << 48)
    with pytest.raises(hl.InvalidHandle):
        dom.import_fence(as_f)
    with pytest.raises(TypeError):
        dom.merge([t])  # type: ignore[list-item]


def test_import_twice_counts_locally(dom: hl.Domain, peer: hl.Domain) -> None:
    f = dom.fence()
    a = peer.import_fence(f.handle)
    b = peer.import_fence(f.handle)
    assert a is not b and a.handle == b.handle == f.handle
    refs = int(fence_table(dom)["refs"][slot_index(f.handle)])
    assert bin(refs).count("1") == 2  # one bit per participant, not per import
    a.release()
    assert b.status is S.ACTIVE
    f.release()
    assert b.status is S.ACTIVE  # b still holds it
    b.signal()
    b.release()
    assert live_slots(dom) == 0


def test_cancel_on_last_release(dom: hl.Domain, peer: hl.Domain) -> None:
    f = dom.fence()
    watch = dom.merge([f])  # observes f's final status
    g = peer.import_fence(f.handle)
    pw = peer.import_fence(watch.handle)
    f.release()
    assert g.status is S.ACTIVE and watch.status is S.ACTIVE  # peer still holds f
    g.release()  # last reference in the domain: CANCEL
    assert watch.status is S.CANCEL
    assert pw.wait(1) is S.CANCEL
    assert int(fence_table(dom)["word"][slot_index(f.handle)]) == int(S.CANCEL)
    assert live_slots(dom) == 1  # only the merged fence
    watch.release()
    pw.release()
    assert_all_free(dom)


def test_release_after_signal_keeps_status(dom: hl.Domain) -> None:
    f = dom.fence()
    m = dom.merge([f])
    f.signal(S(99))
    f.release()
    assert m.status == S(99)


def test_gc_releases(dom: hl.Domain) -> None:
    f = dom.fence()
    h = f.handle
    del f
    import gc

    gc.collect()
    with pytest.raises(hl.InvalidHandle):
        dom.import_fence(h)
    assert live_slots(dom) == 0


def test_domain_full_fences(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=8) as d:
        objs: list[object] = [d.fence() for _ in range(7)]
        objs.append(d.timeline())
        for make in (d.fence, d.timeline, lambda: d.merge([objs[0]])):  # type: ignore[list-item]
            with pytest.raises(hl.DomainFull):
                make()
        objs.pop().release()  # type: ignore[attr-defined]
        objs.append(d.fence())
        assert live_slots(d) == 8
        for o in objs:
            o.release()  # type: ignore[attr-defined]
        assert_all_free(d)
        assert d.check() == []


def test_use_after_domain_close(domain_name: str) -> None:
    """Every call on an object of a closed domain raises DomainClosed.

    BUG: signal/cancel/wait run in the C Handle type, whose handle_live() (like
    the core's NEED_ATTACHED) raises "domain is closed" as a plain
    InvalidOperation, while the Python paths (status, add_done_callback) raise
    DomainClosed."""
    d = hl.Domain.create(domain_name)
    f = d.fence()
    d.close()
    errors = {}
    for name, call in {
        "status": lambda: f.status,
        "signal": f.signal,
        "cancel": f.cancel,
        "wait": lambda: f.wait(0),
        "add_done_callback": lambda: f.add_done_callback(print),
    }.items():
        try:
            call()
        except Exception as e:  # noqa: BLE001
            errors[name] = type(e).__name__
    assert errors == dict.fromkeys(errors, "DomainClosed")
    assert set(errors) == {"status", "signal", "cancel", "wait", "add_done_callback"}
    f.release()  # releasing after close is allowed (nothing to drop)
    with pytest.raises(hl.InvalidHandle):
        f.release()


def test_wait_interrupted_by_close_does_not_crash(domain_name: str) -> None:
    """A thread blocked in wait() while another thread closes the domain must get an
    error, not a crash.

    BUG: Domain.close() -> Core_leave unmaps the domain while the waiter
    thread, its GIL released, still reads the completion word through the old
    mapping: the process dies with SIGSEGV."""
    body = """
        import threading
        name = sys.argv[1]
        owner = hl.Domain.open(name)
        d = hl.Domain.open(name)
        f = owner.fence()
        g = d.import_fence(f.handle)
        res = []
        def waiter():
            try:
                res.append(g.wait(30))
            except BaseException as e:
                res.append(e)
        th = threading.Thread(target=waiter)
        th.start()
        # close once the waiter is asleep on the word (its waiter count, struct hl_fence.waiters)
        import numpy as np
        from hostless import lowlevel
        from hostless._abi import C
        off = lowlevel.completion_word_offset(owner, f) - int(C.F_WORD) + int(C.F_WAITERS)
        deadline = time.monotonic() + 20
        while np.frombuffer(owner.raw(), "<u4", 1, off)[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        d.close()
        th.join(30)
        print(type(res[0]).__name__ if res else "hung", flush=True)
        owner.close()
    """
    with hl.Domain.create(domain_name):
        r = run_child(body, domain_name, timeout=60)
    assert r.returncode == 0, f"process died (rc={r.returncode}) when the domain was closed under a waiter"
    assert r.stdout.strip() in ("DomainClosed", "InvalidOperation")


# --------------------------------------------------------------------- device stores


@needs_test_hooks
def test_device_store_seen_by_sleeping_waiter(domain_name: str) -> None:
    poll = 0.02
    with hl.Domain.create(domain_name, poll_interval=poll) as d:
        f = d.fence()
        got: list[tuple[object, float]] = []
        th = threading.Thread(target=lambda: got.append((f.wait(5, spin=0), time.monotonic())))
        th.start()
        idx = slot_index(f.handle)
        wait_asleep(d, f, 1, [ident(th)])
        t_store = time.monotonic()
        hl._core.testing.device_store(d._core, f.handle, int(S.ERROR))  # one store, no FUTEX_WAKE
        th.join(5)
        assert got and got[0][0] is S.ERROR
        # seen at the end of a bounded sleep, not at the wait's own 5 s timeout (SLACK: the suite's)
        assert got[0][1] - t_store < poll + SLACK, f"seen after {got[0][1] - t_store:.3f} s"
        assert int(fence_table(d)["waiters"][idx]) == 0


@needs_test_hooks
def test_device_store_children_of_merge(domain_name: str) -> None:
    """Children signaled by plain stores (no propagation) still complete a merged fence."""
    with hl.Domain.create(domain_name, poll_interval=0.01, watchdog_interval=0) as d:
        a, b, c = d.fence(), d.fence(), d.fence()
        inner = d.merge([a, b])
        outer = d.merge([inner, c])
        got: list[object] = []
        th = threading.Thread(target=lambda: got.append(outer.wait(5, spin=0)))
        th.start()
        wait_asleep(d, outer, 1, [ident(th)])
        hl._core.testing.device_store(d._core, a.handle, int(S.SUCCESS))
        hl._core.testing.device_store(d._core, c.handle, int(S.SUCCESS))
        hl._core.testing.device_store(d._core, b.handle, 200)
        th.join(5)
        assert got == [S(200)]
        assert inner.status == S(200)
        assert d.check() == []


@needs_test_hooks
def test_device_store_seen_by_async_waiter(domain_name: str) -> None:
    with hl.Domain.create(domain_name, poll_interval=0.01) as d:
        f = d.fence()

        async def main() -> object:
            task = asyncio.ensure_future(f.wait_async(5))
            await notifier_asleep_async(d, [f])  # the store meets the notifier asleep on it
            hl._core.testing.device_store(d._core, f.handle, int(S.SUCCESS))
            return await task

        assert asyncio.run(main()) is S.SUCCESS


# --------------------------------------------------------------------- merge


def test_merge_basic(dom: hl.Domain) -> None:
    fs = [dom.fence() for _ in range(3)]
    m = dom.merge(fs)
    assert m.merged and handle_parts(m.handle)[1] == int(C.KIND_MERGED)
    assert "merged" in repr(m)
    fs[0].signal()
    fs[2].signal()
    assert m.status is S.ACTIVE
    with pytest.raises(TimeoutError):
        m.wait(0.01)
    fs[1].signal()
    assert m.wait(1) is S.SUCCESS
    assert dom.check() == []


def test_merge_cannot_be_signaled(dom: hl.Domain, peer: hl.Domain) -> None:
    child = dom.fence()
    m = dom.merge([child])
    pm = peer.import_fence(m.handle)
    for call in (m.signal, m.cancel, lambda: m.signal(S.ERROR), pm.signal):
        with pytest.raises(hl.InvalidOperation):
            call()
    assert m.status is S.ACTIVE
    child.signal()
    assert pm.wait(1) is S.SUCCESS


def test_merge_first_failure_wins(dom: hl.Domain) -> None:
    fs = [dom.fence() for _ in range(4)]
    m = dom.merge(fs)
    fs[2].signal(S.ERROR)
    fs[0].signal(S.CANCEL)
    fs[1].signal()
    assert m.status is S.ACTIVE
    fs[3].signal(S(500))
    assert m.wait(1) is S.ERROR


def test_merge_of_signaled_children(dom: hl.Domain) -> None:
    a, b = dom.fence(), dom.fence()
    a.signal()
    b.signal()
    assert dom.merge([a, b]).status is S.SUCCESS
    c, d, e = dom.fence(), dom.fence(), dom.fence()
    d.signal(S(300))
    c.signal(S.CANCEL)
    m = dom.merge([c, d, e])  # already-signaled failures: the first in the list wins
    assert m.status is S.ACTIVE
    e.signal()
    assert m.status is S.CANCEL


def test_merge_of_merged(dom: hl.Domain) -> None:
    a, b, c = dom.fence(), dom.fence(), dom.fence()
    ab = dom.merge([a, b])
    abc = dom.merge([ab, c])
    top = dom.merge([abc])
    c.signal(S.ERROR)
    a.signal()
    assert abc.status is S.ACTIVE and top.status is S.ACTIVE
    b.signal()
    assert ab.status is S.SUCCESS
    assert abc.status is S.ERROR and top.wait(1) is S.ERROR
    assert dom.check() == []


def test_fence_in_more_than_two_merges(dom: hl.Domain) -> None:
    """Issue 27 lifted the two-merge limit: a third merge goes through a watch node."""
    f, g = dom.fence(), dom.fence()
    m1 = dom.merge([f])
    m2 = dom.merge([f, g])
    m3 = dom.merge([f])
    m4 = dom.merge([g, f])
    f.signal(S.ERROR)
    assert m1.status is S.ERROR and m3.wait(1) is S.ERROR
    assert m2.status is S.ACTIVE and m4.status is S.ACTIVE
    g.signal()
    assert m2.status is S.ERROR and m4.wait(1) is S.ERROR
    for m in (m1, m2, m3, m4):
        m.release()
    assert dom.check() == []


def test_merge_bad_arguments(dom: hl.Domain, peer: hl.Domain) -> None:
    f = dom.fence()
    with pytest.raises(ValueError):
        dom.merge([])
    ff = dom.merge([f, f])  # sync_file's rule (issue 27): a fence given twice counts once
    assert len(ff._inner.leaves) == 1
    ff.release()
    with pytest.raises(TypeError):
        dom.merge([f.handle])  # type: ignore[list-item]
    g = peer.import_fence(f.handle)
    with pytest.raises(hl.InvalidHandle):
        dom.merge([g])  # held through another Domain object
    r = dom.fence()
    r.release()
    with pytest.raises(hl.InvalidHandle):
        dom.merge([f, r])
    assert live_slots(dom) == 1
    m = dom.merge(iter([f]))  # any iterable
    f.signal()
    assert m.status is S.SUCCESS


def test_merge_40_children(dom: hl.Domain) -> None:
    fs = [dom.fence() for _ in range(40)]
    before = live_slots(dom)
    m = dom.merge(fs)
    assert m.merged
    assert live_slots(dom) == before + 3  # two inner nodes (32 + 8) and the root
    for f in fs[:-1]:
        f.signal()
    assert m.status is S.ACTIVE
    fs[-1].signal()
    assert m.wait(1) is S.SUCCESS
    m.release()
    assert live_slots(dom) == before  # the inner nodes go with the root
    for f in fs:
        f.release()
    assert_all_free(dom)


def test_merge_40_children_error(dom: hl.Domain) -> None:
    fs = [dom.fence() for _ in range(40)]
    m = dom.merge(fs)
    fs[5].signal(S(1000))
    for i, f in enumerate(fs):
        if i != 5:
            f.signal()
    assert m.wait(1) == S(1000)


def test_merge_40_children_first_failure_wins(dom: hl.Domain) -> None:
    """merge() of 40 fences must behave like one composite: the first failure wins.

    BUG: the 40 children are split into inner composites (32 + 8) and a
    failure only reaches the root when its inner composite completes, so a
    later failure in a small inner node that completes first beats the first
    failure (here CANCEL wins over the earlier ERROR)."""
    fs = [dom.fence() for _ in range(40)]
    m = dom.merge(fs)
    fs[0].signal(S.ERROR)  # first failure, in the first inner node
    fs[35].signal(S.CANCEL)  # later failure, in the second inner node
    for f in fs[32:]:
        if f is not fs[35]:
            f.signal()
    for f in fs[1:32]:
        f.signal()
    assert m.wait(1) is S.ERROR


def test_merge_1100_children(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=2048) as d:
        fs = [d.fence() for _ in range(1100)]
        m = d.merge(fs)  # three levels: 35 nodes, 2 nodes, root
        assert live_slots(d) == 1100 + 35 + 2 + 1
        for f in fs[::-1]:
            f.signal()
        assert m.wait(1) is S.SUCCESS
        m.release()
        for f in fs:
            f.release()
        assert_all_free(d)


def test_merge_child_released_cancels(dom: hl.Domain) -> None:
    a, b = dom.fence(), dom.fence()
    m = dom.merge([a, b])
    b.signal()
    a.release()  # last reference of an ACTIVE child: CANCEL, propagated
    assert m.status is S.CANCEL


def test_merge_released_before_children(dom: hl.Domain) -> None:
    a, b = dom.fence(), dom.fence()
    m = dom.merge([a, b])
    m.release()
    a.signal()
    b.signal(S.ERROR)
    assert a.status is S.SUCCESS and b.status is S.ERROR
    a.release()
    b.release()
    assert_all_free(dom)
    assert dom.check() == []


def test_merge_again_after_merges_released(dom: hl.Domain) -> None:
    """A fence may join at most two *live* composites; after those are released it
    can join new ones.

    BUG: a released composite leaves its link in the child's parents[] slot
    (nothing clears it and Core_merge only takes parents[k] == 0), so a fence
    that was ever in two merges can never be merged again
    ("already part of 2 merged fences")."""
    f = dom.fence()
    for _ in range(3):
        m = dom.merge([f])
        m.release()
    m = dom.merge([f])
    f.signal()
    assert m.status is S.SUCCESS


def test_failed_large_merge_leaks_nothing(domain_name: str) -> None:
    """A 40-child merge refused with DomainFull leaves no slot behind and does not
    use up the children's merge links (see test_merge_again_after_merges_released)."""
    with hl.Domain.create(domain_name, fences=42) as d:
        fs = [d.fence() for _ in range(40)]
        with pytest.raises(hl.DomainFull):
            d.merge(fs)  # 2 inner nodes fit, the root does not
        assert live_slots(d) == 40
        assert d.check() == []
        assert [f.status for f in fs] == [S.ACTIVE] * 40
        fs.pop().release()
        fs.pop().release()
        fs.pop().release()
        m = d.merge(fs[:2])
        m2 = d.merge(fs[:2])
        for f in fs:
            f.signal()
        assert m.status is S.SUCCESS and m2.status is S.SUCCESS


def test_merge_imported_and_waited_by_peer(dom: hl.Domain, peer: hl.Domain) -> None:
    a, b = dom.fence(), dom.fence()
    m = dom.merge([a, b])
    pm = peer.import_fence(m.handle)
    assert pm.merged
    got: list[object] = []
    th = threading.Thread(target=lambda: got.append(pm.wait(5)))
    th.start()
    pa = peer.import_fence(a.handle)
    pa.signal(S.ERROR)
    b.signal()
    th.join(5)
    assert got == [S.ERROR]


# --------------------------------------------------------------------- asyncio


def test_await_fence(dom: hl.Domain) -> None:
    f = dom.fence()

    async def main() -> object:
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, f.signal, S(65))
        return await f

    assert asyncio.run(main()) == S(65)

    async def again() -> object:
        return await f  # already signaled: immediate

    assert asyncio.run(again()) == S(65)


def test_wait_async_timeout(dom: hl.Domain) -> None:
    f = dom.fence()

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await f.wait_async(0.05)
        f.signal()
        assert await f.wait_async(1) is S.SUCCESS

    asyncio.run(main())


def test_add_done_callback_without_loop(dom: hl.Domain) -> None:
    f = dom.fence()
    seen: list[tuple[object, str]] = []
    ev = threading.Event()

    def cb(x: hl.Fence) -> None:
        seen.append((x.status, threading.current_thread().name))
        ev.set()

    f.add_done_callback(cb)
    notifier_asleep(dom, [f])
    assert not seen
    f.signal(S.ERROR)
    assert ev.wait(2)
    assert seen == [(S.ERROR, "hostless-notifier")]
    g = dom.fence()
    g.signal()
    ev2 = threading.Event()
    g.add_done_callback(lambda x: ev2.set())  # already signaled: called soon
    assert ev2.wait(2)


def test_add_done_callback_in_loop(dom: hl.Domain) -> None:
    f = dom.fence()

    async def main() -> tuple[object, bool]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[object, bool]] = loop.create_future()
        me = threading.get_ident()
        f.add_done_callback(lambda x: fut.set_result((x.status, threading.get_ident() == me)))

        def signal_when_asleep() -> None:
            notifier_asleep(dom, [f])
            f.signal()

        threading.Thread(target=signal_when_asleep).start()
        return await asyncio.wait_for(fut, 20)

    assert asyncio.run(main()) == (S.SUCCESS, True)


def test_300_concurrent_awaits(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=512) as d:
        fs = [d.fence() for _ in range(300)]

        async def main() -> list[object]:
            tasks = [asyncio.ensure_future(f.wait_async()) for f in fs]
            await notifier_asleep_async(d, fs)
            assert not any(t.done() for t in tasks)

            def signal_all() -> None:
                for i, f in enumerate(fs):
                    f.signal(S.SUCCESS if i % 3 else S(64 + i))

            threading.Thread(target=signal_all).start()
            return await asyncio.wait_for(asyncio.gather(*tasks), 10)

        got = asyncio.run(main())
        assert got == [S.SUCCESS if i % 3 else S(64 + i) for i in range(300)]


def test_300_awaits_late_ones_not_starved(domain_name: str) -> None:
    """Awaits beyond the notifier's first futex_waitv batch (127 words) must complete
    even while the earlier ones stay pending.

    BUG: Notifier._run only ever watches live[:127]; entries after those are not
    looked at until earlier ones complete, so awaiting fence #200 hangs while
    fences #0..#126 are pending."""
    with hl.Domain.create(domain_name, fences=512) as d:
        fs = [d.fence() for _ in range(300)]

        async def main() -> int:
            tasks = [asyncio.ensure_future(f.wait_async()) for f in fs]
            await notifier_asleep_async(d, fs)
            for f in fs[200:]:
                f.signal()
            done, _ = await asyncio.wait(tasks[200:], timeout=3)
            for f in fs[:200]:
                f.signal()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
            return len(done)

        assert asyncio.run(main()) == 100


def test_pending_await_completes_when_domain_closes(domain_name: str) -> None:
    """An await pending when its domain is closed must finish (with DomainClosed),
    not hang forever.

    BUG: Domain.close() stops the notifier thread and drops its pending
    futures without completing them."""
    with hl.Domain.create(domain_name) as owner:
        f = owner.fence()
        d = hl.Domain.open(domain_name)
        g = d.import_fence(f.handle)

        async def main() -> object:
            task = asyncio.ensure_future(g.wait_async())
            await notifier_asleep_async(d, [g])
            d.close()
            done, _ = await asyncio.wait([task], timeout=2)
            if not done:
                task.cancel()
                return "hung"
            return type(task.exception())

        assert asyncio.run(main()) is hl.DomainClosed


def test_await_released_fence_errors(dom: hl.Domain) -> None:
    f = dom.fence()
    f.release()

    async def main() -> None:
        with pytest.raises(hl.InvalidHandle):
            await f

    asyncio.run(main())
