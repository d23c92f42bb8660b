"""Several processes in one domain: signal/wait, asyncio, merge, timelines, fd passing, crashes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

import hostless as hl
from conftest import (
    SLACK,
    assert_all_free,
    child_code,
    finish_child,
    ident,
    kill_child,
    live_slots,
    read_line,
    send_line,
    spawn_child,
    wait_asleep,
    wait_until,
    waiter_count,
)
from hostless._abi import C

S = hl.Status

# A child that joins, imports a fence (handle on stdin), says "ready", waits and prints the status.
WAITER = """
d = hl.Domain.open(sys.argv[1])
f = d.import_fence(int(sys.stdin.readline()))
print("ready", flush=True)
try:
    st = f.wait(15)
    print(int(st), flush=True)
except TimeoutError:
    print("timeout", flush=True)
f.release()
d.close()
"""


def test_signal_in_one_wait_in_many(domain_name: str) -> None:
    with hl.Domain.create(domain_name) as d:
        waiters = [spawn_child(WAITER, domain_name) for _ in range(3)]
        signaler = spawn_child(
            """
            d = hl.Domain.open(sys.argv[1])
            f = d.fence()
            print(f.handle, flush=True)
            sys.stdin.readline()  # go
            f.signal(hl.Status(77))
            print("signaled", flush=True)
            sys.stdin.readline()
            d.close()
            """,
            domain_name,
        )
        try:
            h = int(read_line(signaler))
            mine = d.import_fence(h)
            for w in waiters:
                send_line(w, str(h))
            for w in waiters:
                assert read_line(w) == "ready"
            # the three waiters asleep (their main threads in a futex wait, counted on the
            # fence) before the signal: the cross-process wake-from-sleep path
            wait_asleep(d, mine, 3, [(w.pid, w.pid) for w in waiters])
            assert mine.status is S.ACTIVE
            send_line(signaler, "go")
            assert read_line(signaler) == "signaled"
            assert mine.wait(5) == S(77)
            for w in waiters:
                assert read_line(w) == "77"
                finish_child(w)
            send_line(signaler, "bye")
            finish_child(signaler)
            mine.release()
            assert d.check() == []
            assert_all_free(d)
        finally:
            for p in (*waiters, signaler):
                kill_child(p)


def test_async_waits_across_processes(domain_name: str) -> None:
    with hl.Domain.create(domain_name) as d:
        fs = [d.fence() for _ in range(50)]
        t = d.timeline()
        child = spawn_child(
            """
            import asyncio
            d = hl.Domain.open(sys.argv[1])
            hs = [int(x) for x in sys.stdin.readline().split()]
            fs = [d.import_fence(h) for h in hs[:-1]]
            t = d.import_timeline(hs[-1])
            async def main():
                tasks = [asyncio.ensure_future(f.wait_async(10)) for f in fs]
                tasks.append(asyncio.ensure_future(t.wait_async(42, 10)))
                print("ready", flush=True)
                return await asyncio.gather(*tasks)
            print(" ".join(str(int(s)) for s in asyncio.run(main())), flush=True)
            d.close()
            """,
            domain_name,
        )
        try:
            send_line(child, " ".join(str(x.handle) for x in [*fs, t]))
            assert read_line(child) == "ready"
            # the child's notifier sleeps on all 51 words (one futex_waitv) before the signals
            assert wait_until(lambda: all(waiter_count(d, x) for x in [*fs, t]), 20)
            for i, f in enumerate(fs):
                f.signal(S(64 + i) if i % 5 == 0 else S.SUCCESS)
            t.signal(41)
            t.signal(42)
            got = [int(x) for x in read_line(child).split()]
            assert got == [64 + i if i % 5 == 0 else 2 for i in range(50)] + [2]
            finish_child(child)
        finally:
            kill_child(child)


def test_merge_across_processes(domain_name: str) -> None:
    signaler = """
        d = hl.Domain.open(sys.argv[1])
        f = d.import_fence(int(sys.argv[2]))
        print("ready", flush=True)
        sys.stdin.readline()
        f.signal(int(sys.argv[3]))
        print("done", flush=True)
        sys.stdin.readline()
        d.close()
    """
    with hl.Domain.create(domain_name) as d:
        a, b, c = d.fence(), d.fence(), d.fence()
        ab = d.merge([a, b])
        m = d.merge([ab, c])
        x = spawn_child(signaler, domain_name, a.handle, int(S.SUCCESS))
        y = spawn_child(signaler, domain_name, b.handle, int(S(300)))
        z = spawn_child(WAITER, domain_name)
        try:
            send_line(z, str(m.handle))
            for p in (x, y, z):
                assert read_line(p) == "ready"
            send_line(x, "go")
            assert read_line(x) == "done"
            assert ab.status is S.ACTIVE and m.status is S.ACTIVE
            send_line(y, "go")
            assert read_line(y) == "done"
            assert ab.wait(2) == S(300)
            assert m.status is S.ACTIVE
            c.signal(S.ERROR)  # later failure: the first one propagated wins
            assert m.wait(2) == S(300)
            assert read_line(z) == "300"
            for p in (x, y):
                send_line(p, "bye")
            for p in (x, y, z):
                finish_child(p)
            assert d.check() == []
        finally:
            for p in (x, y, z):
                kill_child(p)


def test_timeline_across_processes(domain_name: str) -> None:
    waiter = """
        d = hl.Domain.open(sys.argv[1])
        t = d.import_timeline(int(sys.argv[2]))
        points = [int(v) for v in sys.argv[3:]]
        print("ready", flush=True)
        out = []
        for v in points:
            st = t.wait(v, 15)
            out.append(f"{v}:{int(st)}:{t.value >= v}")
        print(" ".join(out), flush=True)
        d.close()
    """
    with hl.Domain.create(domain_name) as d:
        t = d.timeline()
        advancer = spawn_child(
            """
            d = hl.Domain.open(sys.argv[1])
            t = d.import_timeline(int(sys.argv[2]))
            sys.stdin.readline()
            for v in range(1, 51):
                t.signal(v)
                time.sleep(0.002)
            print("done", flush=True)
            d.close()
            """,
            domain_name,
            t.handle,
        )
        ws = [spawn_child(waiter, domain_name, t.handle, *pts) for pts in ((10, 25, 50), (1, 49), (50,))]
        try:
            for w in ws:
                assert read_line(w) == "ready"
            send_line(advancer, "go")
            assert t.wait(50, 15) is S.SUCCESS
            assert read_line(advancer) == "done"
            assert read_line(ws[0]) == "10:2:True 25:2:True 50:2:True"
            assert read_line(ws[1]) == "1:2:True 49:2:True"
            assert read_line(ws[2]) == "50:2:True"
            for p in (advancer, *ws):
                finish_child(p)
            # the advancer owned nothing: the timeline (ours) is not failed by its exit
            assert t.failure is None and t.value == 50
        finally:
            for p in (advancer, *ws):
                kill_child(p)


def test_domain_passed_as_fd(domain_name: str) -> None:
    """The domain travels over a Unix socket (SCM_RIGHTS); the name is already gone."""
    with hl.Domain.create(domain_name) as d:
        hl.Domain.unlink(domain_name)  # only the fd leads to it now
        f = d.fence()
        t = d.timeline()
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        code = child_code(
            """
            import socket
            s = socket.socket(fileno=int(sys.argv[1]))
            msg, fds, _flags, _addr = socket.recv_fds(s, 1024, 1)
            f_h, t_h = (int(x) for x in msg.split())
            d = hl.Domain.from_fd(fds[0], label="byfd")
            os.close(fds[0])
            assert d.name is None
            f = d.import_fence(f_h)
            t = d.import_timeline(t_h)
            t.signal(9)
            f.signal(hl.Status(4242))
            s.sendall(f"{d.participant_id}\\n".encode())
            s.recv(1)
            d.close()
            """
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(child_sock.fileno())],
            pass_fds=(child_sock.fileno(),),
            stderr=subprocess.PIPE,
            text=True,
        )
        child_sock.close()
        try:
            socket.send_fds(parent_sock, [f"{f.handle} {t.handle}".encode()], [d.fileno()])
            assert f.wait(15) == S(4242)
            assert t.wait(9, 5) is S.SUCCESS
            pid = int(parent_sock.makefile().readline())
            p = next(p for p in d.participants if p.id == pid)
            assert p.label == "byfd" and p.pid == proc.pid
            parent_sock.sendall(b"x")
            assert proc.wait(15) == 0, proc.stderr.read() if proc.stderr else ""
            assert [p.id for p in d.participants] == [d.participant_id]
            assert d.check() == []
        finally:
            parent_sock.close()
            kill_child(proc)  # type: ignore[arg-type]


def test_killed_owner_wakes_waiters(domain_name: str) -> None:
    """SIGKILL of the owner: every waiter of its fences and timelines wakes with OWNER_DIED
    within about 100 ms (watchdog every 20 ms), references are dropped, slots freed."""
    with hl.Domain.create(domain_name, watchdog_interval=0.02) as d:
        child = spawn_child(
            """
            d = hl.Domain.open(sys.argv[1], watchdog_interval=0)
            f, g = d.fence(), d.fence()
            t = d.timeline(5)
            private = [d.fence() for _ in range(10)]  # held by the child only
            m = d.merge([f, g])
            g.signal()
            print(f.handle, t.handle, m.handle, d.participant_id, flush=True)
            time.sleep(60)
            """,
            domain_name,
        )
        try:
            fh, th, mh, cid = map(int, read_line(child).split())
            f, t, m = d.import_fence(fh), d.import_timeline(th), d.import_fence(mh)
            assert live_slots(d) == 14  # f, g, t, m and 10 private
            got: dict[str, tuple[object, float]] = {}

            def wait(name: str, fn) -> None:  # type: ignore[no-untyped-def]
                st = fn()
                got[name] = (st, time.monotonic())

            ths = [
                threading.Thread(target=wait, args=("f", lambda: f.wait(10))),
                threading.Thread(target=wait, args=("t", lambda: t.wait(6, 10))),
                threading.Thread(target=wait, args=("m", lambda: m.wait(10))),
            ]
            for th in ths:
                th.start()
            for o, th in zip((f, t, m), ths, strict=True):  # each waiter asleep on it when the owner dies
                wait_asleep(d, o, 1, [ident(th)])
            t_kill = time.monotonic()
            kill_child(child)
            for th in ths:
                th.join(10)
            assert {k: v[0] for k, v in got.items()} == dict.fromkeys("ftm", S.OWNER_DIED)
            latest = max(v[1] for v in got.values()) - t_kill
            # ~0.1 s unloaded; within the suite's slack, well before the waits' own 10 s timeouts
            assert latest < SLACK, f"recovered after {latest:.3f} s"
            assert t.value == 5
            # the waiters may wake before the recoverer has finished with the slot table
            assert wait_until(lambda: cid not in {p.id for p in d.participants}, 2)
            assert live_slots(d) == 3  # the 10 private fences and g were freed
            for o in (f, t, m):
                o.release()
            assert d.check() == []
            assert_all_free(d)
        finally:
            kill_child(child)


def test_participant_killed_in_a_loop_leaves_consistent_domain(domain_name: str) -> None:
    """A child doing create/import/signal/release in a tight loop is killed mid-way."""
    with hl.Domain.create(domain_name) as d:
        shared = [d.fence() for _ in range(8)]
        hs = " ".join(str(f.handle) for f in shared)
        for round_ in range(4):
            child = spawn_child(
                """
                import random
                d = hl.Domain.open(sys.argv[1])
                hs = [int(x) for x in sys.argv[2:]]
                print("go", flush=True)
                held = []
                while True:
                    r = random.random()
                    try:
                        if r < 0.3:
                            held.append(d.fence())
                        elif r < 0.5:
                            held.append(d.import_fence(random.choice(hs)))
                        elif r < 0.6 and held:
                            held[-1].signal(random.choice([2, 3, 100]))
                        elif r < 0.7 and len(held) > 1:
                            held.append(d.merge(held[-2:]))
                        elif held:
                            held.pop(random.randrange(len(held))).release()
                    except (hl.AlreadySignaled, hl.InvalidOperation, hl.DomainFull):
                        pass
                """,
                domain_name,
                *hs.split(),
            )
            try:
                assert read_line(child) == "go"
                time.sleep(0.05 + 0.05 * round_)
            finally:
                kill_child(child)
            d.reap()
            assert d.check() == [], d.check()
            assert live_slots(d) == 8
        assert all(f.status in (S.ACTIVE, S.SUCCESS, S.ERROR, S(100)) for f in shared)


@pytest.mark.parametrize("exit_how", ["close", "exit"])
def test_child_leaves_cleanly(domain_name: str, exit_how: str) -> None:
    with hl.Domain.create(domain_name) as d:
        body = """
            d = hl.Domain.open(sys.argv[1])
            f = d.fence()
            print(f.handle, flush=True)
            sys.stdin.readline()
            if sys.argv[2] == "close":
                d.close()
            else:
                os._exit(0)  # no close: the death is noticed through the liveness lock
        """
        child = spawn_child(body, domain_name, exit_how)
        try:
            f = d.import_fence(int(read_line(child)))
            send_line(child, "bye")
            finish_child(child)
            # close(): the owner left (ABI 6); os._exit without close: a death
            assert f.wait(2) is (S.OWNER_LEFT if exit_how == "close" else S.OWNER_DIED)
            assert os.path.exists(f"/dev/shm/{domain_name}")
            assert d.check() == []
        finally:
            kill_child(child)


def test_concurrent_reaps_do_not_hurt_a_newcomer(domain_name: str) -> None:
    """Two recoveries of the same dead participant in one process (the watchdog thread
    and a reap() call, or two reap() calls) must not touch the participant that
    takes the freed slot afterwards.

    BUG: reap_all() treats a slot in RECOVERING(me) as "ours, interrupted earlier"
    and runs recover_participant() again even while another thread of this
    process is still running it.  When the first one finishes, the slot is FREE
    and a newcomer joins with the same index; the second, still scanning, then
    drops the newcomer's reference bits (1 << index is not incarnation-specific)
    -- freeing the newcomer's fence under it -- and wipes its pid and label.
    Here the second reaper is made slow with nice 19 on a shared CPU.
    """
    cpus = sorted(os.sched_getaffinity(0))
    cap = 1 << 21  # a big table: a recovery scan takes a while
    with hl.Domain.create(domain_name, fences=cap, participants=4, watchdog_interval=0) as d:
        child = spawn_child(
            "d = hl.Domain.open(sys.argv[1], watchdog_interval=0)\nprint(d.participant_id, flush=True)\n"
            "time.sleep(60)\n",
            domain_name,
        )
        cid = int(read_line(child))
        kill_child(child)
        raw = d.raw()
        alloc_hint = int(C.H_EPOCH) + 8  # hl_header.alloc_hint follows epoch
        raw[alloc_hint : alloc_hint + 4] = (cap - 10).to_bytes(4, "little")  # newcomer's fence: last slots
        pctl = int(d.header()["participants_offset"]) + (cid & 0xFF) * int(C.PARTICIPANT_SIZE)

        def pstate() -> int:
            return raw[pctl]

        res: dict[str, list[int]] = {}
        go = threading.Event()
        saved = os.sched_getaffinity(0)

        def first() -> None:
            os.sched_setaffinity(0, {cpus[0]})
            res["first"] = d.reap()

        def second() -> None:
            os.sched_setaffinity(0, {cpus[0]})
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            go.wait()
            res["second"] = d.reap()

        t2 = threading.Thread(target=second)
        t1 = threading.Thread(target=first)
        try:
            os.sched_setaffinity(0, {cpus[-1]})
            t2.start()
            t1.start()
            assert wait_until(lambda: pstate() == int(C.PART_RECOVERING), 10, 0)
            go.set()
            assert wait_until(lambda: pstate() == int(C.PART_FREE), 30, 0)
            newcomer = hl.Domain.open(domain_name, label="newcomer", watchdog_interval=0)
            f = newcomer.fence()
            t1.join(30)
            t2.join(30)
        finally:
            os.sched_setaffinity(0, saved)
        try:
            assert res == {"first": [cid], "second": []}
            assert newcomer.participant_id & 0xFF == cid & 0xFF
            me = next(p for p in d.participants if p.id == newcomer.participant_id)
            assert (me.pid, me.label) == (os.getpid(), "newcomer"), "the newcomer's entry was wiped"
            assert f.status is S.ACTIVE, "the newcomer's fence was freed under it"
            assert d.check() == []
        finally:
            newcomer.close()
