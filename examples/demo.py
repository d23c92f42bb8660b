"""hostless demo: a chain of worker processes synchronized by fences, failures, a crash, and the benchmark.

    host --f0--> worker0 --f1--> worker1 --f2--> worker2 --f3--> host

1. The host creates a domain and starts three worker processes.  For every
   frame it creates four fences (f1..f3 owned by the worker expected to signal
   them) and hands the handles out once, ahead of time.  Then the only
   per-frame action of the host is "signal f0, wait f3": the workers wait on
   their input fence and signal their output fence peer-to-peer.
2. worker1 injects a failure (custom status 100) on one frame: worker2 sees it
   on its input and forwards it, and the host receives it at the end of the
   chain while every other frame succeeds.
3. The host kills worker1 with SIGKILL while it waits for its next frame.  Its
   output fence becomes OWNER_DIED through recovery (done by whichever live
   participant notices first); worker2 wakes with OWNER_DIED and forwards it;
   the domain checks clean afterwards.
4. The quick fence benchmark runs and prints its table.

Run: ``python examples/demo.py`` (about 10 s; cleans /dev/shm up).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
from multiprocessing.connection import Connection

import numpy as np

import hostless as hl
from hostless_tools.bench import fences as fence_bench
from hostless_tools.bench import fmt_ns

N_WORKERS = 3
FRAMES = 300
FAIL_FRAME = 150
FAULT = 100  # a custom status: "bad frame"


def worker(idx: int, name: str, conn: Connection) -> None:
    """Stage ``idx`` of the chain: wait on the input fence, signal the output fence."""
    dom = hl.Domain.open(name, label=f"worker{idx}")
    try:
        conn.send(dom.participant_id)
        frames: list[tuple[int, int]] = conn.recv()
        pairs = [(dom.import_fence(a), dom.import_fence(b)) for a, b in frames]
        conn.send("ready")
        for k, (fin, fout) in enumerate(pairs):
            st = fin.wait()
            if st is not hl.Status.SUCCESS:
                out = int(st)  # forward the upstream failure
            elif idx == 1 and k == FAIL_FRAME:
                out = FAULT  # injected failure
            else:
                out = int(hl.Status.SUCCESS)
            fout.signal(out)
            fin.release()
            fout.release()
        conn.send("done")
    finally:
        dom.close()


def main() -> int:
    t_start = time.monotonic()
    name = f"hostless-demo-{os.getpid()}"
    ctx = mp.get_context("spawn")
    dom = hl.Domain.create(name, fences=4096, participants=8, label="host", unlink_on_close=True)
    procs: list[mp.process.BaseProcess] = []
    p: mp.process.BaseProcess
    conns: list[Connection] = []
    try:
        print(f"[1] domain /dev/shm/{name}: starting {N_WORKERS} worker processes")
        for i in range(N_WORKERS):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=worker, args=(i, name, theirs), daemon=True)
            p.start()
            theirs.close()
            procs.append(p)
            conns.append(mine)
        ids = [int(c.recv()) for c in conns]
        owners = [dom.participant_id, *ids]  # signaler of f0, f1, f2, f3

        # every frame's chain, plus one more for the crash in step 3
        chains = [[dom.fence(owner=owners[j]) for j in range(N_WORKERS + 1)] for _ in range(FRAMES + 1)]
        for i, c in enumerate(conns):
            c.send([(ch[i].handle, ch[i + 1].handle) for ch in chains])
        for c in conns:
            assert c.recv() == "ready"
        for part in dom.participants:
            print(f"    participant {part.id:5d}  pid {part.pid:7d}  {part.label:8s}  {part.state}")

        # ---------------------------------------------------------------- 1 + 2
        print(f"[2] {FRAMES} frames through the chain; worker1 fails frame {FAIL_FRAME} with status {FAULT}")
        lat = np.zeros(FRAMES, dtype=np.int64)
        statuses: dict[str, list[int]] = {}
        for k in range(FRAMES):
            ch = chains[k]
            t0 = time.perf_counter_ns()
            ch[0].signal()
            st = ch[-1].wait(timeout=10)
            lat[k] = time.perf_counter_ns() - t0
            statuses.setdefault(st.name, []).append(k)
            for f in ch:
                f.release()
        for st_name, ks in statuses.items():
            shown = ks if len(ks) <= 5 else f"{len(ks)} frames"
            print(f"    {st_name:12s} {shown}")
        p50, p99 = (float(x) for x in np.percentile(lat, [50, 99]))
        print(f"    host signal f0 -> f3 done, 3 hops: p50 {fmt_ns(p50)}, p99 {fmt_ns(p99)}")
        print(
            f"    ({N_WORKERS + 1} processes on {os.cpu_count()} CPUs, lock-step: a stage idle for longer"
            " than its 50 us spin sleeps on the futex, so each hop here costs a kernel wake-up)"
        )
        assert statuses.get(hl.Status(FAULT).name) == [FAIL_FRAME], statuses

        # ------------------------------------------------------------------- 3
        crash = chains[FRAMES]
        victim = procs[1]
        print(f"[3] SIGKILL worker1 (pid {victim.pid}) while it waits for its next frame")
        assert victim.pid is not None
        t_kill = time.perf_counter()
        os.kill(victim.pid, signal.SIGKILL)
        st1 = crash[2].wait(timeout=5)  # worker1's output fence
        dt_ms = (time.perf_counter() - t_kill) * 1e3
        print(f"    worker1's output fence: {st1.name}, {dt_ms:.1f} ms after the kill (recovery)")
        victim.join(5)
        crash[0].signal()
        st3 = crash[3].wait(timeout=5)
        print(f"    end of the chain: {st3.name} (worker2 forwarded it)")
        assert st1 is hl.Status.OWNER_DIED and st3 is hl.Status.OWNER_DIED
        for f in crash:
            f.release()
        for i in (0, 2):
            assert conns[i].recv() == "done"
            procs[i].join(5)
        problems = dom.check()
        print(
            "    participants now: " + ", ".join(f"{part.label} ({part.state})" for part in dom.participants)
        )
        print(f"    dom.check(): {'clean' if not problems else problems}")
        assert not problems, problems
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
        for c in conns:
            c.close()
        dom.close()  # unlink_on_close: the name goes with it

    # ----------------------------------------------------------------------- 4
    print("[4] hostless bench fences --quick")
    result = fence_bench.run(fence_bench.FenceBenchConfig.quick_config(), progress=lambda _m: None)
    fence_bench.print_report(result)
    left = [f for f in os.listdir("/dev/shm") if f.startswith(("hostless-demo-", "hostless-bench-"))]
    left = [f for f in left if str(os.getpid()) in f]
    print(f"done in {time.monotonic() - t_start:.1f} s; /dev/shm leftovers: {left or 'none'}")
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(main())
