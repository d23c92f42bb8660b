"""Derived figures, goals and reports of the pipeline benchmark (:mod:`hostless_tools.bench.pipeline`
measures).

:func:`derive` adds the per-hop figures, :func:`evaluate_goals` checks the
issue's goals (each: the measured value, the goal, met or not, and when not
met the measured reason: where the time goes, from the traced frames),
:func:`report_markdown` / :func:`print_report` / :func:`write_results` report a
finished result dict.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import report
from .harness import ratio
from .pipeline_goals import (  # the derived figures and goals (re-exported: the report's API)
    GOAL_HEADERS,
    HOP_LIMIT_NS,
    RAY_INSTALL,
    default_set,
    derive,
    evaluate_goals,
    get,
    goal_rows,
)
from .pipeline_workloads import BASELINE, BEST
from .report import fmt_ns, fmt_ratio, header, markdown_table

__all__ = [
    "DEFAULT_OUT_DIR",
    "HOP_LIMIT_NS",
    "derive",
    "get",
    "default_set",
    "evaluate_goals",
    "travel_rows",
    "travel_figure",
    "report_markdown",
    "write_results",
    "print_report",
]

DEFAULT_OUT_DIR = "benchmarks/results"

SET_HEADERS = ["agent set", "cpu agent", "npu agent", "idle setting", "note"]


def set_rows(result: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for k, e in result.get("agent_sets", {}).items():
        a = e["agents"]
        how = f"polls {e['agent_spin_s'] * 1e3:g} ms, then parks" if e["agent_spin_s"] else "parks at once"
        rows.append([k, a["cpu"], a["npu"], how, a.get("npu_note") or ""])
    return rows


HOP_HEADERS = ["agent set", "mode", "frame p50", "per hop p50", "p10", "p90"]


def hop_rows(result: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for k, e in result.get("agent_sets", {}).items():
        ident = get(e, "pipelines", "identity", "modes") or {}
        for mode, st in ident.items():
            h = st.get("per_hop", {})
            rows.append(
                [k, mode, fmt_ns(st["p50"]), fmt_ns(h.get("p50")), fmt_ns(h.get("p10")), fmt_ns(h.get("p90"))]
            )
    for kind, label in (("cg", "Ray Compiled Graph"), ("actors", "Ray classic actors")):
        st = get(result, "ray", kind, "identity")
        if st and "per_hop" in st:
            h = st["per_hop"]
            rows.append([label, "-", fmt_ns(st["p50"]), fmt_ns(h["p50"]), fmt_ns(h["p10"]), fmt_ns(h["p90"])])
    return rows


PIPELINE_LABELS = {
    "identity": "identity chain, 2 copy stages",
    "vision_small": "vision pipeline, 5 stages, latency-bound",
    "vision_large": "vision pipeline, 5 stages, data-bound",
    "diamond": "diamond DAG, 4 stages",
}

LATENCY_HEADERS = [
    "pipeline",
    "agent set",
    "mode",
    "p50",
    "p10",
    "p90",
    "host CPU / frame",
    "vs host+copy",
    "ok",
]


def latency_rows(result: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    sets = result.get("agent_sets", {})
    names = [p for p in PIPELINE_LABELS if any(p in e.get("pipelines", {}) for e in sets.values())]
    for pl in names:
        label = PIPELINE_LABELS[pl]
        for k, e in sets.items():
            w = get(e, "pipelines", pl)
            if not w:
                continue
            if label and "shape" in w:
                label += f" ({w['shape'][0]}x{w['shape'][1]})"
            for mode, st in w.get("modes", {}).items():
                rows.append(
                    [
                        label,
                        k,
                        mode,
                        fmt_ns(st["p50"]),
                        fmt_ns(st.get("p10")),
                        fmt_ns(st["p90"]),
                        fmt_ns(st["host_cpu_per_frame_ns"]),
                        fmt_ratio(st["speedup"]),
                        "yes" if st["verified"] else "NO",
                    ]
                )
                label = ""
    return rows


STREAM_HEADERS = [
    "agent set",
    "mode",
    "in flight",
    "frames/s",
    "time per frame",
    "host CPU / frame",
    "vs host+copy",
]


def stream_rows(result: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for k, e in result.get("agent_sets", {}).items():
        for v in (get(e, "pipelines", "vision_large", "stream") or {}).values():
            rows.append(
                [
                    k,
                    f"{v['dispatch']}+{v['data']}",
                    str(v["inflight"]),
                    f"{v['fps']:.1f}",
                    fmt_ns(v["frame_ns"]),
                    fmt_ns(v["host_cpu_per_frame_ns"]),
                    fmt_ratio(v["speedup"]),
                ]
            )
    for kind, label in (("cg", "Ray Compiled Graph"), ("actors", "Ray classic actors")):
        fps = get(result, "ray", kind, "vision_large", "fps") or {}
        for k, v in fps.items():
            rows.append([label, "-", str(k), f"{v:.1f}", fmt_ns(1e9 / v if v else None), "-", "-"])
    return rows


RAY_HEADERS = [
    "pipeline",
    "hostless direct+shared",
    "Ray CG",
    "Ray CG / hostless",
    "Ray actors",
    "actors / hostless",
]


def ray_rows(result: Mapping[str, Any]) -> list[list[str]]:
    ray = result.get("ray") or {}
    if ray.get("status") != "measured":
        return [[f"Ray: {ray.get('status')} ({RAY_INSTALL} adds it)", "-", "-", "-", "-", "-"]]
    key = default_set(result)
    rows = []
    for pl, label in PIPELINE_LABELS.items():
        hl = get(result, "agent_sets", key, "pipelines", pl, "modes", BEST, "p50") if key else None
        cells = [label, fmt_ns(hl)]
        for kind in ("cg", "actors"):
            st = get(ray, kind, pl) or {}
            if "p50" in st:
                cells += [fmt_ns(st["p50"]), fmt_ratio(ratio(st["p50"], hl))]
            else:
                cells += [f"failed: {str(st.get('error', 'not measured'))[:80]}", "-"]
        rows.append(cells)
    return rows


REF_HEADERS = ["reference", "p50", "p10", "p90", "note"]


def ref_rows(result: Mapping[str, Any]) -> list[list[str]]:
    refs = result.get("references", {})
    labels = {
        "c_spin": ("C ping-pong, spin (pingpong.c)", "both sides busy-wait on one cache line"),
        "c_futex": ("C ping-pong, futex (pingpong.c)", "both sides sleep in FUTEX_WAIT: two wake-ups"),
        "native_poll_round_trip": (
            "host -> native agent -> host, polling",
            "agent polls, host spins; on two CPUs as the C ping-pong",
        ),
        "native_park_round_trip": (
            "host -> native agent -> host, parked",
            "both asleep: two futex wake-ups; on two CPUs as the C ping-pong",
        ),
        "python_park_round_trip": ("host -> Python agent -> host, parked", "the previous agent loop"),
    }
    rows = []
    for k, (label, note) in labels.items():
        st = refs.get(k)
        if st:
            rows.append([label, fmt_ns(st["p50"]), fmt_ns(st.get("p10")), fmt_ns(st.get("p90")), note])
    for k, st in (refs.get("idle") or {}).items():
        wk, fine = st.get("wakeups_per_s"), st.get("oncpu_share")
        rows.append(
            [
                f"idle agent: {k.replace('_', ' ')}",
                f"{st['core_share'] * 100:.2f} % of a core",
                "-",
                "-",
                f"over {st['seconds']:.1f} s (tick {st['tick_s'] * 1e3:g} ms)"
                + (f", {wk:.0f} wake-ups/s" if wk is not None else "")
                + (f", schedstat {fine * 100:.2f} %" if fine is not None else ""),
            ]
        )
    return rows


STEP_LABELS = {
    "submit": "host: write inputs, patch and push the first packet (queue + doorbell)",
    "wake": "doorbell -> agent pops the packet (poll or futex wake-up)",
    "run": "agent: checks, input waits, kernel",
    "signal": "agent: signal the stage's timeline",
    "next": "-> next packet enqueued (direct: the agent's follow-up push; host: host wakes, copies, pushes)",
    "host_wake": "last signal -> host's wait returns, outputs read",
}

TRAVEL_HEADERS = ["step", "what", "p50", "p10", "p90"]


def travel_figure(bd: Mapping[str, Any] | None, title: str = "") -> list[str]:
    """A mermaid sequence diagram of a traced 2-stage direct-dispatch frame (the identity chain),
    each arrow labelled with its step's measured p50; [] without the figures."""
    st = (bd or {}).get("steps") or {}
    names = list((bd or {}).get("stages") or [])
    if len(names) != 2 or any(f"{n}.run" not in st for n in names):
        return []
    a, b = names

    def t(k: str) -> str:
        return fmt_ns(st[k]["p50"]) if k in st else "n/a"

    return [
        "```mermaid",
        "sequenceDiagram",
        *([f"    %% {title}"] if title else []),
        "    participant H as host (CompiledGraph.run)",
        "    participant QA as queue A (ring + doorbell)",
        "    participant A as agent A (cpu)",
        "    participant QB as queue B (ring + doorbell)",
        "    participant B as agent B (npu)",
        f"    H->>QA: write inputs, patch frame words, push packet ({t('submit')})",
        f"    QA-->>A: doorbell: polled or futex wake-up, pop ({t(a + '.wake')})",
        f"    A->>A: check handles, wait inputs, kernel ({t(a + '.run')})",
        f"    A->>A: signal timeline A = frame ({t(a + '.signal')})",
        f"    A->>QB: push the follow-up packet ({t(a + '.next')})",
        f"    QB-->>B: doorbell: polled or futex wake-up, pop ({t(b + '.wake')})",
        f"    B->>B: check handles, wait inputs, kernel ({t(b + '.run')})",
        f"    B->>B: signal timeline B = frame ({t(b + '.signal')})",
        f"    B-->>H: the host's timeline wait returns, outputs read ({t('host_wake')})",
        f"    Note over H,B: frame {t('frame')} (p50 of each step; the steps of one frame add up to it)",
        "```",
    ]


def travel_rows(bd: Mapping[str, Any] | None) -> list[list[str]]:
    """The steps of a traced frame in travel order, with what each is."""
    if not bd or not bd.get("steps"):
        return []
    rows = []
    for k, st in bd["steps"].items():
        if k == "frame":
            continue
        what = STEP_LABELS.get(k.rsplit(".", 1)[-1], "")
        rows.append([k, what, fmt_ns(st["p50"]), fmt_ns(st["p10"]), fmt_ns(st["p90"])])
    f = bd["steps"].get("frame")
    if f:
        rows.append(
            [
                "frame",
                "the host's clock just before and after CompiledGraph.run",
                fmt_ns(f["p50"]),
                fmt_ns(f["p10"]),
                fmt_ns(f["p90"]),
            ]
        )
    return rows


def report_markdown(result: Mapping[str, Any], plot_file: str | None = None) -> str:
    """The readable report of one run."""
    cfg = result["config"]
    ray = result.get("ray") or {}
    m = result["machine"]
    key = default_set(result)
    npu = (get(result, "agent_sets", key, "agents") if key else None) or {}
    lines = header(
        "pipeline (native agents)",
        result,
        [
            f"placement: {result['placement']['note']}; host waits spin "
            f"{result.get('host_spin_s', 0) * 1e6:g} us "
            f"before sleeping; {cfg.get('blas_threads', 0) or 'default'} BLAS thread(s) per agent",
            f"load average at start {m.get('loadavg_at_start')}, at end {m.get('loadavg_at_end')} "
            "(other work shares this machine: every figure of one run shares that load)",
            f"{cfg['frames']} frames per latency figure ({cfg['large_frames']} for the data-bound "
            "pipeline) in "
            f"{cfg['rounds']} interleaved round(s) after {cfg['warmup']} warm-up frames per mode"
            f"{' (--quick run)' if cfg['quick'] else ''}",
            f"npu agent of the default set ({key}): {npu.get('npu', '?')}"
            + (f" ({npu['npu_note']})" if npu.get("npu_note") else ""),
        ],
        cpus_note=f" ({result['cpus_available']} available to the run)",
        arch=False,
        software_tail="; Ray: " + (ray.get("version") or str(ray.get("status"))),
    )
    lines += [
        "## Goals",
        "",
        f"On the default agent set ({key}); every ratio is of medians (p50) measured in this run.",
        "",
        markdown_table(GOAL_HEADERS, goal_rows(result)),
        "",
        *([f"![pipeline benchmark]({plot_file})", ""] if plot_file else []),
        "## Agent sets",
        "",
        markdown_table(SET_HEADERS, set_rows(result)),
        "",
        "## Per-hop cost (identity chain: 2 copy stages, cpu then npu)",
        "",
        "per hop = frame latency / 3 hops (host -> s0 -> s1 -> host; Ray: driver -> a -> b -> driver).",
        "",
        markdown_table(HOP_HEADERS, hop_rows(result)),
        "",
        "## Frame latency (`CompiledGraph.run`, one frame at a time)",
        "",
        "host CPU / frame: `time.process_time()` of the host over the measured frames.",
        "",
        markdown_table(LATENCY_HEADERS, latency_rows(result)),
        "",
        "## Streaming, data-bound pipeline (`CompiledGraph.stream`)",
        "",
        "Host modes keep one frame in flight; direct modes the number shown (Ray: frames in flight).",
        "",
        markdown_table(STREAM_HEADERS, stream_rows(result)),
        "",
        "## Ray on the identical pipelines (frame latency p50)",
        "",
        markdown_table(RAY_HEADERS, ray_rows(result)),
        "",
        "## References",
        "",
        markdown_table(REF_HEADERS, ref_rows(result)),
        "",
    ]
    bd = result.get("breakdown") or {}
    if bd:
        lines += [
            "## How a packet travels (traced frames)",
            "",
            f"Agent set {bd.get('agent_set')}, a second domain with a trace ring; each frame cut into "
            "its steps "
            "from the ring's ENQUEUE / START / END / SIGNAL events and the host's clock just before and "
            "after `run` (no Python span around it) "
            "(`hostless_tools.bench.pipeline_trace`); the steps of a frame add up to it.",
            "",
        ]
        for pl in ("identity", "vision_small", "vision_large"):
            for mode in (BEST, BASELINE):
                b = get(bd, pl, mode)
                if not b:
                    continue
                lines += [
                    f"### {PIPELINE_LABELS[pl]}, {mode} ({b['frames']} frames; kernels "
                    f"{fmt_ns(b.get('kernels_p50'))}, hand-offs {fmt_ns(b.get('handoffs_p50'))})",
                    "",
                ]
                if pl == "identity" and mode == BEST:
                    fig = travel_figure(b)
                    lines += [*fig, ""] if fig else []
                lines += [markdown_table(TRAVEL_HEADERS, travel_rows(b)), ""]
    lines += report.errors_section(result)
    lines += [
        "## How it is measured",
        "",
        "- One domain, per agent set one `cpu` and one `npu` agent (stages alternate between them); every "
        "pipeline compiled in the four modes, each checked against a NumPy reference, warmed up, then timed "
        "frame by frame in interleaved rounds.",
        "- Agent sets: native = the agent loop in C (`agents.spawn(..., native=True)`), python = the Python "
        f"loop; poll = the agent polls {cfg.get('poll_spin', 0) * 1e3:g} ms after its last packet before it "
        "parks, park = it parks on the futex at once.",
        "- C references: `hostless_tools/bench/pingpong.c` compiled now with gcc -O2, two processes "
        "pinned to two CPUs.",
        "- Idle CPU: utime + stime of the agent process (`/proc/<pid>/stat`) over the interval, its context "
        "switches (`/proc/<pid>/status`) as wake-ups.",
        "- Ray: `benchmarks/peers/ray_pipelines.py` in a child interpreter, two actors as the two "
        "engines, the "
        "same NumPy kernels; Compiled Graph (`experimental_compile`) and classic `.remote()` chains.",
        "",
        "Reproduce: `hostless bench pipeline` from the repository root (see benchmarks/README.md).",
        "",
    ]
    return "\n".join(lines)


def write_results(result: dict[str, Any], out_dir: str | os.PathLike[str] = DEFAULT_OUT_DIR) -> list[Path]:
    """Write ``pipeline-native-<host>-<date>.json`` and ``.md`` into ``out_dir``; returns the paths."""
    return list(report.write_results("pipeline-native", result, report_markdown(result), out_dir))


def print_report(result: dict[str, Any], *, plain: bool = False) -> None:
    """Print the goal, per-hop, latency, streaming, Ray and reference tables."""
    key = default_set(result)
    report.print_tables(
        [
            ("hostless pipeline benchmark: goals", GOAL_HEADERS, goal_rows(result)),
            ("agent sets", SET_HEADERS, set_rows(result)),
            ("per-hop cost (identity chain)", HOP_HEADERS, hop_rows(result)),
            ("frame latency", LATENCY_HEADERS, latency_rows(result)),
            ("data-bound pipeline, streaming", STREAM_HEADERS, stream_rows(result)),
            ("Ray on the identical pipelines", RAY_HEADERS, ray_rows(result)),
            ("references", REF_HEADERS, ref_rows(result)),
            (
                f"how a packet travels: identity chain, direct+shared, {key}",
                TRAVEL_HEADERS,
                travel_rows(get(result, "breakdown", "identity", BEST)),
            ),
        ],
        result,
        plain=plain,
    )
