"""The host's per-frame path: what ``CompiledGraph.run`` / ``stream`` cost the host, A/B between builds.

    python benchmarks/frame_path.py measure [-n FRAMES] [--json PATH]
    python benchmarks/frame_path.py ab OLD_SITE NEW_SITE [--rounds R] [-n FRAMES] [-o DIR] [--name NAME]
    python benchmarks/frame_path.py report DIR/NAME.json      # rewrite the Markdown report

``measure`` runs, with whichever ``hostless`` is importable, every
configuration once and prints (or writes) a JSON list of records:

* workloads: ``identity2``, a 2-stage chain of ``copy`` kernels on 64 float32
  (256 B; pure per-hop cost), one stage per cpu agent; ``demo5``, the 5-stage
  pipeline of examples/pipeline_demo.py (normalize, gemm, relu, gemm, softmax)
  at 64x64 (latency-bound, as in issue 11): pre/post on one agent, the three
  middle stages on another;
* agents: ``native`` (two ``agents.spawn(dom, "cpu")``, the C loop; the
  middle stages of demo5 run on the second cpu agent, as the native npu was
  not in the build this was written for); the ``python`` agents of earlier
  results ran the Python agent loop, which is gone (issue 22);
* modes: dispatch host / direct times data copy / shared (direct: 2 in flight).

Plus ``submit``: the host's CPU time for the submit alone of a direct-dispatch
frame (identity2 and demo5, shared), measured apart from every wake-up: the
graph's stages sit on a queue the host itself consumes (bound, drained
outside the timed region), so the figure is the Python + C work of patching
and pushing one frame (old: set the values, encode, push; new: one frame
program call), not the futex wake of an agent.

Per configuration: ``run`` one frame at a time (after a warm-up), each call
timed with ``perf_counter_ns`` (frame latency) and ``thread_time_ns`` (the
host thread's CPU time for the frame: encode / patch / push / wait / copy /
read back); then ``stream`` over the same number of frames (process CPU per
frame and frames/s).  The host domain does not spin (``spin=0``: on a
2-core machine a spinning host takes a core from an agent), so CPU time is
work, not polling.

``ab`` runs ``measure`` in subprocesses with PYTHONPATH=OLD_SITE and
NEW_SITE alternately (round r: old first when r is even), so both builds see
the same machine, and writes DIR/NAME.json and DIR/NAME.md: per figure the
median over rounds of each build's per-round median, the rounds' range, and
new/old.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

MODES = [("host", "copy"), ("host", "shared"), ("direct", "copy"), ("direct", "shared")]


Workloads = dict[str, tuple[Any, dict[str, np.ndarray]]]


def _graphs(dom: Any, a: Any, b: Any, rng: np.random.Generator) -> Workloads:
    from hostless.graph import Graph

    out: Workloads = {}
    g = Graph(dom).input("x", (64,), np.float32)
    g.stage("s0", a, "copy", ["x"], ("y0", (64,), np.float32))
    g.stage("s1", b, "copy", ["y0"], ("y1", (64,), np.float32))
    out["identity2"] = (g, {"x": rng.standard_normal(64).astype(np.float32)})
    rows = feat = 64
    hid, o = feat, max(8, feat // 4)
    w1 = (rng.standard_normal((feat, hid)) / np.sqrt(feat)).astype(np.float32)
    w2 = (rng.standard_normal((hid, o)) / np.sqrt(hid)).astype(np.float32)
    g = Graph(dom).input("frame", (rows, feat), np.uint8).constant("w1", w1).constant("w2", w2)
    g.stage("preprocess", a, "normalize", ["frame"], ("x", (rows, feat), np.float32), scalars=[127.5, 64.0])
    g.stage("fc1", b, "gemm", ["x", "w1"], ("h", (rows, hid), np.float32))
    g.stage("act", b, "relu", ["h"], ("r", (rows, hid), np.float32))
    g.stage("fc2", b, "gemm", ["r", "w2"], ("logits", (rows, o), np.float32))
    g.stage("postprocess", a, "softmax", ["logits"], ("probs", (rows, o), np.float32))
    out["demo5"] = (g, {"frame": rng.integers(0, 256, (rows, feat), dtype=np.uint8)})
    return out


def _measure_one(cg: Any, inp: dict[str, np.ndarray], n: int) -> dict[str, Any]:
    for _ in range(20):
        cg.run(inp)
    wall = np.empty(n, dtype=np.int64)
    cpu = np.empty(n, dtype=np.int64)
    for i in range(n):
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        cg.run(inp)
        wall[i] = time.perf_counter_ns() - t0
        cpu[i] = time.thread_time_ns() - c0
    feed = (inp for _ in range(n))
    c0, t0 = time.process_time_ns(), time.perf_counter_ns()
    k = sum(1 for _ in cg.stream(feed))
    dt_ns, dc_ns = time.perf_counter_ns() - t0, time.process_time_ns() - c0
    return {
        "latency_p50_us": float(np.median(wall)) / 1e3,
        "latency_p90_us": float(np.percentile(wall, 90)) / 1e3,
        "run_cpu_p50_us": float(np.median(cpu)) / 1e3,
        "run_cpu_p90_us": float(np.percentile(cpu, 90)) / 1e3,
        "stream_cpu_per_frame_us": dc_ns / k / 1e3,
        "stream_fps": k / (dt_ns / 1e9),
    }


def _submit_only(dom: Any, n: int) -> list[dict[str, Any]]:
    """Per-frame host CPU of a direct frame's submit, with no agent to wake (see above)."""
    from types import SimpleNamespace

    q = dom.queue(1024)
    q.bind()
    me = SimpleNamespace(kind="cpu", queue=q, user_kernels={}, id=dom.participant_id)
    recs = []
    try:
        for wl in ("identity2", "demo5"):
            g, _ = _graphs(dom, me, me, np.random.default_rng(3))[wl]
            with g.compile(dispatch="direct", data="shared", inflight=2) as cg:
                cpu = np.empty(n, dtype=np.int64)
                for i in range(n + 20):
                    cg.frame += 1
                    sl = cg.slots[cg.frame % cg.inflight]
                    c0 = time.thread_time_ns()
                    if hasattr(cg, "_exec"):  # this change: one frame program call
                        cg._exec(sl.submit, cg.frame, None)
                    else:  # before it: set the values, encode and push in Python
                        cg._submit(sl, cg.frame, None)
                    c1 = time.thread_time_ns()
                    if i >= 20:
                        cpu[i - 20] = c1 - c0
                    while q.pop_raw(0, 0) is not None:
                        pass
            recs.append(
                {
                    "workload": wl,
                    "agents": "none",
                    "mode": "direct+shared submit only",
                    "submit_cpu_p50_us": float(np.median(cpu)) / 1e3,
                    "submit_cpu_p90_us": float(np.percentile(cpu, 90)) / 1e3,
                }
            )
    finally:
        q.release()
    return recs


def measure(n: int) -> list[dict[str, Any]]:
    import hostless as hl
    from hostless import agents

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    name = f"hostless-frame-path-{os.getpid()}"
    dom = hl.Domain.create(name, heap="64M", label="host", spin=0.0, unlink_on_close=True)
    recs: list[dict[str, Any]] = []
    try:
        recs += _submit_only(dom, n)
        for kind in ("native",):
            a = agents.spawn(dom, "cpu", label="cpu A")
            b = agents.spawn(dom, "cpu", label="cpu B")
            mids = {"identity2": b, "demo5": b}
            try:
                rng = np.random.default_rng(3)
                for wl in ("identity2", "demo5"):
                    g, inp = _graphs(dom, a, mids[wl], rng)[wl]
                    for dispatch, data in MODES:
                        with g.compile(dispatch=dispatch, data=data, inflight=2) as cg:
                            r = _measure_one(cg, inp, n)
                        r.update(workload=wl, agents=kind, mode=f"{dispatch}+{data}")
                        recs.append(r)
            finally:
                for ag in (a, b):
                    ag.stop()
    finally:
        dom.close()
    return recs


def _key(r: dict[str, Any]) -> str:
    return f"{r['workload']} {r['agents']} {r['mode']}"


FIGS = [
    "submit_cpu_p50_us",
    "submit_cpu_p90_us",
    "run_cpu_p50_us",
    "latency_p50_us",
    "latency_p90_us",
    "stream_cpu_per_frame_us",
    "stream_fps",
]


def ab(old: str, new: str, rounds: int, n: int, outdir: str, name: str) -> int:
    runs: dict[str, list[list[dict[str, Any]]]] = {"old": [], "new": []}
    for r in range(rounds):
        for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
            env = dict(os.environ, PYTHONPATH=old if which == "old" else new)
            p = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "measure", "-n", str(n)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
                cwd="/tmp",
            )
            runs[which].append(json.loads(p.stdout))
            print(f"round {r} {which} done", flush=True)
    table: dict[str, dict[str, Any]] = {}
    for which in ("old", "new"):
        for rr in runs[which]:
            for rec in rr:
                d = table.setdefault(_key(rec), {"old": {}, "new": {}})
                for f in FIGS:
                    if f in rec:
                        d[which].setdefault(f, []).append(rec[f])
    summary: dict[str, dict[str, Any]] = {}
    for k, d in table.items():
        s: dict[str, Any] = {}
        for f in FIGS:
            if f not in d["old"] or f not in d["new"]:
                continue
            o, w = d["old"][f], d["new"][f]
            mo, mw = statistics.median(o), statistics.median(w)
            s[f] = {
                "old_median": mo,
                "new_median": mw,
                "old_range": [min(o), max(o)],
                "new_range": [min(w), max(w)],
                "new_over_old": mw / mo if mo else None,
                "old_rounds": o,
                "new_rounds": w,
            }
        summary[k] = s
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs), load average "
        + " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "python": sys.version.split()[0],
        "command": f"python benchmarks/frame_path.py ab {old} {new} --rounds {rounds} -n {n}",
        "frames_per_config": n,
        "rounds": rounds,
        "old": old,
        "new": new,
    }
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, name + ".json")
    with open(path, "w") as fh:
        json.dump({"meta": meta, "summary": summary, "runs": runs}, fh, indent=1)
    return report(path)


def report(path: str) -> int:
    """Write the Markdown report next to the JSON of an ``ab`` run (and print it)."""
    with open(path) as fh:
        d = json.load(fh)
    meta, summary = d["meta"], d["summary"]
    cols = [
        ("submit_cpu_p50_us", "submit CPU p50 (us)"),
        ("run_cpu_p50_us", "run CPU p50 (us)"),
        ("latency_p50_us", "latency p50 (us)"),
        ("latency_p90_us", "latency p90 (us)"),
        ("stream_cpu_per_frame_us", "stream CPU / frame (us)"),
        ("stream_fps", "stream frames/s"),
    ]
    lines = [
        f"# Host per-frame path in C: old vs new build ({meta['date'][:10]})",
        "",
        f"`{meta['command']}`; {meta['machine']} (at the end of the run); Python {meta['python']};",
        f"{meta['rounds']} rounds, builds alternating (old first in even rounds), "
        f"{meta['frames_per_config']} frames per configuration and round.",
        "",
        "Cells: old, new (each the median over rounds of the round's figure, [range of the rounds'",
        "figures]) and new/old.  submit CPU: host thread CPU for the submit of one direct frame with no",
        "agent to wake (the graph's queue is consumed by the host, drained outside the timed region);",
        "run CPU: host thread CPU per `run()` call (write inputs, submit, waits, read outputs); latency:",
        "`run()` wall time; stream: host process CPU per frame and frames/s while streaming (direct: 2",
        "frames in flight).",
        "",
    ]
    for key, title in cols:
        rows = [k for k in sorted(summary) if key in summary[k]]
        if not rows:
            continue
        lines += [f"## {title}", "", "| configuration | old | new | new/old |", "|---|---|---|---|"]
        for k in rows:
            x = summary[k][key]
            lines.append(
                f"| {k} | {x['old_median']:.1f} [{x['old_range'][0]:.1f}-{x['old_range'][1]:.1f}] "
                f"| {x['new_median']:.1f} [{x['new_range'][0]:.1f}-{x['new_range'][1]:.1f}] "
                f"| {x['new_over_old']:.2f} |"
            )
        lines.append("")
    md = os.path.splitext(path)[0] + ".md"
    with open(md, "w") as fh:
        fh.write("\n".join(lines))
    print("\n".join(lines))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("-n", type=int, default=300)
    m.add_argument("--json", default=None)
    b = sub.add_parser("ab")
    b.add_argument("old")
    b.add_argument("new")
    b.add_argument("--rounds", type=int, default=4)
    b.add_argument("-n", type=int, default=300)
    b.add_argument("-o", "--output", default="benchmarks/results")
    b.add_argument("--name", default=f"frame-path-vm-{dt.date.today().isoformat()}")
    r = sub.add_parser("report")
    r.add_argument("json")
    a = ap.parse_args()
    if a.cmd == "report":
        return report(a.json)
    if a.cmd == "measure":
        recs = measure(a.n)
        txt = json.dumps(recs)
        if a.json:
            with open(a.json, "w") as fh:
                fh.write(txt)
        else:
            print(txt)
        return 0
    return ab(a.old, a.new, a.rounds, a.n, a.output, a.name)


if __name__ == "__main__":
    sys.exit(main())
