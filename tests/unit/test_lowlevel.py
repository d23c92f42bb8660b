"""hostless.lowlevel (the supported hooks below the object API) and hostless.wire (the byte layouts)."""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

import hostless as hl
from hostless import lowlevel, trace, wire
from hostless._abi import C

DOCUMENTED = [
    "DeviceHeap",
    "QueueView",
    "base_address",
    "completion_word_offset",
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
    "word_compare_exchange",
    "word_exchange",
]


@pytest.fixture
def dom() -> Iterator[hl.Domain]:
    name = f"hltest-ll-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(name, fences=64, heap="1M", trace="64K")
    try:
        yield d
    finally:
        d.close()
        hl.Domain.unlink(name)


def test_exports_match_the_documented_list() -> None:
    assert sorted(lowlevel.__all__) == sorted(DOCUMENTED)
    for name in DOCUMENTED:
        obj = getattr(lowlevel, name)
        assert callable(obj), name
        assert obj.__doc__, f"{name} has no docstring"


def test_held_state_follows_release(dom: hl.Domain) -> None:
    f = dom.fence()
    assert lowlevel.is_held(f)
    f.release()
    assert not lowlevel.is_held(f)
    assert not lowlevel.is_held(object())


def test_layout_and_completion_word(dom: hl.Domain) -> None:
    lay = lowlevel.layout(dom)
    assert lay["size"] == int(dom.header()["total_size"])
    assert lay["fences_offset"] == int(dom.header()["fences_offset"])
    f = dom.fence()
    off = lowlevel.completion_word_offset(dom, f)
    assert off == lowlevel.completion_word_offset(dom, f.handle)
    raw = dom.raw()
    assert int.from_bytes(raw[off : off + 8], "little") == 0
    f.signal(hl.Status.ERROR)
    assert int.from_bytes(raw[off : off + 8], "little") == int(hl.Status.ERROR)
    assert lowlevel.handle_kind(f.handle) == int(C.KIND_FENCE)
    assert 0 <= lowlevel.handle_index(f.handle) < lay["fence_capacity"]
    with pytest.raises(hl.InvalidHandle):
        lowlevel.completion_word_offset(dom, dom.queue(4))  # not a fence or timeline
    assert lowlevel.base_address(dom) > 0


def test_raw_queue_push_pop_and_addresses(dom: hl.Domain) -> None:
    q = dom.queue(4)
    q.bind()
    p = hl.Packet(type=hl.PacketType.BARRIER, signal=7, signal_value=9)
    w = lowlevel.queue_push_raw(q, p.encode())
    got = lowlevel.queue_pop_raw(q, 0, 0)
    assert got is not None and got[0] == w and hl.Packet.decode(got[1]) == p
    assert lowlevel.queue_pop_raw(q, 0, 0) is None
    v = lowlevel.queue_view(dom, q)
    base = lowlevel.base_address(dom)
    assert v.capacity == 4 and base < v.queue < v.cells and v.packets > v.queue
    assert base < lowlevel.doorbell_address(dom, q) < base + lowlevel.layout(dom)["size"]
    assert lowlevel.host_wake_fn() != 0


def test_trace_emit_lands_in_the_ring(dom: hl.Domain) -> None:
    from hostless.trace import events

    lowlevel.trace_emit(dom, int(C.EV_USER), 1, 2, 3, 4, 5)
    lowlevel.tracer(dom)(int(C.EV_USER), 6, 7, 8, 9, 10)
    # (hostless.trace's own records, such as this participant's join, carry USER_MAGIC in a)
    ev = [e for e in events(dom) if e["type"] == int(C.EV_USER) and e["a"] & ~0xFF != trace.USER_MAGIC]
    assert [(e["a"], e["b"], e["c"], e["d"], e["e"]) for e in ev] == [(1, 2, 3, 4, 5), (6, 7, 8, 9, 10)]


def test_closed_domain_is_refused() -> None:
    name = f"hltest-ll2-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(name, fences=16)
    d.close()
    hl.Domain.unlink(name)
    with pytest.raises(hl.DomainClosed):
        lowlevel.layout(d)


# ------------------------------------------------------------------ wire


def test_wire_offsets_come_from_the_extension() -> None:
    assert wire.PACKET_SIZE == int(C.PACKET_SIZE)
    assert wire.PK_SIGNAL_VALUE == int(C.PK_SIGNAL_VALUE)
    assert wire.FOLLOW_SIZE == wire.FO_PACKET + wire.PACKET_SIZE
    assert issubclass(wire.BadPacket, ValueError)


def test_decode_args_agrees_with_kernargs_and_reads_in_place() -> None:
    fol = [hl.Follow(5, hl.Packet(signal=11, signal_value=3)), hl.Follow(6, hl.Packet())]
    ka = hl.Kernargs(buffers=[1, 2], scalars=[-1], follow=fol)
    raw = ka.encode()
    assert hl.Kernargs.decode(raw) == hl.Kernargs([1, 2], [(1 << 64) - 1], fol)
    for block in (raw, memoryview(raw), np.frombuffer(raw, np.uint8), np.frombuffer(raw, "<u8")):
        bufs, scal, follow = wire.decode_args(block)
        assert bufs == (1, 2) and scal == ((1 << 64) - 1,)
        assert [(q, hl.Packet.decode(p)) for q, p in follow] == [(f.queue, f.packet) for f in fol]
    # the follow-up packets lie where follow_offset says, and only signaled ones are patched
    (off,) = ka.signal_value_offsets()
    assert off == wire.follow_offset(2, 1, 0) + wire.FO_PACKET + wire.PK_SIGNAL_VALUE
    assert struct.unpack_from("<Q", raw, off)[0] == 3
    with pytest.raises(wire.BadPacket):
        wire.decode_args(raw[:-1])
    with pytest.raises(wire.BadPacket):
        wire.decode_args(b"\0" * wire.KERNARG_SIZE)
