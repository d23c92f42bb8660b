"""One pollable descriptor for hostless objects: event loops wait without a thread per wait.

A :class:`Poller` owns one Linux ``eventfd``.  ``poller.watch(obj)`` asks for ``obj``
(a :class:`~hostless.Fence`, merged ones included, or a timeline :class:`~hostless.Point`)
to be reported; when it completes, the descriptor becomes readable and
``poller.ready()`` returns it, with its final status.  Any loop that can wait on a file
descriptor can therefore wait on hostless objects: :mod:`selectors`, asyncio's
``loop.add_reader``, trio's ``wait_readable``, GLib's ``g_unix_fd_add``::

    poller = hl.Poller()
    poller.watch(fence)
    poller.watch(timeline.point(5), lambda r: print("reached", r.status))
    loop.add_reader(poller.fileno(), poller.ready)   # asyncio; callbacks run in the loop

How it works, honestly: an eventfd is private to the process that made it, and the
objects complete in shared memory, often by a store from another process or a device
that cannot reach our descriptor.  So something in *this* process must turn those
completions into eventfd writes: the domain's notifier thread
(:class:`hostless._aio.Notifier`), the one thread per joined domain that already
completes asyncio waits.  It sleeps on up to 127 completion words at once
(``futex_waitv``; more are visited in turns of 1 ms), and for each completed watch
queues a :class:`Ready` and writes 1 to the eventfd.  So there is no thread per wait:
one per domain this process joined, shared with asyncio's ``wait_async``, however many
objects and pollers.  A signal by a device (a plain store, no futex wake) is seen
within the domain's poll interval, as by every host waiter.

Guarantees:

* every watch is reported exactly once by :meth:`ready` (unless :meth:`unwatch` ran
  first): with the object's final status (SUCCESS, or its failure: ERROR, CANCEL,
  OWNER_DIED when its owner was killed and recovered, ...), or with ``error`` set
  when the wait itself ended (the object's handle was released, the domain closed:
  ``DomainClosed``);
* the descriptor is readable while a report is queued; it may also be readable with
  nothing to report (a report taken by an earlier :meth:`ready`): ``ready()`` then
  returns ``[]``.  Nothing blocks in :meth:`ready`;
* callbacks given to :meth:`watch` run in the thread that calls :meth:`ready`, never
  in the notifier thread; an exception in a callback propagates from ``ready()``
  after the other reports of that call were handed out (they are not lost);
* the poller keeps a watched object alive until it is reported or unwatched (the
  object must not be released by hand meanwhile: that ends the watch with an
  error).

asyncio's ``await fence`` / ``wait_async`` keep working as before, through the same
notifier thread; a poller is for loops that are not asyncio, or for many objects
with one reader.
"""

from __future__ import annotations

import itertools
import os
import select
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from .errors import HostlessError
from .fence import Fence
from .status import Status, fence_status
from .timeline import Point, _point_status

if TYPE_CHECKING:
    from ._aio import Notifier

__all__ = ["Poller", "Ready"]


class Ready(NamedTuple):
    """One report of a :class:`Poller`: the token :meth:`Poller.watch` returned, the
    object, its final status (``None`` when ``error`` is set) and the error that ended
    the wait, if any (``DomainClosed``, ``InvalidHandle``, ...)."""

    token: int
    obj: Fence | Point
    status: Status | None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.SUCCESS


class _Watch:
    """A notifier target (runs in the notifier thread): queue the word, write the eventfd."""

    __slots__ = ("poller", "token")

    def __init__(self, poller: Poller, token: int) -> None:
        self.poller = poller
        self.token = token

    def __call__(self, word: int) -> None:
        self.poller._post(self.token, word, None)

    def fail(self, exc: BaseException) -> None:
        self.poller._post(self.token, 0, exc)


class Poller:
    """One eventfd that becomes readable when a watched hostless object completes (see
    the module docstring for the design and the guarantees).  Objects of several domains
    may be watched by one poller.  Use as a context manager, or call :meth:`close`."""

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._mu = threading.Lock()
        self._tokens = itertools.count(1)
        # token -> (object, callback, notifier, notifier key)
        self._watches: dict[int, tuple[Fence | Point, Callable[[Ready], object] | None, Notifier, int]] = {}
        self._posted: deque[tuple[int, int, BaseException | None]] = deque()

    # ------------------------------------------------------------------ descriptor
    def fileno(self) -> int:
        """The eventfd: wait for it to be readable (select, poll, epoll, add_reader)."""
        if self._fd < 0:
            raise ValueError("the poller is closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def __len__(self) -> int:
        """Watches not reported yet."""
        with self._mu:
            return len(self._watches)

    # ------------------------------------------------------------------ watching
    def watch(self, obj: Fence | Point, callback: Callable[[Ready], object] | None = None) -> int:
        """Report ``obj`` (a fence or a timeline point, held by this process) through the
        descriptor once it completes; ``callback(ready)`` then runs in :meth:`ready`'s
        caller.  An object already complete is reported at once.  Returns a token (in
        :attr:`Ready.token`, for :meth:`unwatch`)."""
        if self._fd < 0:
            raise ValueError("the poller is closed")
        if isinstance(obj, Fence):
            obj._check_held()
            dom, handle, threshold = obj._dom, int(obj.handle), 1
        elif isinstance(obj, Point):
            obj.timeline._check_held()
            dom, handle, threshold = obj.timeline._dom, int(obj.timeline.handle), obj.value
        else:
            raise TypeError(f"a Poller watches a Fence or a timeline Point, got {type(obj).__name__}")
        if callback is not None and not callable(callback):
            raise TypeError("callback must be callable")
        notifier = dom.notifier()
        token = next(self._tokens)
        with self._mu:
            # registered before the notifier may fire it (its key is set just below)
            self._watches[token] = (obj, callback, notifier, -1)
        key = notifier.watch(handle, threshold, _Watch(self, token), None)
        with self._mu:
            entry = self._watches.get(token)
            if entry is not None:
                self._watches[token] = (entry[0], entry[1], entry[2], key)
        return token

    def unwatch(self, token: int) -> bool:
        """Stop watching ``token``: True when it had not been reported yet (it will not be)."""
        with self._mu:
            entry = self._watches.pop(token, None)
        if entry is None:
            return False
        entry[2].unwatch(entry[3])
        return True

    def _post(self, token: int, word: int, exc: BaseException | None) -> None:
        """Notifier thread: queue a completion and make the descriptor readable."""
        with self._mu:
            if self._fd < 0 or token not in self._watches:
                return  # closed, or unwatched meanwhile
            self._posted.append((token, word, exc))
            try:
                os.eventfd_write(self._fd, 1)
            except BlockingIOError:  # the counter is at its maximum: it is readable anyway
                pass

    # ------------------------------------------------------------------ reading
    def ready(self) -> list[Ready]:
        """The watches completed since the last call (never blocks; ``[]`` when none), each
        removed from the poller; their callbacks run here, in order."""
        if self._fd < 0:
            raise ValueError("the poller is closed")
        try:
            os.eventfd_read(self._fd)  # first: a post after this read leaves it readable
        except BlockingIOError:
            pass
        out: list[Ready] = []
        calls: list[tuple[Callable[[Ready], object], Ready]] = []
        with self._mu:
            posted = list(self._posted)
            self._posted.clear()
            entries = [(t, w, e, self._watches.pop(t, None)) for t, w, e in posted]
        for token, word, exc, entry in entries:
            if entry is None:
                continue  # unwatched after it was posted
            obj, cb = entry[0], entry[1]
            r = Ready(token, obj, None, exc) if exc is not None else self._report(token, obj, word)
            out.append(r)
            if cb is not None:
                calls.append((cb, r))
        first: BaseException | None = None
        for cb, r in calls:
            try:
                cb(r)
            except Exception as e:  # the other callbacks still run; the first error is raised
                if first is None:
                    first = e
        if first is not None:
            raise first
        return out

    @staticmethod
    def _report(token: int, obj: Fence | Point, word: int) -> Ready:
        try:
            if isinstance(obj, Fence):
                return Ready(token, obj, fence_status(word))
            return Ready(token, obj, _point_status(obj.timeline, word, obj.value))
        except HostlessError as e:  # a word nobody writes (CorruptDomain), a released handle
            return Ready(token, obj, None, e)

    def wait(self, timeout: float | None = None) -> list[Ready]:
        """Block until a report is ready (or ``timeout`` s pass: ``[]``), then :meth:`ready`.
        For programs without an event loop; Ctrl-C interrupts it."""
        fd = self.fileno()
        if self._posted:
            return self.ready()
        r, _w, _x = select.select([fd], [], [], timeout)
        return self.ready() if r else []

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Forget every watch and close the descriptor (remove it from your loop first)."""
        with self._mu:
            entries = list(self._watches.values())
            self._watches.clear()
            self._posted.clear()
            fd, self._fd = self._fd, -1
        for _obj, _cb, notifier, key in entries:
            notifier.unwatch(key)
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> Poller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._fd < 0 else f"fd {self._fd}, {len(self)} watched"
        return f"<hostless.Poller {state}>"
