"""hostless pipeline demo: one vision-like pipeline in the four modes.

A camera-like frame (uint8) goes through three stages on two engines:

1. preprocess on the ``cpu`` agent (NumPy worker): normalize to float32;
2. inference on the ``npu`` agent (the emulated NPU: each step is an ERT
   START_CU command buffer): GEMM, relu, GEMM;
3. postprocess on the ``cpu`` agent: softmax.

The same graph is compiled in the four modes, dispatch ``host`` / ``direct``
times data ``copy`` / ``shared``:

- host+copy is how the default stacks do it: the host launches a stage,
  waits for it, copies its output into the next engine's private buffer and
  launches the next (write, sync, launch, wait, sync back);
- shared: every stage reads its producer's buffer in place (one shared heap);
- direct: the host submits the first packet of a frame and waits for the
  last; each engine launches the next engine's work itself (follow-up
  packets), so the host is out of the loop and several frames are in flight.

The engines' command processors are native: ``agents.spawn(dom, "cpu")`` and
``"npu"`` run the engine's command processor in C (doorbell, packet, waits,
kernel, the npu's ERT commands, signal, follow-ups with no Python).

For each mode the demo prints the latency per frame (one frame at a time),
the streaming throughput, the host's CPU time per frame and the speedups
against host+copy, checks that all modes give the same output as NumPy, and
writes a Perfetto trace and a plot to ./out/.  Run: ``python
examples/pipeline_demo.py`` (about 20-40 s; cleans /dev/shm up).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import hostless as hl
from hostless import agents, trace
from hostless_tools.bench import fmt_ns, fmt_ratio, print_table
from hostless_tools.bench.pipeline import MODES, mode_name, plan_placement, vision_graph

LATENCY_FRAMES = 400
STREAM_FRAMES = 500
INFLIGHT = 3
SHAPE = (128, 256)  # rows x features of a frame
OUT = Path("out")


def versus(ratio: float, better: str, worse: str, what: str) -> str:
    """``ratio`` = old / new of a cost (lower is better) as words: ``1.22x lower latency`` when
    it is above 1, ``1.22x higher latency`` (1 / ratio) when below: never "0.82x lower"."""
    if ratio != ratio or ratio <= 0:
        return f"n/a {what}"
    if ratio >= 1:
        return f"{fmt_ratio(ratio)} {better} {what}"
    return f"{fmt_ratio(1 / ratio)} {worse} {what}"


def pin_agents(cpu: agents.Agent, npu: agents.Agent) -> str:
    """One engine, one core: pin the agents when there are CPUs for it."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return "not pinned"
    place = plan_placement(cpus, True)
    for agent, where in ((cpu, place["cpu"]), (npu, place["npu"])):
        if where:
            try:
                os.sched_setaffinity(agent.proc.pid, set(where))
            except OSError:
                pass
    return str(place["note"])


def measure(cg: Any, frames: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """Latency per frame (run, one at a time) and streaming throughput (stream)."""
    for f in frames[:20]:
        cg.run(f)  # warm-up
    lat = np.empty(LATENCY_FRAMES, dtype=np.int64)
    for i in range(LATENCY_FRAMES):
        t0 = time.perf_counter_ns()
        cg.run(frames[i % len(frames)])
        lat[i] = time.perf_counter_ns() - t0
    feed = (frames[i % len(frames)] for i in range(STREAM_FRAMES))
    c0, t0 = time.process_time(), time.perf_counter()
    n = sum(1 for _ in cg.stream(feed))
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "p50_ns": float(np.median(lat)),
        "p90_ns": float(np.percentile(lat, 90)),
        "fps": n / dt,
        "host_cpu_ns": cpu / n * 1e9,
        "host_cpu_share": cpu / dt,
    }


def plot(results: dict[str, dict[str, float]], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot (pip install matplotlib)"
    names = list(results)
    colors = ["#c0392b", "#e67e22", "#2980b9", "#27ae60"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    panels = [
        ("latency per frame p50 (us)", [results[k]["p50_ns"] / 1e3 for k in names]),
        (f"throughput, frames/s (direct: {INFLIGHT} in flight)", [results[k]["fps"] for k in names]),
        ("host CPU time per frame (us)", [results[k]["host_cpu_ns"] / 1e3 for k in names]),
    ]
    for ax, (title, vals) in zip(axes, panels, strict=True):
        ax.bar(names, vals, color=colors)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("hostless: preprocess (cpu) -> GEMM, relu, GEMM (npu) -> softmax (cpu)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot: {path}"


def spawn_agents(dom: hl.Domain) -> tuple[agents.Agent, agents.Agent, str]:
    """The cpu and npu agents; returns them and a line saying what they run."""
    cpu = agents.spawn(dom, "cpu", label="cpu (pre/post)")
    try:
        npu = agents.spawn(dom, "npu", label="npu (inference)")
    except BaseException:
        cpu.stop()
        raise
    gemm = npu.capabilities.get("gemm", "?")
    return cpu, npu, f"agents: cpu and npu command processors in C (GEMM: {gemm})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.parse_args(argv)
    t_start = time.monotonic()
    name = f"hostless-pipeline-demo-{os.getpid()}"
    OUT.mkdir(exist_ok=True)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")  # each agent models one engine on one core
    ncpu = len(os.sched_getaffinity(0))
    # On a 2-CPU machine a host that spins while it waits takes a CPU from an agent: sleep at once.
    dom = hl.Domain.create(
        name, heap="128M", trace="8M", label="host", spin=0.0 if ncpu < 3 else 50e-6, unlink_on_close=True
    )
    spawned: list[agents.Agent] = []
    try:
        cpu, npu, which = spawn_agents(dom)
        spawned += [cpu, npu]
        print(f"domain /dev/shm/{name}; {ncpu} CPUs; {pin_agents(cpu, npu)}")
        print(which)
        rng = np.random.default_rng(7)
        g, ref = vision_graph(dom, cpu, npu, SHAPE, rng)
        print("stages: " + " -> ".join(f"{s.name} ({s.agent.kind}: {s.kernel})" for s in g.stages))
        frames = [{"frame": rng.integers(0, 256, SHAPE, dtype=np.uint8)} for _ in range(16)]
        expect = ref(frames[0]["frame"])["probs"]

        results: dict[str, dict[str, float]] = {}
        outputs: dict[str, np.ndarray] = {}
        for dispatch, data in MODES:
            key = mode_name(dispatch, data)
            with g.compile(dispatch=dispatch, data=data, inflight=INFLIGHT) as cg:
                outputs[key] = cg.run(frames[0])["probs"]
                results[key] = measure(cg, frames)
            print(
                f"  {key:14s} done: p50 {fmt_ns(results[key]['p50_ns'])}, {results[key]['fps']:.0f} frames/s"
            )
        for key, out in outputs.items():
            assert np.allclose(out, expect, rtol=1e-4, atol=1e-6), f"{key} differs from NumPy"
            assert np.array_equal(out, outputs["host+copy"]), f"{key} differs from host+copy"
        print("outputs: the four modes agree with each other and with NumPy")

        base = results["host+copy"]
        rows = []
        for key, r in results.items():
            rows.append(
                [
                    key,
                    "1" if key.startswith("host") else str(INFLIGHT),
                    fmt_ns(r["p50_ns"]),
                    fmt_ns(r["p90_ns"]),
                    f"{r['fps']:.0f}",
                    f"{fmt_ns(r['host_cpu_ns'])} ({r['host_cpu_share']:.0%})",
                    fmt_ratio(base["p50_ns"] / r["p50_ns"]),
                    fmt_ratio(r["fps"] / base["fps"]),
                ]
            )
        print()
        print_table(
            "pipeline demo: latency (one frame at a time), throughput (streaming), host CPU per frame",
            [
                "mode",
                "in flight",
                "latency p50",
                "p90",
                "frames/s",
                "host CPU / frame",
                "speedup (latency)",
                "speedup (throughput)",
            ],
            rows,
        )
        best = results["direct+shared"]
        print(
            "direct+shared vs host+copy: "
            f"{versus(base['p50_ns'] / best['p50_ns'], 'lower', 'higher', 'latency')}, "
            f"{fmt_ratio(best['fps'] / base['fps'])} the throughput, "
            f"{versus(base['host_cpu_ns'] / best['host_cpu_ns'], 'less', 'more', 'host CPU per frame')}"
        )
        tpath = OUT / "pipeline_trace.json"
        n = trace.export(dom, str(tpath))
        print(f"trace: {tpath} ({n} events; open it in ui.perfetto.dev)")
        print(plot(results, OUT / "pipeline_demo.png"))
    finally:
        for a in spawned:
            try:
                a.stop()
            except Exception:
                a.kill()
        problems = dom.check()
        dom.close()  # unlink_on_close: the name goes with it
    left = [f for f in os.listdir("/dev/shm") if f == name]
    print(f"dom.check(): {'clean' if not problems else problems}")
    print(f"done in {time.monotonic() - t_start:.1f} s; /dev/shm leftovers: {left or 'none'}")
    return 0 if not left and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
