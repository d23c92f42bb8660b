"""Per-hop cost of identity chains on the default native agents, A/B over the agents'
environment in one run: ``python -m hostless_tools.bench.hops -o DIR [--ab VAR=a,VAR=b]``.

Chains of 1, 2 and 3 ``copy`` stages (16 float32), alternating a cpu and an npu agent,
compiled direct+shared with one frame in flight; the host runs ``CompiledGraph.run``
back to back and times each call (``perf_counter_ns``).  A frame of k stages is k+1
hops (host -> s0 -> ... -> host).  The host is pinned to the first CPU of the run,
the cpu agent to the third and the npu agent to the fifth (when the machine has them:
neighbours apart, so that no two spinning processes share a core's siblings).

``--ab`` names settings of the agents' environment (``VAR=value``, comma separated),
each spawning its own pair of agents; rounds interleave the settings, so that a drift
of the machine hits them alike.  The default compares the agents' kept imports off
(``HOSTLESS_AGENT_KEEP_NS=0``, the loop that released every object after its packet)
and on (the engine's default).  Report: per chain and setting, the frame's p50 (spread
of the per-round medians), p10, p90 and the per-hop p50; the ratio of each setting's
p50 to the first's.  Figures from a shared or noisy machine are not figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from hostless_tools.bench.harness import (
    affinity,
    finish,
    new_result,
    pinned,
    set_affinity,
    summarize,
    temp_domain,
)
from hostless_tools.bench.pipeline import spawn_pair
from hostless_tools.bench.pipeline_workloads import identity_chain
from hostless_tools.bench.report import fmt_ns, header, markdown_table, write_results

CHAINS = (("1 stage", 1), ("2 stages", 2), ("3 stages", 3))


@dataclass
class Config:
    frames: int = 20000
    warmup: int = 2000
    rounds: int = 3
    ab: tuple[str, ...] = ("HOSTLESS_AGENT_KEEP_NS=0", "default")
    spin: float = 0.2


def _setting(s: str) -> tuple[str, str] | None:
    if s == "default":
        return None
    var, sep, val = s.partition("=")
    if not sep or not var:
        raise ValueError(f"--ab: a setting is VAR=value or 'default', got {s!r}")
    return var, val


def _one_round(setting: str, cfg: Config, cpus: list[int]) -> dict[str, np.ndarray]:
    kv = _setting(setting)
    saved = os.environ.get(kv[0]) if kv else None
    if kv:
        os.environ[kv[0]] = kv[1]
    out: dict[str, np.ndarray] = {}
    try:
        with temp_domain("hops", heap=16 << 20) as dom:
            cpu, npu, _ = spawn_pair(dom, True, cfg.spin, "hops")
            try:
                set_affinity(cpu.proc.pid, cpus[min(2, len(cpus) - 1)])
                set_affinity(npu.proc.pid, cpus[min(4, len(cpus) - 1)])
                x = np.arange(16, dtype=np.float32)
                for label, stages in CHAINS:
                    g, ref = identity_chain(dom, cpu, npu, 16, stages)
                    with g.compile("direct", "shared", inflight=1) as cg:
                        for _ in range(cfg.warmup):
                            cg.run({"x": x})
                        ts = np.empty(cfg.frames, np.int64)
                        for i in range(cfg.frames):
                            t0 = time.perf_counter_ns()
                            r = cg.run({"x": x})
                            ts[i] = time.perf_counter_ns() - t0
                        if any(not np.array_equal(r[k], v) for k, v in ref(x).items()):
                            raise AssertionError(f"{label}: wrong output")
                        out[label] = ts
            finally:
                cpu.stop()
                npu.stop()
    finally:
        if kv:
            if saved is None:
                os.environ.pop(kv[0], None)
            else:
                os.environ[kv[0]] = saved
    return out


def run(cfg: Config) -> dict[str, Any]:
    started = time.monotonic()
    result = new_result("hops", cfg, figures={})
    cpus = affinity()
    result["placement"] = {
        "host": cpus[0],
        "cpu": cpus[min(2, len(cpus) - 1)],
        "npu": cpus[min(4, len(cpus) - 1)],
    }
    rounds: dict[str, list[np.ndarray]] = {}
    with pinned(cpus[0]):  # this process for the run only (a caller's affinity comes back)
        for _ in range(cfg.rounds):
            for s in cfg.ab:
                for label, ts in _one_round(s, cfg, cpus).items():
                    rounds.setdefault(f"{s} / {label}", []).append(ts)
    for key, groups in rounds.items():
        allts = np.concatenate(groups)
        result["figures"][key] = {**summarize(allts, groups=groups), "p10": float(np.percentile(allts, 10))}
    finish(result, _goals, started)
    return result


def _goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    cfg, f, out = result["config"], result["figures"], []
    first = cfg["ab"][0]
    for s in cfg["ab"][1:]:
        for label, stages in CHAINS:
            a, b = f.get(f"{first} / {label}"), f.get(f"{s} / {label}")
            if a and b:
                out.append(
                    {
                        "label": f"{label}: p50 {s} / {first}",
                        "value": b["p50"] / a["p50"],
                        "per_hop_ns": b["p50"] / (stages + 1),
                    }
                )
    return out


def report(result: dict[str, Any]) -> str:
    rows = []
    for key, st in result["figures"].items():
        label = key.rsplit(" / ", 1)[1]
        hops = dict(CHAINS)[label] + 1
        rows.append(
            [
                key,
                fmt_ns(st["p50"]),
                f"{fmt_ns(st['p50_lo'])}-{fmt_ns(st['p50_hi'])}",
                fmt_ns(st["p10"]),
                fmt_ns(st["p90"]),
                fmt_ns(st["p50"] / hops),
            ]
        )
    ratios = [[g["label"], f"{g['value']:.3f}", fmt_ns(g["per_hop_ns"])] for g in result["goals"]]
    pl = result["placement"]
    return "\n".join(
        [
            *header(
                "per-hop A/B (identity chains, native agents, direct+shared)",
                result,
                [
                    f"host on CPU {pl['host']}, cpu agent on CPU {pl['cpu']}, npu agent on CPU {pl['npu']}",
                    f"{result['config']['frames']} frames per chain, setting and round; "
                    f"{result['config']['rounds']} interleaved round(s)",
                ],
            ),
            (__doc__ or "").split("\n\n", 1)[1],
            "",
            markdown_table(
                ["setting / chain", "frame p50", "spread of round p50s", "p10", "p90", "per hop p50"], rows
            ),
            "",
            markdown_table(["ratio", "value", "per hop p50"], ratios),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("-o", "--out", default="benchmarks/results")
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ab", default=",".join(Config.ab), help="settings, comma separated (%(default)s)")
    ap.add_argument("--quick", action="store_true", help="300 frames, 1 round (a smoke run)")
    a = ap.parse_args(argv)
    ab = tuple(x.strip() for x in a.ab.split(",") if x.strip())
    for s in ab:
        _setting(s)
    cfg = Config(frames=300, warmup=100, rounds=1, ab=ab) if a.quick else Config(a.frames, 2000, a.rounds, ab)
    result = run(cfg)
    md = report(result)
    js, mdp = write_results("hops", result, md, a.out)
    print(md)
    print(f"wrote {js} and {mdp}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
