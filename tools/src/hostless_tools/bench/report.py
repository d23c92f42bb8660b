"""The reporting half of every benchmark: number formats, tables, the Markdown report, result files.

A benchmark's report module turns its result dict (already measured, see
:mod:`hostless_tools.bench.harness`) into rows; this module renders the rows as
Markdown (the ``.md`` report), rich or plain text (the terminal), and writes
``<kind>-<host>-<date>[-quick].json`` with ``.md`` (:func:`write_results`, the
one writer that ``hostless bench``, ``hostless chaos`` and ``hostless fuzz``
share).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hostless.tables import print_table as print_table  # the CLI's tables (rich or plain text)
from hostless.tables import text_table as text_table

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

Table = tuple[str, Sequence[str], Sequence[Sequence[str]]]
"""(title, headers, rows) of one table."""


# --------------------------------------------------------------------------- numbers


def fmt_ns(ns: float | None) -> str:
    """Format a duration in nanoseconds with a unit: ``237 ns``, ``1.24 us``, ``70.1 us``, ``3.2 ms``."""
    if ns is None or ns != ns:  # None or NaN
        return "n/a"
    if ns < 1_000:
        return f"{ns:.0f} ns"
    if ns < 10_000:
        return f"{ns / 1e3:.2f} us"
    if ns < 1_000_000:
        return f"{ns / 1e3:.1f} us"
    if ns < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def fmt_ratio(r: float | None) -> str:
    """``2.1x``; ``n/a`` when missing."""
    if r is None or r != r:
        return "n/a"
    if r >= 100:
        return f"{r:.0f}x"
    if r >= 10:
        return f"{r:.1f}x"
    return f"{r:.2f}x"


def fmt_ops(v: float) -> str:
    """Operations per second: ``1.24 M/s``, ``750 k/s``."""
    return f"{v / 1e6:.2f} M/s" if v >= 1e6 else f"{v / 1e3:.0f} k/s"


def fmt_met(m: bool | None) -> str:
    """A goal's "met?" cell: yes, NO, n/a."""
    return "n/a" if m is None else ("yes" if m else "NO")


def fmt_size(n: int) -> str:
    """``4 KiB``, ``64 MiB``, ``1 GiB``."""
    for unit, div in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


# --------------------------------------------------------------------------- tables


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table."""

    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    out = ["| " + " | ".join(esc(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def print_tables(tables: Sequence[Table], result: Mapping[str, Any], *, plain: bool = False) -> None:
    """Print each table that has rows, then the run's errors."""
    for title, headers, rows in tables:
        if rows:
            print_table(title, headers, rows, plain=plain)
    for k, v in result["errors"].items():
        print(f"error in {k}: {v}")


def rate_rows(figures: Mapping[str, Any] | None, labels: Mapping[str, str]) -> list[list[str]]:
    """Rows of an ops/s table (figures from ``harness.rate_figures``): label, median, min, max, runs."""
    if not figures:
        return []
    return [
        [
            labels[k],
            fmt_ops(v["ops_per_s_median"]),
            fmt_ops(v["ops_per_s_min"]),
            fmt_ops(v["ops_per_s_max"]),
            f"{len(v['runs'])} x {v['ops_per_run']}",
        ]
        for k, v in figures.items()
    ]


def rate_goal_row(g: Mapping[str, Any]) -> list[str]:
    """The goals-table row of an ops/s goal (``harness.rate_goal``)."""
    return [
        g["label"],
        f"{fmt_ops(g['ops_per_s'])} (median)",
        f"{fmt_ops(g['ops_per_s_min'])}-{fmt_ops(g['ops_per_s_max'])}",
        f"{fmt_ratio(g['ratio'])} of 1M/s",
        g["goal"],
        fmt_met(g["met"]),
    ]


# --------------------------------------------------------------------------- the Markdown report


def header(
    title: str,
    result: Mapping[str, Any],
    details: Sequence[str],
    *,
    cpus_note: str = "",
    arch: bool = True,
    software_tail: str = "",
) -> list[str]:
    """The title and the bullet list that open a report: machine, software, ``details``, duration."""
    m = result["machine"]
    git = f" (git {m['git']})" if m.get("git") else ""
    return [
        f"# hostless {title} benchmark: {m['hostname']}, {m['date']}",
        "",
        f"- machine: {m['cpu_model']}, {m['nproc']} CPUs{cpus_note}, Linux {m['kernel']}"
        f"{' (' + m['machine'] + ')' if arch else ''}; load average at start {m['loadavg_at_start']}",
        f"- software: Python {m['python']}, NumPy {m['numpy']}, hostless {m['hostless']}{git}{software_tail}",
        *(f"- {d}" for d in details),
        f"- run took {result.get('duration_s', '?')} s",
        "",
    ]


def pinned_note(result: Mapping[str, Any]) -> str:
    """Whether the two processes of a run were pinned, and to which CPUs."""
    if result["pinned"]:
        return f"pinned to CPUs {result['cpus'][0]} and {result['cpus'][1]} (os.sched_setaffinity)"
    return "NOT pinned (fewer than two CPUs available, or pinning disabled)"


def section(
    title: str, intro: str | None, headers: Sequence[str], rows: Sequence[Sequence[str]], level: int = 2
) -> list[str]:
    """A report section: heading, optional paragraph, table."""
    out = ["#" * level + " " + title, ""]
    if intro:
        out += [intro, ""]
    return out + [markdown_table(headers, rows), ""]


def errors_section(result: Mapping[str, Any]) -> list[str]:
    """The "Errors" section (empty when nothing failed)."""
    if not result["errors"]:
        return []
    return ["## Errors", ""] + [f"- {k}: {v}" for k, v in result["errors"].items()] + [""]


# --------------------------------------------------------------------------- result files


def safe_hostname(name: str | None = None) -> str:
    """The hostname reduced to characters that are safe in a file name."""
    host = name if name is not None else socket.gethostname()
    return re.sub(r"[^A-Za-z0-9._-]+", "_", host.split(".")[0]) or "host"


def result_stem(kind: str, result: Mapping[str, Any]) -> str:
    """``<kind>-<host>-<YYYY-MM-DD-HHMM>[-quick]``: the file name of a run's results."""
    try:
        when = _dt.datetime.fromisoformat(result["machine"]["date"])
    except (KeyError, ValueError):
        when = _dt.datetime.now(_dt.timezone.utc)
    stem = f"{kind}-{safe_hostname(result['machine'].get('hostname'))}-{when.strftime('%Y-%m-%d-%H%M')}"
    if result.get("config", {}).get("quick"):
        stem += "-quick"
    return stem


def write_json_md(path_stem: Path, result: Mapping[str, Any], markdown: str) -> tuple[Path, Path]:
    """Write ``<stem>.json`` (every figure) and ``<stem>.md`` (the report); returns both paths."""
    path_stem = Path(path_stem)
    js = path_stem.parent / (path_stem.name + ".json")
    md = path_stem.parent / (path_stem.name + ".md")
    js.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    md.write_text(markdown, encoding="utf-8")
    return js, md


def write_results(
    kind: str, result: Mapping[str, Any], markdown: str, out_dir: str | os.PathLike[str]
) -> tuple[Path, Path]:
    """Write ``<kind>-<host>-<date>.json`` and ``.md`` into ``out_dir`` (made if missing)."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    return write_json_md(d / result_stem(kind, result), result, markdown)
