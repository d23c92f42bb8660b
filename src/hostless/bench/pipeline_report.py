"""Derived figures, goals and reports of the pipeline benchmark (:mod:`hostless.bench.pipeline`
measures).

:func:`derive` adds the per-hop figures, :func:`evaluate_goals` checks the
issue's goals, :func:`report_markdown` / :func:`print_report` /
:func:`write_results` report a finished result dict.  The plot is drawn by
``benchmarks/plot.py`` in the repository, outside the installed package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import report
from .harness import met, ratio
from .pipeline_workloads import BASELINE, BEST, mode_name
from .report import fmt_met, fmt_ns, fmt_ratio, fmt_size, header, markdown_table

__all__ = [
    "RAY_MEASURED_P50_NS",
    "DEFAULT_OUT_DIR",
    "derive",
    "get",
    "evaluate_goals",
    "report_markdown",
    "write_results",
    "print_report",
]

DEFAULT_OUT_DIR = "benchmarks/results"

RAY_MEASURED_P50_NS = (142_000.0, 261_000.0)
"""Ray 2.60 Compiled Graph a->b echo, p50 on the 2-core dev machine (shared/measured.md, 2026-11-30)."""


def derive(result: dict[str, Any]) -> None:
    """Per-hop figures of the chains: frame p50 / N, and the slope between the shortest and longest chain."""
    wl = result["workloads"]
    hops: dict[str, Any] = {}
    for w in wl.values():
        if w["kind"] != "chain":
            continue
        for st in w["modes"].values():
            st["per_hop_ns"] = st["p50"] / w["stages"]
    sizes = sorted({w["nbytes"] for w in wl.values() if w["kind"] == "chain"})
    for nbytes in sizes:
        chains = sorted(
            (w for w in wl.values() if w["kind"] == "chain" and w["nbytes"] == nbytes),
            key=lambda w: w["stages"],
        )
        if len(chains) < 2:
            continue
        lo, hi = chains[0], chains[-1]
        for mode in hi["modes"]:
            slope = (hi["modes"][mode]["p50"] - lo["modes"][mode]["p50"]) / (hi["stages"] - lo["stages"])
            hops.setdefault(str(nbytes), {})[mode] = {
                "per_hop_ns": hi["modes"][mode]["p50"] / hi["stages"],
                "slope_ns": slope,
                "stages": hi["stages"],
            }
    result["per_hop"] = hops


def get(result: dict[str, Any], *path: str) -> Any:
    cur: Any = result
    for p in path:
        if not isinstance(cur, dict) or p not in cur:
            return None
        cur = cur[p]
    return cur


def evaluate_goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals, each as a ratio measured in this run (``met`` None when a figure is missing)."""
    goals: list[dict[str, Any]] = []
    cfg = result["config"]
    small, large = min(cfg["chain_sizes"]), max(cfg["chain_sizes"])
    nmax = max(cfg["chain_stages"])
    ck = f"chain_{small}_{nmax}"
    best_hop = get(result, "per_hop", str(small), BEST, "per_hop_ns")
    base_hop = get(result, "per_hop", str(small), BASELINE, "per_hop_ns")

    def add(goal: str, figure: str, value: float | None, limit: float, at_most: bool, detail: str) -> None:
        goals.append(
            {
                "goal": goal,
                "figure": figure,
                "value": value,
                "limit": limit,
                "at_most": at_most,
                "met": met(value, limit, at_most),
                "detail": detail,
            }
        )

    add(
        "per-hop overhead in direct+shared <= 5 us",
        f"{nmax}-stage relu chain, {fmt_size(small)}: frame p50 / {nmax}",
        best_hop,
        5000.0,
        True,
        f"slope {fmt_ns(get(result, 'per_hop', str(small), BEST, 'slope_ns'))} per added stage",
    )
    add(
        "per-hop overhead >= 10x lower than host+copy",
        f"{nmax}-stage relu chain, {fmt_size(small)}: host+copy per hop / direct+shared per hop",
        ratio(base_hop, best_hop),
        10.0,
        False,
        f"host+copy {fmt_ns(base_hop)} vs direct+shared {fmt_ns(best_hop)} per hop",
    )
    ray = result["peers"].get("ray", {})
    echo = get(result, "workloads", "echo", "modes", BEST, "p50")
    if ray.get("status") == "measured":
        ray_p50, src = float(ray["p50"]), f"Ray {ray['version']} measured in this run"
    else:
        ray_p50, src = (
            RAY_MEASURED_P50_NS[0],
            "Ray 2.60 from shared/measured.md (142 us, the low end; not installed here)",
        )
    add(
        ">= 25x lower per-hop latency than Ray Compiled Graphs",
        "2-stage echo (copy kernels, 4 KiB), direct+shared: Ray a->b p50 / hostless p50",
        ratio(ray_p50, echo),
        25.0,
        False,
        f"{src}; hostless {fmt_ns(echo)}",
    )
    for d in ("host", "direct"):
        c = get(result, "workloads", f"chain_{large}_{nmax}", "modes", mode_name(d, "copy"), "p50")
        s = get(result, "workloads", f"chain_{large}_{nmax}", "modes", mode_name(d, "shared"), "p50")
        add(
            f"shared beats copy on data-heavy chains >= 2x ({d} dispatch)",
            f"{nmax}-stage relu chain, {fmt_size(large)}: {d}+copy / {d}+shared",
            ratio(c, s),
            2.0,
            False,
            f"{fmt_ns(c)} vs {fmt_ns(s)}",
        )
    add(
        "direct+shared beats host+copy >= 11x on the latency-bound chain",
        f"{nmax}-stage relu chain, {fmt_size(small)}: host+copy / direct+shared frame p50",
        get(result, "workloads", ck, "modes", BEST, "speedup"),
        11.0,
        False,
        f"{fmt_ns(get(result, 'workloads', ck, 'modes', BASELINE, 'p50'))} vs "
        f"{fmt_ns(get(result, 'workloads', ck, 'modes', BEST, 'p50'))}",
    )
    return goals


GOAL_HEADERS = ["goal", "figure", "reached", "met?", "detail"]


def goal_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for g in result["goals"]:
        v = g["value"]
        reached = fmt_ns(v) if g["at_most"] else fmt_ratio(v)
        rows.append([g["goal"], g["figure"], reached, fmt_met(g["met"]), g["detail"]])
    return rows


LATENCY_HEADERS = [
    "workload",
    "mode",
    "p50",
    "p90",
    "per hop",
    "host CPU / frame",
    "speedup vs host+copy",
    "ok",
]


def _workload_label(key: str, w: dict[str, Any]) -> str:
    if w["kind"] == "chain":
        return f"relu chain, {w['stages']} stages, {fmt_size(w['nbytes'])}"
    if w["kind"] == "echo":
        return "echo, 2 stages (copy), 4 KiB"
    if w["kind"] == "gemm":
        return f"GEMM chain, {w['stages']} x {w['n']}x{w['n']} f32"
    if w["kind"] == "vision":
        return f"vision pipeline, {w['stages']} stages, frame {w['shape'][0]}x{w['shape'][1]} u8"
    if w["kind"] == "diamond":
        return f"diamond DAG, {w['stages']} stages, frame {w['shape'][0]}x{w['shape'][1]} u8"
    return key


def latency_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for key, w in result["workloads"].items():
        if "modes" not in w:
            continue
        label = _workload_label(key, w)
        for mode, st in w["modes"].items():
            rows.append(
                [
                    label,
                    mode,
                    fmt_ns(st["p50"]),
                    fmt_ns(st["p90"]),
                    fmt_ns(st["p50"] / w["stages"]),
                    fmt_ns(st["host_cpu_per_frame_ns"]),
                    fmt_ratio(st["speedup"]),
                    "yes" if st["verified"] else "NO",
                ]
            )
            label = ""
    return rows


STREAM_HEADERS = [
    "mode",
    "in flight",
    "frames/s",
    "time per frame",
    "host CPU / frame",
    "speedup vs host+copy",
]


def stream_rows(result: dict[str, Any]) -> list[list[str]]:
    vs = get(result, "workloads", "vision_stream", "variants") or {}
    return [
        [
            mode_name(v["dispatch"], v["data"]),
            str(v["inflight"]),
            f"{v['fps']:.0f}",
            fmt_ns(v["frame_ns"]),
            fmt_ns(v["host_cpu_per_frame_ns"]),
            fmt_ratio(v["speedup"]),
        ]
        for v in vs.values()
    ]


HOP_HEADERS = ["tensor", "mode", "frame p50 / N", "slope per added stage"]


def hop_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for nbytes, modes in result.get("per_hop", {}).items():
        for mode, h in modes.items():
            rows.append([fmt_size(int(nbytes)), mode, fmt_ns(h["per_hop_ns"]), fmt_ns(h["slope_ns"])])
    return rows


PEER_HEADERS = ["peer", "p50", "p90", "p99", "per hop (p50 / N)"]


def peer_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for key, p in result["peers"].items():
        if key == "ray":
            if p.get("status") == "measured":
                rows.append(
                    [
                        f"Ray {p['version']} Compiled Graph, 2-actor echo",
                        fmt_ns(p["p50"]),
                        fmt_ns(p["p90"]),
                        fmt_ns(p["p99"]),
                        fmt_ns(p["p50"] / 2),
                    ]
                )
            else:
                lo, hi = RAY_MEASURED_P50_NS
                rows.append(
                    [
                        f"Ray Compiled Graph, 2-actor echo: {p.get('status')} (shared/measured.md: Ray 2.60)",
                        f"{fmt_ns(lo)} - {fmt_ns(hi)}",
                        "-",
                        "-",
                        f"{fmt_ns(lo / 2)} - {fmt_ns(hi / 2)}",
                    ]
                )
            continue
        n = p.get("stages", 2)
        rows.append([p["label"], fmt_ns(p["p50"]), fmt_ns(p["p90"]), fmt_ns(p["p99"]), fmt_ns(p["p50"] / n)])
    rt = result.get("spin_round_trip")
    if rt:
        rows.append(
            [
                "host -> cpu agent -> host round trip (4 KiB relu), both polling, no wake-up",
                fmt_ns(rt["p50"]),
                fmt_ns(rt["p90"]),
                fmt_ns(rt["p99"]),
                fmt_ns(rt["p50"] / 2),
            ]
        )
    for kind, fl in result.get("agent_floor", {}).items():
        what = "KERNEL packet" if kind == "cpu" else "ERT START_CU packet"
        rows.append(
            [
                f"agent floor, {kind}: one {what} (4 KiB relu) in one process, no wake-up",
                fmt_ns(fl["p50"]),
                fmt_ns(fl["p90"]),
                fmt_ns(fl["p99"]),
                fmt_ns(fl["p50"]),
            ]
        )
    return rows


def _chain_vs_peers_rows(result: dict[str, Any]) -> list[list[str]]:
    """Hostless direct+shared against multiprocessing chains of the same length and size."""
    rows = []
    for w in result["workloads"].values():
        if w["kind"] != "chain":
            continue
        n, nb = w["stages"], w["nbytes"]
        hl50 = w["modes"][BEST]["p50"]
        pipe = result["peers"].get(f"pipe_chain_{nb}_{n}")
        queue = result["peers"].get(f"queue_chain_{nb}_{n}")
        rows.append(
            [
                f"{n} stages, {fmt_size(nb)}",
                fmt_ns(hl50),
                fmt_ns(pipe["p50"]) if pipe else "-",
                fmt_ratio(ratio(pipe["p50"], hl50)) if pipe else "-",
                fmt_ns(queue["p50"]) if queue else "-",
                fmt_ratio(ratio(queue["p50"], hl50)) if queue else "-",
            ]
        )
    return rows


def report_markdown(result: dict[str, Any], plot_file: str | None = None) -> str:
    """The readable report of one run (``plot_file``: a PNG to show, see benchmarks/plot.py)."""
    cfg = result["config"]
    ray = result["peers"].get("ray", {})
    lines = header(
        "pipeline",
        result,
        [
            f"placement: {result['placement']['note']}; one cpu agent and one npu agent, stages alternate "
            f"between them; host waits spin {result.get('host_spin_s', 50e-6) * 1e6:g} us before sleeping, "
            "agents 50 us (their default); "
            f"{cfg.get('blas_threads', 0) or 'default'} BLAS thread(s) per agent",
            f"{cfg['frames']} frames per latency figure in {cfg['rounds']} interleaved round(s) after "
            f"{cfg['warmup']} "
            f"warm-up frames per mode; {cfg['stream_frames']} frames per streaming figure"
            f"{' (--quick run)' if cfg['quick'] else ''}",
        ],
        cpus_note=f" ({result['cpus_available']} available to the run)",
        arch=False,
        software_tail="; Ray: " + (ray.get("version") or str(ray.get("status"))),
    )
    lines += [
        "## Goals",
        "",
        "Every ratio is of medians (p50) measured in this run, except Ray's when it is not installed.",
        "",
        markdown_table(GOAL_HEADERS, goal_rows(result)),
        "",
    ]
    if plot_file:
        lines += [f"![pipeline benchmark]({plot_file})", ""]
    lines += [
        "## Frame latency (`CompiledGraph.run`, one frame at a time)",
        "",
        "host CPU / frame is `time.process_time()` of the host process over the measured frames: what the "
        "orchestrating CPU spends (spinning included) while the agents work.",
        "",
        markdown_table(LATENCY_HEADERS, latency_rows(result)),
        "",
        "## Per-hop overhead (relu chains alternating cpu and npu)",
        "",
        "frame p50 / N is the issue's definition (it includes the host's submit and final wait and the input "
        "and output copies, spread over the N hops); the slope is (p50 of the longest chain - p50 of the "
        "shortest) / (difference in stages): the cost of one more hop with the fixed costs removed.",
        "",
        markdown_table(HOP_HEADERS, hop_rows(result)),
        "",
        "## Streaming (`CompiledGraph.stream`), vision pipeline",
        "",
        "Host modes keep one frame in flight (the host waits for each stage); direct modes keep `inflight` "
        "frames in flight and the host submits once per frame.",
        "",
        markdown_table(STREAM_HEADERS, stream_rows(result)),
        "",
        "## Peers",
        "",
        markdown_table(PEER_HEADERS, peer_rows(result)),
        "",
        "### hostless direct+shared against multiprocessing chains of the same shape",
        "",
        markdown_table(
            [
                "chain",
                "hostless direct+shared",
                "Pipe chain",
                "Pipe / hostless",
                "Queue chain",
                "Queue / hostless",
            ],
            _chain_vs_peers_rows(result),
        ),
        "",
    ]
    lines += report.errors_section(result)
    lines += [
        "## How it is measured",
        "",
        "- One domain, one `cpu` agent (NumPy worker) and one `npu` agent (emulated NPU: every stage is an "
        "ERT START_CU command buffer), spawned once; every workload is compiled in the four modes, each mode "
        "checked against a NumPy reference, warmed up, then timed frame by frame in interleaved rounds.",
        "- host dispatch: the host pushes a stage's packet, waits for the stage's timeline, (copy mode: "
        "copies "
        "the output into the next stage's private input), pushes the next.  direct dispatch: the host pushes "
        "the first packet; each packet carries the next stage's packet (and in copy mode a copy packet) as a "
        "follow-up that the agent enqueues itself; the host waits for the last timeline.",
        "- multiprocessing peers: spawned processes chained by `Pipe(duplex=False)` or `Queue`, each "
        "applying "
        "the same relu (`np.maximum`) and sending the array on (pickled); the host sends into the first and "
        "receives from the last.",
        "- Ray: `ray.dag` two-actor echo compiled with `experimental_compile()`, in a child interpreter "
        "(`benchmarks/peers/ray_echo.py`); the multiprocessing chains run from "
        "`benchmarks/peers/mp_chain.py`.",
        "- agent floor: `hostless.agents.loop.AgentLoop.execute` run in the benchmark process on a packet it "
        "pushed and popped itself: the Python work of a hop without any cross-process wake-up.",
        "",
        "Reproduce: `hostless bench pipeline` (see benchmarks/README.md).",
        "",
    ]
    return "\n".join(lines)


def write_results(result: dict[str, Any], out_dir: str | os.PathLike[str] = DEFAULT_OUT_DIR) -> list[Path]:
    """Write ``pipeline-<host>-<date>.json`` and ``.md`` into ``out_dir``; returns the paths.

    The plot is drawn apart: ``python benchmarks/plot.py <the JSON>`` (needs matplotlib)
    writes the ``.png`` beside it and shows it in the ``.md``.
    """
    return list(report.write_results("pipeline", result, report_markdown(result), out_dir))


def print_report(result: dict[str, Any], *, plain: bool = False) -> None:
    """Print the goal, latency, streaming, per-hop and peer tables."""
    report.print_tables(
        [
            ("hostless pipeline benchmark: goals", GOAL_HEADERS, goal_rows(result)),
            ("frame latency", LATENCY_HEADERS, latency_rows(result)),
            ("per-hop overhead", HOP_HEADERS, hop_rows(result)),
            ("vision pipeline, streaming", STREAM_HEADERS, stream_rows(result)),
            ("peers", PEER_HEADERS, peer_rows(result)),
        ],
        result,
        plain=plain,
    )
