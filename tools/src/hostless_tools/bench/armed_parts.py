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
``minimal``: the wait, the graph and a stream-write signal alone); ``anchor``: the whole-chain
CUDA graph replay with pinned host I/O.  Two rounds; p50 [p10-p90] per variant; JSON
``armed-parts-<time>.json`` under DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

from hostless_tools.bench.gpu_stage_anchors import SMALL, _apply, chain_weights, torch_anchor

N = 64
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
"""


class _Rig:
    """The mapped host words and buffers, the captured chain and the kernels."""

    def __init__(self) -> None:
        import cupy as cp
        import cupyx
        import torch
        from cuda.bindings import driver as cu

        from hostless import lowlevel

        self.cp, self.cu, self.torch = cp, cu, torch
        mod = cp.RawModule(code=_KERNELS)
        self.kg, self.kc, self.ks = (mod.get_function(k) for k in ("gate", "commit", "sig"))
        nb = N * N * 4
        self.wh, self.wd = self._mapped(64)
        self.sh, self.sd = self._mapped(64)
        self.ih, idp = self._mapped(nb)
        self.oh, self.od = self._mapped(nb)
        self.word, self.sigw = self.wh.view(np.uint64), self.sh.view(np.uint64)
        self.cancel = cupyx.zeros_pinned((1,), np.int32)
        mem = cp.cuda.UnownedMemory(idp, nb, self.ih)
        xin = torch.from_dlpack(cp.ndarray((N, N), cp.float32, cp.cuda.MemoryPointer(mem, 0)))
        ws = [torch.from_numpy(w).cuda() for w in chain_weights(SMALL, N)]
        self.st = torch.cuda.Stream()
        with torch.cuda.stream(self.st):
            _apply(SMALL, xin, ws)
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=self.st):
                self.y = _apply(SMALL, xin, ws)  # its address is fixed for every replay
        self.stream = cp.cuda.ExternalStream(self.st.cuda_stream)
        self.side = cp.cuda.Stream(non_blocking=True)
        self.ev = cp.cuda.Event(block=False, disable_timing=True)
        self.gates = cp.zeros(AHEAD, cp.int32)
        self.hostfn = cu.CUhostFn(lowlevel.host_wake_fn())
        self.cs = cu.CUstream(self.st.cuda_stream)

    def _mapped(self, nbytes: int) -> tuple[Any, int]:
        import cupyx

        h = cupyx.zeros_pinned((nbytes,), np.uint8)
        _err, d = self.cu.cuMemHostGetDevicePointer(h.ctypes.data, 0)
        return h, int(d)

    def enqueue(self, f: int, v: dict[str, Any]) -> None:
        cu = self.cu
        gt = self.gates[f % AHEAD : f % AHEAD + 1]
        if v.get("wait", True):
            geq = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
            cu.cuStreamWaitValue64(self.cs, cu.CUdeviceptr(self.wd), cu.cuuint64_t(f), geq)
        if v.get("gate", True):
            self.kg((1,), (1,), (np.uint64(self.cancel.ctypes.data), gt), stream=self.stream)
        self.graph.replay()
        if v.get("commit", True):
            args = (np.uint64(self.od), np.uint64(self.y.data_ptr()), np.uint64(N * N * 4), gt)
            self.kc((4,), (256,), args, stream=self.stream)
        if v.get("signal") == "memop":
            flag = cu.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
            cu.cuStreamWriteValue64(self.cs, cu.CUdeviceptr(self.sd), cu.cuuint64_t(f), flag)
        else:
            self.ks((1,), (1,), (np.uint64(self.sd), np.uint64(f), gt), stream=self.stream)
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
        torch.cuda.synchronize()
        nxt, ts = 1, []
        x = np.random.default_rng(1).standard_normal((N, N)).astype(np.float32)
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
                out[...] = self.oh.view(np.float32).reshape(N, N)
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


def run(frames: int, rounds: int = 2) -> dict[str, Any]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    res: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "gpu": torch.cuda.get_device_name(0),
        "frames": frames,
        "anchor": torch_anchor(SMALL, (N, N), N, frames, True)[0],
    }
    rig = _Rig()
    for _ in range(rounds):
        for name, v in VARIANTS.items():
            res.setdefault(name, []).append(rig.run(v, frames))
    return res


def report(res: dict[str, Any]) -> str:
    lines = [f"armed frame parts, small chain {N}x{N} ({res['gpu']}, {res['when']}): p50 [p10-p90] us"]

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
    a = ap.parse_args(argv)
    res = run(a.frames)
    print(report(res))
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"armed-parts-{time.strftime('%Y-%m-%d-%H%M')}.json")
    with open(path, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
