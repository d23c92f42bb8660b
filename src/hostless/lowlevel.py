"""Low-level hooks: what agents, device peers, tools and benchmarks need below the object API.

These functions are the supported way to reach the machinery behind a
:class:`~hostless.Domain` and its objects: raw packet words in and out of
queues, the host addresses a device or a C function is handed, the trace
ring, and whether a handle object still holds its reference.  Nothing here
reads a layout word from shared memory: addresses and offsets come from the
layout the extension validated when the domain was joined, so a participant
that rewrites the shared header cannot move them.

Every function that takes a domain raises :class:`~hostless.DomainClosed`
on a closed domain; a handle that is not a live object of the right kind
raises :class:`~hostless.InvalidHandle`.  Addresses are host virtual
addresses in this process (the domain's mapping), valid until the domain is
closed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from . import _core
from ._abi import C, handle_index, handle_kind
from .errors import InvalidHandle
from .queue import NO_TIMEOUT as NO_TIMEOUT  # timeout_ns that waits as long as it takes
from .queue import Queue

if TYPE_CHECKING:
    from .domain import Domain

__all__ = [
    "QueueView",
    "base_address",
    "completion_word_offset",
    "DeviceHeap",
    "device_heaps",
    "doorbell_address",
    "handle_index",
    "handle_kind",
    "host_push_fill",
    "host_push_fn",
    "host_push_state",
    "host_wake_fn",
    "is_held",
    "layout",
    "queue_pop_raw",
    "queue_push_raw",
    "queue_view",
    "trace_emit",
    "tracer",
    "word_exchange",
    "word_compare_exchange",
]


class QueueView(NamedTuple):
    """Host addresses of a validated queue (``struct hl_qview``): what a device producer is handed."""

    queue: int
    """Address of ``struct hl_queue``."""
    cells: int
    """Address of the cell array (one u64 per packet slot)."""
    packets: int
    """Address of the packet array (``capacity`` x ``struct hl_packet``)."""
    capacity: int
    """Packets the ring holds (a power of two)."""


class DeviceHeap(NamedTuple):
    """One device heap of a domain, as :func:`device_heaps` reports it (bytes)."""

    name: str
    """``"cuda:N"``."""
    heap_index: int
    """Its index in the domain (``Buffer.device_heap``)."""
    kind: int
    """DLPack device type (``C.DEVICE_CUDA`` = kDLCUDA)."""
    ordinal: int
    """N of ``cuda:N``."""
    size: int
    """The device range [0, size) its buffers' offsets are taken in."""
    granule: int
    """Allocation unit (and alignment) of its extents."""
    used: int
    free: int
    largest_free: int
    allocs: int
    """Allocations so far."""
    repairs: int
    """Times its bitmap was rebuilt after a lock holder died."""


def device_heaps(dom: Domain) -> list[DeviceHeap]:
    """The domain's device heaps in index order, with their figures (read under each heap's
    lock).  Descriptors come from the layout validated at join; an empty list when the domain
    has none."""
    dom._check_open()
    out = []
    for i, (kind, ordinal) in enumerate(dom._core.device_heaps()):
        st = dom._core.heap_stats(i + 1)
        out.append(
            DeviceHeap(
                f"cuda:{ordinal}",
                i,
                int(kind),
                int(ordinal),
                int(st["size"]),
                int(st["granule"]),
                int(st["used"]),
                int(st["free"]),
                int(st["largest_free"]),
                int(st["allocs"]),
                int(st["repairs"]),
            )
        )
    return out


def _handle_of(obj: Any) -> int:
    h = obj.handle if hasattr(obj, "handle") else obj
    if isinstance(h, bool) or not isinstance(h, int):
        raise InvalidHandle(f"a handle is an int or an object with .handle, got {type(obj).__name__}")
    return h


def is_held(obj: Any) -> bool:
    """Whether the handle object ``obj`` (fence, timeline, buffer, queue) still holds its
    reference: False after ``release()`` and after its domain was closed or left."""
    return bool(getattr(obj, "_held", False))


def layout(dom: Domain) -> dict[str, int]:
    """The domain's layout as validated at join, private to this process: ``size``,
    ``participants_offset``, ``participant_capacity``, ``fences_offset``, ``fence_capacity``,
    ``poll_ns``, ``heap_offset``, ``heap_data_offset``, ``heap_granules``, ``heap_data_size``,
    ``trace_offset`` and ``trace_capacity`` (offsets in bytes from the mapping's start; 0 for
    a table the domain has not)."""
    dom._check_open()
    return {k: int(v) for k, v in dom._core.view().items()}


def base_address(dom: Domain) -> int:
    """Host address of byte 0 of the domain's mapping in this process."""
    dom._check_open()
    return int(dom._core.address())


def completion_word_offset(dom: Domain, obj: Any) -> int:
    """Byte offset, from the mapping's start, of the 64-bit completion word of the fence,
    merged fence or timeline ``obj`` (an object or its handle): the word a device waits on
    with ``>= value`` and signals with one aligned store.  InvalidHandle when the handle is
    not of a synchronization kind or names no slot of this domain (it is not checked for
    staleness: the caller holds the object)."""
    h = _handle_of(obj)
    if handle_kind(h) not in (int(C.KIND_FENCE), int(C.KIND_MERGED), int(C.KIND_TIMELINE)):
        raise InvalidHandle(f"handle {h:#x} is not a fence or timeline")
    lay = layout(dom)
    idx = handle_index(h)
    if not 0 <= idx < lay["fence_capacity"]:
        raise InvalidHandle(f"handle {h:#x} names no slot")
    return lay["fences_offset"] + idx * int(C.FENCE_SIZE) + int(C.F_WORD)


def queue_view(dom: Domain, queue: Queue | int) -> QueueView:
    """The queue's addresses, validated once on the host (live queue, block inside the heap,
    magic, power-of-two capacity): InvalidHandle or CorruptDomain otherwise."""
    dom._check_open()
    q, cells, packets, cap = dom._core.queue_view(_handle_of(queue))
    return QueueView(int(q), int(cells), int(packets), int(cap))


def doorbell_address(dom: Domain, queue: Queue | int) -> int:
    """Host address of the queue's doorbell word (a futex its consumer sleeps on)."""
    dom._check_open()
    return int(dom._core.queue_doorbell_addr(_handle_of(queue)))


def queue_push_raw(queue: Queue, raw: bytes, timeout_ns: int = NO_TIMEOUT) -> int:
    """Enqueue the encoded packet ``raw`` (``PACKET_SIZE`` bytes); returns its write index.
    Waits up to ``timeout_ns`` for room (``NO_TIMEOUT``: forever), then QueueFull; the
    errors of :meth:`Queue.push` otherwise."""
    return int(queue._core.queue_push(queue.handle, raw, timeout_ns))  # as Queue.push


def queue_pop_raw(queue: Queue, timeout_ns: int = NO_TIMEOUT, spin_ns: int = 0) -> tuple[int, bytes] | None:
    """Consumer only: the next packet as (write index, raw bytes), polling ``spin_ns`` then
    sleeping on the doorbell; None when nothing came within ``timeout_ns``."""
    return queue.pop_raw(timeout_ns, spin_ns)


def trace_emit(dom: Domain, event: int, a: int = 0, b: int = 0, c: int = 0, d: int = 0, e: int = 0) -> None:
    """Append one event (``EV_*`` type and five u64 fields, taken modulo 2**64) to the domain's
    trace ring, stamped with this participant and the trace clock; nothing when the domain
    has no trace ring.  Lock-free: a reader drops an event it sees half written."""
    dom._core.trace(event, a, b, c, d, e)


def tracer(dom: Domain) -> Callable[[int, int, int, int, int, int], None]:
    """:func:`trace_emit` bound to ``dom``, for inner loops: ``emit(event, a, b, c, d, e)``
    (all six arguments given; valid while the domain is open)."""
    dom._check_open()
    emit: Callable[[int, int, int, int, int, int], None] = dom._core.trace
    return emit


def host_wake_fn() -> int:
    """Address of the C function ``void hl_host_wake(void *word)``: after a device stored to
    a completion word (``addr`` = the word) or a queue doorbell, it wakes the host threads
    asleep on it with one FUTEX_WAKE (no Python: usable as a ``cuLaunchHostFunc`` callback)."""
    return int(_core.host_wake_fn())


def host_push_fn() -> int:
    """Address of the C function ``void hle_host_push(void *rec)`` (a ``cuLaunchHostFunc``
    callback): pushes the packet its record names into a queue with the host's atomics when
    the record's gate is 0, then rings the queue's doorbell (no Python)."""
    return int(_core.host_push_fn())


def host_push_fill(
    rec: Any, q: int, cells: int, packets: int, capacity: int, packet: int, doorbell: int, producer: int,
    timeout_ns: int,
) -> int:
    """Write a push record into the writable buffer ``rec`` (host addresses from
    :func:`queue_view` and :func:`doorbell_address`); returns the byte offset of its int32
    gate, which the stream sets before the push runs (0 = push)."""
    return int(_core.host_push_fill(rec, q, cells, packets, capacity, packet, doorbell, producer, timeout_ns))


def host_push_state(rec: Any) -> tuple[int, int]:
    """(done, result) of a push record: done is 1 once the push ran."""
    d, r = _core.host_push_state(rec)
    return int(d), int(r)


def word_exchange(buf: Any, value: int) -> int:
    """Atomically store ``value`` in the first 8 bytes of writable buffer ``buf`` (a NumPy
    view of a heap word); returns the word it replaced.  The host's atomics: a GPU's on
    host memory are not atomic against them where it lacks host-native atomics."""
    return int(_core.word_op(buf, 0, value, 0))


def word_compare_exchange(buf: Any, expected: int, value: int) -> int:
    """Atomically: if the first 8 bytes of ``buf`` hold ``expected``, store ``value``;
    returns the word seen (``expected`` when the store was made)."""
    return int(_core.word_op(buf, 1, expected, value))
