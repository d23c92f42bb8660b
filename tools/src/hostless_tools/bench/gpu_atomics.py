"""Are the GPU's system-scope atomics on host memory atomic against the host's?

``python -m hostless_tools.bench.gpu_atomics [-o DIR]`` on a machine with a GPU and gcc.  One
word of mapped pinned host memory; a GPU thread does ``n`` ``atomicAdd_system`` (then ``n``
``atomicCAS_system`` increments) while a host thread does ``n`` ``lock xadd`` (then CAS
increments) on the same word.  With native host atomics (NVLink-C2C) or PCIe AtomicOps the
word ends at ``2n``; without them updates are lost.  hostless's rule that the GPU pushes
nothing into a queue in a graph with armed segments (docs/gpu.md) rests on this measurement.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

_HOST = r"""
#include <stdint.h>
void add_loop(uint64_t *p, long n) {
    for (long i = 0; i < n; i++) __atomic_fetch_add(p, 1, __ATOMIC_SEQ_CST);
}
void cas_loop(uint64_t *p, long n) {
    for (long i = 0; i < n; i++) {
        uint64_t e = __atomic_load_n(p, __ATOMIC_SEQ_CST);
        while (!__atomic_compare_exchange_n(p, &e, e + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    }
}
"""

_GPU = r"""
extern "C" __global__ void g_add(unsigned long long *p, long n) {
    for (long i = 0; i < n; i++) atomicAdd_system(p, 1ull);
}
extern "C" __global__ void g_cas(unsigned long long *p, long n) {
    for (long i = 0; i < n; i++) {
        unsigned long long e = *(volatile unsigned long long *)p, o;
        while ((o = atomicCAS_system(p, e, e + 1)) != e) e = o;
    }
}
"""


def run(n: int = 200_000) -> dict[str, Any]:
    import cupy as cp
    import cupyx

    with tempfile.TemporaryDirectory() as d:
        src, so = os.path.join(d, "at.c"), os.path.join(d, "at.so")
        with open(src, "w") as f:
            f.write(_HOST)
        subprocess.check_call(["gcc", "-O2", "-shared", "-fPIC", "-o", so, src])
        lib = ctypes.CDLL(so)
    mod = cp.RawModule(code=_GPU)
    out: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "host_native_atomic_supported": int(cp.cuda.runtime.deviceGetAttribute(86, 0)),
        "n_each": n,
    }
    for name, kern, host in (
        ("add", mod.get_function("g_add"), lib.add_loop),
        ("cas", mod.get_function("g_cas"), lib.cas_loop),
    ):
        w = cupyx.zeros_pinned((8,), np.uint64)
        kern((1,), (1,), (w.ctypes.data, np.int64(n)))
        host(ctypes.c_void_p(w.ctypes.data), ctypes.c_long(n))
        cp.cuda.runtime.deviceSynchronize()
        got = int(w[0])
        out[name] = {
            "expected": 2 * n,
            "got": got,
            "lost": 2 * n - got,
            "lost_fraction": (2 * n - got) / (2 * n),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("-o", "--out", default=None, help="write gpu-atomics-<date>.json here")
    ap.add_argument("-n", type=int, default=200_000)
    a = ap.parse_args(argv)
    res = run(a.n)
    print(json.dumps(res, indent=1))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"gpu-atomics-{time.strftime('%Y-%m-%d-%H%M')}.json"), "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
