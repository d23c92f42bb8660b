"""Stage functions of the cluster tests (a module, so every node's agents import it by name)."""

from __future__ import annotations

import numpy as np


def tanh_scale(x: np.ndarray, a: float) -> np.ndarray:
    return np.tanh(x) * np.float32(a)


def refuse_negative(x: np.ndarray) -> np.ndarray:
    """Fails its frame when the first value is negative (a bad frame), else copies."""
    if float(x.flat[0]) < 0:
        raise ValueError(f"refuse_negative: first value {float(x.flat[0])} < 0")
    return x.copy()
