"""The stage functions of ``hostless_tools.bench.gpu_stages`` (a cuda agent imports them by name).

PyTorch ones take tensors, CuPy ones arrays; each is what a user would write.  TF32 is
off for PyTorch here and in the anchors, so both compute the same FP32 GEMMs.
"""

from __future__ import annotations

from typing import Any

try:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
except ImportError:  # the bench skips the PyTorch rows
    torch = None


def gemm(x: Any, w: Any) -> Any:
    return x @ w


def relu(x: Any) -> Any:
    return torch.relu(x)


def normalize(x: Any, mean: float, std: float) -> Any:
    return (x - mean) / std


def softmax(x: Any) -> Any:
    return torch.softmax(x, dim=-1)


def scale(x: Any, a: float) -> Any:
    return x * a


def add1(x: Any) -> Any:
    return x + 1


def frame_from_seed(seed: Any, n: int) -> Any:
    """A device-resident frame made on the GPU from a one-element host seed (the camera
    stand-in of the device-resident chain)."""
    return seed.expand(n, n) * torch.ones((n, n), device=seed.device) + 0.5


def row_sums(x: Any) -> Any:
    return x.sum(dim=-1)


# CuPy
def c_normalize(x: Any, mean: float, std: float) -> Any:
    return (x - mean) / std


def c_relu(x: Any) -> Any:
    import cupy as cp

    return cp.maximum(x, 0)


def c_scale(x: Any, a: float) -> Any:
    return x * a
