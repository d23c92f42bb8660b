"""GPU stages from your own functions, in the cuda agent: captured once, replayed per frame.

A graph's consecutive stages that run user functions on one cuda agent form a
*segment* (:mod:`hostless.segments` fuses them at compile time).  The spawner
loads a segment through the agent's private channel
(:mod:`hostless.agents.control`; never from the domain), then *prepares* it once
per frame slot with that slot's buffers.  Here, in the agent:

- **Load** (:class:`Segment`): each function is imported by name
  (:func:`hostless.stagefn.load`), run twice on zero tensors of the declared
  input shapes (so every kernel is compiled and loaded now, never behind a
  pending stream wait), its result checked against the stage's declared shape and
  dtype (a ValueError naming the stage otherwise), then the whole segment is
  captured once as a trial: what cannot be captured (CuPy's cuBLAS calls, a host
  synchronization inside a function) runs eagerly, and the reason travels back
  to :meth:`hostless.graph.CompiledGraph.plan`.
- **Prepare** (:class:`Runner`): the slot's buffers are imported and checked
  (dtype, shape, device: a device buffer must be on this agent's GPU, the output
  no input), and the segment is captured as one CUDA graph over them: inputs in
  host memory are copied in from the domain's registered (pinned) heap (by DMA,
  or by a kernel up to ``COPY_IN_KERNEL_MAX`` bytes), device buffers are read in
  place, intermediates live in the graph's private memory, and the result is
  copied into the output buffer (DMA to host memory).
- **Per frame** (``CudaLoop``): the packet's buffers select the prepared runner;
  the stream waits on the inputs' words on the GPU, the graph is replayed (or
  the functions run eagerly), the signal is stored by the GPU gated on the
  inputs, and the follow-ups are pushed by the GPU.  The agent process does not
  synchronize.

Failure semantics differ from the built-in kernels in one point: a replayed graph
cannot be skipped, so when an input failed the segment still runs and its output
buffer's contents are unspecified; its signal carries the input's failure, so
no reader that follows the protocol reads them.  An exception of an eagerly run
function fails the packet with ERROR and its traceback as the record.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import stagefn

__all__ = ["ARRAYS", "Segment", "Runner", "MAX_STAGES", "MAX_RUNNERS", "COPY_IN_KERNEL_MAX"]

ARRAYS = ("torch", "cupy")
"""What a GPU stage function takes and returns: PyTorch tensors or CuPy arrays."""
MAX_STAGES = 64
"""Stages in one segment (a bound on a load request)."""
MAX_RUNNERS = 64
"""Prepared runners (captured graphs) per segment: a packet whose buffers have none
gets one captured then, up to this many; past it the oldest is dropped."""
COPY_IN_KERNEL_MAX = int(os.environ.get("HOSTLESS_CUDA_COPY_IN_KERNEL_MAX", 64 << 10))
"""Host inputs up to this many bytes are copied into device memory by a kernel reading the
registered heap (one node that starts as soon as its predecessor ends), larger ones by DMA
(the copy engines' bandwidth, no SM); ``HOSTLESS_CUDA_COPY_IN_KERNEL_MAX=0`` copies every one
by DMA (for A/B runs)."""
_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the driver reads where each pointer lives (UVA)


def _shape(x: Any, what: str) -> tuple[int, ...]:
    if not isinstance(x, list) or len(x) > 16 or not all(isinstance(d, int) and 0 <= d < 2**40 for d in x):
        raise ValueError(f"{what}: a shape is a list of at most 16 non-negative ints, got {x!r}")
    return tuple(x)


def _dtype(x: Any, what: str) -> np.dtype:
    try:
        dt = np.dtype(str(x))
    except TypeError as e:
        raise ValueError(f"{what}: bad dtype {x!r}: {e}") from None
    if dt.kind not in "biuf" or dt.itemsize > 8:
        raise ValueError(f"{what}: dtype {dt} is not a bool, integer or float type")
    return dt


@dataclass
class _Stage:
    name: str
    fn: Callable[..., Any]
    scalars: list[Any]
    args: list[int]  # >= 0: the segment's input i; < 0: the output of stage -(a+1)
    shape: tuple[int, ...]
    dtype: np.dtype
    wants_out: bool


class _Torch:
    """PyTorch as a segment's array library."""

    name = "torch"

    def __init__(self, device: int) -> None:
        import torch

        self.torch = torch
        self.dev = torch.device("cuda", device)
        torch.cuda.set_device(self.dev)

    def dtype(self, dt: np.dtype) -> Any:
        return self.torch.from_numpy(np.empty(0, dt)).dtype

    def empty(self, shape: tuple[int, ...], dt: np.dtype) -> Any:
        return self.torch.empty(shape, dtype=self.dtype(dt), device=self.dev)

    def zeros(self, shape: tuple[int, ...], dt: np.dtype) -> Any:
        return self.torch.zeros(shape, dtype=self.dtype(dt), device=self.dev)

    def wrap(self, cupy_array: Any) -> Any:
        return self.torch.from_dlpack(cupy_array)

    def meta(self, x: Any) -> tuple[tuple[int, ...], np.dtype] | None:
        if not isinstance(x, self.torch.Tensor) or x.device != self.dev:
            return None
        try:
            return tuple(x.shape), np.dtype(str(x.dtype).removeprefix("torch."))
        except TypeError:  # bfloat16 and other types NumPy has not
            return None

    def ptr(self, x: Any) -> int:
        return int(x.data_ptr())

    def contiguous_as(self, x: Any, dt: np.dtype) -> Any:
        return x.to(self.dtype(dt)).contiguous()

    def copy(self, dst: Any, src: Any) -> None:
        dst.copy_(src)

    def stream(self, ptr: int) -> Any:
        return self.torch.cuda.stream(self.torch.cuda.ExternalStream(ptr, device=self.dev))

    def capture(self, body: Callable[[int], None]) -> Callable[[int], None]:
        """``body`` captured as a CUDA graph (warmed first on a side stream); the replay."""
        torch = self.torch
        side = torch.cuda.Stream(self.dev)
        with torch.cuda.stream(side):
            body(side.cuda_stream)
        side.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side):
            body(side.cuda_stream)
        side.synchronize()

        def replay(stream: int) -> None:
            with self.stream(stream):
                g.replay()

        replay.graph = g  # type: ignore[attr-defined]  # kept alive with the replay
        return replay


class _Cupy:
    """CuPy as a segment's array library."""

    name = "cupy"

    def __init__(self, device: int) -> None:
        import cupy as cp

        self.cp = cp
        self.device = device
        cp.cuda.Device(device).use()

    def dtype(self, dt: np.dtype) -> Any:
        return dt

    def empty(self, shape: tuple[int, ...], dt: np.dtype) -> Any:
        return self.cp.empty(shape, dt)

    def zeros(self, shape: tuple[int, ...], dt: np.dtype) -> Any:
        return self.cp.zeros(shape, dt)

    def wrap(self, cupy_array: Any) -> Any:
        return cupy_array

    def meta(self, x: Any) -> tuple[tuple[int, ...], np.dtype] | None:
        if not isinstance(x, self.cp.ndarray) or x.device.id != self.device:
            return None
        return tuple(x.shape), np.dtype(x.dtype)

    def ptr(self, x: Any) -> int:
        return int(x.data.ptr)

    def contiguous_as(self, x: Any, dt: np.dtype) -> Any:
        return self.cp.ascontiguousarray(x.astype(dt, copy=False))

    def copy(self, dst: Any, src: Any) -> None:
        self.cp.copyto(dst, src)

    def stream(self, ptr: int) -> Any:
        return self.cp.cuda.ExternalStream(ptr, self.device)

    def capture(self, body: Callable[[int], None]) -> Callable[[int], None]:
        """``body`` captured as a CUDA graph with a memory pool of its own, kept with
        the graph (so nothing the graph writes is ever handed to another allocation)."""
        cp = self.cp
        pool = cp.cuda.MemoryPool()
        side = cp.cuda.Stream(non_blocking=True)
        with cp.cuda.using_allocator(pool.malloc), side:
            body(side.ptr)  # warm: the pool now holds blocks of the sizes the capture asks for
            side.synchronize()
            side.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
            try:
                body(side.ptr)
            finally:
                graph = side.end_capture()
        graph.upload(side)
        side.synchronize()

        def replay(stream: int) -> None:
            graph.launch(self.stream(stream))

        replay.graph = graph  # type: ignore[attr-defined]
        replay.pool = pool  # type: ignore[attr-defined]
        return replay


def _library(arrays: str, device: int) -> _Torch | _Cupy:
    if arrays == "torch":
        return _Torch(device)
    if arrays == "cupy":
        return _Cupy(device)
    raise ValueError(f"arrays is one of {ARRAYS}, got {arrays!r}")


def _memcpy(dst: int, src: int, n: int, stream: int) -> None:
    import cupy as cp

    cp.cuda.runtime.memcpyAsync(dst, src, n, _MEMCPY_DEFAULT, stream)


class Segment:
    """A loaded segment: its functions imported and checked on zero tensors, and whether
    it can be captured (``mode``: "graph" or "eager", ``why``: the reason for eager)."""

    def __init__(self, req: dict[str, Any], device: int) -> None:
        arrays = req.get("arrays")
        if arrays not in ARRAYS:
            raise ValueError(f"a segment's arrays is one of {ARRAYS}, got {arrays!r}")
        ins, sts = req.get("inputs"), req.get("stages")
        if not isinstance(ins, list) or not isinstance(sts, list) or not 0 < len(sts) <= MAX_STAGES:
            raise ValueError(f"a segment request has a list of inputs and 1..{MAX_STAGES} stages")
        if len(ins) > 256:
            raise ValueError("a segment has at most 256 inputs")
        self.inputs = [
            (_shape(i.get("shape"), f"input {n}"), _dtype(i.get("dtype"), f"input {n}"))
            for n, i in enumerate(ins)
        ]
        self.lib = _library(str(arrays), device)
        self.device = device
        self.stages: list[_Stage] = []
        for k, s in enumerate(sts):
            name = str(s.get("name", f"stage {k}"))[:200]
            args = s.get("args")
            if not isinstance(args, list) or not all(
                isinstance(a, int) and -k <= a < len(self.inputs) for a in args
            ):
                raise ValueError(
                    f"stage {name!r}: args refer to segment inputs or earlier stages, got {args!r}"
                )
            scalars = s.get("fn", {}).get("scalars", [])
            if not isinstance(scalars, list):
                raise ValueError(f"stage {name!r}: scalars are a list")
            fn = stagefn.load(s["fn"])
            try:
                wants_out = "out" in inspect.signature(fn).parameters
            except (TypeError, ValueError):
                wants_out = False
            self.stages.append(
                _Stage(
                    name,
                    fn,
                    scalars,
                    list(args),
                    _shape(s.get("shape"), f"stage {name!r}"),
                    _dtype(s.get("dtype"), f"stage {name!r}"),
                    wants_out,
                )
            )
        self.shape, self.dtype = self.stages[-1].shape, self.stages[-1].dtype
        self.mode, self.why = "graph", ""
        self._trial()

    # ------------------------------------------------------------ running
    def compute(self, ins: Sequence[Any], outs: list[Any] | None = None) -> Any:
        """The segment's functions on input arrays ``ins``; the last result, contiguous and of
        the output's dtype.  ``outs`` (stages with an ``out`` parameter): preallocated outputs.
        ValueError naming the stage when a result's shape or type is not the declared one."""
        lib = self.lib
        vals: list[Any] = []
        for k, st in enumerate(self.stages):
            args = [ins[a] if a >= 0 else vals[-a - 1] for a in st.args]
            out = outs[k] if outs is not None and st.wants_out else None
            r = st.fn(*args, *st.scalars, out=out) if out is not None else st.fn(*args, *st.scalars)
            if r is None and out is not None:
                r = out
            m = lib.meta(r)
            if m is None:
                raise TypeError(
                    f"stage {st.name!r} returned {type(r).__name__}, "
                    f"not a {lib.name} array on GPU {self.device}"
                )
            if m[0] != st.shape:
                raise ValueError(f"stage {st.name!r} returned shape {m[0]}, its output has shape {st.shape}")
            if not np.can_cast(m[1], st.dtype, "same_kind"):
                raise ValueError(
                    f"stage {st.name!r} returned {m[1]}, which does not cast to its output {st.dtype}"
                )
            vals.append(r if m[1] == st.dtype else lib.contiguous_as(r, st.dtype))
        return lib.contiguous_as(vals[-1], self.dtype)

    def _outs(self) -> list[Any]:
        return [self.lib.empty(st.shape, st.dtype) if st.wants_out else None for st in self.stages]

    def _trial(self) -> None:
        """Run twice on zero inputs (compiles and loads every kernel, checks the results), then
        try one capture: ``mode`` says whether per-frame work can be a graph replay."""
        lib = self.lib
        ins = [lib.zeros(s, d) for s, d in self.inputs]
        outs = self._outs()
        for _ in range(2):
            self.compute(ins, outs)
        _sync()
        replay, self.why = _capture(lib, lambda _s: self.compute(ins, outs))
        self.mode = "graph" if replay is not None else "eager"
        _sync()

    def runner(self, peer: Any, buffers: Sequence[Any], gated: bool = False) -> Runner:
        """A runner over ``buffers`` (inputs then the output; imported by the caller)."""
        return Runner(self, peer, buffers, gated)


def _sync() -> None:
    import cupy as cp

    cp.cuda.runtime.deviceSynchronize()


def _capture(lib: _Torch | _Cupy, body: Callable[[int], None]) -> tuple[Callable[[int], None] | None, str]:
    """``body`` captured by ``lib``: (the replay, ""), or (None, why) for what a capture refuses
    (the error cleared: the segment then runs eagerly)."""
    try:
        return lib.capture(body), ""
    except Exception as e:
        _clear_capture_error()
        return None, f"{type(e).__name__}: {e}"[:300]


def _clear_capture_error() -> None:
    import cupy as cp

    try:
        cp.cuda.runtime.getLastError()
    except Exception:
        pass
    try:
        cp.cuda.runtime.deviceSynchronize()
    except Exception:
        pass


class Runner:
    """A segment bound to one frame slot's buffers: a captured graph (or the eager body).

    ``gated`` (an armed segment's frames, :class:`hostless.agents.cuda_armed.Armed`): the result
    reaches the output buffer only when the frame's gate is open: a captured graph commits it
    itself, gated by the device int ``gate``; an eager body (not armed) leaves it in device
    ``scratch`` (a CuPy array).  Otherwise straight into the output buffer."""

    def __init__(self, seg: Segment, peer: Any, buffers: Sequence[Any], gated: bool = False) -> None:
        lib = seg.lib
        if len(buffers) != len(seg.inputs) + 1:
            raise ValueError(
                f"segment takes {len(seg.inputs)} inputs and an output, got {len(buffers)} buffers"
            )
        here = f"cuda:{seg.device}"
        want = [*seg.inputs, (seg.shape, seg.dtype)]
        for n, (b, (shp, dt)) in enumerate(zip(buffers, want, strict=True)):
            if tuple(b.shape) != shp or np.dtype(b.dtype) != dt:
                raise ValueError(f"buffer {n} is {b.dtype}{tuple(b.shape)}, the segment wants {dt}{shp}")
            if b.device not in ("cpu", here):
                raise ValueError(f"buffer {n} lives on {b.device}; this agent runs on {here}")
        out = buffers[-1]
        if any(b.handle == out.handle for b in buffers[:-1]):
            raise ValueError("the output buffer is also an input")
        self.seg, self.buffers = seg, list(buffers)
        self.dins: list[Any] = []  # what the functions get for each input
        self.copy_in: list[tuple[int, int, int]] = []  # (device dst, host src, bytes) per frame
        for b in buffers[:-1]:
            if b.device == "cpu":
                d = lib.empty(tuple(b.shape), np.dtype(b.dtype))
                self.copy_in.append((lib.ptr(d), peer.buffer_dptr(b), b.nbytes))
                self.dins.append(d)
            else:
                self.dins.append(lib.wrap(peer.array(b)))
        self.out_dev = out.device != "cpu"
        self.out_arr = lib.wrap(peer.array(out)) if self.out_dev else None
        self.out_ptr, self.out_bytes = peer.buffer_dptr(out), out.nbytes
        self.peer = peer
        self.scratch: Any = None
        self.scratch_arr: Any = None
        # gated and captured: an armed slot's frame (hostless.agents.cuda_armed.Armed) is one
        # replay: the wait on the predecessors' points that opens or closes `gate` (device
        # int32), the body, the gated commit of its result (read where the capture left it: a
        # captured graph writes the same memory on every replay) into the output buffer, the
        # gated signal; `ctl` (device memory) says which frame and which timelines, zeros
        # until the slot is armed (the gate stays closed).  Gated and eager (a segment the
        # agent does not arm): the result goes to `scratch`, never ungated into the output.
        self.gate: Any = peer.cp.full(1, -1, dtype=np.int32) if gated else None
        self.ctl: Any = peer.armed_ctl() if gated else None
        self._result: Any = None
        self.outs = seg._outs()
        self.mode, self.why = seg.mode, seg.why
        self.launch: Callable[[int], None] = self._eager
        if seg.mode == "graph":
            replay, self.why = _capture(lib, self._body_committing if gated else self._body)
            if replay is not None:
                self.launch = replay
            else:
                self.mode = "eager"
        if gated and self.mode != "graph":
            self.scratch = peer.cp.empty(tuple(out.shape), np.dtype(out.dtype))
            self.scratch_arr = lib.wrap(self.scratch)
        _sync()

    def _compute(self, stream: int) -> Any:
        """The inputs copied in on ``stream``, then the segment's functions: their result."""
        for dst, src, n in self.copy_in:
            if n <= COPY_IN_KERNEL_MAX:  # small: a copy kernel starts sooner than a DMA
                self.peer.copy_kernel(dst, src, n, stream)
            else:
                _memcpy(dst, src, n, stream)
        return self.seg.compute(self.dins, self.outs)

    def _body_committing(self, stream: int) -> None:
        """An armed frame's work as captured: its wait, the body, the gated commit of its
        result, the gated signal."""
        cp, peer = self.peer.cp, self.peer
        st = cp.cuda.ExternalStream(stream)
        peer.armed_wait(self.ctl, self.gate, st)
        r = self._result = self._compute(stream)  # kept: the graph's commit reads its memory
        mem = cp.cuda.UnownedMemory(self.seg.lib.ptr(r), self.out_bytes, r, self.seg.device)
        view = cp.ndarray((self.out_bytes,), np.uint8, cp.cuda.MemoryPointer(mem, 0))
        peer.commit(self.buffers[-1], view, self.gate, st)
        peer.armed_signal(self.ctl, self.gate, st)

    def _body(self, stream: int) -> None:
        """One frame's work on ``stream`` (the current stream of the library too)."""
        r = self._compute(stream)
        if self.scratch_arr is not None:
            self.seg.lib.copy(self.scratch_arr, r)
        elif self.out_arr is not None:
            self.seg.lib.copy(self.out_arr, r)
        else:
            _memcpy(self.out_ptr, self.seg.lib.ptr(r), self.out_bytes, stream)

    def _eager(self, stream: int) -> None:
        with self.seg.lib.stream(stream):
            self._body(stream)

    def release(self) -> None:
        """Drop the graph and the buffers (after the stream passed its last launch)."""
        self.launch = self._eager
        self.dins, self.outs, self.out_arr = [], [], None
        self.scratch = self.scratch_arr = self._result = self.ctl = None
        for b in self.buffers:
            try:
                b.release()
            except Exception:
                pass
        self.buffers = []
