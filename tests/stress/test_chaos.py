"""Chaos: participants SIGKILLed at random points of their work.

Worker processes (chaos_worker.py) loop over random create / import / signal /
wait / release / merge / timeline operations on their own objects and on the
handles everyone publishes in a shared file.  The parent kills random workers
at random times (at least 50 kills of joined workers; 200 with HOSTLESS_TEST_FULL=1,
and ``hostless chaos`` soaks longer) and starts new ones,
while its waiter threads wait on fences, merged fences and timelines the
workers own.  Afterwards: every waiter returned with a final status (many of
them OWNER_DIED), recovery left a consistent domain (check() is empty), no
participant is left behind and, once the parent released what it holds, every
slot of the fence table is FREE.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import hostless as hl
from conftest import assert_all_free, full_or, wait_until

pytestmark = pytest.mark.slow  # deselect with: pytest -m "not slow"

S = hl.Status
WORKER = str(Path(__file__).with_name("chaos_worker.py"))
KILLS = full_or(50, 200)
CONCURRENT = 6
WAITERS = 4


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    started: float
    kill_at: float | None = None  # set once it is ready (or at once for an early kill)
    ready: bool = False
    early: bool = False
    grace: bool = False  # leaves with close() on its own: never killed


def test_chaos_kills(domain_name: str, tmp_path: Path) -> None:
    rnd = random.Random(int.from_bytes(os.urandom(4), "little"))
    seed0 = rnd.randrange(1 << 30)
    print(f"chaos seed base {seed0}")
    handles = tmp_path / "handles"
    handles.write_text("")
    failures: list[str] = []
    results: list[hl.Status] = []
    res_lock = threading.Lock()
    stop = threading.Event()

    d = hl.Domain.create(domain_name, fences=1024, participants=24, watchdog_interval=0.02)
    try:
        # parent-owned objects the workers may import, signal and merge
        mine = [d.fence() for _ in range(16)]
        tls = [d.timeline() for _ in range(4)]
        with open(handles, "a") as fh:
            for f in mine:
                fh.write(f"F {f.handle}\n")
            for t in tls:
                fh.write(f"T {t.handle}\n")
        parent_handles = {o.handle for o in (*mine, *tls)}

        def published() -> list[tuple[str, int]]:
            out = []
            for line in handles.read_text().splitlines()[-60:]:
                parts = line.split()
                if len(parts) == 2 and int(parts[1]) not in parent_handles:
                    out.append((parts[0], int(parts[1])))
            return out

        def waiter(k: int) -> None:
            wr = random.Random(seed0 + 7919 * k)
            while not stop.is_set():
                cands = published()
                if not cands:
                    time.sleep(0.01)
                    continue
                kind, h = wr.choice(cands)
                if (h >> 48) & 0xFF == 3 and wr.random() < 0.9:
                    # merged fences built on the parent's own fences complete only at the
                    # end of the run: waiting on many of them starves the statistics below
                    continue
                try:
                    o = d.import_timeline(h) if kind == "T" else d.import_fence(h)
                except hl.InvalidHandle:
                    continue  # released before we got to it
                # An object completes when its owner dies (or signals it): wait in slices while
                # the run goes on (a loaded machine makes runs long).  A merged fence may also
                # wait for our own fences, which we signal only at the end of the run: after 5 s
                # it is parked (still held) and checked after the run, so that it does not starve
                # the statistics.  Once the run has ended (stop: workers gone, our fences
                # signaled) an object unfinished after 30 s more is a hung waiter.
                t_obj = time.monotonic()
                parked = False
                try:
                    while True:
                        done_run = stop.is_set()
                        try:
                            if isinstance(o, hl.Timeline):
                                st = o.wait(2**61, 30 if done_run else 1)  # returns once it fails
                            else:
                                st = o.wait(30 if done_run else 1)
                            break
                        except TimeoutError:
                            if done_run:
                                with res_lock:
                                    failures.append(
                                        f"waiter {k}: {kind} {h:#x} not completed 30 s after the run (hung)"
                                    )
                                return
                            if kind == "M" and time.monotonic() - t_obj > 5:
                                with res_lock:
                                    parked_objs.append((k, kind, h, o))
                                parked = True
                                break
                finally:
                    if not parked:
                        o.release()
                if parked:
                    continue
                with res_lock:
                    results.append(st)

        parked_objs: list[tuple[int, str, int, hl.Fence]] = []
        waiters = [threading.Thread(target=waiter, args=(k,), daemon=True) for k in range(WAITERS)]
        for th in waiters:
            th.start()

        workers: list[Worker] = []
        kills = early_kills = graceful = spawned = 0
        t_start = time.monotonic()

        def spawn() -> None:
            nonlocal spawned
            spawned += 1
            out, err = tmp_path / f"w{spawned}.out", tmp_path / f"w{spawned}.err"
            grace = rnd.random() < 0.05
            argv = [sys.executable, WORKER, domain_name, str(handles), str(seed0 + spawned), str(int(grace))]
            with open(out, "wb") as o, open(err, "wb") as e:
                proc = subprocess.Popen(
                    argv,
                    stdout=o,
                    stderr=e,
                    stdin=subprocess.DEVNULL,
                )
            w = Worker(proc, out, err, time.monotonic(), grace=grace)
            if not grace and rnd.random() < 0.05:  # killed while starting or joining
                w.early = True
                w.kill_at = w.started + rnd.uniform(0.0, 0.4)
            workers.append(w)

        def reap_exited(w: Worker) -> None:
            """Collect an exited worker: SIGKILLed (after joining or before) or left on its own."""
            nonlocal graceful, kills, early_kills
            rc = w.proc.wait()
            errtext = w.err.read_text()
            if "Traceback" in errtext or rc not in (0, -9):
                failures.append(f"worker {w.proc.pid} exited with {rc}:\n{errtext[-2000:]}")
            elif rc == 0:
                graceful += 1
            elif w.out.stat().st_size > 0:  # it had printed "ready": it was a participant
                kills += 1
            else:
                early_kills += 1

        def kill(w: Worker) -> None:
            w.proc.kill()  # SIGKILL, by pid: a process we started
            workers.remove(w)
            reap_exited(w)

        while kills < KILLS:
            assert time.monotonic() - t_start < 240, f"only {kills} kills in 240 s"
            assert not failures, failures[0]
            while len(workers) < CONCURRENT:
                spawn()
            time.sleep(0.005)
            now = time.monotonic()
            for w in list(workers):
                if w.proc.poll() is not None:
                    workers.remove(w)
                    reap_exited(w)
                    continue
                if not w.ready and w.out.stat().st_size > 0:
                    w.ready = True
                    if not w.early and not w.grace:
                        w.kill_at = now + rnd.uniform(0.0, 0.35)
                if w.kill_at is not None and now >= w.kill_at:
                    kill(w)
        for w in list(workers):  # the survivors die too; those leaving on their own may finish
            if w.grace:
                try:
                    w.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    failures.append(f"worker {w.proc.pid} did not leave on its own")
                    w.proc.kill()
                workers.remove(w)
                reap_exited(w)
            else:
                kill(w)
        elapsed = time.monotonic() - t_start

        # Every worker is dead: what they own is OWNER_DIED.  Merged fences may
        # still wait for our own fences: complete those, then the waiters must end.
        for f in mine:
            try:
                f.signal()
            except hl.AlreadySignaled:
                pass
        stop.set()
        for th in waiters:
            th.join(70)
        assert not [th for th in waiters if th.is_alive()], "a waiter never returned"
        for k, kind, h, o in parked_objs:  # merged fences parked during the run: they must end now
            try:
                results.append(o.wait(30))
            except TimeoutError:
                failures.append(f"waiter {k}: {kind} {h:#x} not completed 30 s after the run (hung)")
            finally:
                o.release()
        assert not failures, "\n".join(failures[:5])

        d.reap()
        assert wait_until(lambda: [p.id for p in d.participants] == [d.participant_id], 5), d.participants
        assert d.check() == []
        h = d.header()
        joined = sum(1 for p in tmp_path.glob("w*.out") if p.read_text().startswith("ready"))
        # every worker that joined was either killed (and recovered by someone) or left with close()
        recovered = int(h["stats_recovered"])
        assert kills + graceful == joined, (kills, graceful, joined)
        assert recovered >= kills, (recovered, kills)

        for o in (*mine, *tls):
            o.release()
        assert_all_free(d)
        assert d.check() == []

        died = sum(1 for s in results if s is S.OWNER_DIED)
        print(
            f"chaos: {kills} kills of joined workers (+{early_kills} while starting), {graceful} left "
            f"on their own, {spawned} started, {len(results)} parent waits ({died} OWNER_DIED) "
            f"in {elapsed:.1f} s"
        )
        assert kills >= KILLS
        assert results and died > 0
        assert all(s is not S.ACTIVE for s in results)
    finally:
        stop.set()
        d.close()


@pytest.mark.parametrize("when", ["after_create", "after_import", "in_wait"])
def test_kill_at_a_known_point(domain_name: str, when: str) -> None:
    """Deterministic kill points, each checked for a consistent domain and no leak."""
    body = {
        "after_create": "fs = [d.fence() for _ in range(5)]; m = d.merge(fs[:3]); t = d.timeline(1)",
        "after_import": "g = d.import_fence(h); m = d.merge([g]); g2 = d.import_fence(h)",
        "in_wait": "g = d.import_fence(h); print('w', flush=True); g.wait(60)",
    }[when]
    code = (
        "import sys, hostless as hl\n"
        "d = hl.Domain.open(sys.argv[1], watchdog_interval=0)\n"
        "h = int(sys.argv[2])\n"
        f"{body}\n"
        "print('ok', flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    with hl.Domain.create(domain_name, fences=64) as d:
        f = d.fence()
        p = subprocess.Popen(
            [sys.executable, "-c", code, domain_name, str(f.handle)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert p.stdout is not None
            assert p.stdout.readline().strip() in ("ok", "w")
        finally:
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
        d.reap()
        assert d.check() == []
        assert f.status is S.ACTIVE  # we own and hold it: untouched by the death
        f.release()
        assert_all_free(d)
