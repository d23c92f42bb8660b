"""Where an armed GPU frame's time goes, measured without hostless (GPU, PyTorch and CuPy):
``python -m hostless_tools.bench.armed_parts [--frames N] [-o DIR]``.

The per-frame stream sequence of an armed segment (:class:`hostless.agents.cuda_armed.Armed`)
rebuilt from plain CUDA calls on the small 6-stage chain at 64x64: a stream wait on a pinned
host word, a one-thread gate kernel, the captured chain (its input read from mapped host
memory), a commit kernel into mapped host memory, a signal kernel and a host function
(hostless's C wake function), frames queued 8 ahead, the host writing the input and the word
and spinning on the signal word.  Variants leave parts out or move the host function to a
second stream (``full``: everything, the host function on the frame's stream; ``wake_side``: it
on a second stream behind an event; ``no_wake``: none; ``no_wake_gate``: no gate kernel either;
``no_wake_gate_commit``: nor a commit; ``no_wake_memop_signal``: the signal a stream write;
``minimal``: the wait, the graph and a stream-write signal alone; ``wait_signal``: the stream
wait and a stream-write signal, no work); ``folded``: the gate, the chain, the commit and the
signal (its value a device frame counter) captured as one graph, the host function on a second
stream, as an armed segment runs now (``folded_no_wake``: no host function;
``folded_dma_in`` / ``folded_kernel_in``: the input copied into device memory first, by a DMA
node or by a copy kernel, as a segment's host inputs are); ``anchor``:
the whole-chain CUDA graph replay with pinned host I/O.  ``--chain one`` runs the same on one
``add1`` stage of 16 floats: the GPU leg of ``cpu -> GPU -> cpu`` without hostless.  Two rounds;
p50 [p10-p90] per variant; JSON ``armed-parts[-one]-<time>.json`` under DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

from hostless_tools.bench import gpu_stage_ops as ops
from hostless_tools.bench.gpu_stage_anchors import SMALL, Chain, _apply, chain_weights, torch_anchor

N = 64
CHAINS: dict[str, tuple[Chain, tuple[int, ...]]] = {
    "small": (SMALL, (N, N)),
    "one": ([(ops.add1, 0, ())], (16,)),
}
AHEAD = 8
VARIANTS: dict[str, dict[str, Any]] = {
    "full": {},
    "wake_side": {"hostfn": "side"},
    "no_wake": {"hostfn": "none"},
    "no_wake_gate": {"hostfn": "none", "gate": False},
    "no_wake_gate_commit": {"hostfn": "none", "gate": False, "commit": False},
    "no_wake_memop_signal": {"hostfn": "none", "signal": "memop"},
    "minimal": {
        "hostfn": "none",
        "gate": False,
        "commit": False,
        "signal": "memop",
    },
    "wait_signal": {"hostfn": "none", "gate": False, "graph": False, "commit": False, "signal": "memop"},
    "folded": {"folded": "mapped", "hostfn": "side"},
    "folded_no_wake": {"folded": "mapped", "hostfn": "none"},
    "folded_dma_in": {"folded": "dma", "hostfn": "side"},
    "folded_kernel_in": {"folded": "kernel", "hostfn": "side"},
}
_KERNELS = r"""
extern "C" __global__ void gate(volatile int *cancel, int *g) { g[0] = cancel[0] ? -1 : 0; }
extern "C" __global__ void commit(unsigned char *out, const unsigned char *src, unsigned long long nb,
                                  const int *g) {
    if (g[0]) return;
    for (unsigned long long i = (blockIdx.x * blockDim.x + threadIdx.x) * 16ull; i < nb;
         i += 16ull * gridDim.x * blockDim.x)
        *(uint4 *)(out + i) = *(const uint4 *)(src + i);
}
extern "C" __global__ void sig(unsigned long long *w, unsigned long long v, const int *g) {
    __threadfence_system();
    if (!g[0]) atomicMax((unsigned long long *)w, v);
}
extern "C" __global__ void sigc(unsigned long long *w, unsigned long long *ctr, const int *g) {
    __threadfence_system();
    unsigned long long v = ctr[0] + 1;
    ctr[0] = v;
    if (!g[0]) atomicMax((unsigned long long *)w, v);
}
"""


class _Rig:
    """The mapped host words and buffers, the captured chain and the kernels."""

    def __init__(self, chain: Chain, shape: tuple[int, ...]) -> None:
        import cupy as cp
        import cupyx
        import torch
        from cuda.bindings import driver as cu

        from hostless import lowlevel

        self.cp, self.cu, self.torch = cp, cu, torch
        mod = cp.RawModule(code=_KERNELS)
        self.kg, self.kc, self.ks, ksc = (mod.get_function(k) for k in ("gate", "commit", "sig", "sigc"))
        self.shape = shape
        nb = self.nb = int(np.prod(shape)) * 4
        self.wh, self.wd = self._mapped(64)
        self.sh, self.sd = self._mapped(64)
        self.ih, idp = self._mapped(nb)
        self.oh, self.od = self._mapped(nb)
        self.word, self.sigw = self.wh.view(np.uint64), self.sh.view(np.uint64)
        self.cancel = cupyx.zeros_pinned((1,), np.int32)
        mem = cp.cuda.UnownedMemory(idp, nb, self.ih)
        xin = torch.from_dlpack(cp.ndarray(shape, cp.float32, cp.cuda.MemoryPointer(mem, 0)))
        ws = [torch.from_numpy(w).cuda() for w in chain_weights(chain, N)]
        self.st = torch.cuda.Stream()
        with torch.cuda.stream(self.st):
            _apply(chain, xin, ws)
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=self.st):
                self.y = _apply(chain, xin, ws)  # its address is fixed for every replay
        # folded: the gate, the chain, the commit and a signal whose value is a device frame
        # counter in one graph (as an armed runner's graph holds the whole frame); its input
        # read in place from mapped host memory, or copied in first by DMA or by a kernel
        self.ctr, self.fgate, self.zero = cp.zeros(1, cp.uint64), cp.zeros(1, cp.int32), cp.zeros(1, cp.int32)
        self.xdev = torch.empty(shape, dtype=torch.float32, device="cuda")
        self.fgraphs = {how: self._fold(chain, xin, ws, ksc, how, idp) for how in ("mapped", "dma", "kernel")}
        self.stream = cp.cuda.ExternalStream(self.st.cuda_stream)
        self.side = cp.cuda.Stream(non_blocking=True)
        self.ev = cp.cuda.Event(block=False, disable_timing=True)
        self.gates = cp.zeros(AHEAD, cp.int32)
        self.hostfn = cu.CUhostFn(lowlevel.host_wake_fn())
        self.cs = cu.CUstream(self.st.cuda_stream)

    def _fold(self, chain: Chain, xin: Any, ws: list[Any], ksc: Any, how: str, idp: int) -> Any:
        cp, torch = self.cp, self.torch
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.st), torch.cuda.graph(g, stream=self.st):
            s = cp.cuda.ExternalStream(self.st.cuda_stream)
            self.kg((1,), (1,), (np.uint64(self.cancel.ctypes.data), self.fgate), stream=s)
            x = xin
            if how == "dma":
                cp.cuda.runtime.memcpyAsync(self.xdev.data_ptr(), idp, self.nb, 4, s.ptr)
                x = self.xdev
            elif how == "kernel":
                args = (np.uint64(self.xdev.data_ptr()), np.uint64(idp), np.uint64(self.nb), self.zero)
                self.kc((4,), (256,), args, stream=s)
                x = self.xdev
            yf = _apply(chain, x, ws)
            args = (np.uint64(self.od), np.uint64(yf.data_ptr()), np.uint64(self.nb), self.fgate)
            self.kc((4,), (256,), args, stream=s)
            ksc((1,), (1,), (np.uint64(self.sd), self.ctr, self.fgate), stream=s)
        g.keep = yf
        return g

    def _mapped(self, nbytes: int) -> tuple[Any, int]:
        import cupyx

        h = cupyx.zeros_pinned((nbytes,), np.uint8)
        _err, d = self.cu.cuMemHostGetDevicePointer(h.ctypes.data, 0)
        return h, int(d)

    def enqueue(self, f: int, v: dict[str, Any]) -> None:
        cu = self.cu
        gt = self.gates[f % AHEAD : f % AHEAD + 1]
        if v.get("folded"):
            geq = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
            cu.cuStreamWaitValue64(self.cs, cu.CUdeviceptr(self.wd), cu.cuuint64_t(f), geq)
            self.fgraphs[v["folded"]].replay()
            self._wake(v)
            return
        if v.get("wait", True):
            geq = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
            cu.cuStreamWaitValue64(self.cs, cu.CUdeviceptr(self.wd), cu.cuuint64_t(f), geq)
        if v.get("gate", True):
            self.kg((1,), (1,), (np.uint64(self.cancel.ctypes.data), gt), stream=self.stream)
        if v.get("graph", True):
            self.graph.replay()
        if v.get("commit", True):
            args = (np.uint64(self.od), np.uint64(self.y.data_ptr()), np.uint64(self.nb), gt)
            self.kc((4,), (256,), args, stream=self.stream)
        if v.get("signal") == "memop":
            flag = cu.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
            cu.cuStreamWriteValue64(self.cs, cu.CUdeviceptr(self.sd), cu.cuuint64_t(f), flag)
        else:
            self.ks((1,), (1,), (np.uint64(self.sd), np.uint64(f), gt), stream=self.stream)
        self._wake(v)

    def _wake(self, v: dict[str, Any]) -> None:
        cu = self.cu
        hf = v.get("hostfn", "inline")
        if hf == "inline":
            cu.cuLaunchHostFunc(self.cs, self.hostfn, self.sh.ctypes.data)
        elif hf == "side":
            self.ev.record(self.stream)
            self.side.wait_event(self.ev)
            cu.cuLaunchHostFunc(cu.CUstream(self.side.ptr), self.hostfn, self.sh.ctypes.data)

    def run(self, v: dict[str, Any], frames: int, warm: int = 30) -> dict[str, float]:
        torch = self.torch
        self.word[0] = 0
        self.sigw[0] = 0
        self.ctr.fill(0)
        torch.cuda.synchronize()
        nxt, ts = 1, []
        x = np.random.default_rng(1).standard_normal(self.shape).astype(np.float32)
        out = np.empty_like(x)
        with torch.cuda.stream(self.st):
            for f in range(1, frames + warm + 1):
                while nxt <= f + AHEAD - 1:
                    self.enqueue(nxt, v)
                    nxt += 1
                t0 = time.perf_counter_ns()
                self.ih.view(np.float32)[:] = x.ravel()
                self.word[0] = f
                while self.sigw[0] < f:
                    pass
                out[...] = self.oh.view(np.float32).reshape(self.shape)
                ts.append(time.perf_counter_ns() - t0)
        self.word[0] = 1 << 62  # the frames queued ahead pass
        torch.cuda.synchronize()
        self.side.synchronize()
        a = np.array(ts[warm:]) / 1e3
        return {
            "p50_us": float(np.median(a)),
            "p10_us": float(np.percentile(a, 10)),
            "p90_us": float(np.percentile(a, 90)),
        }


def run(frames: int, rounds: int = 2, chain: str = "small") -> dict[str, Any]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    ch, shape = CHAINS[chain]
    res: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "gpu": torch.cuda.get_device_name(0),
        "chain": chain,
        "frames": frames,
        "anchor": torch_anchor(ch, shape, N, frames, True)[0],
    }
    rig = _Rig(ch, shape)
    for _ in range(rounds):
        for name, v in VARIANTS.items():
            res.setdefault(name, []).append(rig.run(v, frames))
    return res


def report(res: dict[str, Any]) -> str:
    what = "small chain 64x64" if res.get("chain", "small") == "small" else "one add1 stage, 16 floats"
    lines = [f"armed frame parts, {what} ({res['gpu']}, {res['when']}): p50 [p10-p90] us"]

    def one(r: dict[str, float]) -> str:
        return f"{r['p50_us']:.1f} [{r['p10_us']:.1f}-{r['p90_us']:.1f}]"

    for k, v in res.items():
        if isinstance(v, list):
            lines.append(f"{k:44s} " + "  ".join(one(r) for r in v))
        elif isinstance(v, dict):
            lines.append(f"{k:44s} {one(v)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("-o", "--out", default="benchmarks/results")
    ap.add_argument("--frames", type=int, default=400)
    ap.add_argument("--chain", choices=sorted(CHAINS), default="small")
    a = ap.parse_args(argv)
    res = run(a.frames, chain=a.chain)
    print(report(res))
    os.makedirs(a.out, exist_ok=True)
    tag = "" if a.chain == "small" else f"-{a.chain}"
    path = os.path.join(a.out, f"armed-parts{tag}-{time.strftime('%Y-%m-%d-%H%M')}.json")
    with open(path, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
