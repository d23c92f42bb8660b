"""A copy by DMA that runs only when a device gate is open, inside a captured CUDA graph.

An armed GPU frame (:mod:`hostless.agents.cuda_armed`) commits its result into the output
buffer only when its gate is open (every input succeeded, the slot still runs this frame).
A kernel can read the gate and skip its stores (``hl_commit`` in :mod:`hostless.cuda`), but the
copy engines move a large result without taking SMs from the user's work, and a DMA cannot
read the gate itself.  So :func:`capture` captures two
things on the capturing stream: a one-thread kernel that sets a conditional handle from the gate
(``cudaGraphSetConditional``), then a conditional IF node (CUDA 12.4 and later) whose body is
the memcpy node.  Replays copy when the gate is open and skip the copy when it is closed.

:func:`why_not` says, once per process, whether this works here: it compiles the kernel and
captures, replays and checks a 16-byte gated copy both ways.  Where it does not (an older
driver, bindings without conditional nodes), callers commit by kernel as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["capture", "why_not"]

_KERNEL = r"""
extern "C" __global__ void hl_gate_cond(unsigned long long handle, const int *gate) {
    cudaGraphSetConditional((cudaGraphConditionalHandle)handle,
                            *(volatile const int *)gate == 0 ? 1u : 0u);
}
"""

_state: dict[int, Any] = {}  # device ordinal -> the kernel, or the reason it cannot be used


def _rt() -> Any:
    from cuda.bindings import runtime

    return runtime


def _ok(r: Any, what: str) -> Any:
    """cuda.bindings returns (err, *values): raise on an error, return the values."""
    rt = _rt()
    r = r if isinstance(r, tuple) else (r,)
    if r[0] != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"{what} failed: {r[0]}")
    return r[1:] if len(r) > 2 else (r[1] if len(r) == 2 else None)


def _kernel(cp: Any) -> Any:
    return cp.RawModule(code=_KERNEL, options=("--std=c++14",)).get_function("hl_gate_cond")


def capture(cp: Any, dst: int, src: int, n: int, gate: Any, stream: int) -> None:
    """Capture, on ``stream`` (capturing), a copy of ``n`` bytes from device address ``src`` to
    ``dst`` that runs only when the device int32 ``gate`` is 0 at that point of the replay.
    Only after :func:`why_not` returned None for this device."""
    rt = _rt()
    k = _state[cp.cuda.Device().id]
    info = _ok(rt.cudaStreamGetCaptureInfo(stream), "cudaStreamGetCaptureInfo")
    graph = info[2]
    handle = _ok(rt.cudaGraphConditionalHandleCreate(graph, 0, 0), "cudaGraphConditionalHandleCreate")
    k((1,), (1,), (np.uint64(int(handle)), gate), stream=cp.cuda.ExternalStream(stream))
    info = _ok(rt.cudaStreamGetCaptureInfo(stream), "cudaStreamGetCaptureInfo")
    deps, ndeps = info[3], info[-1]
    p = rt.cudaGraphNodeParams()
    p.type = rt.cudaGraphNodeType.cudaGraphNodeTypeConditional
    p.conditional.handle = handle
    p.conditional.type = rt.cudaGraphConditionalNodeType.cudaGraphCondTypeIf
    p.conditional.size = 1
    node = _ok(rt.cudaGraphAddNode(graph, deps, None, ndeps, p), "cudaGraphAddNode")
    body = p.conditional.phGraph_out[0]
    kind = rt.cudaMemcpyKind.cudaMemcpyDefault
    _ok(rt.cudaGraphAddMemcpyNode1D(body, None, 0, dst, src, n, kind), "cudaGraphAddMemcpyNode1D")
    flags = rt.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies
    r = rt.cudaStreamUpdateCaptureDependencies(stream, [node], None, 1, flags)
    _ok(r, "cudaStreamUpdateCaptureDependencies")


def why_not(cp: Any) -> str | None:
    """None when :func:`capture` works on the current device, else why not (checked once per
    process and device: a 16-byte gated copy captured, replayed closed and open)."""
    dev = cp.cuda.Device().id
    got = _state.get(dev)
    if got is None:
        try:
            _state[dev] = _kernel(cp)
            _probe(cp)
            got = _state[dev]
        except Exception as e:  # the kernel, the bindings or the driver: commit by kernel
            got = _state[dev] = f"{type(e).__name__}: {e}"[:300]
            try:
                cp.cuda.runtime.getLastError()
            except Exception:
                pass
    return got if isinstance(got, str) else None


def _probe(cp: Any) -> None:
    rt = _rt()
    src = cp.arange(16, dtype=cp.uint8) + 1
    dst = cp.zeros(16, dtype=cp.uint8)
    gate = cp.ones(1, dtype=cp.int32)
    s = cp.cuda.Stream(non_blocking=True)
    _ok(rt.cudaStreamBeginCapture(s.ptr, rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed), "capture")
    try:
        capture(cp, dst.data.ptr, src.data.ptr, 16, gate, s.ptr)
    finally:
        g = _ok(rt.cudaStreamEndCapture(s.ptr), "cudaStreamEndCapture")
    ge = _ok(rt.cudaGraphInstantiate(g, 0), "cudaGraphInstantiate")
    try:
        _ok(rt.cudaGraphLaunch(ge, s.ptr), "cudaGraphLaunch")
        s.synchronize()
        if int(dst.sum()) != 0:
            raise RuntimeError("the gated copy ran with its gate closed")
        gate.fill(0)
        _ok(rt.cudaGraphLaunch(ge, s.ptr), "cudaGraphLaunch")
        s.synchronize()
        if not bool((dst == src).all()):
            raise RuntimeError("the gated copy did not run with its gate open")
    finally:
        rt.cudaGraphExecDestroy(ge)
        rt.cudaGraphDestroy(g)
