"""Fences: Synx-style one-shot synchronization objects shared by every participant.

Rules (the contract, as in dma-fence and Synx):

* A fence starts ACTIVE and is signaled exactly once, with SUCCESS, ERROR,
  CANCEL, OWNER_DIED or a custom status >= 64.  A second signal raises
  :class:`~hostless.AlreadySignaled`.
* Any holder may signal or wait.  Its completion is one 64-bit word: 0 while
  ACTIVE, the status once signaled, so a device signals with one store and
  waits with ``word >= 1``.
* Each participant holds at most one shared reference; a ``Fence`` object is
  one local reference.  When the last reference in the domain is released
  while the fence is ACTIVE, it is signaled CANCEL.
* If the owner (the participant expected to signal) dies first, recovery
  signals OWNER_DIED and every waiter wakes.
* A merged fence completes when all its children have; its status is SUCCESS
  or the first failure propagated; it cannot be signaled directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from . import _core
from ._abi import C, handle_kind
from .errors import DomainClosed, InvalidHandle
from .status import Status, fence_status

if TYPE_CHECKING:
    pass

__all__ = ["Fence"]

_KIND_MERGED = int(C.KIND_MERGED)


def _timeout_ns(timeout: float | None) -> int:
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("timeout must be >= 0 or None")
    return int(timeout * 1e9)


class Fence(_core.Handle):
    """One reference to a fence of a domain.  Create with ``Domain.fence()``,
    ``Domain.import_fence()`` or ``Domain.merge()``.

    ``handle`` is the global 64-bit handle, valid in every participant.
    Dropping the last Python reference releases the fence like ``release()``.
    """

    __slots__ = ()

    _inner: list[Fence] | None  # a C member (None when unset): the tree nodes of a merge of > 32 fences

    def __new__(cls, *args: Any, **kwargs: Any) -> Fence:
        raise TypeError("use Domain.fence(), Domain.import_fence() or Domain.merge()")

    def _check_held(self) -> None:
        if not self._held:
            raise InvalidHandle(f"fence {self.handle:#x} was released")
        if self._dom._closed:
            raise DomainClosed("the fence's domain is closed")

    @property
    def merged(self) -> bool:
        """True for a composite made by ``Domain.merge``."""
        return handle_kind(self.handle) == _KIND_MERGED

    # ---------------------------------------------------------------- signal
    if TYPE_CHECKING:

        def signal(self, status: int = Status.SUCCESS) -> None:
            """Signal with ``status`` (SUCCESS by default); wakes every waiter.

            Raises AlreadySignaled if already signaled, InvalidOperation for a
            merged fence, ValueError for a status that is not SUCCESS, ERROR,
            CANCEL, OWNER_DIED or 64..2**32-1, InvalidHandle after release.
            """

        def wait(self, timeout: float | None = None, *, spin: float | None = None) -> Status:
            """Block until signaled; returns the final status.

            Spins for ``spin`` seconds (default: the domain's ``spin``), then
            sleeps on a futex; a signal stored by a device without a wake-up is
            seen within the domain's poll interval.  Raises TimeoutError after
            ``timeout`` seconds.  The GIL is released while waiting (after a
            first spin of at most 2 us).
            """

    else:
        signal = _core.handle_method(0)  # C methods named and documented signal / wait
        wait = _core.handle_method(1)

    def cancel(self) -> None:
        """Signal CANCEL."""
        self.signal(Status.CANCEL)

    @property
    def status(self) -> Status:
        """ACTIVE, or the final status.  Not meant for busy polling: use wait()."""
        self._check_held()
        w = self._core.word(self.handle)
        return fence_status(w)

    @property
    def done(self) -> bool:
        return self.status is not Status.ACTIVE

    # ------------------------------------------------------------------ wait
    def __await__(self) -> Generator[Any, None, Status]:
        return self.wait_async().__await__()

    async def wait_async(self, timeout: float | None = None) -> Status:
        """Await the final status without blocking the event loop."""
        self._check_held()
        w = self._core.word(self.handle)
        if w:
            return fence_status(w)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        self._dom.notifier().watch(self.handle, 1, fut, loop)
        if timeout is None:
            return fence_status(await fut)
        try:
            return fence_status(await asyncio.wait_for(fut, timeout))
        except asyncio.TimeoutError:
            raise TimeoutError(f"fence {self.handle:#x} not signaled within {timeout} s") from None

    def add_done_callback(self, cb: Callable[[Fence], object]) -> None:
        """Call ``cb(fence)`` once the fence is signaled (at once if it already is).

        Called from a running asyncio loop, ``cb`` runs in that loop; otherwise
        it runs in the domain's notifier thread.  The fence must stay held
        until then.
        """
        self._check_held()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._dom.notifier().watch(self.handle, 1, lambda _w: cb(self), loop)

    # --------------------------------------------------------------- release
    if TYPE_CHECKING:

        def release(self) -> None:
            """Drop this reference.  Raises InvalidHandle when released twice.

            When it was the last reference in the domain and the fence is still
            ACTIVE, the fence is signaled CANCEL.  A merged fence of more than
            32 children releases the inner nodes of its tree too (C: Handle.release).
            """

    def __repr__(self) -> str:
        if not self._held or self._dom._closed:
            return f"<hostless.Fence {self.handle:#x} released>"
        try:
            st = self.status.name
        except Exception:
            st = "?"
        kind = "merged " if self.merged else ""
        return f"<hostless.Fence {kind}{self.handle:#x} {st}>"
