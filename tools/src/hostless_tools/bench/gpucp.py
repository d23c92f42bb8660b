"""The thesis matrix on the GPU command processor: ``python -m hostless_tools.bench.gpucp -o DIR``.

Measured in one run on one GPU, one frame at a time (host input in, host
output out):

* **anchors**: the mapped-memory ping-pong (a resident kernel answering a
  host store through pinned host memory: the floor of any host <-> GPU
  hand-off); the latency-bound chain as a plain CuPy script and as a CUDA
  graph replay (PyTorch); the chain on the ``cuda`` agent with host dispatch
  and host-staged data (``host+copy``: a host process launches every stage,
  the library's reference mode);
* **the matrix**: the chain on the GPU command processor (``gpucp``) in the
  four modes, copy/shared x host/direct, for a latency-bound chain (6 stages
  at 64x64 f32) and a data-bound one (4 elementwise stages at 2048x2048 f32,
  16 MiB a tensor);
* **hand-off**: chains of 2 and 34 copy stages of 64 bytes, direct+shared:
  the slope per stage, and the device timer's mean from a stage's end to the
  next in-place stage's start (``handoff_ns / inplace`` of the control block);
* **CPU -> GPU -> CPU**: a native cpu agent's stage, a gpucp stage, a native
  cpu agent's stage, direct; minus the same without the gpucp stage;
* **isolation**: plain CuPy in this process while a command processor runs in
  this process (green context, then bounded grid) and while one runs in
  another process.

Goals (issue 14): a hand-off between two command-processor stages <= 2 us;
direct+shared >= 11x lower latency than host+copy on the latency-bound chain
and faster than the CUDA graph replay; >= 2x on the data-bound chain; the
CPU -> GPU -> CPU round trip <= 5 us.  Each is reported met or not.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any

import numpy as np

import hostless as hl
from hostless import agents
from hostless.agents import gpucp as gpucp_mod
from hostless.graph import Graph
from hostless_tools.bench import gpu as gb

DATA: gb.Chain = [("normalize", 0, (0.5, 2.0)), ("relu", 0, ()), ("scale", 0, (0.5,)), ("relu", 0, ())]

_PINGPONG = r"""
extern "C" __global__ void pingpong(volatile unsigned long long *w, int n) {
    for (int i = 0; i < n; i++) {
        while (w[0] != 2ull * i + 1) { }
        __threadfence_system();
        w[8] = 2ull * i + 2;
    }
}
"""


_BUS = r"""
typedef unsigned long long u64;
__device__ u64 gt() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
extern "C" __global__ void bus(volatile u64 *h, u64 *dev, u64 *out, int n) {
    volatile u64 *d = (volatile u64 *)dev;
    u64 s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, acc = 0, t0, t1;
    for (int i = 0; i < n; i++) {  /* a read of host memory */
        t0 = gt(); acc += h[0]; t1 = gt(); s0 += t1 - t0;
    }
    for (int i = 0; i < n; i++) {  /* a system-scope CAS on host memory */
        t0 = gt(); acc += atomicCAS_system((u64 *)&h[8], (u64)i, (u64)i + 1); t1 = gt(); s1 += t1 - t0;
    }
    for (int i = 0; i < n; i++) {  /* a store to host memory, then a system fence */
        h[16] = i; t0 = gt(); __threadfence_system(); t1 = gt(); s2 += t1 - t0;
    }
    for (int i = 0; i < n; i++) {  /* a store to device memory, then a system fence */
        d[0] = i; t0 = gt(); __threadfence_system(); t1 = gt(); s3 += t1 - t0;
    }
    for (int i = 0; i < n; i++) {  /* a store to device memory, then a GPU-scope fence */
        d[0] = i; t0 = gt(); __threadfence(); t1 = gt(); s4 += t1 - t0;
    }
    for (int i = 0; i < n; i++) {  /* two reads of host memory issued together */
        t0 = gt(); u64 a = h[0], b = h[24]; acc += a + b; t1 = gt(); s5 += t1 - t0;
    }
    for (int i = 0; i < n; i++) {  /* a read and a CAS of host memory issued together */
        t0 = gt(); u64 a = h[0]; u64 b = atomicCAS_system((u64 *)&h[8], (u64)(n + i), (u64)(n + i) + 1);
        acc += a + b; t1 = gt(); s6 += t1 - t0;
    }
    out[0] = s0 / n; out[1] = s1 / n; out[2] = s2 / n; out[3] = s3 / n; out[4] = s4 / n; out[5] = s5 / n;
    out[6] = s6 / n; out[7] = acc;
}
/* one warp: what the command processor's round trips are made of */
extern "C" __global__ void bus_warp(volatile u64 *h, u64 *out, int n) {
    const int lane = threadIdx.x;
    u64 s0 = 0, s1 = 0, s2 = 0, s3 = 0, acc = 0, t0 = 0;
    for (int i = 0; i < n; i++) {  /* 22 lanes read 22 consecutive words */
        if (lane == 0) t0 = gt();
        __syncwarp();
        u64 v = lane < 22 ? h[lane] : 0;
        acc += __shfl_sync(0xffffffffu, v, 5);
        if (lane == 0) s0 += gt() - t0;
    }
    for (int i = 0; i < n; i++) {  /* 11 lanes read them as 16-byte vectors */
        if (lane == 0) t0 = gt();
        __syncwarp();
        u64 a = 0, b = 0;
        if (lane < 11)
            asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(h + 2 * lane));
        acc += __shfl_sync(0xffffffffu, a + b, 5);
        if (lane == 0) s1 += gt() - t0;
    }
    for (int i = 0; i < n; i++) {  /* 22 lanes read, lane 22 CASes another word */
        if (lane == 0) t0 = gt();
        __syncwarp();
        u64 v = lane < 22 ? h[lane] : 0;
        if (lane == 22) v = atomicCAS_system((u64 *)&h[40], (u64)i, (u64)i + 1);
        acc += __shfl_sync(0xffffffffu, v, 5) + __shfl_sync(0xffffffffu, v, 22);
        if (lane == 0) s2 += gt() - t0;
    }
    for (int i = 0; i < n; i++) {  /* lane 22 CASes first, then 22 lanes read */
        if (lane == 0) t0 = gt();
        __syncwarp();
        u64 c = 0;
        if (lane == 22) c = atomicCAS_system((u64 *)&h[48], (u64)i, (u64)i + 1);
        u64 v = lane < 22 ? h[lane] : c;
        acc += __shfl_sync(0xffffffffu, v, 5) + __shfl_sync(0xffffffffu, v, 22);
        if (lane == 0) s3 += gt() - t0;
    }
    if (lane == 0) { out[0] = s0 / n; out[1] = s1 / n; out[2] = s2 / n; out[3] = s3 / n; out[4] = acc; }
}
"""


def _mapped_words(n: int) -> tuple[Any, np.ndarray, int]:
    """n u64 words of pinned host memory: (the allocation, its host view zeroed, its device
    address)."""
    import cupy as cp
    from cuda.bindings import driver as cu

    mem = cp.cuda.alloc_pinned_memory(8 * n)
    h = np.frombuffer(mem, dtype=np.uint64, count=n)
    h[...] = 0
    err, dptr = cu.cuMemHostGetDevicePointer(mem.ptr, 0)
    if int(err):
        raise RuntimeError(f"cuMemHostGetDevicePointer: {err!r}")
    return mem, h, int(dptr)


def bus_latency(n: int = 2000) -> dict[str, float]:
    """What one thread of the GPU pays, by its own timer (mean ns): a read of host memory, a
    system-scope CAS on host memory, a system fence after a host store, a system and a GPU-scope
    fence after a device-memory store, reads and a CAS issued together by one thread and by one
    warp.  The floors of the command processor's steps."""
    import cupy as cp

    mem, _h, dptr = _mapped_words(32)
    out = cp.zeros(8, dtype=np.uint64)
    dev = cp.zeros(8, dtype=np.uint64)
    k = cp.RawKernel(_BUS, "bus")
    k((1,), (1,), (dptr, dev, out, np.int32(n)))
    o = out.get()
    kw = cp.RawKernel(_BUS, "bus_warp")
    out2 = cp.zeros(8, dtype=np.uint64)
    kw((1,), (32,), (dptr, out2, np.int32(n)))
    o2 = out2.get()
    names = (
        "host_read_ns",
        "host_cas_ns",
        "host_store_fence_sys_ns",
        "dev_store_fence_sys_ns",
        "dev_store_fence_gpu_ns",
        "two_host_reads_ns",
        "host_read_and_cas_ns",
    )
    res = {k: float(o[i]) for i, k in enumerate(names)}
    names2 = (
        "warp_22_word_reads_ns",
        "warp_11_vector_reads_ns",
        "warp_reads_then_cas_ns",
        "warp_cas_then_reads_ns",
    )
    res.update({k: float(o2[i]) for i, k in enumerate(names2)})
    return res


def pingpong(n: int = 2000) -> dict[str, float]:
    """Round trip host -> resident kernel -> host through mapped pinned memory (both polling)."""
    import cupy as cp

    mem, w, dptr = _mapped_words(16)
    k = cp.RawKernel(_PINGPONG, "pingpong")
    s = cp.cuda.Stream(non_blocking=True)
    k((1,), (1,), (dptr, np.int32(n)), stream=s)
    ts = []
    for i in range(n):
        t0 = time.perf_counter()
        w[0] = 2 * i + 1
        while w[8] != 2 * i + 2:
            pass
        ts.append(time.perf_counter() - t0)
    s.synchronize()
    return gb._stats(ts[50:])


def _frames(
    cg: Any, feed: dict[str, np.ndarray], out: str, frames: int
) -> tuple[dict[str, float], np.ndarray]:
    o = cg.run(feed, timeout=300)[out]
    ts = []
    for _ in range(frames):
        t0 = time.perf_counter()
        o = cg.run(feed, timeout=300)[out]
        ts.append(time.perf_counter() - t0)
    return gb._stats(ts), o


def handoff(dom: hl.Domain, cp_agent: Any, frames: int, short: int = 2, long: int = 34) -> dict[str, Any]:
    """Per-stage cost of a command-processor chain: the slope between a short and a long chain of
    64-byte copies (direct+shared), and the device timer's mean in-place hand-off."""
    res: dict[str, Any] = {}
    x = np.arange(16, dtype=np.float32)
    for n in (short, long):
        g = Graph(dom).input("x0", (16,), "f4")
        for k in range(n):
            g.stage(f"c{k}", cp_agent, "copy", [f"x{k}"], (f"x{k + 1}", (16,), "f4"))
        time.sleep(0.05)  # the counters go out when the queue is idle
        before = gpucp_mod.stats(cp_agent)
        with g.compile(dispatch="direct", data="shared") as cg:
            st0, o = _frames(cg, {"x0": x}, f"x{n}", frames)
            st: dict[str, Any] = dict(st0)
        time.sleep(0.05)
        after = gpucp_mod.stats(cp_agent)
        assert np.array_equal(o, x)
        inpl = after["inplace"] - before["inplace"]
        jobs = (after["local"] - before["local"]) or 1
        st["device_handoff_ns"] = (after["handoff_ns"] - before["handoff_ns"]) / inpl if inpl else 0.0
        st["inplace"] = inpl
        # where a hand-off goes, by the device timer: the signal's fence, the round trip after the
        # job, the rest until the next job starts
        st["device_split_ns"] = {
            "fence": (after["fence_ns"] - before["fence_ns"]) / jobs,
            "round": (after["round_ns"] - before["round_ns"]) / jobs,
            "tail": (after["tail_ns"] - before["tail_ns"]) / inpl if inpl else 0.0,
            "post": (after["post_ns"] - before["post_ns"]) / jobs,
            "job": (after["job_ns"] - before["job_ns"]) / jobs,
        }
        res[f"chain{n}"] = st
    slope = (res[f"chain{long}"]["p50_us"] - res[f"chain{short}"]["p50_us"]) / (long - short)
    res["per_stage_us"] = slope
    res["device_handoff_us"] = res[f"chain{long}"]["device_handoff_ns"] / 1e3
    return res


def cpu_gpu_cpu(dom: hl.Domain, cp_agent: Any, cpu: Any, frames: int) -> dict[str, Any]:
    """[cpu copy, gpucp copy, cpu copy] against [cpu copy, cpu copy], direct, 64-byte tensors."""
    x = np.arange(16, dtype=np.float32)
    res: dict[str, Any] = {}
    for name, ags in (("cpu-gpu-cpu", [cpu, cp_agent, cpu]), ("cpu-cpu", [cpu, cpu])):
        g = Graph(dom).input("x0", (16,), "f4")
        for k, ag in enumerate(ags):
            g.stage(f"c{k}", ag, "copy", [f"x{k}"], (f"x{k + 1}", (16,), "f4"))
        with g.compile(dispatch="direct", data="shared") as cg:
            st, o = _frames(cg, {"x0": x}, f"x{len(ags)}", frames)
        assert np.array_equal(o, x)
        res[name] = st
    res["round_trip_us"] = res["cpu-gpu-cpu"]["p50_us"] - res["cpu-cpu"]["p50_us"]
    return res


def isolation(dom: hl.Domain, frames: int) -> dict[str, Any]:
    """Plain CuPy (the small chain) alone, beside an in-process command processor (green
    context, then bounded grid) and beside one in another process."""
    from hostless.agents.gpucp import GpuCommandProcessor

    res: dict[str, Any] = {"alone": gb.plain_cupy(gb.SMALL, 64, frames)[0]}
    for iso in ("green", "grid"):
        q = dom.queue(16)
        q.bind()
        try:
            p = GpuCommandProcessor(dom, q, 0, 0, sms=8, isolation=iso)
        except Exception as e:  # no green contexts here
            res[f"in-process {iso}"] = {"error": str(e)}
            q.release()
            continue
        try:
            p.start()
            res[f"in-process {iso}"] = {**gb.plain_cupy(gb.SMALL, 64, frames)[0], "info": dict(p.info)}
        finally:
            p.stop()
            p.close()
            q.release()
    a = agents.spawn(dom, "gpucp", device=0)
    try:
        res["other process"] = {
            **gb.plain_cupy(gb.SMALL, 64, max(20, frames // 10))[0],
            "info": a.capabilities,
        }
    finally:
        a.stop()
    return res


def run(frames: int, frames_data: int, n_data: int, agent_spin: float = 5e-3, sms: int = 8) -> dict[str, Any]:
    import cupy as cp

    big = n_data * n_data * 4
    dom = hl.Domain.create(
        f"hl-bench-gpucp-{os.getpid()}",
        fences=4096,
        heap=16 * big + (64 << 20),
        device_heaps={"cuda:0": 12 * big + (64 << 20)},
    )
    dom.spin = agent_spin
    out: dict[str, Any] = {
        "machine": platform.node(),
        "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "agent_spin_s": agent_spin,
        "frames": frames,
    }
    try:
        out["pingpong"] = pingpong()
        out["bus"] = bus_latency()
        print(f"bus (ns): {out['bus']}", flush=True)
        print(f"ping-pong {out['pingpong']['p50_us']:.2f} us", flush=True)
        plain, ref = gb.plain_cupy(gb.SMALL, 64, frames)
        graph, gout = gb.cuda_graph(gb.SMALL, 64, frames)
        out["small"] = {"plain_cupy": plain, "cuda_graph": {**graph, "matches": gb._check(gout, ref)}}
        cuda_agent = agents.spawn(dom, "cuda", device=0, spin=agent_spin)
        try:
            m = gb.hostless_modes(dom, gb.SMALL, 64, frames, cuda_agent, modes=(("host", "copy"),))
        finally:
            cuda_agent.stop()
        r = m["host+copy"]
        r["matches"] = gb._check(r.pop("out"), ref)
        out["small"]["cuda agent host+copy"] = r
        dplain, dref = gb.plain_cupy(DATA, n_data, frames_data)
        out["data"] = {"n": n_data, "plain_cupy": dplain}
        print(
            f"anchors: plain {plain['p50_us']:.1f} us, graph {graph['p50_us']:.1f} us, "
            f"cuda agent host+copy {r['p50_us']:.1f} us",
            flush=True,
        )

        gcp = agents.spawn(dom, "gpucp", device=0, sms=sms)
        cpu = agents.spawn(dom, "cpu", native=True, spin=agent_spin, fixed_spin=True)
        out["gpucp"] = gcp.capabilities
        try:
            for key, chain, n, fr, want in (
                ("small", gb.SMALL, 64, frames, ref),
                ("data", DATA, n_data, frames_data, dref),
            ):
                modes = gb.hostless_modes(dom, chain, n, fr, gcp)
                for mname, mr in modes.items():
                    mr["matches"] = gb._check(mr.pop("out"), want)
                    out[key][f"gpucp {mname}"] = mr
                print(
                    f"{key}: " + ", ".join(f"{k} {v['p50_us']:.1f} us" for k, v in modes.items()), flush=True
                )
            out["handoff"] = handoff(dom, gcp, frames)
            print(
                f"hand-off: {out['handoff']['per_stage_us']:.2f} us a stage, device "
                f"{out['handoff']['device_handoff_us']:.2f} us",
                flush=True,
            )
            out["cpu_gpu_cpu"] = cpu_gpu_cpu(dom, gcp, cpu, frames)
            print(f"cpu->gpu->cpu {out['cpu_gpu_cpu']['round_trip_us']:.2f} us", flush=True)
            time.sleep(0.05)
            out["gpucp_stats"] = gpucp_mod.stats(gcp)
        finally:
            gcp.stop()
            cpu.stop()
        out["isolation"] = isolation(dom, max(50, frames // 2))
    finally:
        dom.close()
    out["goals"] = goals(out)
    return out


def goals(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals of issue 14, each with its measured value and met / not met."""
    rows = []
    s, d = res["small"], res["data"]
    ds, hc = s["gpucp direct+shared"]["p50_us"], s["gpucp host+copy"]["p50_us"]
    ref = s["cuda agent host+copy"]["p50_us"]
    g = s["cuda_graph"]["p50_us"]
    h = res["handoff"]
    rows.append(
        {
            "goal": "hand-off between two command-processor stages <= 2 us",
            "measured": f"{h['per_stage_us']:.2f} us a stage (slope, incl. a 64-byte copy); device timer "
            f"{h['device_handoff_us']:.2f} us",
            "met": h["per_stage_us"] <= 2.0,
        }
    )
    rows.append(
        {
            "goal": "latency-bound: direct+shared >= 11x lower than host+copy",
            "measured": f"gpucp direct+shared {ds:.1f} us; vs gpucp host+copy {hc:.1f} us: {hc / ds:.2f}x; "
            f"vs the cuda agent's host+copy (a host launching each stage) {ref:.1f} us: "
            f"{ref / ds:.2f}x",
            "met": hc / ds >= 11.0,
        }
    )
    rows.append(
        {
            "goal": "latency-bound: direct+shared faster than a CUDA graph replay",
            "measured": f"{ds:.1f} us vs {g:.1f} us ({g / ds:.2f}x)",
            "met": ds < g,
        }
    )
    dds, dhc = d["gpucp direct+shared"]["p50_us"], d["gpucp host+copy"]["p50_us"]
    rows.append(
        {
            "goal": "data-bound: direct+shared >= 2x host+copy",
            "measured": f"{dds:.0f} us vs {dhc:.0f} us ({dhc / dds:.2f}x)",
            "met": dhc / dds >= 2.0,
        }
    )
    rt = res["cpu_gpu_cpu"]["round_trip_us"]
    rows.append(
        {
            "goal": "CPU agent -> GPU command processor -> CPU agent <= 5 us (native CPU agents)",
            "measured": f"{rt:.2f} us (frame {res['cpu_gpu_cpu']['cpu-gpu-cpu']['p50_us']:.1f} us minus "
            f"{res['cpu_gpu_cpu']['cpu-cpu']['p50_us']:.1f} us without the GPU stage)",
            "met": rt <= 5.0,
        }
    )
    return rows


def report(res: dict[str, Any]) -> str:
    def row(name: str, r: dict[str, Any], base: float | None = None) -> str:
        if "p50_us" not in r:
            return f"| {name} | {r.get('error', '?')} | | | |"
        sp = f"{base / r['p50_us']:.2f}x" if base else ""
        spread = f"{r['p10_us']:.1f}-{r['p90_us']:.1f}"
        return f"| {name} | {r['p50_us']:.1f} | {spread} | {sp} | {r.get('matches', '')} |"

    g = res["gpucp"]
    lines = [
        f"# GPU command processor: the thesis matrix ({res['gpu']}, {res['machine']}, {res['date']})",
        "",
        f"Command processor: {g.get('isolation')} with {g.get('sms')} of {g.get('sms_total')} SMs"
        + (
            f"; its front end's SM ran at {res['gpucp_stats']['sm_khz'] / 1e3:.0f} MHz (clock64 against the "
            "global timer, last 100 ms before the end) "
            if res.get("gpucp_stats", {}).get("sm_khz")
            else " "
        )
        + f"({g.get('workers')} worker blocks, {g.get('launch', '')} launch). "
        "One frame at a time; p50 [p10-p90] us. "
        f"Mapped-memory ping-pong (host -> GPU -> host, both polling): {res['pingpong']['p50_us']:.2f} us.",
        "",
        "What one GPU thread pays, by its own timer (the floors of the processor's steps): "
        + ", ".join(f"{k[:-3].replace('_', ' ')} {v / 1e3:.2f} us" for k, v in res.get("bus", {}).items())
        + ".",
        "",
    ]
    for key, title in (
        ("small", "latency-bound: normalize, GEMM, relu, GEMM, relu, softmax at 64x64 f32"),
        ("data", f"data-bound: normalize, relu, scale, relu at {res['data']['n']}^2 f32"),
    ):
        e = res[key]
        base = e.get("gpucp host+copy", {}).get("p50_us")
        lines += [
            f"## {title}",
            "",
            "| path | p50 us | p10-p90 us | vs gpucp host+copy | same result |",
            "|---|---|---|---|---|",
        ]
        for name, r in e.items():
            if isinstance(r, dict) and name != "n":
                lines.append(row(name, r, base))
        lines.append("")
    h = res["handoff"]
    lines += [
        "## Hand-off and round trip",
        "",
        f"- copy chains, direct+shared: 2 stages {h['chain2']['p50_us']:.1f} us, 34 stages "
        f"{h['chain34']['p50_us']:.1f} us: **{h['per_stage_us']:.2f} us a stage**; the device timer's "
        f"mean in-place hand-off (a stage's join to the next's fork): **{h['device_handoff_us']:.2f} us** "
        f"over {h['chain34']['inplace']} hand-offs; of it, by the device timer: preparing the round trip "
        f"{h['chain34']['device_split_ns']['fence'] / 1e3:.2f} us, the round trip after the job "
        f"{h['chain34']['device_split_ns']['round'] / 1e3:.2f} us (the signal's fence and CAS, the next "
        f"stage's reads), the rest "
        f"{h['chain34']['device_split_ns']['tail'] / 1e3:.2f} us (of which settling the signal and the "
        f"follow-ups {h['chain34']['device_split_ns']['post'] / 1e3:.2f} us); a 64-byte copy job "
        f"{h['chain34']['device_split_ns']['job'] / 1e3:.2f} us.",
        f"- native cpu -> gpucp -> native cpu, direct: {res['cpu_gpu_cpu']['cpu-gpu-cpu']['p50_us']:.1f} us; "
        f"without the GPU stage {res['cpu_gpu_cpu']['cpu-cpu']['p50_us']:.1f} us: the GPU leg "
        f"**{res['cpu_gpu_cpu']['round_trip_us']:.2f} us**.",
        "",
        "## Isolation: plain CuPy (small chain) in this process",
        "",
        "| beside | p50 us | p10-p90 us | | |",
        "|---|---|---|---|---|",
    ]
    for name, r in res["isolation"].items():
        lines.append(row(name, r))
    lines += ["", *gb.goals_lines(res["goals"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", default="benchmarks/results")
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--frames-data", type=int, default=30)
    ap.add_argument("--n-data", type=int, default=2048)
    ap.add_argument("--sms", type=int, default=8)
    ap.add_argument("--tag", default="h200")
    a = ap.parse_args(argv)
    from hostless.cuda import available

    why = available()
    if why:
        print(f"no GPU benchmark: {why}", file=sys.stderr)
        return 2
    res = run(a.frames, a.frames_data, a.n_data, sms=a.sms)
    gb.save(res, a.out, f"gpucp-matrix-{a.tag}", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
