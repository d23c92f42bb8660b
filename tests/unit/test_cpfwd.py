"""The GPU command processor's host forwarder (core/cpfwd.c), driven here as the processor
drives it, with no GPU: follow-ups written into the outbox (hostless_gpucp.h) are pushed with
the host's atomics, in order, racing host producers without a loss; one into the processor's
own queue never waits and leaves its hop count where the processor reads it; one that cannot
be pushed (a stale or foreign queue handle, a full queue) fails its signal; a stop forwards
what the outbox holds."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

import hostless as hl
from hostless import _core
from hostless._abi import C

N = int(C.CP_OUTBOX)


@pytest.fixture
def dom(domain_name: str) -> Iterator[hl.Domain]:
    d = hl.Domain.create(domain_name, fences=4096, participants=16, heap="16M")
    try:
        yield d
    finally:
        d.close()


class FakeProcessor:
    """Writes outbox slots as gpucp_sync.cu's cp_out_put does."""

    def __init__(self) -> None:
        self.ob = np.zeros(int(C.CP_OUTBOX_SIZE), np.uint8)
        self.words = self.ob.view(np.uint64)
        self.pos = 0

    def taken(self) -> int:
        return int(self.words[0])

    def put(self, queue: int, packet: hl.Packet, hops: int = 0, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self.pos >= self.taken() + N:  # full: wait for the forwarder
            assert time.monotonic() < deadline, "the forwarder took nothing"
            time.sleep(1e-4)
        at = int(C.CP_OUTBOX_SLOTS) + (self.pos % N) * int(C.CP_OUT_SIZE)
        w = at // 8
        self.words[w + int(C.CP_OUT_QUEUE) // 8] = queue
        self.words[w + int(C.CP_OUT_HOPS) // 8] = hops
        p = int(C.CP_OUT_PACKET)
        self.ob[at + p : at + p + 64] = np.frombuffer(packet.encode(), np.uint8)
        self.words[w] = self.pos + 1  # seq, last (x86 keeps stores in order)
        self.pos += 1

    def hop_word(self, index: int) -> int:
        return int(self.words[int(C.CP_OUTBOX_HOPS) // 8 + index % int(C.CP_HOPS)])

    def drained(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self.taken() < self.pos:
            assert time.monotonic() < deadline
            time.sleep(1e-4)


def test_pushes_in_order_and_races_host_producers(dom: hl.Domain) -> None:
    own, other = dom.queue(8), dom.queue(8192)
    other.bind()
    fp = FakeProcessor()
    fwd = _core.cpfwd_start(dom._core, fp.ob, own.handle)
    n = 3000

    def host() -> None:
        for i in range(n):
            other.push(hl.Packet(kernel=2, signal_value=i + 1))

    t = threading.Thread(target=host)
    t.start()
    for i in range(n):
        fp.put(other.handle, hl.Packet(kernel=1, signal_value=i + 1))
    t.join()
    fp.drained()
    assert _core.cpfwd_stop(fwd) == (n, 0)
    seen: dict[int, list[int]] = {1: [], 2: []}
    for _ in range(2 * n):
        r = other.pop(timeout=2)
        assert r is not None
        seen[r[1].kernel].append(r[1].signal_value)
        other.completed()
    assert seen[1] == list(range(1, n + 1)) and seen[2] == list(range(1, n + 1))
    assert _core.cpfwd_stop(fwd) == (0, 0)  # stopped twice: nothing more


def test_own_queue_hops_are_recorded_before_the_packet(dom: hl.Domain) -> None:
    own = dom.queue(4)
    own.bind()
    fp = FakeProcessor()
    fwd = _core.cpfwd_start(dom._core, fp.ob, own.handle)
    try:
        for h in (1, 7, 64):
            fp.put(own.handle, hl.Packet(kernel=5, signal_value=h), hops=h)
            fp.drained()
            r = own.pop(timeout=2)
            assert r is not None
            idx = r[0]
            word = fp.hop_word(idx)
            assert word & ((1 << 56) - 1) == idx + 1 and word >> 56 == h
            own.completed()
        for _ in range(4):  # our own queue never waits: full, the follow-up fails at once
            fp.put(own.handle, hl.Packet(kernel=5))
        sig = dom.fence()
        t0 = time.monotonic()
        fp.put(own.handle, hl.Packet(kernel=5, signal=sig.handle))
        assert sig.wait(2) == hl.Status.ERROR
        assert time.monotonic() - t0 < 0.5
    finally:
        _core.cpfwd_stop(fwd)


def test_a_follow_up_that_cannot_be_pushed_fails_its_signal(dom: hl.Domain) -> None:
    own = dom.queue(4)
    fp = FakeProcessor()
    fwd = _core.cpfwd_start(dom._core, fp.ob, own.handle)
    try:
        gone = dom.queue(4)
        stale = gone.handle
        gone.release()
        buf = dom.buffer((4,), "f4")
        tl = dom.timeline()
        for qh in (stale, buf.handle, 0, 0x1234_5678_9ABC_DEF0):
            sig = dom.fence()
            fp.put(qh, hl.Packet(kernel=1, signal=sig.handle))
            assert sig.wait(2) == hl.Status.ERROR, qh
        fp.put(buf.handle, hl.Packet(kernel=1, signal=tl.handle, signal_value=3))
        assert tl.wait(3, timeout=2) == hl.Status.ERROR  # a timeline signal fails it
        fp.drained()
    finally:
        pushed, failed = _core.cpfwd_stop(fwd)
    assert (pushed, failed) == (0, 5)


def test_stop_forwards_what_the_outbox_holds(dom: hl.Domain) -> None:
    own, other = dom.queue(4), dom.queue(64)
    other.bind()
    fp = FakeProcessor()
    fwd = _core.cpfwd_start(dom._core, fp.ob, own.handle)
    for i in range(20):
        fp.put(other.handle, hl.Packet(kernel=1, signal_value=i))
    assert _core.cpfwd_stop(fwd)[0] == 20
    assert fp.taken() == 20


def test_outbox_must_fit(dom: hl.Domain) -> None:
    with pytest.raises(ValueError, match="outbox"):
        _core.cpfwd_start(dom._core, np.zeros(64, np.uint8), 0)
    with pytest.raises(TypeError):
        _core.cpfwd_start(object(), np.zeros(int(C.CP_OUTBOX_SIZE), np.uint8), 0)


def test_domain_close_ends_the_forwarder(domain_name: str) -> None:
    d = hl.Domain.create(domain_name, fences=64, participants=4, heap="1M")
    fp = FakeProcessor()
    fwd = _core.cpfwd_start(d._core, fp.ob, 0)
    t0 = time.monotonic()
    d.close()  # waits for the forwarder, which leaves on closing
    assert time.monotonic() - t0 < 2
    _core.cpfwd_stop(fwd)
