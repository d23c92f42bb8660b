"""How long one look of an agent loop at an empty queue takes: ``pop_raw(timeout, spin)``.

    python benchmarks/pop_cycle.py [-n N] [--timeout-us T] [--spin-us S] [-o FILE]

The cuda agent's loop pops its queue with a bounded wait between looks at its armed segments
(``CudaLoop.ARMED_POLL_NS``, 100 us, of which it spins up to its spin, 50 us, and sleeps the
rest): the time between two looks is this cycle.  Measured with the thread's default timer
slack (50 us on Linux) and with 1 us (``PR_SET_TIMERSLACK``, what the cuda agent sets now);
p10 / p50 / p90 / p99 in us per setting, printed and (``-o``) written as JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import time

import numpy as np

import hostless as hl

_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30


def cycle(q: hl.Queue, n: int, timeout_ns: int, spin_ns: int) -> dict[str, float]:
    ts = []
    t = time.perf_counter_ns()
    for _ in range(n):
        q.pop_raw(timeout_ns, spin_ns)
        t2 = time.perf_counter_ns()
        ts.append(t2 - t)
        t = t2
    a = np.array(ts[n // 20 :]) / 1e3
    p = np.percentile(a, [10, 50, 90, 99])
    return {"p10_us": float(p[0]), "p50_us": float(p[1]), "p90_us": float(p[2]), "p99_us": float(p[3])}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("-n", type=int, default=3000)
    ap.add_argument("--timeout-us", type=float, default=100.0)
    ap.add_argument("--spin-us", type=float, default=50.0)
    ap.add_argument("-o", "--out", default=None)
    a = ap.parse_args()
    name = f"pop-cycle-{os.getpid()}"
    dom = hl.Domain.create(name, heap=1 << 20)
    libc = ctypes.CDLL(None, use_errno=True)
    res: dict[str, object] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "timeout_us": a.timeout_us,
        "spin_us": a.spin_us,
    }
    try:
        q = dom.queue(64)
        q.bind()
        before = libc.prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
        for label, slack in (("default_slack", before), ("slack_1us", 1000)):
            libc.prctl(_PR_SET_TIMERSLACK, slack, 0, 0, 0)
            r = cycle(q, a.n, int(a.timeout_us * 1e3), int(a.spin_us * 1e3))
            res[label] = {"slack_ns": slack, **r}
            print(f"{label:14s} (slack {slack} ns): " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()))
    finally:
        dom.close()
        hl.Domain.unlink(name)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
