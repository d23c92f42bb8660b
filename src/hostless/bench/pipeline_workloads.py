"""The hostless workloads of the pipeline benchmark and how each is timed.

Graphs (:func:`relu_chain`, :func:`gemm_chain`, :func:`vision_graph`,
:func:`diamond_graph`) are
compiled in the four :data:`MODES` and timed by :func:`latency` (frame by
frame, interleaved rounds) and :func:`throughput` (streaming); the agent
floor and the both-polling round trip isolate the Python work of a hop.
:mod:`hostless.bench.pipeline` runs them and records the figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .harness import agent_loop, summarize

if TYPE_CHECKING:
    from .pipeline import PipelineBenchConfig

__all__ = [
    "MODES",
    "BASELINE",
    "BEST",
    "mode_name",
    "relu_chain",
    "gemm_chain",
    "vision_graph",
    "diamond_graph",
    "latency",
    "throughput",
    "spin_round_trip",
    "agent_floor",
]

MODES: tuple[tuple[str, str], ...] = (
    ("host", "copy"),
    ("host", "shared"),
    ("direct", "copy"),
    ("direct", "shared"),
)
"""(dispatch, data) of the four modes; host+copy (the first) is the baseline."""


def mode_name(dispatch: str, data: str) -> str:
    """``dispatch+data``: a mode's name in results and reports."""
    return f"{dispatch}+{data}"


BASELINE = mode_name(*MODES[0])
BEST = mode_name(*MODES[3])


def relu_chain(dom: Any, cpu: Any, npu: Any, n: int, nbytes: int, kernel: str = "relu") -> tuple[Any, Any]:
    """An n-stage chain alternating cpu and npu; returns (graph, inputs -> reference function)."""
    from hostless.graph import Graph

    shape = (nbytes // 4,)
    g = Graph(dom).input("x", shape, np.float32)
    prev = "x"
    for k in range(n):
        agent = cpu if k % 2 == 0 else npu
        g.stage(f"s{k}", agent, kernel, [prev], (f"t{k}", shape, np.float32))
        prev = f"t{k}"
    last = prev

    def ref(x: np.ndarray) -> dict[str, np.ndarray]:
        return {last: np.maximum(x, 0) if kernel == "relu" else x.copy()}

    return g, ref


def gemm_chain(
    dom: Any, cpu: Any, npu: Any, n: int, stages: int, rng: np.random.Generator
) -> tuple[Any, Any]:
    from hostless.graph import Graph

    ws = [(rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32) for _ in range(stages)]
    g = Graph(dom).input("x", (n, n), np.float32)
    prev = "x"
    for k in range(stages):
        g.constant(f"w{k}", ws[k])
        agent = cpu if k % 2 == 0 else npu
        g.stage(f"mm{k}", agent, "gemm", [prev, f"w{k}"], (f"y{k}", (n, n), np.float32))
        prev = f"y{k}"
    last = prev

    def ref(x: np.ndarray) -> dict[str, np.ndarray]:
        y = x
        for w in ws:
            y = (y @ w).astype(np.float32)
        return {last: y}

    return g, ref


def vision_graph(
    dom: Any, cpu: Any, npu: Any, shape: tuple[int, int], rng: np.random.Generator, post: Any = None
) -> tuple[Any, Callable[[np.ndarray], dict[str, np.ndarray]]]:
    """The demo's pipeline: normalize (cpu) -> fc1, relu, fc2 (npu) -> softmax (cpu).

    ``post``: the agent of the softmax stage (default: ``cpu``).  Returns the
    graph and a NumPy reference of its output ``probs``.
    """
    from hostless.graph import Graph

    rows, feat = shape
    hid, out = feat, max(8, feat // 4)
    w1 = (rng.standard_normal((feat, hid)) / np.sqrt(feat)).astype(np.float32)
    w2 = (rng.standard_normal((hid, out)) / np.sqrt(hid)).astype(np.float32)
    mean, std = 127.5, 64.0
    g = Graph(dom).input("frame", (rows, feat), np.uint8).constant("w1", w1).constant("w2", w2)
    g.stage("preprocess", cpu, "normalize", ["frame"], ("x", (rows, feat), np.float32), scalars=[mean, std])
    g.stage("fc1", npu, "gemm", ["x", "w1"], ("h", (rows, hid), np.float32))
    g.stage("act", npu, "relu", ["h"], ("a", (rows, hid), np.float32))
    g.stage("fc2", npu, "gemm", ["a", "w2"], ("logits", (rows, out), np.float32))
    g.stage("postprocess", post or cpu, "softmax", ["logits"], ("probs", (rows, out), np.float32))

    def ref(frame: np.ndarray) -> dict[str, np.ndarray]:
        x = ((frame.astype(np.float32) - mean) / std).astype(np.float32)
        y = np.maximum(x @ w1, 0) @ w2
        e = np.exp(y - y.max(axis=-1, keepdims=True))
        return {"probs": (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)}

    return g, ref


def diamond_graph(
    dom: Any, cpu: Any, npu: Any, shape: tuple[int, int], rng: np.random.Generator
) -> tuple[Any, Callable[[np.ndarray], dict[str, np.ndarray]]]:
    """A diamond DAG: normalize (cpu) -> gemm (npu) and scale (cpu) -> add (cpu).

    The two branches run on different agents; in direct dispatch the join is
    pushed by the cpu branch and waits on the npu branch's timeline point.
    Returns the graph and a NumPy reference of its output ``y``.
    """
    from hostless.graph import Graph

    rows, feat = shape
    w = (rng.standard_normal((feat, feat)) / np.sqrt(feat)).astype(np.float32)
    mean, std = 127.5, 64.0
    g = Graph(dom).input("frame", (rows, feat), np.uint8).constant("w", w)
    g.stage("pre", cpu, "normalize", ["frame"], ("x", (rows, feat), np.float32), scalars=[mean, std])
    g.stage("proj", npu, "gemm", ["x", "w"], ("p", (rows, feat), np.float32))
    g.stage("skip", cpu, "scale", ["x"], ("s", (rows, feat), np.float32), scalars=[0.5])
    g.stage("join", cpu, "add", ["p", "s"], ("y", (rows, feat), np.float32))

    def ref(frame: np.ndarray) -> dict[str, np.ndarray]:
        x = ((frame.astype(np.float32) - mean) / std).astype(np.float32)
        return {"y": (x @ w + 0.5 * x).astype(np.float32)}

    return g, ref


def _check(out: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> bool:
    return all(np.allclose(out[k], v, rtol=1e-3, atol=1e-4) for k, v in ref.items())


def latency(
    g: Any, inputs: dict[str, np.ndarray], ref: dict[str, np.ndarray], cfg: PipelineBenchConfig
) -> dict[str, Any]:
    """Frame latency of ``run`` in the four modes, interleaved rounds; with host CPU time per frame."""
    cgs = {mode_name(d, m): g.compile(dispatch=d, data=m, inflight=1) for d, m in MODES}
    try:
        ok = {}
        for key, cg in cgs.items():
            ok[key] = _check(cg.run(inputs), ref)
            for _ in range(cfg.warmup):
                cg.run(inputs)
        per_round = max(1, cfg.frames // cfg.rounds)
        groups: dict[str, list[np.ndarray]] = {k: [] for k in cgs}
        cpu_s: dict[str, float] = dict.fromkeys(cgs, 0.0)
        clock = time.perf_counter_ns
        for _ in range(cfg.rounds):
            for key, cg in cgs.items():
                run = cg.run
                samples = np.empty(per_round, dtype=np.int64)
                c0 = time.process_time()
                for i in range(per_round):
                    t0 = clock()
                    run(inputs)
                    samples[i] = clock() - t0
                cpu_s[key] += time.process_time() - c0
                groups[key].append(samples)
        out: dict[str, Any] = {}
        for key in cgs:
            st = summarize(np.concatenate(groups[key]), groups=groups[key])
            st["host_cpu_per_frame_ns"] = cpu_s[key] / (per_round * cfg.rounds) * 1e9
            st["verified"] = ok[key]
            out[key] = st
        base = out[BASELINE]["p50"]
        for key in cgs:
            out[key]["speedup"] = base / out[key]["p50"]
        return out
    finally:
        for cg in cgs.values():
            cg.close()


def throughput(
    g: Any, make_inputs: Callable[[int], dict[str, np.ndarray]], cfg: PipelineBenchConfig
) -> dict[str, Any]:
    """Streaming frames per second: host modes with 1 frame in flight, direct modes with each inflight."""
    variants: list[tuple[str, str, str, int]] = []
    for d, m in MODES:
        if d == "host":
            variants.append((mode_name(d, m), d, m, 1))
        else:
            for k in cfg.vision_inflight:
                variants.append((f"{mode_name(d, m)} inflight={k}", d, m, k))
    n = cfg.stream_frames
    frames = [make_inputs(i) for i in range(8)]

    def feed(count: int) -> Iterator[dict[str, np.ndarray]]:
        for i in range(count):
            yield frames[i % len(frames)]

    out: dict[str, Any] = {}
    for key, d, m, k in variants:
        cg = g.compile(dispatch=d, data=m, inflight=k)
        try:
            for _ in cg.stream(feed(max(4, cfg.warmup // 2))):
                pass
            c0, t0 = time.process_time(), time.perf_counter()
            count = sum(1 for _ in cg.stream(feed(n)))
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            cg.close()
        out[key] = {
            "dispatch": d,
            "data": m,
            "inflight": k,
            "frames": count,
            "fps": count / dt,
            "frame_ns": dt / count * 1e9,
            "host_cpu_per_frame_ns": cpu / count * 1e9,
        }
    base = out[BASELINE]["fps"]
    for v in out.values():
        v["speedup"] = v["fps"] / base
    return out


def spin_round_trip(dom: Any, n: int = 3000) -> dict[str, Any]:
    """Host -> cpu agent -> host round trip when neither sleeps: the host pushes a 4 KiB relu
    packet and spins on its timeline; the agent (a separate process) polls its doorbell."""
    import hostless as hl
    from hostless import agents
    from hostless.kernels import kernel_id

    a = agents.spawn(dom, "cpu", spin=0.5)
    x, y = dom.buffer((1024,), np.float32), dom.buffer((1024,), np.float32)
    ka = hl.Kernargs(buffers=[x.handle, y.handle]).to_buffer(dom)
    tl = dom.timeline(owner=a.id)
    try:
        samples = np.empty(n, dtype=np.int64)
        clock = time.perf_counter_ns
        p = hl.Packet(kernel=kernel_id("relu"), args=ka.handle, signal=tl.handle)
        for i in range(n):
            p.signal_value = i + 1
            raw = p.encode()
            t0 = clock()
            a.queue.push(raw)
            tl.wait(i + 1, 10.0, spin=1.0)
            samples[i] = clock() - t0
        return summarize(samples[n // 10 :])
    finally:
        a.stop()
        for o in (x, y, ka, tl):
            o.release()


def agent_floor(dom: Any, kind: str, n: int = 4000) -> dict[str, Any]:
    """Per-packet work of an agent with no wake-up: push, pop, decode, a 4 KiB relu (a KERNEL
    packet for cpu, an ERT START_CU command for npu), signal, all in this process (the agent's
    loop body, run here)."""
    import hostless as hl
    from hostless import ert
    from hostless.kernels import cu_index, kernel_id

    q = dom.queue(64)
    x, y = dom.buffer((1024,), np.float32), dom.buffer((1024,), np.float32)
    tl = dom.timeline()
    owned: list[Any] = []
    if kind == "cpu":
        ka = hl.Kernargs(buffers=[x.handle, y.handle]).to_buffer(dom)
        p = hl.Packet(kernel=kernel_id("relu"), args=ka.handle, signal=tl.handle)
    else:
        cmd = ert.start_cu(cu_index("relu"), [2] + ert.u64_args([x.handle, y.handle])).encode()
        cb = dom.buffer(len(cmd))
        owned.append(cb)
        ka = hl.Kernargs(buffers=[cb.handle]).to_buffer(dom)
        p = hl.Packet(type=hl.PacketType.ERT, kernel=cu_index("relu"), args=ka.handle, signal=tl.handle)
    owned.append(ka)
    raw_cmd = cb.numpy() if kind == "npu" else None
    agent = None
    try:
        q.bind()
        agent = agent_loop(dom, q, kind)
        samples = np.empty(n, dtype=np.int64)
        clock = time.perf_counter_ns
        for i in range(n):
            p.signal_value = i + 1
            if raw_cmd is not None:
                raw_cmd[:] = np.frombuffer(cmd, np.uint8)  # a fresh NEW command each time
            t0 = clock()
            q.push(p)
            r = q.pop_raw(0, 0)
            assert r is not None
            agent.execute(r[0], hl.Packet.decode(r[1]))
            samples[i] = clock() - t0
        return summarize(samples[n // 10 :])
    finally:
        if agent is not None:
            agent.cache.clear()
        for o in owned + [tl, y, x, q]:
            o.release()
