"""GPU benchmark (run on the GPU machine): ``python benchmarks/gpu.py -o DIR``.

Needs CuPy and cuda.bindings (``pip install hostless[cuda]``); it is a script of the
repository, not part of the installed package.

Measured in one run:

* ``gpu_wait_rt``: a host thread advances timeline t1 to i; the GPU stream,
  which waits for ``t1 >= i`` (cuStreamWaitValue64), signals t2 = i with the
  gated signal kernel; the host spins until t2 >= i.  Round trip per i.  No
  reference is measured for it in this run, so none is written: figures
  measured elsewhere (a bare stream wait + write value round trip, a
  persistent-kernel ping-pong) are not compared with (issue 28; the GPU
  command processor's benchmark, ``python -m hostless.bench.gpucp``, measures
  its mapped-memory ping-pong in its own run).
* ``handoff``: GPU -> npu-agent hand-off of a small stage: the GPU runs a tiny
  kernel, then either pushes the npu's packet itself (direct: device-side
  enqueue) or the host synchronizes the stream and pushes it (host-mediated);
  time until the npu agent's fence is signaled.
* ``graph``: a GPU + NPU + CPU pipeline (latency-bound chain of small kernels
  and a compute-intensive GEMM chain) in the four modes, speedups against
  host+copy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

import numpy as np

import hostless as hl
from hostless import agents, ert, kernels
from hostless.bench.harness import summarize
from hostless.buffer import bytes_buffer
from hostless.graph import Graph


def _stats(xs: list[float]) -> dict[str, float]:
    """p50, p90, p99 and min in microseconds of durations in seconds (the harness's statistics)."""
    st = summarize(np.array(xs) * 1e9)
    return {
        "p50_us": st["p50"] / 1e3,
        "p90_us": st["p90"] / 1e3,
        "p99_us": st["p99"] / 1e3,
        "min_us": st["min"] / 1e3,
        "n": len(xs),
    }


def gpu_wait_rt(
    dom: hl.Domain, peer: Any, n: int, host_spin: float = 1.0, wake: bool = False
) -> dict[str, float]:
    """Round trip: host signals t1 = i, the GPU's stream wait on t1 >= i is released and the GPU
    signals t2 = i; the host waits for t2 (spinning ``host_spin`` s, then asleep on the futex;
    ``wake``: the GPU's signal is followed by the host function that FUTEX_WAKEs sleepers)."""
    t1, t2 = dom.timeline(), dom.timeline()
    gate = peer.gate([])
    ahead = 32  # a stream holds a bounded number of pending operations: stay well below it
    for i in range(1, min(n, ahead) + 1):
        peer.wait(t1, i)
        peer.signal(t2, i, gate, wake=wake)
    rts = []
    for i in range(1, n + 1):
        t0 = time.perf_counter()
        t1.signal(i)
        t2.wait(i, spin=host_spin)
        rts.append(time.perf_counter() - t0)
        if i + ahead <= n:
            peer.wait(t1, i + ahead)
            peer.signal(t2, i + ahead, gate, wake=wake)
    peer.stream.synchronize()
    t1.release()
    t2.release()
    return _stats(rts[n // 10 :])


def _npu_relu_stage(dom: hl.Domain) -> tuple[Any, Any, Any, Any]:
    """(x, y, ERT command buffer, argument block) of an NPU relu stage y = relu(x) on 256 floats."""
    x = dom.buffer((256,), "f4")
    y = dom.buffer((256,), "f4")
    x.numpy()[:] = 1.0
    cmd = ert.start_cu(kernels.cu_index("relu"), [2, *ert.u64_args([x.handle, y.handle])]).encode()
    cb = bytes_buffer(dom, cmd)
    return x, y, cb, hl.Kernargs(buffers=[cb.handle]).to_buffer(dom)


def handoff(dom: hl.Domain, peer: Any, npu: agents.Agent, n: int, direct: bool) -> dict[str, float]:
    cp = peer.cp
    x, y, cb, ka = _npu_relu_stage(dom)
    g = peer.array(x)
    with peer.stream:
        g += 0  # compile before the loop
    peer.stream.synchronize()
    # prepared packets (one fence each), in the heap where the GPU reads them
    fences = [dom.fence(owner=npu.id) for _ in range(n)]
    pbs = []
    for f in fences:
        pbs.append(
            bytes_buffer(dom, hl.Packet(type=hl.PacketType.ERT, args=ka.handle, signal=f.handle).encode())
        )
    res = cp.zeros(1, dtype=cp.int32)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        with peer.stream:
            g *= 1.0  # the GPU stage
        if direct:
            peer.enqueue(npu.queue, pbs[i], wake=True, result=res)  # the GPU launches the NPU's work
        else:
            peer.stream.synchronize()  # host-mediated: sync, then launch
            npu.queue.push(hl.Packet(type=hl.PacketType.ERT, args=ka.handle, signal=fences[i].handle))
        fences[i].wait(10, spin=1.0)
        times.append(time.perf_counter() - t0)
    peer.stream.synchronize()
    for o in fences + pbs:
        o.release()
    for o in (x, y, cb, ka):
        o.release()
    return _stats(times[n // 10 :])


def handoff_graph(dom: hl.Domain, peer: Any, npu: agents.Agent, n: int, direct: bool) -> dict[str, float]:
    """As :func:`handoff`, with the GPU stage (and, direct, the device-side enqueue) captured once
    into a CUDA graph, so that a frame is one graph launch from the host: the way a prepared
    pipeline would run, without Python's per-kernel launch costs."""
    cp = peer.cp
    x, y, cb, ka = _npu_relu_stage(dom)
    g = peer.array(x)
    st = peer.stream
    with st:
        g *= 1.0  # compile before capturing
    st.synchronize()
    pb = dom.buffer(64)
    res = cp.zeros(1, dtype=cp.int32)
    st.begin_capture()
    with st:
        g *= 1.0  # the GPU stage
    if direct:
        peer.enqueue(npu.queue, pb, wake=False, result=res)  # the GPU launches the NPU's work
    graph = st.end_capture()
    fences = [dom.fence(owner=npu.id) for _ in range(n)]
    times = []
    try:
        for i in range(n):
            raw = hl.Packet(type=hl.PacketType.ERT, args=ka.handle, signal=fences[i].handle).encode()
            if direct:
                pb.numpy()[:] = np.frombuffer(raw, np.uint8)  # the prepared packet the GPU will push
            t0 = time.perf_counter()
            graph.launch(st)
            if not direct:
                st.synchronize()  # host-mediated: sync, then launch
                npu.queue.push(raw)
            fences[i].wait(10, spin=1.0)
            times.append(time.perf_counter() - t0)
        st.synchronize()
    finally:
        for o in (*fences, pb, x, y, cb, ka):
            o.release()
    return _stats(times[n // 10 :])


def graph_modes(
    dom: hl.Domain, gpu: agents.Agent, npu: agents.Agent, cpu: agents.Agent, frames: int
) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    workloads = {}
    # latency-bound: a chain of small kernels alternating GPU and NPU (16 KiB tensors)
    g = Graph(dom).input("a0", (64, 64), "f4")
    prev = "a0"
    for k in range(6):
        ag, kern = (gpu, "relu") if k % 2 == 0 else (npu, "relu")
        g.stage(f"s{k}", ag, kern, [prev], (f"a{k + 1}", (64, 64), "f4"))
        prev = f"a{k + 1}"
    workloads["latency_chain_6"] = (g, {"a0": rng.standard_normal((64, 64)).astype("f4")})
    # compute-intensive: GEMM chain GPU -> NPU -> GPU (1024^2 f32)
    n = 1024
    g2 = Graph(dom).input("x", (n, n), "f4")
    for i in range(3):
        g2.constant(f"W{i}", (rng.standard_normal((n, n)) / np.sqrt(n)).astype("f4"))
    g2.stage("g0", gpu, "gemm", ["x", "W0"], ("h0", (n, n), "f4"))
    g2.stage("n1", npu, "gemm", ["h0", "W1"], ("h1", (n, n), "f4"))
    g2.stage("g2", gpu, "gemm", ["h1", "W2"], ("y", (n, n), "f4"))
    workloads["gemm_chain_1024"] = (g2, {"x": rng.standard_normal((n, n)).astype("f4")})
    for wname, (graph, inp) in workloads.items():
        res: dict[str, Any] = {}
        ref = None
        for dispatch in ("host", "direct"):
            for data in ("copy", "shared"):
                with graph.compile(dispatch=dispatch, data=data) as cg:
                    o = cg.run(inp, timeout=120)  # warm-up (compiles GPU kernels)
                    key = list(o)[0]
                    if ref is None:
                        ref = o[key]
                    ok = bool(np.allclose(o[key], ref, rtol=1e-3, atol=1e-3))
                    ts = []
                    for _ in range(frames):
                        t0 = time.perf_counter()
                        cg.run(inp, timeout=120)
                        ts.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    list(cg.stream([inp] * frames, timeout=120))
                    thr = frames / (time.perf_counter() - t0)
                    res[f"{dispatch}+{data}"] = {**_stats(ts), "stream_fps": thr, "matches_host_copy": ok}
        base = res["host+copy"]["p50_us"]
        for v in res.values():
            v["speedup_vs_host_copy"] = base / v["p50_us"]
        out[wname] = res
    return out


class _Skip(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/gpu.py")
    ap.add_argument("-o", "--out", default="benchmarks/results")
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument(
        "--agent-spin", type=float, default=1e-3, help="agents' doorbell polling before sleeping (s)"
    )
    ap.add_argument("--skip-graph", action="store_true")
    a = ap.parse_args(argv)
    from hostless.cuda import CudaPeer

    name = f"hlbench-gpu-{os.getpid()}"
    dom = hl.Domain.create(name, heap="1G", fences=8192)
    res: dict[str, Any] = {}
    try:
        peer = CudaPeer(dom, 0)
        cp = peer.cp
        res.update(
            {
                "agent_spin_s": a.agent_spin,
                "machine": {
                    "host": platform.node(),
                    "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                    "cpus": os.cpu_count(),
                    "python": sys.version.split()[0],
                    "cupy": cp.__version__,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                },
            }
        )
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, f"gpu-h200-{time.strftime('%Y-%m-%d')}.json")

        def save() -> None:
            with open(path, "w") as f:
                json.dump(res, f, indent=2)

        res["gpu_wait_rt"] = gpu_wait_rt(dom, peer, a.n)
        print("gpu wait rt", res["gpu_wait_rt"], flush=True)
        # a sleeping host waiter: woken by the GPU's host function, or by its bounded sleep alone
        res["gpu_wait_rt_sleeping_host_woken"] = gpu_wait_rt(dom, peer, a.n // 4, host_spin=0.0, wake=True)
        res["gpu_wait_rt_sleeping_host_poll_only"] = gpu_wait_rt(dom, peer, 200, host_spin=0.0, wake=False)
        print(
            "sleeping host",
            res["gpu_wait_rt_sleeping_host_woken"],
            res["gpu_wait_rt_sleeping_host_poll_only"],
        )
        save()
        npu = agents.spawn(dom, "npu", spin=a.agent_spin)
        try:
            res["handoff_direct"] = handoff(dom, peer, npu, a.n // 4, True)
            res["handoff_host"] = handoff(dom, peer, npu, a.n // 4, False)
            print("handoff", res["handoff_direct"], res["handoff_host"], flush=True)
            save()
            for key, direct in (("handoff_graph_direct", True), ("handoff_graph_host", False)):
                try:
                    res[key] = handoff_graph(dom, peer, npu, a.n // 4, direct)
                except Exception as e:  # recorded, the rest of the run goes on
                    res[key] = {"error": repr(e)}
                print(key, res[key], flush=True)
            save()
            if a.skip_graph:
                raise _Skip
            gpu = agents.spawn(dom, "cuda", spin=a.agent_spin)
            cpu = agents.spawn(dom, "cpu", spin=a.agent_spin)
            try:
                res["graph"] = graph_modes(dom, gpu, npu, cpu, a.frames)
            finally:
                gpu.stop()
                cpu.stop()
        except _Skip:
            pass
        finally:
            npu.stop()
        peer.close()
    finally:
        dom.close()
        hl.Domain.unlink(name)
    save()
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
