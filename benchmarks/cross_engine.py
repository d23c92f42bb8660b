"""The cross-engine chain of ``hostless_tools.bench.gpu_stages`` alone (PyTorch GEMM -> npu relu
-> PyTorch softmax, 256x256, against the host-orchestrated anchor): latency and CPU per frame
by process, with the host's waits spinning ``HOST_SPIN`` seconds (0: they sleep at once).

    python benchmarks/cross_engine.py LABEL HOST_SPIN [OUT_DIR]   (a GPU, PyTorch, CuPy)

Run it with ``PYTHONPATH`` pointing at another build for an A/B; writes
``OUT_DIR/ce-LABEL-SPINUS.json``.
"""

import json
import os
import sys

import hostless as hl
from hostless import agents
from hostless_tools.bench.gpu_stages import cross_engine

label, host_spin = sys.argv[1], float(sys.argv[2])
name = f"ceab-{os.getpid()}"
dom = hl.Domain.create(name, heap="1G", device_heaps={"cuda:0": 1 << 30}, spin=host_spin)
try:
    gpu = agents.spawn(dom, "cuda", device=0, timeout=120, spin=50e-6)
    npu = agents.spawn(dom, "npu", spin=50e-6)
    try:
        res = cross_engine(dom, gpu, npu, 256, 300)
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
    )
out = sys.argv[3] if len(sys.argv) > 3 else "."
with open(f"{out}/ce-{label}-{int(host_spin * 1e6)}.json", "w") as fh:
    rows = {k: {a: b for a, b in v.items() if a not in ("out", "plan")} for k, v in res.items()}
    json.dump(rows, fh, indent=1)
