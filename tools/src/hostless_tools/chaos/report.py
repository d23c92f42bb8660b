"""The chaos run's report: a few terminal lines, the Markdown report, the result files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import _tooling
from .record import ANOMALY_KINDS


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A few lines for the terminal."""
    cfg = result["config"]
    out = [
        f"chaos {'PASSED' if result['ok'] else 'FAILED'}: seed {result['seed']}, mode {cfg['mode']}, "
        f"{result['workers_started']} workers started, {result['kills']} kills, "
        f"{result['ops_total']} operations in {result['run_s']} s ({result['duration_s']} s in all)",
        f"anomalies: {result['anomalies_total']} "
        + (str(result["anomaly_counts"]) if result["anomaly_counts"] else ""),
        f"hung waiters: {result['hung_waiters']}, leaked slots: {len(result['leaked_slots'])}, "
        f"heap bytes left: {result['heap_used']}, check() findings: {len(result['check'])}, "
        f"participants left: {len(result['participants_left'])}",
    ]
    if result.get("shared"):
        sh = result["shared"]
        out.append(
            f"shared: {sh['published']} published, {sh['waits']} driver waits returned {sh['statuses']}"
        )
    for a in result["anomalies"][:5]:
        out.append(f"  {a['kind']} (worker {a['worker']}): {a['detail'][:300]}")
    for f in result["check"][:5]:
        out.append(f"  check: {f}")
    for h in result["hung"][:5]:
        out.append(f"  hung: {h}")
    return out


def report_markdown(result: dict[str, Any]) -> str:
    """The Markdown report of a run."""
    cfg, m = result["config"], result["machine"]
    lines = [
        f"# hostless chaos: {'passed' if result['ok'] else 'FAILED'}",
        "",
        _tooling.machine_line(m),
        f"- seed {result['seed']}; mode {cfg['mode']}; {cfg['workers']} workers at once; "
        f"{cfg['fences']} fence slots; kills asked {cfg['kills']}, done {result['kills']}; "
        f"time limit {cfg['seconds']} s; nested merges {cfg['nested']}, buffers {cfg['buffers']}, "
        f"shared objects {cfg['shared']}",
        f"- {result['workers_started']} workers started, {result['workers_graceful']} left on their own; "
        f"{result['ops_total']} operations in {result['run_s']} s ({result['duration_s']} s with the checks)",
        "",
        "Every worker only uses objects private to it, so any anomaly (an observation that differs "
        "from what the worker's own operations imply) is a protocol bug; see `hostless_tools.chaos`.",
        "",
        "## Verdict",
        "",
        _tooling.markdown_table(
            ["check", "found"],
            [
                ["anomalies", str(result["anomalies_total"])],
                ["hung waiters", str(result["hung_waiters"])],
                ["leaked slots", str(len(result["leaked_slots"]))],
                ["heap bytes left", str(result["heap_used"])],
                ["check() findings", str(len(result["check"]))],
                ["participants left", str(len(result["participants_left"]))],
            ],
        ),
        "",
    ]
    if result["anomaly_counts"]:
        lines += [
            "## Anomalies by kind",
            "",
            _tooling.markdown_table(
                ["kind", "count", "meaning"],
                [[k, str(v), ANOMALY_KINDS.get(k, "")] for k, v in result["anomaly_counts"].items()],
            ),
            "",
            "First ones:",
            "",
        ]
        lines += [
            f"- `{a['kind']}` (worker {a['worker']}): {a['detail'][:500]}" for a in result["anomalies"][:30]
        ]
        lines.append("")
    if result["check"] or result["leaked_slots"] or result["hung"] or result["participants_left"]:
        lines += ["## Domain after the run", ""]
        lines += [f"- check: {f}" for f in result["check"][:30]]
        lines += [f"- leaked slot: {s}" for s in result["leaked_slots"][:30]]
        lines += [f"- hung: {h}" for h in result["hung"][:30]]
        lines += [f"- participant left: {p}" for p in result["participants_left"]]
        lines.append("")
    lines += [
        "## Operations",
        "",
        _tooling.markdown_table(["operation", "count"], [[k, str(v)] for k, v in result["ops"].items()]),
        "",
        "Counts of killed workers stop at their last stats line (written every 0.2 s).",
        "",
    ]
    if result.get("shared"):
        sh = result["shared"]
        lines += [
            "## Shared objects",
            "",
            f"{sh['published']} published; the driver's waits returned {sh['statuses']}; "
            f"{sh['held_and_dropped']} were imported and dropped without waiting; "
            f"{sh['gone_before_import']} were released before the driver could import them.",
            "",
        ]
    lines += [
        f"Reproduce: `hostless chaos --kills {cfg['kills']} --workers {cfg['workers']} "
        f"--seconds {cfg['seconds']} "
        f"--fences {cfg['fences']} --seed {result['seed']}"
        + (f" --mode repro --iterations {cfg['iterations']}" if cfg["mode"] == "repro" else "")
        + "` (the interleaving differs from run to run).",
        "",
    ]
    return "\n".join(lines)


def write_results(
    result: dict[str, Any], out_dir: str | os.PathLike[str] = "benchmarks/results"
) -> tuple[Path, Path]:
    """Write ``chaos-<host>-<date>.json`` and ``.md`` into ``out_dir``; returns both paths."""
    return _tooling.write_run("chaos", result, report_markdown(result), out_dir)
