"""The wire formats: the bytes that producers and consumers of a queue exchange.

One home for each byte layout every participant (host, agent, GPU kernel,
firmware) reads or writes:

* the command packet, ``struct hl_packet`` (:class:`Packet`);
* the argument block of a KERNEL or ERT packet, ``struct hl_kernarg``
  (magic ``0x4B41524B``) followed by ``u64 buffers[nbuffers]``,
  ``u64 scalars[nscalars]`` and ``nfollow`` x ``struct hl_follow``
  (:class:`Kernargs`, :func:`decode_args`, :func:`encode_args`);
* the follow-up record, ``struct hl_follow``: a queue handle, then a packet
  the consumer enqueues when the current one succeeds (:class:`Follow`);
* the XRT ERT command layouts, whose one home is :mod:`hostless.ert`
  (re-exported here: :class:`ErtCommand`, :func:`ert_header`, ...);
* the frame program (:class:`FrameOps`): what a host does per frame of a
  prepared pipeline (store the frame number into words of argument blocks,
  push prepared packets with their value words set to it, copy between
  buffers, wait for timeline points), validated once by the engine and run
  per frame in one C call (``hostless._core.FrameProgram``);
* the trace ring's ``HL_EV_USER`` records that hostless writes (names, spans,
  a participant's join: :data:`USER_MAGIC`, :func:`unpack_text`), read and
  written by :mod:`hostless.trace`, the join written by the domain itself.

A codec does not allocate: :meth:`Kernargs.to_buffer` hands the encoded block
to the domain it is given (``Domain.buffer_from``).

Every offset and size comes from the C extension, which computes it with
``offsetof`` / ``sizeof`` from ``hostless.h`` (``PK_*``, ``KA_*``, ``FO_*``,
``KERNARG_SIZE``, ``FOLLOW_SIZE``), and :func:`_check` proves at import that
every layout here agrees with the exported sizes.

Decoding never reads past the bytes it is given: every count is checked
against the room left, by subtraction.  A malformed packet, block or
command raises :class:`BadPacket` (a ``ValueError``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from ._abi import C
from .ert import ErtCommand
from .ert import header as ert_header
from .ert import parse_header as ert_parse_header

__all__ = [
    "BadPacket",
    "PacketType",
    "Packet",
    "Follow",
    "Kernargs",
    "PACKET_SIZE",
    "KERNARG_SIZE",
    "FOLLOW_SIZE",
    "PK_SIGNAL",
    "PK_SIGNAL_VALUE",
    "FO_PACKET",
    "decode_args",
    "encode_args",
    "follow_offset",
    "FrameOps",
    "value_word_mask",
    "ErtCommand",
    "ert_header",
    "ert_parse_header",
    "USER_MAGIC",
    "unpack_text",
]


class BadPacket(ValueError):
    """A malformed packet, argument block or command (a consumer finishes it with ERROR)."""


# ------------------------------------------------------------------ packet
PACKET_SIZE = int(C.PACKET_SIZE)
PK_TYPE = int(C.PK_TYPE)
PK_FLAGS = int(C.PK_FLAGS)
PK_KERNEL = int(C.PK_KERNEL)
PK_ARGS = int(C.PK_ARGS)
PK_SIGNAL = int(C.PK_SIGNAL)
PK_SIGNAL_VALUE = int(C.PK_SIGNAL_VALUE)
PK_WAIT = int(C.PK_WAIT)
PK_WAIT_VALUE = int(C.PK_WAIT_VALUE)

# -------------------------------------------------- argument block, follow-up
KERNARG_MAGIC = int(C.KERNARG_MAGIC)
KA_MAGIC = int(C.KA_MAGIC)
KA_NBUFFERS = int(C.KA_NBUFFERS)
KA_NSCALARS = int(C.KA_NSCALARS)
KA_NFOLLOW = int(C.KA_NFOLLOW)
KERNARG_SIZE = int(C.KERNARG_SIZE)
FO_QUEUE = int(C.FO_QUEUE)
FO_PACKET = int(C.FO_PACKET)
FOLLOW_SIZE = int(C.FOLLOW_SIZE)
_WORD = 8  # buffers and scalars are u64


def _struct(fields: Sequence[tuple[int, str]], size: int) -> struct.Struct:
    """A little-endian struct with each (offset, format) at its offset, padded to ``size``;
    the fields must be given in offset order (the order :meth:`struct.Struct.pack` takes)."""
    fmt, pos = "<", 0
    for off, f in fields:
        if off < pos:
            raise ImportError(f"hostless.wire: field at {off} overlaps the one before (ABI mismatch)")
        fmt += f"{off - pos}x" if off > pos else ""
        fmt += f
        pos = off + struct.calcsize("<" + f)
    if pos > size:
        raise ImportError(f"hostless.wire: fields run to {pos}, past the size {size} (ABI mismatch)")
    return struct.Struct(fmt + (f"{size - pos}x" if size > pos else ""))


_PKT = _struct(
    [
        (PK_TYPE, "H"),
        (PK_FLAGS, "H"),
        (PK_KERNEL, "I"),
        (PK_ARGS, "Q"),
        (PK_SIGNAL, "Q"),
        (PK_SIGNAL_VALUE, "Q"),
        (PK_WAIT, "2Q"),
        (PK_WAIT_VALUE, "2Q"),
    ],
    PACKET_SIZE,
)
_KA = _struct([(KA_MAGIC, "I"), (KA_NBUFFERS, "H"), (KA_NSCALARS, "H"), (KA_NFOLLOW, "H")], KERNARG_SIZE)
_U64 = struct.Struct("<Q")


def _check() -> None:
    """The layouts agree with the exported sizes (an extension of another ABI fails the import)."""
    if _PKT.size != PACKET_SIZE or FOLLOW_SIZE < FO_PACKET + PACKET_SIZE or FO_QUEUE + 8 > FO_PACKET:
        raise ImportError("hostless.wire: packet or follow-up layout disagrees with the extension")
    if KERNARG_SIZE % _WORD or FOLLOW_SIZE % _WORD or FO_PACKET % _WORD:
        raise ImportError("hostless.wire: argument block records are not 8-byte aligned")


_check()


class PacketType:
    """``struct hl_packet.type``."""

    KERNEL = int(C.PKT_KERNEL)
    ERT = int(C.PKT_ERT)
    BARRIER = int(C.PKT_BARRIER)
    STOP = int(C.PKT_STOP)


def _check_field(name: str, v: object, bits: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < (1 << bits):
        raise ValueError(f"packet field {name} must be an int in 0..2**{bits}-1, got {v!r}")


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
        """The ``PACKET_SIZE`` bytes of struct hl_packet (little-endian).  ValueError names
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
            ("type", self.type, 16),
            ("flags", self.flags, 16),
            ("kernel", self.kernel, 32),
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
    def decode(cls, raw: bytes | memoryview) -> Packet:
        """The packet in ``raw``, exactly ``PACKET_SIZE`` bytes (struct.error otherwise)."""
        t, fl, k, a, s, sv, w0, w1, v0, v1 = _PKT.unpack(raw)
        return cls(
            type=t, kernel=k, args=a, signal=s, signal_value=sv, wait=(w0, w1), wait_value=(v0, v1), flags=fl
        )


@dataclass
class Follow:
    """A packet the consumer enqueues into ``queue`` when the current one succeeds (struct hl_follow)."""

    queue: int
    packet: Packet


def follow_offset(nbuffers: int, nscalars: int, j: int) -> int:
    """Byte offset, in an argument block with these counts, of follow-up record ``j``
    (its packet starts ``FO_PACKET`` bytes further)."""
    return KERNARG_SIZE + _WORD * (nbuffers + nscalars) + FOLLOW_SIZE * j


def encode_args(buffers: Sequence[int], scalars: Sequence[int], follow: Sequence[tuple[int, bytes]]) -> bytes:
    """The bytes of an argument block: buffer handles, scalars (taken modulo 2**64) and
    follow-ups as (queue handle, encoded packet).  ValueError when a count exceeds 65535."""
    if max(len(buffers), len(scalars), len(follow)) > 0xFFFF:
        raise ValueError("an argument block holds at most 65535 buffers, scalars and follow-ups each")
    out = bytearray(follow_offset(len(buffers), len(scalars), len(follow)))
    _KA.pack_into(out, 0, KERNARG_MAGIC, len(buffers), len(scalars), len(follow))
    struct.pack_into(f"<{len(buffers)}Q", out, KERNARG_SIZE, *buffers)
    struct.pack_into(
        f"<{len(scalars)}Q",
        out,
        KERNARG_SIZE + _WORD * len(buffers),
        *[s & 0xFFFFFFFFFFFFFFFF for s in scalars],
    )
    for j, (q, raw) in enumerate(follow):
        o = follow_offset(len(buffers), len(scalars), j)
        _U64.pack_into(out, o + FO_QUEUE, q)
        out[o + FO_PACKET : o + FO_PACKET + PACKET_SIZE] = raw
    return bytes(out)


def decode_args(block: Any) -> tuple[tuple[int, ...], tuple[int, ...], list[tuple[int, bytes]]]:
    """(buffers, scalars, [(queue, raw packet)]) of an argument block, without copying it.

    ``block`` is bytes, a memoryview or a NumPy array (read as bytes, whatever
    its dtype and shape).  BadPacket when it is shorter than its header, has a
    bad magic, or claims more entries than it has room for (every count is
    checked by subtraction before anything past the header is read)."""
    if isinstance(block, np.ndarray):
        raw: Any = block if block.ndim == 1 and block.dtype == np.uint8 else block.reshape(-1).view(np.uint8)
        n = int(raw.shape[0])
    else:
        raw, n = block, len(block)
    if n < KERNARG_SIZE:
        raise BadPacket("argument block shorter than its header")
    magic, nb, ns, nf = _KA.unpack_from(raw)
    if magic != KERNARG_MAGIC:
        raise BadPacket(f"argument block has a bad magic {magic:#x}")
    left = n - KERNARG_SIZE
    if nb > left // _WORD:
        raise BadPacket(f"argument block claims {nb} buffers, has room for {left // _WORD}")
    left -= _WORD * nb
    if ns > left // _WORD:
        raise BadPacket(f"argument block claims {ns} scalars, has room for {left // _WORD}")
    left -= _WORD * ns
    if nf > left // FOLLOW_SIZE:
        raise BadPacket(f"argument block claims {nf} follow-ups, has room for {left // FOLLOW_SIZE}")
    bufs = struct.unpack_from(f"<{nb}Q", raw, KERNARG_SIZE)
    scal = struct.unpack_from(f"<{ns}Q", raw, KERNARG_SIZE + _WORD * nb)
    follow = []
    for j in range(nf):
        o = follow_offset(nb, ns, j)
        follow.append(
            (_U64.unpack_from(raw, o + FO_QUEUE)[0], bytes(raw[o + FO_PACKET : o + FO_PACKET + PACKET_SIZE]))
        )
    return bufs, scal, follow


_B = TypeVar("_B", covariant=True)


class BufferSource(Protocol[_B]):
    """What :meth:`Kernargs.to_buffer` is handed: a domain (``Domain.buffer_from``)."""

    def buffer_from(self, data: bytes, /) -> _B: ...


@dataclass
class Kernargs:
    """The argument block of a KERNEL or ERT packet (struct hl_kernarg and what follows)."""

    buffers: list[int] = field(default_factory=list)
    scalars: list[int] = field(default_factory=list)
    follow: list[Follow] = field(default_factory=list)

    def nbytes(self) -> int:
        """Size of the encoded block."""
        return follow_offset(len(self.buffers), len(self.scalars), len(self.follow))

    def encode(self) -> bytes:
        """The bytes of the block (see :func:`encode_args`)."""
        return encode_args(self.buffers, self.scalars, [(f.queue, f.packet.encode()) for f in self.follow])

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> Kernargs:
        """Parse an argument block; ValueError (:class:`BadPacket`) when it is malformed
        (never reads past ``raw``)."""
        bufs, scal, follow = decode_args(bytes(raw))
        return cls(list(bufs), list(scal), [Follow(q, Packet.decode(p)) for q, p in follow])

    def signal_value_offsets(self) -> list[int]:
        """Byte offsets, in the encoded block, of the ``signal_value`` of each follow-up
        packet that has a signal (what a producer rewrites per use of a prepared block)."""
        nb, ns = len(self.buffers), len(self.scalars)
        return [
            follow_offset(nb, ns, j) + FO_PACKET + PK_SIGNAL_VALUE
            for j, f in enumerate(self.follow)
            if f.packet.signal
        ]

    def to_buffer(self, dom: BufferSource[_B]) -> _B:
        """A heap buffer of ``dom`` holding the encoded block (the caller releases it):
        ``dom.buffer_from(self.encode())``, the domain allocates."""
        return dom.buffer_from(self.encode())


# ----------------------------------------------------------- frame programs
def value_word_mask(p: Packet) -> int:
    """The words of ``p`` a frame program sets to the frame number: ``signal_value``,
    and ``wait_value[i]`` for each wait ``i`` the packet has (bit ``n``: u64 word ``n``)."""
    m = 1 << (PK_SIGNAL_VALUE // _WORD)
    for i in range(2):
        if p.wait[i]:
            m |= 1 << (PK_WAIT_VALUE // _WORD + i)
    return m


class FrameOps:
    """The ops of a frame program, in order, with a tag per op (what the op is to its
    builder: :mod:`hostless.graph` tags a wait with its stage).  :meth:`build` hands
    them to the engine, which validates them once (every handle held by this
    process and of its op's kind, every store inside its buffer, copies between
    buffers of one size; errors name the op) and runs them per frame with
    ``FrameProgram.run(frame, timeout_ns)``."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, ...]] = []
        self.tags: list[Any] = []
        self.watch: list[int] = []

    def store(self, buffer: int, offset: int, tag: Any = None) -> None:
        """The u64 at byte ``offset`` of ``buffer`` becomes the frame number."""
        self.ops.append((int(C.FOP_STORE), buffer, offset))
        self.tags.append(tag)

    def push(self, queue: int, packet: Packet, tag: Any = None) -> None:
        """Push ``packet`` into ``queue`` with its value words (:func:`value_word_mask`)
        set to the frame number."""
        self.ops.append((int(C.FOP_PUSH), queue, packet.encode(), value_word_mask(packet)))
        self.tags.append(tag)

    def copy(self, dst: int, src: int, tag: Any = None) -> None:
        """Copy buffer ``src`` into buffer ``dst`` (same size)."""
        self.ops.append((int(C.FOP_COPY), dst, src))
        self.tags.append(tag)

    def wait(self, timeline: int, watch: Sequence[int] = (), tag: Any = None) -> None:
        """Wait for ``timeline`` to reach the frame number; between sleep slices, check
        the ``watch`` timelines for a failure."""
        self.ops.append((int(C.FOP_WAIT), timeline, len(self.watch), len(watch)))
        self.watch.extend(watch)
        self.tags.append(tag)

    def __add__(self, other: FrameOps) -> FrameOps:
        out = FrameOps()
        for ops in (self, other):
            for op, tag in zip(ops.ops, ops.tags, strict=True):
                if op[0] == int(C.FOP_WAIT):
                    out.wait(op[1], ops.watch[op[2] : op[2] + op[3]], tag)
                else:
                    out.ops.append(op)
                    out.tags.append(tag)
        return out

    def build(self, core: Any, slice_s: float) -> Any:
        """The validated ``hostless._core.FrameProgram`` of these ops on ``core`` (a
        domain's ``_core``); waits sleep in slices of ``slice_s`` seconds."""
        return C.FrameProgram(core, self.ops, self.watch, int(slice_s * 1e9))


# ------------------------------------------------------ trace user records
USER_MAGIC = int(C.TRACE_USER_MAGIC)
"""High bits of ``a`` in the ``HL_EV_USER`` records hostless writes ("HL"); the low bits are a
record type (``TRACE_*``), ``b`` a key and ``c``, ``d``, ``e`` up to 24 bytes of UTF-8.  One
writer: the engine's ``hle_trace_user`` (core/records.c, ``_core.trace_user``); this is the
reader's side of the format, its values from ``hostless_engine.h``."""
TRACE_JOIN, TRACE_NAME_KERNEL, TRACE_NAME_HANDLE = (
    int(C.TRACE_JOIN), int(C.TRACE_NAME_KERNEL), int(C.TRACE_NAME_HANDLE)
)
TRACE_SPAN_BEGIN, TRACE_SPAN_END, TRACE_INSTANT = (
    int(C.TRACE_SPAN_BEGIN), int(C.TRACE_SPAN_END), int(C.TRACE_INSTANT)
)
TRACE_TEXT_BYTES = int(C.TRACE_TEXT_BYTES)


def unpack_text(c: int, d: int, e: int) -> str:
    """The text of a record's ``c``, ``d``, ``e`` words (UTF-8, NUL-padded)."""
    raw = b"".join(x.to_bytes(8, "little") for x in (c, d, e))
    return raw.rstrip(b"\0").decode("utf-8", errors="replace")
