"""The objects a domain makes beyond fences and timelines: composites (``merge``), buffers
and queues, and the heaps' figures.  :class:`~hostless.domain.Domain` inherits them from
:class:`DomainObjects` (one class for the user; two modules, split at this seam: creation,
joining and the lifecycle in :mod:`hostless.domain`, the objects that live in the fence
table's heap blocks and composites here)."""

from __future__ import annotations

import mmap
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from . import _core, shm
from ._abi import C
from .buffer import Buffer, ShapeLike, bytes_buffer, normalize_layout, pack_meta, pep3118, unpack_meta
from .errors import InvalidHandle
from .fence import Fence
from .queue import Queue
from .status import Status
from .timeline import Point, Timeline

__all__ = ["DomainObjects", "MAX_QUEUE_CAPACITY"]

_KIND_BUFFER = int(C.KIND_BUFFER)
_KIND_QUEUE = int(C.KIND_QUEUE)

MAX_QUEUE_CAPACITY = 1 << 20
"""The most packets a queue holds (capacities are powers of two from 2)."""


def _handle(handle: int) -> int:
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise InvalidHandle(f"a handle is an int, got {type(handle).__name__}")
    if not 0 < handle < (1 << 64):
        raise InvalidHandle(f"handle {handle} is out of the 64-bit range")
    return handle


class _Inner(list):  # type: ignore[type-arg]
    """What a composite made by ``Domain.merge`` keeps (in ``Fence._inner``, released
    with it): its inner nodes and child references, and ``leaves``, its children
    as given (fences and points), which a later merge flattens."""

    __slots__ = ("leaves",)

    def __init__(self) -> None:
        super().__init__()
        self.leaves: list[Fence | Point] = []


def _flattenable(c: Fence, leaves: list[Fence | Point]) -> bool:
    """Whether a composite child of merge() may be replaced by its leaves (sync_file's
    flattening) without changing what the new composite reads: the composite is still
    ACTIVE, every fence leaf is still held, and no leaf has failed yet.  A composite that
    completed, or that already carries a failure, is a child in its own right, so that a
    merge over it reads its status (the first failure in time), not the first failed leaf
    in list order; and so is one with a composite leaf (it may hold a failure already)."""
    if c.status is not Status.ACTIVE:
        return False
    for leaf in leaves:
        if isinstance(leaf, Fence):
            # a composite leaf may carry a failure while ACTIVE: never flattened further
            if leaf.merged or not leaf._held or leaf.status not in (Status.ACTIVE, Status.SUCCESS):
                return False
        elif leaf.timeline.failure is not None:
            return False
    return True


class DomainObjects:
    """Composites, buffers and queues of a :class:`~hostless.domain.Domain` (its base class:
    use them through a Domain)."""

    __slots__ = ()

    _core: _core.Core
    _layouts: dict[Any, tuple[tuple[int, ...], Any, int, bytes, str]]
    _devices: dict[str, int]

    if TYPE_CHECKING:  # provided by Domain

        def _check_open(self) -> None: ...

        def _raw_map(self) -> mmap.mmap: ...

        def import_timeline(self, handle: int) -> Timeline: ...

    def merge(self, children: Iterable[Fence | Point]) -> Fence:
        """A composite fence that completes when every child has: fences (merged
        ones included) and timeline points (``t.point(v)``), in any mix.

        Its status is SUCCESS when all children succeeded, otherwise the first
        failure propagated (a timeline's failure is its points' failure).  It
        cannot be signaled directly.  As with sync_file, children are
        flattened: a composite made here contributes its own children (while
        it is ACTIVE with no failed child; else it counts as one child, so
        that its status is what the new composite sees), points
        of one timeline keep the latest, a fence given twice counts once.  A
        fence may be in any number of merges: its first two are linked to it,
        each further one (and each point) takes one slot of the fence table
        (a watch node, docs/abi.md 5a), so DomainFull is the bound.  More than
        32 children build a tree of composites.  The composite holds a
        reference to each timeline of its points until it is released; a fence
        child whose last reference is released while ACTIVE is CANCELed, and
        so is the composite.
        """
        self._check_open()
        items = list(children)
        if not items:
            raise ValueError("merge() needs at least one fence or timeline point")
        fences: dict[int, Fence] = {}
        points: dict[int, Point] = {}

        def add(c: object) -> None:
            if isinstance(c, Point):
                t = c.timeline
                if t._dom is not self:
                    raise InvalidHandle("merge() of a point on a timeline of another domain object")
                t._check_held()
                old = points.get(t.handle)
                if old is None or old.value < c.value:
                    points[t.handle] = c
            elif isinstance(c, Fence):
                if c._dom is not self:
                    raise InvalidHandle("merge() of a fence that belongs to another domain object")
                c._check_held()
                leaves = getattr(c._inner, "leaves", None)
                if leaves is not None and _flattenable(c, leaves):
                    for leaf in leaves:
                        add(leaf)
                else:
                    fences.setdefault(c.handle, c)
            elif isinstance(c, Timeline):
                raise TypeError("merge() takes fences and timeline points: use timeline.point(value)")
            else:
                raise TypeError(f"merge() takes Fence objects and timeline points, got {type(c).__name__}")

        for c in items:
            add(c)
        n = int(C.MERGE_MAX_CHILDREN)
        inner = _Inner()
        try:
            # fence children are not referenced (releasing the last reference
            # of an ACTIVE one CANCELs it, and so the composite, as before);
            # timelines are, so that a point is not lost with the caller's object
            inner.leaves.extend(fences.values())
            for p in points.values():
                inner.leaves.append(Point(self.import_timeline(p.timeline.handle), p.value))
            kids: list[tuple[int, int]] = [(f.handle, 0) for f in fences.values()]
            kids += [(p.timeline.handle, p.value) for p in points.values()]
            while True:
                nxt = []
                for i in range(0, len(kids), n):
                    h, watches = self._core.merge_points(kids[i : i + n])
                    node = self._core.wrap(Fence, self, h)
                    for w in watches:
                        inner.append(self._core.wrap(Fence, self, w))
                    inner.append(node)
                    nxt.append((h, 0))
                if len(nxt) == 1:
                    break
                kids = nxt
            root: Fence = inner.pop()
        except BaseException:
            for node in inner:
                node.release()
            for leaf in inner.leaves:
                if isinstance(leaf, Point):
                    leaf.timeline.release()
            raise
        # Inner nodes (tree nodes, watch nodes) and the child references belong
        # to the root object: they are released with it (a node released before
        # it completes is CANCELed, as every fence is).
        inner.extend(leaf.timeline for leaf in inner.leaves if isinstance(leaf, Point))
        root._inner = inner
        return root

    # --------------------------------------------------------------- buffers
    def buffer(self, shape: ShapeLike, dtype: Any = None, *, device: str = "cpu") -> Buffer:
        """Allocate a buffer: ``buffer(nbytes)`` or ``buffer(shape, dtype)``.

        ``device="cpu"`` (the default): from the shared heap; data 64-byte
        aligned, 4096-byte aligned from 64 KiB up.  ``device="cuda:N"``: in
        the domain's device heap for GPU N (256-byte aligned; the slot
        records the placement and a small host block its dtype and shape, so
        every participant that imports it sees the same device, offset and
        layout); the host cannot view it (:class:`DeviceBufferError`).
        Contents are not zeroed.  Raises ValueError for a non-positive size,
        an unknown dtype or device, or a GPU without a device heap in this
        domain; OutOfMemory (with the free space) when the heap cannot hold
        it, DeviceHeapFull (naming the device) when the device heap cannot;
        DomainFull when the slot table is full.
        """
        self._check_open()
        key = (type(shape), shape, type(dtype), dtype)  # 16 and 16.0 hash alike
        try:
            shp, dt, nbytes, meta, fmt = self._layouts[key]
        except (KeyError, TypeError):
            shp, dt, nbytes = normalize_layout(shape, dtype)
            meta = pack_meta(shp, dt, nbytes)
            fmt = pep3118(dt)[0]
            if len(self._layouts) < 256:
                try:
                    self._layouts[key] = (shp, dt, nbytes, meta, fmt)
                except TypeError:  # unhashable shape or dtype spec
                    pass
        if device == "cpu":
            b: Buffer = self._core.new_buffer(
                Buffer, self, nbytes, meta, self._raw_map(), fmt, dt.itemsize, shp
            )
            b._init_layout(shp, dt, nbytes, b._window_off)
            return b
        dev = self._device_index(device)
        b = self._core.new_buffer(Buffer, self, nbytes, meta, None, fmt, dt.itemsize, shp, dev)
        b._init_layout(shp, dt, nbytes, -1, device, dev, b._window_off)
        return b

    def buffer_from(self, data: bytes | bytearray | memoryview) -> Buffer:
        """A new heap buffer holding a copy of ``data`` as bytes (an encoded argument block,
        ERT command or packet: ``Kernargs(...).to_buffer(dom)`` comes here); the caller
        releases it."""
        self._check_open()
        return bytes_buffer(self, bytes(data))

    def _device_index(self, device: str) -> int:
        """The index of ``device``'s heap (ValueError: not a device, or no heap for it here)."""
        try:
            return self._devices[device]
        except (KeyError, TypeError):
            pass
        if shm.parse_device(device) is None:
            raise ValueError('device "cpu" is the host heap')
        have = ", ".join(self._devices) or "none"
        raise ValueError(f"this domain has no device heap for {device} (device heaps: {have})")

    @property
    def devices(self) -> list[str]:
        """The devices this domain has heaps for (``"cuda:N"``), in heap-index order."""
        return list(self._devices)

    def import_buffer(self, handle: int) -> Buffer:
        """Take a reference to the buffer ``handle`` (InvalidHandle when stale, forged or not a buffer).

        A device buffer comes back with its device, offset, shape and dtype."""
        self._check_open()
        b: Buffer = self._core.adopt(Buffer, self, _handle(handle), _KIND_BUFFER)
        off, nbytes, meta, dev, doff = self._core.buffer_info(b.handle)
        try:
            shp, dt, n = unpack_meta(meta)
            if n != nbytes:
                raise InvalidHandle(f"buffer {b.handle:#x}: metadata says {n} bytes, the slot {nbytes}")
        except BaseException:
            b.release()
            raise
        if dev >= 0:
            name = next(k for k, i in self._devices.items() if i == dev)
            b._device = dev + 1
            b._init_layout(shp, dt, nbytes, -1, name, dev, doff)
            return b
        b._set_window(self._raw_map(), off, nbytes, False, *pep3118(dt), shp)
        b._init_layout(shp, dt, nbytes, off)
        return b

    # ---------------------------------------------------------------- queues
    def queue(self, capacity: int = 64) -> Queue:
        """A command queue of ``capacity`` packets (a power of two in 2..2^20), allocated from the heap.

        Its consumer binds with ``Queue.bind()``.  TypeError / ValueError for another
        capacity; OutOfMemory / DomainFull as for buffers.
        """
        self._check_open()
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise TypeError(f"queue capacity must be an int, got {type(capacity).__name__}")
        if not 2 <= capacity <= MAX_QUEUE_CAPACITY or capacity & (capacity - 1):
            raise ValueError(
                f"queue capacity must be a power of two in 2..2^20 ({MAX_QUEUE_CAPACITY}), got {capacity}"
            )
        h = self._core.queue_new(capacity)
        q: Queue = self._core.wrap(Queue, self, h)
        return q

    def import_queue(self, handle: int) -> Queue:
        """Take a reference to the queue ``handle``."""
        self._check_open()
        q: Queue = self._core.adopt(Queue, self, _handle(handle), _KIND_QUEUE)
        return q

    def heap_stats(self, device: str = "cpu") -> dict[str, int | float]:
        """Heap figures: size, used, free, largest_free, free_runs, fragmentation
        (1 - largest free run / free bytes), allocs, repairs (lock breaks after a death),
        granule.  ``device="cuda:N"``: the figures of that device heap (ValueError when
        the domain has none)."""
        self._check_open()
        pool = 0 if device == "cpu" else self._device_index(device) + 1
        st: dict[str, int | float] = dict(self._core.heap_stats(pool))
        free = st.get("free", 0)
        st["fragmentation"] = (1.0 - st["largest_free"] / free) if free else 0.0
        return st
