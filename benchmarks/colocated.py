"""A frame's latency when the host and its agent share one CPU, against two CPUs.

    python benchmarks/colocated.py [--frames N] [--runs R] [--label L] [-o FILE]

A one-stage graph (a cpu agent's ``copy`` of 64x64 float32, direct+shared) is run frame by
frame with the host thread and every thread of the agent pinned: to CPUs 0 and 1
(``apart``), and both to CPU 0 (``together``, what the scheduler does at times on its own,
placing a woken task next to its waker).  A spinning wait that never gives its CPU away
holds the process it waits for off that CPU for its whole spin; the engine's waits yield
past ``HLE_SPIN_PURE_NS`` (engine.h).  p10 / p50 / p90 in us per placement and run,
printed and (``-o``) written as JSON.  Run it with ``PYTHONPATH`` pointing at another build
for an A/B.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import numpy as np

import hostless as hl
from hostless import agents
from hostless.graph import Graph


def _pin(host: int, agent_pid: int, agent_cpu: int) -> None:
    os.sched_setaffinity(0, {host})
    for t in glob.glob(f"/proc/{agent_pid}/task/*"):
        os.sched_setaffinity(int(t.rsplit("/", 1)[1]), {agent_cpu})


def run_once(placement: tuple[int, int], frames: int, n: int) -> dict[str, float]:
    name = f"colocated-{os.getpid()}"
    dom = hl.Domain.create(name, heap="64M")
    try:
        a = agents.spawn(dom, "cpu")
        try:
            _pin(placement[0], a.proc.pid, placement[1])
            g = Graph(dom).input("x", (n, n), "f4")
            g.stage("s", a, "copy", ["x"], ("y", (n, n), "f4"))
            x = np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)
            with g.compile(dispatch="direct", data="shared") as cg:
                for _ in range(20):
                    cg.run({"x": x})
                ts = []
                for _ in range(frames):
                    t = time.perf_counter_ns()
                    cg.run({"x": x})
                    ts.append(time.perf_counter_ns() - t)
        finally:
            a.stop()
    finally:
        dom.close()
        hl.Domain.unlink(name)
    p = np.percentile(np.array(ts) / 1e3, [10, 50, 90])
    return {"p10_us": float(p[0]), "p50_us": float(p[1]), "p90_us": float(p[2])}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--label", default="this build")
    ap.add_argument("-o", "--out", default=None)
    a = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two CPUs")
    cpus = sorted(os.sched_getaffinity(0))
    res: dict[str, object] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "label": a.label,
        "hostless": hl.__file__,
        "n": a.n,
        "frames": a.frames,
    }
    for label, placement in (("apart", (cpus[0], cpus[1])), ("together", (cpus[0], cpus[0]))):
        rows = [run_once(placement, a.frames, a.n) for _ in range(a.runs)]
        os.sched_setaffinity(0, set(cpus))
        res[label] = rows
        for r in rows:
            print(f"{a.label}: {label:8s} " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()), flush=True)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
