"""Timelines: u64 counters that only grow (Vulkan / HSA / IREE style), with a sticky failure.

* ``signal(v)`` requires ``v`` greater than the current value (else ValueError)
  and at most 2**62 - 1.
* ``wait(v)`` returns once the value is >= v.  The completion word is the
  value itself, so a device advances a timeline with one store and waits with
  ``word >= v`` (cuStreamWaitValue64 GEQ).
* ``fail(status)`` is sticky: the word becomes 2**62 | status, larger than any
  value, so every current and future waiter wakes and gets the status.  If the
  owner dies, recovery fails the timeline with OWNER_DIED.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from ._abi import C
from .errors import DomainClosed, InvalidHandle
from .fence import _timeout_ns
from .status import Status

if TYPE_CHECKING:
    from .domain import Domain

__all__ = ["Timeline"]

_FAILED = int(C.TIMELINE_FAILED)


class Timeline:
    """One reference to a timeline.  Create with ``Domain.timeline()`` or ``Domain.import_timeline()``."""

    __slots__ = ("_dom", "_core", "handle", "_held", "__weakref__")

    handle: int

    def __init__(self) -> None:
        raise TypeError("use Domain.timeline() or Domain.import_timeline()")

    @classmethod
    def _adopt(cls, dom: Domain, handle: int) -> Timeline:
        t = object.__new__(cls)
        t._dom = dom
        t._core = dom._core
        t.handle = handle
        t._held = True
        return t

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
        return Status(w & 0xFFFFFFFF) if w & _FAILED else None

    def signal(self, value: int) -> None:
        """Advance to ``value`` (> current).  ValueError otherwise; AlreadySignaled after a failure."""
        if not self._held:
            self._check_held()
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("timeline values are ints")
        self._core.tl_signal(self.handle, value)

    def fail(self, status: int = Status.ERROR) -> None:
        """Fail the timeline with ``status`` (not SUCCESS); sticky.  AlreadySignaled if already failed."""
        self._check_held()
        self._core.tl_fail(self.handle, int(status))

    def wait(self, value: int, timeout: float | None = None, *, spin: float | None = None) -> Status:
        """Block until the value is >= ``value``: returns SUCCESS, or the failure status.

        Raises TimeoutError after ``timeout`` seconds.
        """
        if not self._held:
            self._check_held()
        if not 0 <= value <= int(C.TIMELINE_MAX):
            raise ValueError(f"timeline values are in 0..2**62-1, got {value}")
        sp = self._dom.spin if spin is None else spin
        w = self._core.wait(self.handle, value, _timeout_ns(timeout), int(sp * 1e9))
        if w is None:
            raise TimeoutError(f"timeline {self.handle:#x} did not reach {value} within {timeout} s")
        return _decode(w)

    async def wait_async(self, value: int, timeout: float | None = None) -> Status:
        """Await ``value >= value`` without blocking the loop (SUCCESS or the failure status)."""
        self._check_held()
        if not 0 <= value <= int(C.TIMELINE_MAX):
            raise ValueError(f"timeline values are in 0..2**62-1, got {value}")
        w = self._core.word(self.handle)
        if w >= value:
            return _decode(w)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        self._dom.notifier().watch(self.handle, value, fut, loop)
        try:
            w = await (fut if timeout is None else asyncio.wait_for(fut, timeout))
        except asyncio.TimeoutError:
            raise TimeoutError(f"timeline {self.handle:#x} did not reach {value} within {timeout} s") from None
        return _decode(w)

    def add_callback(self, value: int, cb: Callable[[Timeline, Status], object]) -> None:
        """Call ``cb(timeline, status)`` once the value reaches ``value`` or the timeline fails."""
        self._check_held()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._dom.notifier().watch(self.handle, value, lambda w: cb(self, _decode(w)), loop)

    def release(self) -> None:
        """Drop this reference.  InvalidHandle when released twice."""
        if not self._held:
            raise InvalidHandle(f"timeline {self.handle:#x} was already released")
        self._held = False
        if not self._dom._closed:
            self._core.release(self.handle)

    def __enter__(self) -> Timeline:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._held:
            self.release()

    def __del__(self) -> None:
        try:
            if self._held and not self._dom._closed:
                self.release()
        except Exception:
            pass

    def __repr__(self) -> str:
        if not self._held:
            return f"<hostless.Timeline {self.handle:#x} released>"
        return f"<hostless.Timeline {self.handle:#x} value={self.value} failure={self.failure}>"


def _decode(w: int) -> Status:
    return Status(w & 0xFFFFFFFF) if w & _FAILED else Status.SUCCESS
