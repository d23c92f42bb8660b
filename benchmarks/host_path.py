"""The host's per-frame path of ``CompiledGraph.run`` (issue 22 item 8), A/B between builds.

    python benchmarks/host_path.py measure [-n FRAMES] [--stages S] [--pin] [--json PATH]
    python benchmarks/host_path.py ab OLD_SITE NEW_SITE [--rounds R] [-n FRAMES] [--stages S] [--pin]
                                      [-o DIR] [--name NAME]

Workload: the identity chain of the pipeline benchmark (2 ``copy`` stages on 16
float32, stage s0 on one cpu agent, s1 on another; both ``agents.spawn(dom,
"cpu")``, the default: the C loop), compiled direct+shared (2 in flight), the
host domain at its default spin.  ``--stages 1``: s0 alone (host -> s0 -> host),
which on a 2-CPU machine leaves each process a CPU of its own; ``--pin`` pins the
host to the first CPU and agent k to the next ones (when there are enough).
``measure`` runs, with whichever ``hostless`` is importable:

* ``run``: ``n`` frames of ``cg.run(inputs)`` one at a time (after a warm-up),
  each timed with ``perf_counter_ns`` (frame latency; per hop = frame / (stages
  + 1): host -> s0 -> s1 -> host) and ``thread_time_ns`` (the host thread's CPU);
* ``traced``: the same graph in a domain with a trace ring; around each
  ``run`` the host takes ``monotonic_ns`` (CLOCK_MONOTONIC, the trace's
  clock) before and after, so ``submit`` = the call's start -> the frame's
  first ENQUEUE (checks, inputs written, packet patched and pushed) and
  ``host_wake`` = the sink's SIGNAL -> the call's return (the wait returns,
  checks, outputs copied), without any Python span around the call;
* ``host_only``: the host's own work per ``run()`` with no agent to wake (the
  stages' queue consumed by the host outside the timed region, their
  timelines signaled ahead so the wait returns at once): on a loaded machine
  the figure least disturbed by scheduling;
* ``python_floor``: a call of an empty Python function (the interpreter's
  per-call cost on this machine, for scale).

``ab`` runs ``measure`` in subprocesses with PYTHONPATH=OLD_SITE and NEW_SITE
alternately (old first in even rounds), so both builds see the same machine,
and writes DIR/NAME.json and DIR/NAME.md: per figure the median over rounds of
each build's per-round median (and p10 / p90), the rounds' range, and new/old.
A site is a folder with an installed ``hostless`` (``pip install --target
SITE --no-deps .`` of a checkout).  With the defaults (4 rounds, 1500 frames)
it takes well under a minute on an idle 16-core host.
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

FLOATS = 16
_CPUS = sorted(os.sched_getaffinity(0))  # (before --pin narrows this process's)


def _pct(xs: Any) -> dict[str, float]:
    a = np.asarray(xs, dtype=np.float64)
    return {
        "p50": float(np.median(a)),
        "p10": float(np.percentile(a, 10)),
        "p90": float(np.percentile(a, 90)),
    }


def _graph(dom: Any, agents_: list[Any]) -> Any:
    """The identity chain: stage k on ``agents_[k]``; its output is ``t{len - 1}``."""
    from hostless.graph import Graph

    g = Graph(dom).input("x", (FLOATS,), np.float32)
    prev = "x"
    for k, a in enumerate(agents_):
        g.stage(f"s{k}", a, "copy", [prev], (f"t{k}", (FLOATS,), np.float32))
        prev = f"t{k}"
    return g.compile(dispatch="direct", data="shared")


def _spawn(dom: Any, stages: int, pin: bool) -> list[Any]:
    """One cpu agent per stage; ``pin``: this process on the first CPU, agent k on CPU k + 1
    (where the machine has that many)."""
    from hostless import agents

    out = [agents.spawn(dom, "cpu", label=f"s{k}") for k in range(stages)]
    cpus = _CPUS
    if pin and len(cpus) > stages:
        os.sched_setaffinity(0, {cpus[0]})
        for k, a in enumerate(out):
            os.sched_setaffinity(a.proc.pid, {cpus[k + 1]})
    return out


def _stop(ags: list[Any]) -> None:
    for a in ags:
        a.stop()


def _timed(n: int, stages: int, pin: bool) -> dict[str, Any]:
    import hostless as hl

    dom = hl.Domain.create(
        f"hostless-host-path-{os.getpid()}", heap="16M", label="host", unlink_on_close=True
    )
    try:
        ags = _spawn(dom, stages, pin)
        try:
            with _graph(dom, ags) as cg:
                inp = {"x": np.arange(FLOATS, dtype=np.float32)}
                for _ in range(max(50, n // 10)):
                    cg.run(inp)
                wall = np.empty(n, dtype=np.int64)
                cpu = np.empty(n, dtype=np.int64)
                pc, tt = time.perf_counter_ns, time.thread_time_ns
                for i in range(n):
                    c0, t0 = tt(), pc()
                    out = cg.run(inp)
                    wall[i] = pc() - t0
                    cpu[i] = tt() - c0
                assert np.array_equal(out[f"t{stages - 1}"], inp["x"])
        finally:
            _stop(ags)
    finally:
        dom.close()
    frame = _pct(wall)
    hops = stages + 1
    return {
        "frame_ns": frame,
        "per_hop_ns": {k: v / hops for k, v in frame.items()},
        "host_cpu_ns": _pct(cpu),
    }


def _traced(n: int, stages: int, pin: bool) -> dict[str, Any]:
    import hostless as hl
    from hostless import trace
    from hostless._abi import C

    dom = hl.Domain.create(
        f"hostless-host-path-t-{os.getpid()}", heap="16M", label="host", trace="16M", unlink_on_close=True
    )
    try:
        ags = _spawn(dom, stages, pin)
        try:
            with _graph(dom, ags) as cg:
                inp = {"x": np.arange(FLOATS, dtype=np.float32)}
                tl_of = getattr(cg, "timelines_of", lambda f: cg.timelines)  # (older builds: shared)
                sinks = {tl_of(f)[-1].handle for f in range(cg.inflight)}  # each slot has its own
                for _ in range(50):
                    cg.run(inp)
                mono = time.monotonic_ns
                spans = np.empty((n, 2), dtype=np.int64)
                t_from = mono()
                for i in range(n):
                    t0 = mono()
                    cg.run(inp)
                    spans[i] = (t0, mono())
                evs = [e for e in trace.events(dom) if e["ts"] >= t_from]
        finally:
            _stop(ags)
    finally:
        dom.close()
    enq = np.asarray(sorted(e["ts"] for e in evs if e["type"] == int(C.EV_ENQUEUE)), dtype=np.int64)
    sig = np.asarray(
        sorted(e["ts"] for e in evs if e["type"] == int(C.EV_SIGNAL) and e["a"] in sinks), dtype=np.int64
    )
    submit, wake, frame = [], [], []
    for t0, t1 in spans:
        i = int(np.searchsorted(enq, t0))  # the first ENQUEUE of this call
        j = int(np.searchsorted(sig, t1, side="right")) - 1  # the sink's last SIGNAL before it returned
        if i >= len(enq) or enq[i] > t1 or j < 0 or sig[j] < t0:
            continue
        submit.append(enq[i] - t0)
        wake.append(t1 - sig[j])
        frame.append(t1 - t0)
    return {
        "frames": len(frame),
        "submit_ns": _pct(submit),
        "host_wake_ns": _pct(wake),
        "frame_ns": _pct(frame),
    }


def _host_only(n: int, stages: int) -> dict[str, Any]:
    """The host's own work per ``run()``, no agent to wake: the graph's stages sit on a
    queue the host itself consumes (drained outside the timed region) and the stages'
    timelines (the host owns them here) are signaled to the frame number before each call,
    so the call's wait returns at once.  Checks, inputs, patch, push, wait, outputs."""
    import hostless as hl
    from hostless.agents.kinds import spec_for

    class Me:  # what a compiled graph needs of an agent
        def __init__(self, dom: Any, q: Any) -> None:
            self.kind, self.device, self.native = "cpu", "cpu", None
            self.spec, self.queue, self.user_kernels, self.id = spec_for("cpu"), q, {}, dom.participant_id

    dom = hl.Domain.create(
        f"hostless-host-path-h-{os.getpid()}", heap="16M", label="host", unlink_on_close=True
    )
    try:
        q = dom.queue(1024)
        q.bind()
        me = Me(dom, q)
        with _graph(dom, [me] * stages) as cg:
            inp = {"x": np.arange(FLOATS, dtype=np.float32)}
            wall = np.empty(n, dtype=np.int64)
            pc = time.perf_counter_ns
            tl_of = getattr(cg, "timelines_of", lambda f: cg.timelines)  # (older builds: shared)
            for i in range(n + 100):
                for t in tl_of(cg.frame + 1):  # each frame in flight has its own
                    t.signal(cg.frame + 1)
                t0 = pc()
                cg.run(inp)
                t1 = pc()
                if i >= 100:
                    wall[i - 100] = t1 - t0
                while q.pop_raw(0, 0) is not None:
                    pass
        q.release()
    finally:
        dom.close()
    return {"run_ns": _pct(wall)}


def _floor(n: int = 200000) -> float:
    def f() -> None:
        pass

    t0 = time.perf_counter_ns()
    for _ in range(n):
        f()
    return (time.perf_counter_ns() - t0) / n


def measure(n: int, stages: int = 2, pin: bool = False) -> dict[str, Any]:
    import hostless

    return {
        "hostless": os.path.dirname(hostless.__file__),
        "run": _timed(n, stages, pin),
        "traced": _traced(max(200, n // 3), stages, pin),
        "host_only": _host_only(n, stages),
        "python_floor_ns": _floor(),
    }


FIGS = [
    ("host_only", "run_ns", "host's own work per run(), no agent (see host_only)"),
    ("run", "frame_ns", "run() latency"),
    ("run", "per_hop_ns", "per hop (run() / (stages + 1))"),
    ("run", "host_cpu_ns", "host thread CPU per run()"),
    ("traced", "submit_ns", "submit: call -> first ENQUEUE"),
    ("traced", "host_wake_ns", "host_wake: sink SIGNAL -> return"),
    ("traced", "frame_ns", "traced run() latency"),
]


def _fmt(ns: float) -> str:
    return f"{ns / 1e3:.2f} us" if ns >= 1000 else f"{ns:.0f} ns"


def ab(
    old: str, new: str, rounds: int, n: int, outdir: str, name: str, stages: int = 2, pin: bool = False
) -> int:
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    t_start = time.monotonic()
    load0 = os.getloadavg()
    for r in range(rounds):
        for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
            env = dict(os.environ, PYTHONPATH=old if which == "old" else new)
            p = subprocess.run(
                [sys.executable, __file__, "measure", "-n", str(n), "--stages", str(stages)]
                + (["--pin"] if pin else []),
                env=env,
                capture_output=True,
                text=True,
            )
            if p.returncode:
                sys.stderr.write(p.stderr)
                return p.returncode
            runs[which].append(json.loads(p.stdout))
            print(
                f"round {r} {which}: run p50 {_fmt(runs[which][-1]['run']['frame_ns']['p50'])}",
                file=sys.stderr,
            )
    summary: dict[str, Any] = {}
    for sec, key, _ in FIGS:
        row: dict[str, Any] = {}
        for which in ("old", "new"):
            row[which] = {
                q: statistics.median(x[sec][key][q] for x in runs[which]) for q in ("p50", "p10", "p90")
            }
            ps = [x[sec][key]["p50"] for x in runs[which]]
            row[which]["rounds_p50_range"] = [min(ps), max(ps)]
        row["new_over_old_p50"] = row["new"]["p50"] / row["old"]["p50"]
        summary[f"{sec}.{key}"] = row
    result = {
        "what": (
            f"CompiledGraph.run host path, identity chain of {stages} cpu agent{'s' if stages > 1 else ''} "
            f"(C loop), direct+shared, 16 float32{', pinned to CPUs of their own' if pin else ''}"
        ),
        "stages": stages,
        "pinned": pin,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_start": load0,
            "loadavg_end": os.getloadavg(),
        },
        "command": " ".join(sys.argv),
        "old": old,
        "new": new,
        "rounds": rounds,
        "frames": n,
        "seconds": round(time.monotonic() - t_start, 1),
        "summary": summary,
        "runs": runs,
    }
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, name + ".json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(outdir, name + ".md"), "w") as f:
        f.write(report(result))
    print(path)
    return 0


def report(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        f"# Host per-frame path: old vs new ({res['date'][:10]})",
        "",
        f"`{res['command']}`; {m['host']} ({m['cpus']} CPUs), load average {m['loadavg_start'][0]:.2f} "
        f"at the start, {m['loadavg_end'][0]:.2f} at the end; Python {m['python']}; "
        f"{res['rounds']} rounds, builds alternating, {res['frames']} timed frames per build and round; "
        f"{res['seconds']} s.",
        f"old: `{res['old']}`; new: `{res['new']}`.",
        "",
        res["what"]
        + ".  Cells: median over rounds of each round's p50 (p10 - p90), [range of the rounds' p50].",
        "",
        "| figure | old | new | new/old |",
        "|---|---|---|---|",
    ]
    for sec, key, label in FIGS:
        row = res["summary"][f"{sec}.{key}"]
        cells = []
        for which in ("old", "new"):
            c = row[which]
            lo, hi = c["rounds_p50_range"]
            cells.append(f"{_fmt(c['p50'])} ({_fmt(c['p10'])} - {_fmt(c['p90'])}) [{_fmt(lo)} - {_fmt(hi)}]")
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {row['new_over_old_p50']:.2f} |")
    fl = [x["python_floor_ns"] for w in ("old", "new") for x in res["runs"][w]]
    lines += [
        "",
        f"An empty Python call costs {_fmt(statistics.median(fl))} here (median over the runs).",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("-n", type=int, default=1500)
    m.add_argument("--json")
    a = sub.add_parser("ab")
    a.add_argument("old")
    a.add_argument("new")
    a.add_argument("--rounds", type=int, default=4)
    a.add_argument("-n", type=int, default=1500)
    for x in (m, a):
        x.add_argument("--stages", type=int, choices=(1, 2), default=2)
        x.add_argument("--pin", action="store_true")
    a.add_argument("-o", "--outdir", default="benchmarks/results")
    a.add_argument("--name", default=f"host-path-{platform.node()}-{dt.date.today().isoformat()}")
    r = sub.add_parser("report")
    r.add_argument("json")
    args = ap.parse_args()
    if args.cmd == "measure":
        res = measure(args.n, args.stages, args.pin)
        text = json.dumps(res)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text)
        else:
            print(text)
        return 0
    if args.cmd == "report":
        with open(args.json) as f:
            res = json.load(f)
        with open(args.json[: -len(".json")] + ".md", "w") as f:
            f.write(report(res))
        return 0
    return ab(args.old, args.new, args.rounds, args.n, args.outdir, args.name, args.stages, args.pin)


if __name__ == "__main__":
    sys.exit(main())
