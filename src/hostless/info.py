"""What ``hostless info`` shows: a domain's participants, objects, heap,
names and error records, as a JSON-able dict (:func:`domain_info`), from a
joined :class:`~hostless.Domain` or from a :class:`~hostless.view.DomainView`
(read without joining: what the command uses)."""

from __future__ import annotations

import datetime as _dt
import os
from typing import Any

import numpy as np

from . import lowlevel, records
from ._abi import FENCE_DTYPE, C
from .status import Status
from .view import DomainView

__all__ = ["domain_info"]

_STATE_NAMES = {0: "free", 1: "alloc", 2: "live", 3: "dying"}
_KIND_NAMES = {1: "fence", 2: "timeline", 3: "merged", 4: "buffer", 5: "queue"}


def _iso(ns: int) -> str | None:
    """A CLOCK_REALTIME stamp from the domain as ISO text (None when 0 or nonsense)."""
    if not ns:
        return None
    try:
        return _dt.datetime.fromtimestamp(ns / 1e9, _dt.timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):
        return f"invalid ({ns:#x})"


def _status_name(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return f"INVALID_{code}"


def domain_info(dom: Any) -> dict[str, Any]:
    """Everything ``hostless info`` shows, as a JSON-able dict.

    ``objects`` counts fence-table slots by kind and state; ``live`` breaks the
    live ones down by completion (fences: ACTIVE or their status; timelines:
    active or failed with a status).  ``heap`` holds the shared heap's figures
    (``Domain.heap_stats``: size, used, free, largest_free, free_runs,
    fragmentation, allocs, repairs; bytes), ``buffers``, the number of
    live host buffers, and ``metadata_only`` (the small heap of a domain
    created with device heaps and no heap: it holds only device buffers'
    metadata); ``{"size": 0}`` for a domain without a heap.
    ``device_heaps`` lists each device heap (``lowlevel.device_heaps``: name,
    size, granule, used, free, largest_free, allocs, repairs) with
    ``buffers``, the live buffers placed in it, and ``gpu_here``: whether a GPU
    of that ordinal exists on this machine (a heap is declared in the file; only
    a GPU backs it with memory).
    """
    h = dom.header()
    ro = isinstance(dom, DomainView)
    # the layout validated at attach (or when the view was made): the shared header may have been rewritten
    view = dom.layout if ro else lowlevel.layout(dom)
    raw = dom.raw()
    fcap = int(view["fence_capacity"])
    table = np.frombuffer(raw, dtype=FENCE_DTYPE, count=fcap, offset=int(view["fences_offset"])).copy()
    ctl = table["ctl"].astype(np.uint64)
    state = (ctl & np.uint64(0xFF)).astype(np.int64)
    kind = ((ctl >> np.uint64(24)) & np.uint64(0xFF)).astype(np.int64)
    words = table["word"].astype(np.uint64)

    objects: dict[str, dict[str, int]] = {}
    for st_code, st_name in _STATE_NAMES.items():
        if st_name == "free":
            continue
        sel = state == st_code
        for k_code, k_name in _KIND_NAMES.items():
            n = int(np.count_nonzero(sel & (kind == k_code)))
            if n:
                objects.setdefault(k_name, {})[st_name] = n
    free = int(np.count_nonzero(state == 0))
    heap = _heap_info(dom)
    if heap["size"]:
        heap["buffers"] = int(np.count_nonzero((state == int(C.SLOT_LIVE)) & (kind == int(C.KIND_BUFFER))))

    place = (table["err"].astype(np.uint64) & np.uint64(0xFF)).astype(np.int64)
    dev_bufs = (state == int(C.SLOT_LIVE)) & (kind == int(C.KIND_BUFFER))
    found = dom.device_heaps() if ro else [dh._asdict() for dh in lowlevel.device_heaps(dom)]
    device_heaps = [
        {
            **dh,
            "buffers": int(np.count_nonzero(dev_bufs & (place == int(dh["heap_index"]) + 1))),
            "gpu_here": gpu_present(int(dh["ordinal"])),
        }
        for dh in found
    ]
    dev_names = {int(d["heap_index"]): str(d["name"]) for d in device_heaps}
    if heap["size"]:
        heap["buffers"] -= sum(int(d["buffers"]) for d in device_heaps)  # host-placed ones

    live: dict[str, dict[str, int]] = {}
    failed_bit = int(C.TIMELINE_FAILED)
    for i in np.nonzero(state == int(C.SLOT_LIVE))[0]:
        k = _KIND_NAMES.get(int(kind[i]), f"kind{int(kind[i])}")
        w = int(words[i])
        if k == "buffer" and place[i]:
            key = f"in {dev_names.get(int(place[i]) - 1, 'a device heap')}"
        elif k in ("buffer", "queue"):
            key = "in the heap"
        elif k == "timeline":
            key = f"failed {_status_name(w & 0xFFFFFFFF)}" if w & failed_bit else "active"
        else:
            key = "ACTIVE" if w == 0 else _status_name(w)
        bucket = live.setdefault(k, {})
        bucket[key] = bucket.get(key, 0) + 1

    me = dom.participant_id
    parts = [
        {
            "id": p.id,
            "index": p.index,
            "pid": p.pid,
            "label": p.label,
            "kind": p.kind,
            "state": p.state,
            "joined": _iso(p.joined_ns),
            "this_cli": p.id == me,
        }
        for p in dom.participants
    ]
    return {
        "name": dom.name,
        "abi_version": int(h["abi_version"]),
        "total_size": int(view["size"]),
        "created": _iso(int(h["created_ns"])),
        "poll_interval_s": int(view["poll_ns"]) / 1e9,
        "tag": int(h["tag"]),
        "epoch": int(h["epoch"]),
        "recovered": int(h["stats_recovered"]),
        "capacity": dom.capacity,
        "participants": parts,
        "objects": objects,
        "free_slots": free,
        "live": live,
        "heap": heap,
        "device_heaps": device_heaps,
        "names": {
            n: {"handle": hex(h), "kind": _KIND_NAMES.get((h >> 48) & 0xFF, "?")}
            for n, h in dom.names().items()
        },
        "errors": _error_records(dom),
    }


def gpu_present(ordinal: int) -> bool:
    """Whether GPU ``ordinal`` exists on this machine (its NVIDIA device node), without
    initialising CUDA: a device heap is only bookkeeping in the domain file, and one that no
    GPU here can back is reported as declared, not as memory."""
    return os.path.exists(f"/dev/nvidia{int(ordinal)}")


def _error_records(dom: Any) -> dict[str, str]:
    """Failed object (hex handle) -> the text its failer recorded (hostless.records)."""
    out = {}
    for n in dom.names():
        if n.startswith(records.PREFIX):
            h = int(n[len(records.PREFIX) :], 16)
            text = dom.record(h) if isinstance(dom, DomainView) else records.read(dom, h)
            if text is not None:
                out["0x" + n[len(records.PREFIX) :]] = text
    return out


def _heap_info(dom: Any) -> dict[str, Any]:
    st = dom.heap_stats()
    if not st.get("size"):
        return {"size": 0}
    keys = ("size", "used", "free", "largest_free", "free_runs", "fragmentation", "allocs", "repairs")
    out: dict[str, Any] = {k: (float(st[k]) if k == "fragmentation" else int(st[k])) for k in keys}
    ro = isinstance(dom, DomainView)
    out["metadata_only"] = dom.meta_heap if ro else bool(dom._core.info()["meta_heap"])
    return out
