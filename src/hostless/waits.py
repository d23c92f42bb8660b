"""Waiting on several fences and timeline points at once: ``wait_any`` and
``wait_all`` (Vulkan's ``vkWaitSemaphores`` with and without
``VK_SEMAPHORE_WAIT_ANY_BIT``, ``poll()`` over sync_files), in threads and in
asyncio.

Objects may be any mix of :class:`~hostless.Fence` (merged ones included) and
:class:`~hostless.Point` (``timeline.point(v)``), of any domains this process
joined.  Objects of one domain are waited on with one blocking wait over all
their words (``futex_waitv``: the GIL is released, Ctrl-C ends it within a few
ms, a store by a device is seen within the domain's poll interval); objects of
several domains are waited on in turns of 1 ms per domain.

:class:`WaitSet` is the prepared form for a loop that waits on the same objects
again and again: built once, each ``wait_any`` is one C call that returns an
index (no object is read and no result is built per call), and a point's value
moves with ``set_value``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from . import _core
from ._abi import C
from .fence import Fence
from .status import Status, fence_status
from .timeline import Point, _point_status

if TYPE_CHECKING:
    from .domain import Domain

__all__ = [
    "Completed",
    "WaitSet",
    "Waitable",
    "packet_waits",
    "wait_all",
    "wait_all_async",
    "wait_any",
    "wait_any_async",
]

Waitable = Fence | Point
"""What the multi-object waits and ``Domain.merge`` take: a fence or a timeline point."""

_BATCH = 127  # one futex_waitv takes 128 words; one is the private kick word
_SLICE_NS = 1_000_000  # the turn of each domain (or batch) when there are several


class Completed(NamedTuple):
    """One completed object of a multi-object wait: its position in the list
    given, the object, and its final status (SUCCESS, or the failure: a fence's
    status, a timeline's failure).  Immutable (a named tuple: cheap to make)."""

    index: int  # type: ignore[assignment]  # (shadows tuple.index, as intended)
    obj: Waitable
    status: Status

    @property
    def ok(self) -> bool:
        """True when the status is SUCCESS."""
        return self.status is Status.SUCCESS


def _target(obj: object) -> tuple[Domain, int, int]:
    """(domain, handle, threshold) of a waitable; clear errors otherwise."""
    if isinstance(obj, Fence):
        obj._check_held()
        return obj._dom, int(obj.handle), 1
    if isinstance(obj, Point):
        obj.timeline._check_held()
        return obj.timeline._dom, int(obj.timeline.handle), obj.value
    from .timeline import Timeline

    if isinstance(obj, Timeline):
        raise TypeError(
            "a Timeline is not waitable by itself: wait on one of its points, timeline.point(value)"
        )
    raise TypeError(f"expected a Fence or a timeline Point (timeline.point(v)), got {type(obj).__name__}")


def _status(obj: Waitable, word: int) -> Status:
    if isinstance(obj, Point):
        return _point_status(obj.timeline, word, obj.value)
    return fence_status(word)


def _items(objs: Iterable[Waitable]) -> tuple[list[Waitable], list[tuple[Domain, int, int]]]:
    items = list(objs)
    if not items:
        raise ValueError("nothing to wait for: pass at least one Fence or Point")
    return items, [_target(o) for o in items]


def _ready_now(items: Sequence[Waitable], targets: Sequence[tuple[Domain, int, int]]) -> int:
    for i, (dom, h, thr) in enumerate(targets):
        if dom._core.word(h) >= thr:
            return i
    return -1


def _completed(items: Sequence[Waitable], targets: Sequence[tuple[Domain, int, int]], i: int) -> Completed:
    dom, h, _thr = targets[i]
    return Completed(i, items[i], _status(items[i], dom._core.word(h)))


if TYPE_CHECKING:

    def wait_any(objs: Iterable[Waitable], timeout: float | None = None) -> Completed:
        """Block until one of ``objs`` has completed; returns it (the first in the
        list's order among those complete) with its status.

        A failure completes an object too (its status says so).  Raises
        TimeoutError after ``timeout`` seconds (None: no limit), KeyboardInterrupt
        on Ctrl-C, TypeError for what is not a Fence or Point, InvalidHandle for a
        released one, ValueError for an empty list.
        """

    def wait_all(objs: Iterable[Waitable], timeout: float | None = None) -> list[Completed]:
        """Block until every one of ``objs`` has completed; returns them all, in the
        list's order, with their statuses (a failure completes an object too: check
        ``ok``).

        Raises TimeoutError after ``timeout`` seconds (None: no limit) saying how
        many completed, KeyboardInterrupt on Ctrl-C, and the errors of
        :func:`wait_any` for bad input.
        """

else:
    # C functions (binding/waits.c): a list or tuple of held Fences and Points of one
    # domain is one call (the objects read from their C structs, the engine's
    # hle_wait_many, the Completed built); anything else comes to the general paths below
    wait_any = _core.wait_any
    wait_all = _core.wait_all


def _wait_any_general(objs: Iterable[Waitable], timeout: float | None) -> Completed:
    """wait_any for what the one-call path does not take: objects of several domains,
    more than one engine wait holds, an iterable that is not a list or tuple, and bad
    input (the errors that say what is wrong)."""
    if timeout is not None and not timeout >= 0:  # NaN too, as the one-call path
        raise ValueError("timeout must be >= 0 or None")
    items, targets = _items(objs)
    deadline = None if timeout is None else time.monotonic_ns() + int(timeout * 1e9)
    groups: dict[int, tuple[Domain, list[int]]] = {}
    for i, (dom, _h, _thr) in enumerate(targets):
        groups.setdefault(id(dom), (dom, []))[1].append(i)
    batches = [(dom, idx[k : k + _BATCH]) for dom, idx in groups.values() for k in range(0, len(idx), _BATCH)]
    turn = 0
    while True:
        i = _ready_now(items, targets)
        if i >= 0:
            return _completed(items, targets, i)
        now = time.monotonic_ns()
        if deadline is not None and now >= deadline:
            raise TimeoutError(f"none of {len(items)} objects completed within {timeout} s")
        left = -1 if deadline is None else deadline - now
        dom, idx = batches[turn % len(batches)]
        turn += 1
        nap = left if len(batches) == 1 else (_SLICE_NS if left < 0 else min(left, _SLICE_NS))
        core = dom._core
        core.wait_any([(targets[j][1], targets[j][2]) for j in idx], nap, core.kick_value())


def _wait_all_general(objs: Iterable[Waitable], timeout: float | None) -> list[Completed]:
    """wait_all for what the one-call path does not take (as :func:`_wait_any_general`)."""
    items, targets = _items(objs)
    if timeout is not None and not timeout >= 0:  # NaN too, as the one-call path
        raise ValueError("timeout must be >= 0 or None")
    deadline = None if timeout is None else time.monotonic() + timeout
    for i, o in enumerate(items):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            o.wait(left)
        except TimeoutError:
            done = sum(1 for d, h, thr in targets if d._core.word(h) >= thr)
            raise TimeoutError(
                f"{done} of {len(items)} objects completed within {timeout} s (the first pending: index {i})"
            ) from None
    return [_completed(items, targets, i) for i in range(len(items))]


_core.set_completed(Completed, _wait_any_general, _wait_all_general)


class WaitSet(_core.WaitSet):
    """A prepared wait over a fixed list of fences and timeline points of one
    domain (any mix, 1..127 objects): :func:`wait_any` for a loop that waits on
    the same objects again and again.

    The objects are read and checked once, here; each :meth:`wait_any` is then
    one C call (the engine's wait over every word, the GIL released while it
    sleeps) that returns the index of the first complete object in the set's
    order, an ``int``: no object is read, no list and no :class:`Completed` are
    built per call.  :meth:`set_value` moves a point of the set to another
    value of its timeline (a loop waiting for frame ``i``) without building a
    :class:`~hostless.Point`.

    Methods (in C, inherited):

    * ``wait_any(timeout=None) -> int``: block until one object has completed
      (a failure completes an object too); the index of the first complete
      one.  TimeoutError after ``timeout`` seconds (None: no limit),
      KeyboardInterrupt on Ctrl-C within a few ms, InvalidHandle when an
      object was released since, DomainClosed.
    * ``wait_all(timeout=None) -> None``: block until every object has
      completed; TimeoutError says how many did.
    * ``value(i) -> int`` and ``set_value(i, value)``: the value of point
      ``i`` (0 for a fence); ValueError for a fence or a value outside
      0..2**62-1.

    The set keeps its objects' handles alive but does not own them: releasing
    one of them makes the next wait raise InvalidHandle.  Objects of several
    domains: use :func:`wait_any`.
    """

    __slots__ = ("_fences",)

    def __init__(self, objs: Iterable[Waitable]) -> None:
        items, targets = _items(objs)
        doms = {id(dom) for dom, _h, _thr in targets}
        if len(doms) > 1:
            raise ValueError(
                f"a WaitSet's objects are of one domain, got objects of {len(doms)}: "
                "use hl.wait_any for objects of several domains"
            )
        if len(items) > int(C.WAIT_MANY_MAX):
            raise ValueError(
                f"a WaitSet holds at most {int(C.WAIT_MANY_MAX)} objects, got {len(items)}: "
                "merge some first (Domain.merge) or use hl.wait_any"
            )
        super().__init__(items)
        self._fences = [o if isinstance(o, Fence) else None for o in items]

    def __len__(self) -> int:
        return int(self._n)

    @property
    def objs(self) -> list[Waitable]:
        """The set's objects, in its order (a point as it is now: ``set_value`` moves it)."""
        out: list[Waitable] = []
        for i, f in enumerate(self._fences):
            out.append(f if f is not None else Point(self._holders[i], self.value(i)))
        return out

    def status(self, i: int) -> Status:
        """ACTIVE until object ``i`` completes, then SUCCESS or its failure (a fence's
        status, a timeline's failure; a point reached before the failure is SUCCESS), as
        :attr:`Completed.status`.  IndexError, InvalidHandle, DomainClosed."""
        s = self._status(i)
        return Status.ACTIVE if s is None else s

    def completed(self, i: int) -> Completed:
        """Object ``i`` with its status now (what :func:`wait_any` returns, for the index
        :meth:`wait_any` gave): ``Completed(i, obj, status)``."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"WaitSet index {i} out of range ({len(self)} objects)")
        i %= len(self)
        return Completed(i, self.objs[i], self.status(i))


async def wait_any_async(objs: Iterable[Waitable], timeout: float | None = None) -> Completed:
    """:func:`wait_any` without blocking the event loop (the domains' notifier
    threads watch the words).  Cancelling it stops watching."""
    items, targets = _items(objs)
    i = _ready_now(items, targets)
    if i >= 0:
        return _completed(items, targets, i)
    tasks = [asyncio.ensure_future(o.wait_async()) for o in items]
    try:
        done, _pending = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            raise TimeoutError(f"none of {len(items)} objects completed within {timeout} s")
        first = min(tasks.index(t) for t in done)
        return Completed(first, items[first], tasks[first].result())
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()


async def wait_all_async(objs: Iterable[Waitable], timeout: float | None = None) -> list[Completed]:
    """:func:`wait_all` without blocking the event loop."""
    items, _targets = _items(objs)
    tasks = [asyncio.ensure_future(o.wait_async()) for o in items]
    try:
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        if pending:
            raise TimeoutError(f"{len(done)} of {len(items)} objects completed within {timeout} s")
        return [Completed(i, o, t.result()) for i, (o, t) in enumerate(zip(items, tasks, strict=True))]
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()


def packet_waits(*objs: Waitable) -> dict[str, Any]:
    """The ``wait`` and ``wait_value`` fields of a :class:`~hostless.Packet`
    for up to two fences or points: ``Packet(..., **hl.packet_waits(p, f))``.
    A packet waits on a timeline with ``word >= wait_value`` (a point) and on a
    fence until it is signaled."""
    if len(objs) > 2:
        raise ValueError(f"a packet waits on at most two objects, got {len(objs)} (merge the rest first)")
    hs, vs = [0, 0], [0, 0]
    for i, o in enumerate(objs):
        _dom, h, thr = _target(o)
        hs[i], vs[i] = h, (thr if isinstance(o, Point) else 0)
    return {"wait": (hs[0], hs[1]), "wait_value": (vs[0], vs[1])}
