"""The pipeline benchmark: graphs in the four modes against each other and against peers.

Everything is measured in ONE run on one machine, with one ``cpu`` agent and
one ``npu`` agent (two processes; stages alternate between them so that every
hop crosses processes):

workloads, each compiled in the four modes (dispatch ``host`` / ``direct``
times data ``copy`` / ``shared``) and measured in interleaved rounds:
  * ``chain``: a latency-bound chain of N ``relu`` stages (N = 2, 4, 8)
    alternating cpu and npu, on 4 KiB and 1 MiB float32 tensors;
  * ``gemm``: a compute-intensive chain of 256x256 float32 GEMMs alternating
    cpu and npu (weights uploaded once);
  * ``vision``: the demo's streaming pipeline: normalize on cpu, two GEMMs
    and a relu on the npu, softmax on cpu; per-frame latency (``run``) and
    streaming throughput (``stream``) with 1 frame in flight in host modes
    and 2..4 in direct modes (the host submits once per frame);
  * ``echo``: a 2-stage pipeline of ``copy`` kernels (cpu then npu) on 4 KiB,
    the peer workload of Ray Compiled Graphs.
  * ``diamond``: a diamond DAG at the vision frame size: normalize (cpu),
    then a GEMM (npu) and a scale (cpu) in parallel, joined by an add (cpu).

figures per workload and mode: frame latency median (p50) and p90, the host's
CPU time per frame (``time.process_time``), the speedup against host+copy,
and per hop: frame time / N (the issue's definition) and the slope between
the shortest and the longest chain (fixed costs removed).

peers, in the same run (the peers' own code is in the repository's
``benchmarks/peers/``, outside the installed package: :func:`find_peers`):
  * ``multiprocessing``: a chain of N processes each applying the same relu
    and passing the array on over ``multiprocessing.Pipe`` (and over
    ``multiprocessing.Queue``); the host sends into the first and receives
    from the last; the same chain with N = 2 as an echo;
  * Ray Compiled Graphs: a two-actor echo chain when ``ray`` is importable
    (its version is recorded; "not installed" otherwise: it is an optional
    dependency, not installed by the project).  Its figure from
    ``shared/measured.md`` (142-261 us p50 on the 2-core dev machine) is
    used for the goal when it cannot be measured.
  * the agent floor: the time one agent spends on a packet with no wake-up
    (push, pop, decode, kernel, signal, all in one process): the part of a
    hop that is Python work rather than cross-process wake-up.

:func:`run` returns a JSON-able dict; :func:`write_results` writes it with a
Markdown report (goals and reports: :mod:`hostless.bench.pipeline_report`;
workloads: :mod:`hostless.bench.pipeline_workloads`).  ``benchmarks/plot.py``
draws the PNG from the JSON.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .harness import (
    Progress,
    Recorder,
    affinity,
    drop_domain,
    finish,
    new_domain,
    new_result,
    pinned,
    run_json,
    set_affinity,
    summarize,
)
from .pipeline_report import (
    DEFAULT_OUT_DIR,
    RAY_MEASURED_P50_NS,
    derive,
    evaluate_goals,
    print_report,
    report_markdown,
    write_results,
)
from .pipeline_workloads import (
    BASELINE,
    BEST,
    MODES,
    agent_floor,
    diamond_graph,
    gemm_chain,
    latency,
    mode_name,
    relu_chain,
    spin_round_trip,
    throughput,
    vision_graph,
)
from .report import fmt_ns, fmt_size

__all__ = [
    "PipelineBenchConfig",
    "MODES",
    "BASELINE",
    "BEST",
    "mode_name",
    "plan_placement",
    "vision_graph",
    "find_peers",
    "run",
    "derive",
    "evaluate_goals",
    "report_markdown",
    "write_results",
    "print_report",
    "RAY_MEASURED_P50_NS",
    "DEFAULT_OUT_DIR",
]

_BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class PipelineBenchConfig:
    """Parameters of one run of the pipeline benchmark."""

    frames: int = 400
    """Measured frames per latency figure (in total over the rounds)."""
    warmup: int = 40
    """Frames run first in every mode and dropped."""
    rounds: int = 4
    """Interleaved rounds: every mode once per round, so that a drift of the machine affects all alike."""
    chain_stages: tuple[int, ...] = (2, 4, 8)
    chain_sizes: tuple[int, ...] = (4096, 1 << 20)
    """Bytes per tensor of the chain workload (float32)."""
    gemm_n: int = 256
    gemm_stages: int = 4
    vision_shape: tuple[int, int] = (128, 256)
    """(rows, features) of a vision frame; GEMMs 256x256 and 256x64."""
    vision_inflight: tuple[int, ...] = (2, 3, 4)
    stream_frames: int = 300
    """Frames per streaming-throughput figure."""
    peer_frames: int = 400
    """Round trips per multiprocessing / Ray figure."""
    pin: bool = True
    """Pin the host and the agents to CPUs (see ``placement`` in the result)."""
    host_spin: float | None = None
    """Spin budget (seconds) of the host's waits; None: 0 with fewer than 3 CPUs (a spinning host
    takes a CPU from an agent there, which measured slower in every mode), else the domain default."""
    blas_threads: int = 1
    """BLAS threads per agent (OPENBLAS/OMP/MKL_NUM_THREADS in the agents' environment): one engine,
    one core.  0 leaves the environment alone."""
    quick: bool = False

    @classmethod
    def quick_config(cls) -> PipelineBenchConfig:
        """A small run (well under a minute): for demos and smoke tests."""
        return cls(
            frames=60,
            warmup=10,
            rounds=2,
            chain_stages=(2, 8),
            vision_inflight=(2, 4),
            stream_frames=60,
            peer_frames=60,
            quick=True,
        )


# --------------------------------------------------------------------------- placement


def plan_placement(cpus: Sequence[int], pin: bool) -> dict[str, Any]:
    """Where the host and the two agents run.

    With 3 or more CPUs each gets its own.  With 2 the agents get one each
    and the host floats over both: it only submits and waits (it sleeps once
    its short spin is over), and an agent that shared a CPU with the other
    would make every hop a context switch.  With 1 nothing is pinned.
    """
    cpus = list(cpus)
    if not pin or len(cpus) < 2:
        why = "pinning disabled" if not pin else "fewer than two CPUs"
        return {"pinned": False, "host": None, "cpu": None, "npu": None, "note": f"not pinned ({why})"}
    if len(cpus) >= 3:
        return {
            "pinned": True,
            "host": [cpus[0]],
            "cpu": [cpus[1]],
            "npu": [cpus[2]],
            "note": f"host on CPU {cpus[0]}, cpu agent on CPU {cpus[1]}, npu agent on CPU {cpus[2]}",
        }
    return {
        "pinned": True,
        "host": None,
        "cpu": [cpus[0]],
        "npu": [cpus[1]],
        "note": (
            f"2 CPUs: cpu agent on CPU {cpus[0]}, npu agent on CPU {cpus[1]}, the host not pinned "
            "(it shares both CPUs with the agents)"
        ),
    }


# --------------------------------------------------------------------------- peers

PEERS_ENV = "HOSTLESS_BENCH_PEERS"
"""Environment variable naming the directory of the peer scripts."""


def find_peers(peers_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The directory of the peer scripts (``mp_chain.py``, ``ray_echo.py``): ``peers_dir``,
    else ``$HOSTLESS_BENCH_PEERS``, else ``benchmarks/peers`` under the current directory
    (the repository root, where the results go too); None when there is none."""
    for d in (peers_dir,) if peers_dir is not None else (os.environ.get(PEERS_ENV), "benchmarks/peers"):
        if d and (Path(d) / "mp_chain.py").is_file():
            return Path(d)
    return None


def _no_peers() -> str:
    return f"peer scripts not found (run from the repository root, or set {PEERS_ENV} to benchmarks/peers)"


def _mp_peers(cfg: PipelineBenchConfig, peers: Path | None, say: Progress) -> dict[str, Any]:
    """The multiprocessing chains (``benchmarks/peers/mp_chain.py``, a child interpreter)."""
    if peers is None:
        raise FileNotFoundError(_no_peers())
    spec = {
        "stages": list(cfg.chain_stages),
        "sizes": list(cfg.chain_sizes),
        "frames": cfg.peer_frames,
        "warmup": cfg.warmup,
        "pin": cfg.pin,
    }
    data = run_json([sys.executable, str(peers / "mp_chain.py"), json.dumps(spec)], progress=say)
    out: dict[str, Any] = data["peers"]
    return out


def _ray_peer(cfg: PipelineBenchConfig, peers: Path | None) -> dict[str, Any]:
    """Ray Compiled Graphs, two-actor echo chain (``benchmarks/peers/ray_echo.py``, a child
    interpreter), when ``ray`` is importable."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return {"status": "not installed", "version": None}
    if peers is None:
        return {"status": f"failed: {_no_peers()}", "version": None}
    try:
        cmd = [sys.executable, str(peers / "ray_echo.py"), str(cfg.peer_frames), str(max(20, cfg.warmup))]
        data = run_json(cmd, timeout=300)
        return {"status": "measured", "version": data["version"], **summarize(data["samples_ns"])}
    except Exception as e:  # keep the rest of the run
        return {"status": f"failed: {type(e).__name__}: {e}", "version": None}


# --------------------------------------------------------------------------- the run


def run(
    cfg: PipelineBenchConfig | None = None,
    progress: Progress | None = None,
    peers_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Run the whole pipeline benchmark; returns a JSON-able dict (see module doc).

    ``peers_dir``: the directory of the peer scripts (default: :func:`find_peers`).
    """
    from hostless import agents

    cfg = cfg or PipelineBenchConfig()
    if cfg.frames < 1 or cfg.rounds < 1 or cfg.warmup < 0 or cfg.stream_frames < 1 or cfg.peer_frames < 1:
        raise ValueError("frames, rounds, stream_frames and peer_frames must be >= 1, warmup >= 0")

    started = time.monotonic()
    cpus = affinity()
    place = plan_placement(cpus, cfg.pin)
    result = new_result("pipeline", cfg, cpus_available=len(cpus), placement=place, workloads={}, peers={})
    wl: dict[str, Any] = result["workloads"]
    rec = Recorder(result["errors"], progress)
    say = rec.say
    rng = np.random.default_rng(2026)
    heap = max(256 << 20, 24 * max(cfg.chain_sizes) * max(cfg.chain_stages))
    host_spin = cfg.host_spin if cfg.host_spin is not None else (0.0 if len(cpus) < 3 else 50e-6)
    result["host_spin_s"] = host_spin
    dom, name = new_domain(
        "pipeline", heap=heap, fences=8192, participants=16, label="bench-host", spin=host_spin
    )
    spawned: list[Any] = []
    saved_env = {k: os.environ.get(k) for k in _BLAS_VARS}
    if cfg.blas_threads > 0:
        os.environ.update(dict.fromkeys(_BLAS_VARS, str(cfg.blas_threads)))
    try:
        with pinned(place["host"]):
            cpu = agents.spawn(dom, "cpu", label="bench-cpu")
            spawned.append(cpu)
            npu = agents.spawn(dom, "npu", label="bench-npu")
            spawned.append(npu)
            result["placement"]["applied"] = {
                "cpu": set_affinity(cpu.proc.pid, place["cpu"]),
                "npu": set_affinity(npu.proc.pid, place["npu"]),
            }

            def step(key: str, fn: Callable[[], Any]) -> Any:
                return rec.attempt(key, fn, key)  # keep the other figures

            say(f"placement: {place['note']}")
            for nbytes in cfg.chain_sizes:
                for n in cfg.chain_stages:
                    key = f"chain_{nbytes}_{n}"
                    g, ref = relu_chain(dom, cpu, npu, n, nbytes)
                    x = rng.standard_normal(nbytes // 4).astype(np.float32)
                    r = step(key, functools.partial(latency, g, {"x": x}, ref(x), cfg))
                    if r is not None:
                        wl[key] = {"kind": "chain", "stages": n, "nbytes": nbytes, "modes": r}
                        say(f"chain {n} stages x {fmt_size(nbytes)}: " + _mode_line(r))
            g, ref = relu_chain(dom, cpu, npu, 2, 4096, kernel="copy")
            x = rng.standard_normal(1024).astype(np.float32)
            r = step("echo", lambda: latency(g, {"x": x}, ref(x), cfg))
            if r is not None:
                wl["echo"] = {"kind": "echo", "stages": 2, "nbytes": 4096, "modes": r}
                say("echo 2 stages x 4 KiB: " + _mode_line(r))
            g, ref = gemm_chain(dom, cpu, npu, cfg.gemm_n, cfg.gemm_stages, rng)
            x = rng.standard_normal((cfg.gemm_n, cfg.gemm_n)).astype(np.float32)
            r = step("gemm", lambda: latency(g, {"x": x}, ref(x), cfg))
            if r is not None:
                wl["gemm"] = {"kind": "gemm", "stages": cfg.gemm_stages, "n": cfg.gemm_n, "modes": r}
                say(f"gemm chain {cfg.gemm_stages} x {cfg.gemm_n}^2: " + _mode_line(r))
            g, vref = vision_graph(dom, cpu, npu, cfg.vision_shape, rng)
            frames = [rng.integers(0, 256, cfg.vision_shape, dtype=np.uint8) for _ in range(8)]
            r = step("vision", lambda: latency(g, {"frame": frames[0]}, vref(frames[0]), cfg))
            if r is not None:
                wl["vision"] = {
                    "kind": "vision",
                    "stages": len(g.stages),
                    "shape": list(cfg.vision_shape),
                    "modes": r,
                }
                say("vision pipeline, latency: " + _mode_line(r))
            t = step("vision_stream", lambda: throughput(g, lambda i: {"frame": frames[i % 8]}, cfg))
            if t is not None:
                wl["vision_stream"] = {"kind": "stream", "stages": len(g.stages), "variants": t}
                say("vision pipeline, streaming: " + ", ".join(f"{k} {v['fps']:.0f}/s" for k, v in t.items()))
            g, dref = diamond_graph(dom, cpu, npu, cfg.vision_shape, rng)
            r = step("diamond", lambda: latency(g, {"frame": frames[0]}, dref(frames[0]), cfg))
            if r is not None:
                wl["diamond"] = {
                    "kind": "diamond",
                    "stages": len(g.stages),
                    "shape": list(cfg.vision_shape),
                    "modes": r,
                }
                say("diamond DAG, latency: " + _mode_line(r))
            say("agent floor (one process, no wake-up)")
            for kind in ("cpu", "npu"):
                fl = step(f"agent_floor_{kind}", functools.partial(agent_floor, dom, kind))
                if fl is not None:
                    result.setdefault("agent_floor", {})[kind] = fl
                    say(f"  {kind}: p50 {fmt_ns(fl['p50'])} per packet")
            rt = step("spin_round_trip", functools.partial(spin_round_trip, dom))
            if rt is not None:
                result["spin_round_trip"] = rt
                say(f"host -> cpu agent -> host, both polling: p50 {fmt_ns(rt['p50'])}")
        peers = find_peers(peers_dir)
        say("multiprocessing peers")
        mp_peers = rec.attempt("multiprocessing", lambda: _mp_peers(cfg, peers, say), "multiprocessing")
        if mp_peers is not None:
            result["peers"].update(mp_peers)
        say("Ray Compiled Graphs peer")
        result["peers"]["ray"] = _ray_peer(cfg, peers)
        say(f"  ray: {result['peers']['ray']['status']}")
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for a in spawned:
            try:
                a.stop()
            except Exception:
                a.kill()
        drop_domain(dom, name)
    derive(result)
    finish(result, evaluate_goals, started)
    return result


def _mode_line(r: dict[str, Any]) -> str:
    return ", ".join(f"{k} {fmt_ns(v['p50'])}" for k, v in r.items())
