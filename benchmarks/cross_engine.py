"""The cross-engine chain of ``hostless_tools.bench.gpu_stages`` alone (PyTorch GEMM -> npu relu
-> PyTorch softmax, 256x256, against the host-orchestrated anchor): latency and CPU per frame
by process (their process CPU clocks, in ns), with the host's waits spinning ``HOST_SPIN`` seconds
(0: they sleep at once), over ``FRAMES`` frames of each (3000 by default).

    python benchmarks/cross_engine.py LABEL HOST_SPIN [OUT_DIR [FRAMES]]   (a GPU, PyTorch, CuPy)

Run it with ``PYTHONPATH`` pointing at another build for an A/B; writes
``OUT_DIR/ce-LABEL-SPINUS.json``.  Also prints (and writes under ``threads``) the CPU seconds of
each thread of the cuda agent and of this process over the whole call (both chains: the cuda
agent serves only hostless's), the busiest first, to find what uses the agent's CPU.
"""

import glob
import json
import os
import sys

import hostless as hl
from hostless import agents
from hostless_tools.bench.gpu_stages import cross_engine
from hostless_tools.bench.pipeline_workloads import thread_cpu_ns


def thread_ns(pid: int) -> dict[str, int]:
    """CPU ns of each live thread of ``pid``, by "name/tid"."""
    out = {}
    for t in glob.glob(f"/proc/{pid}/task/*"):
        tid = int(t.rsplit("/", 1)[1])
        try:
            with open(t + "/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended
            continue
        ns = thread_cpu_ns(pid, tid)
        if ns is not None:
            out[f"{name}/{tid}"] = ns
    return out


def busiest(before: dict[str, int], after: dict[str, int], n: int = 8) -> list[tuple[str, float]]:
    rows = [(k, (v - before.get(k, 0)) / 1e9) for k, v in after.items()]
    return sorted(rows, key=lambda r: -r[1])[:n]


label, host_spin = sys.argv[1], float(sys.argv[2])
frames = int(sys.argv[4]) if len(sys.argv) > 4 else 3000
name = f"ceab-{os.getpid()}"
dom = hl.Domain.create(name, heap="1G", device_heaps={"cuda:0": 1 << 30}, spin=host_spin)
try:
    gpu = agents.spawn(dom, "cuda", device=0, timeout=120, spin=50e-6)
    npu = agents.spawn(dom, "npu", spin=50e-6)
    try:
        t0 = {"cuda agent": thread_ns(gpu.proc.pid), "host": thread_ns(os.getpid())}
        res = cross_engine(dom, gpu, npu, 256, frames)
        threads = {
            "cuda agent": busiest(t0["cuda agent"], thread_ns(gpu.proc.pid)),
            "host": busiest(t0["host"], thread_ns(os.getpid())),
        }
    finally:
        for a in (gpu, npu):
            a.stop()
finally:
    dom.close()
    hl.Domain.unlink(name)
for k, v in res.items():
    by = v.get("cpu_us_per_frame_by", {})
    print(
        f"{label} spin={host_spin * 1e6:.0f}us {k}: p50 {v['p50_us']:.1f} "
        f"[{v['p10_us']:.1f}-{v['p90_us']:.1f}] CPU {v['cpu_us_per_frame']:.1f} "
        + " ".join(f"{a}={b:.1f}" for a, b in by.items())
        + f" ({frames} frames)"
    )
for who, rows in threads.items():
    print(f"{label} {who} threads (CPU s): " + ", ".join(f"{n} {c:.2f}" for n, c in rows))
out = sys.argv[3] if len(sys.argv) > 3 else "."
with open(f"{out}/ce-{label}-{int(host_spin * 1e6)}.json", "w") as fh:
    rows = {k: {a: b for a, b in v.items() if a not in ("out", "plan")} for k, v in res.items()}
    json.dump({**rows, "threads": threads}, fh, indent=1)
