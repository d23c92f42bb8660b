"""User-registered kernels for tests/agents/test_agents.py.

An agent imports this module by name (``user_kernels={"axpy":
"hl_user_kernels:axpy"}``); the tests put this folder on the agent's
PYTHONPATH.  A kernel takes ``(buffers, scalars)``, buffers being NumPy views
of shared-heap buffers (inputs first, the output last) and scalars raw u64
words, and writes its output in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hostless.kernels import as_f64


def axpy(bufs: Sequence[np.ndarray], scalars: Sequence[int]) -> None:
    """out = a * x + y, with ``a`` an f64 scalar."""
    if len(bufs) != 3 or len(scalars) != 1:
        raise ValueError("axpy takes x, y, out and one scalar")
    x, y, out = bufs
    np.multiply(x, as_f64(scalars[0]), out=out)
    out += y


def fail(bufs: Sequence[np.ndarray], scalars: Sequence[int]) -> None:
    """Always raises: the agent must fail the command with ERROR and go on."""
    raise RuntimeError("user kernel failed on purpose")
