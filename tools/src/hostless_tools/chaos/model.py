"""What a chaos worker knows about each of its private objects (the model every reading is
checked against), and its configuration."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hostless.buffer import Buffer
from hostless.fence import Fence
from hostless.timeline import Timeline

from .record import _FAILED, _slot


class _Node:
    """A fence or merged fence of the worker, with what it must read.

    ``final`` is None while the object must be ACTIVE, else its status as two
    readings of the merge rule (``[eager, lazy]``, see ChaosWorker._child_done;
    both equal for a plain fence).  ``parents`` are the live merges it belongs
    to (at most two), ``children`` / ``pending`` those of a merge.
    """

    __slots__ = (
        "obj",
        "handle",
        "merged",
        "final",
        "err",
        "parents",
        "children",
        "pending",
        "tainted",
        "log",
    )

    def __init__(self, obj: Fence, merged: bool, children: Sequence[_Node] = ()) -> None:
        self.obj = obj
        self.handle = obj.handle
        self.merged = merged
        self.final: tuple[int, int] | None = None
        self.err: list[int | None] = [None, None]
        self.parents: list[_Node] = []
        self.children: list[_Node] = list(children)
        self.pending: set[int] = {id(c) for c in children}
        self.tainted = False
        self.log: list[str] = []

    def name(self) -> str:
        kind = "merge" if self.merged else "fence"
        return f"{kind} {self.handle:#x} (slot {_slot(self.handle)})"

    def descendants(self) -> set[int]:
        out = {id(self)}
        for c in self.children:
            out |= c.descendants()
        return out

    def depth(self) -> int:
        return 1 + max((c.depth() for c in self.children), default=0)


class _Tl:
    __slots__ = ("obj", "handle", "value", "failed", "tainted")

    def __init__(self, obj: Timeline, value: int) -> None:
        self.obj = obj
        self.handle = obj.handle
        self.value = value
        self.failed: int | None = None
        self.tainted = False

    def name(self) -> str:
        return f"timeline {self.handle:#x} (slot {_slot(self.handle)})"

    def expected_word(self) -> int:
        return (_FAILED | self.failed) if self.failed is not None else self.value


class _Buf:
    __slots__ = ("obj", "tag")

    def __init__(self, obj: Buffer, tag: int) -> None:
        self.obj = obj
        self.tag = tag


class _Shared:
    """A fence or timeline published to the driver: ``plan`` is the status the fence will get."""

    __slots__ = ("obj", "plan", "signaled", "value", "bad")

    def __init__(self, obj: Fence | Timeline, plan: int) -> None:
        self.obj = obj
        self.plan = plan
        self.signaled = False
        self.value = 0
        self.bad = False


@dataclass
class WorkerConfig:
    """What a worker does.  ``mode``: ``"mix"`` (random operations) or ``"repro"`` (the fixed loop
    fence, fence, merge, signal, signal, wait, release x3, new timeline)."""

    seed: int = 0
    mode: str = "mix"
    iterations: int = 0
    """Operations (mix) or loop iterations (repro) before leaving on its own; 0: until stopped."""
    max_seconds: float = 600.0
    """Leaves on its own after this long (a safety net if the driver is gone)."""
    max_nodes: int = 24
    max_timelines: int = 6
    max_buffers: int = 6
    nested: bool = True
    """Merges of merges (trees up to 4 levels)."""
    buffers: bool = True
    shared: bool = False
    """Publish fences / timelines for the driver to wait on."""
    watchdog: float = 0.02
    algebra: bool = True
    """Composites over timeline points and fences shared by many composites (AlgebraOps)."""
