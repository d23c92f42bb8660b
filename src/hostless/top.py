"""``hostless top NAME``: a live view of a domain, refreshed several times a second.

It shows the participants (label, pid, kind, alive or dead, and the slots' last
recoveries: which pid, recovered by whom, when), the agents (each queue with a
consumer: its participant's label and kind, packets/s, busy %, failures and the last
failure's reason, queue depth), the timelines' values and progress per second, the
heap's and the device heaps' use, and the name table.  Keys: ``p`` packets/s, ``b``
busy, ``f`` failures, ``d`` depth, ``n`` label (sort the agents), ``q`` (or Ctrl-C)
quits.

It only reads: the domain is mapped read-only through :class:`hostless.view.DomainView`
(no participant slot, no lock, no reference), so it never blocks or perturbs a
participant.  Rates are deltas of counters the domain keeps between two refreshes:
``completed``, ``failed`` and ``busy_ns`` of each queue (``struct hl_queue``, written by
the engine's agent loop, which sets ``HL_QUEUE_COUNTS``; the Python and GPU loops keep
only ``completed``, so their busy % and failures are shown as ``-``).

Everything read is untrusted: labels, kinds, names and failure records go through
:func:`hostless.termtext.safe` (control characters shown escaped, never markup);
counters that go backwards or exceed the elapsed time are shown as ``?``.  The domain
may be corrupted, removed, truncated or replaced under the view: each refresh checks
that the file is still the one mapped and still as large, and shows what happened
instead of the tables, reopening the name when a domain appears there again.  A
truncation that lands during a refresh's reads does not kill the process: the view's
mapping is under the engine's SIGBUS guard (a page past the new end reads zeros, and
:attr:`DomainView.truncated` says so: that refresh is discarded).

:func:`snapshot` (what was read) and :func:`render` (the lines shown) are pure
functions of a view and of two snapshots, for tests and other front ends.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ._abi import C
from .errors import CorruptDomain
from .status import Status
from .termtext import safe
from .view import DomainView, open_view

__all__ = ["AgentRow", "Snapshot", "SORT_KEYS", "snapshot", "remember", "render", "Monitor", "main"]

SORT_KEYS = {"p": "packets/s", "b": "busy %", "f": "failures", "d": "depth", "n": "label"}
"""Keys that sort the agents' table, and what they sort by."""

_MAX_TIMELINES = 12


def _u(buf: Any, off: int, n: int) -> int:
    return int.from_bytes(bytes(buf[off : off + n]), "little")


def _status_name(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return f"invalid status {code:#x}"


@dataclass(frozen=True)
class PartRow:
    index: int
    pid: int
    label: str
    kind: str
    state: str
    recovered_pid: int  # the slot's last recovery (0: none)
    recovered_by: str
    recovered_ns: int


@dataclass(frozen=True)
class AgentRow:
    queue: int  # the queue's handle
    label: str  # the consumer participant's label ("" when its slot is gone)
    kind: str
    pid: int
    state: str  # alive, dead, recovering, gone (the consumer's slot was freed or reused)
    completed: int
    failed: int
    busy_ns: int
    last_failed: int
    reason: str  # the last failure's record, or its signal's status
    depth: int | None  # packets queued (None: the indices are inconsistent)
    capacity: int
    counts: bool = True  # its consumer keeps failed, busy_ns and last_failed (HL_QUEUE_COUNTS)


@dataclass(frozen=True)
class TimelineRow:
    handle: int
    name: str
    value: int
    failure: str  # "" or the failure status


@dataclass
class Snapshot:
    """One read of a domain (``error`` set when it could not be read)."""

    t: float
    name: str
    error: str = ""
    epoch: int = 0
    recovered: int = 0
    participants: list[PartRow] = field(default_factory=list)
    agents: list[AgentRow] = field(default_factory=list)
    timelines: list[TimelineRow] = field(default_factory=list)
    heap: dict[str, Any] = field(default_factory=dict)
    device_heaps: list[dict[str, Any]] = field(default_factory=list)
    names: dict[str, int] = field(default_factory=dict)
    objects: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------- reading


def _handle(tag: int, kind: int, gen: int, idx: int) -> int:
    return (tag << 56) | (kind << 48) | ((gen & 0xFFFFFF) << 24) | (idx + 1)


def _queue_header(view: DomainView, word: int, size: int) -> int | None:
    """The mapping offset of the queue block at heap-data offset ``word`` (``size`` bytes),
    every extent checked by subtraction; None when it does not fit."""
    lay, m = view.layout, view.raw()
    ho, hs = lay["heap_offset"], lay["heap_size"]
    if not hs or _u(m, ho + int(C.HP_MAGIC), 8) != int(C.HEAP_MAGIC):
        return None
    data_rel, dsize = _u(m, ho + int(C.HP_DATA_OFFSET), 8), _u(m, ho + int(C.HP_DATA_SIZE), 8)
    if data_rel > hs or dsize > hs - data_rel:
        return None
    if word > dsize or size > dsize - word or size < int(C.QUEUE_HEADER_SIZE):
        return None
    q = ho + data_rel + word
    if _u(m, q, 8) != int(C.QUEUE_MAGIC):
        return None
    return q


def _reason(view: DomainView, sig: int, fences: Any) -> str:
    if not sig:
        return ""
    try:
        rec = view.record(sig)
    except (ValueError, IndexError, UnicodeError):
        rec = None
    if rec:
        lines = [ln.strip() for ln in rec.splitlines() if ln.strip()]
        return lines[0] if lines else ""  # the first line (a traceback follows it)
    idx = (sig & 0xFFFFFF) - 1
    if 0 <= idx < len(fences) and view._slot_live(sig):
        w = int(fences[idx]["word"])
        if (sig >> 48) & 0xFF == int(C.KIND_TIMELINE):
            return _status_name(w & 0xFFFFFFFF) if w >= int(C.TIMELINE_FAILED) else f"signal {sig:#x}"
        return _status_name(w) if w else f"signal {sig:#x}"
    return f"signal {sig:#x} (gone; no record)"


def snapshot(view: DomainView, now: float | None = None) -> Snapshot:
    """Read everything :func:`render` shows from ``view`` (read-only; bounded work)."""
    t = time.monotonic() if now is None else now
    snap = Snapshot(t=t, name=view.name)
    m, lay = view.raw(), view.layout
    h = view.header()
    snap.epoch, snap.recovered = int(h["epoch"]), int(h["stats_recovered"])
    tag = int(h["tag"])
    parts = {p.index: p for p in view.participants}
    psize, pbase = int(C.PARTICIPANT_SIZE), lay["participants_offset"]
    for i in range(lay["participant_capacity"]):
        base = pbase + i * psize
        rpid = _u(m, base + int(C.P_RECOVERED_PID), 4)
        p = parts.get(i)
        if p is None and not rpid:
            continue
        by = _u(m, base + int(C.P_RECOVERED_BY), 4)
        by_s = "" if not rpid else ("an unjoined process" if by == 256 else f"slot {by - 1}" if by else "?")
        if by and 0 < by <= 255:
            rec = parts.get(by - 1)
            if rec is not None:
                by_s = f"slot {by - 1} ({safe(rec.label)}, pid {rec.pid})"
        snap.participants.append(
            PartRow(
                index=i,
                pid=p.pid if p else 0,
                label=safe(p.label) if p else "",
                kind=safe(p.kind) if p else "",
                state=p.state if p else "free",
                recovered_pid=rpid,
                recovered_by=by_s,
                recovered_ns=_u(m, base + int(C.P_RECOVERED_NS), 8) if rpid else 0,
            )
        )
    fences = view.fences()
    ctl = fences["ctl"].astype("u8")
    live = (ctl & 0xFF) == int(C.SLOT_LIVE)
    kinds = (ctl >> 24) & 0xFF
    names = view.names()
    rev = {hh: n for n, hh in names.items()}
    snap.names = {safe(n): hh for n, hh in names.items() if not n.startswith("!")}  # "!": records
    for kname, k in (
        ("fences", C.KIND_FENCE),
        ("timelines", C.KIND_TIMELINE),
        ("merged", C.KIND_MERGED),
        ("buffers", C.KIND_BUFFER),
        ("queues", C.KIND_QUEUE),
    ):
        snap.objects[kname] = int((live & (kinds == int(k))).sum())
    for idx in map(int, (live & (kinds == int(C.KIND_QUEUE))).nonzero()[0]):
        f = fences[idx]
        c = int(f["ctl"])
        qh = _handle(tag, int(C.KIND_QUEUE), c >> 32, idx)
        q = _queue_header(view, int(f["word"]), int(f["aux"]))
        if q is None:
            continue
        consumer, qflags = _u(m, q + int(C.Q_CONSUMER), 4), _u(m, q + int(C.Q_FLAGS), 4)
        if not consumer and not qflags & int(C.QUEUE_WAS_BOUND):
            continue  # nobody ever served it: not an agent's
        cidx, cinc = (consumer & 0xFF) - 1, consumer >> 8
        p = parts.get(cidx)
        mine = p is not None and ((p.id >> 8) & 0xFFFFFF) == cinc
        cap = _u(m, q + int(C.Q_CAPACITY), 4)
        w, r = _u(m, q + int(C.Q_WRITE_INDEX), 8), _u(m, q + int(C.Q_READ_INDEX), 8)
        depth = w - r if r <= w and w - r <= cap else None  # by subtraction
        last = _u(m, q + int(C.Q_LAST_FAILED), 8)
        snap.agents.append(
            AgentRow(
                queue=qh,
                label=safe(p.label) if mine and p else "",
                kind=safe(p.kind) if mine and p else "",
                pid=p.pid if mine and p else 0,
                state=(p.state if mine and p else "gone" if consumer else "no consumer"),
                completed=_u(m, q + int(C.Q_COMPLETED), 8),
                failed=_u(m, q + int(C.Q_FAILED), 8),
                busy_ns=_u(m, q + int(C.Q_BUSY_NS), 8),
                last_failed=last,
                reason=safe(_reason(view, last, fences)),
                depth=depth,
                capacity=cap,
                counts=bool(qflags & int(C.QUEUE_COUNTS)),
            )
        )
    tls = []
    for idx in map(int, (live & (kinds == int(C.KIND_TIMELINE))).nonzero()[0]):
        f = fences[idx]
        hh = _handle(tag, int(C.KIND_TIMELINE), int(f["ctl"]) >> 32, idx)
        w = int(f["word"])
        failed = w >= int(C.TIMELINE_FAILED)
        tls.append(
            TimelineRow(
                handle=hh,
                name=safe(rev.get(hh, "")),
                value=int(f["aux"]) if failed else w,
                failure=_status_name(w & 0xFFFFFFFF) if failed else "",
            )
        )
    tls.sort(key=lambda x: (x.name == "", x.name, x.handle))
    snap.timelines = tls
    snap.heap = dict(view.heap_stats())
    snap.device_heaps = view.device_heaps()
    return snap


def remember(cur: Snapshot, prev: Snapshot | None) -> Snapshot:
    """``cur`` with the label, kind and pid of each agent whose consumer is gone taken from
    ``prev`` (what it was serving with), marked "(was)": a killed agent's row stays
    readable after its recovery freed its slot."""
    if prev is None or prev.error:
        return cur
    old = {a.queue: a for a in prev.agents}
    rows = []
    for a in cur.agents:
        o = old.get(a.queue)
        if not a.label and o is not None and o.label:
            was = o.label if o.label.endswith(" (was)") else f"{o.label} (was)"
            a = replace(a, label=was, kind=o.kind, pid=o.pid)
        rows.append(a)
    cur.agents = rows
    return cur


# ---------------------------------------------------------------------- rendering


def _size(n: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


def _rate(cur: int, old: int | None, dt: float) -> float | None:
    if old is None or dt <= 0:
        return None
    if cur < old:
        return -1.0  # went backwards: a new queue in the slot, or a hostile write
    return (cur - old) / dt


def _fmt_rate(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    if x < 0 or (pct and x > 100.5):
        return "?"
    return f"{x:.0f}%" if pct else f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def agent_rates(cur: Snapshot, prev: Snapshot | None) -> dict[int, tuple[float | None, float | None]]:
    """Queue handle -> (packets/s, busy %) from the counters' deltas between two snapshots
    (None where there is no earlier snapshot of that queue; -1 where a counter went back)."""
    out: dict[int, tuple[float | None, float | None]] = {}
    old = {a.queue: a for a in prev.agents} if prev is not None and not prev.error else {}
    dt = cur.t - prev.t if prev is not None else 0.0
    for a in cur.agents:
        o = old.get(a.queue)
        pk = _rate(a.completed, o.completed if o else None, dt)
        busy = _rate(a.busy_ns, o.busy_ns if o else None, dt)
        out[a.queue] = (pk, None if busy is None else busy if busy < 0 else busy / 1e9 * 100)
    return out


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip()] + [fmt.format(*r).rstrip() for r in rows]


def render(cur: Snapshot, prev: Snapshot | None = None, *, sort: str = "p", width: int = 120) -> list[str]:
    """The lines ``hostless top`` shows for ``cur`` (rates against ``prev``), each at most
    ``width`` characters, agents sorted by ``sort`` (a key of :data:`SORT_KEYS`)."""
    stamp = time.strftime("%H:%M:%S")
    keys = "".join(SORT_KEYS)
    by = SORT_KEYS.get(sort, "?")
    lines = [f"hostless top {safe(cur.name)}  {stamp}  sort by {by}  (keys {keys}: sort, q: quit)"]
    if cur.error:
        lines += ["", cur.error]
        return [ln[:width] for ln in lines]
    obj = ", ".join(f"{n} {k}" for k, n in cur.objects.items() if n)
    lines.append(f"epoch {cur.epoch}, {cur.recovered} recoveries; live objects: {obj or 'none'}")
    hp = cur.heap
    heap = "no heap"
    if hp.get("size"):
        heap = f"heap {_size(hp.get('used', 0))} / {_size(hp['size'])} used ({hp.get('allocs', 0)} allocs)"
    for d in cur.device_heaps:
        heap += f"; {d['name']} {_size(d['used'])} / {_size(d['size'])}"
    lines += [heap, ""]

    rates = agent_rates(cur, prev)
    rows = []
    for a in cur.agents:
        pk, busy = rates[a.queue]
        rows.append(
            (
                a,
                pk,
                busy,
                [
                    a.label or "?",
                    a.kind or "?",
                    str(a.pid) if a.pid else "-",
                    a.state,
                    _fmt_rate(pk),
                    _fmt_rate(busy, pct=True) if a.counts else "-",
                    str(a.failed) if a.counts else "-",
                    "?" if a.depth is None else f"{a.depth}/{a.capacity}",
                    a.reason or "",
                ],
            )
        )
    sorters: dict[str, Callable[[tuple[AgentRow, Any, Any, list[str]]], Any]] = {
        "p": lambda r: -(r[1] or 0),
        "b": lambda r: -(r[2] or 0),
        "f": lambda r: -r[0].failed,
        "d": lambda r: -(r[0].depth or 0),
        "n": lambda r: r[0].label,
    }
    rows.sort(key=sorters.get(sort, sorters["p"]))
    lines.append(f"agents ({len(rows)})")
    lines += _table(
        ["label", "kind", "pid", "state", "pkt/s", "busy", "failed", "depth", "last failure"],
        [r[3] for r in rows],
    )
    lines.append("")
    prow = [
        [str(p.index), str(p.pid) if p.pid else "-", p.label or "-", p.kind or "-", p.state]
        + [
            f"pid {p.recovered_pid} by {p.recovered_by} at "
            + time.strftime("%H:%M:%S", time.localtime(p.recovered_ns / 1e9))
            if p.recovered_pid
            else ""
        ]
        for p in cur.participants
    ]
    lines.append(f"participants ({sum(p.state != 'free' for p in cur.participants)})")
    lines += _table(["slot", "pid", "label", "kind", "state", "last recovery of the slot"], prow)
    lines.append("")
    old_tl = {x.handle: x.value for x in prev.timelines} if prev is not None and not prev.error else {}
    dt = cur.t - prev.t if prev is not None else 0.0
    trows = []
    for x in cur.timelines[:_MAX_TIMELINES]:
        r = _rate(x.value, old_tl.get(x.handle), dt)
        trows.append([x.name or f"{x.handle:#x}", str(x.value), _fmt_rate(r), x.failure or "-"])
    more = len(cur.timelines) - len(trows)
    lines.append(f"timelines ({len(cur.timelines)}{f', {more} not shown' if more > 0 else ''})")
    lines += _table(["timeline", "value", "/s", "failed"], trows)
    lines.append("")
    lines.append(f"names ({len(cur.names)})")
    lines += [f"  {n}  {h:#x}" for n, h in sorted(cur.names.items())]
    return [ln[:width] for ln in lines]


# ---------------------------------------------------------------------- the live loop


class Monitor:
    """The reading half of ``hostless top``: keeps a view of ``name`` open, reopens it when
    the domain is replaced, and turns every failure into a :class:`Snapshot` with ``error``
    set (it never raises for what the domain holds or whether it exists)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._view: DomainView | None = None
        self._ident: tuple[int, int] | None = None

    def _path(self) -> str:
        from .shm import path_of

        return self.name if "/" in self.name else path_of(self.name)

    def _drop(self) -> None:
        if self._view is not None:
            self._view.close()
        self._view, self._ident = None, None

    def close(self) -> None:
        self._drop()

    def read(self) -> Snapshot:
        now = time.monotonic()
        label = os.path.basename(self.name)
        path = self._path()
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._drop()
            return Snapshot(t=now, name=label, error=f"{path}: no such domain (removed?); waiting for it")
        except OSError as e:
            self._drop()
            return Snapshot(t=now, name=label, error=f"{path}: {e.strerror or e}")
        if self._view is not None and (
            self._ident != (st.st_dev, st.st_ino) or os.fstat(self._view._fd).st_size != self._view.size
        ):
            self._drop()  # replaced by another file, or resized under the mapping: do not read it
        if self._view is None:
            try:
                self._view = open_view(path)
            except (CorruptDomain, OSError, ValueError) as e:
                return Snapshot(t=now, name=label, error=f"cannot read the domain: {e}")
            self._ident = (st.st_dev, st.st_ino)
        try:
            snap = snapshot(self._view, now)
        except Exception as e:  # shared memory written by anyone: never a crash of the view
            self._drop()
            return Snapshot(
                t=now, name=label, error=f"the domain could not be read ({type(e).__name__}: {e})"
            )
        if self._view.truncated:  # read zeros past the file's new end: not the domain
            self._drop()
            return Snapshot(t=now, name=label, error=f"{path} was truncated under the view")
        return snap


def main(name: str, interval: float = 0.25, iterations: int | None = None) -> int:
    """Run the curses view of ``name`` until ``q`` or Ctrl-C (or ``iterations`` refreshes)."""
    import curses

    mon = Monitor(name)

    def loop(scr: Any) -> None:
        try:
            curses.curs_set(0)
        except curses.error:  # a terminal that cannot hide the cursor
            pass
        scr.timeout(int(interval * 1000))
        sort, prev, n = "p", None, 0
        while iterations is None or n < iterations:
            cur = remember(mon.read(), prev)
            hgt, wid = scr.getmaxyx()
            scr.erase()
            for y, line in enumerate(render(cur, prev, sort=sort, width=max(wid - 1, 1))[: max(hgt - 1, 1)]):
                try:
                    scr.addstr(y, 0, line)
                except curses.error:  # a character the terminal cannot show, or the last cell
                    pass
            scr.refresh()
            prev = cur if not cur.error else None
            n += 1
            key = scr.getch()
            if key in (ord("q"), ord("Q")):
                return
            if 0 <= key < 256 and chr(key) in SORT_KEYS:
                sort = chr(key)

    try:
        curses.wrapper(loop)
    except KeyboardInterrupt:
        pass
    finally:
        mon.close()
    return 0
