"""Model-based test of the device heaps: random allocations (tiny to larger than the
heap), releases and imports by two participants (two Domain objects of this process),
on two small device heaps and the host heap, checked step by step against a reference
model of the extents.

The model holds, per device heap, the extent [offset, offset + granules * 256) of every
live device buffer.  After each step: the engine's extents are exactly the model's
(every holder sees the same device and offset), they are disjoint, aligned and inside
their heap, each heap's used counter equals the model's, and ``check()`` finds nothing.
An allocation must succeed exactly when the model has a free run large enough (the
allocator searches every start position), and fail with DeviceHeapFull naming the device
otherwise.  When everything is released, every heap is empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import hostless as hl
from conftest import full_or, unique_name, unlink_quietly
from hostless._abi import C

G = int(C.DEVICE_GRANULE)
DEVICES = {"cuda:0": 2 << 20, "cuda:7": 4 << 20}
MAX_LIVE = 60
SIZES = {
    "tiny": (1, G),
    "small": (G + 1, 16 * G),
    "medium": (16 * G + 1, 1 << 18),
    "large": ((1 << 18) + 1, 3 << 20),
}


@dataclass
class Entry:
    handle: int
    device: str
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    offset: int  # device offset, or -1 for a host buffer
    refs: dict[str, list[hl.Buffer]] = field(default_factory=lambda: {"A": [], "B": []})

    @property
    def granules(self) -> int:
        return -(-self.nbytes // G)

    def holders(self) -> list[tuple[str, int]]:
        return [(who, i) for who, lst in self.refs.items() for i in range(len(lst))]


class DeviceHeapMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.name = unique_name("hldevheap")
        a = hl.Domain.create(
            self.name,
            fences=256,
            participants=4,
            heap="256K",
            device_heaps=dict(DEVICES),
            watchdog_interval=0,
        )
        self.doms = {"A": a, "B": hl.Domain.open(self.name, label="B", watchdog_interval=0)}
        self.live: dict[int, Entry] = {}

    # ------------------------------------------------------------------ model
    def _extents(self, device: str) -> list[tuple[int, int]]:
        """The model's extents in ``device``'s heap, in granules, sorted."""
        return sorted((e.offset // G, e.granules) for e in self.live.values() if e.device == device)

    def _largest_free(self, device: str) -> int:
        """The model's largest free run in ``device``'s heap, in granules."""
        total, end, best = DEVICES[device] // G, 0, 0
        for g, n in self._extents(device):
            best = max(best, g - end)
            end = g + n
        return max(best, total - end)

    def _pick(self, data: st.DataObject) -> Entry:
        return self.live[data.draw(st.sampled_from(sorted(self.live)), label="handle")]

    # ------------------------------------------------------------------ rules
    @precondition(lambda self: len(self.live) < MAX_LIVE)
    @rule(
        data=st.data(),
        cls=st.sampled_from(sorted(SIZES)),
        device=st.sampled_from(sorted(DEVICES)),
        dtype=st.sampled_from(["u1", "<f4", "<i8", "<c16"]),
        who=st.sampled_from("AB"),
    )
    def alloc(self, data: st.DataObject, cls: str, device: str, dtype: str, who: str) -> None:
        dt = np.dtype(dtype)
        lo, hi = SIZES[cls]
        elems = max(1, data.draw(st.integers(lo, hi), label="nbytes") // dt.itemsize)
        shape = (elems,) if elems % 2 else (2, elems // 2)
        nbytes = elems * dt.itemsize
        need = -(-nbytes // G)
        fits = need <= self._largest_free(device)
        try:
            b = self.doms[who].buffer(shape, dt, device=device)
        except hl.DeviceHeapFull as e:
            event(f"{device} full")
            assert not fits, (
                f"{nbytes} bytes refused with a free run of {self._largest_free(device)} granules: {e}"
            )
            assert device in str(e)
            return
        assert fits, f"{nbytes} bytes allocated in {device} although the model has no run of {need} granules"
        assert (b.device, b.shape, b.dtype, b.nbytes) == (device, shape, dt, nbytes)
        assert b.device_offset is not None and b.device_offset % G == 0
        event(f"allocated {cls}")
        e = Entry(b.handle, device, shape, dt, nbytes, b.device_offset)
        e.refs[who].append(b)
        self.live[b.handle] = e

    @precondition(lambda self: len(self.live) < MAX_LIVE)
    @rule(n=st.integers(1, 5000), who=st.sampled_from("AB"))
    def alloc_host(self, n: int, who: str) -> None:
        """Host buffers share the heap with the device buffers' metadata blocks."""
        try:
            b = self.doms[who].buffer(n)
        except hl.OutOfMemory:
            event("host heap full")
            return
        assert b.device == "cpu" and b.device_offset is None
        e = Entry(b.handle, "cpu", (n,), np.dtype("u1"), n, -1)
        e.refs[who].append(b)
        self.live[b.handle] = e

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        e = self._pick(data)
        who, i = data.draw(st.sampled_from(e.holders()), label="holder")
        e.refs[who].pop(i).release()
        if not e.holders():
            del self.live[e.handle]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), who=st.sampled_from("AB"))
    def import_(self, data: st.DataObject, who: str) -> None:
        e = self._pick(data)
        b = self.doms[who].import_buffer(e.handle)
        assert (b.device, b.shape, b.dtype, b.nbytes) == (e.device, e.shape, e.dtype, e.nbytes)
        assert b.device_offset == (None if e.device == "cpu" else e.offset)
        e.refs[who].append(b)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def extents_match_the_model(self) -> None:
        a = self.doms["A"]
        for device, size in DEVICES.items():
            ext = self._extents(device)
            end = 0
            for g, n in ext:
                assert g >= end and g + n <= size // G, (device, ext)
                end = g + n
            assert a.heap_stats(device)["used"] == sum(n for _, n in ext) * G
        for e in self.live.values():
            for lst in e.refs.values():
                for b in lst:
                    assert b.device == e.device and (e.device == "cpu" or b.device_offset == e.offset)

    @invariant()
    def check_is_clean(self) -> None:
        assert self.doms["A"].check() == []

    def teardown(self) -> None:
        try:
            for e in list(self.live.values()):
                for lst in e.refs.values():
                    for b in lst:
                        b.release()
            self.live.clear()
            a = self.doms["A"]
            for device in DEVICES:
                st_ = a.heap_stats(device)
                assert st_["used"] == 0 and st_["free_runs"] == 1, st_
            assert a.heap_stats()["used"] == 0
            assert a.check() == []
        finally:
            self.doms["B"].close()
            self.doms["A"].close()
            unlink_quietly(self.name)


DeviceHeapMachine.TestCase.settings = settings(
    max_examples=full_or(25, 60),  # sequences of up to 40 steps each
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestDeviceHeapModel = DeviceHeapMachine.TestCase
