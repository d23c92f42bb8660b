"""Old vs new microbenchmark for issue 27 (fence algebra), in one run on one machine.

    python benchmarks/fence_algebra_micro.py OLD_SITE [NEW_SITE] [--rounds R] [-o DIR] [--tag TAG]
    python benchmarks/fence_algebra_micro.py --measure        (one round, this build; JSON)

OLD_SITE / NEW_SITE: directories holding a built ``hostless`` package (NEW_SITE
defaults to the one this interpreter imports), e.g. main built with
``pip install --no-build-isolation --no-deps --target /tmp/fa-old-site <main worktree>``.
Each round runs, for each build, alternating which goes first so that both see
the same machine load: ``hostless bench fences --quick`` (fence and timeline
round trips between two processes: p50 per round) and ``--measure`` here (in one
process: create+signal+release, a point wait vs ``wait_any`` over 8 objects,
the completing one signalled just before the wait; new build only for the
last two, main has neither).  Reports per figure the median over rounds with
p10-p90 and the new/old ratio of the medians.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))


def per_op(fn, n: int, reps: int = 5) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def measure(n: int) -> dict[str, float]:
    import hostless as hl

    dom = hl.Domain.create(f"hl_bench_fa_{uuid.uuid4().hex[:6]}", unlink_on_close=True)
    out: dict[str, float] = {}

    def create(k: int) -> None:
        for _ in range(k):
            f = dom.fence()
            f.signal()
            f.release()

    out["create_signal_release_us"] = per_op(create, n)
    if hasattr(hl, "wait_any"):
        t = dom.timeline()
        state = {"v": 0}
        others = [dom.fence() for _ in range(7)]

        def single(k: int) -> None:
            for _ in range(k):
                state["v"] += 1
                t.signal(state["v"])
                t.point(state["v"]).wait(1)

        def any8(k: int) -> None:
            for _ in range(k):
                state["v"] += 1
                t.signal(state["v"])
                hl.wait_any([*others, t.point(state["v"])], timeout=1)

        out["point_signal_wait_us"] = per_op(single, n)
        out["wait_any_8_us"] = per_op(any8, n)
        out["wait_any_8_over_point_wait"] = out["wait_any_8_us"] / out["point_signal_wait_us"]
    dom.close()
    return out


def site_of_this_build() -> str:
    import hostless

    return os.path.dirname(os.path.dirname(os.path.abspath(hostless.__file__)))


def one_round(site: str, n: int, tmp: str) -> dict[str, float]:
    sys.path.insert(0, HERE)
    from ab_fences import run_one  # noqa: E402  (hostless bench fences --quick in that build)

    out = tempfile.mkdtemp(dir=tmp)
    fig = {f"2proc:{k}": v for k, v in run_one(site, 2000, out).items() if not k.startswith("throughput")}
    env = dict(os.environ, PYTHONPATH=site)
    r = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--measure", "-n", str(n)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp,
    )
    fig.update(json.loads(r.stdout))
    return fig


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old", nargs="?")
    ap.add_argument("new", nargs="?")
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("-o", "--output", default="benchmarks/results")
    ap.add_argument("--tag", default=f"vm-{dt.date.today().isoformat()}")
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure(a.n)))
        return 0
    if not a.old:
        ap.error("OLD_SITE is required (or --measure)")
    sites = {"old": a.old, "new": a.new or site_of_this_build()}
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
                runs[which].append(one_round(sites[which], a.n, tmp))
                print(f"round {r} {which} done", flush=True)
    keys = sorted(set().union(*runs["old"], *runs["new"]))
    rows = []
    for k in keys:
        row: dict[str, object] = {"figure": k}
        for which in ("old", "new"):
            xs = [x[k] for x in runs[which] if k in x]
            if xs:
                row[which] = {
                    "median": statistics.median(xs),
                    "p10": pct(xs, 0.1),
                    "p90": pct(xs, 0.9),
                    "n": len(xs),
                }
        if "old" in row and "new" in row:
            row["new_over_old"] = row["new"]["median"] / row["old"]["median"]  # type: ignore[index]
        rows.append(row)
    machine = f"{os.uname().nodename}, {os.cpu_count()} CPUs"
    machine += ": a loaded 2-core VM shared with another engineer's work"
    doc = {"machine": machine, "sites": sites, "rounds": a.rounds, "n": a.n, "rows": rows, "raw": runs}
    os.makedirs(a.output, exist_ok=True)
    base = os.path.join(a.output, f"fence-algebra-{a.tag}")
    with open(base + ".json", "w") as fh:
        json.dump(doc, fh, indent=2)
    with open(base + ".md", "w") as fh:
        fh.write(f"# fence algebra: old (main) vs new, one run, {a.rounds} interleaved rounds\n\n")
        fh.write(
            f"Machine: {machine}.  2proc rows in ns (p50 of `hostless bench fences --quick` per round),\n"
        )
        fh.write("others in us (best of 5 batches in one process); median over rounds [p10-p90].\n\n")
        fh.write("| figure | old | new | new/old |\n|---|---|---|---|\n")
        for row in rows:
            cells = []
            for which in ("old", "new"):
                v = row.get(which)
                cells.append("-" if v is None else f"{v['median']:.3f} [{v['p10']:.3f}-{v['p90']:.3f}]")  # type: ignore[index]
            ratio = row.get("new_over_old")
            shown = "-" if ratio is None else f"{ratio:.2f}"
            fh.write(f"| {row['figure']} | {cells[0]} | {cells[1]} | {shown} |\n")
    print(open(base + ".md").read())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
