"""Explicit-state model checker of the command-queue protocol
(``src/hostless/include/hostless/hostless_queue.h``).

Pure Python, standard library only.  ``python tests/model/queue_model.py`` explores
every scenario against every variant and prints the state counts and, for each
violation found, a shortest counterexample trace (one line per atomic step).

What is modelled
----------------
* Shared memory: ``capacity`` cell words (seq, producer, state
  FREE/RESERVED/READY/SKIP), the packet slot of each cell (one word here: the
  packet's identity), ``write_index`` and ``read_index``.  Sequence numbers
  are unbounded (no 48-bit wrap).  The doorbell and the futex sleeps are left
  out (they only make the consumer sleep; a poll of a cell stands for them).
* Producers: each runs a list of pushes, each with a hint: none
  (``HL_QUEUE_NO_HINT``), ``fresh`` (the index after its last push, the GPU
  command processor's rule; none for the first push), ``lap n`` (the fresh
  hint minus n * capacity: stale by n laps), or an absolute index (``abs h``:
  e.g. one ahead of write_index).  A push is hl_queue_reserve then
  hl_queue_publish, as in the header: the hinted round (CAS of cell hint from
  FREE(hint), CAS of write_index hint -> hint + 1), the usual rounds (load
  write_index, load the cell, CAS the cell / help write_index / FULL /
  re-read write_index for CORRUPT), the packet store and the READY store.  A
  FULL reserve is retried without a hint (as push_poll and cp_reserve do);
  the 4096-round limit is not modelled (a retry loop is a cycle of states).
* The consumer (pop_poll, its only writer of read_index, which it keeps in a
  register): waits for cell r to be READY or SKIP with seq r (a poll that
  finds nothing is not a step), copies the packet (READY only), stores
  FREE(r + capacity), stores read_index = r + 1.
* Death: a producer marked killable may die while it holds a reservation it
  has not published (after its cell CAS, before its READY store); a
  recoverer process then (one step: it sees the dead participant's liveness
  lock free) scans the cells, one load each, and CASes every RESERVED cell of
  the dead producer to SKIP (hle_recover_queue).
* Atomicity: one transition = one access to shared memory (load, store, CAS),
  sequentially consistent; local computation is folded into the access that
  follows it.

Checks
------
After every transition: no index is reserved twice (``double-reserve``); a
packet store or READY store lands only on the writer's own RESERVED cell and
never on an unconsumed packet (``overwrite``); write_index never goes back
(``wi-backwards``) and never passes an index nobody reserved
(``wi-passes-unreserved``); the consumer copies the packet published for the
index it takes (``bad-packet``), takes each packet once (``duplicate``), in
each producer's order (``fifo``), SKIPs only packets of a dead producer
(``bad-skip``); FULL is returned only while write_index - read_index >=
capacity (``false-full``); CORRUPT is never returned (``corrupt``).  At final
states (nothing but deaths enabled): every reserved packet was taken
(``lost``).  After the search: every reachable state can still reach a final
state (``stuck``: a deadlock or a livelock, e.g. a producer spinning on FULL
behind a cell nobody will ever free).

Variants
--------
``CURRENT`` is the header as it is now: recovery moves write_index from s to
s + 1 before it SKIPs a dead producer's cell of seq s (hl_queue_skip_reserved,
called by hle_recover_queue).  ``OLD`` is the header as first landed, whose
recovery only SKIPped the cell.  Two deliberately broken ones show that the
checker can fail: ``BROKEN_ANY_FREE`` (the hinted round loads the cell and
CASes it if it is FREE, whatever its seq) and ``BROKEN_STORE_WI`` (the hinted
round stores write_index = hint + 1 instead of a CAS).  The other candidate
fix of OLD's wedge, ``RESERVE_HELPS_AHEAD`` (OLD with one change): a usual
round that finds the cell ahead of w (seq > w: index w was consumed, so it
was reserved) CASes write_index from w to w + 1 and retries, instead of
re-reading write_index and returning HL_E_CORRUPT.

Findings (OLD; the first is fixed in CURRENT, the second is ruled out by the
contract: a hint must not be ahead of write_index)
------------------
* ``death-in-window``: a producer killed between its cell CAS and its
  write_index CAS (both the hinted and the usual round have that window)
  leaves write_index = w; recovery SKIPs cell w, the consumer frees it to
  FREE(w + capacity), and from then on every unhinted reserve reads
  write_index = w, finds the cell ahead of w and a write_index that did not
  move: HL_E_CORRUPT, forever (nothing advances write_index any more).
* ``hint-ahead``: a hint ahead of write_index (allowed by the header's words,
  "a write index the caller expects to be free", but never produced by the
  GPU command processor, whose hints come from its own pushes) reserves past
  an unreserved index; the write_index CAS fails, the packet waits for
  someone to reserve the hole, and once both are consumed write_index lags
  read_index: the next unhinted push returns HL_E_CORRUPT (same wedge).
  Whatever the fix, such a hint also breaks the producer's own order when
  its next push fills the hole (``hint-ahead-fifo``), and strands its packet
  when nobody does (``hint-ahead-alone``): the contract has to rule hints
  ahead of write_index out (an index after one's own last push never is).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

CURRENT = "CURRENT"
OLD = "OLD"
BROKEN_ANY_FREE = "BROKEN_ANY_FREE"
BROKEN_STORE_WI = "BROKEN_STORE_WI"
RESERVE_HELPS_AHEAD = "RESERVE_HELPS_AHEAD"
VARIANTS = (CURRENT, OLD, BROKEN_ANY_FREE, BROKEN_STORE_WI, RESERVE_HELPS_AHEAD)

FREE, RESERVED, READY, SKIP = 0, 1, 2, 3
STATE_NAMES = {FREE: "FREE", RESERVED: "RESERVED", READY: "READY", SKIP: "SKIP"}
NO_HINT = None


class Cell(NamedTuple):
    seq: int
    producer: int
    state: int

    def __repr__(self) -> str:
        if self.state == FREE:
            return f"FREE({self.seq})"
        return f"{STATE_NAMES[self.state]}({self.seq},p{self.producer})"


class Pkt(NamedTuple):
    """A packet's identity: the index it was reserved at, its producer, its number."""

    at: int
    pid: int
    n: int


class Proc(NamedTuple):
    pc: str
    k: int = 0  # pushes done (producer) / cell scanned (recoverer)
    w: int = 0  # the index in hand
    c: Cell | None = None  # the cell value loaded
    hint: int | None = None
    last: int | None = None  # the index of the last push (fresh hints)
    alive: bool = True


class Ghost(NamedTuple):
    reserved: tuple[tuple[int, Pkt], ...] = ()  # index -> packet, sorted
    taken: tuple[Pkt, ...] = ()  # in the consumer's order (SKIPs too)
    dead: frozenset[int] = frozenset()


class State(NamedTuple):
    cells: tuple[Cell, ...]
    slots: tuple[Pkt | None, ...]
    wi: int
    ri: int
    procs: tuple[Proc, ...]
    ghost: Ghost


@dataclass(frozen=True)
class Producer:
    pid: int
    pushes: tuple[Any, ...]  # hint specs: None, "fresh", ("lap", n), ("abs", h)
    killable: bool = False
    after_wi_only: bool = False  # killable only once write_index is past its cell (outside the window)


@dataclass(frozen=True)
class Consumer:
    pass


@dataclass(frozen=True)
class Recoverer:
    victim: int


@dataclass(frozen=True)
class Scenario:
    name: str
    capacity: int
    procs: tuple[Producer | Consumer | Recoverer, ...]
    doc: str = ""
    min_states: int = 10
    covers: tuple[str, ...] = ()  # branches (Result.events) the search must have taken


@dataclass
class Violation:
    kind: str
    message: str
    trace: list[str]


@dataclass
class Result:
    scenario: str
    variant: str
    states: int = 0
    transitions: int = 0
    finals: int = 0
    seconds: float = 0.0
    complete: bool = True
    violations: dict[str, Violation] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)  # transitions per branch taken (coverage)

    def summary(self) -> str:
        v = ", ".join(sorted(self.violations)) or "no violation"
        return (
            f"{self.scenario:<20} {self.variant:<18} {self.states:>7} states"
            f" {self.transitions:>8} transitions {self.finals:>3} finals {self.seconds:6.2f} s  {v}"
        )


class ModelError(Exception):
    pass


class Step:
    """One transition of one process: exactly one shared access, and the checks it triggers."""

    def __init__(self, model: Model, st: State, pi: int) -> None:
        self.m = model
        self.cells = list(st.cells)
        self.slots = list(st.slots)
        self.wi = st.wi
        self.ri = st.ri
        self.procs = list(st.procs)
        self.ghost = st.ghost
        self.pi = pi
        self.accesses = 0
        self.desc = ""
        self.bad: list[tuple[str, str]] = []
        self.events: list[str] = []  # coverage: which branches the step took

    # ---- shared accesses (exactly one per step) ----
    def _one(self, desc: str) -> None:
        self.accesses += 1
        if self.accesses > 1:
            raise ModelError(f"two shared accesses in one step: {self.desc}; {desc}")
        self.desc = desc

    def load_cell(self, i: int) -> Cell:
        c = self.cells[i % self.m.cap]
        self._one(f"load cell[{i % self.m.cap}] = {c!r}")
        return c

    def cas_cell(self, i: int, expect: Cell, new: Cell) -> bool:
        j = i % self.m.cap
        ok = self.cells[j] == expect
        self._one(f"CAS cell[{j}] {expect!r} -> {new!r}: {'ok' if ok else f'fail ({self.cells[j]!r})'}")
        if ok:
            self.cells[j] = new
        return ok

    def store_cell(self, i: int, new: Cell) -> None:
        j = i % self.m.cap
        self._one(f"store cell[{j}] = {new!r} (was {self.cells[j]!r})")
        self.cells[j] = new

    def load_wi(self) -> int:
        self._one(f"load write_index = {self.wi}")
        return self.wi

    def cas_wi(self, expect: int, new: int) -> bool:
        ok = self.wi == expect
        self._one(f"CAS write_index {expect} -> {new}: {'ok' if ok else f'fail ({self.wi})'}")
        if ok:
            self._set_wi(new)
        return ok

    def store_wi(self, new: int) -> None:
        self._one(f"store write_index = {new} (was {self.wi})")
        self._set_wi(new)

    def _set_wi(self, new: int) -> None:
        if new < self.wi:
            self.bad.append(("wi-backwards", f"write_index {self.wi} -> {new}"))
        self.wi = new

    def store_slot(self, i: int, p: Pkt) -> None:
        j = i % self.m.cap
        old = self.slots[j]
        self._one(f"store packet[{j}] = {p}")
        if old is not None and old.at != i and old not in self.ghost.taken:
            self.bad.append(("overwrite", f"packet {p} stored over {old}, not yet consumed"))
        self.slots[j] = p

    def load_slot(self, i: int) -> Pkt | None:
        p = self.slots[i % self.m.cap]
        self._one(f"copy packet[{i % self.m.cap}] = {p}")
        return p

    def store_ri(self, new: int) -> None:
        self._one(f"store read_index = {new}")
        self.ri = new

    def see_dead(self, d: int) -> None:
        self._one(f"liveness lock of p{d} is free (p{d} died)")

    # ---- ghost ----
    def reserve_ghost(self, w: int, pkt: Pkt) -> None:
        res = dict(self.ghost.reserved)
        if w in res:
            self.bad.append(("double-reserve", f"index {w} reserved by {pkt} after {res[w]}"))
        res[w] = pkt
        self.ghost = self.ghost._replace(reserved=tuple(sorted(res.items())))

    def take_ghost(self, r: int, cell: Cell, copied: Pkt | None) -> None:
        res = dict(self.ghost.reserved)
        pkt = res.get(r)
        if pkt is None:
            self.bad.append(("bad-packet", f"index {r} taken but never reserved"))
            return
        if cell.state == READY and copied != pkt:
            self.bad.append(("bad-packet", f"index {r}: copied {copied}, published {pkt}"))
        if cell.state == SKIP and pkt.pid not in self.ghost.dead:
            self.bad.append(("bad-skip", f"index {r} ({pkt}) SKIPped, its producer is alive"))
        if pkt in self.ghost.taken:
            self.bad.append(("duplicate", f"{pkt} taken twice"))
        earlier = [t.n for t in self.ghost.taken if t.pid == pkt.pid]
        if earlier and max(earlier) > pkt.n:
            self.bad.append(("fifo", f"{pkt} taken after packet {max(earlier)} of p{pkt.pid}"))
        self.ghost = self.ghost._replace(taken=self.ghost.taken + (pkt,))

    def state(self) -> State:
        return State(tuple(self.cells), tuple(self.slots), self.wi, self.ri, tuple(self.procs), self.ghost)


class Model:
    def __init__(self, scn: Scenario, variant: str) -> None:
        if variant not in VARIANTS:
            raise ValueError(variant)
        self.scn = scn
        self.variant = variant
        self.cap = scn.capacity
        self.names = []
        for spec in scn.procs:
            if isinstance(spec, Producer):
                self.names.append(f"P{spec.pid}")
            elif isinstance(spec, Consumer):
                self.names.append("C")
            else:
                self.names.append("R")

    def initial(self) -> State:
        cells = tuple(Cell(i, 0, FREE) for i in range(self.cap))
        procs = []
        for spec in self.scn.procs:
            procs.append(Proc("start" if isinstance(spec, Producer) else "idle"))
        return State(cells, (None,) * self.cap, 0, 0, tuple(procs), Ghost())

    # ---- one process, one step ----
    def step(self, st: State, pi: int) -> Step | None:
        spec = self.scn.procs[pi]
        p = st.procs[pi]
        if not p.alive:
            return None
        x = Step(self, st, pi)
        if isinstance(spec, Producer):
            np = self.producer(x, spec, p)
        elif isinstance(spec, Consumer):
            np = self.consumer(x, p)
        else:
            np = self.recoverer(x, spec, p)
        if np is None:
            return None
        if x.accesses != 1:
            raise ModelError(f"{self.names[pi]} at {p.pc}: {x.accesses} shared accesses")
        x.procs[pi] = np
        return x

    def hint_for(self, spec: Producer, p: Proc) -> int | None:
        h = spec.pushes[p.k]
        if h is None:
            return None
        if h == "fresh":
            return None if p.last is None else p.last + 1
        if h[0] == "lap":
            return (
                None if p.last is None or p.last + 1 - h[1] * self.cap < 0 else p.last + 1 - h[1] * self.cap
            )
        if h[0] == "abs":
            return int(h[1])
        raise ValueError(h)

    def producer(self, x: Step, spec: Producer, p: Proc) -> Proc | None:
        me = spec.pid
        pc = p.pc
        if pc == "done":
            return None
        if pc == "start":  # hl_queue_reserve: the hinted round, or the first usual round
            hint = self.hint_for(spec, p)
            if hint is None:
                return p._replace(pc="R2", w=x.load_wi(), hint=None)
            if self.variant == BROKEN_ANY_FREE:
                return p._replace(pc="H1b", hint=hint, c=x.load_cell(hint))
            if x.cas_cell(hint, Cell(hint, 0, FREE), Cell(hint, me, RESERVED)):
                x.reserve_ghost(hint, Pkt(hint, me, p.k))
                x.events.append("hint-taken")
                return p._replace(pc="H2", w=hint, hint=hint)
            x.events.append("hint-missed")
            return p._replace(pc="R1", hint=hint)
        if pc == "H1b":  # broken: any FREE cell will do
            assert p.c is not None and p.hint is not None
            if p.c.state == FREE and x.cas_cell(p.hint, p.c, Cell(p.hint, me, RESERVED)):
                x.reserve_ghost(p.hint, Pkt(p.hint, me, p.k))
                return p._replace(pc="H2", w=p.hint)
            if p.c.state != FREE:  # the CAS was not tried: this step needs its access
                return p._replace(pc="R2", w=x.load_wi())
            return p._replace(pc="R1")
        if pc == "H2":
            if self.variant == BROKEN_STORE_WI:
                x.store_wi(p.w + 1)
            else:
                x.cas_wi(p.w, p.w + 1)
            return p._replace(pc="P1")
        if pc == "R1":
            return p._replace(pc="R2", w=x.load_wi())
        if pc == "R2":
            w = p.w
            c = x.load_cell(w)
            if c.state == FREE and c.seq == w:
                return p._replace(pc="R3", c=c)
            if c.seq == w:
                x.events.append("help")
                return p._replace(pc="R4")  # reserved by someone who has not advanced write_index: help
            if c.seq < w:
                x.events.append("full")
                if x.wi - x.ri < self.cap:
                    x.bad.append(("false-full", f"FULL with write_index {x.wi}, read_index {x.ri}"))
                return p._replace(pc="R1", hint=None)  # FULL: the caller retries without a hint
            return p._replace(pc="R5")
        if pc == "R3":
            assert p.c is not None
            if x.cas_cell(p.w, p.c, Cell(p.w, me, RESERVED)):
                x.reserve_ghost(p.w, Pkt(p.w, me, p.k))
                return p._replace(pc="R6")
            return p._replace(pc="R1")
        if pc == "R6":
            x.cas_wi(p.w, p.w + 1)
            return p._replace(pc="P1")
        if pc == "R4":
            x.cas_wi(p.w, p.w + 1)
            return p._replace(pc="R1")
        if pc == "R5" and self.variant == RESERVE_HELPS_AHEAD:
            # the other candidate fix: a cell ahead of w means index w was consumed, so reserved
            x.cas_wi(p.w, p.w + 1)
            return p._replace(pc="R1")
        if pc == "R5":
            if x.load_wi() == p.w:
                x.bad.append(
                    ("corrupt", f"HL_E_CORRUPT: cell[{p.w % self.cap}] is ahead of write_index {p.w}")
                )
                return p._replace(pc="done")
            return p._replace(pc="R1")
        if pc == "P1":  # hl_queue_publish: the packet, then READY
            cur = x.cells[p.w % self.cap]
            if cur != Cell(p.w, me, RESERVED):
                x.bad.append(("overwrite", f"P{me} fills packet {p.w} but its cell is {cur!r}"))
            x.store_slot(p.w, Pkt(p.w, me, p.k))
            return p._replace(pc="P2")
        if pc == "P2":
            cur = x.cells[p.w % self.cap]
            if cur != Cell(p.w, me, RESERVED):
                x.bad.append(("overwrite", f"P{me} publishes {p.w} over {cur!r}"))
            x.store_cell(p.w, Cell(p.w, me, READY))
            k = p.k + 1
            return Proc("done" if k == len(spec.pushes) else "start", k=k, last=p.w)
        raise ModelError(pc)

    def consumer(self, x: Step, p: Proc) -> Proc | None:
        r = x.ri
        if p.pc == "idle":
            c = x.cells[r % self.cap]
            if c.seq != r or c.state not in (READY, SKIP):
                return None  # a poll that finds nothing: no step
            x.load_cell(r)
            x.events.append("take" if c.state == READY else "take-skip")
            return p._replace(pc="copy" if c.state == READY else "free", c=c, w=r)
        if p.pc == "copy":
            assert p.c is not None
            x.take_ghost(r, p.c, x.load_slot(r))
            return p._replace(pc="free2")
        if p.pc in ("free", "free2"):
            assert p.c is not None
            if p.pc == "free":
                x.take_ghost(r, p.c, None)  # a SKIP: nothing copied (folded into the store below)
            x.store_cell(r, Cell(r + self.cap, 0, FREE))
            return p._replace(pc="adv")
        if p.pc == "adv":
            x.store_ri(r + 1)
            return Proc("idle")
        raise ModelError(p.pc)

    def recoverer(self, x: Step, spec: Recoverer, p: Proc) -> Proc | None:
        d = spec.victim
        if p.pc == "idle":
            if d not in x.ghost.dead:
                return None
            x.see_dead(d)
            return Proc("scan", k=0)
        if p.pc == "scan":
            if p.k >= self.cap:
                return None
            c = x.load_cell(p.k)
            if c.state == RESERVED and c.producer == d:
                return p._replace(pc="adv_wi" if self.variant == CURRENT else "skip", c=c)
            return Proc("scan", k=p.k + 1) if p.k + 1 < self.cap else Proc("done")
        if p.pc == "adv_wi":  # hl_queue_skip_reserved: write_index past the abandoned cell first
            assert p.c is not None
            x.cas_wi(p.c.seq, p.c.seq + 1)
            return p._replace(pc="skip")
        if p.pc == "skip":
            assert p.c is not None
            x.cas_cell(p.k, p.c, Cell(p.c.seq, d, SKIP))
            return Proc("scan", k=p.k + 1) if p.k + 1 < self.cap else Proc("done")
        if p.pc == "done":
            return None
        raise ModelError(p.pc)

    def kill(self, st: State, pi: int) -> State | None:
        """A killable producer dies while it holds an unpublished reservation."""
        spec = self.scn.procs[pi]
        p = st.procs[pi]
        if not isinstance(spec, Producer) or not spec.killable or not p.alive:
            return None
        if p.pc not in (("P1", "P2") if spec.after_wi_only else ("H2", "R6", "P1", "P2")):
            return None
        g = st.ghost._replace(dead=st.ghost.dead | {spec.pid})
        procs = list(st.procs)
        procs[pi] = p._replace(alive=False)
        return st._replace(procs=tuple(procs), ghost=g)

    def successors(self, st: State) -> list[tuple[State, str, list[tuple[str, str]], bool, list[str]]]:
        out = []
        for pi in range(len(st.procs)):
            x = self.step(st, pi)
            if x is not None:
                out.append((x.state(), f"{self.names[pi]}: {x.desc}", x.bad, False, x.events))
            k = self.kill(st, pi)
            if k is not None:
                out.append((k, f"{self.names[pi]}: dies holding index {st.procs[pi].w}", [], True, ["death"]))
        return out

    def state_issues(self, st: State) -> list[tuple[str, str]]:
        res = {i for i, _ in st.ghost.reserved}
        holes = [i for i in range(st.wi) if i not in res]
        if holes:
            return [("wi-passes-unreserved", f"write_index {st.wi} passed unreserved index {holes[0]}")]
        return []

    def final_issues(self, st: State) -> list[tuple[str, str]]:
        out = []
        lost = [p for _, p in st.ghost.reserved if p not in st.ghost.taken]
        if lost:
            out.append(("lost", f"never taken: {lost} (write_index {st.wi}, read_index {st.ri}, {st.cells})"))
        return out


def trace_to(parent: list[int], label: list[str], sid: int) -> list[str]:
    tr = []
    while parent[sid] >= 0:
        tr.append(label[sid])
        sid = parent[sid]
    tr.reverse()
    return tr


def explore(scn: Scenario, variant: str, max_states: int = 2_000_000) -> Result:
    """Breadth-first search of every interleaving (shortest trace per violation kind), then the
    liveness check: every state reaches a final state."""
    model = Model(scn, variant)
    t0 = time.perf_counter()
    res = Result(scn.name, variant)
    init = model.initial()
    ids: dict[State, int] = {init: 0}
    states = [init]
    parent = [-1]
    label = [""]
    succs: list[list[int]] = []
    expanded: list[bool] = []
    finals: set[int] = set()
    queue = deque([0])

    def record(kind: str, msg: str, sid: int, last: str | None) -> None:
        if kind not in res.violations:
            tr = trace_to(parent, label, sid) + ([last] if last else [])
            res.violations[kind] = Violation(kind, msg, tr)

    while queue:
        sid = queue.popleft()
        st = states[sid]
        while len(succs) <= sid:
            succs.append([])
            expanded.append(False)
        expanded[sid] = True
        succ = model.successors(st)
        if all(killed for _, _, _, killed, _ in succ):
            res.finals += 1
            finals.add(sid)
            for kind, msg in model.final_issues(st):
                record(kind, msg, sid, None)
        for nst, desc, bad, _killed, events in succ:
            res.transitions += 1
            for e in events:
                res.events[e] = res.events.get(e, 0) + 1
            for kind, msg in bad:
                record(kind, msg, sid, desc)
            nid = ids.get(nst)
            if nid is None:
                nid = len(states)
                ids[nst] = nid
                states.append(nst)
                parent.append(sid)
                label.append(desc)
                sbad = model.state_issues(nst)
                for kind, msg in sbad:
                    record(kind, msg, nid, None)
                if not bad and not sbad:
                    queue.append(nid)
                else:
                    finals.add(nid)  # a violating state is not expanded (nor reported as stuck)
            succs[sid].append(nid)
        if len(states) > max_states:
            raise ModelError(f"{scn.name}/{variant}: more than {max_states} states")
    # liveness: backwards from the final states
    pred: list[list[int]] = [[] for _ in states]
    for a, lst in enumerate(succs):
        for b in lst:
            pred[b].append(a)
    can = [False] * len(states)
    todo = deque(finals)
    for f in finals:
        can[f] = True
    while todo:
        b = todo.popleft()
        for a in pred[b]:
            if not can[a]:
                can[a] = True
                todo.append(a)
    stuck = [s for s in range(len(states)) if not can[s]]
    if stuck:
        s = stuck[0]  # smallest id: found first by the BFS, a shortest trace
        st = states[s]
        record(
            "stuck",
            f"no final state is reachable (write_index {st.wi}, read_index {st.ri}, cells {st.cells}, "
            f"procs {[f'{model.names[i]}:{p.pc}' for i, p in enumerate(st.procs)]})",
            s,
            None,
        )
    res.states = len(states)
    res.seconds = time.perf_counter() - t0
    return res


P, C, R = Producer, Consumer, Recoverer


def scenarios() -> list[Scenario]:
    """Small scenarios, each explored exhaustively."""
    fresh, abs0, abs1 = "fresh", ("abs", 0), ("abs", 1)
    return [
        Scenario(
            name="plain-cap1",
            capacity=1,
            procs=(P(0, (None, None)), P(1, (None,)), C()),
            doc="no hints, capacity 1",
            min_states=500,
            covers=("full", "help", "take"),
        ),
        Scenario(
            name="plain-cap2",
            capacity=2,
            procs=(P(0, (None, None)), P(1, (None, None)), C()),
            doc="no hints, capacity 2",
            min_states=3000,
            covers=("full", "help", "take"),
        ),
        Scenario(
            name="fresh-cap2",
            capacity=2,
            procs=(P(0, (None, fresh, fresh)), P(1, (None, None)), C()),
            doc="the GPU command processor's hints (the index after its last push) and an unhinted producer",
            min_states=10000,
            covers=("hint-taken", "hint-missed", "full", "help"),
        ),
        Scenario(
            name="fresh-two-hinted",
            capacity=2,
            procs=(P(0, (None, fresh, fresh)), P(1, (None, fresh)), C()),
            doc="two hinting producers interleaved: each one's hint is stale whenever the other pushed",
            min_states=15000,
            covers=("hint-taken", "hint-missed", "full"),
        ),
        Scenario(
            name="fresh-cap1",
            capacity=1,
            procs=(P(0, (None, fresh, fresh)), P(1, (None, fresh)), C()),
            doc="capacity 1: a fresh hint is the cell of the last push",
            min_states=10000,
            covers=("hint-taken", "hint-missed", "full"),
        ),
        Scenario(
            name="stale-laps",
            capacity=2,
            procs=(P(0, (None, None, ("lap", 1), ("lap", 2))), P(1, (None, None)), C()),
            doc="hints one and two laps stale: the cell holds a later seq",
            min_states=20000,
            covers=("hint-missed", "full"),
        ),
        Scenario(
            name="stale-abs",
            capacity=1,
            procs=(P(0, (None, None, abs0, abs1)), P(1, (None,)), C()),
            doc="absolute hints 0 and 1 after several pushes: stale by one or more laps",
            min_states=3000,
            covers=("hint-missed", "full"),
        ),
        Scenario(
            name="three-producers",
            capacity=2,
            procs=(P(0, (None, fresh)), P(1, (fresh,)), P(2, (None,)), C()),
            doc="three producers, capacity 2 (one hinted)",
            min_states=30000,
            covers=("hint-taken", "hint-missed", "help"),
        ),
        Scenario(
            name="death-after-wi",
            capacity=2,
            procs=(P(0, (None, fresh), killable=True, after_wi_only=True), P(1, (None, fresh)), C(), R(0)),
            doc="a producer killed after write_index passed its cell (outside the window), recovered",
            min_states=10000,
            covers=("death", "take-skip", "hint-taken"),
        ),
        Scenario(
            name="death-in-window",
            capacity=2,
            procs=(P(0, (None,), killable=True), P(1, (None, None)), C(), R(0)),
            doc="a producer killed anywhere between its cell CAS and its READY store, recovered",
            min_states=2000,
            covers=("death", "take-skip"),
        ),
        Scenario(
            name="death-hinted",
            capacity=2,
            procs=(P(0, (abs0, fresh), killable=True), P(1, (None, fresh)), C(), R(0)),
            doc="a hinting producer (first hint 0, fresh) killed between its cell CAS and its READY store",
            min_states=10000,
            covers=("death", "take-skip", "hint-taken"),
        ),
        Scenario(
            name="hint-ahead",
            capacity=2,
            procs=(P(0, (abs1,)), P(1, (None, None)), C()),
            doc="a hint one ahead of write_index (not what the header's users pass)",
            min_states=400,
            covers=("hint-taken",),
        ),
        Scenario(
            name="hint-ahead-fifo",
            capacity=2,
            procs=(P(0, (abs1, None)), C()),
            doc="a hint ahead, then an unhinted push by the same producer: it fills the hole",
            min_states=10,
            covers=("hint-taken",),
        ),
        Scenario(
            name="hint-ahead-alone",
            capacity=2,
            procs=(P(0, (abs1,)), C()),
            doc="a hint ahead and nobody to reserve the hole behind it",
            min_states=4,
            covers=("hint-taken",),
        ),
    ]


def scenario(name: str) -> Scenario:
    for s in scenarios():
        if s.name == name:
            return s
    raise KeyError(name)


def explore_by_name(name: str, variant: str) -> Result:
    return explore(scenario(name), variant)


def main(argv: list[str]) -> int:
    names = argv or [s.name for s in scenarios()]
    for n in names:
        for v in VARIANTS:
            res = explore_by_name(n, v)
            print(res.summary())
            for kind, viol in sorted(res.violations.items()):
                print(f"  [{kind}] {viol.message}")
                for t in viol.trace:
                    print(f"      {t}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
