"""Corruption planning: the pristine layout of a case's domain (read with ``pread``), and which
field of which instance of a region a case writes (:func:`_plan_target`)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

from hostless._abi import C

from .layout import Struct, _fuzzable, abi_layout


@dataclass
class _Snap:
    """The pristine layout of a case's domain, read with pread() (the fuzzer never maps it)."""

    total: int
    header: dict[str, int]
    objects: dict[str, int]
    """kind -> fence-table slot index of a shared object"""
    parts: dict[str, int]
    """role -> participant index"""
    handles: dict[str, Any]
    heap: dict[str, int]
    buffer_meta: list[int]
    """absolute offsets of the shared buffers' hl_buffer_meta (small, large)"""
    queue_abs: int
    queue: dict[str, int]
    trace: dict[str, int]


def _read_fields(fd: int, st: Struct, base: int) -> dict[str, int]:
    raw = os.pread(fd, st.size, base)
    out: dict[str, int] = {}
    for f in st.fields.values():
        if f.text or f.name.startswith(("reserved", "pad")):
            continue
        for i in range(f.count):
            key = f.name if f.count == 1 else f"{f.name}[{i}]"
            o = f.offset + i * f.size
            out[key] = int.from_bytes(raw[o : o + f.size], "little")
    return out


def _snapshot(path: str, ready: dict[str, dict[str, Any]]) -> _Snap:
    L = abi_layout()
    fd = os.open(path, os.O_RDONLY)
    try:
        total = os.fstat(fd).st_size
        h = _read_fields(fd, L["header"], 0)
        handles = ready["creator"]["handles"]
        objects = {
            "fence": (handles["fences"][3] & 0xFFFFFF) - 1,
            "merged": (handles["merged"] & 0xFFFFFF) - 1,
            "timeline": (handles["timeline"] & 0xFFFFFF) - 1,
            "buffer": (handles["buffers"][0] & 0xFFFFFF) - 1,
            "queue": (handles["queue"] & 0xFFFFFF) - 1,
        }

        def slot(i: int) -> dict[str, int]:
            return _read_fields(fd, L["fence"], h["fences_offset"] + i * L["fence"].size)

        heap = _read_fields(fd, L["heap"], h["heap_offset"])
        data_abs = h["heap_offset"] + heap["data_offset"]
        metas = []
        for bh in handles["buffers"]:
            s = slot((bh & 0xFFFFFF) - 1)
            metas.append(data_abs + s["parents[0]"] * int(C.GRANULE))
        qs = slot(objects["queue"])
        queue_abs = data_abs + qs["word"]
        queue = _read_fields(fd, L["queue"], queue_abs)
        trace = _read_fields(fd, L["trace"], h["trace_offset"]) if h["trace_size"] else {}
    finally:
        os.close(fd)
    parts = {role: int(r["index"]) for role, r in ready.items()}
    return _Snap(total, h, objects, parts, handles, heap, metas, queue_abs, queue, trace)


@dataclass
class _Target:
    """Where a value goes: absolute offset and width, and what it is."""

    region: str
    field: str
    target: str
    offset: int
    size: int
    text: bool
    orig: int
    region_off: int
    region_size: int
    kind: str
    """value class: geometry, counter, ctl, pctl, owner, refs, link, cell, handle, status, text, any"""
    ahead: int | None = None
    """a fence slot resolved at write time: ``alloc_hint + ahead`` (``offset`` is then within the slot)"""
    base: int = 0
    """start of the struct instance (or 64-byte window) that holds the field"""
    span: int = 0
    """its size up to its last fuzzable field (0: no whole-struct corruption)"""
    siblings: tuple[int, ...] = ()
    """other instances of the same struct (absolute offsets), which a whole-struct case may clone"""


_GEOMETRY = {
    "total_size",
    "participants_offset",
    "fences_offset",
    "queues_offset",
    "queues_size",
    "trace_offset",
    "trace_size",
    "heap_offset",
    "heap_size",
    "participant_capacity",
    "fence_capacity",
    "participant_size",
    "fence_size",
    "header_size",
    "bitmap_offset",
    "granules",
    "data_offset",
    "data_size",
    "capacity",
    "cells_offset",
    "packets_offset",
    "packet_size",
    "nbytes",
    "itemsize",
    "ndim",
    "shape",
}
_COUNTERS = {
    "write_index",
    "read_index",
    "write",
    "seq",
    "hint",
    "used_granules",
    "alloc_hint",
    "epoch",
    "completed",
    "doorbell",
    "allocs",
    "repairs",
    "stats_recovered",
    "waiters",
    "space_waiters",
    "doorbell_waiters",
    "participant",
}


def _value_kind(region: str, fname: str) -> str:
    if region == "fence":
        return {
            "ctl": "ctl",
            "refs": "refs",
            "owner": "owner",
            "parents": "link",
            "word": "status",
            "aux": "any",
            "err": "any",
            "wake": "counter",
            "waiters": "counter",
        }.get(fname, "any")
    if region == "participant" and fname == "ctl":
        return "pctl"
    if region == "queue_cells":
        return "cell"
    if region == "queue_packets" and fname in ("args", "signal", "wait"):
        return "handle"
    if fname in ("lock", "consumer"):
        return "owner"
    if fname in _GEOMETRY:
        return "geometry"
    if fname in _COUNTERS:
        return "counter"
    return "any"


def _struct_target(rng: random.Random, region: str, st: Struct, base: int, target: str) -> _Target:
    fname = rng.choice(_fuzzable(st))
    f = st.fields[fname]
    idx = rng.randrange(f.count) if f.count > 1 and not f.text and rng.random() < 0.5 else 0
    off = base + f.offset + idx * f.size
    label = fname if f.count == 1 or f.text else f"{fname}[{idx}]"
    size = f.nbytes if f.text else f.size
    t = _Target(region, label, target, off, size, f.text, 0, 0, 0, _value_kind(region, fname))
    t.base, t.span = base, _span(st)
    return t


def _span(st: Struct) -> int:
    """Bytes of ``st`` up to the end of its last field that is not reserved or padding."""
    return max(st.fields[n].offset + st.fields[n].nbytes for n in _fuzzable(st))


def _plan_target(rng: random.Random, region: str, s: _Snap) -> _Target:
    """Pick field and instance of ``region`` (deterministic in rng and the layout)."""
    L = abi_layout()
    h = s.header
    if region == "header":
        t = _struct_target(rng, region, L["header"], 0, "header")
        t.region_off, t.region_size = 0, int(C.HEADER_SIZE)
        if t.field == "fence_capacity":
            t.region_off, t.region_size = h["fences_offset"], h["fence_capacity"] * L["fence"].size
    elif region == "participant":
        who = rng.choice(["creator", "joiner1", "free"])
        if who not in s.parts:
            who = "free"
        idx = s.parts.get(who, h["participant_capacity"] - 1)
        base = h["participants_offset"] + idx * L["participant"].size
        t = _struct_target(rng, region, L["participant"], base, f"{who} (index {idx})")
        t.siblings = tuple(
            h["participants_offset"] + i * L["participant"].size for i in sorted(s.parts.values()) if i != idx
        )
        t.region_off, t.region_size = (
            h["participants_offset"],
            h["participant_capacity"] * L["participant"].size,
        )
    elif region == "fence":
        kind = rng.choice(["fence", "merged", "timeline", "buffer", "queue", "any", "next", "next"])
        ahead = rng.randrange(1, 4) if kind == "next" else None
        idx = s.objects[kind] if kind in s.objects else rng.randrange(h["fence_capacity"])
        fname_pick = rng.choice(_fuzzable(L["fence"]))
        f = L["fence"].fields[fname_pick]
        pidx = rng.randrange(f.count) if f.count > 1 else 0
        base = h["fences_offset"] + idx * L["fence"].size
        label = fname_pick if f.count == 1 else f"{fname_pick}[{pidx}]"
        t = _Target(
            region,
            label,
            f"{kind} slot {idx}",
            base + f.offset + pidx * f.size,
            f.size,
            False,
            0,
            h["fences_offset"],
            h["fence_capacity"] * L["fence"].size,
            _value_kind(region, fname_pick),
        )
        t.base, t.span = base, L["fence"].size
        t.siblings = tuple(
            h["fences_offset"] + i * L["fence"].size for i in sorted(s.objects.values()) if i != idx
        )
        if ahead is not None:
            t.ahead, t.offset, t.target = ahead, f.offset + pidx * f.size, f"slot alloc_hint+{ahead}"
            t.base = 0
        if fname_pick == "aux" and kind == "buffer":
            t.kind = "geometry"
        if fname_pick == "word" and kind in ("buffer", "queue"):
            t.kind = "geometry"
    elif region == "heap":
        t = _struct_target(rng, region, L["heap"], h["heap_offset"], "heap header")
        t.region_off, t.region_size = h["heap_offset"], h["heap_size"]
    elif region == "heap_bitmap":
        words = max(1, (s.heap["granules"] + 63) // 64)
        i = rng.randrange(words)
        off = h["heap_offset"] + s.heap["bitmap_offset"] + 8 * i
        t = _Target(
            region, f"bitmap[{i}]", "heap bitmap", off, 8, False, 0, h["heap_offset"], h["heap_size"], "refs"
        )
        t.base = h["heap_offset"] + s.heap["bitmap_offset"] + 64 * (i // 8)
        t.span = min(64, 8 * words - 64 * (i // 8))
    elif region == "buffer_meta":
        which = rng.randrange(len(s.buffer_meta))
        t = _struct_target(
            rng, region, L["buffer_meta"], s.buffer_meta[which], ["small buffer", "large buffer"][which]
        )
        t.siblings = tuple(m for m in s.buffer_meta if m != s.buffer_meta[which])
        t.region_off, t.region_size = h["heap_offset"], h["heap_size"]
    elif region == "queue":
        t = _struct_target(rng, region, L["queue"], s.queue_abs, "queue header")
        t.region_off, t.region_size = s.queue_abs, L["queue"].size
    elif region == "queue_cells":
        cap = max(1, s.queue["capacity"])
        i = rng.randrange(cap)
        off = s.queue_abs + s.queue["cells_offset"] + 8 * i
        t = _Target(
            region,
            f"cell[{i}]",
            "queue cells",
            off,
            8,
            False,
            0,
            s.queue_abs,
            s.queue["packets_offset"] + cap * L["packet"].size,
            "cell",
        )
        t.base = s.queue_abs + s.queue["cells_offset"]
        t.span = min(64, 8 * cap)
    elif region == "queue_packets":
        cap = max(1, s.queue["capacity"])
        i = rng.randrange(cap)
        base = s.queue_abs + s.queue["packets_offset"] + i * L["packet"].size
        t = _struct_target(rng, region, L["packet"], base, f"packet {i}")
        first = s.queue_abs + s.queue["packets_offset"]
        t.siblings = tuple(first + j * L["packet"].size for j in range(cap) if j != i)
        t.region_off, t.region_size = s.queue_abs, s.queue["packets_offset"] + cap * L["packet"].size
    elif region == "trace":
        t = _struct_target(rng, region, L["trace"], h["trace_offset"], "trace header")
        t.region_off, t.region_size = h["trace_offset"], h["trace_size"]
    elif region == "trace_event":
        cap = max(1, s.trace.get("capacity", 1))
        i = rng.randrange(min(cap, 64)) if rng.random() < 0.7 else rng.randrange(cap)
        base = h["trace_offset"] + L["trace"].size + i * L["trace_event"].size
        t = _struct_target(rng, region, L["trace_event"], base, f"event {i}")
        first = h["trace_offset"] + L["trace"].size
        t.siblings = tuple(first + j * L["trace_event"].size for j in range(min(cap, 64)) if j != i)
        t.region_off, t.region_size = h["trace_offset"], h["trace_size"]
    else:
        raise ValueError(f"unknown region {region!r}")
    return t
