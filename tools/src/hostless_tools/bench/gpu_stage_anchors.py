"""The anchors of the GPU-stages benchmark (:mod:`hostless_tools.bench.gpu_stages`): what a
GPU user writes without hostless, timed one frame at a time as the benchmark times hostless:
PyTorch eager and a whole-chain CUDA graph replay with pinned host I/O (and device-resident),
plain CuPy with pinned (and pageable) I/O, and two resident blocks ping-ponging a flag in
device memory.  The chains (:data:`GEMM`, :data:`SMALL`, :data:`DATA_CUPY`) are the
benchmark's, with the functions of :mod:`hostless_tools.bench.gpu_stage_ops`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hostless_tools.bench import gpu_stage_ops as ops
from hostless_tools.bench.gpu import _stats

# a chain: (function, weights it takes, scalars)
Chain = list[tuple[Callable[..., Any], int, tuple[float, ...]]]
GEMM: Chain = [(ops.gemm, 1, ()), (ops.gemm, 1, ()), (ops.gemm, 1, ()), (ops.relu, 0, ())]
SMALL: Chain = [
    (ops.normalize, 0, (0.5, 2.0)),
    (ops.gemm, 1, ()),
    (ops.relu, 0, ()),
    (ops.gemm, 1, ()),
    (ops.relu, 0, ()),
    (ops.softmax, 0, ()),
]
DATA_CUPY: Chain = [
    (ops.c_normalize, 0, (0.5, 2.0)),
    (ops.c_relu, 0, ()),
    (ops.c_scale, 0, (0.5,)),
    (ops.c_relu, 0, ()),
]


def chain_weights(chain: Chain, n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
        for _f, nw, _s in chain
        for _ in range(nw)
    ]


def _apply(chain: Chain, x: Any, ws: list[Any]) -> Any:
    wi = 0
    for f, nw, sc in chain:
        x = f(x, *ws[wi : wi + nw], *sc)
        wi += nw
    return x


def time_frames(step: Callable[[], Any], frames: int, warm: int = 3) -> tuple[dict[str, float], Any]:
    out = None
    for _ in range(warm):
        out = step()
    ts = []
    for _ in range(frames):
        t0 = time.perf_counter()
        out = step()
        ts.append(time.perf_counter() - t0)
    return _stats(ts), out


# ---------------------------------------------------------------- anchors
def torch_anchor(
    chain: Chain, shape: tuple[int, ...], n: int, frames: int, graph: bool, copy_out: bool = True
) -> tuple[dict[str, float], np.ndarray]:
    """PyTorch with pinned host I/O: the frame copied into a pinned tensor, uploaded, the chain
    (eager, or one CUDA graph replay), downloaded into a pinned tensor, then copied out."""
    import torch

    dev = torch.device("cuda:0")
    ws = [torch.from_numpy(w).to(dev) for w in chain_weights(chain, n)]
    frame = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    hin = torch.empty(shape, dtype=torch.float32).pin_memory()
    x = torch.empty(shape, dtype=torch.float32, device=dev)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            y = _apply(chain, x, ws)
    s.synchronize()
    hout = torch.empty(tuple(y.shape), dtype=y.dtype).pin_memory()
    g = None
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = _apply(chain, x, ws)
    hin_np, hout_np = hin.numpy(), hout.numpy()
    cur = torch.cuda.current_stream()

    def step() -> Any:
        nonlocal y
        hin_np[...] = frame
        x.copy_(hin, non_blocking=True)
        if g is not None:
            g.replay()
        else:
            y = _apply(chain, x, ws)
        hout.copy_(y, non_blocking=True)
        cur.synchronize()
        return hout_np.copy() if copy_out else hout_np

    st, out = time_frames(step, frames)
    return st, np.array(out)


def torch_device_anchor(n: int, frames: int) -> tuple[dict[str, float], np.ndarray]:
    """The device-resident GEMM chain as one CUDA graph replay: a one-element seed in, the
    frame made on the GPU, three GEMMs and a relu, row sums out (pinned, copied out)."""
    import torch

    dev = torch.device("cuda:0")
    ws = [torch.from_numpy(w).to(dev) for w in chain_weights(GEMM, n)]
    hin = torch.ones((1,), dtype=torch.float32).pin_memory()
    seed = torch.empty((1,), dtype=torch.float32, device=dev)

    def body() -> Any:
        return ops.row_sums(_apply(GEMM, ops.frame_from_seed(seed, n), ws))

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            body()
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = body()
    hout = torch.empty((n,), dtype=torch.float32).pin_memory()
    cur = torch.cuda.current_stream()

    def step() -> Any:
        hin.numpy()[0] = 0.25
        seed.copy_(hin, non_blocking=True)
        g.replay()
        hout.copy_(y, non_blocking=True)
        cur.synchronize()
        return hout.numpy().copy()

    return time_frames(step, frames)


def cupy_anchor(chain: Chain, n: int, frames: int, pinned: bool) -> tuple[dict[str, float], np.ndarray]:
    """Plain CuPy: pinned host I/O (``cupyx.empty_pinned``, async copies on one stream), or
    pageable (``cp.asarray`` / ``cp.asnumpy``: labelled as such)."""
    import cupy as cp
    import cupyx

    ws = [cp.asarray(w) for w in chain_weights(chain, n)]
    frame = np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)
    s = cp.cuda.Stream(non_blocking=True)
    if not pinned:

        def step() -> Any:
            with s:
                r = cp.asnumpy(_apply(chain, cp.asarray(frame), ws), stream=s)
            s.synchronize()
            return r

        return time_frames(step, frames)
    hin = cupyx.empty_pinned((n, n), np.float32)
    hout = cupyx.empty_pinned((n, n), np.float32)
    x = cp.empty((n, n), np.float32)

    def step_p() -> Any:
        hin[...] = frame
        with s:
            x.set(hin, stream=s)
            _apply(chain, x, ws).get(out=hout, stream=s)
        s.synchronize()
        return hout.copy()

    return time_frames(step_p, frames)


_FLAG = r"""
extern "C" __global__ void flag_pingpong(volatile unsigned long long *w, int n) {
    /* block 0 and block 1 hand a flag in device memory back and forth n times */
    if (threadIdx.x) return;
    unsigned long long me = blockIdx.x;
    for (int i = 0; i < n; i++) {
        unsigned long long want = 2ull * i + me;
        while (w[0] != want) { }
        w[0] = want + 1;
    }
}
"""


def flag_pingpong(n: int = 200_000) -> dict[str, float]:
    """One GPU-to-GPU hand-off: two resident blocks alternating on a device-memory flag
    (n hand-offs each way, timed by events; 5 runs)."""
    import cupy as cp

    k = cp.RawKernel(_FLAG, "flag_pingpong")
    w = cp.zeros(1, dtype=cp.uint64)
    per = []
    for _ in range(6):
        w[...] = 0
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        k((2,), (32,), (w, np.int32(n)))
        b.record()
        b.synchronize()
        per.append(cp.cuda.get_elapsed_time(a, b) * 1e-3 / (2 * n))
    return _stats(per[1:])


# ---------------------------------------------------------------- hostless
