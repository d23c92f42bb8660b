"""hostless.Poller (issue 26, item 5): one eventfd that event loops wait on, with no thread
per wait.

selectors and asyncio's add_reader over many objects (more than one futex_waitv batch),
fences and timeline points of two domains, failures (ERROR, a failed timeline, a point
reached before the failure), a peer SIGKILLed while its fence is watched (OWNER_DIED
through recovery), the domain closed under a watch, unwatch and close, callbacks and
their errors, Ctrl-C in a select on the descriptor, and the thread count: watching
hundreds of objects adds no thread beyond the domain's one notifier."""

from __future__ import annotations

import asyncio
import os
import random
import selectors
import signal
import subprocess
import sys
import threading
import time

import pytest

import hostless as hl
from conftest import SLACK, child_code, kill_child, read_line, spawn_child

S = hl.Status


def _drain(p: hl.Poller, want: int, timeout: float) -> list[hl.Ready]:
    """Reports from a selectors loop until ``want`` arrived (or the timeout)."""
    out: list[hl.Ready] = []
    with selectors.DefaultSelector() as sel:
        sel.register(p.fileno(), selectors.EVENT_READ)
        end = time.monotonic() + timeout
        while len(out) < want and time.monotonic() < end:
            if sel.select(timeout=end - time.monotonic()):
                out += p.ready()
    return out


def test_selectors_many_objects_each_reported_once(dom: hl.Domain) -> None:
    fences = [dom.fence() for _ in range(200)]
    tl = dom.timeline()
    points = [tl.point(v) for v in range(1, 101)]
    objs: list[hl.Fence | hl.Point] = [*fences, *points]
    with hl.Poller() as p:
        tokens = {p.watch(o): o for o in objs}
        assert len(p) == len(objs) and p.ready() == []
        order = list(fences)
        random.Random(26).shuffle(order)

        def signal_all() -> None:
            for i, f in enumerate(order):
                f.signal(S.ERROR if i % 7 == 0 else S.SUCCESS)
                if i % 2 == 0:
                    tl.signal(i // 2 + 1)
            if tl.value < 100:
                tl.signal(100)

        t = threading.Thread(target=signal_all)
        t.start()
        got = _drain(p, len(objs), 20 + SLACK)
        t.join()
        assert sorted(r.token for r in got) == sorted(tokens)  # each exactly once
        for r in got:
            assert r.obj is tokens[r.token] and r.error is None
            if isinstance(r.obj, hl.Fence):
                assert r.status is r.obj.status
            else:
                assert r.status is S.SUCCESS
        assert len(p) == 0 and p.ready() == []


def test_asyncio_add_reader_and_wait_async_side_by_side(dom: hl.Domain) -> None:
    async def main() -> tuple[list[S | None], S]:
        loop = asyncio.get_running_loop()
        p = hl.Poller()
        fs = [dom.fence() for _ in range(50)]
        futs = {p.watch(f): loop.create_future() for f in fs}

        def on_readable() -> None:
            for r in p.ready():
                futs[r.token].set_result(r.status)

        loop.add_reader(p.fileno(), on_readable)
        other = dom.fence()
        waiting = asyncio.ensure_future(other.wait_async(timeout=10))  # asyncio as before
        for i, f in enumerate(fs):
            loop.call_later(0.001 * i, f.signal, S.CANCEL if i == 3 else S.SUCCESS)
        loop.call_later(0.02, other.signal)
        statuses = await asyncio.wait_for(asyncio.gather(*futs.values()), 10 + SLACK)
        loop.remove_reader(p.fileno())
        p.close()
        return statuses, await waiting

    statuses, other = asyncio.run(main())
    assert statuses[3] is S.CANCEL and statuses.count(S.SUCCESS) == 49 and other is S.SUCCESS


def test_failures_and_points_reached_before_a_failure(dom: hl.Domain, peer: hl.Domain) -> None:
    tl = dom.timeline()
    f = dom.fence()
    f2 = peer.fence()  # through another Domain object (its own notifier), same poller
    with hl.Poller() as p:
        seen: list[hl.Ready] = []
        toks = {
            p.watch(tl.point(3), seen.append): S.SUCCESS,  # reached before the failure
            p.watch(tl.point(9), seen.append): S.CANCEL,
            p.watch(f, seen.append): S.ERROR,
            p.watch(f2, seen.append): S(70),
        }
        tl.signal(5)
        tl.fail(S.CANCEL)
        f.signal(S.ERROR)
        f2.signal(S(70))
        got = _drain(p, 4, 10 + SLACK)
        assert {r.token: r.status for r in got} == toks
        assert seen == got  # callbacks ran in this thread, in order, with the same reports


def test_already_complete_and_unwatch_and_close(dom: hl.Domain) -> None:
    done, gone, later = dom.fence(), dom.fence(), dom.fence()
    done.signal()
    p = hl.Poller()
    t_done = p.watch(done)
    t_gone = p.watch(gone)
    assert p.unwatch(t_gone) and not p.unwatch(t_gone)
    gone.signal()
    got = _drain(p, 1, 5 + SLACK)
    assert [(r.token, r.status) for r in got] == [(t_done, S.SUCCESS)]
    time.sleep(0.05)
    assert p.ready() == []  # the unwatched one is not reported
    p.watch(later)
    fd = p.fileno()
    p.close()
    later.signal()  # the notifier's report for a closed poller goes nowhere
    time.sleep(0.05)
    assert p.closed
    with pytest.raises(ValueError):
        p.fileno()
    assert fd not in _eventfds()  # closed (a reused number would be no eventfd of ours)


def _eventfds() -> set[int]:
    out = set()
    for x in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{x}") == "anon_inode:[eventfd]":
                out.add(int(x))
        except OSError:
            pass
    return out


def test_domain_closed_under_a_watch(make_name: object) -> None:
    d = hl.Domain.create(make_name(), heap="1M")  # type: ignore[operator]
    f = d.fence()
    with hl.Poller() as p:
        tok = p.watch(f)
        d.close()
        got = _drain(p, 1, 5 + SLACK)
        assert len(got) == 1 and got[0].token == tok and got[0].status is None
        assert isinstance(got[0].error, hl.DomainClosed)


def test_callback_error_raised_after_the_others(dom: hl.Domain) -> None:
    a, b = dom.fence(), dom.fence()
    calls: list[int] = []

    def boom(r: hl.Ready) -> None:
        raise RuntimeError("callback failed")

    with hl.Poller() as p:
        p.watch(a, boom)
        tb = p.watch(b, lambda r: calls.append(r.token))
        a.signal()
        b.signal()
        time.sleep(0.1)
        with selectors.DefaultSelector() as sel:
            sel.register(p.fileno(), selectors.EVENT_READ)
            assert sel.select(timeout=5 + SLACK)
        with pytest.raises(RuntimeError, match="callback failed"):
            while len(calls) < 1:
                p.ready()
                time.sleep(0.01)
        assert calls == [tb]


def test_peer_killed_while_watched(dom: hl.Domain) -> None:
    child = spawn_child(
        """
        d = hl.Domain.open(sys.argv[1], label="victim")
        f = d.fence()
        d.publish("victim/f", f)
        print("ready", flush=True)
        sys.stdin.readline()
        """,
        dom.name,
    )
    try:
        assert read_line(child) == "ready"
        f = dom.lookup("victim/f", timeout=10)
        with hl.Poller() as p:
            tok = p.watch(f)
            assert p.ready() == []
            t0 = time.monotonic()
            kill_child(child)
            got = _drain(p, 1, 5 + SLACK)
            assert [(r.token, r.status) for r in got] == [(tok, S.OWNER_DIED)]
            assert time.monotonic() - t0 < 2 + SLACK  # the watchdog's 20 ms, not a timeout
    finally:
        kill_child(child)


def test_no_thread_per_wait(dom: hl.Domain) -> None:
    dom.notifier()  # the domain's one notifier thread
    before = threading.active_count()
    fs = [dom.fence() for _ in range(210)]  # more than one futex_waitv batch (127)
    pollers = [hl.Poller() for _ in range(3)]
    for i, f in enumerate(fs):
        pollers[i % 3].watch(f)
    time.sleep(0.05)
    assert threading.active_count() == before
    for f in fs:
        f.signal()
    got = sum(len(_drain(p, 70, 10 + SLACK)) for p in pollers)
    assert got == 210
    for p in pollers:
        p.close()


def test_ctrl_c_ends_a_select_on_the_descriptor(make_name: object) -> None:
    name = make_name()  # type: ignore[operator]
    code = child_code(
        """
        import selectors
        d = hl.Domain.create(sys.argv[1], heap="1M", unlink_on_close=True)
        f = d.fence()
        p = hl.Poller()
        p.watch(f)
        sel = selectors.DefaultSelector()
        sel.register(p.fileno(), selectors.EVENT_READ)
        print("waiting", flush=True)
        try:
            sel.select()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            p.close()
            d.close()
            sys.exit(0)
        print("woke", flush=True)
        sys.exit(1)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=2 + SLACK)
        assert proc.returncode == 0 and "interrupted" in out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_watch_refuses_what_it_cannot_watch(dom: hl.Domain) -> None:
    with hl.Poller() as p:
        with pytest.raises(TypeError):
            p.watch(dom.timeline())  # type: ignore[arg-type]  # a timeline needs a point
        f = dom.fence()
        f.release()
        with pytest.raises(hl.InvalidHandle):
            p.watch(f)
        with pytest.raises(TypeError):
            p.watch(dom.fence(), 5)  # type: ignore[arg-type]
