"""Timelines: u64 counters that only grow (Vulkan / HSA / IREE style), with a sticky failure.

* ``signal(v)`` requires ``v`` greater than the current value (else ValueError)
  and at most 2**62 - 1.
* ``wait(v)`` returns once the value is >= v.  The completion word is the
  value itself, so a device advances a timeline with one store and waits with
  ``word >= v`` (cuStreamWaitValue64 GEQ).
* ``fail(status)`` is sticky: the word becomes 2**62 | status, larger than any
  value, so every current and future waiter wakes.  A point reached stays
  reached: a wait for a value at or below the value the timeline had when it
  failed returns SUCCESS; a wait for a higher one returns the status.  If the
  owner dies, recovery fails the timeline with OWNER_DIED; if it leaves with
  ``Domain.close()``, with OWNER_LEFT.
* ``await timeline.point(v)`` awaits a point (a Timeline itself is not
  awaitable: it has no value to wait for).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from . import _core
from ._abi import C
from .errors import DomainClosed, InvalidHandle
from .status import Status, timeline_failure

if TYPE_CHECKING:
    pass

__all__ = ["Point", "Timeline"]

_FAILED = int(C.TIMELINE_FAILED)


class Timeline(_core.Handle):
    """One reference to a timeline.  Create with ``Domain.timeline()`` or ``Domain.import_timeline()``."""

    __slots__ = ()

    def __new__(cls, *args: object, **kwargs: object) -> Timeline:
        raise TypeError("use Domain.timeline() or Domain.import_timeline()")

    def _check_held(self) -> None:
        if not self._held:
            raise InvalidHandle(f"timeline {self.handle:#x} was released")
        if self._dom._closed:
            raise DomainClosed("the timeline's domain is closed")

    @property
    def value(self) -> int:
        """Current value (after a failure: the value it had when it failed)."""
        self._check_held()
        w = self._core.word(self.handle)
        if w & _FAILED:
            return int(self._core.aux(self.handle))
        return int(w)

    @property
    def failure(self) -> Status | None:
        """The failure status, or None while the timeline has not failed."""
        self._check_held()
        w = self._core.word(self.handle)
        return timeline_failure(w)

    if TYPE_CHECKING:

        def signal(self, value: int) -> None:
            """Advance to ``value`` (> current, <= 2**62-1): ValueError otherwise;
            AlreadySignaled after a failure.  Wakes every waiter whose point is reached."""

        def wait(self, value: int, timeout: float | None = None, *, spin: float | None = None) -> Status:
            """Block until the value is >= ``value`` or the timeline fails: returns SUCCESS when
            ``value`` was reached (also before a failure), else the failure status.

            Spins for ``spin`` seconds (default: the domain's), then sleeps on a
            futex.  Raises TimeoutError after ``timeout`` seconds.
            """

        def point(self, value: int) -> Point:
            """The point ``value`` of this timeline: a waitable that completes when the
            value reaches ``value`` (SUCCESS) or the timeline fails (its failure status).

            Accepted wherever a fence is: ``Domain.merge``, :func:`hostless.wait_any` /
            :func:`hostless.wait_all`, ``await``, a packet's wait list
            (:func:`hostless.packet_waits`), ``Domain.publish``.  It holds no reference
            of its own: the timeline object must stay held while it is used.  TypeError
            for a value that is not an int, ValueError outside 0..2**62-1."""

    else:
        signal = _core.handle_method(2)  # C methods named and documented signal / wait / point
        wait = _core.handle_method(3)
        point = _core.handle_method(4)  # a Point in one allocation (binding/point.c)

    def fail(self, status: int = Status.ERROR) -> None:
        """Fail the timeline with ``status`` (not SUCCESS); sticky.  AlreadySignaled if already failed."""
        self._check_held()
        if isinstance(status, bool) or not 0 < int(status) <= 0xFFFFFFFF:
            raise ValueError(f"invalid failure status {status!r} (ERROR, CANCEL, OWNER_DIED or 64..2**32-1)")
        self._core.tl_fail(self.handle, int(status))

    async def wait_async(self, value: int, timeout: float | None = None) -> Status:
        """Await until the timeline's value is >= ``value`` (or it fails), without blocking the
        loop: SUCCESS when ``value`` was reached (also before a failure), else the failure
        status.  ``await timeline.point(value)`` is the same."""
        self._check_held()
        if not 0 <= value <= int(C.TIMELINE_MAX):
            raise ValueError(f"timeline values are in 0..2**62-1, got {value}")
        w = self._core.word(self.handle)
        if w >= value:
            return _point_status(self, w, value)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        self._dom.notifier().watch(self.handle, value, fut, loop)
        try:
            w = await (fut if timeout is None else asyncio.wait_for(fut, timeout))
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"timeline {self.handle:#x} did not reach {value} within {timeout} s"
            ) from None
        return _point_status(self, w, value)

    def add_callback(self, value: int, cb: Callable[[Timeline, Status], object]) -> None:
        """Call ``cb(timeline, status)`` once the value reaches ``value`` or the timeline fails."""
        self._check_held()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._dom.notifier().watch(
            self.handle, value, lambda w: cb(self, _point_status(self, w, value)), loop
        )

    def __await__(self) -> Generator[Any, None, Status]:
        """A Timeline is not awaitable by itself (it has no value to wait for): TypeError naming
        what is, ``await timeline.point(value)`` or ``await timeline.wait_async(value)``."""
        raise TypeError(
            "a Timeline is not awaitable by itself: await timeline.point(value) "
            "(or timeline.wait_async(value)) for the value to reach"
        )

    def __repr__(self) -> str:
        if not self._held or self._dom._closed:
            return f"<hostless.Timeline {self.handle:#x} released>"
        return f"<hostless.Timeline {self.handle:#x} value={self.value} failure={self.failure}>"


class Point(_core.Point):
    """A point on a timeline (``Timeline.point(v)``): a value object, ``timeline``
    and ``value``, equal to any other point of the same timeline and value.

    Guarantees: ``wait`` returns SUCCESS once the timeline's value is >= ``value``,
    or the timeline's failure status once it has failed (as ``Timeline.wait``);
    it is never complete before that.  A merge over points completes when every
    point and fence in it has, with the first failure.

    ``Point(timeline, value)`` raises TypeError for what is not a Timeline or an
    int, ValueError for a value outside 0..2**62-1.  The fields are read-only
    (its C base, binding/point.c, holds them: the waits read them without a
    lookup)."""

    __slots__ = ()

    if TYPE_CHECKING:
        timeline: Timeline
        value: int

        def __init__(self, timeline: Timeline, value: int) -> None: ...

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Point is immutable")

    @property
    def handle(self) -> int:
        """The timeline's handle (a packet waits on it with ``wait_value = value``)."""
        return int(self.timeline.handle)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Point)
            and other.timeline._dom is self.timeline._dom
            and other.timeline.handle == self.timeline.handle
            and other.value == self.value
        )

    def __hash__(self) -> int:
        return hash((self.timeline.handle, self.value))

    @property
    def status(self) -> Status:
        """ACTIVE until the point is reached, then SUCCESS, or the timeline's failure."""
        self.timeline._check_held()
        w = self.timeline._core.word(self.timeline.handle)
        return _point_status(self.timeline, w, self.value) if w >= self.value else Status.ACTIVE

    @property
    def done(self) -> bool:
        return self.status is not Status.ACTIVE

    def wait(self, timeout: float | None = None, *, spin: float | None = None) -> Status:
        """Block until reached (SUCCESS) or failed (the status); TimeoutError after ``timeout``."""
        return self.timeline.wait(self.value, timeout, spin=spin)

    async def wait_async(self, timeout: float | None = None) -> Status:
        """Await the point without blocking the event loop."""
        return await self.timeline.wait_async(self.value, timeout)

    def __await__(self) -> Generator[Any, None, Status]:
        return self.wait_async().__await__()

    def __repr__(self) -> str:
        return f"<hostless.Point {self.timeline.handle:#x} >= {self.value}>"


_core.set_point_types(Point, Timeline)


def _point_status(tl: Timeline, w: int, value: int) -> Status:
    """What a wait for ``value`` returns given the word ``w`` it saw (>= value, or failed):
    hl_point_status, through the engine: SUCCESS when ``value`` was reached, also before a
    failure (the value failed from is in aux, read after the word), else the failure."""
    failure = timeline_failure(w)  # CorruptDomain for a word nobody writes
    if failure is None:
        return Status.SUCCESS
    return Status(tl._core.point_status(tl.handle, value, w))
