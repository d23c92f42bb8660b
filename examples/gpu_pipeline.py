"""A camera pipeline across CPU, GPU and NPU, with your own GPU code as stages.

camera frames (cpu agent, NumPy) -> preprocess (CuPy, on the cuda agent) -> a small CNN
written in PyTorch with random weights (nothing downloaded; on the same cuda agent: each is
captured as a CUDA graph, and the tensor between them stays in GPU memory) -> relu on the
emulated NPU (an ERT command) -> postprocess: softmax (cpu agent, NumPy).  Run in the four modes, checked
against the same math in NumPy/PyTorch on the host path, with a Perfetto trace in ./out/.

Needs a GPU, PyTorch and CuPy; otherwise it says why and exits 0 (``make demo`` runs it).
Run: ``python examples/gpu_pipeline.py``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

H, W, C, K = 64, 64, 3, 10  # frame size, channels, classes


def camera(seed: np.ndarray, out: np.ndarray) -> None:
    """cpu: a synthetic uint8 RGB frame from a frame counter."""
    yy, xx = np.mgrid[0:H, 0:W]
    k = int(seed[0])
    for c in range(C):
        out[..., c] = ((xx * (c + 1) + yy * 3 + 7 * k) % 256).astype(np.uint8)


def preprocess(frame: Any) -> Any:
    """CuPy: HWC uint8 -> CHW float32 in [-1, 1]."""
    import cupy as cp

    x = frame.astype(cp.float32).transpose(2, 0, 1) / 127.5 - 1.0
    return cp.ascontiguousarray(x)


_net: dict[int, Any] = {}


def _model(device: Any) -> Any:
    import torch

    if device.index not in _net:
        torch.manual_seed(0)  # random weights, the same in every process
        _net[device.index] = (
            torch.nn.Sequential(
                torch.nn.Conv2d(C, 8, 3, stride=2, padding=1),
                torch.nn.ReLU(),
                torch.nn.Conv2d(8, 16, 3, stride=2, padding=1),
                torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(1),
                torch.nn.Flatten(),
                torch.nn.Linear(16, K),
            )
            .to(device)
            .eval()
        )
    return _net[device.index]


def cnn(x: Any) -> Any:
    """PyTorch: the CNN's logits for one CHW frame, shape (1, K)."""
    import torch

    with torch.no_grad():
        return _model(x.device)(x.unsqueeze(0))


def postprocess(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def reference(k: int) -> np.ndarray:
    import torch

    frame = np.empty((H, W, C), np.uint8)
    camera(np.array([k], np.int32), frame)
    x = torch.from_numpy(frame.astype(np.float32).transpose(2, 0, 1) / 127.5 - 1.0).cuda()
    logits = cnn(x).cpu().numpy()
    return postprocess(np.maximum(logits, 0))


def main() -> int:
    try:
        import cupy  # noqa: F401
        import torch
    except ImportError as e:
        print(f"gpu_pipeline: skipped: {e} (needs PyTorch and CuPy)")
        return 0
    import hostless as hl
    from hostless import agents, trace
    from hostless.cuda import available
    from hostless.graph import Graph

    why = available()
    if why is not None or not torch.cuda.is_available():
        print(f"gpu_pipeline: skipped: no usable GPU ({why or 'torch sees none'})")
        return 0
    out_dir = Path("out")
    out_dir.mkdir(exist_ok=True)
    name = f"hl-gpu-pipeline-{os.getpid()}"
    dom = hl.Domain.create(
        name, heap="256M", trace="8M", device_heaps={"cuda:0": 64 << 20}, unlink_on_close=True
    )
    cpu = agents.spawn(dom, "cpu")
    gpu = agents.spawn(dom, "cuda", device=0, timeout=120)
    npu = agents.spawn(dom, "npu")
    try:
        g = Graph(dom).input("k", (1,), "i4")
        g.stage("camera", cpu, camera, ["k"], ("frame", (H, W, C), "u1"))
        g.stage("preprocess", gpu, preprocess, ["frame"], ("x", (C, H, W), "f4"), arrays="cupy")
        g.stage("cnn", gpu, cnn, ["x"], ("logits", (1, K), "f4"), arrays="torch")
        g.stage("relu", npu, "relu", ["logits"], ("act", (1, K), "f4"))
        g.stage("postprocess", cpu, postprocess, ["act"], ("probs", (1, K), "f4"))
        refs = {k: reference(k) for k in range(1, 9)}
        for dispatch, data in (
            ("host", "copy"),
            ("host", "shared"),
            ("direct", "copy"),
            ("direct", "shared"),
        ):
            with g.compile(dispatch=dispatch, data=data) as cg:
                if dispatch == "direct" and data == "shared":
                    print(cg.plan())
                ts = []
                for k in range(1, 9):
                    t0 = time.perf_counter()
                    p = cg.run({"k": np.array([k], np.int32)}, timeout=60)["probs"]
                    ts.append(time.perf_counter() - t0)
                    np.testing.assert_allclose(p, refs[k], rtol=1e-4, atol=1e-5)
                p50 = np.median(ts[1:]) * 1e6
                print(f"{dispatch}+{data}: 8 frames match the reference; p50 {p50:.0f} us a frame")
        n = trace.export(dom, str(out_dir / "gpu_pipeline_trace.json"))
        print(f"trace: out/gpu_pipeline_trace.json ({n} events)")
    finally:
        for a in (cpu, gpu, npu):
            a.stop()
        dom.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
