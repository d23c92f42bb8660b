"""Armed GPU segments, old build against new in one session (GPU, PyTorch):
``python -m hostless_tools.bench.armed_ab --label L [--frames N] [-o DIR]``.

Runs, direct+shared with one frame in flight, on the hostless that Python imports (an old build
through ``PYTHONPATH=<its site folder>``, the new one without): the small 6-stage PyTorch chain
at 64x64 (``small``); a 16-float chain cpu copy -> GPU ``add1`` -> cpu copy (``cpu-gpu-cpu``) and
the same without the GPU stage (``cpu-cpu``; their difference is the GPU leg); one GPU stage
alone (``gpu``); and the small chain's whole-chain CUDA graph replay with pinned host I/O as the
anchor.  p50, p10, p90 per row; JSON ``armed-ab-<label>.json`` under DIR.  Run the labels one
after another on one machine and compare them only there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

N = 64


def run(frames: int) -> dict[str, Any]:
    import torch

    import hostless as hl
    from hostless import agents
    from hostless_tools.bench.gpu_stage_anchors import SMALL, torch_anchor
    from hostless_tools.bench.gpu_stages import _graph, chain16, hostless_rows

    torch.backends.cuda.matmul.allow_tf32 = False
    res: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "gpu": torch.cuda.get_device_name(0),
        "hostless": os.path.dirname(hl.__file__),
        "frames": frames,
        "anchor_small_cuda_graph": torch_anchor(SMALL, (N, N), N, frames, True)[0],
    }
    direct = (("direct", "shared"),)
    name = f"hlab-{os.getpid()}"
    dom = hl.Domain.create(name, heap="1G", device_heaps={"cuda:0": 1 << 30}, spin=500e-6)
    x = np.random.default_rng(1).standard_normal((N, N)).astype(np.float32)
    try:
        gpu = agents.spawn(dom, "cuda", device=0, timeout=120, spin=50e-6)
        cpu = agents.spawn(dom, "cpu", spin=50e-6)
        try:
            rows: dict[str, Any] = {}
            g = _graph(dom, gpu, SMALL, (N, N), N, "torch")
            rows["small"] = hostless_rows(g, {"x0": x}, f"x{len(SMALL)}", frames, direct)["direct+shared"]
            for nm, kinds in (("cpu-gpu-cpu", "cgc"), ("cpu-cpu", "cc"), ("gpu", "g")):
                rows[nm] = chain16(dom, cpu, gpu, kinds, frames)
            for k in rows:
                rows[k] = {kk: vv for kk, vv in rows[k].items() if kk not in ("out", "plan")}
            res["rows"] = rows
        finally:
            gpu.stop()
            cpu.stop()
    finally:
        dom.close()
        hl.Domain.unlink(name)
    r = res["rows"]
    res["small_over_anchor"] = r["small"]["p50_us"] / res["anchor_small_cuda_graph"]["p50_us"]
    res["gpu_leg_us"] = r["cpu-gpu-cpu"]["p50_us"] - r["cpu-cpu"]["p50_us"]
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("-o", "--out", default="benchmarks/results")
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--label", default="new")
    a = ap.parse_args(argv)
    res = run(a.frames)
    p50 = {k: round(v["p50_us"], 1) for k, v in res["rows"].items()}
    print(
        f"{a.label}: {p50}; anchor {res['anchor_small_cuda_graph']['p50_us']:.1f} us; "
        f"small/anchor {res['small_over_anchor']:.2f}x; GPU leg {res['gpu_leg_us']:.1f} us"
    )
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"armed-ab-{a.label}.json"), "w") as fh:
        json.dump(res, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
