"""The hostless workloads of the pipeline benchmark and how each is timed.

Graphs (:func:`identity_chain`, :func:`vision_graph`, :func:`diamond_graph`)
are compiled in the four :data:`MODES` and timed by :func:`latency` (frame by
frame, interleaved rounds) and :func:`throughput` (streaming).  The agent
references isolate one agent: :func:`agent_round_trip` (host -> agent -> host,
polling or parked), :func:`idle_cpu` (an idle agent's CPU share from
``/proc/<pid>/stat``).  :mod:`hostless_tools.bench.pipeline` runs them and records
the figures; :mod:`hostless_tools.bench.pipeline_trace` says where a frame's time goes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .harness import summarize

__all__ = [
    "MODES",
    "BASELINE",
    "BEST",
    "mode_name",
    "identity_chain",
    "vision_graph",
    "diamond_graph",
    "latency",
    "throughput",
    "agent_round_trip",
    "ctx_switches",
    "idle_cpu",
    "proc_cpu_ns",
    "proc_cpu_ticks",
    "thread_cpu_ns",
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


def identity_chain(dom: Any, cpu: Any, npu: Any, floats: int, stages: int = 2) -> tuple[Any, Any]:
    """``stages`` ``copy`` stages alternating cpu and npu on ``floats`` float32 (the pure per-hop
    cost: the kernel moves a few bytes); returns (graph, input -> reference function)."""
    from hostless.graph import Graph

    shape = (floats,)
    g = Graph(dom).input("x", shape, np.float32)
    prev = "x"
    for k in range(stages):
        g.stage(f"s{k}", cpu if k % 2 == 0 else npu, "copy", [prev], (f"t{k}", shape, np.float32))
        prev = f"t{k}"
    last = prev

    def ref(x: np.ndarray) -> dict[str, np.ndarray]:
        return {last: x.copy()}

    return g, ref


def vision_graph(
    dom: Any,
    cpu: Any,
    npu: Any,
    shape: tuple[int, int],
    rng: np.random.Generator,
    post: Any = None,
    hidden: int | None = None,
) -> tuple[Any, Callable[[np.ndarray], dict[str, np.ndarray]]]:
    """The demo's pipeline: normalize (cpu) -> fc1, relu, fc2 (npu) -> softmax (cpu).

    ``shape``: (rows, features) of a frame; ``hidden``: the width of fc1
    (default: ``features``), fc2's is a quarter of it (at least 8).  ``post``:
    the agent of the softmax stage (default: ``cpu``).  Returns the graph and a
    NumPy reference of its output ``probs``.
    """
    from hostless.graph import Graph

    rows, feat = shape
    hid = feat if hidden is None else hidden
    out = max(8, hid // 4)
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


def _p10(samples: np.ndarray) -> float:
    return float(np.percentile(samples, 10))


def latency(
    g: Any,
    inputs: dict[str, np.ndarray],
    ref: dict[str, np.ndarray],
    frames: int,
    warmup: int,
    rounds: int,
) -> dict[str, Any]:
    """Frame latency of ``run`` in the four modes: ``warmup`` dropped frames per mode, then
    ``frames`` measured ones in ``rounds`` interleaved rounds; with the host's CPU time per
    frame, whether the output matched the reference and the speedup against host+copy."""
    cgs = {mode_name(d, m): g.compile(dispatch=d, data=m, inflight=1) for d, m in MODES}
    try:
        ok = {}
        for key, cg in cgs.items():
            ok[key] = _check(cg.run(inputs), ref)
            for _ in range(warmup):
                cg.run(inputs)
        per_round = max(1, frames // max(1, rounds))
        groups: dict[str, list[np.ndarray]] = {k: [] for k in cgs}
        cpu_s: dict[str, float] = dict.fromkeys(cgs, 0.0)
        clock = time.perf_counter_ns
        for _ in range(max(1, rounds)):
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
            every = np.concatenate(groups[key])
            st: dict[str, Any] = summarize(every, groups=groups[key])
            st["p10"] = _p10(every)
            st["host_cpu_per_frame_ns"] = cpu_s[key] / every.size * 1e9
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
    g: Any,
    make_inputs: Callable[[int], dict[str, np.ndarray]],
    frames: int,
    warmup: int,
    inflight: Sequence[int],
) -> dict[str, Any]:
    """Streaming frames per second: host modes with 1 frame in flight, direct modes with each
    of ``inflight``; ``warmup`` dropped frames, then ``frames`` measured ones per variant."""
    variants: list[tuple[str, str, str, int]] = []
    for d, m in MODES:
        if d == "host":
            variants.append((mode_name(d, m), d, m, 1))
        else:
            for k in inflight:
                variants.append((f"{mode_name(d, m)} inflight={k}", d, m, k))
    cache = [make_inputs(i) for i in range(4)]

    def feed(count: int) -> Iterator[dict[str, np.ndarray]]:
        for i in range(count):
            yield cache[i % len(cache)]

    out: dict[str, Any] = {}
    for key, d, m, k in variants:
        cg = g.compile(dispatch=d, data=m, inflight=k)
        try:
            for _ in cg.stream(feed(max(2, warmup))):
                pass
            c0, t0 = time.process_time(), time.perf_counter()
            count = sum(1 for _ in cg.stream(feed(frames)))
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


def agent_round_trip(dom: Any, agent: Any, n: int, host_spin: float, floats: int = 16) -> dict[str, Any]:
    """Host -> ``agent`` -> host: the host pushes a ``copy`` packet of ``floats`` float32 and
    waits on the timeline the agent signals (spinning ``host_spin`` seconds before it sleeps);
    ``n`` round trips, the first tenth dropped.  With a parked agent (spawned with ``spin=0``)
    and ``host_spin=0`` each round trip is two futex wake-ups, as in the C futex ping-pong."""
    import hostless as hl
    from hostless.kernels import kernel_id

    x, y = dom.buffer((floats,), np.float32), dom.buffer((floats,), np.float32)
    ka = hl.Kernargs(buffers=[x.handle, y.handle]).to_buffer(dom)
    tl = dom.timeline(owner=agent.id)
    try:
        samples = np.empty(n, dtype=np.int64)
        clock = time.perf_counter_ns
        p = hl.Packet(kernel=kernel_id("copy"), args=ka.handle, signal=tl.handle)
        push, wait = agent.queue.push, tl.wait
        for i in range(n):
            p.signal_value = i + 1
            raw = p.encode()
            t0 = clock()
            push(raw)
            wait(i + 1, 10.0, spin=host_spin)
            samples[i] = clock() - t0
        kept = samples[n // 10 :]
        st: dict[str, Any] = summarize(kept)
        st["p10"] = _p10(kept)
        return st
    finally:
        for o in (x, y, ka, tl):
            o.release()


def proc_cpu_ticks(pid: int) -> int:
    """utime + stime of process ``pid`` in clock ticks (``/proc/<pid>/stat`` fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        raw = f.read()
    fields = raw[raw.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return int(fields[11]) + int(fields[12])


def proc_cpu_ns(pid: int) -> int:
    """CPU nanoseconds (user + system) used so far by process ``pid``, all its threads, those
    that ended included: its process CPU clock (``clock_getcpuclockid``: the clock id is
    ``(~pid << 3) | 2``, CPUCLOCK_SCHED), read like this process's own.  Where that clock
    cannot be read, :func:`proc_cpu_ticks` in ns (10 ms steps at the usual 100 Hz: too coarse
    for a window of a few hundred frames)."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)
    except OSError:
        return proc_cpu_ticks(pid) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def thread_cpu_ns(pid: int, tid: int) -> int | None:
    """CPU nanoseconds thread ``tid`` of process ``pid`` has run (``schedstat``; ``tid`` =
    ``pid``: its main thread), or None."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def ctx_switches(pid: int, tid: int | None = None) -> tuple[int, int] | None:
    """Voluntary and involuntary context switches of process ``pid``'s main thread (or of its
    thread ``tid``), from ``status``, or None."""
    vol = invol = 0
    try:
        with open(f"/proc/{pid}/task/{tid}/status" if tid is not None else f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    vol = int(line.split()[-1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    invol = int(line.split()[-1])
    except OSError:
        return None
    return vol, invol


def _wakeups(pid: int) -> int | None:
    """Context switches of process ``pid``'s main thread (voluntary + involuntary), or None."""
    sw = ctx_switches(pid)
    return None if sw is None else sw[0] + sw[1]


def idle_cpu(pid: int, seconds: float, settle: float = 0.3) -> dict[str, Any]:
    """The CPU share of an idle process ``pid`` (an agent with an empty queue) over ``seconds``:
    utime + stime from ``/proc/<pid>/stat`` (clock ticks, 10 ms at the usual 100 Hz) divided by
    the wall time (``core_share``); the same from ``/proc/<pid>/schedstat`` in ns
    (``oncpu_share``, main thread, finer than a tick); its context switches per second (its
    wake-ups while idle)."""
    tick = os.sysconf("SC_CLK_TCK")
    time.sleep(settle)
    c0, n0, w0, t0 = proc_cpu_ticks(pid), thread_cpu_ns(pid, pid), _wakeups(pid), time.monotonic()
    time.sleep(seconds)
    c1, n1, w1, t1 = proc_cpu_ticks(pid), thread_cpu_ns(pid, pid), _wakeups(pid), time.monotonic()
    wall = t1 - t0
    return {
        "seconds": wall,
        "cpu_s": (c1 - c0) / tick,
        "core_share": (c1 - c0) / tick / wall,
        "tick_s": 1.0 / tick,
        "oncpu_share": None if n0 is None or n1 is None else (n1 - n0) / 1e9 / wall,
        "wakeups_per_s": None if w0 is None or w1 is None else (w1 - w0) / wall,
    }
