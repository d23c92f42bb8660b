"""Explicit-state model checker of the fence-table protocol of the C engine (``src/hostless/core/``).

Pure Python, standard library only.  ``python tests/model/protocol_model.py`` runs
every scenario against both protocol variants and prints, for each, the number
of states explored, the transitions, and either "no violation" or the
counterexample traces (one line per atomic step: "process: procedure(..): step").

What is modelled
----------------
* Shared memory: a table of ``cap`` (1-4) slots with the fields of
  ``struct hl_fence`` that the protocol uses: ``word``, ``ctl`` = (gen, kind,
  pidx, state FREE/ALLOC/LIVE/DYING), ``refs`` (bitmask of participants),
  ``waiters``, ``owner`` (a participant index; incarnations are not
  modelled: every participant has one), ``aux`` (merged: (gen, pending mask);
  timeline: the value before a failure), ``parents`` (``maxpar`` links
  (pos, parent gen, parent index) stored in separate words), ``err`` (merged:
  (gen, first failure)) and ``wake`` (the NEW timeline wake sequence); plus
  ``alloc_hint``, the participant table (state ALIVE/RECOVERING/FREE and the
  recorder of the recoverer: a participant index or 255) and one liveness
  lock per participant (the OFD lock on its byte of the file: held by the
  live participant; free once it died; in the NEW protocol taken by d's
  recoverer).  Futex sleepers are part of the state: a process asleep on an
  address is not schedulable until a FUTEX_WAKE on that address.
* Processes: each process runs a program (a list of API operations: alloc,
  merge, signal, wait, release, import, sweep, recover d, ...).  The
  operations are written as explicit state machines that mirror the C
  functions (``alloc_begin``/``alloc_publish``, ``merge``, ``do_signal``,
  ``propagate``, ``propagate_link``, ``resolve_merged``, ``sweep``,
  ``drop_ref``, ``finalize``, ``do_import``, ``do_wait``, ``do_tl_signal``,
  ``reap_all``/``recover_participant``).  A process state is a call stack of
  frames (procedure, pc, locals), all hashable.
* Atomicity: ONE transition performs exactly ONE access to shared memory:
  a load, a store, a CAS (8 bytes), a fetch_or/fetch_add, a CAS2 (the NEW
  16-byte CAS over {word, ctl}), a FUTEX_WAIT (compares and sleeps
  atomically), a FUTEX_WAKE, an OFD lock test/take/release.  Everything local
  (branches, calls, returns) is folded into the transition that follows it.
  Every access is sequentially consistent (no weak-memory reordering is
  modelled).  Two simplifications are atomic on purpose: the initialisation
  of a claimed slot (all its fields, one step, as the brief allows; the C code
  does one store per field while the slot is ALLOC, i.e. invisible to every
  protocol reader), and the check "is any slot FREE" of an allocation that
  found the table full (a spin-retry loop is modelled as an await: the process
  is blocked until some slot is FREE, then scans again).
* Death: a process marked ``killable`` may be killed before any of its steps
  (also after its program ended: it is still a participant).  It then stops
  forever and its liveness lock (and a lock it held as a recoverer) is
  released; its references, its ownerships and its ``pctl`` stay until a
  recoverer cleans them up.
* Checks after every transition: the write rule (every write to word, aux,
  err or parents is classified: ``stale-write`` when it lands on another
  incarnation than the one the writer aimed at, i.e. the generation moved
  since the writer read it, which is the bug; ``unheld-write`` when it lands
  on the intended incarnation but the writer neither holds a reference, nor
  owns the slot ALLOC/DYING, nor used a generation-checked atomic step (the
  NEW write rule forbids it, the OLD protocol does it routinely); a write to a
  FREE slot, or to a claimed slot before its initialisation, is recorded as a
  benign note: the initialisation of the next incarnation overwrites it),
  merged-fence consistency (never SUCCESS while a child is ACTIVE or failed,
  a failure status must come from a child), at most one recoverer of a
  participant inside the recovery steps, and per-scenario checks.  A
  violating state is reported and not expanded further.
* Checks at final states (no transition enabled but deaths: a killable process
  may also never die, and a recoverer waiting for a death is then idle):
  nobody asleep forever
  (lost wake-up) or blocked forever, every slot FREE or LIVE (ALLOC/DYING
  only by a dead participant not yet recovered), LIVE => refs != 0, FREE =>
  refs == 0, every reference bit matches a reference the model knows of, a
  merged fence's pending mask covers only ACTIVE children that link to it
  and a merged fence with an empty mask is complete, and after a recovery:
  no reference bit, no ALLOC/DYING slot of the dead participant, every fence
  it owned is signaled.

What is abstracted or left out
------------------------------
* Values: generations are unbounded integers (no 24-bit wrap), statuses are
  SUCCESS=2, ERROR=3, CANCEL=4, OWNER_DIED=6, a failed timeline word is
  FAILED | status with FAILED = 2^62, and the futex compares the low 32 bits
  (value mod 2^32), so a timeline that jumps by 2^32 leaves its futex word
  unchanged.
* A single level of merges (a merged fence is never the child of another
  merge: ``record_failure``'s recursion to grand-parents is not modelled) and,
  by default, one parent link per fence (``maxpar=1``; the C code has
  HL_MAX_PARENTS = 2, a scenario may set ``maxpar=2``).
* No heap, buffers, queues, trace ring, device (plain-store) signalers,
  spinning phases of waits, timeouts, incarnation numbers, joins/leaves, the
  local per-process reference counts of the C code (a process takes one
  reference per object), nor the "already part of 2 merges" pre-check.
* Waits have no bounded sleep (the real code sleeps at most poll_ns and then
  re-checks): without it a lost wake-up is a process asleep forever, which is
  what the model reports.  A wait on a merged fence does not run a sweep
  before sleeping (the sweeper processes of the scenarios do that).
* OLD recovery follows the landed C code, including the per-slot re-read of
  the participant's ctl (a recoverer whose claim was taken over stops at the
  next slot); the takeover test "recorded recoverer dead" is one read of that
  participant's liveness lock.

Variants
--------
``OLD`` is the landed code of ABI version 1.  ``DRAFT`` is the rewrite as
first specified: seqlock reads in propagate, CAS2 completion of merged
fences, the pending mask set before publication, links and aux cleared before
FREE, alloc_hint only advancing, timeline sleepers on a wake sequence,
recovery under the dead participant's liveness lock with pinning; drop_ref and
import unchanged.  ``NEW`` is what src/hostless/core/ implements: DRAFT plus
the two changes this model asked for (see the traces of recovery-stale-write
and recovery-vs-import): drop_ref reads refs between two reads of ctl and
retries if ctl moved; a recovery that finds the slot DYING by someone else, or
whose pin check sees the same generation DYING, waits for the slot to settle
and examines it again instead of skipping it.  (Comments below that say "NEW"
describe what DRAFT and NEW share; "NEW+fix" marks the two changes.)

What it finds (``python tests/model/protocol_model.py``)
---------------------------------------------------
OLD: every bug the scenarios are about.  DRAFT: none of those, but two others:
a leaked slot (LIVE, refs 0) when the undo drop_ref of a failed recovery pin
acts on the next object in the slot (recovery-stale-write), and a fence owned
by a dead participant left ACTIVE forever when the recovery skips a slot that
is only transiently DYING while an importer takes a reference
(recovery-vs-import).  NEW: nothing.

The counterexamples as data: ``Violation.steps`` (one ``Step`` per trace line),
``api_events`` (the trace at API granularity) and ``linearizations`` (the API-level
orders it allows); tests/model/test_protocol_replay.py replays OLD's against the C engine.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

OLD = "OLD"  # ABI version 1, the landed code
DRAFT = "DRAFT"  # the write rule as first specified (two bugs, found by this model)
NEW = "NEW"  # DRAFT plus the model's two fixes: what src/hostless/core/ implements
VARIANTS = (OLD, NEW)
# watch nodes (ABI 5, docs/abi.md 5a).  FIRST: the watch nodes as first written on the
# fence-algebra branch (an untagged watcher count, decremented by every node's finalize);
# NEW implements the two fixes the watch scenarios asked for; EVAL_FIRST and COUNT_FIRST are
# NEW with the "no lost completion" ordering broken on purpose (the creator evaluates its node
# before counting it; the signaller reads the count before storing the word), to show that
# the model finds the lost completion the ordering prevents.
FIRST = "FIRST"
EVAL_FIRST = "EVAL_FIRST"
COUNT_FIRST = "COUNT_FIRST"
# watch lists (ABI 6, docs/abi.md 5a): what src/hostless/core/ implements now.  A watched object's
# nodes are linked from it (head in the count's field, a node's next in its parents[1], modelled
# as the field nxt); its signaller walks them instead of scanning; a node's finalize marks its
# next, then unlinks every marked node its walk meets with CASes that carry the predecessor's
# (or the target's) generation.  In the watch scenarios NEW is ABI 5 (the count and the scan):
# the old protocol, which must show nothing the scenarios did not expect of it.  (NEW and the
# list variants both fail timelines with ABI 6's reached points: AUX_MAX_VARIANTS below.)
LISTS = "LISTS"
# LISTS broken on purpose, to show that the list scenarios find what the design prevents:
# NOMARK: a finalize unlinks its node without marking it first (two neighbours leaving at once
# relink a node that left); NOCHECK: a walker follows any slot a next names, without checking it
# is a node of that list (a node unlinked and reused under a walker ends its walk early).
LISTS_NOMARK = "LISTS_NOMARK"
LISTS_NOCHECK = "LISTS_NOCHECK"
LIST_VARIANTS = (LISTS, LISTS_NOMARK, LISTS_NOCHECK)
WATCH_VARIANTS = (FIRST, EVAL_FIRST, COUNT_FIRST, NEW, LISTS)
# reached points (ABI 6, docs/abi.md 3 and 8): FORGET is ABI 5 (a failed timeline reports its
# failure for every point, a clean leave fails what the participant owned with OWNER_DIED, and
# every failer stores the value it read into aux); AUX_STORE reads aux back ("a point at or below
# the value before the failure is SUCCESS") but keeps the plain store of aux, which a concurrent
# failer that read an older value can lower; NEW raises aux with a max-CAS loop and leaves with
# OWNER_LEFT.
FORGET = "FORGET"
AUX_STORE = "AUX_STORE"
POINT_VARIANTS = (FORGET, AUX_STORE, NEW)
# a failer raises aux by a max-CAS (ABI 6) in NEW and in the list variants (ABI 6 too: both
# changes ship together); the other variants keep ABI 5's plain store
AUX_MAX_VARIANTS = (NEW, *LIST_VARIANTS)
ALL_VARIANTS = (OLD, DRAFT, NEW, FIRST, EVAL_FIRST, COUNT_FIRST, *LIST_VARIANTS, FORGET, AUX_STORE)

# slot states, kinds
FREE, ALLOC, LIVE, DYING = "FREE", "ALLOC", "LIVE", "DYING"
FENCE, MERGED, TIMELINE = "fence", "merged", "timeline"
# statuses (abstract numbers)
ACTIVE = 0
SUCCESS, ERROR, CANCEL, OWNER_DIED, OWNER_LEFT = 2, 3, 4, 6, 7
STATUS_NAMES = {
    SUCCESS: "SUCCESS",
    ERROR: "ERROR",
    CANCEL: "CANCEL",
    OWNER_DIED: "OWNER_DIED",
    OWNER_LEFT: "OWNER_LEFT",
}
FAILED = 1 << 62  # timeline failure flag
FUTEX_MOD = 1 << 32  # a futex compares the low 32 bits
NOT_JOINED = 255  # the recoverer recorded by a process that has not joined
# participant states
P_FREE, P_ALIVE, P_RECOVERING = "FREE", "ALIVE", "RECOVERING"
# process states
RUN, DONE, DEAD = "run", "done", "dead"
# violations that are reported but do not stop the search below them: the OLD
# protocol writes objects it does not hold by design (sweeps, recovery); a stale
# write is followed further so that its observable effect is reported too, and
# so are two concurrent recoverers (to see what their stale steps hit)
NONFATAL = frozenset({"unheld-write", "stale-write", "two-recoverers"})
# the fields the write rule is about
CHECKED_FIELDS = frozenset({"word", "aux", "par", "err", "nxt"})
TAG = 1 << 63  # NEW: the tag bit of a watcher count (HL_WATCHERS_TAG)


class Ctl(NamedTuple):
    gen: int
    kind: str
    pidx: int
    state: str

    def __repr__(self) -> str:
        return f"{self.state}(gen {self.gen}, {self.kind}, pidx {self.pidx})"


class Link(NamedTuple):
    pos: int
    gen: int
    p: int

    def __repr__(self) -> str:
        return f"link(pos {self.pos} -> slot {self.p} gen {self.gen})"


class Handle(NamedTuple):
    idx: int
    gen: int
    kind: str

    def __repr__(self) -> str:
        return f"{self.kind}@{self.idx}.g{self.gen}"


class Watchers(NamedTuple):
    """HL_WATCHERS(gen, n): a watched object's count of watch nodes (a timeline's parents[0], a
    plain fence's err).  tagged: NEW sets bit 63, which no link, merged err or timeline word has."""

    gen: int
    n: int
    tagged: bool

    def __repr__(self) -> str:
        return f"watchers(gen {self.gen}: {self.n}{', tagged' if self.tagged else ''})"


class WHead(NamedTuple):
    """LISTS: HL_WHEAD(gen, ver, index + 1): a watched object's list head (in the count's field)."""

    gen: int
    ver: int
    first: int | None  # the first node's slot, None: empty

    def __repr__(self) -> str:
        return f"head(gen {self.gen} v{self.ver}: {'-' if self.first is None else self.first})"


class WNext(NamedTuple):
    """LISTS: HL_WNEXT(gen, index + 1) | MARK: a watch node's next (its parents[1]), carrying the
    node's own generation."""

    gen: int
    nxt: int | None
    mark: bool

    def __repr__(self) -> str:
        return (
            f"next(gen {self.gen}: {'-' if self.nxt is None else self.nxt}{', marked' if self.mark else ''})"
        )


def enc(v: Any) -> int:
    """The 64-bit encoding of a parents[k] / err value (what a CAS of the real field compares):
    HL_LINK = pos[62:56] | gen[55:32] | (index + 1); HL_WATCHERS = tag[63] | gen[55:32] | n;
    a merged err (gen, status) = gen[55:32] | status; a watch node's err is its threshold."""
    if v is None:
        return 0
    if isinstance(v, Link):
        return (v.pos << 56) | (v.gen << 32) | (v.p + 1)
    if isinstance(v, Watchers):
        return (TAG if v.tagged else 0) | (v.gen << 32) | v.n
    if isinstance(v, WHead):
        ver = v.ver & 0x7FFF
        return (
            TAG
            | ((ver >> 8) << 56)
            | (v.gen << 32)
            | ((ver & 0xFF) << 24)
            | (0 if v.first is None else v.first + 1)
        )
    if isinstance(v, WNext):
        return TAG | ((1 << 62) if v.mark else 0) | (v.gen << 32) | (0 if v.nxt is None else v.nxt + 1)
    if isinstance(v, tuple):
        return (v[0] << 32) | v[1]
    return int(v)


Kids = tuple[int, tuple[tuple[int, int] | None, ...]]  # merged gen, ((child index, child gen), ...)


class Slot(NamedTuple):
    word: int = 0
    ctl: Ctl = Ctl(0, FENCE, 0, FREE)
    refs: int = 0
    waiters: int = 0
    owner: int | None = None
    aux: Any = 0
    par: tuple[Link | None, ...] = (None,)
    err: tuple[int, int] = (0, 0)
    wake: int = 0
    nxt: WNext | None = None  # LISTS: a watch node's next (parents[1] in the C code)
    # ghost fields (not in the real slot): claimed but not initialised yet; the
    # children of a merged incarnation
    fresh: bool = False
    kids: Kids | None = None


SLOT_INDEX = {f: k for k, f in enumerate(Slot._fields)}


class Part(NamedTuple):
    state: str
    inc: int = 1
    recoverer: int | None = None

    def __repr__(self) -> str:
        if self.state == P_RECOVERING:
            return f"RECOVERING(by {self.recoverer})"
        return self.state


class Frame(NamedTuple):
    fn: str
    pc: str
    locals: tuple[tuple[str, Any], ...]
    into: str | None  # caller's local that receives the return value


class Proc(NamedTuple):
    status: str
    stack: tuple[Frame, ...]


class Shared(NamedTuple):
    slots: tuple[Slot, ...]
    hint: int
    parts: tuple[Part, ...]
    locks: tuple[int | None, ...]  # liveness lock of each participant: index of the holding process
    sleep: tuple[tuple[int, str] | None, ...]  # per process: futex address (slot, field) it sleeps on
    held: frozenset[tuple[int, int, int]]  # ghost: references (participant, slot, gen) known to be held
    flags: frozenset[str]  # ghost: marks set by programs


State = tuple[Shared, tuple[Proc, ...]]


def new_frame(t: tuple[str, str, tuple[tuple[str, Any], ...], str | None]) -> Frame:
    """Frame(*t) without the Python-level NamedTuple constructor (hot path)."""
    return tuple.__new__(Frame, t)


def new_proc(t: tuple[str, tuple[Frame, ...]]) -> Proc:
    return tuple.__new__(Proc, t)


Loc = dict[str, Any]
Next = tuple[Any, ...]
Issue = tuple[str, str]  # (kind, message)

BLOCK: Next = ("block",)


def goto(pc: str) -> Next:
    return ("goto", pc)


def call(fn: str, ret_pc: str, into: str | None = None, **args: Any) -> Next:
    return ("call", fn, args, ret_pc, into)


def tail(fn: str, **args: Any) -> Next:
    """Call fn in place of the current procedure (its value is ours)."""
    return ("tail", fn, args)


def ret(value: Any = None) -> Next:
    return ("ret", value)


def freeze(loc: Loc) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(loc.items()))


def fmt(v: Any, f: str = "word") -> str:
    if f == "refs" and isinstance(v, int):
        return f"{v:#b}"
    if f != "word" or isinstance(v, bool):
        return repr(v)
    if isinstance(v, int) and v >= FAILED:
        return f"FAILED|{fmt(v - FAILED)}"
    if isinstance(v, int) and v in STATUS_NAMES:
        return f"{v}={STATUS_NAMES[v]}"
    if isinstance(v, int) and v >= 1 << 16:
        return f"2^{v.bit_length() - 1}" if v & (v - 1) == 0 else hex(v)
    return repr(v)


class ModelError(Exception):
    pass


# ---------------------------------------------------------------------------
# the context of one transition: every shared access goes through it


class Ctx:
    __slots__ = (
        "model",
        "sh",
        "pi",
        "spec",
        "me",
        "new",
        "fix",
        "cap",
        "maxpar",
        "verbose",
        "accesses",
        "desc",
        "bad",
        "notes",
        "stack",
        "_acting",
    )

    def __init__(self, model: Model, sh: Shared, pi: int, stack: tuple[Frame, ...], verbose: bool) -> None:
        self.model = model
        self.sh = sh
        self.pi = pi
        self.spec = model.procs[pi]
        self.me = self.spec.part
        self.new = model.new
        self.fix = model.fix
        self.cap = model.cap
        self.maxpar = model.maxpar
        self.verbose = verbose
        self.accesses = 0
        self.desc = ""
        self.bad: list[Issue] = []
        self.notes: list[str] = []
        self.stack = stack
        self._acting: set[int] | None = None

    @property
    def part(self) -> int:
        """Our participant index (only joined processes allocate, import, release)."""
        if self.me is None:
            raise ModelError(f"{self.spec.name} has not joined")
        return self.me

    @property
    def acting(self) -> set[int]:
        """The participants this process acts for: itself, and d while it recovers d (d's bit,
        slots ALLOC/DYING by d)."""
        if self._acting is None:
            acting = set() if self.me is None else {self.me}
            for fr in self.stack:
                if fr.fn == "recover":
                    loc = dict(fr.locals)
                    if "claimed" in loc:
                        acting.add(loc["d"])
            self._acting = acting
        return self._acting

    # -- bookkeeping
    def _one(self) -> None:
        if self.accesses:
            raise ModelError(f"{self.spec.name}: two shared accesses in one step")
        self.accesses = 1

    def _set(self, i: int, **kw: Any) -> None:
        """slots[i]._replace(**kw), without NamedTuple._replace (hot path)."""
        sh = self.sh
        slots = sh.slots
        fields = list(slots[i])
        for f, v in kw.items():
            fields[SLOT_INDEX[f]] = v
        new_slots = slots[:i] + (tuple.__new__(Slot, fields),) + slots[i + 1 :]
        self.sh = tuple.__new__(Shared, (new_slots,) + sh[1:])

    def violation(self, kind: str, msg: str) -> None:
        self.bad.append((kind, msg))

    def _check_write(self, i: int, f: str, gen: int, checked: bool) -> None:
        """The write rule.  gen: the incarnation the writer aims at; checked: the
        atomic step itself compared that generation (CAS2, CAS of aux/err)."""
        s = self.sh.slots[i]
        c = s.ctl
        who = self.spec.name
        if c.gen != gen or c.state == FREE:
            if c.state == FREE or (c.state == ALLOC and s.fresh):
                what = "FREE" if c.state == FREE else "claimed, not yet initialised"
                self.notes.append(
                    f"{who} writes {f} of a {what} slot (the next initialisation overwrites it)"
                )
                return
            self.violation(
                "stale-write",
                f"{who} wrote {f} of slot {i} aiming at gen {gen}, but the slot is now {c!r}: "
                "another incarnation, held by someone else",
            )
            return
        if checked:
            return
        if c.state in (ALLOC, DYING) and c.pidx in self.acting:
            return  # rule (b): ALLOC or DYING by itself
        held = self.sh.held
        for a in self.acting:
            if (a, i, c.gen) in held:
                return  # rule (a): holds a reference
        self.violation(
            "unheld-write",
            f"{who} wrote {f} of slot {i} ({c!r}) without holding it and without a generation-checked step",
        )

    # -- slot accesses (each is ONE atomic step)
    def load(self, i: int, f: str) -> Any:
        self._one()
        v = getattr(self.sh.slots[i], f)
        if self.verbose:
            self.desc = f"load {f}[{i}] -> {fmt(v, f)}"
        return v

    def store(self, i: int, f: str, v: Any, gen: int) -> None:
        self._one()
        if f in CHECKED_FIELDS:
            self._check_write(i, f, gen, False)
        if self.verbose:
            self.desc = f"store {f}[{i}] = {fmt(v, f)}"
        self._set(i, **{f: v})

    def cas(
        self, i: int, f: str, expect: Any, new: Any, gen: int | None = None, checked: bool = False
    ) -> tuple[bool, Any]:
        """Returns (ok, value found).  gen: aimed incarnation (for the write rule)."""
        self._one()
        cur = getattr(self.sh.slots[i], f)
        ok = cur == expect
        if self.verbose:
            self.desc = f"CAS {f}[{i}] {fmt(expect, f)} -> {fmt(new, f)}: " + (
                "ok" if ok else f"fails (found {fmt(cur, f)})"
            )
        if ok:
            if f in CHECKED_FIELDS:
                assert gen is not None
                self._check_write(i, f, gen, checked)
            self._set(i, **{f: new})
        return ok, cur

    def cas2(self, i: int, word: int, ctl: Ctl, new_word: int) -> bool:
        """NEW: 16-byte CAS over {word, ctl}: writes word only if ctl is still ctl."""
        self._one()
        s = self.sh.slots[i]
        ok: bool = s.word == word and s.ctl == ctl
        if self.verbose:
            self.desc = f"CAS2 (word, ctl)[{i}] ({fmt(word)}, {ctl!r}) -> word {fmt(new_word)}: " + (
                "ok" if ok else f"fails (found {fmt(s.word)}, {s.ctl!r})"
            )
        if ok:
            self._check_write(i, "word", ctl.gen, True)
            self._set(i, word=new_word)
        return ok

    def cas_enc(self, i: int, f: str, expect: Any, new: Any, gen: int) -> tuple[bool, Any]:
        """CAS of parents[0] or err comparing the 64-bit encodings (enc): a value of another
        format that encodes the same is the same to the CPU.  Generation-checked: the field
        carries the generation (a watcher count)."""
        self._one()
        s = self.sh.slots[i]
        cur = s.par[0] if f == "par" else s.err
        ok = enc(cur) == enc(expect)
        if self.verbose:
            self.desc = f"CAS {'parents[0]' if f == 'par' else f}[{i}] {expect!r} -> {new!r}: " + (
                "ok" if ok else f"fails (found {cur!r})"
            )
        if ok:
            self._check_write(i, f, gen, True)
            if f == "par":
                self._set(i, par=(new,) + s.par[1:])
            else:
                self._set(i, err=new)
        return ok, cur

    def load_par(self, i: int, k: int) -> Link | None:
        self._one()
        v = self.sh.slots[i].par[k]
        if self.verbose:
            self.desc = f"load parents[{k}][{i}] -> {v!r}"
        sl = self.sh.slots[i]
        if (
            isinstance(v, (Watchers, WHead))
            and sl.ctl.kind != TIMELINE
            and sl.ctl.state != FREE
            and not sl.fresh
        ):
            # a count written over a link (FIRST, watch-target-reuse): garbage to every reader
            self.violation("corrupt-link", f"parents[{k}] of slot {i} ({self.sh.slots[i].ctl!r}) holds {v!r}")
            return None
        return v

    def cas_par(self, i: int, k: int, expect: Link | None, new: Link | None, gen: int) -> bool:
        self._one()
        par = self.sh.slots[i].par
        ok = par[k] == expect
        if self.verbose:
            self.desc = f"CAS parents[{k}][{i}] {expect!r} -> {new!r}: " + (
                "ok" if ok else f"fails ({par[k]!r})"
            )
        if ok:
            self._check_write(i, "par", gen, False)
            self._set(i, par=par[:k] + (new,) + par[k + 1 :])
        return ok

    def store_par(self, i: int, k: int, v: Link | None, gen: int) -> None:
        self._one()
        par = self.sh.slots[i].par
        self._check_write(i, "par", gen, False)
        if self.verbose:
            self.desc = f"store parents[{k}][{i}] = {v!r}"
        self._set(i, par=par[:k] + (v,) + par[k + 1 :])

    def fetch_or(self, i: int, bits: int) -> int:
        self._one()
        old: int = self.sh.slots[i].refs
        if self.verbose:
            self.desc = f"fetch_or refs[{i}] |= {bits:#b} (was {old:#b})"
        self._set(i, refs=old | bits)
        return old

    def fetch_add(self, i: int, f: str, delta: int) -> int:
        self._one()
        old: int = getattr(self.sh.slots[i], f)
        if self.verbose:
            self.desc = f"fetch_add {f}[{i}] += {delta} (was {old})"
        self._set(i, **{f: (old + delta) % FUTEX_MOD})
        return old

    def init_slot(self, i: int, gen: int, **fields: Any) -> None:
        """alloc_begin's initialisation of a claimed (ALLOC) slot: one step."""
        self._one()
        self._check_write(i, "word", gen, False)
        if self.verbose:
            shown = ", ".join(f"{k}={fmt(v, k)}" for k, v in fields.items() if k not in ("fresh", "kids"))
            self.desc = f"init slot {i}: {shown}"
        self._set(i, **fields)

    def futex_wait(self, i: int, f: str, expected: int) -> bool:
        self._one()
        v: int = getattr(self.sh.slots[i], f) % FUTEX_MOD
        slept = v == expected
        if self.verbose:
            self.desc = f"FUTEX_WAIT(&{f}[{i}], {fmt(expected)}): " + (
                "asleep" if slept else f"value is {fmt(v)}, returns"
            )
        if slept:
            sl = self.sh.sleep
            self.sh = self.sh._replace(sleep=sl[: self.pi] + ((i, f),) + sl[self.pi + 1 :])
        return slept

    def futex_wake(self, i: int, f: str) -> None:
        self._one()
        woken = [self.model.procs[k].name for k, a in enumerate(self.sh.sleep) if a == (i, f)]
        if self.verbose:
            self.desc = f"FUTEX_WAKE(&{f}[{i}]) wakes {woken or 'nobody'}"
        self.sh = self.sh._replace(sleep=tuple(None if a == (i, f) else a for a in self.sh.sleep))

    # -- globals
    def load_hint(self) -> int:
        self._one()
        if self.verbose:
            self.desc = f"load alloc_hint -> {self.sh.hint}"
        return self.sh.hint

    def store_hint(self, v: int) -> None:
        self._one()
        if self.verbose:
            self.desc = f"store alloc_hint = {v}"
        self.sh = self.sh._replace(hint=v)

    def load_pctl(self, d: int) -> Part:
        self._one()
        v = self.sh.parts[d]
        if self.verbose:
            self.desc = f"load pctl[{d}] -> {v!r}"
        return v

    def cas_pctl(self, d: int, expect: Part, new: Part) -> bool:
        self._one()
        cur = self.sh.parts[d]
        ok = cur == expect
        if self.verbose:
            self.desc = f"CAS pctl[{d}] {expect!r} -> {new!r}: " + ("ok" if ok else f"fails ({cur!r})")
        if ok:
            p = self.sh.parts
            self.sh = self.sh._replace(parts=p[:d] + (new,) + p[d + 1 :])
        return ok

    def lock_free(self, d: int) -> bool:
        """F_OFD_GETLK on d's byte: is nobody holding it?"""
        self._one()
        free = self.sh.locks[d] is None
        if self.verbose:
            self.desc = f"test lock[{d}] -> " + ("free" if free else "held")
        return free

    def try_lock(self, d: int) -> bool:
        """F_OFD_SETLK on d's byte."""
        self._one()
        free = self.sh.locks[d] is None
        if self.verbose:
            self.desc = f"take lock[{d}] -> " + ("taken" if free else "held by someone alive")
        if free:
            lk = self.sh.locks
            self.sh = self.sh._replace(locks=lk[:d] + (self.pi,) + lk[d + 1 :])
        return free

    def unlock(self, d: int) -> None:
        self._one()
        if self.verbose:
            self.desc = f"release lock[{d}]"
        lk = self.sh.locks
        assert lk[d] == self.pi
        self.sh = self.sh._replace(locks=lk[:d] + (None,) + lk[d + 1 :])

    def await_(self, cond: bool, desc: str) -> bool:
        """A blocking wait for a condition: not enabled (no step) while false."""
        if not cond:
            return False
        self._one()
        if self.verbose:
            self.desc = desc
        return True

    # -- ghost state (no access)
    def hold(self, part: int, i: int, gen: int) -> None:
        self.sh = self.sh._replace(held=self.sh.held | {(part, i, gen)})

    def unhold(self, part: int, i: int, gen: int | None) -> None:
        if gen is not None and (part, i, gen) in self.sh.held:
            self.sh = self.sh._replace(held=self.sh.held - {(part, i, gen)})

    def set_flag(self, flag: str) -> None:
        self.sh = self.sh._replace(flags=self.sh.flags | {flag})


StepFn = Callable[[Ctx, str, Loc], Next]
STEPS: dict[str, StepFn] = {}


def procedure(name: str) -> Callable[[StepFn], StepFn]:
    def reg(fn: StepFn) -> StepFn:
        STEPS[name] = fn
        return fn

    return reg


def merged_aux(a: Any) -> tuple[int, int] | None:
    """aux as (gen, mask) when it is a merged pending word, else None."""
    return a if type(a) is tuple else None  # a Handle (a watch node's target) is not


# ---------------------------------------------------------------------------
# the procedures.  Each `if pc == ...` block performs at most one shared access.


@procedure("main")
def p_main(x: Ctx, pc: str, L: Loc) -> Next:
    """The program of a process: one API operation after the other."""
    prog = x.spec.program
    k = L["op"]
    if k == len(prog):
        return ret()
    op = prog[k]
    L["op"] = k + 1
    what = op[0]
    for key in [key for key in L if key.startswith("mw:")]:  # a merge over points: (m, nodes)
        m, ws = L.pop(key)
        L["h:" + key[3:]] = m
        for j, w in enumerate(ws):
            L[f"h:{key[3:]}.w{j}"] = w
    if what == "merge" and x.model.watch:  # ("merge", var, (child vars, or "var@value" points))
        kids = tuple((L["h:" + v.split("@")[0]], int(v.split("@")[1]) if "@" in v else 1) for v in op[2])
        return call("merge_points", "next", "mw:" + op[1], kids=kids)
    if what == "poll":  # ("poll", var): the real waits' bounded sleep: sees the word once it is set
        h = L["h:" + op[1]]
        if not x.await_(x.sh.slots[h.idx].word != 0, f"sees word[{h.idx}] set (bounded sleep)"):
            return BLOCK
        return goto("next")
    if what == "leave":  # ("leave",): hle_leave, a clean close: recover ourselves
        s = OWNER_DIED if x.model.variant == FORGET else OWNER_LEFT
        return call("recover", "next", d=x.part, s=s, leaving=True)
    if what == "check_point":  # ("check_point", var, v, (failures)): after a wait that returned
        return call("point_status", "next", h=L["h:" + op[1]], v=op[2], fails=op[3])
    if what == "tl_fail":  # ("tl_fail", var, status)
        return call("tl_fail", "next", h=L["h:" + op[1]], s=op[2])
    if what == "check_status":  # ("check_status", var, (acceptable statuses)): after a wait
        h = L["h:" + op[1]]
        w = x.load(h.idx, "word")
        if w not in op[2]:
            x.violation(
                "wrong-status",
                f"{x.spec.name}: {h!r} completed {fmt(w)}, expected " + " or ".join(fmt(v) for v in op[2]),
            )
        return goto("next")
    if what == "alloc":  # ("alloc", var, kind)
        return call("alloc", "next", "h:" + op[1], kind=op[2], owner=x.part, mask=0, kids=None)
    if what == "merge":  # ("merge", var, (child vars))
        return call("merge", "next", "h:" + op[1], kids=tuple(L["h:" + v] for v in op[2]))
    if what == "signal":  # ("signal", var, status)
        return call("signal", "next", h=L["h:" + op[1]], s=op[2])
    if what == "tl_signal":  # ("tl_signal", var, value)
        return call("tl_signal", "next", h=L["h:" + op[1]], v=op[2])
    if what == "wait":  # ("wait", var, threshold)
        if not L.get("ok:" + op[1], True):
            return goto("next")  # the import failed: nothing to wait for
        h = L["h:" + op[1]]
        return call("tl_wait" if x.new and h.kind == TIMELINE else "wait", "next", h=h, thr=op[2])
    if what == "import":  # ("import", var)
        return call("import", "next", "ok:" + op[1], h=L["h:" + op[1]])
    if what == "release":  # ("release", var)
        if "h:" + op[1] not in L:
            return goto("next")  # a watch node that the merge did not need (the link was free)
        h = L.pop("h:" + op[1])
        if not L.pop("ok:" + op[1], True):
            return goto("next")  # the import failed: nothing to release
        return call("drop_ref", "next", i=h.idx, part=x.part, actor=x.part, gen=h.gen)
    if what == "check_active":  # ("check_active", var): only we may signal it: it must be ACTIVE
        h = L["h:" + op[1]]
        w = x.load(h.idx, "word")
        if w != 0:
            x.violation(
                "fresh-not-active", f"{x.spec.name}'s new {h!r} is {fmt(w)}, but nobody but it may signal it"
            )
        return goto("next")
    if what == "sweep":
        return call("sweep", "next")
    if what == "mark":  # ghost: tell the other programs how far we are
        x.set_flag(op[1])
        return goto("next")
    if what == "await":  # ("await", flag)
        if not x.await_(op[1] in x.sh.flags, f"starts ({op[1]})"):
            return BLOCK
        return goto("next")
    if what == "await_dead":  # ("await_dead", d): poll d's liveness lock until it is free
        if not x.await_(x.sh.locks[op[1]] is None, f"sees participant {op[1]}'s lock free (it died)"):
            return BLOCK
        return goto("next")
    if what == "recover":  # ("recover", d): one pass of reap_all for participant d
        return call("recover", "next", d=op[1])
    raise ModelError(f"unknown operation {op!r}")


@procedure("alloc")
def p_alloc(x: Ctx, pc: str, L: Loc) -> Next:
    """alloc_begin + alloc_publish: claim a FREE slot from alloc_hint, initialise, publish LIVE."""
    cap = x.cap
    if pc == "start":
        L["start"], L["n"] = x.load_hint() % cap, 0
        return goto("scan")
    if pc == "scan":
        n = L["n"]
        if n == cap:
            return goto("full")
        idx = (L["start"] + n) % cap
        c = x.load(idx, "ctl")
        if c.state != FREE:
            L["n"] = n + 1
            return goto("scan")
        L["idx"], L["c"] = idx, c
        return goto("claim")
    if pc == "claim":
        idx, c = L["idx"], L.pop("c")
        gen = c.gen + 1
        ok, _ = x.cas(idx, "ctl", c, Ctl(gen, L["kind"], x.part, ALLOC))
        if not ok:
            L["n"] += 1
            return goto("scan")
        x.hold(x.part, idx, gen)
        x._set(idx, fresh=True)  # ghost
        del L["start"], L["n"]
        L["gen"] = gen
        return goto("init")
    if pc == "full":  # table full: the C code fails (E_Full); the programs retry until a slot is FREE
        if not x.await_(
            any(s.ctl.state == FREE for s in x.sh.slots), "table full; a slot is FREE now: rescan"
        ):
            return BLOCK
        del L["start"], L["n"]
        return goto("start")
    idx, gen, kind = L["idx"], L["gen"], L["kind"]
    if pc == "init":
        x.init_slot(
            idx,
            gen,
            word=0,
            waiters=0,
            owner=L["owner"] if kind != MERGED else None,
            aux=(gen, L["mask"]) if kind == MERGED else L.get("target", 0),  # OLD: mask 0 (set after
            # publish); NEW: the mask; a watch node: the handle of its target
            err=L.get("thr", (gen, 0)),  # a watch node: its threshold
            par=((L["link"],) if "link" in L else (None,)) + (None,) * (x.maxpar - 1),
            nxt=WNext(gen, None, False) if "target" in L and x.model.variant in LIST_VARIANTS else None,
            refs=1 << x.part,
            fresh=False,
            kids=(gen, L["kids"]) if kind == MERGED else None,
        )
        return goto("publish")
    if pc == "publish":
        x.store(idx, "ctl", Ctl(gen, kind, 0, LIVE), gen)
        return goto("hint")
    if pc == "hint":
        x.store_hint((idx + 1) % cap)
        return ret(Handle(idx, gen, kind))
    raise ModelError(pc)


@procedure("merge")
def p_merge(x: Ctx, pc: str, L: Loc) -> Next:
    """Core_merge: allocate the merged slot, then link every child (all held by the caller)."""
    kids: tuple[Handle, ...] = L["kids"]
    n = len(kids)
    if pc == "start":
        mask = (1 << n) - 1
        return call(
            "alloc",
            "linkall",
            "m",
            kind=MERGED,
            owner=None,
            mask=mask if x.new else 0,  # NEW: pending mask written at init, before publish
            kids=tuple((h.idx, h.gen) for h in kids),
        )
    m: Handle = L["m"]
    if pc == "linkall":
        L["j"], L["k"] = 0, 0
        if x.new:
            return goto("link")
        x.store(m.idx, "aux", (m.gen, (1 << n) - 1), m.gen)  # OLD: the mask only after publish
        return goto("link")
    j = L["j"]
    if pc == "link":
        if j == n:
            return ret(m)
        k = L["k"]
        if k == x.maxpar:  # lost the race for the last link: the child counts as failed
            L["j"], L["k"] = j + 1, 0
            return call("propagate_link", "link", link=Link(j, m.gen, m.idx), status=ERROR)
        old = x.load_par(kids[j].idx, k)
        L["old"] = old
        return goto("cas_link" if old is None else "link_live")
    if pc == "link_live":  # link_live(old): does it name a merged fence that still exists?
        old = L["old"]
        c = x.load(old.p, "ctl")
        if c.state != FREE and c.kind == MERGED and c.gen == old.gen:
            del L["old"]
            L["k"] += 1
            return goto("link")
        return goto("cas_link")
    if pc == "cas_link":
        k = L["k"]
        ok = x.cas_par(kids[j].idx, k, L.pop("old"), Link(j, m.gen, m.idx), kids[j].gen)
        if not ok:
            L["k"] = k + 1
            return goto("link")
        return goto("child_word")
    if pc == "child_word":
        w = x.load(kids[j].idx, "word")
        L["j"], L["k"] = j + 1, 0
        if w:
            return call("propagate_link", "link", link=Link(j, m.gen, m.idx), status=w)
        return goto("link")
    raise ModelError(pc)


@procedure("signal")
def p_signal(x: Ctx, pc: str, L: Loc) -> Next:
    """do_signal by a holder: CAS word 0 -> s, wake, propagate."""
    h: Handle = L["h"]
    if pc == "start" and x.model.variant == COUNT_FIRST and x.model.watch and "count" not in L:
        L["count"] = load_count(x, h)  # broken on purpose: the count before the word
        return goto("start")
    if pc == "start":
        ok, _ = x.cas(h.idx, "word", 0, L["s"], h.gen)
        if not ok:
            return ret("already signaled")
        return call("wake_fence", "prop", i=h.idx)
    if pc == "prop":
        if x.model.watch:
            return call("propagate", "notify", i=h.idx)
        return tail("propagate", i=h.idx)
    if pc == "notify":
        extra = {"count": L["count"]} if "count" in L else {}
        return tail("watch_notify", h=h, **extra)
    raise ModelError(pc)


@procedure("wake_fence")
def p_wake_fence(x: Ctx, pc: str, L: Loc) -> Next:
    """hl_wake_all / hl_wake_fence: FUTEX_WAKE on the word if waiters != 0."""
    i = L["i"]
    if pc == "start":
        if x.load(i, "waiters") == 0:
            return ret()
        return goto("futex")
    if pc == "futex":
        x.futex_wake(i, "word")
        return ret()
    raise ModelError(pc)


@procedure("wake_tl")
def p_wake_tl(x: Ctx, pc: str, L: Loc) -> Next:
    """NEW hl_wake_timeline: bump the wake sequence, then FUTEX_WAKE on it if waiters != 0."""
    i = L["i"]
    if pc == "start":
        x.fetch_add(i, "wake", 1)
        return goto("waiters")
    if pc == "waiters":
        if x.load(i, "waiters") == 0:
            return ret()
        return goto("futex")
    if pc == "futex":
        x.futex_wake(i, "wake")
        return ret()
    raise ModelError(pc)


@procedure("propagate")
def p_propagate(x: Ctx, pc: str, L: Loc) -> Next:
    """Tell the merged parents of slot i that it completed (any participant may call it)."""
    i = L["i"]
    if not x.new:
        # OLD: w = word; then every link, read after w, with no check that it is the same object
        if pc == "start":
            w = x.load(i, "word")
            if w == 0:
                return ret()
            L["w"], L["k"] = w, 0
            return goto("links")
        if pc == "links":
            k = L["k"]
            if k == x.maxpar:
                return ret()
            lk = x.load_par(i, k)
            L["k"] = k + 1
            if lk is None:
                return goto("links")
            return call("propagate_link", "links", link=lk, status=L["w"])
        raise ModelError(pc)
    # NEW: seqlock: c1 = ctl, word, links, c2 = ctl; the links are used only if c2 == c1
    if pc == "start":
        c1 = x.load(i, "ctl")
        if c1.state not in (LIVE, DYING) or c1.kind == TIMELINE:
            return ret()
        L["c1"] = c1
        return goto("word")
    if pc == "word":
        w = x.load(i, "word")
        if w == 0:
            return ret()
        L["w"], L["links"] = w, ()
        return goto("links")
    if pc == "links":
        links = L["links"]
        if len(links) < x.maxpar:
            L["links"] = links + (x.load_par(i, len(links)),)
            return goto("links")
        return goto("c2")
    if pc == "c2":
        if x.load(i, "ctl") != L.pop("c1"):
            return ret()  # the slot changed: the links may belong to another object
        L["links"] = tuple(lk for lk in L["links"] if lk is not None)
        return goto("send")
    if pc == "send":
        links = L["links"]
        if not links:
            return ret()
        L["links"] = links[1:]
        return call("propagate_link", "send", link=links[0], status=L["w"])
    raise ModelError(pc)


@procedure("propagate_link")
def p_propagate_link(x: Ctx, pc: str, L: Loc) -> Next:
    """Clear the child's bit in the parent's pending mask; resolve the parent at zero."""
    lk: Link = L["link"]
    p, gen, bit = lk.p, lk.gen, 1 << lk.pos
    if pc == "start":
        c = x.load(p, "ctl")
        if c.kind != MERGED or c.gen != gen:  # OLD: the state is not checked
            return ret()
        if x.new:
            if c.state != LIVE:
                return ret()
            L["c"] = c
        return goto("aux" if L["status"] == SUCCESS else "err")
    if pc == "err":  # record_failure: err carries the generation
        x.cas(p, "err", (gen, 0), (gen, L["status"]), gen, checked=True)
        return goto("aux")
    if pc == "aux":
        L["a"] = x.load(p, "aux")
        return goto("aux_loop")
    if pc == "aux_loop":
        a = merged_aux(L["a"])
        if a is None or a[0] != gen:
            return ret()
        if not a[1] & bit:
            return goto("cleared")
        return goto("aux_cas")
    if pc == "aux_cas":  # aux carries the generation too
        a = L["a"]
        ok, cur = x.cas(p, "aux", a, (gen, a[1] & ~bit), gen, checked=True)
        L["a"] = (gen, a[1] & ~bit) if ok else cur
        return goto("cleared" if ok else "aux_loop")
    if pc == "cleared":
        if L.pop("a")[1] != 0:
            return ret()
        if x.new:
            return tail("resolve_merged", i=p, c=L["c"], aux_known=True)
        return goto("fin")
    # OLD resolution: read err, re-read ctl, then CAS the word in a SEPARATE step
    if pc == "fin":
        e = x.load(p, "err")
        L["fin"] = e[1] if e[0] == gen and e[1] else SUCCESS
        return goto("reread")
    if pc == "reread":
        if x.load(p, "ctl").gen != gen:
            return ret()
        return goto("word_cas")
    if pc == "word_cas":
        ok, _ = x.cas(p, "word", 0, L["fin"], gen)
        if not ok:
            return ret()
        return call("wake_fence", "prop", i=p)
    if pc == "prop":
        return tail("propagate", i=p)
    raise ModelError(pc)


@procedure("resolve_merged")
def p_resolve_merged(x: Ctx, pc: str, L: Loc) -> Next:
    """NEW resolve_merged(i, ctl read LIVE): complete with the first failure or SUCCESS by CAS2."""
    i, c = L["i"], L["c"]
    if pc == "start":
        if c.state != LIVE or c.kind != MERGED:
            return ret(False)
        if L["aux_known"]:  # propagate_link just cleared the last bit
            return goto("err")
        a = merged_aux(x.load(i, "aux"))
        if a is None or a[0] != c.gen or a[1] != 0:
            return ret(False)
        return goto("err")
    if pc == "err":
        e = x.load(i, "err")
        L["fin"] = e[1] if e[0] == c.gen and e[1] else SUCCESS
        return goto("cas2")
    if pc == "cas2":
        if not x.cas2(i, 0, c, L["fin"]):
            return ret(False)
        return call("wake_fence", "prop", i=i)
    if pc == "prop":
        return tail("propagate", i=i)
    raise ModelError(pc)


@procedure("sweep")
def p_sweep(x: Ctx, pc: str, L: Loc) -> Next:
    """sweep(): propagate signaled children, resolve merged fences with an empty mask."""
    if pc == "start":
        L["i"] = 0
        return goto("slot")
    i = L["i"]
    if pc == "slot":
        if i == x.cap:
            return ret()
        c = x.load(i, "ctl")
        if c.state != LIVE or c.kind == TIMELINE:
            L["i"] = i + 1
            return goto("slot")
        L["c"], L["k"] = c, 0
        return goto("links")
    if pc == "links":  # (parents[0] || parents[1]) && word
        k = L["k"]
        if k == x.maxpar:
            return goto("merged")
        if x.load_par(i, k) is None:
            L["k"] = k + 1
            return goto("links")
        return goto("lword")
    if pc == "lword":
        if x.load(i, "word") == 0:
            return goto("merged")
        return call("propagate", "merged", i=i)
    if pc == "merged":
        if L["c"].kind != MERGED:
            return goto("next")
        return goto("mword")
    if pc == "mword":
        if x.load(i, "word") != 0:
            return goto("next")
        if x.new:
            return call("resolve_merged", "next", i=i, c=L["c"], aux_known=False)
        return goto("maux")
    # OLD resolution: checks on aux and err, then a CAS of the word alone
    if pc == "maux":
        a = merged_aux(x.load(i, "aux"))
        if a is None or a[1] != 0 or a[0] != L["c"].gen:
            return goto("next")
        return goto("merr")
    if pc == "merr":
        e = x.load(i, "err")
        L["fin"] = e[1] if e[0] == L["c"].gen and e[1] else SUCCESS
        return goto("mcas")
    if pc == "mcas":
        ok, _ = x.cas(i, "word", 0, L.pop("fin"), L["c"].gen)
        if ok:
            return call("wake_fence", "mprop", i=i)
        return goto("next")
    if pc == "mprop":
        return call("propagate", "next", i=i)
    if pc == "next":
        L.pop("c", None)
        L.pop("k", None)
        L["i"] = i + 1
        return goto("slot")
    raise ModelError(pc)


@procedure("drop_ref")
def p_drop_ref(x: Ctx, pc: str, L: Loc) -> Next:
    """drop_ref(i, bit of `part`, actor); gen: the reference being dropped (None: an undo)."""
    i, part = L["i"], L["part"]
    b = 1 << part
    if pc == "start" and x.fix:
        # NEW+fix: refs is read between two reads of ctl (a seqlock), and used only if ctl did
        # not move.  The C code reads refs, then ctl: a refs value read before an allocation's
        # init (which overwrites refs) can then meet the new object's LIVE ctl, and the undo of
        # a failed pin or import moves somebody else's object to DYING; its last holder, seeing
        # DYING, takes its own bit for a stale one and clears it: the object is leaked.  Reading
        # ctl only before refs is not enough either: the "stale bit" branch then acts on an ALLOC
        # or DYING state that has become LIVE since.
        L["c"] = x.load(i, "ctl")
        return goto("refs_after_ctl")
    if pc == "refs_after_ctl":
        m = x.load(i, "refs")
        if not m & b:
            del L["c"]
            return ret()
        L["m"] = m
        return goto("ctl_again")
    if pc == "ctl_again":
        if x.load(i, "ctl") != L["c"]:
            del L["c"], L["m"]
            return goto("start")
        m = L["m"]
        if m & ~b:
            del L["c"]
            return goto("clear")
        if L["c"].state != LIVE:
            del L["c"]
            return goto("stale")
        return goto("dying")
    if pc == "start":
        m = x.load(i, "refs")
        if not m & b:
            return ret()
        L["m"] = m
        return goto("clear" if m & ~b else "ctl")
    if pc == "clear":  # other holders remain: just clear our bit
        m = L.pop("m")
        ok, _ = x.cas(i, "refs", m, m & ~b)
        if not ok:
            return goto("start")
        x.unhold(part, i, L["gen"])
        return ret()
    if pc == "ctl":
        c = x.load(i, "ctl")
        if c.state != LIVE:
            return goto("stale")
        L["c"] = c
        return goto("dying")
    if pc == "stale":  # a stale bit on a slot being freed or initialised
        ok, _ = x.cas(i, "refs", L.pop("m"), 0)
        if not ok:
            return goto("start")
        x.unhold(part, i, L["gen"])
        return ret()
    c = cast(Ctl, L.get("c"))
    if pc == "dying":
        ok, _ = x.cas(i, "ctl", c, Ctl(c.gen, c.kind, L["actor"], DYING))
        if not ok:
            del L["c"], L["m"]
            return goto("start")
        return goto("refs0")
    if pc == "refs0":
        dy = Ctl(c.gen, c.kind, L["actor"], DYING)
        ok, _ = x.cas(i, "refs", b, 0)
        if ok:
            x.unhold(part, i, L["gen"])
            return tail("finalize", i=i, dy=dy)
        return goto("back")
    if pc == "back":  # someone took a reference meanwhile: back to LIVE and retry
        del L["c"], L["m"]
        ok, _ = x.cas(i, "ctl", Ctl(c.gen, c.kind, L["actor"], DYING), c)
        if ok and x.new and c.kind == MERGED:  # NEW: a resolve that failed while DYING is done now
            return call("resolve_merged", "start", i=i, c=c, aux_known=False)
        return goto("start")
    raise ModelError(pc)


@procedure("finalize")
def p_finalize(x: Ctx, pc: str, L: Loc) -> Next:
    """Free a DYING slot: CANCEL an ACTIVE fence, propagate, (NEW: clear links and aux), FREE."""
    i, dy = L["i"], L["dy"]
    if pc == "start":
        if dy.kind == TIMELINE:
            return goto("free")
        ok, _ = x.cas(i, "word", 0, CANCEL, dy.gen)
        if ok:
            return call("wake_fence", "prop", i=i)
        return goto("prop")
    if pc == "prop":
        if x.model.watch and dy.kind == FENCE:
            return call("propagate", "w_aux", i=i)
        return call("propagate", "clear" if x.new else "free", i=i)
    if pc == "w_aux":  # a watch node leaves its target's count; a watched fence scans
        a = x.load(i, "aux")
        if isinstance(a, Handle):
            if x.model.variant in LIST_VARIANTS:  # marks its next, then leaves the target's list
                return call("watch_unlink", "clear", i=i, gen=dy.gen, t=a)
            L["a"] = a
            return goto("w_counted" if x.model.variant != FIRST else "w_dec")
        if x.model.variant in LIST_VARIANTS:  # a watched fence: its nodes (CANCEL now), through its list
            return call("watch_notify", "clear", h=Handle(i, dy.gen, FENCE))
        return goto("w_count")
    if pc == "w_counted":  # NEW: only a count the node's creator gave is taken back
        if not x.load(i, "err") & COUNTED:
            del L["a"]
            return goto("clear")
        return goto("w_dec")
    if pc == "w_dec":
        return call("watchers_add", "clear", h=L.pop("a"), delta=-1)
    if pc == "w_count":
        if enc(x.load(i, "err")) & 0xFFFFFFFF:
            return call("watch_scan", "clear", t=i)
        return goto("clear")
    if pc == "clear":  # NEW: nothing of this object is left for a stale reader
        k = L.get("k", 0)
        if k < x.maxpar:
            x.store_par(i, k, None, dy.gen)
            L["k"] = k + 1
            return goto("clear")
        x.store(i, "aux", 0, dy.gen)
        return goto(
            "clear_nxt" if x.model.variant in LIST_VARIANTS and x.sh.slots[i].nxt is not None else "free"
        )
    if pc == "clear_nxt":  # LISTS: a node's next is its parents[1] (cleared with the links)
        x.store(i, "nxt", None, dy.gen)
        return goto("free")
    if pc == "free":
        ok, _ = x.cas(i, "ctl", dy, Ctl(dy.gen, dy.kind, 0, FREE))
        if ok and not x.new:
            return goto("hint")
        return ret()
    if pc == "hint":  # OLD: the next allocation lands exactly here
        x.store_hint(i)
        return ret()
    raise ModelError(pc)


@procedure("import")
def p_import(x: Ctx, pc: str, L: Loc) -> Next:
    """do_import: take a reference to someone else's object.  Returns True, or False if stale."""
    h: Handle = L["h"]
    i, b = h.idx, 1 << x.part
    if pc == "start":
        c = x.load(i, "ctl")
        if c.gen != h.gen or c.kind != h.kind or c.state not in (LIVE, DYING):
            return ret(False)
        L["c"] = c
        return goto("or" if c.state == LIVE else "dying")
    if pc == "dying":  # its last holder is releasing it: wait for LIVE (revert) or FREE
        if not x.await_(x.sh.slots[i].ctl != L["c"], "ctl changed: retry"):
            return BLOCK
        del L["c"]
        return goto("start")
    if pc == "or":
        L["old"] = x.fetch_or(i, b)
        return goto("recheck")
    if pc == "recheck":
        c2 = x.load(i, "ctl")
        c, old = L.pop("c"), L.pop("old")
        if c2 == c:
            x.hold(x.part, i, h.gen)
            return ret(True)
        L["c2"] = c2
        if not old & b:
            return call("drop_ref", "after", i=i, part=x.part, actor=x.part, gen=None)
        return goto("after")
    if pc == "after":
        if L.pop("c2").gen != h.gen:
            return ret(False)
        return goto("start")
    raise ModelError(pc)


@procedure("wait")
def p_wait(x: Ctx, pc: str, L: Loc) -> Next:
    """do_wait's sleep phase, futex on the word's low 32 bits, no timeout (see the module doc)."""
    h, thr = L["h"], L["thr"]
    i = h.idx
    if pc == "start":
        if x.load(i, "word") >= thr:
            return ret()
        return goto("inc")
    if pc == "inc":
        x.fetch_add(i, "waiters", 1)
        return goto("reload")
    if pc == "reload":
        w = x.load(i, "word")
        if w >= thr:
            L["done"] = True
            return goto("dec")
        L["exp"] = w % FUTEX_MOD
        return goto("sleep")
    if pc == "sleep":
        x.futex_wait(i, "word", L.pop("exp"))
        return goto("dec")
    if pc == "dec":
        x.fetch_add(i, "waiters", -1)
        if L.pop("done", False):
            return ret()
        return goto("start")
    raise ModelError(pc)


@procedure("tl_wait")
def p_tl_wait(x: Ctx, pc: str, L: Loc) -> Next:
    """NEW timeline wait: sleep on the wake sequence, read BEFORE the word."""
    h, thr = L["h"], L["thr"]
    i = h.idx
    if pc == "start":
        if x.load(i, "word") >= thr:
            return ret()
        return goto("inc")
    if pc == "inc":
        x.fetch_add(i, "waiters", 1)
        return goto("seq")
    if pc == "seq":
        L["s"] = x.load(i, "wake")
        return goto("reload")
    if pc == "reload":
        if x.load(i, "word") >= thr:
            del L["s"]
            L["done"] = True
            return goto("dec")
        return goto("sleep")
    if pc == "sleep":
        x.futex_wait(i, "wake", L.pop("s"))
        return goto("dec")
    if pc == "dec":
        x.fetch_add(i, "waiters", -1)
        if L.pop("done", False):
            return ret()
        return goto("start")
    raise ModelError(pc)


@procedure("tl_signal")
def p_tl_signal(x: Ctx, pc: str, L: Loc) -> Next:
    """do_tl_signal: CAS word cur -> v (v > cur), then wake."""
    h: Handle = L["h"]
    i = h.idx
    if pc == "start" and x.model.variant == COUNT_FIRST and x.model.watch and "count" not in L:
        L["count"] = load_count(x, h)  # broken on purpose: the count before the word
        return goto("start")
    if pc == "start":
        cur = x.load(i, "word")
        if cur & FAILED or L["v"] <= cur:
            return ret("invalid")
        L["cur"] = cur
        return goto("cas")
    if pc == "cas":
        ok, _ = x.cas(i, "word", L.pop("cur"), L["v"], h.gen)
        if not ok:
            return goto("start")
        if x.model.scn.point:  # ghost: the values this timeline reached (see point_status)
            x.set_flag(f"reached:{i}:{h.gen}:{L['v']}")
        if x.model.watch:
            return call("wake_tl", "notify", i=i)
        return tail("wake_tl" if x.new else "wake_fence", i=i)
    if pc == "notify":
        extra = {"count": L["count"]} if "count" in L else {}
        return tail("watch_notify", h=h, **extra)
    raise ModelError(pc)


# ---- watch nodes (ABI 5, docs/abi.md 5a; src/hostless/core/merge.c)


def count_field(x: Ctx, h: Handle) -> str:
    """Where the watcher count of h lives: a timeline's parents[0], a plain fence's err."""
    return "par" if h.kind == TIMELINE else "err"


def load_count(x: Ctx, h: Handle) -> Any:
    return x.load_par(h.idx, 0) if h.kind == TIMELINE else x.load(h.idx, "err")


@procedure("merge_points")
def p_merge_points(x: Ctx, pc: str, L: Loc) -> Next:
    """hle_merge_points: the composite with its full pending mask, then each child: a fence links
    through a free parents[] entry; a timeline point, or a fence whose links are taken, gets a
    watch node.  Returns (composite, (watch nodes...))."""
    kids: tuple[tuple[Handle, int], ...] = L["kids"]
    n = len(kids)
    if pc == "start":
        L["ws"] = ()
        return call(
            "alloc",
            "linkall",
            "m",
            kind=MERGED,
            owner=None,
            mask=(1 << n) - 1,
            kids=tuple(None if h.kind == TIMELINE else (h.idx, h.gen) for h, _ in kids),
        )
    m: Handle = L["m"]
    if pc == "linkall":
        L["j"], L["k"] = 0, 0
        return goto("link")
    j = L["j"]
    if pc == "link":
        if j == n:
            return ret((m, L["ws"]))
        h, thr = kids[j]
        k = L["k"]
        if h.kind == TIMELINE or k == x.maxpar:  # a watch node
            L["j"], L["k"] = j + 1, 0
            return call(
                "new_watch", "watched", "w", target=h, thr=thr, link=Link(j, m.gen, m.idx), pos=j, m=m
            )
        old = x.load_par(h.idx, k)
        L["old"] = old
        return goto("cas_link" if old is None else "link_live")
    if pc == "watched":
        L["ws"] = L["ws"] + (L.pop("w"),)
        return goto("link")
    if pc == "link_live":
        old = L["old"]
        c = x.load(old.p, "ctl")
        if c.state != FREE and c.kind == MERGED and c.gen == old.gen:
            del L["old"]
            L["k"] += 1
            return goto("link")
        return goto("cas_link")
    h = kids[j][0]
    if pc == "cas_link":
        k = L["k"]
        ok = x.cas_par(h.idx, k, L.pop("old"), Link(j, m.gen, m.idx), h.gen)
        if not ok:
            L["k"] = k + 1
            return goto("link")
        return goto("child_word")
    if pc == "child_word":
        w = x.load(h.idx, "word")
        L["j"], L["k"] = j + 1, 0
        if w:
            return call("propagate_link", "link", link=Link(j, m.gen, m.idx), status=w)
        return goto("link")
    raise ModelError(pc)


@procedure("new_watch")
def p_new_watch(x: Ctx, pc: str, L: Loc) -> Next:
    """new_watch: a FENCE slot initialised while ALLOC (aux = target, err = threshold,
    parents[0] = the link), published LIVE, then counted on its target, then evaluated once.
    NEW marks the node counted (parents[1] = COUNTED) after counting, so that its finalize
    takes back only a count it gave.  EVAL_FIRST: evaluated before counted (broken)."""
    t: Handle = L["target"]
    if pc == "start":
        return call(
            "alloc",
            "published",
            "w",
            kind=FENCE,
            owner=None,
            mask=0,
            kids=None,
            target=t,
            thr=L["thr"],
            link=L["link"],
        )
    w: Handle = L["w"]
    if pc == "published":
        m = L["m"]  # ghost: the composite's child j is this node
        ms = x.sh.slots[m.idx]
        if ms.kids is not None and ms.kids[0] == m.gen:
            kl = list(ms.kids[1])
            kl[L["pos"]] = (w.idx, w.gen)
            x._set(m.idx, kids=(m.gen, tuple(kl)))
        if x.model.variant == EVAL_FIRST:
            return call("watch_eval", "count", i=w.idx)
        return goto("count")
    if pc == "count":
        if x.model.variant in LIST_VARIANTS:
            return call("watch_push", "eval", t=t, w=w)
        return call("watchers_add", "counted", h=t, delta=1)
    if pc == "counted":
        if x.model.variant != FIRST:
            x.store(w.idx, "err", L["thr"] | COUNTED, w.gen)  # the creator holds the node (rule (a))
        if x.model.variant == EVAL_FIRST:
            return ret(w)
        return goto("eval")
    if pc == "eval":
        return call("watch_eval", "done", i=w.idx)
    if pc == "done":
        return ret(w)
    raise ModelError(pc)


COUNTED = TAG  # NEW: bit 63 of a watch node's err (HL_WATCH_COUNTED): its creator counted it


@procedure("watchers_add")
def p_watchers_add(x: Ctx, pc: str, L: Loc) -> Next:
    """hle_watchers_add(h, delta): check the slot is h's kind and generation, then CAS the count,
    which carries h's generation (and, NEW, the tag bit), so that the CAS acts only on h's count."""
    h: Handle = L["h"]
    delta = L["delta"]
    tagged = x.model.variant != FIRST
    if pc == "start":
        c = x.load(h.idx, "ctl")
        if c.kind != h.kind or c.gen != h.gen:
            return ret()
        return goto("load")
    if pc == "load":
        L["v"] = load_count(x, h)
        return goto("loop")
    if pc == "loop":
        v = L["v"]
        e = enc(v)
        if (e >> 32) & 0xFFFFFF == h.gen and (not tagged or e & TAG):
            n = e & 0xFFFFFFFF
        elif delta > 0 and (e == 0 or (h.kind == FENCE and e == h.gen << 32)):
            n = 0  # the first watcher of an object the caller holds (rule (a))
        else:
            del L["v"]
            return ret()  # another object's field: never touched
        if delta < 0 and n == 0:
            del L["v"]
            return ret()
        ok, cur = x.cas_enc(h.idx, count_field(x, h), v, Watchers(h.gen, n + delta, tagged), h.gen)
        if ok:
            del L["v"]
            return ret()
        L["v"] = cur
        return goto("loop")
    raise ModelError(pc)


@procedure("watch_eval")
def p_watch_eval(x: Ctx, pc: str, L: Loc) -> Next:
    """hle_watch_eval(i): seqlock read of the node, seqlock read of its target's word; complete
    the node with CAS2 on the node as read (rule (c)), then propagate (idempotent)."""
    i = L["i"]
    if pc == "start":
        c1 = x.load(i, "ctl")
        if c1.state != LIVE or c1.kind != FENCE:
            return ret()
        L["c1"] = c1
        return goto("aux")
    if pc == "aux":
        L["a"] = x.load(i, "aux")
        return goto("thr")
    if pc == "thr":
        e = x.load(i, "err")
        L["thr"] = e & ~COUNTED if isinstance(e, int) else 0  # another object now: c2 drops it
        return goto("word")
    if pc == "word":
        L["w"] = x.load(i, "word")
        return goto("c2")
    if pc == "c2":
        if x.load(i, "ctl") != L["c1"] or not isinstance(L["a"], Handle):
            return ret()
        if L["w"] != 0:
            return tail("propagate", i=i)
        return goto("t1")
    a: Handle = L["a"]
    if pc == "t1":
        L["t1"] = x.load(a.idx, "ctl")
        return goto("tw")
    if pc == "tw":
        L["tw"] = x.load(a.idx, "word")
        return goto("t2")
    if pc == "t2":
        t1 = L.pop("t1")
        if x.load(a.idx, "ctl") != t1:
            del L["tw"]
            return goto("t1")  # moving: read again
        tw = L.pop("tw")
        same = t1.gen == a.gen and t1.kind == a.kind and t1.state in (LIVE, DYING)
        if not same:
            st = CANCEL  # the watched object is gone
        elif tw < L["thr"]:
            return ret()
        elif a.kind == TIMELINE:
            st = tw - FAILED if tw & FAILED else SUCCESS
        else:
            st = tw
        L["st"] = st
        return goto("cas2")
    if pc == "cas2":
        if x.cas2(i, 0, L["c1"], L["st"]):
            return call("wake_fence", "prop", i=i)
        return goto("prop")
    if pc == "prop":
        return tail("propagate", i=i)
    raise ModelError(pc)


@procedure("watch_notify")
def p_watch_notify(x: Ctx, pc: str, L: Loc) -> Next:
    """hle_watch_notify: the signaller of h (holder, or its recoverer) reads h's watcher count
    and scans when it is nonzero.  (The C code first reads the kind from ctl: the holder knows
    it, so that read is not modelled.)  COUNT_FIRST: the count was read before the word was
    stored (the caller passes it as `count`)."""
    h: Handle = L["h"]
    if pc == "start" and x.model.variant in LIST_VARIANTS:  # the head: walk the list when it names a node
        v = load_count(x, h)
        if not isinstance(v, WHead) or v.gen != h.gen or v.first is None:
            return ret()
        L["first"] = v.first
        return goto("aux" if h.kind == FENCE else "walk")
    if pc == "walk":
        return tail("watch_walk", h=h, cur=L["first"], steps=0)
    if pc == "start":
        if "count" in L:
            v = L["count"]
        else:
            v = load_count(x, h)
        if enc(v) & 0xFFFFFFFF == 0:
            return ret()
        if h.kind == FENCE:
            return goto("aux")
        return tail("watch_scan", t=h.idx)
    if pc == "aux":  # a watch node's err is a threshold, not a count
        if x.load(h.idx, "aux") != 0:
            return ret()
        if x.model.variant in LIST_VARIANTS:
            return goto("walk")
        return tail("watch_scan", t=h.idx)
    raise ModelError(pc)


@procedure("watch_scan")
def p_watch_scan(x: Ctx, pc: str, L: Loc) -> Next:
    """hle_watch_scan(t): evaluate every LIVE watch node naming slot t."""
    t = L["t"]
    if pc == "start":
        L["i"] = 0
        return goto("aux")
    i = L["i"]
    if pc == "aux":
        if i == x.cap:
            return ret()
        a = x.load(i, "aux")
        if isinstance(a, Handle) and a.idx == t:
            return goto("ctl")
        L["i"] = i + 1
        return goto("aux")
    if pc == "ctl":
        c = x.load(i, "ctl")
        L["i"] = i + 1
        if c.state == LIVE and c.kind == FENCE:
            return call("watch_eval", "aux", i=i)
        return goto("aux")
    raise ModelError(pc)


def list_node(x: Ctx, pc: str, L: Loc, nxt_pc: str) -> Next | None:
    """LISTS: the seqlock read of node L["cur"] of the list of L["h"] (ctl, aux, next, ctl), one
    step per pc ("n_c1", "n_aux", "n_nxt", "n_c2"); leaves L["nc"], L["nn"] and goes to nxt_pc;
    L["broken"] = True when it is not a node of that list (another object: a slot reused while
    linked); None when pc is none of these."""
    i = L["cur"]
    if pc == "n_c1":
        L["nc"] = x.load(i, "ctl")
        return goto("n_aux")
    if pc == "n_aux":
        L["na"] = x.load(i, "aux")
        return goto("n_nxt")
    if pc == "n_nxt":
        L["nn"] = x.load(i, "nxt")
        return goto("n_c2")
    if pc == "n_c2":
        c1, a, n = L["nc"], L.pop("na"), L["nn"]
        if x.load(i, "ctl") != c1:
            return goto("n_c1")  # moving: read again
        h: Handle = L["h"] if "h" in L else L["t"]
        ok = (
            c1.kind == FENCE
            and c1.state in (LIVE, DYING)
            and a == h
            and isinstance(n, WNext)
            and n.gen == c1.gen
        )
        if x.model.variant == LISTS_NOCHECK and not ok:  # broken on purpose: trusts the slot
            L["nn"] = n if isinstance(n, WNext) else WNext(c1.gen, None, False)
        elif not ok:
            L["broken"] = True
        return goto(nxt_pc)
    return None


@procedure("watch_walk")
def p_watch_walk(x: Ctx, pc: str, L: Loc) -> Next:
    """LISTS, hle_watch_notify's walk (read-only): from node cur, evaluate every unmarked LIVE
    node of h's list; a broken list (or one longer than the table) scans the table instead."""
    h: Handle = L["h"]
    if pc == "start":
        if L["cur"] is None:
            return ret()
        if L["steps"] > x.cap:
            return tail("watch_scan", t=h.idx)
        return goto("n_c1")
    if pc == "again":  # a walk from a node that left meanwhile: once more from the head
        v = load_count(x, h)
        if not isinstance(v, WHead) or v.gen != h.gen:
            return ret()
        L["cur"], L["steps"] = v.first, 0
        return goto("start")
    r = list_node(x, pc, L, "node")
    if r is not None:
        return r
    if pc == "node":
        if L.pop("broken", False):
            L.pop("nc"), L.pop("nn")
            L["tries"] = L.get("tries", 0) + 1
            if L["tries"] < 2:
                return goto("again")
            return tail("watch_scan", t=h.idx)
        c1, n = L.pop("nc"), L.pop("nn")
        i = L["cur"]
        L["cur"], L["steps"] = n.nxt, L["steps"] + 1
        if not n.mark and c1.state == LIVE:
            return call("watch_eval", "start", i=i)
        return goto("start")
    raise ModelError(pc)


@procedure("watch_push")
def p_watch_push(x: Ctx, pc: str, L: Loc) -> Next:
    """LISTS, watch_push: the creator (holding target t and node w) checks t, sets w's next to
    the head's node, then CASes the head to w (from the fresh field of a first node)."""
    t: Handle = L["t"]
    w: Handle = L["w"]
    if pc == "start":
        c = x.load(t.idx, "ctl")
        if c.kind != t.kind or c.gen != t.gen:
            return ret(False)
        return goto("load")
    if pc == "load":
        L["v"] = load_count(x, t)
        return goto("next")
    v = L["v"]
    if isinstance(v, WHead) and v.gen == t.gen:
        first, ver = v.first, v.ver
    elif enc(v) == 0 or (t.kind == FENCE and enc(v) == t.gen << 32):
        first, ver = None, 0
    else:
        del L["v"]
        return ret(False)  # another object's field: never touched
    if pc == "next":
        x.store(w.idx, "nxt", WNext(w.gen, first, False), w.gen)  # we hold the node (rule (a))
        return goto("cas")
    if pc == "cas":
        ok, cur = x.cas_enc(t.idx, count_field(x, t), v, WHead(t.gen, ver + 1, w.idx), t.gen)
        if ok:
            del L["v"]
            return ret(True)
        L["v"] = cur
        return goto("next")
    raise ModelError(pc)


@procedure("watch_unlink")
def p_watch_unlink(x: Ctx, pc: str, L: Loc) -> Next:
    """LISTS, hle_watch_unlink by node i's finalize (DYING by it, or its recoverer): mark i's
    next (CAS), check the target t is still there, then walk t's list from its head, unlinking
    every marked node met: a CAS of the unmarked predecessor's next (carrying its generation) or
    of the head (carrying t's generation and the version) to the marked node's next.  Done when
    i was unlinked or is not in the list; a lost CAS walks again."""
    i, gen = L["i"], L["gen"]
    t: Handle = L["t"]
    if pc == "start":
        L["mv"] = x.load(i, "nxt")
        return goto("mark")
    if pc == "mark" and x.model.variant == LISTS_NOMARK:  # broken on purpose: no mark
        n = L.pop("mv")
        if not isinstance(n, WNext) or n.gen != gen:
            return ret()
        return goto("target")
    if pc == "mark":
        n = L.pop("mv")
        if not isinstance(n, WNext) or n.gen != gen:
            return ret()  # not a list node
        if n.mark:
            return goto("target")
        ok, cur = x.cas(i, "nxt", n, n._replace(mark=True), gen)  # rule (b): DYING by us
        if not ok:
            L["mv"] = cur
            return goto("mark")
        return goto("target")
    if pc == "target":
        c = x.load(t.idx, "ctl")
        if c.kind != t.kind or c.gen != t.gen or c.state not in (LIVE, DYING):
            return ret()  # the object is gone: nobody walks its list
        return goto("head")
    if pc == "head":
        pv = load_count(x, t)
        if not isinstance(pv, WHead) or pv.gen != t.gen:
            return ret()
        L["pf"], L["pv"], L["cur"], L["steps"] = None, pv, pv.first, 0
        return goto("step")
    if pc == "step":
        if L["cur"] is None or L["steps"] > x.cap:
            return goto("done")
        return goto("n_c1")
    r = list_node(x, pc, L, "node")
    if r is not None:
        return r
    if pc == "node":
        if L.pop("broken", False):  # a node that left under us (or a broken list): again, 3 times
            L.pop("nc"), L.pop("nn")
            L["tries"] = L.get("tries", 0) + 1
            return goto("head" if L["tries"] < 3 else "done")
        L.pop("nc")
        n = L.pop("nn")
        L["steps"] += 1
        if n.mark or (x.model.variant == LISTS_NOMARK and L["cur"] == i):
            L["unl"] = n
            return goto("unlink")
        L["pf"], L["pv"], L["cur"] = L["cur"], n, n.nxt
        return goto("step")
    if pc == "unlink":
        n, pf, pv, cur = L.pop("unl"), L["pf"], L["pv"], L["cur"]
        if pf is None:  # the head: the object's generation and the version are in it
            new: Any = WHead(t.gen, pv.ver + 1, n.nxt)
            ok, _ = x.cas_enc(t.idx, count_field(x, t), pv, new, t.gen)
        else:  # the predecessor's next: its generation is in it (rule (c))
            new = pv._replace(nxt=n.nxt)
            ok, _ = x.cas(pf, "nxt", pv, new, pv.gen, checked=True)
        if not ok:
            return goto("head")  # lost a race: walk again
        if cur == i:
            return goto("done")
        L["pv"], L["cur"] = new, n.nxt
        return goto("step")
    if pc == "done":
        for k in ("pf", "pv", "cur", "steps", "tries"):
            L.pop(k, None)
        return ret()
    raise ModelError(pc)


@procedure("raise_aux")
def p_raise_aux(x: Ctx, pc: str, L: Loc) -> Next:
    """A failer records in aux the value it is about to fail the timeline from (before its CAS
    of the word).  NEW (ABI 6, hl_timeline_fail): aux only grows, by a max-CAS loop, so a failer
    that read an older value never lowers what another one stored (so do the list variants, ABI 6
    too).  Before: one plain store."""
    i, v, gen = L["i"], L["v"], L["gen"]
    if x.model.variant not in AUX_MAX_VARIANTS:
        x.store(i, "aux", v, gen)
        return ret()
    if pc == "start":
        a = x.load(i, "aux")
        if a >= v:
            return ret()
        L["a"] = a
        return goto("cas")
    if pc == "cas":
        ok, _ = x.cas(i, "aux", L.pop("a"), v, gen)
        return ret() if ok else goto("start")
    raise ModelError(pc)


@procedure("point_status")
def p_point_status(x: Ctx, pc: str, L: Loc) -> Next:
    """What a wait on the point (t, v) returns once it has woken (hl_point_status): SUCCESS when
    the word is >= v and not failed; after a failure, SUCCESS when aux (the value before the
    failure) is >= v, else the failure (FORGET: the failure, always).  Checked against the ghost
    record of the values t reached: a point reached before the failure must be SUCCESS
    (``reached-point-failed``), one never reached its failure, one of ``fails``."""
    h, v = L["h"], L["v"]
    i = h.idx
    reached = any(
        f.startswith(f"reached:{i}:{h.gen}:") and int(f.rsplit(":", 1)[1]) >= v for f in x.sh.flags
    )
    if pc == "start":
        w = x.load(i, "word")
        if not w & FAILED:
            if w < v:
                raise ModelError(f"point_status of {h!r} >= {v} before its wait returned")
            return ret(SUCCESS)
        L["w"] = w
        if x.model.variant == FORGET:
            return goto("check")
        return goto("aux")
    if pc == "aux":
        a = x.load(i, "aux")
        L["st"] = SUCCESS if a >= v else L["w"] - FAILED
        return goto("check")
    if pc == "check":
        w = L.pop("w")
        st = L.pop("st", w - FAILED)
        if reached and st != SUCCESS:
            x.violation(
                "reached-point-failed",
                f"{x.spec.name}: the point {h!r} >= {v} was reached before the failure, the wait "
                f"returned {fmt(st)}",
            )
        elif not reached and st == SUCCESS:
            x.violation(
                "unreached-point-success",
                f"{x.spec.name}: {h!r} never reached {v}, the wait returned SUCCESS",
            )
        elif st != SUCCESS and st not in L["fails"]:
            x.violation(
                "wrong-status",
                f"{x.spec.name}: {h!r} failed with {fmt(st)}, expected "
                + " or ".join(fmt(s) for s in L["fails"]),
            )
        return ret(st)
    raise ModelError(pc)


@procedure("tl_fail")
def p_tl_fail(x: Ctx, pc: str, L: Loc) -> Next:
    """hle_timeline_fail by a holder: aux = value, CAS word -> FAILED | s, wake, notify."""
    h: Handle = L["h"]
    i = h.idx
    if pc == "start":
        if x.model.variant == COUNT_FIRST:
            L["count"] = load_count(x, h)
        return goto("load")
    if pc == "load":
        cur = x.load(i, "word")
        if cur & FAILED:
            return ret("already failed")
        L["cur"] = cur
        return goto("aux")
    if pc == "aux":
        return call("raise_aux", "cas", i=i, v=L["cur"], gen=h.gen)
    if pc == "cas":
        ok, _ = x.cas(i, "word", L.pop("cur"), FAILED | L["s"], h.gen)
        if not ok:
            return goto("load")
        return call("wake_tl", "notify", i=i)
    if pc == "notify":
        extra = {"count": L["count"]} if "count" in L else {}
        return tail("watch_notify", h=h, **extra)
    raise ModelError(pc)


@procedure("recover")
def p_recover(x: Ctx, pc: str, L: Loc) -> Next:
    """reap_all (for one participant d) + recover_participant."""
    d = L["d"]
    dbit = 1 << d
    my_id = x.me if x.me is not None else NOT_JOINED
    actor = x.me if x.me is not None else d  # recorded in the DYING ctl
    # ---- the claim
    if not x.new:
        if pc == "start":
            p = x.load_pctl(d)
            if p.state == P_FREE:
                return ret()
            L["p"] = p
            if p.state == P_ALIVE:
                return goto("lockchk")
            r = p.recoverer
            if r == my_id or r == NOT_JOINED:
                return goto("claim")  # ours from before, or recorded by a non-joined recoverer: take it
            return goto("rlock")
        if pc == "rlock":  # the recorded recoverer: alive?
            if not x.lock_free(L["p"].recoverer):
                del L["p"]
                return ret()  # someone alive is on it
            return goto("claim")
        if pc == "lockchk":
            if not x.lock_free(d):
                del L["p"]
                return ret()  # d is alive
            return goto("reread")
        if pc == "reread":
            if x.load_pctl(d) != L["p"]:
                del L["p"]
                return ret()
            return goto("claim")
        if pc == "claim":
            p = L.pop("p")
            claimed = Part(P_RECOVERING, p.inc, my_id)
            if p != claimed and not x.cas_pctl(d, p, claimed):
                return ret()
            L["claimed"], L["i"] = claimed, 0
            return goto("chk")
        if pc == "chk":  # a recoverer whose claim was taken over stops
            if L["i"] == x.cap:
                return goto("finish")
            if x.load_pctl(d) != L["claimed"]:
                del L["claimed"]
                return ret()
            return goto("sctl")
    else:
        if pc == "start" and L.get("leaving"):  # hle_leave: our own lock is ours already
            return goto("pctl")
        if pc == "start":  # FIRST d's liveness lock: free only when d is dead and nobody recovers it
            if not x.try_lock(d):
                return ret()
            return goto("pctl")
        if pc == "pctl":
            p = x.load_pctl(d)
            if p.state == P_FREE:
                return goto("unlock_only")
            L["p"] = p
            return goto("claim")
        if pc == "claim":
            p = L.pop("p")
            claimed = Part(P_RECOVERING, p.inc, my_id)
            if not x.cas_pctl(d, p, claimed):
                return goto("pctl")
            L["claimed"], L["i"] = claimed, 0
            return goto("chk")
        if pc == "chk":
            if L["i"] == x.cap:
                return goto("finish")
            return goto("sctl")
        if pc == "unlock_only":
            x.unlock(d)
            return ret()
    # ---- per slot
    i = L.get("i", 0)
    if pc == "sctl":
        c = x.load(i, "ctl")
        L["c"] = c
        if c.state == ALLOC and c.pidx == d:
            return goto("a_refs")
        if c.state == DYING and c.pidx == d:
            return goto("d_refs")
        if c.state == LIVE:
            return goto("pin" if x.new else "owner")
        if c.state == DYING and x.fix:
            return goto("settle")
        return goto("next" if x.new else "refs")
    c = cast(Ctl, L.get("c"))  # the ctl read at the start of this slot
    if pc == "settle":  # NEW+fix: DYING by someone else: it is freed or rolled back; see which
        if not x.await_(x.sh.slots[i].ctl != c, f"ctl[{i}] moved from {c!r}: look again"):
            return BLOCK
        return goto("sctl")
    if pc == "a_refs":  # died while initialising: nobody else can hold it yet
        x.store(i, "refs", 0, c.gen)
        return goto("a_free")
    if pc == "a_free":
        x.cas(i, "ctl", c, Ctl(c.gen, c.kind, 0, FREE))
        return goto("next")
    if pc == "d_refs":  # died while freeing: finish or roll back
        m = x.load(i, "refs")
        if m & ~dbit == 0:
            if m:
                L["m"] = m
                return goto("d_cas0")
            return goto("d_reload")
        return goto("d_back")
    if pc == "d_cas0":
        ok, _ = x.cas(i, "refs", L.pop("m"), 0)
        if ok:
            x.unhold(d, i, c.gen)
        return goto("d_reload")
    if pc == "d_reload":
        if x.load(i, "refs") == 0:
            return call("finalize", "next", i=i, dy=c)
        return goto("d_back")
    if pc == "d_back":
        live = Ctl(c.gen, c.kind, 0, LIVE)
        ok, _ = x.cas(i, "ctl", c, live)
        if ok and x.new and c.kind == MERGED:
            return call("resolve_merged", "d_ctl", i=i, c=live, aux_known=False)
        return goto("d_ctl")
    if pc == "d_ctl":
        c = x.load(i, "ctl")
        L["c"] = c
        if c.state == LIVE:
            return goto("pin" if x.new else "owner")
        return goto("next" if x.new else "refs")
    if pc == "pin":  # NEW: pin the object with d's bit, then check it is still the one read
        L["old"] = x.fetch_or(i, dbit)
        return goto("pin_chk")
    if pc == "pin_chk":
        old = L.pop("old")
        c2 = x.load(i, "ctl")
        if c2 != c:
            # NEW: another object now, go on.  NEW+fix: the same object only went DYING (and
            # may come back LIVE, kept by an importer): look at this slot again
            again = x.fix and c2.gen == c.gen and c2.state in (LIVE, DYING)
            after = "sctl" if again else "next"
            if not old & dbit:
                return call("drop_ref", after, i=i, part=d, actor=actor, gen=None)
            return goto(after)
        x.hold(d, i, c.gen)
        return goto("owner")
    if pc == "owner":
        if x.load(i, "owner") != d:
            return goto("unpin" if x.new else "refs")
        return goto("tl_load" if c.kind == TIMELINE else "od_cas")
    if pc == "od_cas":
        ok, _ = x.cas(i, "word", 0, L.get("s", OWNER_DIED), c.gen)
        if ok:
            return call("wake_fence", "od_prop", i=i)
        return goto("od_prop")
    if pc == "od_prop":
        if x.model.watch:
            return call("propagate", "od_notify", i=i)
        return call("propagate", "unpin" if x.new else "refs", i=i)
    if pc == "od_notify":
        return call("watch_notify", "unpin", h=Handle(i, c.gen, c.kind))
    if pc == "tl_load":  # fail_timeline_word
        cur = x.load(i, "word")
        if cur & FAILED:
            return goto("tl_wake")
        L["cur"] = cur
        return goto("tl_aux")
    if pc == "tl_aux":
        return call("raise_aux", "tl_cas", i=i, v=L["cur"], gen=c.gen)
    if pc == "tl_cas":
        ok, now = x.cas(i, "word", L.pop("cur"), FAILED | L.get("s", OWNER_DIED), c.gen)
        if not ok and not now & FAILED:
            L["cur"] = now
            return goto("tl_aux")
        return goto("tl_wake")
    if pc == "tl_wake":
        if x.model.watch:
            return call("wake_tl", "tl_notify", i=i)
        if x.new:
            return call("wake_tl", "unpin", i=i)
        return call("wake_fence", "refs", i=i)
    if pc == "tl_notify":
        return call("watch_notify", "unpin", h=Handle(i, c.gen, c.kind))
    if pc == "refs":  # OLD: drop d's bit if it is there (whatever object holds the slot now)
        if x.load(i, "refs") & dbit:
            return call("drop_ref", "next", i=i, part=d, actor=actor, gen=c.gen)
        return goto("next")
    if pc == "unpin":  # NEW: drop the pin (d's reference); may free the slot
        return call("drop_ref", "next", i=i, part=d, actor=actor, gen=c.gen)
    if pc == "next":
        L.pop("c", None)
        L["i"] = i + 1
        return goto("chk")
    if pc == "finish":
        cl = L["claimed"]
        x.cas_pctl(d, cl, Part(P_FREE, cl.inc, None))
        if x.new:
            return goto("unlock")
        del L["claimed"], L["i"]
        return ret()
    if pc == "unlock":
        x.unlock(d)
        del L["claimed"], L["i"]
        return ret()
    raise ModelError(pc)


# ---------------------------------------------------------------------------
# scenarios


@dataclass(frozen=True)
class Process:
    name: str
    part: int | None  # participant index (its bit in refs); None: not joined
    program: tuple[tuple[Any, ...], ...]
    killable: bool = False


@dataclass(frozen=True)
class Obj:
    """An object that exists when the scenario starts (generation 1)."""

    var: str
    idx: int
    kind: str
    holders: tuple[int, ...]
    owner: int | None = None
    word: int = 0
    children: tuple[str, ...] = ()  # merged: its children (all linked through parents[0])
    watch: tuple[str, int] | None = None  # a watch node: (watched var, threshold), counted


InvariantFn = Callable[["Model", State], list[Issue]]


@dataclass(frozen=True)
class Scenario:
    name: str
    doc: str
    cap: int
    nparts: int
    procs: tuple[Process, ...]
    objects: tuple[Obj, ...] = ()
    hint: int = 0
    dead: tuple[int, ...] = ()  # participants already dead when the scenario starts
    maxpar: int = 1
    expect_old: tuple[str, ...] = ()  # violation kinds the OLD protocol must show
    min_states: int = 100  # NEW must explore at least this many states
    invariants: tuple[InvariantFn, ...] = ()
    # watch-node scenarios (docs/abi.md 5a): explored for WATCH_VARIANTS instead of OLD/DRAFT;
    # expect[variant]: the violation kinds that variant must show (NEW: none, always)
    watch: bool = False
    expect: tuple[tuple[str, tuple[str, ...]], ...] = ()
    slow: bool = False  # explored only by the slow test (pytest -m slow)
    variants: tuple[str, ...] = WATCH_VARIANTS  # a watch scenario: the variants it is explored for
    # reached-point scenarios (docs/abi.md 3, 8): explored for POINT_VARIANTS (their
    # `variants`), expect as for watch
    point: bool = False


class Model:
    def __init__(self, scn: Scenario, variant: str) -> None:
        assert variant in ALL_VARIANTS
        self.scn = scn
        self.variant = variant
        self.procs = scn.procs
        self.cap = scn.cap
        self.maxpar = scn.maxpar
        self.killable = tuple(pi for pi, p in enumerate(scn.procs) if p.killable)
        self.new = variant != OLD
        self.fix = variant not in (OLD, DRAFT)
        self.watch = scn.watch

    # -- states
    def initial(self) -> State:
        scn = self.scn
        slots = [Slot(par=(None,) * self.maxpar) for _ in range(scn.cap)]
        by_var = {o.var: o for o in scn.objects}
        held: set[tuple[int, int, int]] = set()
        for o in scn.objects:
            aux: Any = 0
            kids = None
            if o.kind == MERGED:
                mask = sum(1 << j for j, v in enumerate(o.children) if by_var[v].word == 0)
                aux = (1, mask)
                kids = (1, tuple((by_var[v].idx, 1) for v in o.children))
            refs = sum(1 << h for h in o.holders)
            held |= {(h, o.idx, 1) for h in o.holders}
            slots[o.idx] = slots[o.idx]._replace(
                word=o.word,
                ctl=Ctl(1, o.kind, 0, LIVE),
                refs=refs,
                owner=o.owner,
                aux=aux,
                err=(1, 0),
                kids=kids,
            )
        for o in scn.objects:
            if o.watch is not None and self.variant in LIST_VARIANTS:  # pushed in the objects' order
                t = by_var[o.watch[0]]
                ts = slots[t.idx]
                head = ts.par[0] if t.kind == TIMELINE else ts.err
                first = head.first if isinstance(head, WHead) else None
                ver = head.ver if isinstance(head, WHead) else 0
                slots[o.idx] = slots[o.idx]._replace(
                    aux=Handle(t.idx, 1, t.kind), err=o.watch[1], nxt=WNext(1, first, False)
                )
                hd = WHead(1, ver + 1, o.idx)
                slots[t.idx] = (
                    ts._replace(par=(hd,) + ts.par[1:]) if t.kind == TIMELINE else ts._replace(err=hd)
                )
            elif o.watch is not None:
                t = by_var[o.watch[0]]
                slots[o.idx] = slots[o.idx]._replace(
                    aux=Handle(t.idx, 1, t.kind), err=o.watch[1] | (COUNTED if self.variant != FIRST else 0)
                )
                ts = slots[t.idx]
                e = enc(ts.par[0] if t.kind == TIMELINE else ts.err)
                cnt = Watchers(
                    1, (e & 0xFFFFFFFF if e & TAG or self.variant == FIRST else 0) + 1, self.variant != FIRST
                )
                slots[t.idx] = (
                    ts._replace(par=(cnt,) + ts.par[1:]) if t.kind == TIMELINE else ts._replace(err=cnt)
                )
        for o in scn.objects:
            for j, v in enumerate(o.children):
                c = by_var[v].idx
                slots[c] = slots[c]._replace(par=(Link(j, 1, o.idx),) + slots[c].par[1:])
        proc_of = {p.part: pi for pi, p in enumerate(scn.procs) if p.part is not None}
        locks = tuple(None if d in scn.dead else proc_of.get(d, -1) for d in range(scn.nparts))
        sh = Shared(
            slots=tuple(slots),
            hint=scn.hint,
            parts=tuple(Part(P_ALIVE) for _ in range(scn.nparts)),
            locks=locks,
            sleep=(None,) * len(scn.procs),
            held=frozenset(held),
            flags=frozenset(),
        )
        procs = []
        for p in scn.procs:
            loc: Loc = {"op": 0}
            for op in p.program:
                for a in op[1:]:
                    for v in a if isinstance(a, tuple) else (a,):
                        if isinstance(v, str):
                            v = v.split("@")[0]  # "t@1": a point of t
                        if isinstance(v, str) and v in by_var:
                            o = by_var[v]
                            loc["h:" + v] = Handle(o.idx, 1, o.kind)
            procs.append(Proc(RUN, (Frame("main", "next", freeze(loc), None),)))
        return sh, tuple(procs)

    def dead_parts(self, st: State) -> set[int]:
        dead = set(self.scn.dead)
        for p, pr in zip(self.procs, st[1], strict=True):
            if pr.status == DEAD and p.part is not None:
                dead.add(p.part)
        return dead

    # -- transitions
    def step(self, st: State, pi: int, verbose: bool = False) -> tuple[State, Ctx] | None:
        """Run process pi up to and including its next shared access.  None: not enabled."""
        sh, procs = st
        pr = procs[pi]
        if pr.status != RUN or sh.sleep[pi] is not None:
            return None
        x = Ctx(self, sh, pi, pr.stack, verbose)
        stack = list(pr.stack)
        where = here = ""
        for _ in range(200):
            if not stack:
                break
            fr = stack[-1]
            L = dict(fr.locals)
            if verbose:
                here = frame_summary(fr.fn, L)
            nxt = STEPS[fr.fn](x, fr.pc, L)
            tag = nxt[0]
            if tag == "block":
                return None
            if verbose and x.accesses and not where:
                where = here
            if tag == "goto":
                stack[-1] = new_frame((fr.fn, nxt[1], freeze(L), fr.into))
            elif tag == "call":
                stack[-1] = new_frame((fr.fn, nxt[3], freeze(L), fr.into))
                stack.append(new_frame((nxt[1], "start", freeze(nxt[2]), nxt[4])))
            elif tag == "tail":
                stack[-1] = new_frame((nxt[1], "start", freeze(nxt[2]), fr.into))
            else:  # ret
                stack.pop()
                if stack and fr.into is not None:
                    caller = stack[-1]
                    cl = dict(caller.locals)
                    cl[fr.into] = nxt[1]
                    stack[-1] = new_frame((caller.fn, caller.pc, freeze(cl), caller.into))
            if x.accesses:
                break
        else:
            raise ModelError(f"{self.procs[pi].name}: more than 200 local steps")
        if verbose:
            x.desc = f"{where}: {x.desc}" if x.accesses else "returns (program ends)"
        status = RUN if stack else DONE
        procs2 = procs[:pi] + (new_proc((status, tuple(stack))),) + procs[pi + 1 :]
        return (x.sh, procs2), x

    def kill(self, st: State, pi: int) -> State:
        sh, procs = st
        sh = sh._replace(
            locks=tuple(None if h == pi else h for h in sh.locks),
            sleep=sh.sleep[:pi] + (None,) + sh.sleep[pi + 1 :],
        )
        return sh, procs[:pi] + (Proc(DEAD, ()),) + procs[pi + 1 :]

    def successors(self, st: State) -> list[tuple[State, int, bool, list[Issue], list[str]]]:
        out = []
        for pi in range(len(self.procs)):
            r = self.step(st, pi)
            if r is not None:
                out.append((r[0], pi, False, r[1].bad, r[1].notes))
        for pi in self.killable:
            if st[1][pi].status != DEAD:
                out.append((self.kill(st, pi), pi, True, [], []))
        return out

    def label(self, st: State, pi: int, killed: bool) -> str:
        name = self.procs[pi].name
        if killed:
            return f"{name}: KILLED"
        r = self.step(st, pi, verbose=True)
        assert r is not None
        return f"{name}: {r[1].desc}"

    # -- invariants
    def state_issues(self, st: State) -> list[Issue]:
        sh, procs = st
        bad: list[Issue] = []
        slots = sh.slots
        for mi, s in enumerate(slots):  # merged fences vs their children
            if s.kids is None or s.ctl.gen != s.kids[0] or s.ctl.state not in (LIVE, DYING) or s.word == 0:
                continue
            current = [
                (ci, slots[ci].word)
                for ci, cg in (k for k in s.kids[1] if k is not None)
                if slots[ci].ctl.gen == cg and slots[ci].ctl.state in (LIVE, DYING)
            ]
            if s.word == SUCCESS:
                for ci, w in current:
                    if w != SUCCESS:
                        bad.append(
                            (
                                "merged-early",
                                f"merged fence in slot {mi} is SUCCESS while its child in slot {ci} is "
                                + ("ACTIVE" if w == 0 else fmt(w)),
                            )
                        )
            elif s.word != CANCEL and len(current) == len(s.kids[1]) and all(w != s.word for _, w in current):
                bad.append(("merged-status", f"merged fence in slot {mi} is {fmt(s.word)}, no child is"))
        by_d: dict[int, list[str]] = {}
        for p, pr in zip(self.procs, procs, strict=True):
            for fr in pr.stack:
                if fr.fn == "recover":
                    loc = dict(fr.locals)
                    if "claimed" in loc:
                        by_d.setdefault(loc["d"], []).append(p.name)
        for d, names in by_d.items():
            if len(names) > 1:
                bad.append(
                    ("two-recoverers", f"{' and '.join(names)} run the recovery of participant {d} at once")
                )
        if self.watch:
            bad += watch_state_issues(sh)
        for inv in self.scn.invariants:
            bad += inv(self, st)
        return bad

    @staticmethod
    def idle(p: Process, pr: Proc) -> bool:
        """Waiting for a death that may never come (a watchdog polling liveness locks)."""
        fr = pr.stack[-1]
        if fr.fn != "main":
            return False
        k: int = dict(fr.locals)["op"]
        return k < len(p.program) and p.program[k][0] == "await_dead"

    def final_issues(self, st: State) -> list[Issue]:
        """At a state where nothing but a death can happen."""
        sh, procs = st
        bad: list[Issue] = []
        for p, pr, addr in zip(self.procs, procs, sh.sleep, strict=True):
            if addr is not None:
                bad.append(
                    ("lost-wakeup", f"{p.name} is asleep forever on the futex of {addr[1]}[{addr[0]}]")
                )
            elif pr.status == RUN and not self.idle(p, pr):
                bad.append(("stuck", f"{p.name} is blocked forever in {pr.stack[-1].fn}.{pr.stack[-1].pc}"))
        dead = self.dead_parts(st)
        unrecovered = {d for d in dead if sh.parts[d].state != P_FREE}
        for i, s in enumerate(sh.slots):
            c = s.ctl
            if c.state in (ALLOC, DYING) and c.pidx not in unrecovered:
                bad.append(("end-state", f"slot {i} is left {c!r}"))
            if c.state == LIVE and s.refs == 0:
                bad.append(("end-state", f"slot {i} is LIVE with no reference"))
            if c.state == FREE and s.refs != 0:
                bad.append(("end-state", f"slot {i} is FREE with refs {s.refs:#b}"))
            if c.state == LIVE:
                for part in range(len(sh.parts)):
                    if s.refs >> part & 1 and (part, i, c.gen) not in sh.held:
                        bad.append(
                            ("leaked-ref", f"slot {i} ({c!r}) has a reference bit of {part} nobody holds")
                        )
            if c.state == LIVE and c.kind == MERGED and s.kids is not None and s.kids[0] == c.gen:
                a_ = merged_aux(s.aux)
                mask = a_[1] if a_ is not None and a_[0] == c.gen else 0
                for j, kid in enumerate(s.kids[1]):
                    if not mask >> j & 1 or kid is None:
                        continue
                    ci, cg = kid
                    cs = sh.slots[ci]
                    ok = (
                        cs.ctl.gen == cg
                        and cs.ctl.state == LIVE
                        and cs.word == 0
                        and Link(j, c.gen, i) in cs.par
                    )
                    if not ok:
                        bad.append(
                            (
                                "pending-mask",
                                f"merged slot {i}: bit {j} pending but child slot {ci} is not an ACTIVE "
                                "child linking to it",
                            )
                        )
                if mask == 0 and s.word == 0:
                    bad.append(
                        ("lost-completion", f"merged slot {i} has no pending child but is still ACTIVE")
                    )
        for a, i, g in sh.held:
            s = sh.slots[i]
            if s.ctl.gen == g and s.ctl.state == LIVE and not s.refs >> a & 1:
                bad.append(("lost-ref", f"{a} holds slot {i} gen {g} but its bit is not in refs"))
        for d in dead - unrecovered:  # recovery completed
            for i, s in enumerate(sh.slots):
                c = s.ctl
                if s.refs >> d & 1:
                    bad.append(("recovery-incomplete", f"slot {i} ({c!r}) keeps dead participant {d}'s bit"))
                if c.state in (ALLOC, DYING) and c.pidx == d:
                    bad.append(("recovery-incomplete", f"slot {i} is left {c!r}"))
                if (
                    c.state == LIVE
                    and s.owner == d
                    and c.kind != MERGED
                    and (s.word == 0 or (c.kind == TIMELINE and not s.word & FAILED))
                ):
                    bad.append(("recovery-incomplete", f"slot {i} ({c!r}) owned by dead {d} is not failed"))
        if self.watch:
            bad += watch_final_issues(sh)
        for inv in self.scn.invariants:
            bad += inv(self, st)
        return bad


def watch_target(sh: Shared, a: Handle) -> tuple[bool, int]:
    """(is the watched object still there, its word)."""
    t = sh.slots[a.idx]
    return t.ctl.gen == a.gen and t.ctl.kind == a.kind and t.ctl.state in (LIVE, DYING), t.word


def watch_state_issues(sh: Shared) -> list[Issue]:
    """After every step: a watch node completes only once its point is reached, with the
    watched object's status (a fence's status, a timeline's failure), or CANCEL once it is gone."""
    bad: list[Issue] = []
    for i, s in enumerate(sh.slots):
        a = s.aux
        if not isinstance(a, Handle) or s.ctl.state not in (LIVE, DYING) or s.word in (0, CANCEL):
            continue
        there, tw = watch_target(sh, a)
        if not there:
            continue
        thr = s.err & ~COUNTED
        if tw < thr:
            bad.append(("watch-early", f"watch node {i} is {fmt(s.word)} but {a!r} is at {fmt(tw)} < {thr}"))
        elif s.word != SUCCESS:
            want = tw - FAILED if a.kind == TIMELINE and tw & FAILED else tw
            if s.word != want:
                bad.append(("watch-status", f"watch node {i} is {fmt(s.word)}, {a!r} is {fmt(tw)}"))
    return bad


def watch_final_issues(sh: Shared) -> list[Issue]:
    """At final states: no watch node left ACTIVE whose point was reached (or whose object is
    gone): the completion was lost (only the sweeps, not modelled, would find it); and every
    watched object's count covers its counted live nodes (a lower count makes a signaller skip
    the scan: a lost completion in waiting)."""
    bad: list[Issue] = []
    live: dict[Handle, int] = {}
    for i, s in enumerate(sh.slots):
        a = s.aux
        if not isinstance(a, Handle) or s.ctl.state != LIVE:
            continue
        if s.err & COUNTED:  # counted by its creator (NEW marks it; FIRST does not: unchecked)
            live[a] = live.get(a, 0) + 1
        there, tw = watch_target(sh, a)
        if s.word == 0 and (not there or tw >= s.err & ~COUNTED):
            bad.append(
                (
                    "lost-completion",
                    f"watch node {i} is ACTIVE but {a!r} " + (f"is at {fmt(tw)}" if there else "is gone"),
                )
            )
    bad += watch_list_issues(sh)
    for a, n in live.items():
        there, _ = watch_target(sh, a)
        if not there:
            continue
        t = sh.slots[a.idx]
        e = enc(t.par[0] if a.kind == TIMELINE else t.err)
        have = e & 0xFFFFFFFF if (e >> 32) & 0xFFFFFF == a.gen else 0
        if n and have < n:
            bad.append(("watch-count", f"{a!r} counts {have} watch nodes, {n} are LIVE"))
    return bad


def watch_list_issues(sh: Shared) -> list[Issue]:
    """LISTS, at final states (every finalize and recovery done): the list of every watched
    object still there holds exactly its LIVE nodes, unmarked, with no cycle and no stranger
    (a node left out is evaluated by the sweeps only; a slot reused while linked sends every
    signaller to the table scan)."""
    bad: list[Issue] = []
    for ti, t in enumerate(sh.slots):
        head = t.par[0] if t.ctl.kind == TIMELINE else t.err
        if t.ctl.state not in (LIVE, DYING) or not isinstance(head, WHead) or head.gen != t.ctl.gen:
            continue
        h = Handle(ti, t.ctl.gen, t.ctl.kind)
        want = {i for i, s in enumerate(sh.slots) if s.ctl.state == LIVE and s.aux == h}
        seen: list[int] = []
        cur = head.first
        while cur is not None:
            s = sh.slots[cur]
            if cur in seen or s.aux != h or not isinstance(s.nxt, WNext) or s.nxt.gen != s.ctl.gen:
                bad.append(
                    (
                        "watch-list",
                        f"the list of {h!r} reaches slot {cur} ({s.ctl!r}, {s.nxt!r}) after {seen}",
                    )
                )
                break
            if s.nxt.mark or s.ctl.state != LIVE:
                bad.append(("watch-list", f"the list of {h!r} still holds slot {cur} ({s.ctl!r}, {s.nxt!r})"))
                break
            seen.append(cur)
            cur = s.nxt.nxt
        else:
            if set(seen) != want:
                bad.append(
                    ("watch-list", f"the list of {h!r} holds {seen}, its LIVE nodes are {sorted(want)}")
                )
    return bad


def frame_summary(fn: str, L: Loc) -> str:
    if fn == "main":
        return "main"
    for k in ("h", "link", "i", "d"):
        if k in L:
            v = L[k]
            return (
                f"{fn}({'slot ' + str(v) if k == 'i' else 'participant ' + str(v) if k == 'd' else repr(v)})"
            )
    return fn


# ---------------------------------------------------------------------------
# the explorer


class Step(NamedTuple):
    """One transition of a trace, as data: the process that took it, the index in its program
    of the API operation the step belongs to (None: a death, or the return at the end of the
    program), and whether the step is the process's death."""

    proc: str
    op: int | None
    killed: bool


@dataclass
class Violation:
    kind: str
    message: str
    trace: list[str]
    steps: list[Step] = field(default_factory=list)
    """The trace as data (one Step per line of ``trace``): what tests/model/test_protocol_replay.py
    replays against the C engine."""


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
    notes: dict[str, list[str]] = field(default_factory=dict)

    def summary(self) -> str:
        head = (
            f"{self.scenario:22s} {self.variant:7s}: {self.states:6d} states, "
            f"{self.transitions:7d} transitions, {self.finals:3d} final states, {self.seconds:5.1f} s"
        )
        if not self.complete:
            head += " (stopped once the expected violation was found)"
        if not self.violations:
            return head + ": no violation"
        return head + ": VIOLATIONS " + ", ".join(sorted(self.violations))


def explore(
    scn: Scenario, variant: str, stop_on: tuple[str, ...] = (), max_states: int = 3_000_000
) -> Result:
    """Breadth-first search of every interleaving; the first (shortest) trace per violation kind.

    stop_on: stop as soon as every one of these kinds was found."""
    model = Model(scn, variant)
    t0 = time.perf_counter()
    res = Result(scn.name, variant)
    init = model.initial()
    parent: dict[State, tuple[State, int, bool] | None] = {init: None}
    queue = deque([init])
    pending: list[tuple[str, str, State, tuple[int, bool] | None]] = []
    note_at: dict[str, tuple[State, int]] = {}

    def record(kind: str, msg: str, st: State, last: tuple[int, bool] | None) -> None:
        if kind not in res.violations and not any(k == kind for k, _, _, _ in pending):
            pending.append((kind, msg, st, last))

    bad0 = model.state_issues(init)
    for kind, msg in bad0:
        record(kind, msg, init, None)
    while queue:
        st = queue.popleft()
        succ = model.successors(st)
        if all(killed for _, _, killed, _, _ in succ):
            # final, or quiescent: only deaths can happen (a killable process may also never die)
            res.finals += 1
            for kind, msg in model.final_issues(st):
                record(kind, msg, st, None)
        for nst, pi, killed, bad, notes in succ:
            res.transitions += 1
            for note in notes:
                note_at.setdefault(note, (st, pi))
            for kind, msg in bad:
                record(kind, msg, st, (pi, killed))
            n = len(parent)
            parent.setdefault(nst, (st, pi, killed))
            if len(parent) == n:
                continue  # seen before
            sbad = model.state_issues(nst)
            for kind, msg in sbad:
                record(kind, msg, nst, None)
            if any(k not in NONFATAL for k, _ in bad + sbad):
                continue  # a violating state is not expanded
            queue.append(nst)
        # turn the pending records into traces (cheap: few)
        for kind, msg, vst, last in pending:
            tr = trace_to(model, parent, vst)
            if last is not None:
                tr.append(model.label(vst, *last))
            res.violations[kind] = Violation(kind, msg, tr, steps_to(model, parent, vst, last))
        pending.clear()
        if stop_on and all(k in res.violations for k in stop_on):
            res.complete = False
            break
        if len(parent) > max_states:
            raise ModelError(f"{scn.name}/{variant}: more than {max_states} states")
    for key, (st, pi) in note_at.items():
        res.notes[key] = trace_to(model, parent, st) + [model.label(st, pi, False)]
    res.states = len(parent)
    res.seconds = time.perf_counter() - t0
    return res


def trace_to(model: Model, parent: dict[State, tuple[State, int, bool] | None], st: State) -> list[str]:
    path = []
    cur = parent[st]
    while cur is not None:
        path.append(cur)
        cur = parent[cur[0]]
    path.reverse()
    return [model.label(prev, pi, killed) for prev, pi, killed in path]


def step_of(model: Model, nxt: State, pi: int, killed: bool) -> Step:
    """The Step of the transition of process pi that led to state nxt."""
    name = model.procs[pi].name
    if killed:
        return Step(name, None, True)
    stack = nxt[1][pi].stack
    if not stack:
        return Step(name, None, False)  # the program's end
    # main's "op" is the index of the next operation to start: the step belongs to the one
    # before it (an operation in progress, or one that just ended inside main)
    return Step(name, int(dict(stack[0].locals)["op"]) - 1, False)


def steps_to(
    model: Model,
    parent: dict[State, tuple[State, int, bool] | None],
    st: State,
    last: tuple[int, bool] | None = None,
) -> list[Step]:
    """The path to st (and the transition ``last`` out of it, if any) as Steps."""
    chain: list[tuple[State, int, bool, State]] = []
    nxt, cur = st, parent[st]
    while cur is not None:
        chain.append((cur[0], cur[1], cur[2], nxt))
        nxt, cur = cur[0], parent[cur[0]]
    chain.reverse()
    out = [step_of(model, n, pi, killed) for _p, pi, killed, n in chain]
    if last is not None:
        pi, killed = last
        if killed:
            n = model.kill(st, pi)
        else:
            r = model.step(st, pi)
            assert r is not None
            n = r[0]
        out.append(step_of(model, n, pi, killed))
    return out


class ApiEvent(NamedTuple):
    """One API operation of a counterexample (or a death), placed at API granularity."""

    proc: str
    op: int | None  # index in the process's program; None: the process is killed
    begin: int  # index of its first step in the trace (len(trace) for what the trace never reached)
    end: int  # index of its last step
    spans: tuple[tuple[str, int | None], ...]  # other processes' events that ended inside it


GHOST_OPS = frozenset({"mark", "await", "await_dead"})
"""Operations that are the model's ordering devices, not API calls."""


def api_events(scn: Scenario, steps: list[Step]) -> list[ApiEvent]:
    """A counterexample at API granularity: every API operation (and death) of the trace,
    ordered by the step at which it ends (its last shared access), then the operations the
    trace never reached, one after the other, per process in program order (they get the
    positions len(steps), len(steps) + 1, ...).  ``spans`` names the operations of other
    processes that the trace runs inside this one (an interleaving at instruction level that
    an API-level replay cannot force)."""
    first: dict[tuple[str, int | None], int] = {}
    last: dict[tuple[str, int | None], int] = {}
    for n, s in enumerate(steps):
        if s.op is None and not s.killed:
            continue
        key = (s.proc, s.op)
        first.setdefault(key, n)
        last[key] = n
    events = []
    for key, end in last.items():
        begin = first[key]
        spans = tuple(k for k, e in last.items() if k[0] != key[0] and begin < e < end)
        events.append(ApiEvent(key[0], key[1], begin, end, spans))
    events.sort(key=lambda e: e.end)
    n = len(steps)
    for p in scn.procs:
        if any(e.proc == p.name and e.op is None for e in events):
            continue  # killed: it does nothing more
        done = [e.op for e in events if e.proc == p.name and e.op is not None]
        for k in range(max(done, default=-1) + 1, len(p.program)):
            if p.program[k][0] not in GHOST_OPS:
                events.append(ApiEvent(p.name, k, n, n, ()))
                n += 1
    return [e for e in events if e.op is None or scn_op(scn, e)[0] not in GHOST_OPS]


def linearizations(events: list[ApiEvent], limit: int = 1000) -> list[list[ApiEvent]]:
    """Every order of the events in which each takes effect at one instant between its first
    and its last step (a linear extension of "a before b when a ends before b begins"): the
    API-level orders that the counterexample's interleaving allows.  At most ``limit``."""
    n = len(events)
    out: list[list[ApiEvent]] = []
    before = [{j for j in range(n) if events[j].end < events[i].begin} for i in range(n)]

    def extend(order: list[int], done: set[int]) -> None:
        if len(out) >= limit:
            return
        if len(order) == n:
            out.append([events[i] for i in order])
            return
        for i in range(n):
            if i not in done and before[i] <= done:
                done.add(i)
                order.append(i)
                extend(order, done)
                order.pop()
                done.discard(i)

    extend([], set())
    return out


def scn_op(scn: Scenario, e: ApiEvent) -> tuple[Any, ...]:
    """The program operation of an event."""
    assert e.op is not None
    return next(p for p in scn.procs if p.name == e.proc).program[e.op]


# ---------------------------------------------------------------------------
# the scenarios (participant indices are the bits in refs)


def merge_reuse(sweeps: int = 1) -> Scenario:
    return Scenario(
        name="merge-reuse",
        doc="""Bug 1.  P1 creates fences a, b and m = merge(a, b) (the whole table of 3 slots),
        signals a and b, waits for m and releases m, a, b; a sweeper S (another participant's
        watchdog) sweeps the table concurrently; P2, once P1 starts releasing m, allocates a fence
        x (it lands in a freed slot, m's in the OLD protocol where alloc_hint points at the slot just
        freed) and checks that x is still ACTIVE.  A resolution of m that read m's ctl before m was
        freed must not complete x.  S sweeps once by default (NEW: about 104k states; with two
        sweeps, ``--sweeps=2``, about 206k, too slow for the test budget).""",
        cap=3,
        nparts=3,
        procs=(
            Process(
                "P1",
                0,
                (
                    ("alloc", "a", FENCE),
                    ("alloc", "b", FENCE),
                    ("merge", "m", ("a", "b")),
                    ("signal", "a", SUCCESS),
                    ("signal", "b", SUCCESS),
                    ("wait", "m", 1),
                    ("mark", "P1 releases m"),
                    ("release", "m"),
                    ("release", "a"),
                    ("release", "b"),
                ),
            ),
            Process("S", 1, (("sweep",),) * sweeps),
            Process(
                "P2",
                2,
                (("await", "P1 releases m"), ("alloc", "x", FENCE), ("check_active", "x"), ("release", "x")),
            ),
        ),
        expect_old=("stale-write", "fresh-not-active"),
        min_states=5000,
    )


def merge_birth() -> Scenario:
    return Scenario(
        name="merge-birth",
        doc="""P1 holds fences a and b (slots 0 and 1), merges them (slot 2), signals a ERROR and
        b SUCCESS, waits for the merged fence and releases everything; a sweeper S sweeps once.
        OLD: the merged slot is LIVE with an empty pending mask before merge stores the mask, and the
        sweep completes it at birth (SUCCESS while its children are ACTIVE).  The merged status must
        be ERROR (the first failure).""",
        cap=3,
        nparts=2,
        objects=(Obj("a", 0, FENCE, (0,)), Obj("b", 1, FENCE, (0,))),
        hint=2,
        procs=(
            Process(
                "P1",
                0,
                (
                    ("merge", "m", ("a", "b")),
                    ("signal", "a", ERROR),
                    ("signal", "b", SUCCESS),
                    ("wait", "m", 1),
                    ("release", "m"),
                    ("release", "a"),
                    ("release", "b"),
                ),
            ),
            Process("S", 1, (("sweep",),)),
        ),
        expect_old=("merged-early",),
        min_states=1000,
    )


def propagate_stale_child() -> Scenario:
    return Scenario(
        name="propagate-stale-child",
        doc="""Slot 0: fence c held by P1; slot 1: M1 = merge(c) held by P1; slot 2: a fence held by
        P2 (so the table is full).  P1 signals c, releases c, then M1.  P2 allocates a fence f (it can
        only get c's or M1's freed slot) and merges it into M2.  The sweeper S, which read c's word
        before c was freed, must not use the links of whatever is in c's slot later: in the OLD
        protocol it reads f's link to M2 and clears M2's bit, completing M2 while f is ACTIVE.""",
        cap=3,
        nparts=3,
        objects=(
            Obj("c", 0, FENCE, (0,)),
            Obj("M1", 1, MERGED, (0,), children=("c",)),
            Obj("y", 2, FENCE, (2,)),
        ),
        procs=(
            Process("P1", 0, (("signal", "c", SUCCESS), ("release", "c"), ("release", "M1"))),
            Process("S", 1, (("sweep",),)),
            Process("P2", 2, (("alloc", "f", FENCE), ("merge", "M2", ("f",)))),
        ),
        expect_old=("merged-early",),
        min_states=1000,
    )


def timeline_lost_wakeup() -> Scenario:
    return Scenario(
        name="timeline-lost-wakeup",
        doc="""A timeline t at 0 held by P1 and P2.  P1 waits for t >= 1; P2 signals t = 2^32, whose
        low 32 bits are those of 0.  OLD: the futex is the word's low half, unchanged by the signal:
        a waiter that read 0 before the signal and sleeps after the wake sleeps forever (the real code
        sleeps at most poll_ns; the model has no timeout, to show the lost wake-up).  NEW: sleepers
        wait on the wake sequence, read before the word.""",
        cap=1,
        nparts=2,
        objects=(Obj("t", 0, TIMELINE, (0, 1)),),
        procs=(Process("P1", 0, (("wait", "t", 1),)), Process("P2", 1, (("tl_signal", "t", FUTEX_MOD),))),
        expect_old=("lost-wakeup",),
        min_states=15,
    )


def recovery_stale_write() -> Scenario:
    return Scenario(
        name="recovery-stale-write",
        doc="""Participant D owns fence f (slot 0, imported by P1 before the start) and fence g
        (slot 1, held only by D).  D releases f; D is killed at any point (also after its program).
        P1 releases f; P2 allocates a fence x (it waits for a free slot: f's or g's) and checks it is
        ACTIVE, then releases it; R (joined) waits until D's liveness lock is free and recovers D.
        OLD: R reads f's ctl and owner, f is freed and x allocated in its slot, R's OWNER_DIED CAS
        lands on x.  After the recovery: g is OWNER_DIED (or freed), no D bit, no slot stuck.""",
        cap=2,
        nparts=4,
        objects=(Obj("f", 0, FENCE, (0, 1), owner=0), Obj("g", 1, FENCE, (0,), owner=0)),
        procs=(
            Process("D", 0, (("release", "f"),), killable=True),
            Process("P1", 1, (("release", "f"),)),
            Process("P2", 2, (("alloc", "x", FENCE), ("check_active", "x"), ("release", "x"))),
            Process("R", 3, (("await_dead", 0), ("recover", 0))),
        ),
        expect_old=("stale-write", "fresh-not-active"),
        min_states=1000,
    )


def two_recoverers() -> Scenario:
    return Scenario(
        name="two-recoverers",
        doc="""D (participant 0) is dead at the start; it owns f (slot 0, also held by P1) and g
        (slot 1, held only by D).  R1 (not joined: records 255) and R2 (joined) both recover D while
        P1 releases f and P2 allocates a fence x, checks it is ACTIVE and releases it.  OLD: R2 may
        take over R1's claim (255) while R1 is inside a slot's steps; NEW: D's liveness lock admits
        one recoverer at a time.""",
        cap=2,
        nparts=4,
        dead=(0,),
        objects=(Obj("f", 0, FENCE, (0, 1), owner=0), Obj("g", 1, FENCE, (0,), owner=0)),
        procs=(
            Process("P1", 1, (("release", "f"),)),
            Process("P2", 2, (("alloc", "x", FENCE), ("check_active", "x"), ("release", "x"))),
            Process("R1", None, (("recover", 0),)),
            Process("R2", 3, (("recover", 0),)),
        ),
        expect_old=("two-recoverers", "stale-write"),
        min_states=1000,
    )


def recovery_vs_import() -> Scenario:
    return Scenario(
        name="recovery-vs-import",
        doc="""D (participant 0) is dead at the start; it owned fence f (slot 0), now held only by P1.
        P1 releases f; P3, which has f's handle, imports it, waits for it (it must complete:
        OWNER_DIED, or CANCEL if it was freed first) and releases it; R recovers D.  P1's release
        may go LIVE -> DYING and roll back because a bit appeared (R's pin, P3's import); a recovery
        that takes that transient DYING for "another object" and skips the slot leaves f ACTIVE,
        held by P3, with its owner dead: P3 sleeps forever.""",
        cap=1,
        nparts=4,
        dead=(0,),
        objects=(Obj("f", 0, FENCE, (1,), owner=0),),
        procs=(
            Process("P1", 1, (("release", "f"),)),
            Process("P3", 2, (("import", "f"), ("wait", "f", 1), ("release", "f"))),
            Process("R", 3, (("recover", 0),)),
        ),
        expect_old=("lost-wakeup",),
        min_states=100,
    )


def timeline_owner_died() -> Scenario:
    return Scenario(
        name="timeline-owner-died",
        doc="""Timeline t (slot 0, at 0) owned by D, held by D and P1.  D signals t = 2^32 and may be
        killed at any point; P1 waits for t >= 1 and releases t; R waits until D's lock is free
        and recovers D (timeline branch: aux = value, word = FAILED | OWNER_DIED, wake).  Whatever
        happens, P1 must wake up and t must end failed.  OLD: the 2^32 jump is invisible to the
        futex (lost wake-up, as in timeline-lost-wakeup).""",
        cap=1,
        nparts=3,
        objects=(Obj("t", 0, TIMELINE, (0, 1), owner=0),),
        procs=(
            Process("D", 0, (("tl_signal", "t", FUTEX_MOD),), killable=True),
            Process("P1", 1, (("wait", "t", 1), ("release", "t"))),
            Process("R", 2, (("await_dead", 0), ("recover", 0))),
        ),
        expect_old=("lost-wakeup",),
        min_states=100,
    )


# ---- watch-node scenarios (docs/abi.md 5a): explored for FIRST, EVAL_FIRST, COUNT_FIRST, NEW

LOST = ("lost-wakeup", "lost-completion")


def watch_birth(fail: bool = False) -> Scenario:
    st = (ERROR,) if fail else (SUCCESS,)
    return Scenario(
        name="watch-birth-fail" if fail else "watch-birth",
        doc=f"""Timeline t (slot 0, at 0) held by P and S.  P merges m over the point t@1 (a watch
        node, then the composite; P holds both), waits for m, checks its status
        ({"ERROR" if fail else "SUCCESS"}) and releases m and the node; S
        {"fails t with ERROR" if fail else "signals t = 1"} at any point of the merge's birth
        (node published, counted, evaluated) and of the propagation.  No sweeper: the completion
        must come from the creator's evaluation or the signaller's scan.  EVAL_FIRST and
        COUNT_FIRST (the ordering broken) lose it: P sleeps forever.""",
        cap=3,
        nparts=2,
        objects=(Obj("t", 0, TIMELINE, (0, 1)),),
        procs=(
            Process(
                "P",
                0,
                (
                    ("merge", "m", ("t@1",)),
                    ("wait", "m", 1),
                    ("check_status", "m", st),
                    ("release", "m"),
                    ("release", "m.w0"),
                ),
            ),
            Process("S", 1, (("tl_fail", "t", ERROR),) if fail else (("tl_signal", "t", 1),)),
        ),
        watch=True,
        expect=((EVAL_FIRST, LOST), (COUNT_FIRST, LOST)),
        min_states=200,
    )


def watch_mixed() -> Scenario:
    return Scenario(
        name="watch-mixed",
        doc="""Fence f (slot 0) and timeline t (slot 1), both held by P and S.  P merges m over f and
        t@1 (f links directly, t through a watch node), waits, and releases m and the node; S
        signals f ERROR and then t = 1.  m must end ERROR (the first failure) whatever the
        interleaving with the birth and the propagation.""",
        cap=4,
        nparts=2,
        objects=(Obj("f", 0, FENCE, (0, 1)), Obj("t", 1, TIMELINE, (0, 1))),
        procs=(
            Process(
                "P",
                0,
                (
                    ("merge", "m", ("f", "t@1")),
                    ("wait", "m", 1),
                    ("check_status", "m", (ERROR,)),
                    ("release", "m"),
                    ("release", "m.w0"),
                ),
            ),
            Process("S", 1, (("signal", "f", ERROR), ("tl_signal", "t", 1))),
        ),
        watch=True,
        expect=((EVAL_FIRST, LOST), (COUNT_FIRST, LOST)),
        min_states=500,
    )


def watch_owner_died() -> Scenario:
    return Scenario(
        name="watch-owner-died",
        doc="""Timeline t (slot 0, at 0) owned by D, held by D and P.  D signals t = 1 and may be
        killed at any point; P merges m over t@2, waits for m (polling: the bounded sleep of the
        real waits; a futex sleep would also report a propagator killed between its completing
        CAS and its FUTEX_WAKE, which the bounded sleep covers), checks its status and releases
        m and the node; D then signals t = 2.  R waits until D's lock is free and recovers D (t
        fails OWNER_DIED and the recovery scans for t's watch nodes).  P must wake, with SUCCESS
        if D reached 2, else OWNER_DIED.""",
        cap=3,
        nparts=3,
        objects=(Obj("t", 0, TIMELINE, (0, 1), owner=0),),
        procs=(
            Process("D", 0, (("tl_signal", "t", 1), ("tl_signal", "t", 2)), killable=True),
            Process(
                "P",
                1,
                (
                    ("merge", "m", ("t@2",)),
                    ("poll", "m"),
                    ("check_status", "m", (OWNER_DIED, SUCCESS)),
                    ("release", "m"),
                    ("release", "m.w0"),
                ),
            ),
            Process("R", 2, (("await_dead", 0), ("recover", 0))),
        ),
        watch=True,
        expect=((EVAL_FIRST, ("stuck", "lost-completion")), (COUNT_FIRST, ("stuck", "lost-completion"))),
        min_states=500,
    )


def watch_creator_dies() -> Scenario:
    return Scenario(
        name="watch-creator-dies",
        doc="""Timeline t (slot 0, at 0) held by C, P and S.  P's watch node w2 (slot 1) on t@1 exists
        already, counted on t (P waits on the node itself: its composite adds nothing here).
        C merges m1 over t@1 and may be killed at any point of the birth (between publishing
        its node and counting it, too); R recovers C; S signals t = 1; P waits for w2.  FIRST:
        the finalize of C's uncounted node takes w2's count back, S reads a count of 0 and does
        not scan, P sleeps forever.  NEW: a node's finalize takes back only a count its creator
        gave (HL_WATCH_COUNTED).""",
        cap=4,
        nparts=4,
        objects=(
            Obj("t", 0, TIMELINE, (0, 1, 2)),
            Obj("w2", 1, FENCE, (1,), watch=("t", 1)),
        ),
        procs=(
            Process("C", 0, (("merge", "m1", ("t@1",)),), killable=True),
            Process("P", 1, (("wait", "w2", 1), ("check_status", "w2", (SUCCESS,)))),
            Process("S", 2, (("tl_signal", "t", 1),)),
            Process("R", 3, (("await_dead", 0), ("recover", 0))),
        ),
        watch=True,
        expect=((FIRST, ("lost-wakeup",)),),
        min_states=1000,
        slow=True,  # about 300k states per variant, 30 s
    )


def watch_target_reuse() -> Scenario:
    return Scenario(
        name="watch-target-reuse",
        doc="""Timeline t (slot 0) with watch node w (slot 1) of composite m (slot 2), all held by P;
        slot 3 FREE (never used).  P releases t before w (recovery of a dead creator drops its
        references in slot order, so this happens), then w, then m.  Q allocates a fence f (t's
        freed slot, generation 2) and merges it into M (slot 3, generation 1): f's parents[0] =
        link(pos 0 -> slot 3 gen 1), whose 64 bits are those of an untagged count "gen 1: 4".
        FIRST: w's finalize, which checked t's ctl before the slot was reused, decrements that
        "count" (a stale write into f's link).  NEW: a count is tagged (bit 63), no link is.""",
        cap=4,
        nparts=2,
        objects=(
            Obj("t", 0, TIMELINE, (0,)),
            Obj("w", 1, FENCE, (0,), watch=("t", 1)),
            Obj("m", 2, MERGED, (0,), children=("w",)),
        ),
        procs=(
            Process("P", 0, (("release", "t"), ("release", "w"), ("release", "m"))),
            Process(
                "Q", 1, (("alloc", "f", FENCE), ("merge", "M", ("f",)), ("release", "M"), ("release", "f"))
            ),
        ),
        watch=True,
        expect=((FIRST, ("stale-write",)),),
        min_states=300,
    )


def watch_shared(composites: int = 2) -> Scenario:
    procs = [Process("S", 0, (("signal", "f", SUCCESS),)), Process("A", 1, (("release", "M1"),))]
    objects = [Obj("f", 0, FENCE, tuple(range(composites + 1))), Obj("M1", 1, MERGED, (1,), children=("f",))]
    for k in range(2, composites + 1):
        procs.append(
            Process(
                f"B{k}",
                k,
                (
                    ("merge", f"M{k}", ("f",)),
                    ("wait", f"M{k}", 1),
                    ("release", f"M{k}"),
                    ("release", f"M{k}.w0"),
                ),
            )
        )
    return Scenario(
        name=f"watch-shared-{composites}",
        doc=f"""Fence f (slot 0) in {composites} composites: M1 (slot 1) links to it directly
        (parents[0]; the model has one link per fence), the others (by B2..) through watch
        nodes, created while S signals f and A releases M1.  Each B waits for its composite and
        releases it and its node.  No slot leaks, f's count ends at 0 with no watch node left,
        no stale write, nobody sleeps forever.""",
        cap=2 + 2 * (composites - 1),
        nparts=composites + 1,
        objects=tuple(objects),
        procs=tuple(procs),
        watch=True,
        expect=((EVAL_FIRST, LOST), (COUNT_FIRST, LOST)),
        min_states=500,
        slow=composites > 2,
    )


LIST_SCENARIO_VARIANTS = (NEW, LISTS, LISTS_NOMARK, LISTS_NOCHECK)


def watch_list_neighbours() -> Scenario:
    return Scenario(
        name="watch-list-neighbours",
        doc="""Timeline t (slot 0, at 0) with three watch nodes on t@1, pushed w1, w2, w3: the list
        is t -> w3 -> w2 -> w1.  P1 releases w2 and P2 (killable at every step; R recovers it)
        releases w3 at the same time: neighbours leave the list together.  At the end t's list
        holds exactly w1 (no freed node linked, no cycle) and nothing leaks.  LISTS_NOMARK (no
        mark before the unlink) relinks a node that left.  (A signaller walking the list meanwhile
        is watch-list-reuse's.)""",
        cap=4,
        nparts=4,
        objects=(
            Obj("t", 0, TIMELINE, (0, 1, 2)),
            Obj("w1", 1, FENCE, (0,), watch=("t", 1)),
            Obj("w2", 2, FENCE, (1,), watch=("t", 1)),
            Obj("w3", 3, FENCE, (2,), watch=("t", 1)),
        ),
        procs=(
            Process("P1", 1, (("release", "w2"),)),
            Process("P2", 2, (("release", "w3"),), killable=True),
            Process("R", 3, (("await_dead", 2), ("recover", 2))),
        ),
        watch=True,
        # NEW (ABI 5) too: a finalizer killed after decrementing the count and before FREE is
        # finalized again by its recoverer, which decrements again: the count drops below the
        # live nodes and the signaller skips the scan (the list's unlink is idempotent)
        expect=((NEW, ("watch-count",)), (LISTS_NOMARK, ("watch-list",)), (LISTS_NOCHECK, ("watch-list",))),
        min_states=1000,
        variants=LIST_SCENARIO_VARIANTS,
    )


def watch_list_reuse() -> Scenario:
    return Scenario(
        name="watch-list-reuse",
        doc="""Timeline t (slot 0, at 0) with watch nodes w1 (slot 1) and w2 (slot 2, held by P) on
        t@1: the list is t -> w2 -> w1.  S signals t to 1
        and walks the list while P releases w2 (unlinked, freed) and Q allocates a fence f in the
        only slot that frees (2, the table is full) and releases it: a walker that read the head
        before the unlink reaches f.  w1 must complete with SUCCESS (a walker that meets a slot
        that is not a node of t's list scans the table).  LISTS_NOCHECK (a walker that trusts the
        slot: f's empty next ends its walk) loses w1's completion.""",
        cap=3,
        nparts=4,
        hint=2,
        objects=(
            Obj("t", 0, TIMELINE, (0, 1, 2)),
            Obj("w1", 1, FENCE, (1,), watch=("t", 1)),
            Obj("w2", 2, FENCE, (2,), watch=("t", 1)),
        ),
        procs=(
            Process("S", 0, (("tl_signal", "t", 1),)),
            Process("P", 2, (("release", "w2"),)),
            Process("Q", 3, (("alloc", "f", FENCE), ("release", "f"))),
        ),
        watch=True,
        expect=((LISTS_NOCHECK, ("lost-completion",)),),
        min_states=1000,
        variants=LIST_SCENARIO_VARIANTS,
    )


# ---- reached points and clean leaves (ABI 6): explored for FORGET, AUX_STORE, NEW

POINT_BUG = "reached-point-failed"


def timeline_reached_point() -> Scenario:
    return Scenario(
        name="timeline-reached-point",
        doc="""Timeline t (slot 0, at 0) owned by D, held by D, F1, F2 and P.  D signals t = 1 then
        t = 2; F1 fails t with ERROR and F2 with CANCEL, concurrently; P waits for t >= 2 and then
        asks what the points 1 and 2 say.  A point reached before the failure must say SUCCESS,
        one never reached the failure.  FORGET: every point says the failure.  AUX_STORE: F1 read
        t = 1, F2 read t = 2 and stored aux = 2, F1 stores aux = 1, F2's CAS fails t: point 2
        says CANCEL although it was reached.""",
        cap=1,
        nparts=4,
        objects=(Obj("t", 0, TIMELINE, (0, 1, 2, 3), owner=0),),
        procs=(
            Process("D", 0, (("tl_signal", "t", 1), ("tl_signal", "t", 2))),
            Process("F1", 1, (("tl_fail", "t", ERROR),)),
            Process("F2", 2, (("tl_fail", "t", CANCEL),)),
            Process(
                "P",
                3,
                (
                    ("wait", "t", 2),
                    ("check_point", "t", 2, (ERROR, CANCEL)),
                    ("check_point", "t", 1, (ERROR, CANCEL)),
                    ("release", "t"),
                ),
            ),
        ),
        point=True,
        variants=POINT_VARIANTS,
        expect=((FORGET, (POINT_BUG,)), (AUX_STORE, (POINT_BUG,))),
        min_states=300,
    )


def timeline_owner_left() -> Scenario:
    return Scenario(
        name="timeline-owner-left",
        doc="""Timeline t (slot 0, at 0) owned by D, held by D, F and P.  D signals t = 1 and leaves
        (hle_leave: a clean close, which recovers D itself: its owned timeline fails); F fails t
        with ERROR at any point; P waits for t >= 2 and asks what the points 1 and 2 say.  Point 1
        was reached: SUCCESS; point 2 fails with OWNER_LEFT (D left) or ERROR, never OWNER_DIED.
        FORGET: point 1 says the failure, and the leave says OWNER_DIED.  AUX_STORE: F read t = 0,
        D's leave stored aux = 1, F stores aux = 0, the leave's CAS fails t: point 1 fails.""",
        cap=1,
        nparts=3,
        objects=(Obj("t", 0, TIMELINE, (0, 1, 2), owner=0),),
        procs=(
            Process("D", 0, (("tl_signal", "t", 1), ("leave",))),
            Process("F", 1, (("tl_fail", "t", ERROR), ("release", "t"))),
            Process(
                "P",
                2,
                (
                    ("wait", "t", 2),
                    ("check_point", "t", 2, (ERROR, OWNER_LEFT)),
                    ("check_point", "t", 1, (ERROR, OWNER_LEFT)),
                    ("release", "t"),
                ),
            ),
        ),
        point=True,
        variants=POINT_VARIANTS,
        expect=((FORGET, (POINT_BUG, "wrong-status")), (AUX_STORE, (POINT_BUG,))),
        min_states=300,
    )


def point_scenarios() -> list[Scenario]:
    return [timeline_reached_point(), timeline_owner_left()]


def watch_scenarios() -> list[Scenario]:
    return [
        watch_birth(),
        watch_birth(fail=True),
        watch_mixed(),
        watch_owner_died(),
        watch_target_reuse(),
        watch_creator_dies(),
        watch_shared(2),
        watch_shared(3),
        watch_list_neighbours(),
        watch_list_reuse(),
    ]


def scenarios() -> list[Scenario]:
    return [
        merge_reuse(),
        merge_birth(),
        propagate_stale_child(),
        timeline_lost_wakeup(),
        recovery_stale_write(),
        two_recoverers(),
        recovery_vs_import(),
        timeline_owner_died(),
        *watch_scenarios(),
        *point_scenarios(),
    ]


def scenario(name: str, sweeps: int = 1) -> Scenario:
    for scn in scenarios():
        if scn.name == name:
            return merge_reuse(sweeps) if name == "merge-reuse" else scn
    raise KeyError(name)


def explore_by_name(name: str, variant: str, stop_on: tuple[str, ...] = ()) -> Result:
    """explore(scenario(name), ...): a picklable job for a process pool."""
    return explore(scenario(name), variant, stop_on=stop_on)


def report(res: Result, out: Any = None, max_notes: int = 3) -> None:
    out = out or sys.stdout
    print(res.summary(), file=out)
    for kind in sorted(res.violations):
        v = res.violations[kind]
        print(f"  [{kind}] {v.message}", file=out)
        for line in v.trace:
            print(f"      {line}", file=out)
    if res.notes:
        print(f"  benign writes to FREE/uninitialised slots ({len(res.notes)} kinds), e.g.:", file=out)
        for n in list(res.notes)[:max_notes]:
            print(f"      {n}", file=out)


def main(argv: list[str]) -> int:
    """python tests/model/protocol_model.py [--quick] [--no-draft] [--sweeps=N] [scenario ...]

    Every scenario against OLD, DRAFT and NEW (the implemented protocol); --no-draft skips DRAFT.
    --quick: stop the OLD search once the violations the scenario expects are found (the full
    OLD searches take about a minute, two-recoverers most of it).  --sweeps=2: the sweeper of
    merge-reuse sweeps twice (about twice the states)."""
    quick = "--quick" in argv
    variants = VARIANTS if "--no-draft" in argv else ALL_VARIANTS
    sweeps = 1
    for a in argv:
        if a.startswith("--sweeps="):
            sweeps = int(a.split("=", 1)[1])
    names = {a for a in argv if not a.startswith("--")}
    known = {s.name for s in scenarios()}
    if names - known:
        print(f"unknown scenario(s) {sorted(names - known)}; known: {sorted(known)}")
        return 2
    t0 = time.perf_counter()
    for scn in scenarios():
        if names and scn.name not in names:
            continue
        scn = scenario(scn.name, sweeps)
        print(f"== {scn.name}: {' '.join(scn.doc.split())}")
        for variant in scn.variants if scn.watch or scn.point else variants:
            stop = scn.expect_old if quick and variant == OLD else ()
            if quick and (scn.watch or scn.point):
                stop = dict(scn.expect).get(variant, ())
            report(explore(scn, variant, stop_on=stop))
        print()
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
