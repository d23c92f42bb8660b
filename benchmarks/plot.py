"""Plot a ``hostless bench pipeline`` result: per-hop cost, speedups, streaming throughput.

    python benchmarks/plot.py benchmarks/results/pipeline-native-<host>-<date>.json [...]

Writes ``<same name>.png`` next to each JSON file and rewrites its ``.md``
report so that it shows the plot.  Needs matplotlib (``pip install
matplotlib``, or ``make venv``); the installed package does not plot.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from hostless_tools.bench.pipeline import mode_name, report_markdown
from hostless_tools.bench.pipeline_report import default_set, get


def plot(result: dict[str, Any], path: str | os.PathLike[str]) -> str | None:
    """Write the PNG summary of a pipeline result; returns None, or why it was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: plot skipped (pip install matplotlib)"
    sets = result["agent_sets"]
    key = default_set(result)
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    colors = {
        "host+copy": "#c0392b",
        "host+shared": "#e67e22",
        "direct+copy": "#2980b9",
        "direct+shared": "#27ae60",
    }
    ax = axes[0]
    labels, vals = [], []
    for k, e in sets.items():
        h = get(e, "pipelines", "identity", "modes", "direct+shared", "per_hop", "p50")
        if h is not None:
            labels.append(f"hostless {k}")
            vals.append(h / 1e3)
    for kind, nm in (("cg", "Ray CG"), ("actors", "Ray actors")):
        h = get(result, "ray", kind, "identity", "per_hop", "p50")
        if h is not None:
            labels.append(nm)
            vals.append(h / 1e3)
    c_spin = get(result, "references", "c_spin", "p50")
    if c_spin is not None:
        labels.append("C spin ping-pong")
        vals.append(c_spin / 2e3)
    ax.barh(range(len(labels)), vals, color="#27ae60")
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("per hop p50 (us, log)")
    ax.set_title("identity chain, direct+shared: per hop")
    ax.grid(alpha=0.3, axis="x")

    ax = axes[1]
    pls = [
        p for p in ("identity", "vision_small", "vision_large", "diamond") if get(sets, key, "pipelines", p)
    ]
    width = 0.2
    for j, (mode, c) in enumerate(colors.items()):
        ax.bar(
            [i + (j - 1.5) * width for i in range(len(pls))],
            [sets[key]["pipelines"][p]["modes"][mode]["speedup"] for p in pls],
            width,
            color=c,
            label=mode,
        )
    ax.set_xticks(range(len(pls)))
    ax.set_xticklabels(pls, fontsize=8)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("latency speedup vs host+copy (p50)")
    ax.set_title(f"speedup per pipeline ({key})")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")

    ax = axes[2]
    vs = get(sets, key, "pipelines", "vision_large", "stream") or {}
    names = list(vs)
    ax.barh(
        range(len(names)),
        [vs[k]["fps"] for k in names],
        color=[colors[mode_name(vs[k]["dispatch"], vs[k]["data"])] for k in names],
    )
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=7)
    ax.set_xlabel("frames / s")
    ax.set_title(f"data-bound pipeline, streaming ({key})")
    ax.grid(alpha=0.3, axis="x")
    m = result["machine"]
    fig.suptitle(f"hostless pipeline benchmark: {m['hostname']}, {m['nproc']} CPUs, {m['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv: list[str] | None = None) -> int:
    """Plot each result file given; 1 when matplotlib is missing."""
    ap = argparse.ArgumentParser(prog="python benchmarks/plot.py", description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="pipeline-*.json result files")
    args = ap.parse_args(argv)
    for js in args.results:
        result = json.loads(js.read_text(encoding="utf-8"))
        if result.get("benchmark") != "pipeline-native":
            print(f"{js}: not a pipeline result, skipped", file=sys.stderr)
            continue
        png = js.with_suffix(".png")
        why = plot(result, png)
        if why:
            print(why, file=sys.stderr)
            return 1
        js.with_suffix(".md").write_text(report_markdown(result, png.name), encoding="utf-8")
        print(f"wrote {png} and {js.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
