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
from typing import TYPE_CHECKING

from . import _core
from ._abi import C
from .errors import DomainClosed, InvalidHandle
from .status import Status, timeline_failure

if TYPE_CHECKING:
    pass

__all__ = ["Timeline"]

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
            """Block until the value is >= ``value``: returns SUCCESS, or the failure status.

            Spins for ``spin`` seconds (default: the domain's), then sleeps on a
            futex.  Raises TimeoutError after ``timeout`` seconds.
            """

    else:
        signal = _core.handle_method(2)  # C methods named and documented signal / wait
        wait = _core.handle_method(3)

    def fail(self, status: int = Status.ERROR) -> None:
        """Fail the timeline with ``status`` (not SUCCESS); sticky.  AlreadySignaled if already failed."""
        self._check_held()
        if isinstance(status, bool) or not 0 < int(status) <= 0xFFFFFFFF:
            raise ValueError(f"invalid failure status {status!r} (ERROR, CANCEL, OWNER_DIED or 64..2**32-1)")
        self._core.tl_fail(self.handle, int(status))

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
            raise TimeoutError(
                f"timeline {self.handle:#x} did not reach {value} within {timeout} s"
            ) from None
        return _decode(w)

    def add_callback(self, value: int, cb: Callable[[Timeline, Status], object]) -> None:
        """Call ``cb(timeline, status)`` once the value reaches ``value`` or the timeline fails."""
        self._check_held()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._dom.notifier().watch(self.handle, value, lambda w: cb(self, _decode(w)), loop)

    def __repr__(self) -> str:
        if not self._held or self._dom._closed:
            return f"<hostless.Timeline {self.handle:#x} released>"
        return f"<hostless.Timeline {self.handle:#x} value={self.value} failure={self.failure}>"


def _decode(w: int) -> Status:
    return timeline_failure(w) or Status.SUCCESS
