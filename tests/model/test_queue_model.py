"""The explicit-state model checker of the command-queue protocol (tests/model/queue_model.py).

Every interleaving of each small scenario is explored:

* CURRENT (hostless_queue.h now: hinted and unhinted reserves, the consumer
  of core/queue.c, recovery's hl_queue_skip_reserved, which moves write_index
  past the abandoned cell before it SKIPs it) shows no violation in the
  scenarios of its contract's use (no hint, fresh hints, hints stale by one
  or more laps, a producer killed in any window of its push), over at least
  ``min_states`` states each.
* OLD (the header as first landed today: recovery only SKIPped): a producer
  killed between its cell CAS and its write_index CAS, once recovered and
  its SKIP consumed, leaves write_index behind read_index and every later
  unhinted reserve returns HL_E_CORRUPT (death-in-window, death-hinted).
* Outside the contract, in both: a hint ahead of write_index (hint-ahead)
  wedges the queue the same way, breaks its producer's FIFO or strands its
  packet (hint-ahead-fifo, hint-ahead-alone); the header rules such hints
  out.  RESERVE_HELPS_AHEAD (OLD, with a round that finds the cell ahead of w
  advancing write_index) clears both wedges but not the hint-ahead
  FIFO/stranding.
* The deliberately broken variants (the hinted CAS takes any FREE cell;
  write_index stored rather than CASed) are caught, so the checker can fail;
  so are a missing recovery (stuck, lost) and the per-step checks.

About 20 s of CPU in one process (``pytest -s`` prints the state counts).
"""

from __future__ import annotations

import pytest

import queue_model as qm

SCENARIOS = {s.name: s for s in qm.scenarios()}

# what CURRENT shows, on purpose (see the module docstring): hints ahead of write_index, which the
# contract rules out; everything else must be clean
CURRENT_FINDINGS = {
    "hint-ahead": {"corrupt"},
    "hint-ahead-fifo": {"fifo"},
    "hint-ahead-alone": {"lost"},
}
OLD_FINDINGS = {**CURRENT_FINDINGS, "death-in-window": {"corrupt"}, "death-hinted": {"corrupt"}}
CLEAN = [n for n in SCENARIOS if n not in CURRENT_FINDINGS]

_cache: dict[tuple[str, str], qm.Result] = {}


def result(name: str, variant: str) -> qm.Result:
    key = (name, variant)
    if key not in _cache:
        _cache[key] = qm.explore(SCENARIOS[name], variant)
        print(_cache[key].summary())
    return _cache[key]


def show(res: qm.Result) -> str:
    lines = [res.summary()]
    for kind, v in sorted(res.violations.items()):
        lines.append(f"[{kind}] {v.message}")
        lines += [f"    {t}" for t in v.trace]
    return "\n".join(lines)


@pytest.mark.parametrize("name", CLEAN)
def test_current_protocol_has_no_violation(name: str) -> None:
    res = result(name, qm.CURRENT)
    assert res.complete
    assert res.states >= SCENARIOS[name].min_states, "the search explored too little to mean anything"
    assert res.finals >= 1
    assert not res.violations, show(res)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_covers_its_branches(name: str) -> None:
    """No vacuous pass: each scenario's search took the branches it is about (hinted CAS taken and
    missed, FULL, helping write_index, a death and its SKIP)."""
    res = result(name, qm.CURRENT)
    missing = [e for e in SCENARIOS[name].covers if not res.events.get(e)]
    assert SCENARIOS[name].covers and not missing, f"never taken: {missing} ({res.events})"


@pytest.mark.parametrize("name", sorted(CURRENT_FINDINGS))
def test_current_findings(name: str) -> None:
    """What a hint ahead of write_index (outside the contract) would do with the code as it is."""
    res = result(name, qm.CURRENT)
    print(show(res))
    assert set(res.violations) == CURRENT_FINDINGS[name], show(res)
    for v in res.violations.values():
        assert v.trace and all(": " in t for t in v.trace)


@pytest.mark.parametrize("name", sorted(OLD_FINDINGS))
def test_old_findings(name: str) -> None:
    """The wedge the model found in the header as first landed (its recovery only SKIPped): the
    checker must still find it there, so that CURRENT's clean result means something."""
    res = result(name, qm.OLD)
    print(show(res))
    assert set(res.violations) == OLD_FINDINGS[name], show(res)
    for v in res.violations.values():
        assert v.trace and all(": " in t for t in v.trace)
    if "corrupt" in res.violations:
        last = res.violations["corrupt"].trace[-1]
        assert last.startswith("P") and "load write_index" in last


def test_death_in_window_trace() -> None:
    """The shortest counterexample: the producer dies after its cell CAS, before its write_index
    CAS; recovery SKIPs the cell, the consumer frees it a lap ahead, write_index never moves."""
    tr = result("death-in-window", qm.OLD).violations["corrupt"].trace
    died = next(k for k, t in enumerate(tr) if "dies holding index 0" in t)
    assert any("CAS cell[0] FREE(0) -> RESERVED(0,p0): ok" in t for t in tr[:died])
    assert not any("CAS write_index 0 -> 1: ok" in t for t in tr)
    after = tr[died:]
    assert any(t.startswith("R: CAS cell[0] RESERVED(0,p0) -> SKIP(0,p0): ok") for t in after)
    assert any(t.startswith("C: store cell[0] = FREE(2)") for t in after)


def test_death_hinted_trace() -> None:
    """The same window in the hinted round: between the hinted cell CAS and its write_index CAS."""
    tr = result("death-hinted", qm.OLD).violations["corrupt"].trace
    assert tr[:2] == ["P0: CAS cell[0] FREE(0) -> RESERVED(0,p0): ok", "P0: dies holding index 0"], tr


def test_hint_ahead_trace() -> None:
    tr = result("hint-ahead", qm.CURRENT).violations["corrupt"].trace
    assert "P0: CAS cell[1] FREE(1) -> RESERVED(1,p0): ok" in tr
    assert "P0: CAS write_index 1 -> 2: fail (0)" in tr


@pytest.mark.parametrize("name", ["death-in-window", "death-hinted", "death-after-wi"])
def test_recovery_that_advances_write_index(name: str) -> None:
    """The fix, as landed: recovery CASes write_index from s to s + 1 before SKIPping a dead
    producer's cell of seq s (hl_queue_skip_reserved, from hle_recover_queue)."""
    res = result(name, qm.CURRENT)
    assert res.complete and res.states >= SCENARIOS[name].min_states
    assert not res.violations, show(res)


@pytest.mark.parametrize(
    ("name", "leaves"),
    [
        ("death-in-window", set()),
        ("death-hinted", set()),
        ("hint-ahead", set()),
        ("fresh-two-hinted", set()),
        ("hint-ahead-fifo", {"fifo"}),
        ("hint-ahead-alone", {"lost"}),
    ],
)
def test_reserve_that_helps_past_a_consumed_cell(name: str, leaves: set[str]) -> None:
    """The other candidate fix: a usual round that finds the cell ahead of w CASes write_index
    from w to w + 1 (index w was consumed) instead of returning HL_E_CORRUPT.  It clears both
    wedges; a hint ahead still breaks FIFO or strands its packet (a contract matter)."""
    res = result(name, qm.RESERVE_HELPS_AHEAD)
    assert res.complete
    assert set(res.violations) == leaves, show(res)


@pytest.mark.parametrize(
    ("name", "variant", "kind"),
    [
        ("fresh-cap2", qm.BROKEN_ANY_FREE, "double-reserve"),
        ("stale-abs", qm.BROKEN_ANY_FREE, "double-reserve"),
        ("fresh-cap2", qm.BROKEN_STORE_WI, "wi-backwards"),
        ("hint-ahead", qm.BROKEN_STORE_WI, "wi-passes-unreserved"),
    ],
)
def test_broken_variants_are_caught(name: str, variant: str, kind: str) -> None:
    res = result(name, variant)
    print(show(res))
    assert kind in res.violations, show(res)
    assert res.violations[kind].trace


def test_broken_any_free_trace() -> None:
    """A stale hint whose cell is FREE a lap later: the broken CAS reserves an index that was
    already reserved (and consumed)."""
    tr = result("stale-abs", qm.BROKEN_ANY_FREE).violations["double-reserve"].trace
    assert tr[-1].startswith("P0: CAS cell[0] FREE(") and tr[-1].endswith("-> RESERVED(0,p0): ok")
    assert tr[-1] != "P0: CAS cell[0] FREE(0) -> RESERVED(0,p0): ok"


def test_missing_recovery_is_stuck_or_lost() -> None:
    """The liveness checks can fail: a producer dies holding a cell and nobody recovers it."""
    P, C = qm.Producer, qm.Consumer
    spin = qm.Scenario(
        "no-recovery-full", 2, (P(0, (None,), killable=True, after_wi_only=True), P(1, (None, None)), C())
    )
    res = qm.explore(spin, qm.CURRENT)
    assert "stuck" in res.violations, show(res)  # P1 spins on FULL behind the dead cell forever
    assert "dies holding index 0" in " ".join(res.violations["stuck"].trace)
    quiet = qm.Scenario(
        "no-recovery", 2, (P(0, (None,), killable=True, after_wi_only=True), P(1, (None,)), C())
    )
    res = qm.explore(quiet, qm.CURRENT)
    assert "lost" in res.violations, show(res)


def test_every_transition_is_one_access() -> None:
    scn = SCENARIOS["plain-cap2"]
    model = qm.Model(scn, qm.CURRENT)
    st = model.initial()
    for pi in range(2):
        x = model.step(st, pi)
        assert x is not None and x.accesses == 1 and x.desc
    x = qm.Step(model, st, 0)
    x.load_wi()
    with pytest.raises(qm.ModelError):
        x.load_cell(0)
    a, b = qm.explore(scn, qm.CURRENT), qm.explore(scn, qm.CURRENT)
    assert (a.states, a.transitions, a.finals) == (b.states, b.transitions, b.finals)


def test_per_step_checks_fire() -> None:
    """The consumer's and the producers' checks, on hand-made states."""
    model = qm.Model(SCENARIOS["plain-cap2"], qm.CURRENT)
    st = model.initial()
    a0, a1, b0 = qm.Pkt(0, 0, 0), qm.Pkt(1, 0, 1), qm.Pkt(2, 1, 0)
    g = qm.Ghost(reserved=((0, a0), (1, a1), (2, b0)))
    st = st._replace(ghost=g)

    def take(ghost: qm.Ghost, r: int, cell: qm.Cell, copied: qm.Pkt | None) -> list[str]:
        x = qm.Step(model, st._replace(ghost=ghost), 2)
        x.take_ghost(r, cell, copied)
        return [k for k, _ in x.bad]

    assert take(g, 0, qm.Cell(0, 0, qm.READY), a0) == []
    assert take(g._replace(taken=(a0,)), 0, qm.Cell(0, 0, qm.READY), a0) == ["duplicate"]
    assert take(g._replace(taken=(a1,)), 0, qm.Cell(0, 0, qm.READY), a0) == ["fifo"]
    assert take(g, 0, qm.Cell(0, 0, qm.READY), b0) == ["bad-packet"]
    assert take(g, 0, qm.Cell(0, 0, qm.SKIP), None) == ["bad-skip"]
    assert take(g._replace(dead=frozenset({0})), 0, qm.Cell(0, 0, qm.SKIP), None) == []
    x = qm.Step(model, st, 0)
    x.reserve_ghost(1, qm.Pkt(1, 1, 1))
    assert [k for k, _ in x.bad] == ["double-reserve"]
    x = qm.Step(model, st._replace(wi=2), 0)
    x.cas_wi(2, 1)
    assert [k for k, _ in x.bad] == ["wi-backwards"]
    assert [k for k, _ in model.state_issues(st._replace(wi=4))] == ["wi-passes-unreserved"]
    # a packet store over one that was published and not yet taken
    full = st._replace(slots=(a0, None))
    x = qm.Step(model, full, 0)
    x.store_slot(2, b0)
    assert [k for k, _ in x.bad] == ["overwrite"]
    # FULL while write_index - read_index < capacity
    p = qm.Proc("R2", w=2)
    odd = st._replace(cells=(qm.Cell(0, 0, qm.READY), qm.Cell(1, 0, qm.FREE)), wi=2, ri=1)
    x = qm.Step(model, odd, 0)
    model.producer(x, model.scn.procs[0], p)  # type: ignore[arg-type]
    assert [k for k, _ in x.bad] == ["false-full"]
