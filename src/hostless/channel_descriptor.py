"""The descriptor a channel's publisher publishes under the channel's name: a host buffer of
u64 words (magic and version, depth, the published and claimed timelines, the slots' buffer
handles), and its reading by a subscriber or a second publisher: every word read once,
checked (magic, version, depth by subtraction against the buffer's size, no repeated
handle), and every handle imported by the engine (kind and generation checked).  Not a
public module: :mod:`hostless.channel` and :mod:`hostless.subscriber` use it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import names
from .buffer import Buffer
from .errors import ChannelError, CorruptChannel, HostlessError
from .timeline import Timeline

if TYPE_CHECKING:
    from .domain import Domain

MAX_DEPTH = 1024
"""The most slots a channel's ring has."""
_DESC_MAGIC = int.from_bytes(b"HLCHAN01", "little")
_VERSION = 1
_HDR = 8  # descriptor words before the slots' handles


def _words(buf: Buffer, count: int) -> list[int]:
    """One snapshot of ``count`` u64 words of a host buffer (read once: a peer may rewrite it)."""
    return [int(x) for x in np.frombuffer(buf.numpy().reshape(-1).view(np.uint8), "<u8", count)]


def _dead_channel(dom: Domain, key: str) -> bool:
    """Whether the descriptor published as ``key`` belongs to a publisher that left or died
    (or is not a channel at all: then it is not ours to keep either way, NameTaken stands)."""
    try:
        ring = _open_descriptor(dom, key, 0.0)
    except (ChannelError, KeyError, TimeoutError):
        return False
    try:
        return ring[0].failure is not None
    finally:
        for o in (ring[0], ring[1], *ring[2], ring[3]):
            o.release()


def _open_descriptor(
    dom: Domain, key: str, timeout: float | None
) -> tuple[Timeline, Timeline, list[Buffer], Buffer]:
    """(published, claimed, slots, descriptor) of the channel published as ``key``, validated."""
    try:
        desc = names.lookup(dom, key, timeout)
    except KeyError:
        raise TimeoutError(f"no channel {key[3:]!r} in this domain (no publisher has created it)") from None
    if not isinstance(desc, Buffer):
        if hasattr(desc, "release"):
            desc.release()
        raise CorruptChannel(f"{key!r} names a {type(desc).__name__}, not a channel descriptor")
    taken: list[Any] = []
    try:
        if desc.device != "cpu" or desc.nbytes < _HDR * 8 or desc.nbytes % 8:
            raise CorruptChannel(f"{key!r}: a descriptor is a host buffer of u64 words, got {desc!r}")
        words = desc.nbytes // 8
        w = _words(desc, words)
        if w[0] != _DESC_MAGIC or w[1] & 0xFFFFFFFF != _VERSION:
            raise CorruptChannel(f"{key!r}: not a channel descriptor of version {_VERSION} (magic/version)")
        depth = w[1] >> 32
        if not 1 <= depth <= MAX_DEPTH or depth > words - _HDR:
            raise CorruptChannel(f"{key!r}: depth {depth} is not in 1..{min(MAX_DEPTH, words - _HDR)}")
        if w[2] == w[3] or len(set(w[_HDR : _HDR + depth])) != depth:
            raise CorruptChannel(f"{key!r}: the descriptor repeats a handle")
        pub = dom.import_timeline(w[2])
        taken.append(pub)
        claim = dom.import_timeline(w[3])
        taken.append(claim)
        slots: list[Buffer] = []
        for h in w[_HDR : _HDR + depth]:
            b = dom.import_buffer(h)
            taken.append(b)
            slots.append(b)
            s0 = slots[0]
            if (b.shape, b.dtype, b.device) != (s0.shape, s0.dtype, s0.device):
                raise CorruptChannel(f"{key!r}: slot {b.handle:#x} differs from slot {s0.handle:#x}")
    except HostlessError as e:
        for o in (*taken, desc):
            o.release()
        if isinstance(e, ChannelError):
            raise
        raise CorruptChannel(f"{key!r}: {e}") from e
    except BaseException:
        for o in (*taken, desc):
            o.release()
        raise
    return pub, claim, slots, desc
