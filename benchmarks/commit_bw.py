"""16 MiB between the GPU and host memory, each way, on one stream (CUDA events, median of 30):
an armed frame's gated commit kernel (``hl_commit``, SM stores into the domain's registered
heap) against a DMA into the same heap and into ``cupyx.empty_pinned`` memory (what the
data-bound anchor of ``hostless_tools.bench.gpu_stages`` uses), the copy kernel and DMAs the
other way, and the host's memcpy into and out of the heap and pinned memory.

    python benchmarks/commit_bw.py [-o FILE]    (a GPU, CuPy and cuda.bindings)
"""

import argparse
import json
import os
import time

import cupy as cp
import cupyx
import numpy as np

import hostless as hl
from hostless.cuda import CudaPeer

ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
ap.add_argument("-o", "--out", default=None)
a = ap.parse_args()
n = 16 << 20
name = f"commitbw-{os.getpid()}"
dom = hl.Domain.create(name, heap="256M")
peer = CudaPeer(dom, 0)
out = dom.buffer((n,), np.uint8)
inb = dom.buffer((n,), np.uint8)
out.numpy()[...] = 1
inb.numpy()[...] = 2
dout, din = peer.buffer_dptr(out), peer.buffer_dptr(inb)
scratch = cp.arange(n, dtype=cp.uint8)
dev2 = cp.empty(n, cp.uint8)
gate = cp.zeros(1, cp.int32)
pin = cupyx.empty_pinned((n,), np.uint8)
pin[...] = 3
s = cp.cuda.Stream(non_blocking=True)


def t(fn, reps=30):
    ts = []
    for _ in range(reps + 3):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        fn()
        e1.record(s)
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
    ts = np.array(ts[3:])
    return {
        "p50_us": float(np.median(ts)),
        "p10_us": float(np.percentile(ts, 10)),
        "p90_us": float(np.percentile(ts, 90)),
    }


rt = cp.cuda.runtime
res = {
    "commit kernel dev->heap": t(lambda: peer.commit(out, scratch, gate, s)),
    "DMA dev->heap": t(lambda: rt.memcpyAsync(dout, scratch.data.ptr, n, 4, s.ptr)),
    "DMA dev->pinned (anchor)": t(lambda: rt.memcpyAsync(pin.ctypes.data, scratch.data.ptr, n, 2, s.ptr)),
    "DMA heap->dev": t(lambda: rt.memcpyAsync(dev2.data.ptr, din, n, 4, s.ptr)),
    "DMA pinned->dev (anchor)": t(lambda: rt.memcpyAsync(dev2.data.ptr, pin.ctypes.data, n, 1, s.ptr)),
    "copy kernel heap->dev": t(lambda: peer.copy_kernel(dev2.data.ptr, din, n, s.ptr)),
}
src = np.ones(n, np.uint8)


def host(fn):
    ts = []
    for _ in range(20):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    return float(np.median(ts))


res["host memcpy into heap"] = host(lambda: inb.numpy().__setitem__(Ellipsis, src))
res["host memcpy into pinned"] = host(lambda: pin.__setitem__(Ellipsis, src))
res["host memcpy out of heap"] = host(lambda: out.numpy().copy())
res["host memcpy out of pinned"] = host(lambda: pin.copy())
for k, v in res.items():
    print(f"{k:32s} {v}")
if a.out:
    with open(a.out, "w") as fh:
        json.dump({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "bytes": n, **res}, fh, indent=1)
dom.close()
hl.Domain.unlink(name)
