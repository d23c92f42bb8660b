"""The fence-table model's counterexamples, replayed against the C engine.

tests/model/protocol_model.py explores every interleaving of small scenarios and shows
the OLD protocol's bugs as counterexample traces (one atomic step a line).  This
file ties that model to the code the way tests/c/queue_stress.c ties the queue
model: for every violation the model finds in OLD (``Scenario.expect_old``), the
trace is exported as data (``Violation.steps``, ``protocol_model.api_events``)
and replayed on a real domain, which is then checked with the model's own
invariants.

How a trace is replayed
-----------------------
* The domain has exactly the model's table (``cap`` fence slots), and the
  objects that exist when the scenario starts are created in the model's slots
  (checked: the engine's allocation order must put them there).  Every model
  process is a separate process joined to the domain (its own participant and
  liveness lock; forked by a forkserver that has hostless imported) that runs
  the process's API operations on command: ``alloc``, ``merge``, ``signal``,
  ``tl_signal``, ``wait``, ``import``, ``release``, ``sweep`` and ``recover``
  (both ``Domain.reap``).  A participant dead at the start, or killed by the
  trace, dies by a real SIGKILL.  Every watchdog is off, so recovery happens
  where the trace puts it.  The unjoined recoverer of two-recoverers (R1) is a
  process whose join finds the participant table full: it recovers the dead
  before it has a slot of its own, as the C code's join does.
* Granularity: Python cannot stop the C engine between two of its atomic steps,
  so each API operation runs whole, and the trace is replayed in every order in
  which each operation takes effect at one instant between its first and its
  last step in the counterexample (``protocol_model.linearizations``: 1 to 12
  orders a trace).  Where the trace runs an operation inside another one (the
  instruction-level interleaving itself, ``ApiEvent.spans``), the orders cover
  both sides of it, and:
  - a wait starts at its place and the replay goes on once the waiter is
    observably asleep (its waiter count and its thread in a futex wait), so
    what comes next meets a sleeper: the wake-up path the lost-wakeup
    counterexamples are about; its answer is collected before its process's
    next operation;
  - in the ``overlap`` replay (one order: the one in which the operations end),
    a sweep or a recovery that the trace interleaves with other operations runs
    in a loop in its own process (``Domain.reap`` again and again) over that
    window: real concurrency where the counterexample interleaves it, though
    not at a chosen instruction.
* Checks, with the model's names: after every operation (outside the overlap
  windows), ``merged-early`` and ``merged-status``; at ``check_active``,
  ``fresh-not-active``; every wait must return (``lost-wakeup``) with a status
  the scenario allows (``wait-status``); at the end (every program done),
  ``end-state``, ``leaked-ref`` and ``lost-ref`` (reference bits against the
  references the replay knows each participant holds), ``pending-mask``,
  ``lost-completion``, ``recovery-incomplete`` (after a recovery: no bit, no
  ALLOC/DYING slot of the dead participant, every fence it owned signaled) and
  ``Domain.check()``; once every participant left, every slot FREE.
* The checks can fail: ``test_checks_catch_a_broken_domain`` breaks a table
  with raw stores (a reference bit nobody holds, a holder's bit cleared, a
  merged fence SUCCESS while a child is ACTIVE, a child completed without
  propagation) and each is reported; ``test_the_old_bug_applied_by_hand_is_caught``
  replays merge-reuse with the OLD sweep's stale write done by hand at the
  trace's point (one store into the new fence's word) and the replay reports
  fresh-not-active, as the model does for OLD.

What it cannot show: an interleaving inside one operation (the model's
``stale-write`` and ``two-recoverers`` are about the steps themselves), only
what such an interleaving would leave behind in the orders the API allows; and
a lost wake-up costs the engine one bounded sleep (the domain's poll interval),
not a hang, so the replay sees a waiter that returns either way (the wake-up
itself is timed by tests/unit/test_timeline.py's lost-wake-up test).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest

import hostless as hl
import protocol_model as pm
import replay_player
from conftest import assert_all_free, fence_table, thread_in_futex, unique_name, waiter_count
from hostless._abi import PARTICIPANT_DTYPE, C

TRACES = [(s.name, kind) for s in pm.scenarios() for kind in s.expect_old]
ANSWER = 60.0  # seconds a participant has to answer one command (waits time out at 30 s)
LOOPABLE = frozenset({"sweep", "recover"})  # idempotent: run again and again in the overlap replay

EXPECT_WAIT: dict[str, dict[str, set[str]]] = {
    # the statuses a waiter may see, per scenario and object (the scenarios' docs)
    "merge-reuse": {"m": {"SUCCESS"}},
    "merge-birth": {"m": {"ERROR"}},  # the first failure
    "timeline-lost-wakeup": {"t": {"SUCCESS"}},
    "recovery-vs-import": {"f": {"OWNER_DIED", "CANCEL", "skipped"}},  # skipped: the import failed
    "timeline-owner-died": {"t": {"SUCCESS", "OWNER_DIED"}},
}

_CTX: Any = None


def context() -> Any:
    """A forkserver context with hostless and the player preloaded (started once)."""
    global _CTX
    if _CTX is None:
        _CTX = multiprocessing.get_context("forkserver")
        _CTX.set_forkserver_preload(["hostless", "replay_player"])
    return _CTX


# ----------------------------------------------------------------------------- participants


@dataclass
class Player:
    """One model process (or a participant dead at the start), played by its own process."""

    name: str
    proc: Any  # multiprocessing.Process
    conn: Connection
    pid_: int = -1  # participant id
    dead: bool = False
    waiting: str | None = None  # the object of a wait in flight (started, answer not read)
    blocked: tuple[Any, ...] | None = None  # an allocation that found the table full (waits)

    @property
    def index(self) -> int:
        return self.pid_ & 0xFF

    @property
    def inc(self) -> int:
        return self.pid_ >> 8

    def send(self, **cmd: Any) -> None:
        self.conn.send(cmd)

    def answered(self) -> bool:
        return bool(self.conn.poll())

    def reply(self) -> Any:
        if not self.conn.poll(ANSWER):
            raise AssertionError(f"{self.name} did not answer within {ANSWER} s")
        r = self.conn.recv()
        if "err" in r:
            raise ReplayError(f"{self.name}: {r['err']}")
        return r["ok"]

    def call(self, **cmd: Any) -> Any:
        self.send(**cmd)
        return self.reply()


class ReplayError(Exception):
    """A participant's operation raised."""


def start_player(name: str, dom_name: str) -> Player:
    ctx = context()
    here, there = ctx.Pipe()
    proc = ctx.Process(target=replay_player.play, args=(there, dom_name, name), daemon=True)
    proc.start()
    there.close()
    p = Player(name, proc, here)
    if not here.poll(ANSWER):
        raise AssertionError(f"{name} did not join")
    p.pid_ = int(here.recv()["id"])
    return p


def stop_player(p: Player) -> None:
    if p.proc.is_alive():
        p.proc.kill()
    p.proc.join(ANSWER)
    p.conn.close()


# ----------------------------------------------------------------------------- the checks


def handle_slot(h: int) -> tuple[int, int]:
    """(slot index, generation) of a handle."""
    return (h & 0xFFFFFF) - 1, (h >> 24) & 0xFFFFFF


@dataclass
class Ghost:
    """What the replay knows the real domain must hold (the model's ghost state)."""

    held: set[tuple[int, int, int]] = field(default_factory=set)  # (participant index, slot, gen)
    merged: dict[tuple[int, int], list[tuple[int, int]]] = field(default_factory=dict)  # (slot, gen): kids
    dead: dict[int, int] = field(default_factory=dict)  # participant index -> incarnation, killed


def participants(d: hl.Domain) -> np.ndarray:
    h = d.header()
    return np.frombuffer(
        bytes(d.raw()),
        dtype=PARTICIPANT_DTYPE,
        count=int(h["participant_capacity"]),
        offset=int(h["participants_offset"]),
    ).copy()


def recovered(d: hl.Domain, ghost: Ghost) -> set[int]:
    """The dead participants whose recovery finished (their slot FREE, or joined again)."""
    parts = participants(d)
    out = set()
    for i, inc in ghost.dead.items():
        pctl = int(parts[i]["ctl"])
        if pctl & 0xFF == int(C.PART_FREE) or (pctl >> 16) & 0xFFFFFFFF != inc:
            out.add(i)
    return out


def word_name(w: int) -> str:
    return "ACTIVE" if w == 0 else hl.Status(w).name if w in {int(s) for s in hl.Status} else f"{w:#x}"


def state_issues(table: np.ndarray, ghost: Ghost) -> list[tuple[str, str]]:
    """The model's per-state checks (Model.state_issues) on a snapshot of the real table."""
    out = []
    ctl = [int(c) for c in table["ctl"]]
    word = [int(w) for w in table["word"]]

    def current(i: int, gen: int) -> bool:
        return (ctl[i] >> 32) & 0xFFFFFF == gen and ctl[i] & 0xFF in (int(C.SLOT_LIVE), int(C.SLOT_DYING))

    for (mi, mg), kids in ghost.merged.items():
        if not current(mi, mg) or word[mi] == 0:
            continue
        now = [(ci, word[ci]) for ci, cg in kids if current(ci, cg)]
        if word[mi] == int(hl.Status.SUCCESS):
            for ci, w in now:
                if w != int(hl.Status.SUCCESS):
                    out.append(
                        (
                            "merged-early",
                            f"merged slot {mi} is SUCCESS while child slot {ci} is {word_name(w)}",
                        )
                    )
        elif (
            word[mi] != int(hl.Status.CANCEL) and len(now) == len(kids) and all(w != word[mi] for _, w in now)
        ):
            out.append(("merged-status", f"merged slot {mi} is {word_name(word[mi])}, no child is"))
    return out


def final_issues(table: np.ndarray, ghost: Ghost, done: set[int]) -> list[tuple[str, str]]:
    """The model's end-of-run checks (Model.final_issues) on a snapshot of the real table;
    ``done``: the dead participants whose recovery finished."""
    out = state_issues(table, ghost)
    unrecovered = set(ghost.dead) - done
    held = {(a, i, g) for a, i, g in ghost.held if a not in done}
    for i, s in enumerate(table):
        c, refs, w = int(s["ctl"]), int(s["refs"]), int(s["word"])
        st, gen, kind, pidx = c & 0xFF, (c >> 32) & 0xFFFFFF, (c >> 24) & 0xFF, (c >> 8) & 0xFF
        if st in (int(C.SLOT_ALLOC), int(C.SLOT_DYING)) and pidx not in unrecovered:
            out.append(("end-state", f"slot {i} is left in state {st} by participant {pidx}"))
        if st == int(C.SLOT_LIVE) and refs == 0:
            out.append(("end-state", f"slot {i} is LIVE with no reference"))
        if st == int(C.SLOT_FREE) and refs:
            out.append(("end-state", f"slot {i} is FREE with refs {refs:#b}"))
        if st == int(C.SLOT_LIVE):
            for a in range(64):
                if refs >> a & 1 and (a, i, gen) not in held:
                    out.append(("leaked-ref", f"slot {i} has a reference bit of {a} nobody holds"))
        if st == int(C.SLOT_LIVE) and kind == int(C.KIND_MERGED) and w == 0:
            aux = int(s["aux"])
            mask = aux & 0xFFFFFFFF if (aux >> 32) & 0xFFFFFF == gen else 0
            kids = ghost.merged.get((i, gen), [])
            for j, (ci, cg) in enumerate(kids):
                if not mask >> j & 1:
                    continue
                cs = table[ci]
                cc = int(cs["ctl"])
                links = {int(x) for x in cs["parents"]}
                link = (j << 56) | (gen << 32) | (i + 1)
                ok = (cc >> 32) & 0xFFFFFF == cg and cc & 0xFF == int(C.SLOT_LIVE) and int(cs["word"]) == 0
                if not (ok and link in links):
                    out.append(("pending-mask", f"merged slot {i}: bit {j} pending, child slot {ci} is not"))
            if mask == 0:
                out.append(("lost-completion", f"merged slot {i} has no pending child but is ACTIVE"))
        for d in done:
            if refs >> d & 1:
                out.append(("recovery-incomplete", f"slot {i} keeps dead participant {d}'s bit"))
            if st in (int(C.SLOT_ALLOC), int(C.SLOT_DYING)) and pidx == d:
                out.append(("recovery-incomplete", f"slot {i} is left in state {st} by {d}"))
            owner = int(s["owner"])
            if (
                st == int(C.SLOT_LIVE)
                and owner
                and (owner & 0xFF) - 1 == d
                and owner >> 8 == ghost.dead[d] & 0xFFFFFF
                and kind in (int(C.KIND_FENCE), int(C.KIND_TIMELINE))
                and (w == 0 if kind == int(C.KIND_FENCE) else not w & int(C.TIMELINE_FAILED))
            ):
                out.append(("recovery-incomplete", f"slot {i} owned by dead {d} is not failed"))
    for a, i, g in held:
        s = table[i]
        c = int(s["ctl"])
        if (c >> 32) & 0xFFFFFF == g and c & 0xFF == int(C.SLOT_LIVE) and not int(s["refs"]) >> a & 1:
            out.append(("lost-ref", f"{a} holds slot {i} gen {g} but its bit is not in refs"))
    return out


# ----------------------------------------------------------------------------- the replay


@dataclass
class Replay:
    scn: pm.Scenario
    dom: hl.Domain
    players: dict[str, Player]
    ghost: Ghost
    handles: dict[str, int] = field(default_factory=dict)  # var -> handle (of its latest object)
    kinds: dict[str, str] = field(default_factory=dict)
    issues: list[tuple[str, str]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def note(self, kind: str, msg: str) -> None:
        if (kind, msg) not in self.issues:
            self.issues.append((kind, msg))


def part_name(scn: pm.Scenario, part: int) -> str:
    for p in scn.procs:
        if p.part == part:
            return p.name
    return f"D{part}"  # a participant that exists only to hold objects (dead at the start)


def setup(scn: pm.Scenario, dom_name: str) -> Replay:
    joined = {p.part for p in scn.procs if p.part is not None} | set(scn.dead)
    for o in scn.objects:
        joined |= set(o.holders) | ({o.owner} if o.owner is not None else set())
    unjoined = any(p.part is None for p in scn.procs)
    # with an unjoined recoverer the participant table is exactly full (the observer and
    # every other participant), so that its join recovers before it has a slot
    cap = 1 + len(joined) + (0 if unjoined else 2)
    dom = hl.Domain.create(dom_name, fences=scn.cap, participants=cap, watchdog_interval=0)
    r = Replay(scn, dom, {}, Ghost())
    try:
        for part in sorted(joined):
            name = part_name(scn, part)
            r.players[name] = start_player(name, dom_name)
        for o in sorted(scn.objects, key=lambda o: o.idx):
            assert not o.word, "objects signaled at the start are not replayed (no scenario has one)"
            creator = r.players[part_name(scn, o.owner if o.owner is not None else o.holders[0])]
            if o.kind == pm.MERGED:
                h = creator.call(op="merge", var=o.var, kids=list(o.children))
            else:
                h = creator.call(op="alloc", var=o.var, kind=o.kind)
            r.handles[o.var], r.kinds[o.var] = h, o.kind
            i, g = handle_slot(h)
            assert i == o.idx, f"{o.var} landed in slot {i}, the model has it in slot {o.idx}"
            if o.kind == pm.MERGED:
                r.ghost.merged[(i, g)] = [handle_slot(r.handles[v]) for v in o.children]
            holders = [r.players[part_name(scn, x)] for x in o.holders]
            for p in holders:
                if p is not creator:
                    p.call(op="import", var=o.var, h=h, kind=o.kind)
                r.ghost.held.add((p.index, i, g))
            if creator not in holders:
                creator.call(op="release", var=o.var)
        for part in scn.dead:
            kill(r, r.players[part_name(scn, part)])
    except BaseException:
        teardown(r)
        raise
    return r


def kill(r: Replay, p: Player) -> None:
    os.kill(p.proc.pid, signal.SIGKILL)
    p.proc.join(ANSWER)
    p.dead = True
    r.ghost.dead[p.index] = p.inc
    r.log.append(f"{p.name}: KILLED (SIGKILL)")


def teardown(r: Replay) -> None:
    for p in r.players.values():
        if not p.dead and p.proc.is_alive():
            try:
                p.call(op="exit")
            except Exception:
                pass
        stop_player(p)
    try:
        r.dom.reap()
        r.dom.close()
    finally:
        hl.Domain.unlink(r.dom.name or "")


def leave_all(r: Replay) -> None:
    """Every live participant leaves cleanly (releasing what it holds); the dead are
    recovered; then the domain must check clean with every slot FREE."""
    for p in r.players.values():
        if not p.dead:
            p.call(op="exit")
            p.proc.join(ANSWER)
            assert p.proc.exitcode == 0, f"{p.name} exited with {p.proc.exitcode}"
            p.dead = True  # gone (cleanly)
    r.dom.reap()
    assert r.dom.check() == []
    assert_all_free(r.dom)


def check_state(r: Replay, when: str) -> None:
    for kind, msg in state_issues(fence_table(r.dom), r.ghost):
        r.note(kind, f"{msg} (after {when})")


def try_alloc(r: Replay, p: Player, op: tuple[Any, ...]) -> bool:
    """An allocation or a merge.  The model's allocation waits while the table is full (it
    takes effect once a slot is FREE): one that finds it full here is left blocked (False)
    and tried again after every later event; its process's next operation waits for it."""
    cmd: dict[str, Any] = {"op": op[0], "var": op[1]}
    if op[0] == "alloc":
        cmd["kind"] = op[2]
    else:
        cmd["kids"] = list(op[2])
    try:
        h = int(p.call(**cmd))
    except ReplayError as e:
        if "DomainFull" not in str(e):
            raise
        if p.blocked is None:
            r.log.append(f"{p.name}: {' '.join(map(str, op))} (the table is full: it waits)")
        p.blocked = op
        return False
    p.blocked = None
    i, g = handle_slot(h)
    r.handles[op[1]], r.kinds[op[1]] = h, (op[2] if op[0] == "alloc" else pm.MERGED)
    r.ghost.held.add((p.index, i, g))
    if op[0] == "merge":
        r.ghost.merged[(i, g)] = [handle_slot(r.handles[v]) for v in op[2]]
    r.log.append(f"{p.name}: {' '.join(map(str, op))} -> slot {i} gen {g}")
    return True


def unblock(r: Replay, p: Player, patient: bool) -> bool:
    """Try p's blocked allocation again (``patient``: for up to 5 s, then ``stuck``)."""
    assert p.blocked is not None
    deadline = time.monotonic() + (5 if patient else 0)
    while not try_alloc(r, p, p.blocked):
        if time.monotonic() > deadline:
            if patient:
                r.note("stuck", f"{p.name}: {p.blocked!r} never found a FREE slot")
            return False
        time.sleep(0.005)
    return True


def run_op(r: Replay, p: Player, op: tuple[Any, ...]) -> None:
    """One API operation of the model's program, run by its participant."""
    what = op[0]
    label = f"{p.name}: {' '.join(map(str, op))}"
    if what in ("alloc", "merge"):
        try_alloc(r, p, op)
        return
    if what == "import":
        try:
            h = p.call(op="import", var=op[1], h=r.handles[op[1]], kind=r.kinds[op[1]])
            r.ghost.held.add((p.index, *handle_slot(h)))
        except ReplayError as e:  # freed before the import: the model's "import fails"
            assert "InvalidHandle" in str(e), e
            label += " -> failed (freed)"
    elif what == "release":
        if p.call(op="release", var=op[1]) != "skipped":
            r.ghost.held.discard((p.index, *handle_slot(r.handles[op[1]])))
    elif what == "signal":
        p.call(op="signal", var=op[1], status=op[2])
    elif what == "tl_signal":
        p.call(op="tl_signal", var=op[1], value=op[2])
    elif what == "wait":
        p.send(op="wait", var=op[1], thr=op[2])
        p.waiting = op[1]
        label += f" (started: {asleep_or_done(r, p, op[1])})"
    elif what == "check_active":
        st = p.call(op="status", var=op[1])
        if st != "ACTIVE":
            r.note(
                "fresh-not-active", f"{p.name}'s new fence {op[1]} is {st}, but nobody but it may signal it"
            )
        label += f" -> {st}"
    elif what in ("sweep", "recover"):
        label += f" -> recovered {p.call(op=what)}"
    else:
        raise AssertionError(f"{r.scn.name}: no API operation for {op!r}")
    r.log.append(label)


def asleep_or_done(r: Replay, p: Player, var: str) -> str:
    """Until the waiter answered or is asleep on the object (counted, its thread in a futex)."""
    h = r.handles.get(var)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if p.answered() or not p.proc.is_alive():
            return "answered"
        if h is not None and waiter_count(r.dom, h) >= 1 and thread_in_futex(p.proc.pid, p.proc.pid):
            return "asleep"
        time.sleep(0.001)
    raise AssertionError(f"{p.name} neither answered nor slept on {var}")


def finish_wait(r: Replay, p: Player) -> None:
    var = p.waiting
    assert var is not None
    p.waiting = None
    try:
        st = p.reply()
    except ReplayError as e:
        r.note("lost-wakeup", f"{p.name}'s wait on {var} did not return: {e}")
        return
    r.log.append(f"{p.name}: wait {var} -> {st}")
    allowed = EXPECT_WAIT.get(r.scn.name, {}).get(var)
    if allowed is not None and st not in allowed:
        r.note("wait-status", f"{p.name}'s wait on {var} returned {st}, expected one of {sorted(allowed)}")


def join_recoverer(r: Replay, name: str) -> None:
    """The unjoined recoverer: a process whose join finds the participant table full
    recovers the dead before it takes a slot."""
    dead_before = set(r.ghost.dead) - recovered(r.dom, r.ghost)
    p = start_player(name, r.dom.name or "")
    r.players[name] = p
    by_join = dead_before & recovered(r.dom, r.ghost)
    r.log.append(
        f"{name}: joins a full table -> participant {p.index} (recovered at its join: {sorted(by_join)})"
    )


def overlap_windows(scn: pm.Scenario, events: list[pm.ApiEvent]) -> list[tuple[int, int, pm.ApiEvent]]:
    """(first, last event index, event) of each sweep or recovery (by a joined process) that
    the counterexample interleaves with other operations: it spans them, or they span it.
    The overlap replay runs it in a loop over that window of events."""
    procs = {p.name: p for p in scn.procs}
    out = []
    for j, e in enumerate(events):
        if e.op is None or pm.scn_op(scn, e)[0] not in LOOPABLE or procs[e.proc].part is None:
            continue
        key = (e.proc, e.op)
        window = [k for k, x in enumerate(events) if (x.proc, x.op) in e.spans or key in x.spans]
        if window:
            out.append((min([*window, j]), max([*window, j]), e))
    return out


def _dead_ready(r: Replay, e: pm.ApiEvent) -> bool:
    """A recover op runs once the participant its process awaits (await_dead) has died."""
    prog = next(p for p in r.scn.procs if p.name == e.proc).program
    assert e.op is not None
    awaited = [op[1] for op in prog[: e.op] if op[0] == "await_dead"]
    return all(r.players[part_name(r.scn, d)].dead for d in awaited)


def replay(
    scn: pm.Scenario,
    order: list[pm.ApiEvent],
    overlap: bool = False,
    tamper: Callable[[Replay, pm.ApiEvent], None] | None = None,
) -> Replay:
    """Run the events in this order on a fresh domain; returns the replay with its issues
    (the caller ends it: :func:`leave_all`, then :func:`teardown`)."""
    r = setup(scn, unique_name("hlreplay"))
    try:
        _replay(r, order, overlap, tamper)
    except BaseException:
        teardown(r)
        raise
    return r


def _replay(
    r: Replay, order: list[pm.ApiEvent], overlap: bool, tamper: Callable[[Replay, pm.ApiEvent], None] | None
) -> None:
    scn = r.scn
    procs = {p.name: p for p in scn.procs}
    loops = overlap_windows(scn, order) if overlap else []
    looping: set[str] = set()
    for k, e in enumerate(order):
        for start, _stop, lp in loops:
            if start == k:
                r.players[lp.proc].send(op="loop")
                looping.add(lp.proc)
                r.log.append(f"{lp.proc}: {pm.scn_op(scn, lp)[0]} again and again from here (overlap)")
        p = r.players.get(e.proc)
        if e.op is None:
            assert p is not None
            kill(r, p)
        else:
            op = pm.scn_op(scn, e)
            if p is not None and p.waiting is not None and not p.dead:
                finish_wait(r, p)  # program order: the wait returns before the next operation
            if p is not None and p.blocked is not None and not p.dead and not unblock(r, p, True):
                p.dead = True  # stuck: it does nothing more (reported)
            if op[0] == "recover" and procs[e.proc].part is None:
                join_recoverer(r, e.proc)
            elif e.proc in looping:
                r.log.append(f"{e.proc}: {op[0]} (its place: it runs in its loop)")
            elif p is None or p.dead:
                pass  # a dead process does nothing more
            elif op[0] == "recover" and not _dead_ready(r, e):
                r.log.append(f"{e.proc}: recover skipped (the participant it awaits never died)")
            else:
                run_op(r, p, op)
        for _start, stop, lp in loops:
            if stop == k:
                n = r.players[lp.proc].call(op="stop")
                looping.discard(lp.proc)
                r.log.append(f"{lp.proc}: loop stopped after {n} runs")
        for q in r.players.values():
            if q.blocked is not None and not q.dead:
                unblock(r, q, False)
        if tamper is not None:
            tamper(r, e)
        if not looping:  # (a snapshot taken while a loop runs may be torn)
            check_state(r, r.log[-1] if r.log else "setup")
    for p in r.players.values():
        if p.waiting is not None and not p.dead:
            finish_wait(r, p)
        if p.blocked is not None and not p.dead:
            unblock(r, p, True)
    done = recovered(r.dom, r.ghost)
    for kind, msg in final_issues(fence_table(r.dom), r.ghost, done):
        r.note(kind, msg)
    if set(r.ghost.dead) <= done:  # (a dead participant nobody recovered is reported by check())
        for msg in r.dom.check():
            r.note("check", msg)


@pytest.fixture(scope="module")
def counterexamples() -> Iterator[dict[tuple[str, str], list[pm.ApiEvent]]]:
    """The OLD protocol's counterexamples as API events (the model, stopped once the
    scenario's expected violations are found: a few seconds in all)."""
    out = {}
    for scn in pm.scenarios():
        if not scn.expect_old:
            continue  # (the watch-node scenarios: their variants are FIRST..NEW, not OLD)
        res = pm.explore(scn, pm.OLD, stop_on=scn.expect_old)
        for kind in scn.expect_old:
            v = res.violations[kind]
            assert len(v.steps) == len(v.trace)
            out[(scn.name, kind)] = pm.api_events(scn, v.steps)
    yield out


def describe(scn: pm.Scenario, events: list[pm.ApiEvent]) -> list[str]:
    return [
        f"  {e.proc}: {'KILL' if e.op is None else pm.scn_op(scn, e)} steps {e.begin}-{e.end}"
        + (f" spans {list(e.spans)}" if e.spans else "")
        for e in events
    ]


def show(r: Replay, events: list[pm.ApiEvent]) -> str:
    return "\n".join(
        [
            "events:",
            *describe(r.scn, events),
            "replay:",
            *(f"  {x}" for x in r.log),
            "issues:",
            *(f"  [{k}] {m}" for k, m in r.issues),
        ]
    )


def run_and_check(scn: pm.Scenario, order: list[pm.ApiEvent], overlap: bool = False) -> None:
    r = replay(scn, order, overlap)
    try:
        print(show(r, order))
        assert r.issues == [], show(r, order)
        leave_all(r)
    finally:
        teardown(r)


@pytest.mark.parametrize(("name", "kind"), TRACES)
def test_old_counterexample_in_every_api_order(
    counterexamples: dict[tuple[str, str], list[pm.ApiEvent]], name: str, kind: str
) -> None:
    """The trace replayed in every order the API allows (each operation taking effect
    between its first and its last step): no check of the model fails on the engine."""
    scn = pm.scenario(name)
    events = counterexamples[(name, kind)]
    assert events and any(e.op is not None for e in events)
    orders = pm.linearizations(events)
    assert orders and events in orders  # the order in which the operations end is one of them
    print(f"{len(orders)} orders")
    for order in orders:
        run_and_check(scn, order)


@pytest.mark.parametrize(("name", "kind"), TRACES)
def test_old_counterexample_with_sweeps_and_recoveries_overlapping(
    counterexamples: dict[tuple[str, str], list[pm.ApiEvent]], name: str, kind: str
) -> None:
    """The trace in the order its operations end, each sweep or recovery that the
    counterexample interleaves with other operations running in a loop over them."""
    scn = pm.scenario(name)
    events = counterexamples[(name, kind)]
    if not overlap_windows(scn, events):
        pytest.skip("no sweep or recovery of this trace runs inside other operations")
    run_and_check(scn, events, overlap=True)


# ----------------------------------------------------------------------------- the checks can fail


def poke(d: hl.Domain, slot: int, fld: str, value: int) -> int:
    """Store ``value`` into a u64 field of a fence slot with a raw store (a broken or hostile
    participant's write); returns the old value."""
    from hostless import lowlevel

    base = lowlevel.layout(d)["fences_offset"] + slot * int(C.FENCE_SIZE)
    off = base + int(getattr(C, f"F_{fld.upper()}"))
    raw = d.raw()
    old = int.from_bytes(raw[off : off + 8], "little")
    raw[off : off + 8] = value.to_bytes(8, "little")
    return old


def kinds(issues: list[tuple[str, str]]) -> set[str]:
    return {k for k, _ in issues}


def test_checks_catch_a_broken_domain(domain_name: str) -> None:
    """Every check of the replay reports a table broken on purpose (raw stores into a
    consistent domain), and reports nothing once the store is undone."""
    with hl.Domain.create(domain_name, fences=3, participants=4, watchdog_interval=0) as d:
        p = hl.Domain.open(domain_name, label="holder", watchdog_interval=0)
        try:
            a, b = p.fence(), p.fence()
            m = p.merge([a, b])
            me, other = p.participant_id & 0xFF, d.participant_id & 0xFF
            ghost = Ghost()
            for o in (a, b, m):
                ghost.held.add((me, *handle_slot(o.handle)))
            ghost.merged[handle_slot(m.handle)] = [handle_slot(a.handle), handle_slot(b.handle)]
            ia, im = handle_slot(a.handle)[0], handle_slot(m.handle)[0]

            def issues(done: set[int] = set()) -> set[str]:  # noqa: B006 - read only
                return kinds(final_issues(fence_table(d), ghost, done))

            assert issues() == set()
            # a reference bit nobody holds
            old = poke(d, ia, "refs", (1 << me) | (1 << other))
            assert "leaked-ref" in issues()
            poke(d, ia, "refs", old)
            # the holder's bit gone (the slot LIVE with no reference)
            poke(d, ia, "refs", 0)
            assert {"lost-ref", "end-state"} <= issues()
            poke(d, ia, "refs", old)
            # a merged fence SUCCESS while a child is ACTIVE (the OLD sweep's early completion)
            poke(d, im, "word", int(hl.Status.SUCCESS))
            assert "merged-early" in kinds(state_issues(fence_table(d), ghost))
            poke(d, im, "word", 0)
            # a child completed by a plain store, never propagated: its pending bit stays
            poke(d, ia, "word", int(hl.Status.SUCCESS))
            assert "pending-mask" in issues()
            poke(d, ia, "word", 0)
            # a participant taken for dead and recovered whose bits and fences are still there
            ghost.dead[me] = p.participant_id >> 8
            assert "recovery-incomplete" in issues({me})
            del ghost.dead[me]
            assert issues() == set()
            for o in (m, a, b):
                o.release()
        finally:
            p.close()
        assert d.check() == []


def test_the_old_bug_applied_by_hand_is_caught(
    counterexamples: dict[tuple[str, str], list[pm.ApiEvent]],
) -> None:
    """merge-reuse's fresh-not-active trace, replayed with the OLD sweep's stale write done by
    hand where the counterexample does it (after P2's allocation of x in the merged fence's
    freed slot, one store of SUCCESS into x's word): the replay must report what the model
    reports for OLD."""
    scn = pm.scenario("merge-reuse")
    events = counterexamples[("merge-reuse", "fresh-not-active")]

    def stale_sweep(r: Replay, e: pm.ApiEvent) -> None:
        if e.op is not None and pm.scn_op(scn, e)[:2] == ("alloc", "x"):
            poke(r.dom, handle_slot(r.handles["x"])[0], "word", int(hl.Status.SUCCESS))
            r.log.append("(tampered: the OLD sweep's CAS lands on x)")

    r = replay(scn, events, overlap=False, tamper=stale_sweep)
    try:
        print(show(r, events))
        assert "fresh-not-active" in kinds(r.issues), show(r, events)
    finally:
        teardown(r)
