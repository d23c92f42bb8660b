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

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import _core
from ._abi import C
from .errors import InvalidHandle

if TYPE_CHECKING:
    from .buffer import Buffer
    from .domain import Domain

__all__ = ["Packet", "Follow", "Kernargs", "Queue", "PacketType"]

_PKT = struct.Struct("<HHIQQQ2Q2Q")
assert _PKT.size == int(C.PACKET_SIZE)
_KA = struct.Struct("<IHHHHI")
_NO_TIMEOUT = -1


class PacketType:
    KERNEL = int(C.PKT_KERNEL)
    ERT = int(C.PKT_ERT)
    BARRIER = int(C.PKT_BARRIER)
    STOP = int(C.PKT_STOP)


def _check_field(name: str, v: object, bits: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < (1 << bits):
        raise ValueError(f"packet field {name} must be an int in 0..2**{bits}-1, got {v!r}")


def _timeout_ns(timeout: float | None) -> int:
    if timeout is None:
        return _NO_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout must be None (forever) or seconds >= 0, got {timeout!r}")
    return int(timeout * 1e9)


@dataclass
class Packet:
    """One command packet (struct hl_packet)."""

    type: int = PacketType.KERNEL
    kernel: int = 0
    args: int = 0
    signal: int = 0
    signal_value: int = 0
    wait: tuple[int, int] = (0, 0)
    wait_value: tuple[int, int] = (0, 0)
    flags: int = 0

    def encode(self) -> bytes:
        """The 64 bytes of struct hl_packet (little-endian).  ValueError names
        a field that does not fit its width."""
        try:
            return _PKT.pack(
                self.type,
                self.flags,
                self.kernel,
                self.args,
                self.signal,
                self.signal_value,
                *self.wait,
                *self.wait_value,
            )
        except (struct.error, TypeError):
            pass  # the fast path failed: find the field and say which (off the hot path)
        for name, v, bits in (
            ("type", self.type, 32),
            ("flags", self.flags, 32),
            ("kernel", self.kernel, 64),
            ("args", self.args, 64),
            ("signal", self.signal, 64),
            ("signal_value", self.signal_value, 64),
        ):
            _check_field(name, v, bits)
        if len(self.wait) != 2 or len(self.wait_value) != 2:
            raise ValueError("wait and wait_value are pairs (two handles, two values; 0 = none)")
        for i in range(2):
            _check_field(f"wait[{i}]", self.wait[i], 64)
            _check_field(f"wait_value[{i}]", self.wait_value[i], 64)
        raise ValueError(f"cannot encode {self!r}")

    @classmethod
    def decode(cls, raw: bytes) -> Packet:
        t, fl, k, a, s, sv, w0, w1, v0, v1 = _PKT.unpack(raw)
        return cls(
            type=t, kernel=k, args=a, signal=s, signal_value=sv, wait=(w0, w1), wait_value=(v0, v1), flags=fl
        )


@dataclass
class Follow:
    """A packet the consumer enqueues into ``queue`` when the current one succeeds."""

    queue: int
    packet: Packet


@dataclass
class Kernargs:
    """The argument block of a KERNEL packet (struct hl_kernarg and what follows)."""

    buffers: list[int] = field(default_factory=list)
    scalars: list[int] = field(default_factory=list)
    follow: list[Follow] = field(default_factory=list)

    def nbytes(self) -> int:
        return _KA.size + 8 * (len(self.buffers) + len(self.scalars)) + 72 * len(self.follow)

    def encode(self) -> bytes:
        out = bytearray(
            _KA.pack(int(C.KERNARG_MAGIC), len(self.buffers), len(self.scalars), len(self.follow), 0, 0)
        )
        out += struct.pack(f"<{len(self.buffers)}Q", *self.buffers)
        out += struct.pack(f"<{len(self.scalars)}Q", *[s & 0xFFFFFFFFFFFFFFFF for s in self.scalars])
        for f in self.follow:
            out += struct.pack("<Q", f.queue) + f.packet.encode()
        return bytes(out)

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> Kernargs:
        """Parse an argument block; ValueError when it is malformed (never reads past ``raw``)."""
        raw = bytes(raw)
        if len(raw) < _KA.size:
            raise ValueError("argument block shorter than its header")
        magic, nb, ns, nf, _r0, _r1 = _KA.unpack_from(raw)
        if magic != int(C.KERNARG_MAGIC):
            raise ValueError(f"argument block has a bad magic {magic:#x}")
        # each count against the room left, by subtraction (as C must, without overflow)
        left = len(raw) - _KA.size
        for count, size, what in ((nb, 8, "buffers"), (ns, 8, "scalars"), (nf, 72, "follow-ups")):
            if count > left // size:
                raise ValueError(f"argument block claims {count} {what} but has room for {left // size}")
            left -= count * size
        off = _KA.size
        bufs = list(struct.unpack_from(f"<{nb}Q", raw, off))
        off += 8 * nb
        scal = list(struct.unpack_from(f"<{ns}Q", raw, off))
        off += 8 * ns
        fol = []
        for _ in range(nf):
            (q,) = struct.unpack_from("<Q", raw, off)
            fol.append(Follow(q, Packet.decode(raw[off + 8 : off + 72])))
            off += 72
        return cls(bufs, scal, fol)

    def to_buffer(self, dom: Domain) -> Buffer:
        """A heap buffer holding the encoded block (the caller releases it)."""
        from .buffer import bytes_buffer

        return bytes_buffer(dom, self.encode())


class Queue(_core.Handle):
    """One reference to a command queue.  Create with ``Domain.queue()`` or ``Domain.import_queue()``."""

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Queue:
        raise TypeError("use Domain.queue() or Domain.import_queue()")

    def push(self, packet: Packet | bytes, timeout: float | None = None) -> int:
        """Enqueue a packet; returns its write index.

        Blocks while the queue is full; raises QueueFull after ``timeout``
        seconds (``0`` = do not wait), InvalidOperation when the queue is full
        and its consumer died (a queue with room takes the packet: a respawned
        agent that binds it will run it), CorruptDomain when the queue's words
        were overwritten.
        """
        raw = packet.encode() if isinstance(packet, Packet) else packet
        return int(self._core.queue_push(self.handle, raw, _timeout_ns(timeout)))

    def bind(self) -> None:
        """Become the queue's consumer (it has none, or its consumer is dead)."""
        self._core.queue_bind(self.handle)

    def pop(self, timeout: float | None = None, spin: float = 20e-6) -> tuple[int, Packet] | None:
        """Take the next packet (consumer only): (index, packet), or None after ``timeout``."""
        if isinstance(spin, bool) or not isinstance(spin, (int, float)) or not spin >= 0:
            raise ValueError(f"spin must be seconds >= 0, got {spin!r}")
        r = self._core.queue_pop(self.handle, _timeout_ns(timeout), int(spin * 1e9))
        if r is None:
            return None
        return int(r[0]), Packet.decode(r[1])

    def pop_raw(self, timeout_ns: int, spin_ns: int) -> tuple[int, bytes] | None:
        """As :meth:`pop` with the packet's 64 raw bytes (for agents' inner loops)."""
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
        if not self._held or self._dom._closed:
            return f"<hostless.Queue {self.handle:#x} released>"
        i = self.info()
        return (
            f"<hostless.Queue {self.handle:#x} {i['write_index'] - i['read_index']}/{i['capacity']} pending>"
        )


def check_queue_handle(h: int) -> int:
    if (h >> 48) & 0xFF != int(C.KIND_QUEUE):
        raise InvalidHandle(f"handle {h:#x} is not a queue")
    return h
