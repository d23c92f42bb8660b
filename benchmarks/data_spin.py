"""Is the data-bound chain's gap to plain CuPy the host's wake-up?  The chain of
``hostless_tools.bench.gpu_stages`` (4 CuPy elementwise ops at 2048x2048, direct+shared, 100
frames a row) with the host's waits spinning 0.5 ms (the bench's: shorter than a frame, so the
host sleeps and a CUDA host function wakes it) and 20 ms (longer than a frame, as a CUDA
synchronize spins), in turn, twice, against plain CuPy with pinned I/O in the same run.

    python benchmarks/data_spin.py     (a GPU, CuPy, cuda.bindings)
"""

import os

import numpy as np

import hostless as hl
from hostless import agents
from hostless_tools.bench.gpu_stage_anchors import DATA_CUPY, cupy_anchor
from hostless_tools.bench.gpu_stages import _graph, hostless_rows

n, frames = 2048, 100
print("cupy pinned", round(cupy_anchor(DATA_CUPY, n, frames, pinned=True)[0]["p50_us"], 1), flush=True)
fr = np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)
for spin in (0.0005, 0.02, 0.0005, 0.02):
    name = f"ds-{os.getpid()}"
    dom = hl.Domain.create(name, heap="1G", device_heaps={"cuda:0": 1 << 30}, spin=spin)
    try:
        gpu = agents.spawn(dom, "cuda", device=0, timeout=120, spin=50e-6)
        try:
            g = _graph(dom, gpu, DATA_CUPY, (n, n), n, "cupy")
            r = hostless_rows(g, {"x0": fr}, f"x{len(DATA_CUPY)}", frames, (("direct", "shared"),))
            v = r["direct+shared"]
            spread = f"[{v['p10_us']:.1f}-{v['p90_us']:.1f}]"
            print(f"hostless spin {spin * 1e3:.1f} ms: p50 {v['p50_us']:.1f} {spread}", flush=True)
        finally:
            gpu.stop()
    finally:
        dom.close()
        hl.Domain.unlink(name)
