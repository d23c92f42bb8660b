"""Plot a ``hostless bench pipeline`` result: chain latency, speedups, streaming throughput.

    python benchmarks/plot.py benchmarks/results/pipeline-<host>-<date>.json [...]

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

from hostless.bench.pipeline import mode_name, report_markdown
from hostless.bench.pipeline_report import get
from hostless.bench.report import fmt_size


def plot(result: dict[str, Any], path: str | os.PathLike[str]) -> str | None:
    """Write the PNG summary of a pipeline result; returns None, or why it was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: plot skipped (pip install matplotlib)"
    wl = result["workloads"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    colors = {
        "host+copy": "#c0392b",
        "host+shared": "#e67e22",
        "direct+copy": "#2980b9",
        "direct+shared": "#27ae60",
    }
    ax = axes[0]
    sizes = sorted({w["nbytes"] for w in wl.values() if w["kind"] == "chain"})
    for nbytes, style in zip(sizes, ("-", "--", ":", "-.")[: len(sizes)], strict=True):
        chains = sorted(
            (w for w in wl.values() if w["kind"] == "chain" and w["nbytes"] == nbytes),
            key=lambda w: w["stages"],
        )
        for mode, c in colors.items():
            xs = [w["stages"] for w in chains]
            ys = [w["modes"][mode]["p50"] / 1e3 for w in chains]
            ax.plot(xs, ys, style, marker="o", color=c, label=f"{mode}, {fmt_size(nbytes)}")
    ax.set_yscale("log")
    ax.set_xlabel("stages (alternating cpu / npu)")
    ax.set_ylabel("frame latency p50 (us, log)")
    ax.set_title("relu chains")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)

    ax = axes[1]
    keys = [k for k, w in wl.items() if "modes" in w]
    width = 0.2
    for j, (mode, c) in enumerate(colors.items()):
        ax.bar(
            [i + (j - 1.5) * width for i in range(len(keys))],
            [wl[k]["modes"][mode]["speedup"] for k in keys],
            width,
            color=c,
            label=mode,
        )
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels(
        [k.replace("chain_", "c").replace("_", "/") for k in keys], rotation=45, ha="right", fontsize=7
    )
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("speedup vs host+copy (p50)")
    ax.set_title("speedup per workload")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")

    ax = axes[2]
    vs = get(result, "workloads", "vision_stream", "variants") or {}
    labels = list(vs)
    ax.barh(
        range(len(labels)),
        [vs[k]["fps"] for k in labels],
        color=[colors[mode_name(vs[k]["dispatch"], vs[k]["data"])] for k in labels],
    )
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xlabel("frames / s")
    ax.set_title("vision pipeline, streaming")
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
        if result.get("benchmark") != "pipeline":
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
