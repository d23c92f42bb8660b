"""Goals and reports of the fence benchmark (:mod:`hostless.bench.fences` measures).

:func:`evaluate_goals` compares a run's figures with its references and the
project's goals; :func:`report_markdown` is the readable report,
:func:`print_report` the terminal tables, :func:`write_results` writes the
JSON and the report.  All of them work on a finished result dict, so a report
can be regenerated from a JSON file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import report
from .harness import rate_goal, ratio
from .report import fmt_met, fmt_ns, fmt_ratio, header, pinned_note, rate_goal_row

__all__ = [
    "LATENCY_FIGURES",
    "DEFAULT_OUT_DIR",
    "evaluate_goals",
    "goal_rows",
    "latency_rows",
    "throughput_rows",
    "report_markdown",
    "write_results",
    "print_report",
]

DEFAULT_OUT_DIR = "benchmarks/results"

LATENCY_FIGURES: dict[str, str] = {
    "timeline_spin": "hostless timelines, spin mode",
    "timeline_sleep": "hostless timelines, sleep mode (spin=0)",
    "fence_spin": "hostless fence per round, spin mode",
    "fence_sleep": "hostless fence per round, sleep mode (spin=0)",
    "c_spin": "C spin ping-pong, one cache line",
    "c_futex": "C futex ping-pong, one cache line",
    "numpy_spin": "NumPy spin loop on shared_memory",
    "pipe": "multiprocessing.Pipe, blocking recv_bytes (sleeps in the kernel)",
    "pipe_poll": "multiprocessing.Pipe, spinning on poll() before recv_bytes",
}


def _p(result: dict[str, Any], key: str, q: str = "p50") -> float | None:
    fig = result["latency"].get(key)
    return None if fig is None else float(fig[q])


def evaluate_goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Compare the hostless figures with the references and the project's goals.

    Ratios are of medians (p50); the p99 ratio is given beside.  ``met`` is
    None when a figure or its reference is missing.
    """
    goals: list[dict[str, Any]] = []

    def latency_goal(key: str, ref: str, goal: str, limit: float, faster_by: bool = False) -> None:
        v50, v99 = _p(result, key), _p(result, key, "p99")
        r50, r99 = _p(result, ref), _p(result, ref, "p99")
        if faster_by:  # reference / hostless must be >= limit
            r, rp = ratio(r50, v50), ratio(r99, v99)
            ref_text = f"{LATENCY_FIGURES[ref]} / this"
        else:  # hostless / reference must be <= limit
            r, rp = ratio(v50, r50), ratio(v99, r99)
            ref_text = f"this / {LATENCY_FIGURES[ref]}"
        goals.append(
            {
                "figure": key,
                "label": LATENCY_FIGURES[key],
                "p50_ns": v50,
                "p99_ns": v99,
                "reference": ref,
                "ratio_of": ref_text,
                "ratio": r,
                "ratio_p99": rp,
                "goal": goal,
                "met": None if r is None else (r >= limit if faster_by else r <= limit),
            }
        )

    # The goals are stated against the physical anchors (the C ping-pongs) and the
    # Python floor; multiprocessing.Pipe is compared like for like only: its
    # blocking recv with hostless's sleep mode, its poll() spin with the spin mode.
    for key in ("timeline_spin", "fence_spin"):
        latency_goal(key, "c_spin", "<= 3x C spin", 3.0)
        latency_goal(key, "numpy_spin", "<= 1x NumPy spin loop", 1.0)
        latency_goal(key, "pipe_poll", "faster than Pipe, both spinning (>= 1x)", 1.0, faster_by=True)
    for key in ("timeline_sleep", "fence_sleep"):
        latency_goal(key, "c_futex", "<= 1.3x C futex", 1.3)
        latency_goal(key, "pipe", "no slower than Pipe, both blocking (>= 1x)", 1.0, faster_by=True)
    tp = result.get("throughput")
    if tp is not None:
        goals.append(
            rate_goal(
                "throughput",
                "create+signal+release, Python API, one core",
                tp["api"],
                ">= 1M ops/s",
                {"reference": "goal", "ratio_p99": None},
            )
        )
    return goals


_REF_NAMES = {
    "c_spin": "C spin",
    "c_futex": "C futex",
    "numpy_spin": "NumPy spin",
    "pipe": "Pipe (blocking)",
    "pipe_poll": "Pipe (polled)",
}


def goal_rows(result: dict[str, Any]) -> list[list[str]]:
    """Rows of the goals table: figure, p50, p99, ratio, goal, met?"""
    rows = []
    for g in result["goals"]:
        if g["figure"] == "throughput":
            rows.append(rate_goal_row(g))
            continue
        r = fmt_ratio(g["ratio"])
        if g["ratio_p99"] is not None:
            r += f" (p99 {fmt_ratio(g['ratio_p99'])})"
        ref = g["reference"]
        name = _REF_NAMES.get(ref, ref)
        r += f" faster than {name}" if ref in ("pipe", "pipe_poll") else f" vs {name}"
        rows.append([g["label"], fmt_ns(g["p50_ns"]), fmt_ns(g["p99_ns"]), r, g["goal"], fmt_met(g["met"])])
    return rows


def latency_rows(result: dict[str, Any]) -> list[list[str]]:
    """Rows of the round-trip table: figure, n, min, p50 (block spread), p90, p99, mean."""
    rows = []
    for key, label in LATENCY_FIGURES.items():
        f = result["latency"].get(key)
        if f is None:
            err = result["errors"].get(key)
            why = f"not measured: {err}" if err else "not in this run"
            rows.append([label, "-", "-", "-", "-", "-", "-", why])
            continue
        rows.append(
            [
                label,
                f"{int(f['n'])}",
                fmt_ns(f["min"]),
                fmt_ns(f["p50"]),
                fmt_ns(f["p90"]),
                fmt_ns(f["p99"]),
                fmt_ns(f["mean"]),
                f"{fmt_ns(f['p50_lo'])} - {fmt_ns(f['p50_hi'])}",
            ]
        )
    return rows


GOAL_HEADERS = ["figure", "p50", "p99", "ratio (of p50)", "goal", "met?"]
LATENCY_HEADERS = ["round trip", "n", "min", "p50", "p90", "p99", "mean", "p50 spread"]
THROUGHPUT_HEADERS = ["throughput", "median", "min", "max", "runs x ops"]
_THROUGHPUT_LABELS = {
    "api": "create+signal+release, Python API",
    "core": "create+signal+release, bare _core calls",
}


def throughput_rows(result: dict[str, Any]) -> list[list[str]]:
    """Rows of the throughput table: API and bare core calls, median, min, max, runs."""
    return report.rate_rows(result.get("throughput"), _THROUGHPUT_LABELS)


def report_markdown(result: dict[str, Any]) -> str:
    """The readable report of one run."""
    m = result["machine"]
    cfg = result["config"]
    lines = header(
        "fence",
        result,
        [
            f"two processes {pinned_note(result)}; the peer is a spawned process",
            f"{cfg['round_trips']} round trips per figure in {cfg['rounds']} round(s), each after "
            f"{cfg['warmup']} dropped warm-up round trips"
            f"{' (--quick run)' if cfg['quick'] else ''}; spin mode waits with spin={cfg['spin'] * 1e6:g} us"
            f"{' (the domain default)' if cfg['spin'] == 50e-6 else ''}, sleep mode with spin=0",
        ],
        software_tail=f", {m['gcc'] or 'no gcc'}",
    )
    lines += report.section(
        "Goals",
        "Ratios are of medians (p50), with the p99 ratio in brackets; every figure and every reference "
        "comes from this one run. Each goal names its mode: spin mode is compared with spinning peers "
        "(C spin, NumPy spin, Pipe polled), sleep mode with blocking ones (C futex, Pipe blocking).",
        GOAL_HEADERS,
        goal_rows(result),
    )
    lines += report.section(
        "Round trips between two processes",
        "A signals, B wakes and signals back, A wakes: one clock read per round. "
        "The figures are measured in "
        + (
            f"{cfg['rounds']} interleaved rounds (every figure once per round, so that a drift of the "
            "machine affects all alike); the p50 spread is the lowest and highest median of the rounds."
            if cfg["rounds"] > 1
            else "one round; the p50 spread is the lowest and highest median of 5 consecutive blocks."
        ),
        LATENCY_HEADERS,
        latency_rows(result),
    )
    trows = throughput_rows(result)
    if trows:
        lines += report.section(
            "Throughput on one core",
            "A loop of `f = dom.fence(); f.signal(); f.release()` (and the same three calls on the C "
            "core directly); median of the runs, after one dropped warm-up run.",
            THROUGHPUT_HEADERS,
            trows,
        )
    lines += report.errors_section(result)
    lines += [
        "## How each figure is measured",
        "",
        "- hostless timelines: A `t1.signal(i)`, B `t1.wait(i)` then `t2.signal(i)`, A `t2.wait(i)`. "
        "No object is created per round.",
        "- hostless fence per round: A creates N fence pairs ahead of time (B -> A fences owned by B) and "
        "sends the handles; B imports them; round i signals and waits on pair i.",
        "- C references: `src/hostless/bench/pingpong.c`, compiled at run time with `gcc -O2`; one "
        "32-bit word on one cache line; spin = busy-wait, futex = FUTEX_WAIT at once and FUTEX_WAKE "
        "after every store.",
        "- NumPy spin loop: two u64 slots in `multiprocessing.shared_memory`; each side stores with "
        "NumPy and spins in Python until the other's slot changes.",
        "- multiprocessing.Pipe, blocking: one byte with `send_bytes` / `recv_bytes` each way, both sides "
        "asleep in `recv_bytes` (the peer of sleep mode).",
        "- multiprocessing.Pipe, polled: the same, both sides spinning on `poll()` before `recv_bytes` "
        "(the peer of spin mode).",
        "",
        "Reproduce: `hostless bench fences` (see benchmarks/README.md).",
        "",
    ]
    return "\n".join(lines)


def write_results(
    result: dict[str, Any], out_dir: str | os.PathLike[str] = DEFAULT_OUT_DIR
) -> tuple[Path, Path]:
    """Write ``fences-<host>-<date>.json`` and ``.md`` into ``out_dir``; returns both paths."""
    return report.write_results("fences", result, report_markdown(result), out_dir)


def print_report(result: dict[str, Any], *, plain: bool = False) -> None:
    """Print the goals, round-trip and throughput tables to the terminal."""
    report.print_tables(
        [
            ("hostless fence benchmark: goals", GOAL_HEADERS, goal_rows(result)),
            ("round trips between two processes", LATENCY_HEADERS, latency_rows(result)),
            ("throughput on one core", THROUGHPUT_HEADERS, throughput_rows(result)),
        ],
        result,
        plain=plain,
    )
