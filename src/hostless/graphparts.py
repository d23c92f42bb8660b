"""The parts a graph is made of (:mod:`hostless.graph` describes the whole): its stages,
its errors, and what a :class:`~hostless.compiled.CompiledGraph` holds per agent and per
frame in flight, with the helpers that move tensors in and out of its buffers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import devmem, lowlevel
from .agents import Agent
from .buffer import Buffer
from .errors import HostlessError, OutOfMemory
from .kernels import f64
from .segments import GpuSegment
from .status import Status
from .timeline import Timeline
from .wire import Packet


class StageFailed(HostlessError):
    """A stage of a graph failed.

    ``status`` says how (ERROR, OWNER_DIED, ...); ``error``, when the stage's
    agent recorded one (:mod:`hostless.records`), says why: the exception's
    type and message, then the kernel's traceback in the agent, as text.
    ``frame``: the number of the frame that failed (``CompiledGraph.frame``
    counts the frames submitted), or None when raised outside a frame.  A
    compiled graph outlives a failed frame: the next one runs without a
    recompile (:class:`GraphInvalidated`, an agent gone, is the exception).
    """

    def __init__(
        self, stage: str, status: Status, error: str | None = None, frame: int | None = None
    ) -> None:
        msg = f"stage {stage!r} failed with {status.name}"
        if frame is not None:
            msg = f"frame {frame}: {msg}"
        if error:
            msg += f": {error}"
        super().__init__(msg)
        self.stage, self.status, self.error, self.frame = stage, status, error, frame


class GraphInvalidated(StageFailed):
    """An agent this compiled graph runs on died or was replaced (respawned on its queue).

    The graph's packets, timelines and argument blocks were built for that
    agent: the frame that noticed fails and every later ``run``/``stream``
    raises this, never returning a frame, until the graph is compiled again
    (``g.compile()`` on live agents, a respawned one included).  A
    :class:`StageFailed` (``stage`` is the first stage on that agent,
    ``status`` OWNER_DIED), so code that handles stage failures handles it;
    ``agent_id`` is the participant id the graph was compiled for."""

    def __init__(self, stage: str, agent_id: int, why: str) -> None:
        HostlessError.__init__(
            self,
            f"stage {stage!r} failed with OWNER_DIED: its agent (participant {agent_id}) {why}; "
            "this compiled graph is no longer valid and returns no frame: compile it again with g.compile() "
            "on live agents (a respawned one included)",
        )
        self.stage, self.status, self.error, self.frame = stage, Status.OWNER_DIED, None, None
        self.agent_id = agent_id


class GraphResetFailed(HostlessError):
    """A frame failed and the compiled graph could not be reset for the next one (out of
    heap, the domain's object table full): it returns no frame until compiled again
    (``g.compile()``).  The failed frame's :class:`StageFailed` is its context."""


class GraphTooLarge(OutOfMemory):
    """A graph cannot fit the domain's heaps: ``compile()`` refuses it before allocating
    anything (or releases what it allocated when a heap's free space is too scattered).
    The message says how much it needs and the ``Domain.create`` size that fits it;
    ``heap`` ("cpu": the shared heap, or "cuda:N"), ``needed``, ``free`` and ``size``
    are the figures, in bytes."""

    def __init__(self, msg: str, *, heap: str, needed: int, free: int, size: int) -> None:
        super().__init__(msg)
        self.heap, self.needed, self.free, self.size = heap, needed, free, size


@dataclass
class Stage:
    name: str
    agent: Agent
    kernel: str | Callable[..., Any] | GpuSegment
    """A built-in kernel's name, a user kernel's name (``spawn(user_kernels=...)``),
    a plain Python function (:mod:`hostless.stagefn`), or (in a compiled graph) a
    segment of GPU function stages (:mod:`hostless.segments`)."""
    inputs: list[str]
    output: str
    shape: tuple[int, ...]
    dtype: np.dtype
    scalars: list[float | int] = field(default_factory=list)
    arrays: str | None = None
    """A GPU function stage's array library: "torch" or "cupy" (:mod:`hostless.segments`)."""


def _check_cast(name: str, arr: np.ndarray, dt: np.dtype) -> None:
    """Refuse an input that would change value when written into the graph's dtype: a
    float into an integer input (300.0 into uint8 would become 44), integers out of
    range, complex into real.  Float to a narrower float rounds, as expected."""
    if arr.dtype == dt or np.can_cast(arr.dtype, dt, "safe") or not arr.size:
        return
    if dt.kind == "f" and arr.dtype.kind in "fiub":
        return  # rounding to the nearest float is not a change of meaning
    if arr.dtype.kind in "iub" and dt.kind in "iub":
        info = np.iinfo(dt) if dt.kind != "b" else None
        lo, hi = arr.min(), arr.max()
        if info is not None and info.min <= lo and hi <= info.max:
            return
        raise ValueError(f"input {name!r} has values {lo}..{hi} that do not fit its dtype {dt}")
    raise TypeError(
        f"input {name!r} is {arr.dtype}, the graph's input is {dt}: convert it yourself "
        f"(the cast would change values, e.g. 300.0 into uint8 gives 44)"
    )


def checked_inputs(
    graph_inputs: Mapping[str, tuple[tuple[int, ...], np.dtype]], inputs: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """A frame's inputs checked against the graph's, all before any is used: KeyError for an
    unknown or a missing name, ValueError for another shape, :func:`_check_cast`'s errors for a
    cast that would change values.  Returns each as an array (``np.asarray``: no copy)."""
    unknown = sorted(name for name in inputs if name not in graph_inputs)
    if unknown:
        raise KeyError(f"unknown graph input(s) {unknown}; the graph's inputs are {sorted(graph_inputs)}")
    out = {}
    for name, (shp, dt) in graph_inputs.items():
        if name not in inputs:
            raise KeyError(f"missing graph input {name!r}")
        arr = np.asarray(inputs[name])
        if arr.shape != shp:
            raise ValueError(f"input {name!r} must have shape {shp}, got {arr.shape}")
        _check_cast(name, arr, dt)
        out[name] = arr
    return out


def _view(b: Buffer) -> np.ndarray | Buffer:
    """A host buffer's NumPy view, made once; a device buffer itself (it has no host view)."""
    return b.numpy() if b.device == "cpu" else b


def _store(b: Buffer, arr: np.ndarray) -> None:
    """Write ``arr`` into ``b``: in place for host memory, one copy for device memory."""
    if b.device == "cpu":
        b.numpy()[...] = arr
    else:
        devmem.from_host(b, arr)


def _scalar_word(x: float | int) -> int:
    return f64(x) if isinstance(x, float) else int(x) & 0xFFFFFFFFFFFFFFFF


class _Ident:
    """An agent as a compiled graph knows it: the words of its participant slot and of its
    queue's consumer that must keep what they held at compile time."""

    __slots__ = (
        "stage", "agent_id", "index", "ctl", "ctl_want", "consumer", "consumer_want",
        "ctl_off", "consumer_off",
    )

    CTL_MASK = (0xFFFFFF << 16) | 0xFF  # the incarnation's low 24 bits (what an id carries) and state

    def __init__(
        self, stage: str, agent_id: int, index: int, ctl: memoryview, ctl_want: int,
        consumer: memoryview, consumer_want: int, ctl_off: int, consumer_off: int,
    ) -> None:
        self.stage, self.agent_id, self.index = stage, agent_id, index
        self.ctl, self.ctl_want, self.consumer, self.consumer_want = ctl, ctl_want, consumer, consumer_want
        self.ctl_off, self.consumer_off = ctl_off, consumer_off  # the words' offsets in the mapping

    def changed(self) -> str | None:
        """None while the agent is the one compiled for; else what happened (two loads)."""
        cons = self.consumer[0]
        if cons != self.consumer_want and cons != 0:
            return f"was replaced: participant slot {(cons & 0xFF) - 1} consumes its queue now (a respawn)"
        if self.ctl[0] & self.CTL_MASK != self.ctl_want:
            return "died or left (its participant slot no longer holds it)"
        if cons != self.consumer_want:
            return "died (its recovery unbound its queue)"
        return None


class Retired:
    """One generation of a compiled graph's timelines and per-slot objects (argument
    blocks, ERT commands, relays' scratch bytes), replaced after a failed frame and kept
    until no packet can name them; ``first``: the first frame run on them."""

    __slots__ = ("first", "owned", "timelines")

    def __init__(self, timelines: list[Timeline], owned: list[Any], first: int) -> None:
        self.timelines, self.owned, self.first = timelines, owned, first

    def release(self) -> None:
        """Release every object still held (idempotent)."""
        for o in self.owned:
            if lowlevel.is_held(o):
                o.release()
        for t in self.timelines:
            if lowlevel.is_held(t):
                t.release()
        self.owned, self.timelines = [], []


class _Slot:
    """The buffers, timelines and prepared packets of one frame in flight."""

    def __init__(self) -> None:
        # each stage's timeline and (direct + copy) the copies' ones, signalled with the frame
        # number: the slot's own, so that a failed frame fails no other frame in flight
        self.timelines: list[Timeline] = []
        self.copied: dict[int, Timeline] = {}
        # after a failed frame (hostless.renewal): the objects of the slot's earlier timelines
        # and packets, kept until no packet names them, and the first frame on the current ones
        self.retired: list[Retired] = []
        self.first = 1
        # a frame left in flight on the slot that nobody collects (a timeout, an interrupt, a
        # stream closed early): its number, and the slot is renewed before its next use
        self.stale = 0
        self.tensors: dict[str, Buffer] = {}  # shared mode: one per name
        self.stage_in: list[list[Buffer]] = []  # copy mode: private inputs per stage
        self.stage_out: list[Buffer] = []  # output buffer per stage
        self.packets: list[Packet] = []  # the packet of each stage (host; direct: roots' are pushed)
        self.scratch: list[int] = []  # direct: the two one-byte buffers relay packets copy
        # (argument block, byte offset) of each follow-up packet's signal and wait value:
        # the words the frame program sets to the frame number before each submit
        self.stores: list[tuple[int, int]] = []
        self.owned: list[Any] = []
        # the frame programs (hostless._core.FrameProgram) and their ops' tags (stage index
        # of each wait): submit (direct: stores and the roots' pushes; host: every push,
        # wait and copy of the frame), wait (every sink), run (submit, then wait)
        self.submit: tuple[Any, list[Any]] = (None, [])
        self.wait: tuple[Any, list[Any]] = (None, [])
        self.run: tuple[Any, list[Any]] = (None, [])
        # NumPy views made once: the buffers each graph input is written into, the outputs
        # host buffers as NumPy views, device buffers as themselves (written and read by copies)
        self.in_views: dict[str, list[np.ndarray | Buffer]] = {}
        self.out_views: list[tuple[str, np.ndarray | Buffer]] = []
