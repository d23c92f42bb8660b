"""The cost of a user span (``hostless.trace.span``) against the two engine calls it makes.

    python benchmarks/span_cost.py [-n N] [--rounds R]

In a fresh domain with a trace ring: ``with trace.span("frame", dom): pass`` N times, and N
pairs of bare ``trace_user`` calls (a begin and an end record, what a span writes); the mean
per block of each, per round.  ``PYTHONPATH=SITE`` runs another build (old vs new in turn).
The pipeline benchmark cuts traced frames inside such spans (``hostless_tools.bench.
pipeline_trace``): what a span costs beyond its two records lands in the first and last step
of every traced frame (``submit``, ``host_wake``).
"""

from __future__ import annotations

import argparse
import os
import time

import hostless as hl
from hostless import trace
from hostless._abi import C


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    name = f"span-cost-{os.getpid()}"
    dom = hl.Domain.create(name, heap=1 << 20, trace="1M")
    try:
        for _ in range(a.rounds):
            t0 = time.perf_counter_ns()
            for _ in range(a.n):
                with trace.span("frame", dom):
                    pass
            t1 = time.perf_counter_ns()
            for _ in range(a.n):
                C.trace_user(dom._core, 4, 1, "frame")
                C.trace_user(dom._core, 5, 1, "frame")
            t2 = time.perf_counter_ns()
            print(f"span block {(t1 - t0) / a.n:.0f} ns; two bare records {(t2 - t1) / a.n:.0f} ns")
    finally:
        dom.close()
        hl.Domain.unlink(name)


if __name__ == "__main__":
    main()
