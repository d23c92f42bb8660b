"""Model-based test of the shared heap: random sequences of allocations (random
sizes, small to large, random dtypes and shapes), releases, imports and writes
by two participants (two Domain objects of this process), checked step by step
against a model of the live buffers and their contents.

Every buffer is filled with random bytes when it is allocated (and on writes);
after each step every live buffer must still hold exactly its bytes (so no two
blocks overlap and nothing moved), the blocks must be disjoint and aligned,
the heap's used counter must equal the blocks the model holds, and
``check()`` must find nothing.  When everything is released, the heap is empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import hostless as hl
from conftest import full_or, unique_name, unlink_quietly

HEAP = 1 << 20
FENCES = 128
MAX_LIVE = 100
LARGE = 65536
PAGE = 4096
DTYPES = ["u1", "<i2", ">u4", "<f4", "<f8", "<c16", "?", "<i8"]
SIZE_CLASSES = {
    "tiny": (1, 64),
    "small": (65, 4096),
    "medium": (4097, LARGE - 1),
    "large": (LARGE, 400_000),
}


def block_bytes(nbytes: int) -> int:
    if nbytes >= LARGE:
        return PAGE + -(-nbytes // PAGE) * PAGE
    return 128 + -(-nbytes // 64) * 64


def head_bytes(nbytes: int) -> int:
    return PAGE if nbytes >= LARGE else 128


def as_bytes(b: hl.Buffer) -> np.ndarray:
    """A byte view of ``b`` through the buffer protocol."""
    return np.frombuffer(memoryview(b), dtype=np.uint8)


@dataclass
class Entry:
    handle: int
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    offset: int
    content: np.ndarray
    refs: dict[str, list[hl.Buffer]] = field(default_factory=lambda: {"A": [], "B": []})

    def holders(self) -> list[tuple[str, int]]:
        return [(who, i) for who, lst in self.refs.items() for i in range(len(lst))]


class HeapMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.name = unique_name("hlheap")
        a = hl.Domain.create(self.name, fences=FENCES, participants=4, heap=HEAP, watchdog_interval=0)
        self.doms = {"A": a, "B": hl.Domain.open(self.name, label="B", watchdog_interval=0)}
        self.live: dict[int, Entry] = {}
        self.stale: list[int] = []
        self.dead_objs: list[hl.Buffer] = []  # released
        self.closed_objs: list[hl.Buffer] = []  # held by B when it closed
        self.seed = 0

    # ------------------------------------------------------------------ helpers
    def _fresh(self, n: int) -> np.ndarray:
        self.seed += 1
        return np.random.default_rng(self.seed).integers(0, 256, n, dtype=np.uint8)

    def _base(self, who: str) -> int:
        """Address of ``who``'s mapping of the domain."""
        return int(np.frombuffer(self.doms[who].raw(), np.uint8).ctypes.data)

    def _pick(self, data: st.DataObject) -> Entry:
        return self.live[data.draw(st.sampled_from(sorted(self.live)), label="handle")]

    # ------------------------------------------------------------------ rules
    @precondition(lambda self: len(self.live) < MAX_LIVE)
    @rule(
        data=st.data(),
        cls=st.sampled_from(sorted(SIZE_CLASSES)),
        dtype=st.sampled_from(DTYPES),
        who=st.sampled_from("AB"),
        ndim=st.integers(1, 3),
    )
    def alloc(self, data: st.DataObject, cls: str, dtype: str, who: str, ndim: int) -> None:
        dt = np.dtype(dtype)
        lo, hi = SIZE_CLASSES[cls]
        elems = max(1, data.draw(st.integers(lo, hi), label="nbytes") // dt.itemsize)
        divs = [d for d in (1, 2, 3, 4, 8, 16) if elems % d == 0]
        d1 = data.draw(st.sampled_from(divs), label="dim")
        shape: tuple[int, ...] = {1: (elems,), 2: (d1, elems // d1), 3: (1, d1, elems // d1)}[ndim]
        nbytes = elems * dt.itemsize
        dom = self.doms[who]
        try:
            b = dom.buffer(shape, dt)
        except hl.OutOfMemory as e:
            event("out of memory")
            st_ = dom.heap_stats()
            slack = PAGE - 64 if nbytes >= LARGE else 0
            assert block_bytes(nbytes) > st_["largest_free"] - slack, (nbytes, st_)
            assert str(HEAP - self._model_used()) in str(e), str(e)
            return
        assert (b.shape, b.dtype, b.nbytes) == (shape, dt, nbytes)
        assert b.offset % (PAGE if nbytes >= LARGE else 64) == 0, (nbytes, b.offset)
        assert b.handle not in self.live
        content = self._fresh(nbytes)
        as_bytes(b)[:] = content
        event(f"allocated {cls}")
        e = Entry(b.handle, shape, dt, nbytes, b.offset, content)
        e.refs[who].append(b)
        self.live[b.handle] = e

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        e = self._pick(data)
        who, i = data.draw(st.sampled_from(e.holders()), label="holder")
        b = e.refs[who].pop(i)
        b.release()
        self.dead_objs.append(b)
        if not e.holders():
            del self.live[e.handle]
            self.stale.append(e.handle)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), who=st.sampled_from("AB"))
    def import_buffer(self, data: st.DataObject, who: str) -> None:
        e = self._pick(data)
        c = self.doms[who].import_buffer(e.handle)
        assert (c.shape, c.dtype, c.nbytes, c.offset) == (e.shape, e.dtype, e.nbytes, e.offset)
        assert np.array_equal(as_bytes(c), e.content)
        mv = memoryview(c)
        assert mv.shape == e.shape and mv.format == memoryview(np.empty(1, e.dtype)).format
        mv.release()
        e.refs[who].append(c)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), how=st.sampled_from(["numpy", "memoryview", "dlpack"]))
    def write(self, data: st.DataObject, how: str) -> None:
        e = self._pick(data)
        who, i = data.draw(st.sampled_from(e.holders()), label="holder")
        b = e.refs[who][i]
        new = self._fresh(e.nbytes)
        if how == "dlpack" and not e.dtype.isnative:
            with pytest.raises(BufferError):  # DLPack has no byte order
                np.from_dlpack(b)
            how = "numpy"
        if how == "numpy":
            b.numpy().reshape(-1).view(np.uint8)[:] = new
        elif how == "memoryview":
            memoryview(b).cast("B")[:] = new.tobytes()
        else:
            np.from_dlpack(b).reshape(-1).view(np.uint8)[:] = new
        e.content = new

    @precondition(lambda self: self.stale)
    @rule(data=st.data(), who=st.sampled_from("AB"))
    def import_stale(self, data: st.DataObject, who: str) -> None:
        h = data.draw(st.sampled_from(self.stale[-20:]), label="stale")
        with pytest.raises(hl.InvalidHandle):
            self.doms[who].import_buffer(h)

    @precondition(lambda self: self.dead_objs)
    @rule(data=st.data())
    def use_released(self, data: st.DataObject) -> None:
        b = data.draw(st.sampled_from(self.dead_objs[-20:]), label="released")
        with pytest.raises(hl.InvalidHandle):
            b.release()
        with pytest.raises(hl.InvalidHandle):
            b.numpy()

    @precondition(lambda self: self.closed_objs)
    @rule(data=st.data())
    def use_after_close(self, data: st.DataObject) -> None:
        b = data.draw(st.sampled_from(self.closed_objs[-20:]), label="closed")
        with pytest.raises(hl.DomainClosed):
            b.numpy()

    @rule()
    def reopen_b(self) -> None:
        """B leaves (dropping every reference it holds) and joins again."""
        self.doms["B"].close()
        for h in list(self.live):
            e = self.live[h]
            self.closed_objs += e.refs["B"]
            e.refs["B"] = []
            if not e.holders():
                del self.live[h]
                self.stale.append(h)
        self.doms["B"] = hl.Domain.open(self.name, label="B", watchdog_interval=0)

    # ------------------------------------------------------------- invariants
    def _model_used(self) -> int:
        return sum(block_bytes(e.nbytes) for e in self.live.values())

    @invariant()
    def heap_consistent(self) -> None:
        a = self.doms["A"]
        assert a.check() == []
        stt = a.heap_stats()
        assert stt["used"] == self._model_used(), stt
        assert stt["free"] == HEAP - stt["used"]
        assert stt["largest_free"] <= stt["free"]
        # blocks disjoint (head included), inside the heap's data area
        data0 = int(stt["data_offset"])
        spans = sorted((e.offset - head_bytes(e.nbytes), e.offset + e.nbytes) for e in self.live.values())
        for s, end in spans:
            assert data0 <= s and end <= data0 + HEAP
        for (_, e0), (s1, _) in zip(spans, spans[1:], strict=False):
            assert e0 <= s1, spans

    @invariant()
    def contents_intact(self) -> None:
        for e in self.live.values():
            who, i = e.holders()[0]
            b = e.refs[who][i]
            assert b.numpy().ctypes.data == self._base(who) + e.offset
            assert np.array_equal(as_bytes(b), e.content), f"buffer {e.handle:#x} was overwritten"

    def teardown(self) -> None:
        try:
            for e in list(self.live.values()):
                for lst in e.refs.values():
                    for b in lst:
                        b.release()
            self.live.clear()
            a = self.doms["A"]
            assert a.heap_stats()["used"] == 0
            assert a.check() == []
        finally:
            self.doms["B"].close()
            self.doms["A"].close()
            unlink_quietly(self.name)


HeapMachine.TestCase.settings = settings(
    max_examples=full_or(40, 100),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestHeapModel = HeapMachine.TestCase
