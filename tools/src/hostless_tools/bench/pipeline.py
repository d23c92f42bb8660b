"""The pipeline benchmark: graphs in the four modes on the agents' C loop, Ray, C references.

Everything is measured in ONE run on one machine, with one ``cpu`` agent and
one ``npu`` agent per agent set (two processes; stages alternate between
them so that every hop crosses processes).

agent sets (:data:`AGENT_SETS`): ``native-poll`` (the default: the agent loop
in C, polling its doorbell) and ``native-park`` (the same, parked on the futex
at once when idle).  The ``python-poll`` and ``python-park`` sets of earlier
results ran the Python agent loop, which is gone (cpu and npu agents run the
C loop by default now).

pipelines, each compiled in the four modes (dispatch ``host`` / ``direct``
times data ``copy`` / ``shared``) and timed frame by frame in interleaved rounds:
  * ``identity``: 2 ``copy`` stages (cpu then npu) on 16 float32: the pure
    per-hop cost.  Per hop = frame latency / hops, hops = stages + 1 (host ->
    s0 -> s1 -> host: the same count as a C round trip's 2 hops and Ray's
    driver -> a -> b -> driver), median with p10 / p90;
  * ``vision_small``: the demo's 5 stages (normalize on cpu -> fc1, relu, fc2
    on npu -> softmax on cpu) at a 64x64 frame: latency-bound;
  * ``vision_large``: the same (64-wide layers) at a 1024x1024 frame (4 MiB
    float32 tensors): data-bound; also streamed (``CompiledGraph.stream``,
    host modes 1 frame in flight, direct modes 2 and 4);
  * ``diamond``: normalize (cpu) -> a GEMM (npu) and a scale (cpu) -> add (cpu),
    at 64x64: fan-out and fan-in.

references, in the same run:
  * the C ping-pong (``pingpong.c``, compiled now with gcc -O2): spin and futex
    round trips between two processes;
  * host -> agent -> host round trips of a native agent, polling (host
    spinning too) and parked (host sleeping too: two futex wake-ups, as the C
    futex round trip);
  * idle CPU: a parked agent's utime + stime (``/proc/<pid>/stat``) over a few
    seconds, with its wake-ups per second;
  * where the time goes: a few hundred traced frames (a second domain with a
    trace ring) cut into the steps of a packet's travel
    (:mod:`hostless_tools.bench.pipeline_trace`).

peers: Ray Compiled Graphs and classic Ray actors on the identical
pipelines (``benchmarks/peers/ray_pipelines.py``, a child interpreter), when
``ray`` is importable (``pip install 'hostless[bench]'``); "not installed"
otherwise, and the goals table says so.

:func:`run` returns a JSON-able dict; :func:`write_results` writes it with a
Markdown report (goals and reports: :mod:`hostless_tools.bench.pipeline_report`;
workloads: :mod:`hostless_tools.bench.pipeline_workloads`).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .harness import (
    Progress,
    Recorder,
    affinity,
    compile_c,
    drop_domain,
    finish,
    new_domain,
    new_result,
    pin_cpus,
    pinned,
    run_json,
    scratch_dir,
    set_affinity,
    summarize,
)
from .pipeline_peers import find_peers, ray_peers
from .pipeline_report import (
    DEFAULT_OUT_DIR,
    derive,
    evaluate_goals,
    print_report,
    report_markdown,
    write_results,
)
from .pipeline_trace import frame_steps, step_summary, traced_frames
from .pipeline_workloads import (
    BASELINE,
    BEST,
    MODES,
    agent_round_trip,
    diamond_graph,
    identity_chain,
    idle_cpu,
    latency,
    mode_name,
    throughput,
    vision_graph,
)
from .report import fmt_ns

__all__ = [
    "PipelineBenchConfig",
    "AGENT_SETS",
    "PIPELINES",
    "MODES",
    "BASELINE",
    "BEST",
    "mode_name",
    "plan_placement",
    "vision_graph",
    "find_peers",
    "spawn_pair",
    "run",
    "derive",
    "evaluate_goals",
    "report_markdown",
    "write_results",
    "print_report",
    "DEFAULT_OUT_DIR",
]

AGENT_SETS: tuple[str, ...] = ("native-poll", "native-park")
"""``<implementation>-<idle setting>`` of the agent sets; the first is the default."""

PIPELINES: tuple[str, ...] = ("identity", "vision_small", "vision_large", "diamond")

_BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class PipelineBenchConfig:
    """Parameters of one run of the pipeline benchmark."""

    frames: int = 300
    """Measured frames per latency figure (in total over the rounds)."""
    warmup: int = 30
    """Frames run first in every mode and dropped."""
    rounds: int = 3
    """Interleaved rounds: every mode once per round, so that a drift of the machine affects all alike."""
    identity_floats: int = 16
    """float32 per tensor of the identity chain (64 bytes)."""
    small_shape: tuple[int, int] = (64, 64)
    """(rows, features) of the latency-bound vision pipeline's frame and of the diamond's."""
    large_shape: tuple[int, int] = (1024, 1024)
    """(rows, features) of the data-bound vision pipeline's frame."""
    hidden: int = 64
    """Width of fc1 in both vision pipelines (fc2's: a quarter of it)."""
    large_frames: int = 30
    """Measured frames per latency figure of the data-bound pipeline."""
    stream_frames: int = 40
    """Frames per streaming figure of the data-bound pipeline."""
    inflight: tuple[int, ...] = (2, 4)
    """Frames in flight of the direct modes' streaming figures."""
    agent_sets: tuple[str, ...] = AGENT_SETS
    """Which agent sets to run (:data:`AGENT_SETS`); the first one's figures are the goals'."""
    poll_spin: float = 0.2
    """Spin budget (seconds) of a polling agent: it polls its doorbell this long after its last packet."""
    ref_round_trips: int = 4000
    """Round trips per C and agent round-trip reference."""
    idle_seconds: float = 3.0
    """How long an idle agent's CPU use is measured."""
    trace_frames: int = 200
    """Traced frames per breakdown (identity and vision_small; a tenth for vision_large)."""
    ray: bool = True
    """Measure the Ray peers when ``ray`` is importable."""
    pin: bool = True
    """Pin the agents to CPUs (see ``placement`` in the result)."""
    host_spin: float | None = None
    """Spin budget (seconds) of the host's waits; None: 0 with fewer than 3 CPUs (a spinning host
    takes a CPU from an agent there), else the domain default (50 us)."""
    blas_threads: int = 1
    """BLAS threads per agent (OPENBLAS/OMP/MKL_NUM_THREADS in the agents' environment): one engine,
    one core.  0 leaves the environment alone."""
    quick: bool = False

    @classmethod
    def quick_config(cls) -> PipelineBenchConfig:
        """A small run (about a minute): for demos and smoke tests."""
        return cls(
            frames=60,
            warmup=10,
            rounds=2,
            large_frames=6,
            stream_frames=8,
            ref_round_trips=600,
            idle_seconds=1.0,
            trace_frames=40,
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


# --------------------------------------------------------------------------- agents


def spawn_pair(dom: Any, native: bool, spin: float, label: str) -> tuple[Any, Any, dict[str, Any]]:
    """A cpu and an npu agent (the C loop, ``spin`` seconds of polling when idle); ``native``
    must be True (the Python loop is gone).  Returns (cpu, npu, info)."""
    from hostless import agents

    if not native:
        raise ValueError("the Python agent loop is gone: cpu and npu agents run the C loop")
    cpu = agents.spawn(dom, "cpu", spin=spin, label=f"{label} cpu")
    info: dict[str, Any] = {"cpu": "native", "npu": "native", "npu_note": None}
    try:
        npu = agents.spawn(dom, "npu", spin=spin, label=f"{label} npu")
    except BaseException:
        cpu.stop()
        raise
    return cpu, npu, info


def _same(inputs: dict[str, np.ndarray], _k: int) -> dict[str, np.ndarray]:
    return inputs


def _stop(*ags: Any) -> None:
    for a in ags:
        try:
            a.stop()
        except Exception:
            a.kill()


def _pipeline(
    name: str, dom: Any, cpu: Any, npu: Any, cfg: PipelineBenchConfig, rng: np.random.Generator
) -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray], dict[str, Any]]:
    """The graph of pipeline ``name``, one input frame, its reference output, and what it is."""
    if name == "identity":
        g, ref = identity_chain(dom, cpu, npu, cfg.identity_floats)
        x = rng.standard_normal(cfg.identity_floats).astype(np.float32)
        return g, {"x": x}, ref(x), {"stages": 2, "hops": 3, "floats": cfg.identity_floats}
    shape = cfg.large_shape if name == "vision_large" else cfg.small_shape
    frame = rng.integers(0, 256, shape, dtype=np.uint8)
    if name.startswith("vision"):
        g, vref = vision_graph(dom, cpu, npu, shape, rng, hidden=cfg.hidden)
    else:
        g, vref = diamond_graph(dom, cpu, npu, shape, rng)
    return g, {"frame": frame}, vref(frame), {"stages": len(g.stages), "shape": list(shape)}


def _run_set(
    key: str, dom: Any, cfg: PipelineBenchConfig, place: dict[str, Any], rec: Recorder
) -> dict[str, Any]:
    """Every pipeline in the four modes on one agent set."""
    impl, how = key.split("-")
    spin = cfg.poll_spin if how == "poll" else 0.0
    cpu, npu, info = spawn_pair(dom, impl == "native", spin, key)
    entry: dict[str, Any] = {"agents": info, "agent_spin_s": spin, "pipelines": {}}
    say = rec.say
    if info["npu_note"]:
        say(f"  {info['npu_note']}")
    try:
        entry["applied_pinning"] = {
            "cpu": set_affinity(cpu.proc.pid, place["cpu"]),
            "npu": set_affinity(npu.proc.pid, place["npu"]),
        }
        rng = np.random.default_rng(2026)
        for name in PIPELINES:
            g, inputs, ref, what = _pipeline(name, dom, cpu, npu, cfg, rng)
            large = name == "vision_large"
            frames = cfg.large_frames if large else cfg.frames
            warm = max(2, cfg.warmup // 5) if large else cfg.warmup
            r = rec.attempt(
                f"{key}/{name}",
                functools.partial(latency, g, inputs, ref, frames, warm, cfg.rounds),
                f"{key} {name}",
            )
            if r is None:
                continue
            entry["pipelines"][name] = {**what, "modes": r}
            say(f"  {key} {name}: " + ", ".join(f"{k} {fmt_ns(v['p50'])}" for k, v in r.items()))
            if large:
                t = rec.attempt(
                    f"{key}/{name}_stream",
                    functools.partial(
                        throughput, g, functools.partial(_same, inputs), cfg.stream_frames, warm, cfg.inflight
                    ),
                    f"{key} {name} streaming",
                )
                if t is not None:
                    entry["pipelines"][name]["stream"] = t
                    say(
                        f"  {key} {name} streaming: "
                        + ", ".join(f"{k} {v['fps']:.1f}/s" for k, v in t.items())
                    )
    finally:
        _stop(cpu, npu)
    return entry


# --------------------------------------------------------------------------- references


def _c_refs(cfg: PipelineBenchConfig, rec: Recorder, cpus: Sequence[int]) -> dict[str, Any]:
    """The C ping-pong round trips (spin, futex), compiled now; {} when they cannot be built.
    ``cpus``: the CPUs of the run (the host itself may be pinned to one of them)."""
    a, b = pin_cpus(cpus) if cfg.pin else (None, None)
    out: dict[str, Any] = {}
    with scratch_dir() as tmp:
        exe, err = compile_c(Path(__file__).with_name("pingpong.c"), tmp, "pingpong")
        if exe is None:
            rec.errors["c_spin"] = rec.errors["c_futex"] = str(err)
            return out
        n, w = cfg.ref_round_trips, max(100, cfg.ref_round_trips // 10)
        for mode in ("spin", "futex"):
            cmd = [exe, mode, str(n), str(w), str(-1 if a is None else a), str(-1 if b is None else b)]
            data = rec.attempt(f"c_{mode}", functools.partial(run_json, cmd), f"C {mode} round trip")
            if data is not None:
                s = np.asarray(data["samples_ns"], dtype=np.int64)
                st: dict[str, Any] = summarize(s)
                st["p10"] = float(np.percentile(s, 10))
                st["pinned"] = bool(data.get("pinned"))
                out[f"c_{mode}"] = st
    return out


def _agent_refs(
    dom: Any, cfg: PipelineBenchConfig, place: dict[str, Any], rec: Recorder, cpus: Sequence[int]
) -> dict[str, Any]:
    """Round trips host -> agent -> host (polling and parked) and idle CPU of agents."""
    from hostless import agents

    out: dict[str, Any] = {}
    n = cfg.ref_round_trips
    cases = [
        ("native_poll_round_trip", True, cfg.poll_spin, 1.0),
        ("native_park_round_trip", True, 0.0, 0.0),
    ]
    # the host and the agent on two different CPUs, as the C ping-pong's two processes (a wake-up
    # on the waker's own CPU costs less than one that crosses CPUs, in a VM above all)
    host_cpu, agent_cpu = pin_cpus(cpus) if cfg.pin else (None, None)
    for key, _native, spin, host_spin in cases:
        a = agents.spawn(dom, "cpu", spin=spin, label=key)
        try:
            pinned_apart = set_affinity(a.proc.pid, agent_cpu)
            with pinned(host_cpu):
                r = rec.attempt(key, functools.partial(agent_round_trip, dom, a, n, host_spin), key)
            if r is not None:
                out[key] = {**r, "agent_spin_s": spin, "host_spin_s": host_spin, "pinned_apart": pinned_apart}
                rec.say(f"  {key}: p50 {fmt_ns(r['p50'])}")
        finally:
            _stop(a)
    idle = [("native_park", 0.0), ("native_default", 50e-6)]
    out["idle"] = {}
    for key, spin in idle:
        a = agents.spawn(dom, "cpu", spin=spin, label=f"idle {key}")
        try:
            r = rec.attempt(
                f"idle_{key}", functools.partial(idle_cpu, a.proc.pid, cfg.idle_seconds), f"idle {key}"
            )
            if r is not None:
                out["idle"][key] = {**r, "agent_spin_s": spin}
                rec.say(f"  idle {key}: {r['core_share'] * 100:.2f} % of a core")
        finally:
            _stop(a)
    # the same parked agent in a domain whose sleepers re-read their words every 10 ms, not 1 ms
    pdom, pname = new_domain("pipeidle", heap=16 << 20, participants=8, poll_interval=10e-3)
    try:
        a = agents.spawn(pdom, "cpu", spin=0.0, label="idle poll 10 ms")
        try:
            r = rec.attempt(
                "idle_native_park_poll10ms",
                functools.partial(idle_cpu, a.proc.pid, cfg.idle_seconds),
                "idle native park, poll_interval 10 ms",
            )
            if r is not None:
                out["idle"]["native_park_poll10ms"] = {**r, "agent_spin_s": 0.0, "poll_interval_s": 10e-3}
                rec.say(f"  idle native_park, poll_interval 10 ms: {r['core_share'] * 100:.2f} % of a core")
        finally:
            _stop(a)
    finally:
        drop_domain(pdom, pname)
    return out


def _breakdowns(
    cfg: PipelineBenchConfig, place: dict[str, Any], host_spin: float, rec: Recorder
) -> dict[str, Any]:
    """Traced frames on the default agent set, cut into the steps of a packet's travel."""
    key = cfg.agent_sets[0] if cfg.agent_sets else AGENT_SETS[0]
    impl, how = key.split("-")
    spin = cfg.poll_spin if how == "poll" else 0.0
    dom, name = new_domain(
        "pipetrace",
        heap=256 << 20,
        trace="16M",
        fences=4096,
        participants=16,
        label="bench-host",
        spin=host_spin,
    )
    out: dict[str, Any] = {"agent_set": key}
    try:
        cpu, npu, _info = spawn_pair(dom, impl == "native", spin, f"traced {key}")
        try:
            set_affinity(cpu.proc.pid, place["cpu"])
            set_affinity(npu.proc.pid, place["npu"])
            rng = np.random.default_rng(7)
            for pl in ("identity", "vision_small", "vision_large"):
                g, inputs, _ref, _what = _pipeline(pl, dom, cpu, npu, cfg, rng)
                names = [s.name for s in g.stages]
                frames = max(5, cfg.trace_frames // 10) if pl == "vision_large" else cfg.trace_frames
                for d, m in (MODES[3], MODES[0]):
                    mode = mode_name(d, m)

                    def one(
                        g: Any = g, d: str = d, m: str = m, i: Any = inputs, f: int = frames, nm: Any = names
                    ) -> Any:
                        with g.compile(dispatch=d, data=m, inflight=1) as cg:
                            evs = traced_frames(dom, cg, i, f, warmup=min(10, f))
                        return step_summary(frame_steps(evs, nm))

                    r = rec.attempt(f"trace/{pl}/{mode}", one, f"trace {pl} {mode}")
                    if r is not None:
                        out.setdefault(pl, {})[mode] = {**r, "stages": names}
                        rec.say(
                            f"  trace {pl} {mode}: {r['frames']} frames, kernels "
                            f"{fmt_ns(r.get('kernels_p50'))}, hand-offs {fmt_ns(r.get('handoffs_p50'))}"
                        )
        finally:
            _stop(cpu, npu)
    finally:
        drop_domain(dom, name)
    return out


# --------------------------------------------------------------------------- the run


def run(
    cfg: PipelineBenchConfig | None = None,
    progress: Progress | None = None,
    peers_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Run the whole pipeline benchmark; returns a JSON-able dict (see module doc).

    ``peers_dir``: the directory of the peer scripts (default: :func:`find_peers`).
    One failed figure is recorded in ``errors`` and leaves the others standing.
    """
    cfg = cfg or PipelineBenchConfig()
    if cfg.frames < 1 or cfg.rounds < 1 or cfg.warmup < 0 or cfg.stream_frames < 1 or cfg.large_frames < 1:
        raise ValueError("frames, rounds, stream_frames and large_frames must be >= 1, warmup >= 0")
    bad = [k for k in cfg.agent_sets if k not in AGENT_SETS]
    if bad or not cfg.agent_sets:
        raise ValueError(f"agent_sets must be a non-empty selection of {AGENT_SETS}, not {bad}")

    started = time.monotonic()
    cpus = affinity()
    place = plan_placement(cpus, cfg.pin)
    result = new_result(
        "pipeline-native", cfg, cpus_available=len(cpus), placement=place, agent_sets={}, references={}
    )
    rec = Recorder(result["errors"], progress)
    say = rec.say
    host_spin = cfg.host_spin if cfg.host_spin is not None else (0.0 if len(cpus) < 3 else 50e-6)
    result["host_spin_s"] = host_spin
    heap = 256 << 20
    saved_env = {k: os.environ.get(k) for k in _BLAS_VARS}
    if cfg.blas_threads > 0:
        os.environ.update(dict.fromkeys(_BLAS_VARS, str(cfg.blas_threads)))
    try:
        with pinned(place["host"]):
            say(f"placement: {place['note']}")
            dom, name = new_domain(
                "pipeline", heap=heap, fences=8192, participants=32, label="bench-host", spin=host_spin
            )
            try:
                for key in cfg.agent_sets:
                    say(f"agent set {key}")
                    r = rec.attempt(key, functools.partial(_run_set, key, dom, cfg, place, rec), key)
                    if r is not None:
                        result["agent_sets"][key] = r
                say("references: agent round trips, idle CPU")
                r = rec.attempt(
                    "agent_refs", lambda: _agent_refs(dom, cfg, place, rec, cpus), "agent references"
                )
                if r is not None:
                    result["references"].update(r)
            finally:
                drop_domain(dom, name)
            say("references: C ping-pong")
            result["references"].update(_c_refs(cfg, rec, cpus))
            say("where the time goes (traced frames)")
            r = rec.attempt("breakdown", lambda: _breakdowns(cfg, place, host_spin, rec), "breakdown")
            if r is not None:
                result["breakdown"] = r
        say("Ray peers (Compiled Graphs, classic actors)")
        result["ray"] = ray_peers(cfg, find_peers(peers_dir), say)
        say(f"  ray: {result['ray']['status']}")
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        result["machine"]["loadavg_at_end"] = None
    derive(result)
    finish(result, evaluate_goals, started)
    return result
