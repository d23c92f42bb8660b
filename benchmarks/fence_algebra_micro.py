"""Microbenchmark for issue 27 (fence algebra), in one process: fence signal+wait,
timeline signal+wait, create+signal+release, and wait_any over 8 objects vs a
single wait (the completing object signalled just before the wait).  Writes
JSON to benchmarks/results/fence_algebra_micro.json and a short .md report.
Only the new code is measured (no old build in the same run)."""

from __future__ import annotations

import json
import os
import platform
import time
import uuid

import hostless as hl

N = 20000


def per_op(fn, n: int = N) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main() -> None:
    dom = hl.Domain.create(f"hl_bench_fa_{uuid.uuid4().hex[:6]}", unlink_on_close=True)
    t = dom.timeline()
    state = {"v": 0}

    def fence_rt(n: int) -> None:
        for _ in range(n):
            f = dom.fence()
            f.signal()
            f.wait(1)
            f.release()

    def tl_rt(n: int) -> None:
        for _ in range(n):
            state["v"] += 1
            t.signal(state["v"])
            t.wait(state["v"], 1)

    def create(n: int) -> None:
        for _ in range(n):
            f = dom.fence()
            f.signal()
            f.release()

    others = [dom.fence() for _ in range(7)]

    def single(n: int) -> None:
        for _ in range(n):
            state["v"] += 1
            t.signal(state["v"])
            t.point(state["v"]).wait(1)

    def any8(n: int) -> None:
        for _ in range(n):
            state["v"] += 1
            t.signal(state["v"])
            hl.wait_any([*others, t.point(state["v"])], timeout=1)

    res = {
        "fence_create_signal_wait_release_us": per_op(fence_rt),
        "timeline_signal_wait_us": per_op(tl_rt),
        "create_signal_release_us": per_op(create),
        "point_wait_us": per_op(single),
        "wait_any_8_us": per_op(any8),
    }
    res["wait_any_8_over_single"] = res["wait_any_8_us"] / res["point_wait_us"]
    dom.close()
    note = "loaded 2-core machine, one process"
    out = {"machine": platform.node(), "cpus": os.cpu_count(), "note": note, **res}
    os.makedirs("benchmarks/results", exist_ok=True)
    with open("benchmarks/results/fence_algebra_micro.json", "w") as fh:
        json.dump(out, fh, indent=2)
    with open("benchmarks/results/fence_algebra_micro.md", "w") as fh:
        fh.write("# fence algebra microbenchmark (loaded 2-core machine)\n\n| figure | value |\n|---|---|\n")
        for k, v in res.items():
            fh.write(f"| {k} | {v:.3f} |\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
