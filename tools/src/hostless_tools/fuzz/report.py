"""The fuzz run's report: terminal lines, the Markdown report, the findings list, the result files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import _tooling
from .policy import ACCEPTED, OUTCOMES


def _value_text(r: dict[str, Any]) -> str:
    if r.get("value_hex"):
        return str(r["value_hex"])
    if r.get("bytes"):
        return "bytes " + str(r["bytes"])[:40]
    return str(r.get("value", ""))


def _finding_line(r: dict[str, Any]) -> str:
    bad = [i for i in r.get("innocents", []) if i["outcome"] != "clean"]
    why = "; ".join(f"{i['role']}: {i['why']}" for i in bad) or r.get("why", "")
    return (
        f"{r['outcome'].upper()} {r['region']}.{r.get('field', '?')} ({r.get('target', '')}) "
        f"offset {r.get('offset')} value {_value_text(r)} [{r.get('how', '')}]"
        + (" toggled" if r.get("mode") == "toggle" else "")
        + f": {why}"
    )


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A few lines for the terminal."""
    t = result["totals"]
    dry = " (dry run)" if result["config"].get("dry") else ""
    out = [
        f"fuzz {'PASSED' if result['ok'] else 'FAILED'}{dry}: seed {result['seed']}, {sum(t.values())} cases "
        f"in {result['duration_s']} s: {t['crash']} crash, {t['hang']} hang, {t['error']} setup error, "
        f"{t['clean']} clean",
    ]
    if result["errors_seen"]:
        out.append(
            "accepted errors seen by the innocents: "
            + ", ".join(f"{k} {v}" for k, v in list(result["errors_seen"].items())[:8])
        )
    for r in result["findings"][:20]:
        out.append("  " + _finding_line(r))
        out.append(f"    repro: {r['repro']}")
        if r.get("exact_repro"):
            out.append(f"    exact: {r['exact_repro']}")
    return out


def report_markdown(result: dict[str, Any]) -> str:
    """The Markdown report of a run."""
    cfg, m, t = result["config"], result["machine"], result["totals"]
    lines = [
        f"# hostless fuzz: {'passed' if result['ok'] else 'FAILED'}"
        + (" (dry run: nothing was written)" if cfg.get("dry") else ""),
        "",
        _tooling.machine_line(m),
        f"- seed {result['seed']}; {cfg['cases']} field cases"
        + (f", {cfg['truncate']} truncation cases" if cfg["truncate"] else "")
        + (f" (only case {cfg['case']})" if cfg["case"] is not None else "")
        + f"; {cfg['innocents']} innocents per case (and a victim SIGKILLed after the write in "
        f"{cfg.get('victims', 0):.0%} of the cases); window {cfg['window_s']} s; hang deadline "
        f"{cfg['deadline_s']} s; CLI probes in {cfg['cli']:.0%} of the cases; {result['duration_s']} s",
    ]
    if cfg["sanitizers"]:
        lines.append(f"- sanitizers: {cfg['sanitizers']}")
    lines += [
        "",
        "Each case writes one field of the live domain (twice) while innocent processes that attached "
        "before keep working.  `crash`: an innocent died by a signal, a sanitizer reported, or an "
        "exception of a type other than " + ", ".join(ACCEPTED) + " escaped; `hang`: an innocent "
        "outlived the deadline; see `hostless_tools.fuzz`.",
        "",
        "## Outcomes",
        "",
        f"{t['crash']} crash, {t['hang']} hang, {t['error']} setup error, {t['clean']} clean.",
        "",
    ]
    field_rows = [
        [reg, *(str(c[o]) for o in OUTCOMES)] for reg, c in result["counts"].items() if reg != "truncate"
    ]
    lines += [_tooling.markdown_table(["region", *OUTCOMES], field_rows), ""]
    if "truncate" in result["counts"]:
        c = result["counts"]["truncate"]
        lines += [
            "## Truncation cases (reported apart: surviving them needs SIGBUS handling)",
            "",
            _tooling.markdown_table(["class", *OUTCOMES], [["truncate", *(str(c[o]) for o in OUTCOMES)]]),
            "",
        ]
    by_field: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in result["findings"]:
        by_field.setdefault((r["region"], r.get("field", "?"), r["outcome"]), []).append(r)
    if by_field:
        lines += ["## Crashes and hangs by field", ""]
        lines += [
            _tooling.markdown_table(
                ["region", "field", "outcome", "cases", "repro (first)"],
                [
                    [reg, fld, out, str(len(rs)), f"`{rs[0]['repro']}`"]
                    for (reg, fld, out), rs in by_field.items()
                ],
            ),
            "",
            "## Every crash and hang",
            "",
        ]
        for r in result["findings"]:
            lines.append(f"### case {r['case']}: {r['outcome']} ({r['region']}.{r.get('field', '?')})")
            lines.append("")
            lines.append(f"- {_finding_line(r)}")
            lines.append(f"- reproduce: `{r['repro']}`")
            if r.get("exact_repro"):
                lines.append(f"- exactly this write: `{r['exact_repro']}`")
            if r.get("cli"):
                lines.append(f"- CLI probe: `{r['cli']}`")
            for i in r.get("innocents", []):
                if i["outcome"] == "clean":
                    continue
                lines.append(f"- {i['role']} (pid {i['pid']}, rc {i['rc']}): {i['why']}; last stderr lines:")
                lines.append("")
                lines.append("```")
                lines += [ln[:300] for ln in (i.get("sanitizer") or i.get("stderr_tail") or [])[-40:]]
                lines.append("```")
            lines.append("")
    if result["errors_seen"]:
        lines += [
            "## Accepted errors the innocents met",
            "",
            _tooling.markdown_table(
                ["type", "count"], [[k, str(v)] for k, v in result["errors_seen"].items()]
            ),
            "",
        ]
    lines += ["## Cases", ""]
    lines += [
        _tooling.markdown_table(
            ["case", "region", "field", "target", "offset", "value", "how", "mode", "outcome", "s"],
            [
                [
                    str(r["case"]),
                    r["region"],
                    str(r.get("field", "")),
                    str(r.get("target", "")),
                    str(r.get("offset", "")),
                    _value_text(r),
                    str(r.get("how", ""))[:50],
                    str(r.get("mode", "")),
                    r["outcome"],
                    str(r.get("duration_s", "")),
                ]
                for r in result["cases"]
            ],
        ),
        "",
    ]
    return "\n".join(lines)


def findings_markdown(result: dict[str, Any]) -> str:
    """One line per crash or hang with its reproduction (for a running findings list)."""
    out = []
    git = result["machine"].get("git")
    for r in result["findings"]:
        exact = f" (exact: `{r['exact_repro']}`)" if r.get("exact_repro") else ""
        out.append(f"- [{git}] `{r['repro']}`{exact}: {_finding_line(r)}")
    return "\n".join(out) + ("\n" if out else "")


def write_results(
    result: dict[str, Any], out_dir: str | os.PathLike[str] = "benchmarks/results"
) -> tuple[Path, Path]:
    """Write ``fuzz-<host>-<date>.json`` and ``.md`` into ``out_dir``; returns both paths."""
    return _tooling.write_run("fuzz", result, report_markdown(result), out_dir)
