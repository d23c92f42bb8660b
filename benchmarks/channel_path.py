"""The per-frame cost of a channel's hot path, in one process (issue 24's latency goal).

    python benchmarks/channel_path.py [-n FRAMES] [--rounds R] [--subs S] [--json PATH]

One publisher and ``S`` subscribers (default 1; "block" policy, start "next") of a 64-byte
channel (depth 4) in one process, through two participants of one domain (the publisher's
and the subscribers'), so nothing waits: each step is ``with pub.loan() as f: f.data[0] = i``
then, for each subscriber, ``with sub.receive() as g: g.data[0]``.  Per round, the median
over ``n`` frames of the time (``perf_counter_ns``) of the loan block and of one subscriber's
receive block; the result is the median over rounds of those medians (and their range).  The
cost of an empty Python function call is printed for scale (the interpreter's speed on this
machine).  This isolates the CPU cost of the API from the wake-up latency that
``hostless bench channel`` measures across processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import hostless as hl


def _empty() -> None:
    pass


def measure(n: int, rounds: int, subs: int) -> dict[str, object]:
    name = f"hl-chpath-{os.getpid()}"
    loans: list[float] = []
    recvs: list[float] = []
    floor: list[float] = []
    with hl.Domain.create(name, heap="4M", unlink_on_close=True) as a:
        b = hl.Domain.open(name, label="subs")
        try:
            pub = hl.Channel(a, "c", 64, depth=4)
            ss = [hl.Subscriber(b, "c", f"s{i}", start="next") for i in range(subs)]
            sub = ss[0]
            pc = time.perf_counter_ns
            for _ in range(rounds):
                tl = np.empty(n, np.int64)
                tr = np.empty(n, np.int64)
                for i in range(n):
                    t0 = pc()
                    with pub.loan() as f:
                        f.data[0] = i & 0xFF
                    t1 = pc()
                    with sub.receive() as g:
                        g.data[0]
                    t2 = pc()
                    for s in ss[1:]:
                        with s.receive():
                            pass
                    tl[i], tr[i] = t1 - t0, t2 - t1
                loans.append(float(np.median(tl[n // 10 :])))
                recvs.append(float(np.median(tr[n // 10 :])))
                t0 = pc()
                for _ in range(n):
                    _empty()
                floor.append((pc() - t0) / n)
            for s in ss:
                s.close()
            pub.close()
        finally:
            b.close()

    def fig(xs: list[float]) -> dict[str, float]:
        return {"median_ns": statistics.median(xs), "min_ns": min(xs), "max_ns": max(xs)}

    return {"frames": n, "rounds": rounds, "subscribers": subs, "loan_publish": fig(loans),
            "receive_release": fig(recvs), "python_call": fig(floor)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=20000, help="frames per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--subs", type=int, default=1)
    ap.add_argument("--json", help="write the result here too")
    a = ap.parse_args()
    r = measure(a.n, a.rounds, a.subs)
    for k in ("loan_publish", "receive_release", "python_call"):
        f = r[k]
        assert isinstance(f, dict)
        print(f"{k:16s} median {f['median_ns']:8.0f} ns  (rounds: {f['min_ns']:.0f}..{f['max_ns']:.0f})")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(r, fh, indent=1)


if __name__ == "__main__":
    main()
