"""GPU stage functions for tests/gpu/test_gpu_stages.py (the cuda agent imports them by name)."""

from __future__ import annotations

from typing import Any

import numpy as np


def t_affine(x: Any, w: Any, b: float) -> Any:
    """PyTorch: x @ w + b (cuBLAS: captured by PyTorch)."""
    return x @ w + b


def t_relu(x: Any) -> Any:
    import torch

    return torch.relu(x)


def t_softmax(x: Any) -> Any:
    import torch

    return torch.softmax(x, dim=-1)


def t_scale_out(x: Any, a: float, out: Any) -> None:
    """Writes ``out`` in place (the ``out=`` contract)."""
    import torch

    torch.mul(x, a, out=out)


def t_checked(x: Any) -> Any:
    """Reads a value on the host (cannot be captured: runs eagerly) and raises on a hot frame."""
    if float(x.max()) > 100.0:
        raise ValueError("frame too hot: max above 100")
    return x * 2


def t_wrong_shape(x: Any) -> Any:
    return x[:1]


def c_norm(x: Any, mean: float, std: float) -> Any:
    """CuPy elementwise: captured."""
    return (x - mean) / std


def c_gemm(x: Any, w: Any) -> Any:
    """CuPy GEMM (cuBLAS refuses CuPy's capture: eager, with the reason in plan())."""
    return x @ w


def ref_affine(x: np.ndarray, w: np.ndarray, b: float) -> np.ndarray:
    return x @ w + b


def ref_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def cpu_double(x: np.ndarray) -> np.ndarray:
    return x * 2


def cpu_fail_on_negative(x: np.ndarray) -> np.ndarray:
    if (x < 0).any():
        raise ValueError("negative input")
    return x
