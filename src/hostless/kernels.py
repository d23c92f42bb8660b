"""Kernel registries of the agents.

CPU agents run NumPy kernels named by id; the emulated NPU exposes compute
units (CUs) as a loaded xclbin would.  A kernel gets its buffers (NumPy views
into the shared heap, no copy) and its 64-bit scalars, and writes its outputs
in place.  It raises ValueError on bad arguments: the agent then fails the
command with ERROR and carries on.  Kernels whose work grows faster than
their buffers (gemm, conv2d) refuse more than ``MAX_WORK`` multiply-adds, so
that a hostile shape cannot hold an agent for hours.

Buffer convention: inputs first, the output last.

Ids, CU indices and limits are the ABI header's (``hostless_kernels.h``,
through the extension's constant table), which the C kernels
(``core/kernels.c``) and the GPU command processor (``agents/gpucp.cu``)
read too.
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Callable, Sequence

import numpy as np

from ._abi import C

__all__ = ["CPU_KERNELS", "NPU_CUS", "kernel_id", "cu_index", "f64", "as_f64", "Kernel", "check_stage"]

Kernel = Callable[[Sequence[np.ndarray], Sequence[int]], None]


def f64(x: float) -> int:
    """A float as the raw 64-bit scalar word kernels receive."""
    return int(struct.unpack("<Q", struct.pack("<d", float(x)))[0])


def as_f64(word: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", word & 0xFFFFFFFFFFFFFFFF))[0])


MAX_WORK = int(C.K_MAX_WORK)
"""Multiply-adds one gemm / conv2d call may do (a 2048^3 GEMM is 2**33)."""


def _need(bufs: Sequence[np.ndarray], n: int, name: str) -> None:
    if len(bufs) != n:
        raise ValueError(f"{name} takes {n} buffers, got {len(bufs)}")


def _work(name: str, *dims: int) -> None:
    w = 1
    for d in dims:
        w *= max(int(d), 0)
    if w > MAX_WORK:
        raise ValueError(f"{name}: {w} multiply-adds is more than MAX_WORK ({MAX_WORK})")


def k_copy(b: Sequence[np.ndarray], s: Sequence[int]) -> None:
    """copy(src) -> dst: the bytes of ``src`` into ``dst`` (same byte size; any dtypes). No scalars."""
    _need(b, 2, "copy")
    src, dst = b[0].reshape(-1).view(np.uint8), b[1].reshape(-1).view(np.uint8)
    if src.nbytes != dst.nbytes:
        raise ValueError(f"copy: {src.nbytes} bytes into {dst.nbytes}")
    np.copyto(dst, src)


def k_add(b: Sequence[np.ndarray], s: Sequence[int]) -> None:
    """add(a, b) -> out: ``a + b`` (NumPy broadcasting to the output's shape). No scalars."""
    _need(b, 3, "add")
    np.add(b[0], b[1], out=b[2])


def k_scale(b: Sequence[np.ndarray], s: Sequence[int]) -> None:
    """scale(x) -> out: ``x * factor``; one scalar, ``factor`` (a float; an int is read as one)."""
    _need(b, 2, "scale")
    if len(s) != 1:
        raise ValueError("scale takes one scalar (f64)")
    np.multiply(b[0], as_f64(s[0]), out=b[1], casting="unsafe")


def k_relu(b: Sequence[np.ndarray], s: Sequence[int]) -> None:
    """relu(x) -> out: ``max(x, 0)`` elementwise. No scalars."""
    _need(b, 2, "relu")
    np.maximum(b[0], 0, out=b[1])


def k_gemm(b: Sequence[np.ndarray], s: Sequence[int]) -> None:
    """gemm(a, w) -> out: the matrix product of (m, k) and (k, n) into (m, n). No scalars."""
    _need(b, 3, "gemm")
    a, w, out = b
    if a.ndim != 2 or w.ndim != 2 or a.shape[1] != w.shape[0] or out.shape != (a.shape[0], w.shape[1]):
        raise ValueError(f"gemm: shapes {a.shape} @ {w.shape} -> {out.shape} do not match")
    _work("gemm", a.shape[0], a.shape[1], w.shape[1])
    np.matmul(a, w, out=out)


def k_sum(b: Sequence[np.ndarray], s: Sequence[int]) -> None:
    """sum(x) -> out: the sum of every element of ``x`` into ``out``'s first element. No scalars."""
    _need(b, 2, "sum")
    b[1].reshape(-1)[0] = b[0].sum()


def k_softmax(b: Sequence[np.ndarray], s: Sequence[int]) -> None:
    """softmax(x) -> out: softmax over the last axis, computed in float32. No scalars."""
    _need(b, 2, "softmax")
    x = b[0].astype(np.float32, copy=False)
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    np.divide(e, e.sum(axis=-1, keepdims=True), out=b[1], casting="unsafe")


def k_conv2d(b: Sequence[np.ndarray], s: Sequence[int]) -> None:
    """conv2d(image, kernel) -> out: valid 2-D correlation of an (H, W) image with a
    (kh, kw) kernel into (H - kh + 1, W - kw + 1). No scalars."""
    _need(b, 3, "conv2d")
    img, ker, out = b
    if img.ndim != 2 or ker.ndim != 2:
        raise ValueError("conv2d takes 2-D image and kernel")
    kh, kw = ker.shape
    oh, ow = img.shape[0] - kh + 1, img.shape[1] - kw + 1
    if oh < 1 or ow < 1 or out.shape != (oh, ow):
        raise ValueError(f"conv2d: output must be {(oh, ow)}, got {out.shape}")
    _work("conv2d", oh, ow, kh, kw)
    win = np.lib.stride_tricks.sliding_window_view(img, (kh, kw))
    np.einsum("ijkl,kl->ij", win, ker, out=out, casting="unsafe")


def k_normalize(b: Sequence[np.ndarray], s: Sequence[int]) -> None:
    """normalize(x) -> out: ``(x - mean) / std`` into a float output (a camera preprocess
    step).  Scalars: ``mean`` (default 0.0) and ``std`` (default 1.0, not zero), floats."""
    _need(b, 2, "normalize")
    mean = as_f64(s[0]) if len(s) > 0 else 0.0
    std = as_f64(s[1]) if len(s) > 1 else 1.0
    if std == 0:
        raise ValueError("normalize: std is zero")
    np.subtract(b[0], mean, out=b[1], casting="unsafe")
    b[1] /= std


def k_int8_gemm(b: Sequence[np.ndarray], s: Sequence[int]) -> None:
    """int8_gemm(a, w) -> out: int8 (m, k) x int8 (k, n) -> int32 (m, n) (NPU CU 0). No scalars."""
    _need(b, 3, "int8_gemm")
    a, w, out = b
    if a.dtype != np.int8 or w.dtype != np.int8 or out.dtype != np.int32:
        raise ValueError("int8_gemm takes int8 inputs and an int32 output")
    if a.ndim == 2 and w.ndim == 2:
        _work("int8_gemm", a.shape[0], a.shape[1], w.shape[1])  # before the int32 copies
    k_gemm([a.astype(np.int32), w.astype(np.int32), out], s)


CPU_KERNELS: dict[str, tuple[int, Kernel]] = {
    "copy": (int(C.CK_COPY), k_copy),
    "add": (int(C.CK_ADD), k_add),
    "scale": (int(C.CK_SCALE), k_scale),
    "relu": (int(C.CK_RELU), k_relu),
    "gemm": (int(C.CK_GEMM), k_gemm),
    "sum": (int(C.CK_SUM), k_sum),
    "softmax": (int(C.CK_SOFTMAX), k_softmax),
    "conv2d": (int(C.CK_CONV2D), k_conv2d),
    "normalize": (int(C.CK_NORMALIZE), k_normalize),
}

# The emulated NPU's "xclbin": compute units by index.
NPU_CUS: dict[str, tuple[int, Kernel]] = {
    "int8_gemm": (int(C.NPU_CU_INT8_GEMM), k_int8_gemm),
    "gemm": (int(C.NPU_CU_GEMM), k_gemm),
    "relu": (int(C.NPU_CU_RELU), k_relu),
    "softmax": (int(C.NPU_CU_SOFTMAX), k_softmax),
    "conv2d": (int(C.NPU_CU_CONV2D), k_conv2d),
    "copy": (int(C.NPU_CU_COPY), k_copy),
}

Shape = tuple[int, ...]


def check_stage(
    kernel: str, ins: Sequence[tuple[Shape, np.dtype]], out: tuple[Shape, np.dtype], nscalars: int
) -> None:
    """ValueError, saying why, when built-in ``kernel`` (a cpu kernel, NPU CU or CUDA kernel
    of that name) cannot run on inputs and an output of these shapes and dtypes with
    ``nscalars`` scalars: what the kernel itself would refuse at run time, found before."""
    shapes = [sh for sh, _ in ins]
    oshape, odt = out
    n_in = {
        "copy": 1,
        "add": 2,
        "scale": 1,
        "relu": 1,
        "gemm": 2,
        "sum": 1,
        "softmax": 1,
        "conv2d": 2,
        "normalize": 1,
        "int8_gemm": 2,
    }.get(kernel)
    if n_in is None:
        return  # a user kernel: its own business
    if len(ins) != n_in:
        raise ValueError(f"{kernel} takes {n_in} input(s), got {len(ins)}")
    max_scalars = {"scale": 1, "normalize": 2}.get(kernel, 0)
    if nscalars > max_scalars or (kernel == "scale" and nscalars != 1):
        takes = "one scalar" if kernel == "scale" else f"at most {max_scalars} scalar(s)"
        raise ValueError(f"{kernel} takes {takes}, got {nscalars}")
    if kernel == "copy":
        nb = int(np.prod(shapes[0])) * ins[0][1].itemsize
        if nb != int(np.prod(oshape)) * odt.itemsize:
            raise ValueError(f"copy: {nb} bytes into an output of {int(np.prod(oshape)) * odt.itemsize}")
    elif kernel == "add":
        try:
            b = np.broadcast_shapes(shapes[0], shapes[1], oshape)
        except ValueError:
            b = None
        if b != oshape:
            raise ValueError(f"add: {shapes[0]} + {shapes[1]} does not broadcast to the output {oshape}")
    elif kernel in ("scale", "relu", "softmax", "normalize"):
        if shapes[0] != oshape:
            raise ValueError(f"{kernel}: the output must have the input's shape {shapes[0]}, got {oshape}")
        if kernel == "normalize" and odt.kind != "f":
            raise ValueError(f"normalize: the output must be a float array, got {odt}")
    elif kernel in ("gemm", "int8_gemm"):
        a, w = shapes
        if len(a) != 2 or len(w) != 2 or a[1] != w[0] or oshape != (a[0], w[1]):
            raise ValueError(f"{kernel}: shapes {a} @ {w} -> {oshape} do not match")
        if kernel == "int8_gemm" and (ins[0][1] != np.int8 or ins[1][1] != np.int8 or odt != np.int32):
            raise ValueError("int8_gemm takes int8 inputs and an int32 output")
    elif kernel == "conv2d":
        img, ker = shapes
        if len(img) != 2 or len(ker) != 2:
            raise ValueError("conv2d takes a 2-D image and a 2-D kernel")
        want = (img[0] - ker[0] + 1, img[1] - ker[1] + 1)
        if want[0] < 1 or want[1] < 1 or oshape != want:
            raise ValueError(f"conv2d: the output must be {want}, got {oshape}")
    elif kernel == "sum" and int(np.prod(oshape)) < 1:
        raise ValueError("sum: the output needs at least one element")


USER_KERNEL_BASE = int(C.K_USER_BASE)
LOAD_KERNEL = int(C.K_LOAD)
"""Kernel id that once asked a cpu agent, through its queue, to import a stage
function.  Refused by every agent now: a packet with it fails alone with ERROR
and a record, and nothing is imported; stage functions reach an agent only
through its spawner's private channel (:mod:`hostless.agents.control`)."""
FUNCTION_KERNEL_BASE = int(C.K_FUNCTION_BASE)
"""Ids from here on are stage functions loaded after spawn (``Agent.load_function``)."""


def kernel_id(name: str) -> int:
    """Id of a CPU kernel by name (KeyError lists the known ones)."""
    try:
        return CPU_KERNELS[name][0]
    except KeyError:
        raise KeyError(f"unknown cpu kernel {name!r}; known: {sorted(CPU_KERNELS)}") from None


def cu_index(name: str) -> int:
    """CU index of an NPU kernel by name."""
    try:
        return NPU_CUS[name][0]
    except KeyError:
        raise KeyError(f"unknown npu kernel {name!r}; known: {sorted(NPU_CUS)}") from None


def load_user_kernel(spec: str) -> Kernel:
    """'package.module:function' -> the function (user-registered kernels)."""
    mod, _, fn = spec.partition(":")
    if not mod or not fn:
        raise ValueError(f"user kernel spec {spec!r} must be 'module:function'")
    k: Kernel = getattr(importlib.import_module(mod), fn)
    return k


# ---------------------------------------------------------------------------
# CUDA kernels (CuPy): same ids as the CPU kernels; fn(inputs, scalars, out)
# computes into ``out`` (device scratch) on the current stream.


def _cuda_table() -> dict[int, Callable[..., None]]:
    import cupy as cp

    def need(ins: Sequence[object], n: int, name: str) -> None:
        if len(ins) != n:
            raise ValueError(f"{name} takes {n} inputs, got {len(ins)}")

    def copy(ins: Sequence[object], s: Sequence[int], out: object) -> None:
        need(ins, 1, "copy")
        src, dst = cp.asarray(ins[0]), cp.asarray(out)
        if src.nbytes != dst.nbytes:
            raise ValueError("copy: size mismatch")
        dst.view(cp.uint8).reshape(-1)[...] = src.view(cp.uint8).reshape(-1)

    def add(ins: Sequence[object], s: Sequence[int], out: object) -> None:
        need(ins, 2, "add")
        cp.add(ins[0], ins[1], out=out)

    def scale(ins: Sequence[object], s: Sequence[int], out: object) -> None:
        need(ins, 1, "scale")
        cp.multiply(ins[0], as_f64(s[0]), out=out, casting="unsafe")

    def relu(ins: Sequence[object], s: Sequence[int], out: object) -> None:
        need(ins, 1, "relu")
        cp.maximum(ins[0], 0, out=out)

    def gemm(ins: Sequence[object], s: Sequence[int], out: object) -> None:
        need(ins, 2, "gemm")
        a, w, o = cp.asarray(ins[0]), cp.asarray(ins[1]), cp.asarray(out)
        if a.ndim != 2 or w.ndim != 2 or a.shape[1] != w.shape[0] or o.shape != (a.shape[0], w.shape[1]):
            raise ValueError(f"gemm: shapes {a.shape} @ {w.shape} -> {o.shape} do not match")
        cp.matmul(a, w, out=o)

    def softmax(ins: Sequence[object], s: Sequence[int], out: object) -> None:
        need(ins, 1, "softmax")
        x = cp.asarray(ins[0]).astype(cp.float32, copy=False)
        e = cp.exp(x - x.max(axis=-1, keepdims=True))
        cp.divide(e, e.sum(axis=-1, keepdims=True), out=out, casting="unsafe")

    def normalize(ins: Sequence[object], s: Sequence[int], out: object) -> None:
        need(ins, 1, "normalize")
        mean = as_f64(s[0]) if len(s) > 0 else 0.0
        std = as_f64(s[1]) if len(s) > 1 else 1.0
        cp.divide(cp.subtract(ins[0], mean), std, out=out, casting="unsafe")

    def conv2d(ins: Sequence[object], s: Sequence[int], out: object) -> None:
        need(ins, 2, "conv2d")
        img, ker, o = cp.asarray(ins[0]), cp.asarray(ins[1]), cp.asarray(out)
        kh, kw = ker.shape
        acc = cp.zeros(o.shape, dtype=cp.float32)
        for i in range(kh):
            for j in range(kw):
                acc += img[i : i + o.shape[0], j : j + o.shape[1]] * ker[i, j]
        o[...] = acc

    return {
        CPU_KERNELS["copy"][0]: copy,
        CPU_KERNELS["add"][0]: add,
        CPU_KERNELS["scale"][0]: scale,
        CPU_KERNELS["relu"][0]: relu,
        CPU_KERNELS["gemm"][0]: gemm,
        CPU_KERNELS["softmax"][0]: softmax,
        CPU_KERNELS["normalize"][0]: normalize,
        CPU_KERNELS["conv2d"][0]: conv2d,
    }


CUDA_KERNEL_NAMES = ("copy", "add", "scale", "relu", "gemm", "softmax", "normalize", "conv2d")
