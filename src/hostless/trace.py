"""Traces: the domain's trace ring, your own spans in it, and its export as a
Chrome / Perfetto JSON timeline.

Every packet (enqueue, start, end) and every fence / timeline signal is
recorded with a CLOCK_MONOTONIC timestamp in the trace ring (create the domain
with ``trace="4M"``).  Add your own with :func:`span` and :func:`instant`::

    with hl.trace.span("detect"):      # a slice on this participant's track
        boxes = detect(frame)
    hl.trace.instant("dropped frame")

:func:`export` writes ``{"traceEvents": [...]}``: one process and track per
participant (each event carries its writer's participant index and
incarnation, so two processes that used the same participant slot one after
the other get a track each), named by its label (also after it left: every
participant records its label in the ring when it joins), a slice per packet
run named after its Graph stage (or its kernel), a slice per wait that had to
wait (``wait <name>``, from its start to its end), instant events for
enqueues and signals, flow arrows from each enqueue to the start of the same
packet on its consumer, and the user's spans and instants.  Objects are named
by :func:`name` records, else by the names they are published under
(``Domain.publish``, read from the name table at export), else by handle.
Open it in ui.perfetto.dev.

The exporter needs no participant slot: ``hostless trace NAME -o out.json``
reads the ring through a read-only :class:`~hostless.view.DomainView`.

Names travel in the ring as ``HL_EV_USER`` records (``a`` = :data:`USER_MAGIC`
| a record type, ``b`` = the key, ``c``..``e`` = up to 24 bytes of UTF-8), so
a trace exported by any process, after the namers left, is still readable.
Like every event they are overwritten when the ring wraps: a ring too small
for a run loses the names recorded at its start (tracks and slices then fall
back to the participant table and to ``k<kernel id>``).  ``HL_EV_USER`` events
whose ``a`` lacks the magic are left to their owners and exported as plain
instants.
"""

from __future__ import annotations

import itertools
import json
import threading
from contextlib import ContextDecorator
from typing import Any

import numpy as np

from . import lowlevel
from ._abi import C
from .domain import Domain, _live
from .kernels import CPU_KERNELS
from .view import DomainView
from .wire import TRACE_INSTANT as _INSTANT
from .wire import TRACE_JOIN as _JOIN
from .wire import TRACE_NAME_HANDLE as _NAME_HANDLE
from .wire import TRACE_NAME_KERNEL as _NAME_KERNEL
from .wire import TRACE_SPAN_BEGIN as _SPAN_BEGIN
from .wire import TRACE_SPAN_END as _SPAN_END
from .wire import USER_MAGIC as USER_MAGIC
from .wire import unpack_text as _unpack

__all__ = ["events", "export", "to_chrome", "track_of", "span", "instant", "name", "USER_MAGIC"]

_EV_USER = int(C.EV_USER)
_trace_user = C.trace_user  # (bound once: spans call it twice each)
_span_ids = itertools.count(1)
_span_lock = threading.Lock()


def _emit(dom: Domain, kind: int, key: int, text: str) -> None:
    if dom.closed or not dom.trace_enabled():
        return
    # one writer of these records: the engine's hle_trace_user (core/records.c)
    C.trace_user(dom._core, kind, key & (2**64 - 1), text.replace("\0", " "))


def _traced_domain(dom: Domain | None) -> Domain | None:
    if dom is not None:
        return dom
    traced = [d for d in list(_live) if not d.closed and d.trace_enabled()]
    if len(traced) > 1:
        raise ValueError(f"{len(traced)} traced domains are open in this process: pass dom=")
    return traced[0] if traced else None


def name(dom: Domain, handle: int, text: str) -> None:
    """Record that the object ``handle`` (a fence, timeline or queue) is
    called ``text``: packets signaling it are named so in the export.  The
    :class:`~hostless.graph.Graph` names each stage's signal this way."""
    _emit(dom, _NAME_HANDLE, handle, text)


def name_kernel(dom: Domain, kernel: int, text: str) -> None:
    """Record that kernel id ``kernel`` is called ``text`` (user kernels get
    their ids at spawn; the built-in ones are named without a record)."""
    _emit(dom, _NAME_KERNEL, kernel, text)


class span(ContextDecorator):  # noqa: N801 (a function to its callers: ``with trace.span(...)``)
    """A slice named ``text`` on this participant's track, from entering the
    block to leaving it (also when it raises).  ``dom`` defaults to the one
    traced domain this process has open; without any, nothing is recorded.
    Spans nest; they may overlap across threads of one participant, and each
    is matched by its own id.  Names longer than 24 bytes are cut.  Also a
    decorator (each call a span of its own).

    Entering and leaving are one call into the engine each (which records
    nothing for a domain closed since, or without a trace ring), so that what
    the span times is its block."""

    __slots__ = ("_arg", "_core", "_text", "_sid")

    def __init__(self, text: str, dom: Domain | None = None) -> None:
        d = _traced_domain(dom)
        self._arg = dom
        self._core = d._core if d is not None else None
        self._text = text.replace("\0", " ")
        self._sid = 0

    def _recreate_cm(self) -> span:  # ContextDecorator: a fresh span for each decorated call
        return span(self._text, self._arg)

    def __enter__(self) -> None:
        if self._core is not None:
            with _span_lock:
                self._sid = sid = next(_span_ids)
            _trace_user(self._core, _SPAN_BEGIN, sid, self._text)

    def __exit__(self, *exc: object) -> None:
        if self._sid:
            _trace_user(self._core, _SPAN_END, self._sid, self._text)


def instant(text: str, dom: Domain | None = None, value: int = 0) -> None:
    """An instant event named ``text`` (with an integer ``value``) on this
    participant's track; ``dom`` as for :func:`span`."""
    d = _traced_domain(dom)
    if d is not None:
        _emit(d, _INSTANT, value, text)


_EV = np.dtype(
    {
        "names": ["seq", "ts", "type", "part", "a", "b", "c", "d", "e"],
        "formats": ["<u8", "<u8", "<u4", "<u4", "<u8", "<u8", "<u8", "<u8", "<u8"],
        "offsets": [0, 8, 16, 20, 24, 32, 40, 48, 56],
        "itemsize": 64,
    }
)
_FIELDS = ("seq", "ts", "type", "part", "a", "b", "c", "d", "e")
_NAMES = {
    int(C.EV_ENQUEUE): "enqueue",
    int(C.EV_START): "start",
    int(C.EV_END): "end",
    int(C.EV_SIGNAL): "signal",
    int(C.EV_WAIT): "wait",
    int(C.EV_USER): "user",
}


def events(dom: Domain | DomainView) -> list[dict[str, int]]:
    """The valid events of the ring, oldest first (torn or overwritten ones are dropped).
    ``part`` is the writer's participant slot index, ``inc`` the low 24 bits of its
    incarnation (the event's participant field is the writer's HL_OWNER code, ABI 6)."""
    # the layout validated at attach (or when the view was made), never the shared header
    v = dom.layout if isinstance(dom, DomainView) else lowlevel.layout(dom)
    off, cap = int(v["trace_offset"]), int(v["trace_capacity"])
    if not off or not cap:
        return []
    raw = np.frombuffer(dom.raw(), dtype=np.uint8, count=64 + 64 * cap, offset=off)
    write = int(raw[16:24].view("<u8")[0])  # shared: used only modulo cap, and at most cap events
    ev = raw[64 : 64 + 64 * cap].view(_EV).copy()
    first = max(0, write - cap)
    out = []
    for i in range(first, write):
        e = ev[i % cap]
        if int(e["seq"]) != i + 1:
            continue
        rec = {k: int(e[k]) for k in _FIELDS}
        who = rec["part"]
        rec["part"], rec["inc"] = (who & 0xFF) - 1, who >> 8  # HL_OWNER(inc, index); 0: no writer
        out.append(rec)
    out.sort(key=lambda e: e["ts"])
    return out


def _kernel_names() -> dict[int, str]:
    return {kid: kname for kname, (kid, _fn) in CPU_KERNELS.items()}


def _track(e: dict[str, int]) -> int:
    """The track (Chrome tid and pid) of an event: its writer, participant slot and
    incarnation (``(inc << 8) | index``: the participant id's low 32 bits)."""
    return ((e.get("inc", 0) & 0xFFFFFF) << 8) | (e["part"] & 0xFF)


def track_of(participant_id: int) -> int:
    """The track of a participant id (``(incarnation << 8) | index``)."""
    return (((participant_id >> 8) & 0xFFFFFF) << 8) | (participant_id & 0xFF)


def to_chrome(dom: Domain | DomainView, evs: list[dict[str, int]] | None = None) -> dict[str, Any]:
    """The Chrome trace-event JSON object for the domain's trace."""
    evs = events(dom) if evs is None else evs
    table = {track_of(p.id): f"{p.label} ({p.kind}, pid {p.pid})" for p in dom.participants}
    kernels = _kernel_names()
    handles: dict[int, str] = {h: n for n, h in dom.names().items() if not n.startswith("!")}  # published
    joined: dict[int, str] = {}  # track -> "label (kind)" of the participant that joined there
    for e in evs:  # names first: a record may come after the events it names
        if e["type"] == _EV_USER and e["a"] & ~0xFF == USER_MAGIC:
            rec, text = e["a"] & 0xFF, _unpack(e["c"], e["d"], e["e"])
            if rec == _NAME_KERNEL:
                kernels[e["b"]] = text
            elif rec == _NAME_HANDLE:
                handles[e["b"]] = text
            elif rec == _JOIN:
                joined[track_of(e["b"])] = text
    out: list[dict[str, Any]] = []
    t0 = evs[0]["ts"] if evs else 0
    # The core stamps an enqueue after it published the packet (and retook the
    # GIL), so a consumer can start it "before" its enqueue; the flow arrow
    # starts no later than the packet's start (the publish came before both).
    starts = {(e["a"], e["b"]): e["ts"] for e in evs if e["type"] == int(C.EV_START)}

    begun: dict[str, str] = {}

    def packet_name(signal: int, kernel: int) -> str:
        return handles.get(signal) or kernels.get(kernel) or f"k{kernel}"

    for e in evs:
        tid = _track(e)  # one process and track per participant (slot and incarnation)
        if e["type"] == _EV_USER and e["a"] & ~0xFF == USER_MAGIC and e["a"] & 0xFF == _JOIN:
            continue
        ts = (e["ts"] - t0) / 1000.0
        kind = _NAMES.get(e["type"], "?")
        base = {"pid": tid, "tid": tid, "ts": ts, "cat": kind}
        pid = f"{e['a']:#x}:{e['b']}"  # queue handle : packet index
        if kind == "enqueue":
            args = {"queue": hex(e["a"]), "index": e["b"], "kernel": e["d"], "signal": hex(e["c"])}
            out.append(
                {**base, "ph": "i", "s": "t", "name": f"enqueue {packet_name(e['c'], e['d'])}", "args": args}
            )
            fts = (min(e["ts"], starts.get((e["a"], e["b"]), e["ts"])) - t0) / 1000.0
            out.append({**base, "ts": fts, "cat": "flow", "ph": "s", "name": "dispatch", "id": pid})
        elif kind == "start":
            args = {"queue": hex(e["a"]), "index": e["b"], "kernel": e["d"], "signal": hex(e["c"])}
            nm = begun[pid] = packet_name(e["c"], e["d"])
            out.append({**base, "cat": "packet", "ph": "b", "name": nm, "id": pid, "args": args})
            out.append({**base, "cat": "flow", "ph": "f", "name": "dispatch", "id": pid, "bp": "e"})
        elif kind == "end":
            nm = begun.pop(pid, "") or handles.get(e["c"]) or "packet"  # the end matches its start's name
            out.append(
                {**base, "cat": "packet", "ph": "e", "name": nm, "id": pid, "args": {"status": e["d"]}}
            )
        elif kind == "wait":  # a wait that waited: a slice from its start (c) to its end
            nm = handles.get(e["a"]) or f"{e['a']:#x}"
            start = max(e["c"], t0)
            args = {"handle": hex(e["a"]), "threshold": e["b"], "word": hex(e["d"])}
            out.append(
                {**base, "ts": (start - t0) / 1000.0, "ph": "X", "dur": (e["ts"] - start) / 1000.0,
                 "name": f"wait {nm}", "args": args}
            )
        elif kind == "signal":
            nm = handles.get(e["a"], "signal")
            args = {"handle": hex(e["a"]), "value": e["b"]}
            out.append(
                {**base, "ph": "i", "s": "t", "name": nm if nm == "signal" else f"signal {nm}", "args": args}
            )
        elif kind == "user" and e["a"] & ~0xFF == USER_MAGIC:
            sub, text = e["a"] & 0xFF, _unpack(e["c"], e["d"], e["e"])
            if sub in (_SPAN_BEGIN, _SPAN_END):
                ph = "b" if sub == _SPAN_BEGIN else "e"
                out.append({**base, "cat": "user", "ph": ph, "name": text, "id": f"span:{tid}:{e['b']}"})
            elif sub == _INSTANT:
                args = {"value": e["b"]}
                out.append({**base, "cat": "user", "ph": "i", "s": "t", "name": text, "args": args})
            # name records were used above
        else:
            out.append({**base, "ph": "i", "s": "t", "name": kind, "args": {"a": e["a"], "b": e["b"]}})
    meta: list[dict[str, Any]] = []
    for tr in sorted({_track(e) for e in evs}):
        # the join record names the participant, also after it left; the participant table only
        # the one there now (a join record may have been overwritten when the ring wrapped)
        idx = tr & 0xFF
        nm = joined.get(tr) or table.get(tr, f"participant {idx} (incarnation {tr >> 8})")
        meta.append({"ph": "M", "name": "process_name", "pid": tr, "args": {"name": nm}})
        meta.append({"ph": "M", "name": "thread_name", "pid": tr, "tid": tr, "args": {"name": nm}})
    return {"traceEvents": meta + out, "displayTimeUnit": "ns"}


def export(dom: Domain | DomainView, path: str) -> int:
    """Write the trace to ``path``; returns the number of events."""
    obj = to_chrome(dom)
    with open(path, "w") as f:
        json.dump(obj, f)
    return len(obj["traceEvents"])
