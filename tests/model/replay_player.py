"""One participant of tests/model/test_protocol_replay.py: a process joined to the domain that runs
a model process's API operations on command (forked by a multiprocessing forkserver that
has hostless imported, so that a replay starts its participants in milliseconds)."""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any

import hostless as hl


def play(conn: Connection, name: str, label: str) -> None:
    """Join ``name``, send the participant id, then answer commands (dicts with ``op``)
    with ``{"ok": result}`` or ``{"err": "Type: message"}`` until ``exit``."""
    d = hl.Domain.open(name, label=label, watchdog_interval=0)
    conn.send({"id": d.participant_id})
    objs: dict[str, Any] = {}

    def run(c: dict[str, Any]) -> Any:
        op, var = c["op"], c.get("var")
        if op == "alloc":
            objs[var] = d.timeline() if c["kind"] == "timeline" else d.fence()
            return objs[var].handle
        if op == "import":
            objs[var] = d.import_timeline(c["h"]) if c["kind"] == "timeline" else d.import_fence(c["h"])
            return objs[var].handle
        if op == "merge":
            objs[var] = d.merge([objs[v] for v in c["kids"]])
            return objs[var].handle
        if op == "signal":
            objs[var].signal(hl.Status(c["status"]))
            return None
        if op == "tl_signal":
            objs[var].signal(c["value"])
            return None
        if op == "wait":
            o = objs.get(var)
            if o is None:
                return "skipped"  # its import failed: nothing to wait for (the model's rule)
            st = o.wait(c["thr"], 30) if isinstance(o, hl.Timeline) else o.wait(30)
            return st.name
        if op == "release":
            o = objs.pop(var, None)
            if o is None:
                return "skipped"
            o.release()
            return None
        if op == "status":
            return objs[var].status.name
        if op in ("sweep", "recover"):
            return d.reap()
        if op == "loop":  # reap again and again until the next command (read as "stop")
            n = 0
            while not conn.poll():
                d.reap()
                n += 1
            conn.recv()
            d.reap()
            return n + 1
        if op == "exit":
            return None
        raise ValueError(f"unknown operation {op!r}")

    while True:
        try:
            c = conn.recv()
        except EOFError:
            break
        try:
            out = {"ok": run(c)}
        except Exception as e:
            out = {"err": f"{type(e).__name__}: {e}"}
        conn.send(out)
        if c["op"] == "exit":
            break
    d.close()
