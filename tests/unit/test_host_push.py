"""The host function a CUDA stream runs to push a follow-up (core/hostfn.c, hle_host_push),
called here as CUDA's callback thread would, with no GPU: the push goes through the header's
hl_queue_push with the host's atomics, is skipped when the gate says an input failed, waits
a bounded time on a full queue, and never loses a packet against concurrent host producers."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator

import numpy as np
import pytest

import hostless as hl
from hostless import lowlevel
from hostless._abi import C

_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lowlevel.host_push_fn())


@pytest.fixture
def dom(domain_name: str) -> Iterator[hl.Domain]:
    d = hl.Domain.create(domain_name, fences=4096, participants=16, heap="16M")
    try:
        yield d
    finally:
        d.close()


def _record(dom: hl.Domain, q: hl.Queue, pb: hl.Buffer, timeout_ns: int = 10**9) -> tuple[np.ndarray, int]:
    rec = np.zeros(128, np.uint8)
    qaddr, cells, packets, cap = lowlevel.queue_view(dom, q)
    base = lowlevel.base_address(dom)
    gate_at = lowlevel.host_push_fill(
        rec, qaddr, cells, packets, cap, base + pb.offset, lowlevel.doorbell_address(dom, q),
        int(C.PRODUCER_DEVICE_BASE) + 1, timeout_ns,
    )  # fmt: skip
    return rec, gate_at


def _packet(dom: hl.Domain, **kw: int) -> hl.Buffer:
    pb = dom.buffer(64)
    pb.numpy()[:] = np.frombuffer(hl.Packet(**kw).encode(), np.uint8)
    return pb


def test_push_then_gated_push(dom: hl.Domain) -> None:
    q = dom.queue(8)
    q.bind()
    pb = _packet(dom, kernel=7, signal_value=42)
    rec, gate_at = _record(dom, q, pb)
    assert lowlevel.host_push_state(rec) == (0, 0)
    _FN(rec.ctypes.data)
    assert lowlevel.host_push_state(rec) == (1, 0)
    r = q.pop(timeout=1)
    assert r is not None and r[1].kernel == 7 and r[1].signal_value == 42
    q.completed()
    rec, gate_at = _record(dom, q, pb)
    rec[gate_at : gate_at + 4].view(np.int32)[0] = int(hl.Status.ERROR)
    _FN(rec.ctypes.data)
    assert lowlevel.host_push_state(rec) == (1, 1)  # an input failed: not pushed
    assert q.pop(timeout=0.05) is None


def test_full_queue_gives_up_after_its_timeout(dom: hl.Domain) -> None:
    q = dom.queue(2)
    q.bind()
    for _ in range(2):
        q.push(hl.Packet(kernel=1))
    rec, _ = _record(dom, q, _packet(dom, kernel=9), timeout_ns=30_000_000)
    _FN(rec.ctypes.data)
    assert lowlevel.host_push_state(rec) == (1, -7)  # HL_E_FULL (hostless_errors.h)
    got = [q.pop(timeout=1) for _ in range(2)]
    assert [g[1].kernel for g in got if g] == [1, 1]
    assert q.pop(timeout=0.05) is None  # nothing overwritten


def test_record_checks_its_buffer(dom: hl.Domain) -> None:
    q = dom.queue(8)
    with pytest.raises(ValueError, match="8-byte aligned buffer"):
        lowlevel.host_push_fill(np.zeros(16, np.uint8), 0, 0, 0, 0, 0, 0, 0, 0)
    with pytest.raises(BufferError):
        lowlevel.host_push_fill(bytes(128), 0, 0, 0, 0, 0, 0, 0, 0)
    del q


def test_callback_pushes_race_host_pushes_without_loss(dom: hl.Domain) -> None:
    n = 2000
    q = dom.queue(8192)
    q.bind()
    pbs = [_packet(dom, kernel=1, signal_value=i + 1) for i in range(n)]  # held: read when pushed
    recs = [_record(dom, q, pb)[0] for pb in pbs]

    def callbacks() -> None:  # CUDA's callback thread
        for rec in recs:
            _FN(rec.ctypes.data)

    def host(k: int) -> None:
        for i in range(n):
            q.push(hl.Packet(kernel=k, signal_value=i + 1))

    ts = [threading.Thread(target=callbacks), threading.Thread(target=host, args=(2,)),
          threading.Thread(target=host, args=(3,))]  # fmt: skip
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(lowlevel.host_push_state(r) == (1, 0) for r in recs)
    seen: dict[int, list[int]] = {1: [], 2: [], 3: []}
    for _ in range(3 * n):
        r = q.pop(timeout=2)
        assert r is not None
        seen[r[1].kernel].append(r[1].signal_value)
        q.completed()
    for k, v in seen.items():
        assert v == list(range(1, n + 1)), (k, len(v), [x for x in v[:50]])
    assert q.pop(timeout=0.05) is None


def test_word_ops_are_atomic_steps() -> None:
    w = np.zeros(1, np.uint64)
    assert lowlevel.word_exchange(w, 5) == 0 and w[0] == 5
    assert lowlevel.word_compare_exchange(w, 4, 9) == 5 and w[0] == 5  # not equal: unchanged
    assert lowlevel.word_compare_exchange(w, 5, 9) == 5 and w[0] == 9
    with pytest.raises(BufferError):
        lowlevel.word_exchange(bytes(8), 1)
    with pytest.raises(ValueError):
        lowlevel.word_exchange(np.zeros(1, np.uint32), 1)
