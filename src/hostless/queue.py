"""Command queues: rings of 64-byte packets with a doorbell (AQL-like).

One consumer (the agent bound to the queue), many producers (the host, other
agents, GPU kernels, firmware).  A packet names a kernel of the consumer, its
argument block (a heap buffer holding buffer handles, scalars and follow-up
packets), up to two fences / timeline points to wait for and one to signal.
Follow-up packets are enqueued by the consumer when the packet completes
successfully: that is direct dispatch, the producing engine launching the
next engine's work with no host in between.

Guarantees: a full queue blocks (``timeout``) or raises :class:`QueueFull`;
a packet is never dropped or overwritten; a producer killed while filling a
packet does not wedge the consumer (recovery marks the cell SKIP and signals
the packet's fence OWNER_DIED).
"""

from __future__ import annotations

from typing import Any

from . import _core, lowlevel
from ._abi import C, handle_kind
from .errors import InvalidHandle
from .shm import check_spin
from .wire import Follow, Kernargs, Packet, PacketType

__all__ = ["Packet", "Follow", "Kernargs", "Queue", "PacketType"]
# Packet, Follow, Kernargs and PacketType are the wire formats (hostless.wire), re-exported here

_NO_TIMEOUT = lowlevel.NO_TIMEOUT


def _timeout_ns(timeout: float | None) -> int:
    if timeout is None:
        return _NO_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout must be None (forever) or seconds >= 0, got {timeout!r}")
    return int(timeout * 1e9)


class Queue(_core.Handle):
    """One reference to a command queue.  Create with ``Domain.queue()`` or ``Domain.import_queue()``."""

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Queue:
        raise TypeError("use Domain.queue() or Domain.import_queue()")

    def push(self, packet: Packet | bytes, timeout: float | None = None) -> int:
        """Enqueue a packet; returns its write index.

        Blocks while the queue is full; raises QueueFull after ``timeout``
        seconds (``0`` = do not wait), InvalidOperation when the queue is full
        and its consumer died (a queue with room takes the packet, and the
        agent respawned on the queue fails it unrun, its signal with
        OWNER_DIED: see :meth:`bind`), CorruptDomain when the queue's words
        were overwritten.
        """
        raw = packet.encode() if isinstance(packet, Packet) else packet
        return int(self._core.queue_push(self.handle, raw, _timeout_ns(timeout)))

    def bind(self) -> int:
        """Become the queue's consumer (it has none, or its consumer is dead).

        Returns the index below which the queue's packets were queued for the
        consumer this one replaces (0 for a queue's first consumer, or one
        already ours): those must not run, since their consumer died with them
        and their producers may have reused what they name; fail their signals
        (and their follow-ups') with OWNER_DIED instead, as the agents do.  A
        packet reserved after the takeover gets an index at or above it."""
        return int(self._core.queue_bind(self.handle))

    def pop(self, timeout: float | None = None, spin: float = 20e-6) -> tuple[int, Packet] | None:
        """Take the next packet (consumer only): (index, packet), or None after ``timeout``."""
        spin = check_spin(spin)
        r = self.pop_raw(_timeout_ns(timeout), int(spin * 1e9))
        if r is None:
            return None
        return int(r[0]), Packet.decode(r[1])

    def pop_raw(self, timeout_ns: int, spin_ns: int) -> tuple[int, bytes] | None:
        """As :meth:`pop` with the packet's raw bytes (for agents' inner loops; the same as
        :func:`hostless.lowlevel.queue_pop_raw`)."""
        r: tuple[int, bytes] | None = self._core.queue_pop(self.handle, timeout_ns, spin_ns)
        return r

    def completed(self) -> None:
        """Count one finished packet (consumer)."""
        self._core.queue_completed(self.handle)

    def info(self) -> dict[str, int]:
        """capacity, write_index, read_index, consumer, completed, doorbell."""
        d: dict[str, int] = self._core.queue_info(self.handle)
        return d

    def __repr__(self) -> str:
        if not lowlevel.is_held(self) or self._dom.closed:
            return f"<hostless.Queue {self.handle:#x} released>"
        i = self.info()
        return (
            f"<hostless.Queue {self.handle:#x} {i['write_index'] - i['read_index']}/{i['capacity']} pending>"
        )


def check_queue_handle(h: int) -> int:
    if handle_kind(h) != int(C.KIND_QUEUE):
        raise InvalidHandle(f"handle {h:#x} is not a queue")
    return h
