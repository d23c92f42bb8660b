"""Model-based test: random sequences of operations by two participants (two
Domain objects of this process) checked step by step against a small
pure-Python model of the semantics, with ``dom.check() == []`` after each step.

The model mirrors the documented rules: one-shot fences, statuses, merged
fences (first failure propagated wins, at most two live composites per fence),
CANCEL when the last reference of an ACTIVE fence goes, monotonic timelines
with a sticky failure (points reached before it stay SUCCESS), OWNER_LEFT / timeline failure
when the owner leaves,
stale handles after release, DomainFull on a full table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import hostless as hl
from conftest import fence_table, full_or, unique_name, unlink_quietly

S = hl.Status
CAP = 10
STATUSES = [S.SUCCESS, S.ERROR, S.CANCEL, S.OWNER_DIED, S(64), S(1000), S(2**32 - 1)]
FAIL_STATUSES = [S.ERROR, S.CANCEL, S.OWNER_DIED, S(77), S(2**32 - 1)]
PARTS = ("A", "B")


@dataclass
class Obj:
    handle: int
    kind: str  # "fence", "merged", "timeline"
    owner: str | None  # "A", "B@<incarnation>", None
    holders: dict[str, int] = field(default_factory=dict)
    # fences and merged fences
    status: int = 0  # 0 = ACTIVE
    # every failure status seen at or below this object: what a nested composite may report
    fails: set[int] = field(default_factory=set)
    ambiguous: bool = False  # merged fence with a merged child (see _propagate_link)
    parents: list[tuple[Obj, int]] = field(default_factory=list)  # links (parent, position)
    links_used: int = 0  # parent link slots consumed (never given back by the implementation)
    pending: set[int] = field(default_factory=set)
    err: int = 0
    children: list[Obj] = field(default_factory=list)
    # timelines
    value: int = 0
    failure: int = 0
    alive: bool = True

    @property
    def index(self) -> int:
        return (self.handle & 0xFFFFFF) - 1

    @property
    def active(self) -> bool:
        if self.kind == "timeline":
            return not self.failure
        return self.status == 0


class DomainModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.name = unique_name("hlmodel")
        self.doms: dict[str, hl.Domain] = {}
        self.doms["A"] = hl.Domain.create(self.name, fences=CAP, participants=4, watchdog_interval=0)
        self.doms["B"] = hl.Domain.open(self.name, watchdog_interval=0)
        self.b_gen = 0
        self.objs: dict[int, Obj] = {}  # live objects by handle
        self.stale: list[tuple[int, str]] = []  # handles of freed objects, with their kind
        self.refs: dict[str, list[tuple[Obj, Any]]] = {"A": [], "B": []}  # Python objects held

    def teardown(self) -> None:
        for d in self.doms.values():
            d.close()
        unlink_quietly(self.name)

    # ------------------------------------------------------------ model helpers
    def owner_tag(self, p: str) -> str:
        return "A" if p == "A" else f"B@{self.b_gen}"

    def live_count(self) -> int:
        return len(self.objs)

    def _complete(self, o: Obj, status: int) -> None:
        o.status = status
        if status != S.SUCCESS:
            o.fails.add(status)
        for parent, pos in list(o.parents):
            self._propagate_link(parent, pos, o)

    def _propagate_link(self, parent: Obj, pos: int, child: Obj) -> None:
        if not parent.alive or pos not in parent.pending:
            return
        if child.kind == "merged":
            # Which failure of a nested composite reaches the parent first depends on
            # whether failures are forwarded to ancestors eagerly (as a flat merge
            # would see them) or with the child's completion: accept any failure
            # seen below it.
            parent.ambiguous = True
        if child.status != S.SUCCESS and not parent.err:
            parent.err = child.status
        parent.fails |= child.fails
        parent.pending.discard(pos)
        if not parent.pending and parent.status == 0:
            event("merged fence completed" + (" (nested)" if parent.ambiguous else ""))
            self._complete(parent, parent.err or S.SUCCESS)

    def _free(self, o: Obj) -> None:
        """Last reference gone: ACTIVE fences are cancelled, the slot is freed."""
        if o.kind != "timeline" and o.status == 0:
            event("cancelled on last release")
            o.ambiguous = False  # its own status is exactly CANCEL
            self._complete(o, S.CANCEL)
        o.alive = False
        del self.objs[o.handle]
        self.stale.append((o.handle, o.kind))

    def _owner_left(self, o: Obj) -> None:
        """Its owner left with close(): OWNER_LEFT (ABI 6: leaving is not dying)."""
        if o.kind == "timeline":
            if not o.failure:
                o.failure = S.OWNER_LEFT
        elif o.status == 0:
            event("owner left")
            self._complete(o, S.OWNER_LEFT)

    def _drop(self, p: str, o: Obj) -> None:
        o.holders[p] -= 1
        if o.holders[p] == 0:
            del o.holders[p]
            if not o.holders:
                self._free(o)

    def _add(self, p: str, o: Obj, pyobj: Any) -> None:
        o.holders[p] = o.holders.get(p, 0) + 1
        self.refs[p].append((o, pyobj))

    def _pick(self, data: st.DataObject, p: str, kinds: tuple[str, ...]) -> tuple[int, Obj, Any] | None:
        cands = [i for i, (o, _) in enumerate(self.refs[p]) if o.kind in kinds]
        if not cands:
            return None
        i = data.draw(st.sampled_from(cands))
        o, py = self.refs[p][i]
        return i, o, py

    # ------------------------------------------------------------------ rules
    @rule(p=st.sampled_from(PARTS), kind=st.sampled_from(["fence", "timeline"]), initial=st.integers(0, 3),
          other_owner=st.booleans())  # fmt: skip
    def create(self, p: str, kind: str, initial: int, other_owner: bool) -> None:
        d = self.doms[p]
        q = "B" if p == "A" else "A"
        owner_id = self.doms[q].participant_id if other_owner else None
        full = self.live_count() >= CAP
        try:
            py = d.fence(owner=owner_id) if kind == "fence" else d.timeline(initial, owner=owner_id)
        except hl.DomainFull:
            assert full
            event("create: DomainFull")
            return
        assert not full
        o = Obj(py.handle, kind, self.owner_tag(q if other_owner else p))
        o.value = initial if kind == "timeline" else 0
        self.objs[o.handle] = o
        self._add(p, o, py)

    @rule(p=st.sampled_from(PARTS), n=st.integers(1, 4))
    def create_many(self, p: str, n: int) -> None:
        for _ in range(n):
            self.create(p, "fence", 0, False)

    @rule(p=st.sampled_from(PARTS), data=st.data())
    def signal_all_children(self, p: str, data: st.DataObject) -> None:
        """Signal every ACTIVE plain fence that p holds (drives merged fences to completion)."""
        for o, py in list(self.refs[p]):
            if o.kind == "fence" and o.status == 0 and o.alive:
                st_ = data.draw(st.sampled_from(STATUSES))
                py.signal(st_)
                self._complete(o, int(st_))

    @precondition(lambda self: self.objs or self.stale)
    @rule(p=st.sampled_from(PARTS), data=st.data(), stale=st.booleans(), wrong_kind=st.booleans())
    def import_(self, p: str, data: st.DataObject, stale: bool, wrong_kind: bool) -> None:
        d = self.doms[p]
        if stale and self.stale:
            h, kind = data.draw(st.sampled_from(self.stale))
            with pytest.raises(hl.InvalidHandle):
                d.import_timeline(h) if kind == "timeline" else d.import_fence(h)
            return
        if not self.objs:
            return
        o = self.objs[data.draw(st.sampled_from(sorted(self.objs)))]
        is_tl = o.kind == "timeline"
        if wrong_kind:
            with pytest.raises(hl.InvalidHandle):
                d.import_fence(o.handle) if is_tl else d.import_timeline(o.handle)
            return
        py = d.import_timeline(o.handle) if is_tl else d.import_fence(o.handle)
        self._add(p, o, py)

    @rule(p=st.sampled_from(PARTS), data=st.data(), status=st.sampled_from(STATUSES))
    def signal(self, p: str, data: st.DataObject, status: hl.Status) -> None:
        got = self._pick(data, p, ("fence", "merged"))
        if got is None:
            return
        _, o, py = got
        if o.kind == "merged":
            with pytest.raises(hl.InvalidOperation):
                py.signal(status)
        elif o.status:
            with pytest.raises(hl.AlreadySignaled):
                py.signal(status)
        else:
            py.signal(status)
            self._complete(o, int(status))

    @rule(p=st.sampled_from(PARTS), data=st.data(), bad=st.sampled_from([0, 1, 5, 63, 2**32]))
    def signal_invalid(self, p: str, data: st.DataObject, bad: int) -> None:
        got = self._pick(data, p, ("fence",))
        if got is not None:
            with pytest.raises(ValueError):
                got[2].signal(bad)

    @rule(p=st.sampled_from(PARTS), data=st.data())
    def release(self, p: str, data: st.DataObject) -> None:
        got = self._pick(data, p, ("fence", "merged", "timeline"))
        if got is None:
            return
        i, o, py = got
        py.release()
        with pytest.raises(hl.InvalidHandle):
            py.release()
        self.refs[p].pop(i)
        self._drop(p, o)

    @rule(p=st.sampled_from(PARTS), data=st.data(), n=st.integers(1, 3))
    def merge(self, p: str, data: st.DataObject, n: int) -> None:
        # Plain fences with fewer than two live merges only: since issue 27 a fence in two
        # live merges takes a watch node (one more slot) instead of being refused, and a
        # merged child may be flattened into its leaves (Domain.merge); neither is in this
        # model.  Those cases are covered by tests/unit/test_fence_algebra.py and the chaos
        # stress (hostless_tools.chaos AlgebraOps, tests/stress/test_stress.py).
        cands = {
            o.handle: (o, py)
            for o, py in self.refs[p]
            if o.kind == "fence" and sum(par.alive for par, _ in o.parents) < 2
        }
        if not cands:
            return
        hs = data.draw(st.lists(st.sampled_from(sorted(cands)), min_size=1, max_size=n, unique=True))
        children = [cands[h] for h in hs]
        must_refuse = any(sum(par.alive for par, _ in o.parents) >= 2 for o, _ in children)
        may_refuse = any(o.links_used >= 2 for o, _ in children)
        full = self.live_count() >= CAP
        try:
            py = self.doms[p].merge([c for _, c in children])
        except hl.InvalidOperation:
            assert must_refuse or may_refuse
            event("merge refused: fence already in two merges")
            return
        except hl.DomainFull:
            assert full and not must_refuse
            event("merge: DomainFull")
            return
        event("merge")
        assert not must_refuse and not full
        m = Obj(py.handle, "merged", None, pending=set(range(len(children))))
        m.children = [o for o, _ in children]
        self.objs[m.handle] = m
        self._add(p, m, py)
        for pos, (o, _) in enumerate(children):
            o.parents.append((m, pos))
            o.links_used = min(2, o.links_used + 1)
            if o.status:
                self._propagate_link(m, pos, o)

    @rule(p=st.sampled_from(PARTS), data=st.data(), step=st.integers(-1, 3))
    def tl_signal(self, p: str, data: st.DataObject, step: int) -> None:
        got = self._pick(data, p, ("timeline",))
        if got is None:
            return
        _, o, py = got
        v = max(0, o.value + step)
        if o.failure:
            with pytest.raises(hl.AlreadySignaled):
                py.signal(o.value + 1)
        elif v <= o.value:
            with pytest.raises(ValueError):
                py.signal(v)
        else:
            py.signal(v)
            o.value = v

    @rule(p=st.sampled_from(PARTS), data=st.data(), status=st.sampled_from(FAIL_STATUSES))
    def tl_fail(self, p: str, data: st.DataObject, status: hl.Status) -> None:
        got = self._pick(data, p, ("timeline",))
        if got is None:
            return
        _, o, py = got
        if o.failure:
            with pytest.raises(hl.AlreadySignaled):
                py.fail(status)
        else:
            py.fail(status)
            o.failure = int(status)

    @rule(p=st.sampled_from(PARTS), data=st.data(), ahead=st.integers(-2, 2))
    def wait0(self, p: str, data: st.DataObject, ahead: int) -> None:
        got = self._pick(data, p, ("fence", "merged", "timeline"))
        if got is None:
            return
        _, o, py = got
        if o.kind == "timeline":
            v = max(0, o.value + ahead)
            if v <= o.value:  # reached (also before a failure: a point reached stays reached)
                assert py.wait(v, 0) is S.SUCCESS
            elif o.failure:
                assert py.wait(v, 0) == o.failure
            elif v <= o.value:
                assert py.wait(v, 0) is S.SUCCESS
            else:
                with pytest.raises(TimeoutError):
                    py.wait(v, 0)
        elif o.status == 0:
            with pytest.raises(TimeoutError):
                py.wait(0)
        else:
            self._check_status(o, py.wait(0))

    @rule()
    def restart_b(self) -> None:
        """B leaves (close) and a new B joins: owned objects fail, references drop."""
        self.doms["B"].close()
        tag = self.owner_tag("B")
        # recovery walks the slot table in index order: owner first, then the reference
        for o in sorted(self.objs.values(), key=lambda x: x.index):
            if not o.alive:
                continue
            if o.owner == tag:
                self._owner_left(o)
            if "B" in o.holders:
                o.holders.pop("B")
                if not o.holders:
                    self._free(o)
        self.refs["B"] = []
        self.b_gen += 1
        self.doms["B"] = hl.Domain.open(self.name, watchdog_interval=0)

    # ------------------------------------------------------------- invariants
    def _check_status(self, o: Obj, got: hl.Status) -> None:
        if o.kind == "merged" and o.ambiguous and o.status:
            if o.status == S.SUCCESS:
                assert got is S.SUCCESS
            else:
                assert got in o.fails, (got, o.fails)
        else:
            assert got == (o.status or S.ACTIVE), (o, got)

    @invariant()
    def matches_model(self) -> None:
        d = self.doms["A"]
        assert d.check() == []
        table = fence_table(d)
        states = (table["ctl"] & np.uint64(0xFF)).astype(np.int64)
        live = {int(i) for i in np.nonzero(states != 0)[0]}
        assert live == {o.index for o in self.objs.values()}
        bits = {p: 1 << (self.doms[p].participant_id & 0xFF) for p in PARTS}
        for o in self.objs.values():
            want = sum(bits[p] for p in o.holders)
            assert int(table["refs"][o.index]) == want, (o.kind, o.holders)
        for p in PARTS:
            for o, py in self.refs[p]:
                if o.kind == "timeline":
                    assert py.failure == (o.failure or None)
                    assert py.value == o.value
                else:
                    self._check_status(o, py.status)
                    assert py.merged == (o.kind == "merged")


TestDomainModel = DomainModel.TestCase
TestDomainModel.settings = settings(
    max_examples=full_or(60, 150),
    stateful_step_count=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
