"""A/B run of the fence benchmark: two builds of hostless, interleaved, one machine.

    python benchmarks/ab_fences.py OLD_SITE NEW_SITE [--rounds R] [-n N] [-o DIR]

OLD_SITE and NEW_SITE are directories that each hold a built ``hostless``
package (for example a copy of site-packages/hostless from before a change).
Each round runs ``hostless bench fences --quick`` once per build, alternating
which goes first, so that both see the same machine load; the report gives,
per figure, the median over rounds of each build's p50 and the new/old ratio
with the rounds' range.  Writes ab-fences-<date>.json and .md into DIR.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_one(site: str, n: int, out: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=site)
    cmd = [sys.executable, "-m", "hostless.cli", "bench", "fences", "--quick", "-n", str(n), "-o", out]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=tempfile.gettempdir())
    (path,) = glob.glob(os.path.join(out, "fences-*.json"))
    d = json.load(open(path))
    fig = {k: float(v["p50"]) for k, v in d["latency"].items()}
    for k, v in d.get("throughput", {}).items():
        if isinstance(v, dict) and "ops_per_s_median" in v:
            fig[f"throughput:{k}"] = float(v["ops_per_s_median"])
    return fig


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("-o", "--output", default="benchmarks/results")
    a = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for which in order:
                out = os.path.join(tmp, f"{which}{r}")
                os.makedirs(out)
                runs[which].append(run_one(getattr(a, which), a.n, out))
                print(f"round {r} {which} done", flush=True)
    keys = sorted(set(runs["old"][0]) & set(runs["new"][0]))
    rows = []
    for k in keys:
        o = [x[k] for x in runs["old"]]
        w = [x[k] for x in runs["new"]]
        ratios = [b / a_ for a_, b in zip(o, w, strict=True) if a_]
        rows.append(
            {
                "figure": k,
                "old_median": statistics.median(o),
                "new_median": statistics.median(w),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
            }
        )
    date = dt.datetime.now(dt.timezone.utc)
    stem = os.path.join(a.output, f"ab-fences-{os.uname().nodename}-{date:%Y-%m-%d-%H%M}")
    meta = {
        "date": date.isoformat(),
        "rounds": a.rounds,
        "n": a.n,
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "rows": rows,
        "runs": runs,
    }
    os.makedirs(a.output, exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    lines = [
        f"# Fence benchmark, old vs new build, interleaved ({date:%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs)",
        "",
        f"{a.rounds} rounds of `hostless bench fences --quick -n {a.n}` per build, alternating the order.",
        "Latency figures are p50 in ns (lower is better), throughput in ops/s (higher is better);",
        "ratio = new / old, median over rounds with the rounds' range.",
        "",
        "| figure | old (median) | new (median) | new/old | range |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['figure']} | {row['old_median']:.4g} | {row['new_median']:.4g} | "
            f"{row['ratio_median']:.2f} | {row['ratio_min']:.2f}-{row['ratio_max']:.2f} |"
        )
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
