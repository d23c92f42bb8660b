"""Fence algebra (issue 27), old build vs new build in one run: ``hostless bench algebra``.

    hostless bench algebra [--old REV | --old-site DIR] [--new-site DIR] [--rounds R] [-n N] [--quick]

Two builds of hostless are measured alternately (the old one first in even
rounds) in fresh subprocesses, each with ``PYTHONPATH`` set to its build, so
that both see the same machine load:

* ``old``: ``git archive REV`` of this checkout (default :data:`OLD_REV`, main
  before the fence algebra), installed into a temporary folder with
  ``pip install --no-build-isolation --no-deps --target`` (a minute or two),
  or a folder given with ``--old-site`` that holds a built ``hostless``;
* ``new``: the ``hostless`` this interpreter imports, or ``--new-site``.

Figures (each subprocess measures every figure its build has):

* ``create_signal_release``: ``dom.fence()``, ``signal()``, ``release()`` in
  one process (best of 5 batches, per operation);
* ``rt_timeline_wait``: a two-process round trip (this process signals
  timeline ping to i, the peer waits for it with ``Timeline.wait(i)`` and
  signals pong to i, this process waits for pong), p50;
* ``rt_wait_any_8`` (builds with ``hl.wait_any``): the same round trip, the
  peer waiting with ``hl.wait_any`` over 7 idle fences and ``ping.point(i)``;
  ``rt_wait_any_8 / rt_timeline_wait`` is the issue's "wait_any over 8 objects
  costs <= 1.5x a single wait's round trip";
* ``rt_waitset_8`` (builds with ``hl.WaitSet``): the same, the peer waiting
  with a ``WaitSet`` over the same 8 objects, built once, its point moved with
  ``set_value(7, i)`` each round (the prepared form of the goal's wait_any);
* ``ready_point_wait`` / ``ready_wait_any_8`` (the same builds): in one
  process, signal then wait on the point alone or with ``wait_any`` over 8
  (the calls' own cost: nothing sleeps); ``ready_waitset_8`` with a
  ``WaitSet`` (builds with it);
* ``signal_unwatched`` / ``signal_watched_4`` (builds with ``Timeline.point``):
  ``Timeline.signal`` in a 65,536-slot table, the timeline in no merge, then
  with 4 composites over points it has not reached (the signal's search for
  its watch nodes).

Writes ``algebra-<host>-<date>.json`` and ``.md`` (per figure and build: the
median over rounds with p10-p90; new/old).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

OLD_REV = "d7c7636"
"""main before the fence algebra (issue 27) landed: no points, no watch nodes, no wait_any."""

FIGURES = {
    "create_signal_release": "create + signal + release (one process)",
    "rt_timeline_wait": "round trip, peer waits with Timeline.wait",
    "rt_wait_any_8": "round trip, peer waits with wait_any over 8",
    "rt_waitset_8": "round trip, peer waits with a WaitSet over 8",
    "ready_point_wait": "signal, then point wait (one process)",
    "ready_wait_any_8": "signal, then wait_any over 8 (one process)",
    "ready_waitset_8": "signal, then a WaitSet over 8 (one process)",
    "signal_unwatched": "Timeline.signal, in no merge (65,536 slots)",
    "signal_watched_4": "Timeline.signal, 4 composites watching (65,536 slots)",
}
RATIOS = {
    "rt_wait_any_8 / rt_timeline_wait": ("rt_wait_any_8", "rt_timeline_wait", 1.5),
    "rt_waitset_8 / rt_timeline_wait": ("rt_waitset_8", "rt_timeline_wait", 1.5),
    "ready_wait_any_8 / ready_point_wait": ("ready_wait_any_8", "ready_point_wait", 1.5),
    "ready_waitset_8 / ready_point_wait": ("ready_waitset_8", "ready_point_wait", 1.5),
    "signal_watched_4 / signal_unwatched": ("signal_watched_4", "signal_unwatched", None),
}


@dataclass
class AlgebraBenchConfig:
    """What ``hostless bench algebra`` runs."""

    rounds: int = 6
    n: int = 5000  # operations per batch (in-process figures), round trips (two-process ones)
    old_rev: str = OLD_REV
    old_site: str | None = None
    new_site: str | None = None
    quick: bool = False
    pin: bool = True  # the round trips' two processes on two CPUs

    @classmethod
    def quick_config(cls) -> AlgebraBenchConfig:
        return cls(rounds=2, n=1000, quick=True)


# --------------------------------------------------------------------------- measuring (in a subprocess)


def _best_per_op(fn: Any, n: int, reps: int = 5) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn(n)
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


_PEER = """
import os, sys
import hostless as hl
if int(sys.argv[5]) >= 0:
    os.sched_setaffinity(0, {int(sys.argv[5])})
d = hl.Domain.open(sys.argv[1], watchdog_interval=0)
ping, pong = d.import_timeline(int(sys.argv[2])), d.import_timeline(int(sys.argv[3]))
mode = sys.argv[6]
idle = [d.import_fence(int(h)) for h in sys.argv[7:]]
n = int(sys.argv[4])
if mode == "set":
    ws = hl.WaitSet([*idle, ping.point(1)])
    for i in range(1, n + 1):
        ws.set_value(7, i)
        ws.wait_any(30)
        pong.signal(i)
elif mode == "any":
    for i in range(1, n + 1):
        hl.wait_any([*idle, ping.point(i)], timeout=30)
        pong.signal(i)
else:
    for i in range(1, n + 1):
        ping.wait(i, 30)
        pong.signal(i)
d.close()
"""


def _round_trips(hl: Any, n: int, mode: str, pinned: bool = True) -> float:
    """p50 of n two-process round trips (ns); this process and the peer on two CPUs when there
    are two (as ``hostless bench fences``).  This process is pinned for the run only: a second
    run must see every CPU again (pinned left over from the first, the second found one CPU,
    left its peer unpinned, and the two could share a CPU: 130 us round trips)."""
    from .harness import pin_cpus
    from .harness import pinned as pinned_to

    mine, peer_cpu = pin_cpus() if pinned else (None, None)
    with pinned_to(mine):
        return _round_trips_pinned(hl, n, mode, peer_cpu)


def _round_trips_pinned(hl: Any, n: int, mode: str, peer_cpu: int | None) -> float:
    """The peer waits with Timeline.wait (mode "wait"), hl.wait_any over 8 ("any") or a
    WaitSet over the same 8 ("set")."""
    dom = hl.Domain.create(f"hl_bench_alg_{os.getpid()}_{time.monotonic_ns() % 10**9}", unlink_on_close=True)
    try:
        ping, pong = dom.timeline(), dom.timeline()
        idle = [dom.fence() for _ in range(7)] if mode != "wait" else []
        cpu = str(-1 if peer_cpu is None else peer_cpu)
        args = [dom.name, str(ping.handle), str(pong.handle), str(n), cpu, mode]
        args += [str(f.handle) for f in idle]
        peer = subprocess.Popen([sys.executable, "-c", _PEER, *args])
        try:
            samples = []
            for i in range(1, n + 1):
                t0 = time.perf_counter_ns()
                ping.signal(i)
                pong.wait(i, 30)
                samples.append(time.perf_counter_ns() - t0)
            if peer.wait(60) != 0:
                raise RuntimeError(f"the round-trip peer exited with status {peer.returncode}")
        finally:
            if peer.poll() is None:
                peer.kill()
                peer.wait()
        return float(statistics.median(samples[n // 10 :]))
    finally:
        dom.close()


def measure(n: int, pinned: bool = True) -> dict[str, float]:
    """Every figure this build has, in ns (see the module's docstring)."""
    import hostless as hl

    out: dict[str, float] = {}
    dom = hl.Domain.create(f"hl_bench_alg_{os.getpid()}", fences=1 << 16, unlink_on_close=True)
    try:

        def create(k: int) -> None:
            for _ in range(k):
                f = dom.fence()
                f.signal()
                f.release()

        out["create_signal_release"] = _best_per_op(create, n)
        t = dom.timeline()
        v = [0]

        def signal(k: int) -> None:
            for _ in range(k):
                v[0] += 1
                t.signal(v[0])

        if hasattr(hl.Timeline, "point"):
            out["signal_unwatched"] = _best_per_op(signal, n)
            watching = [dom.merge([t.point(1 << 60)]) for _ in range(4)]
            out["signal_watched_4"] = _best_per_op(signal, max(50, n // 20))
            for m in watching:
                m.release()
        if hasattr(hl, "wait_any"):
            idle = [dom.fence() for _ in range(7)]

            def ready_point(k: int) -> None:
                for _ in range(k):
                    v[0] += 1
                    t.signal(v[0])
                    t.point(v[0]).wait(1)

            def ready_any(k: int) -> None:
                for _ in range(k):
                    v[0] += 1
                    t.signal(v[0])
                    hl.wait_any([*idle, t.point(v[0])], timeout=1)

            out["ready_point_wait"] = _best_per_op(ready_point, n)
            out["ready_wait_any_8"] = _best_per_op(ready_any, n)
            if hasattr(hl, "WaitSet"):
                ws = hl.WaitSet([*idle, t.point(1)])

                def ready_set(k: int) -> None:
                    for _ in range(k):
                        v[0] += 1
                        t.signal(v[0])
                        ws.set_value(7, v[0])
                        ws.wait_any(1)

                out["ready_waitset_8"] = _best_per_op(ready_set, n)
    finally:
        dom.close()
    out["rt_timeline_wait"] = _round_trips(hl, n, "wait", pinned)
    if hasattr(hl, "wait_any"):
        out["rt_wait_any_8"] = _round_trips(hl, n, "any", pinned)
    if hasattr(hl, "WaitSet"):
        out["rt_waitset_8"] = _round_trips(hl, n, "set", pinned)
    return out


# --------------------------------------------------------------------------- the two builds


def build_old(rev: str, into: str) -> str:
    """``git archive rev`` of the checkout around this process's working directory,
    installed into ``into``/site; returns that site folder."""
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode != 0:
        raise SystemExit(
            "hostless bench algebra builds the old build from a git checkout: run it inside the "
            "repository, or give a built one with --old-site DIR"
        )
    src, site = os.path.join(into, "src"), os.path.join(into, "site")
    os.makedirs(src)
    arch = subprocess.run(["git", "-C", top.stdout.strip(), "archive", rev], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", src], input=arch.stdout, check=True)
    env = {k: v for k, v in os.environ.items() if k != "HOSTLESS_TEST_HOOKS"}
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps"]
    pip += ["--target", site, src]
    r = subprocess.run(pip, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"building {rev} failed (pip install --target {site}):\n{r.stderr[-4000:]}")
    return site


def site_of_this_build() -> str:
    import hostless

    return os.path.dirname(os.path.dirname(os.path.abspath(hostless.__file__)))


def _measure_in(site: str, n: int, pinned: bool) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=site + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(
        [sys.executable, "-m", "hostless_tools.bench.algebra", "--measure", "-n", str(n)]
        + ([] if pinned else ["--no-pin"]),
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # not a checkout's src/ ahead of PYTHONPATH
    )
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def run(cfg: AlgebraBenchConfig, progress: Any = print) -> dict[str, Any]:
    """Both builds, ``cfg.rounds`` interleaved rounds; the result of ``write_results``."""
    from .harness import machine_info

    tmp = tempfile.mkdtemp(prefix="hl-bench-algebra-")
    try:
        old = cfg.old_site
        if old is None:
            progress(f"building the old build ({cfg.old_rev}) into {tmp}")
            old = build_old(cfg.old_rev, tmp)
        sites = {"old": old, "new": cfg.new_site or site_of_this_build()}
        runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
        for r in range(cfg.rounds):
            for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
                runs[which].append(_measure_in(sites[which], cfg.n, cfg.pin))
                progress(f"round {r + 1}/{cfg.rounds}: {which} measured")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows: dict[str, dict[str, Any]] = {}
    for k in FIGURES:
        row: dict[str, Any] = {}
        for which in ("old", "new"):
            xs = [x[k] for x in runs[which] if k in x]
            if xs:
                row[which] = {"median": statistics.median(xs), "p10": _pct(xs, 0.1), "p90": _pct(xs, 0.9)}
        if "old" in row and "new" in row:
            row["new_over_old"] = row["new"]["median"] / row["old"]["median"]
        rows[k] = row
    ratios = {}
    for name, (a, b, goal) in RATIOS.items():
        per_round = [x[a] / x[b] for x in runs["new"] if a in x and b in x and x[b]]
        if per_round:
            med = statistics.median(per_round)
            ratios[name] = {"median": med, "min": min(per_round), "max": max(per_round), "goal": goal}
            ratios[name]["met"] = None if goal is None else med <= goal
    return {
        "machine": machine_info(),
        "config": asdict(cfg) | {"old_site": sites["old"] if cfg.old_site else None},
        "rows": rows,
        "ratios": ratios,
        "raw": runs,
        "errors": {},
    }


# --------------------------------------------------------------------------- report


def _cell(x: dict[str, float] | None) -> str:
    from .report import fmt_ns

    if not x:
        return "-"
    return f"{fmt_ns(x['median'])} [{fmt_ns(x['p10'])}-{fmt_ns(x['p90'])}]"


def tables(result: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    from .report import fmt_met, fmt_ratio

    figs = [
        [FIGURES[k], _cell(r.get("old")), _cell(r.get("new")), fmt_ratio(r.get("new_over_old"))]
        for k, r in result["rows"].items()
    ]
    rat = [
        [
            k,
            f"{fmt_ratio(v['median'])} [{fmt_ratio(v['min'])}-{fmt_ratio(v['max'])}]",
            "-" if v["goal"] is None else f"<= {v['goal']}x",
            fmt_met(v["met"]),
        ]
        for k, v in result["ratios"].items()
    ]
    return [
        ("Old vs new: median over rounds [p10-p90]", ["figure", "old", "new", "new/old"], figs),
        ("New build: ratios per round, median [min-max]", ["ratio", "new build", "goal", "met?"], rat),
    ]


def print_report(result: dict[str, Any], plain: bool = False) -> None:
    from .report import print_tables

    print_tables(tables(result), result, plain=plain)


def markdown(result: dict[str, Any]) -> str:
    from .report import errors_section, header, section

    cfg = result["config"]
    old = f"`--old-site {cfg['old_site']}`" if cfg["old_site"] else f"git archive `{cfg['old_rev']}`"
    out = header(
        "Fence algebra: old vs new build",
        result,
        [f"Old: {old}; new: the build that ran the benchmark.", f"{cfg['rounds']} rounds, n = {cfg['n']}."],
    )
    for title, heads, rows in tables(result):
        out += section(title, None, heads, rows)
    return "\n".join(out + errors_section(result))


def write_results(result: dict[str, Any], out_dir: str) -> Any:
    from .report import write_results as write

    return write("algebra", result, markdown(result), out_dir)


def main() -> int:
    ap = argparse.ArgumentParser(description="the measuring half of hostless bench algebra (one build)")
    ap.add_argument("--measure", action="store_true", required=True)
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--no-pin", action="store_true")
    a = ap.parse_args()
    print(json.dumps(measure(a.n, not a.no_pin)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
