"""Trace export: the domain's trace ring as a Chrome / Perfetto JSON timeline.

Every packet (enqueue, start, end) and every fence / timeline signal is
recorded with a CLOCK_MONOTONIC timestamp in the trace ring (create the domain
with ``trace="4M"``).  :func:`export` writes ``{"traceEvents": [...]}``: one
track per participant (named from the participant table), a slice per packet
run (async ``b``/``e`` events, since packets overlap across agents), instant
events for enqueues and signals, and flow arrows from each enqueue to the
start of the same packet on its consumer.  Open it in ui.perfetto.dev.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from . import lowlevel
from ._abi import C
from .domain import Domain

__all__ = ["events", "export", "to_chrome"]

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


def events(dom: Domain) -> list[dict[str, int]]:
    """The valid events of the ring, oldest first (torn or overwritten ones are dropped)."""
    v = lowlevel.layout(dom)  # the layout validated at attach, never the shared header
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
        out.append({k: int(e[k]) for k in _FIELDS})
    out.sort(key=lambda e: e["ts"])
    return out


def to_chrome(dom: Domain, evs: list[dict[str, int]] | None = None) -> dict[str, Any]:
    """The Chrome trace-event JSON object for the domain's trace."""
    evs = events(dom) if evs is None else evs
    names = {p.index: f"{p.label} ({p.kind}, pid {p.pid})" for p in dom.participants}
    out: list[dict[str, Any]] = []
    for idx in sorted({e["part"] for e in evs}):
        out.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": 1,
                "tid": idx,
                "args": {"name": names.get(idx, f"participant {idx}")},
            }
        )
    out.append({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "hostless domain"}})
    t0 = evs[0]["ts"] if evs else 0
    # The core stamps an enqueue after it published the packet (and retook the
    # GIL), so a consumer can start it "before" its enqueue; the flow arrow
    # starts no later than the packet's start (the publish came before both).
    starts = {(e["a"], e["b"]): e["ts"] for e in evs if e["type"] == int(C.EV_START)}
    for e in evs:
        ts = (e["ts"] - t0) / 1000.0
        kind = _NAMES.get(e["type"], "?")
        base = {"pid": 1, "tid": e["part"], "ts": ts, "cat": kind}
        pid = f"{e['a']:#x}:{e['b']}"  # queue handle : packet index
        if kind == "enqueue":
            out.append(
                {
                    **base,
                    "ph": "i",
                    "s": "t",
                    "name": f"enqueue k{e['d']}",
                    "args": {"queue": hex(e["a"]), "index": e["b"]},
                }
            )
            fts = (min(e["ts"], starts.get((e["a"], e["b"]), e["ts"])) - t0) / 1000.0
            out.append({**base, "ts": fts, "cat": "flow", "ph": "s", "name": "dispatch", "id": pid})
        elif kind == "start":
            args = {"queue": hex(e["a"]), "index": e["b"], "kernel": e["d"], "signal": hex(e["c"])}
            out.append({**base, "cat": "packet", "ph": "b", "name": "packet", "id": pid, "args": args})
            out.append({**base, "cat": "flow", "ph": "f", "name": "dispatch", "id": pid, "bp": "e"})
        elif kind == "end":
            out.append(
                {**base, "cat": "packet", "ph": "e", "name": "packet", "id": pid, "args": {"status": e["d"]}}
            )
        elif kind == "signal":
            out.append(
                {
                    **base,
                    "ph": "i",
                    "s": "t",
                    "name": "signal",
                    "args": {"handle": hex(e["a"]), "value": e["b"]},
                }
            )
        else:
            out.append({**base, "ph": "i", "s": "t", "name": kind, "args": {"a": e["a"], "b": e["b"]}})
    return {"traceEvents": out, "displayTimeUnit": "ns"}


def export(dom: Domain, path: str) -> int:
    """Write the trace to ``path``; returns the number of events."""
    obj = to_chrome(dom)
    with open(path, "w") as f:
        json.dump(obj, f)
    return len(obj["traceEvents"])
