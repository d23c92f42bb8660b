"""Recovery and the invariant checker.

Recovery itself runs in the C core (``core/recovery.c: hle_reap_all``) because it must be
made of the same single atomic steps as every other operation.  The rules:

* Each live participant holds an OFD lock on one byte of the domain file; the
  kernel drops it when the process dies, so "lock free while the slot says
  ALIVE" is death, with no pid-reuse ambiguity.
* Any participant that notices (its watchdog thread every 20 ms by default,
  ``Domain.reap()``, or a join that finds the table full) claims the dead slot
  with one CAS (ALIVE -> RECOVERING(me)), then for every fence slot: frees
  slots the dead one was initialising, finishes or rolls back a release it was
  in the middle of, signals OWNER_DIED on ACTIVE fences it owned (timelines
  fail with OWNER_DIED), and drops its reference bit (freeing slots nobody
  holds any more).  Then the participant slot becomes FREE.
* Every step is idempotent: a recoverer that dies is itself dead, and the next
  recoverer repeats the work.
* A participant that leaves (``Domain.close``) recovers itself the same way,
  except that what it owned completes with OWNER_LEFT: leaving is not dying.
  A timeline's points reached before its failure stay SUCCESS either way
  (docs/abi.md sections 3 and 8).

This module holds the checker: it reads a snapshot of the tables and lists
every violated invariant.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from . import _core
from ._abi import FENCE_DTYPE, HEADER_DTYPE, PARTICIPANT_DTYPE, C

__all__ = ["check_tables", "check_heap", "check_device_heap", "split_findings"]

_DEAD = re.compile(
    r"^participant (\d+)(?: \(pid \d+\) is dead and not recovered|: recovery stuck| is still being recovered)"
)
_DEAD_REFS = re.compile(r"^fence slot \d+ is referenced by dead or absent participants (0x[0-9a-f]+)$")
_DEAD_TRANSIENT = re.compile(r"^fence slot \d+ is stuck in a transient state \d+ \(participant (\d+)\)$")
_DEAD_OWNER = re.compile(r"^fence slot \d+ is ACTIVE but its owner (\d+) is gone \(not recovered\)$")


def split_findings(findings: list[str]) -> tuple[list[str], list[str]]:
    """(unreaped, corrupt): the findings of :func:`check_tables` that a dead participant not
    recovered yet explains (itself, references it still holds, a slot it left ALLOC or DYING,
    an ACTIVE fence it owned), which ``reap`` repairs; and every other one (corruption, or an
    operation in flight elsewhere).  A finding names a participant that is not dead-unrecovered
    stays in ``corrupt``."""
    dead = {int(m.group(1)) for f in findings if (m := _DEAD.match(f))}
    unreaped: list[str] = []
    corrupt: list[str] = []
    for f in findings:
        ok = bool(_DEAD.match(f))
        if not ok and (m := _DEAD_REFS.match(f)):
            mask = int(m.group(1), 16)
            ok = bool(dead) and all(mask >> i & 1 == 0 or i in dead for i in range(64))
        elif not ok and (m := _DEAD_TRANSIENT.match(f) or _DEAD_OWNER.match(f)):
            ok = int(m.group(1)) in dead
        (unreaped if ok else corrupt).append(f)
    return unreaped, corrupt


def _status_ok(w: int) -> bool:
    return bool(_core.status_valid(w))


_LAYOUT_FIELDS = ("participant_capacity", "participants_offset", "fence_capacity", "fences_offset", "poll_ns")


def check_tables(
    buf: bytes,
    lock_held: Callable[[int], bool],
    me: int,
    heap: tuple[bytes, bytes, int, int] | None = None,
    view: dict[str, int] | None = None,
    device_heaps: list[tuple[str, int, tuple[bytes, bytes, int, int]]] | None = None,
) -> list[str]:
    """Return every invariant violation in a snapshot ``buf`` of a domain.

    ``view`` is the layout this participant validated when it attached
    (``Core.view()``): the tables are read where it says, and a shared header
    that no longer matches it is reported (a participant rewrote it), never
    followed.  Without it (a file checked offline) the header is validated
    here.  ``heap`` is ``(bitmap, slot table, used granules, granules)``
    copied under the heap lock (``Core.heap_snapshot``); with it the heap is
    checked too.  ``device_heaps`` holds ``(name, granule, snapshot)`` for each
    device heap, in index order, each snapshot taken under that heap's lock.
    """
    out: list[str] = []
    if len(buf) < int(C.HEADER_SIZE):
        return [f"domain is {len(buf)} bytes, smaller than a header"]
    h = np.frombuffer(buf, dtype=HEADER_DTYPE, count=1)[0]
    if int(h["magic"]) != int(C.MAGIC) or int(h["abi_version"]) != int(C.ABI_VERSION):
        out.append("header magic or ABI version is wrong")
        if view is None:
            return out
    if int(h["total_size"]) != len(buf):
        out.append(f"header total_size {int(h['total_size'])} != mapping size {len(buf)}")
        if view is None:
            return out
    if view is not None:
        for name in _LAYOUT_FIELDS:
            if int(h[name]) != int(view[name]):
                out.append(f"header {name} is {int(h[name])}, was {int(view[name])} at attach (rewritten)")
        pcap, fcap = int(view["participant_capacity"]), int(view["fence_capacity"])
        poff, foff = int(view["participants_offset"]), int(view["fences_offset"])
    else:
        pcap, fcap = int(h["participant_capacity"]), int(h["fence_capacity"])
        poff, foff = int(h["participants_offset"]), int(h["fences_offset"])
    if not (0 < pcap <= int(C.MAX_PARTICIPANTS)) or poff + pcap * int(C.PARTICIPANT_SIZE) > len(buf):
        return [*out, "participant table lies outside the domain"]
    if not (0 < fcap <= int(C.MAX_FENCES)) or foff + fcap * int(C.FENCE_SIZE) > len(buf):
        return [*out, "fence table lies outside the domain"]
    parts = np.frombuffer(buf, dtype=PARTICIPANT_DTYPE, count=pcap, offset=poff)
    fences = np.frombuffer(buf, dtype=FENCE_DTYPE, count=fcap, offset=foff)

    alive_mask = 0
    alive_inc: dict[int, int] = {}
    for i in range(pcap):
        pctl = int(parts[i]["ctl"])
        st = pctl & 0xFF
        if st == int(C.PART_FREE):
            continue
        if st == int(C.PART_ALIVE):
            if i == me or lock_held(i):
                alive_mask |= 1 << i
                alive_inc[i] = (pctl >> 16) & 0xFFFFFF
            else:
                out.append(f"participant {i} (pid {int(parts[i]['pid'])}) is dead and not recovered")
        elif st == int(C.PART_RECOVERING):
            if lock_held(i):
                out.append(f"participant {i} is still being recovered (a live recoverer holds its lock)")
            else:
                out.append(
                    f"participant {i}: recovery stuck (its recoverer died); the next reap() takes it over"
                )
        else:
            out.append(f"participant {i} has an invalid state {st}")

    ctl = fences["ctl"].astype(np.uint64)
    state = (ctl & np.uint64(0xFF)).astype(np.int64)
    kind = ((ctl >> np.uint64(24)) & np.uint64(0xFF)).astype(np.int64)
    gen24 = ((ctl >> np.uint64(32)) & np.uint64(0xFFFFFF)).astype(np.int64)
    refs = fences["refs"]
    words = fences["word"]
    tl_failed = int(C.TIMELINE_FAILED)

    bad_state = np.nonzero(state > int(C.SLOT_DYING))[0]
    for bi in bad_state:
        out.append(f"fence slot {bi} has an invalid state {int(state[bi])}")
    for ti in np.nonzero((state == int(C.SLOT_ALLOC)) | (state == int(C.SLOT_DYING)))[0]:
        pidx = (int(ctl[ti]) >> 8) & 0xFF
        out.append(f"fence slot {ti} is stuck in a transient state {int(state[ti])} (participant {pidx})")
    for fi in np.nonzero((state == int(C.SLOT_FREE)) & (refs != 0))[0]:
        out.append(f"free fence slot {fi} still has references {int(refs[fi]):#x}")

    pending: dict[int, int] = {}
    live = np.nonzero(state == int(C.SLOT_LIVE))[0]
    for ii in live:
        i = int(ii)
        r, k, w = int(refs[i]), int(kind[i]), int(words[i])
        if r == 0:
            out.append(f"live fence slot {i} has no reference (leaked)")
        if r & ~alive_mask:
            out.append(f"fence slot {i} is referenced by dead or absent participants {r & ~alive_mask:#x}")
        if k in (int(C.KIND_BUFFER), int(C.KIND_QUEUE)):
            continue  # checked by check_heap
        if k not in (int(C.KIND_FENCE), int(C.KIND_TIMELINE), int(C.KIND_MERGED)):
            out.append(f"fence slot {i} has an invalid kind {k}")
            continue
        if k == int(C.KIND_TIMELINE):
            if w & tl_failed and (w & ~tl_failed) > 0xFFFFFFFF:
                out.append(f"timeline slot {i} has an invalid failure word {w:#x}")
            if w & tl_failed and not _status_ok(w & 0xFFFFFFFF):
                out.append(f"timeline slot {i} failed with an invalid status {w & 0xFFFFFFFF}")
        elif w and not _status_ok(w):
            out.append(f"fence slot {i} holds an invalid status word {w:#x}")
        owner = int(fences[i]["owner"])
        if owner:
            oi, oinc = (owner & 0xFF) - 1, owner >> 8
            active = (w == 0) if k != int(C.KIND_TIMELINE) else not (w & tl_failed)
            if not (0 <= oi < pcap):
                out.append(f"fence slot {i} names an owner slot {oi} outside the table")
            elif active and alive_inc.get(oi) != oinc:
                out.append(f"fence slot {i} is ACTIVE but its owner {oi} is gone (not recovered)")
        if k == int(C.KIND_MERGED):
            aux = int(fences[i]["aux"])
            if (aux >> 32) & 0xFFFFFF != int(gen24[i]):
                out.append(f"merged slot {i} has a pending mask of another generation")
            elif w == 0 and aux & 0xFFFFFFFF == 0:
                out.append(f"merged slot {i} has no pending child but is not signaled")
            pending[i] = aux & 0xFFFFFFFF if w == 0 else 0
        if k == int(C.KIND_TIMELINE):
            continue  # a timeline's parents[0] heads its watch list (docs/abi.md 5a): no links
        for raw_link in fences[i]["parents"]:
            link = int(raw_link)
            if not link or link >> 63:
                continue  # bit 63: a watch node's next (docs/abi.md 5a), not a link
            p = (link & 0xFFFFFFFF) - 1
            if not 0 <= p < fcap:
                out.append(f"fence slot {i} links to a parent {p} outside the table")
    # every pending child bit of an unsignaled merged fence must belong to an
    # ACTIVE child that still links to it
    if pending:
        covered: dict[int, int] = {p: 0 for p in pending}
        for ii in live:
            i = int(ii)
            if int(kind[i]) == int(C.KIND_TIMELINE):
                continue
            for raw_link in fences[i]["parents"]:
                link = int(raw_link)
                if not link or link >> 63:
                    continue
                p = (link & 0xFFFFFFFF) - 1
                if p in covered and (link >> 32) & 0xFFFFFF == int(gen24[p]):
                    bit = 1 << ((link >> 56) & 0x7F)
                    if int(words[i]) == 0:
                        covered[p] |= bit
                    elif pending[p] & bit:
                        out.append(f"merged slot {p}: child {i} is signaled but not propagated")
        for p, m in pending.items():
            if m & ~covered[p]:
                out.append(
                    f"merged slot {p} waits for children that no longer exist (mask {m & ~covered[p]:#x})"
                )
    if heap is not None:
        out += check_heap(*heap)
    for i, (name, granule, snap) in enumerate(device_heaps or []):
        out += check_device_heap(i, name, granule, *snap, nheaps=len(device_heaps or []))
    return out


def check_heap(bitmap: bytes, slots: bytes, used: int, granules: int) -> list[str]:
    """Heap invariants: every buffer's block lies in the heap, blocks do not
    overlap, the bitmap marks exactly the blocks and ``used`` counts them."""
    out: list[str] = []
    fences = np.frombuffer(slots, dtype=FENCE_DTYPE)
    ctl = fences["ctl"].astype(np.uint64)
    state = (ctl & np.uint64(0xFF)).astype(np.int64)
    kind = ((ctl >> np.uint64(24)) & np.uint64(0xFF)).astype(np.int64)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")[:granules].astype(bool)
    expect = np.zeros(granules, dtype=bool)
    total = 0
    gran, large = int(C.GRANULE), int(C.LARGE_BUFFER)
    blocks = (kind == int(C.KIND_BUFFER)) | (kind == int(C.KIND_QUEUE))
    for ii in np.nonzero((state != int(C.SLOT_FREE)) & blocks)[0]:
        i = int(ii)
        g, n = int(fences[i]["parents"][0]), int(fences[i]["parents"][1])
        word, nbytes = int(fences[i]["word"]), int(fences[i]["aux"])
        if n == 0:
            if state[i] == int(C.SLOT_LIVE):
                out.append(f"live buffer slot {i} owns no heap block")
            continue
        if g + n > granules:
            out.append(f"buffer slot {i} has a block [{g}, {g + n}) outside the heap ({granules} granules)")
            continue
        if kind[i] == int(C.KIND_BUFFER) and int(fences[i]["err"]) & 0xFF:
            # a device buffer: its block holds only the metadata (check_device_heap does its data)
            if n * gran < int(C.BUFFER_META_SIZE):
                out.append(f"device buffer slot {i}: its block [{g}, {g + n}) cannot hold the metadata")
        else:
            head = 4096 if nbytes >= large else int(C.BUFFER_META_SIZE)
            if word != g * gran + head or nbytes > n * gran - head:
                out.append(f"buffer slot {i}: data offset {word} / size {nbytes} do not fit its block")
        if expect[g : g + n].any():
            out.append(f"buffer slot {i}: block [{g}, {g + n}) overlaps another buffer")
        expect[g : g + n] = True
        total += n
    return out + _bitmap_findings("heap", bits, expect, used, total)


def _bitmap_findings(what: str, bits: np.ndarray, expect: np.ndarray, used: int, total: int) -> list[str]:
    """A heap's bitmap ``bits`` against the granules its buffers own (``expect``, ``total``)
    and its used counter."""
    out = []
    if (bits & ~expect).any():
        out.append(f"{what} bitmap marks {int((bits & ~expect).sum())} granules that no buffer owns (leak)")
    if (expect & ~bits).any():
        out.append(f"{what} bitmap misses {int((expect & ~bits).sum())} granules owned by buffers")
    if used != total:
        out.append(f"{what} used counter {used} != granules owned by buffers {total}")
    return out


def check_device_heap(
    index: int,
    name: str,
    granule: int,
    bitmap: bytes,
    slots: bytes,
    used: int,
    granules: int,
    nheaps: int = 1,
) -> list[str]:
    """Invariants of device heap ``index`` (``name``, e.g. "cuda:0"): every buffer placed in it
    owns an extent inside it that holds its bytes, extents do not overlap, the bitmap marks
    exactly them and ``used`` counts them; no buffer names a device heap that does not exist."""
    out: list[str] = []
    fences = np.frombuffer(slots, dtype=FENCE_DTYPE)
    ctl = fences["ctl"].astype(np.uint64)
    state = (ctl & np.uint64(0xFF)).astype(np.int64)
    kind = ((ctl >> np.uint64(24)) & np.uint64(0xFF)).astype(np.int64)
    place = (fences["err"].astype(np.uint64) & np.uint64(0xFF)).astype(np.int64)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")[:granules].astype(bool)
    expect = np.zeros(granules, dtype=bool)
    total = 0
    bufs = (state != int(C.SLOT_FREE)) & (kind == int(C.KIND_BUFFER))
    if index == 0:
        for ii in np.nonzero(bufs & (place > nheaps))[0]:
            out.append(f"buffer slot {int(ii)} names device heap {int(place[ii]) - 1}: there is none")
    for ii in np.nonzero(bufs & (place == index + 1))[0]:
        i = int(ii)
        word, nbytes, e = int(fences[i]["word"]), int(fences[i]["aux"]), int(fences[i]["err"])
        n = e >> 8
        if n == 0:
            if state[i] == int(C.SLOT_LIVE):
                out.append(f"live buffer slot {i} owns no extent of device heap {name}")
            continue
        if word % granule:
            out.append(f"buffer slot {i}: device offset {word} is not a multiple of {granule} ({name})")
            continue
        g = word // granule
        if g + n > granules:
            out.append(f"buffer slot {i}: extent [{g}, {g + n}) outside device heap {name} ({granules} g)")
            continue
        if nbytes > n * granule:
            out.append(f"buffer slot {i}: {nbytes} bytes do not fit its extent of {n * granule} B ({name})")
        if expect[g : g + n].any():
            out.append(f"buffer slot {i}: extent [{g}, {g + n}) overlaps another buffer ({name})")
        expect[g : g + n] = True
        total += n
    return out + _bitmap_findings(f"device heap {name}", bits, expect, used, total)
