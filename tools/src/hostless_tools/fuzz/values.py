"""The values a case writes: boundaries, random values, and structured ones by field class
(geometry, counters, control words, owners, links, cells, handles, statuses, dtype strings), and
the truncation plans."""

from __future__ import annotations

import random

from hostless._abi import C

from .plan import _Snap, _Target


def _boundaries(bits: int) -> list[int]:
    top = (1 << bits) - 1
    vals = [0, 1, 2, 3, 7, 8, 63, 64, 255, 256, 4095, 4096, 4097, 0x7FFF, 0x8000, 0xFFFF, 0x10000]
    vals += [2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**48, 2**62, 2**62 + 1, 2**63 - 1, 2**63]
    vals += [2**64 - 4096, 2**64 - 64, 2**64 - 2, 2**64 - 1, top, 1 << (bits - 1)]
    return sorted({v & top for v in vals})


_TEXTS = (b"|V2147483647", b"<U1073741824", b"O", b"<f4\x00junk", b"|S0", b"<c32", b"(2,2)f4", b"M8[Y]")


def _pick_text(rng: random.Random, n: int) -> tuple[bytes, str]:
    choice = rng.randrange(7)
    if choice == 0:
        return bytes(rng.randrange(1, 256) for _ in range(n)), "random bytes, no NUL"
    if choice == 1:
        return b"\xff" * n, "all 0xff"
    text = rng.choice(_TEXTS)
    return text[:n].ljust(n, b"\x00"), f"string {text!r}"


def _pick_value(rng: random.Random, t: _Target, s: _Snap) -> tuple[int | bytes, str]:
    """(value, how it was chosen) for target ``t``."""
    if t.text:
        return _pick_text(rng, t.size)
    v, how = _pick_int(rng, t, s)
    return v & ((1 << (8 * t.size)) - 1), how


def _pick_int(rng: random.Random, t: _Target, s: _Snap) -> tuple[int, str]:
    bits = 8 * t.size
    top = (1 << bits) - 1
    kind = t.kind
    r = rng.random()
    if r < 0.30 or kind == "any":
        b = rng.choice(_boundaries(bits))
        if kind == "any" and rng.random() < 0.3:
            return rng.getrandbits(bits), "random"
        return b, f"boundary {b:#x}"
    if r < 0.40:
        return rng.getrandbits(bits), "random"
    if r < 0.50:
        mode = rng.randrange(5)
        o = t.orig
        flip = 1 << rng.randrange(bits)
        derived = [o + 1, o - 1, o ^ flip, o + 4096, ~o][mode]
        return derived, ["orig+1", "orig-1", "orig with one bit flipped", "orig+4096", "~orig"][mode]
    tag = s.header["tag"]
    fcap = s.header["fence_capacity"]
    pcap = s.header["participant_capacity"]
    opts: list[tuple[int, str]]
    if kind == "geometry":
        opts = [
            (s.total, "total_size"),
            (s.total + 1, "total_size+1"),
            (s.total - 8, "total_size-8"),
            (s.total + 4096, "total_size+4096"),
            (t.region_size, "region size"),
            (t.region_size + 1, "region size+1"),
            (t.region_size + 64, "region size+64"),
            (t.region_off + t.region_size, "region end"),
            ((1 << 64) - t.region_off, "2^64 - region offset (overflows when added)"),
            ((1 << 64) - t.region_off - t.region_size + 64, "2^64 - region end + 64"),
            ((1 << 64) - s.total, "2^64 - total_size"),
            (1 << 40, "2^40"),
            ((1 << 63) - 4096, "2^63-4096"),
            (t.orig * 2, "orig*2"),
            (t.orig * 4096, "orig*4096"),
        ]
        return rng.choice(opts)
    if kind == "counter":
        o = t.orig
        opts = [
            (o + (1 << 32), "orig+2^32"),
            (o + 8, "orig+8"),
            (o - 8, "orig-8"),
            (top, "max"),
            ((1 << 48) - 1, "2^48-1"),
            (o + (1 << 63), "orig+2^63"),
            (1 << 47, "2^47"),
        ]
        return rng.choice(opts)
    if kind == "ctl":
        gen = rng.choice([0, 1, rng.getrandbits(32), 0xFFFFFFFF, 0x1000000])
        k = rng.randrange(8)
        pidx = rng.choice([0, 1, pcap - 1, pcap, 63, 64, 255])
        st = rng.randrange(6)
        return (gen << 32) | (k << 24) | (
            pidx << 8
        ) | st, f"CTL(gen={gen:#x}, kind={k}, pidx={pidx}, state={st})"
    if kind == "pctl":
        inc = rng.choice([0, 1, rng.getrandbits(32), 0xFFFFFFFF])
        rec = rng.choice([0, 1, pcap - 1, pcap, 255])
        st = rng.randrange(5)
        return (inc << 16) | (rec << 8) | st, f"PCTL(inc={inc:#x}, rec={rec}, state={st})"
    if kind == "owner":
        inc = rng.choice([0, 1, 0xFFFFFF, rng.getrandbits(24)])
        idx = rng.choice([0, 1, pcap - 1, pcap, 63, 64, 254, 255])
        for role in sorted(s.parts):  # a live participant's own code: a lock or queue it never took
            if rng.random() < 0.2:
                pi = s.parts[role]
                return (1 << 8) | (pi + 1), f"OWNER(inc=1, idx={pi} = {role})"
        return ((inc & 0xFFFFFF) << 8) | ((idx + 1) & 0xFF), f"OWNER(inc={inc:#x}, idx={idx})"
    if kind == "refs":
        opts = [
            (1 << rng.randrange(64), "one bit"),
            (top, "all bits"),
            ((1 << pcap) | 1, "bit past the capacity"),
            (1 << 63, "bit 63"),
            (rng.getrandbits(64), "random bits"),
        ]
        return rng.choice(opts)
    if kind == "link":
        pos = rng.choice([0, 1, 31, 32, 127])
        gen = rng.getrandbits(24)
        idx = rng.choice([0, fcap - 1, fcap, fcap + 1, (1 << 24) - 1, (1 << 32) - 2])
        return (pos << 56) | (gen << 32) | ((idx + 1) & 0xFFFFFFFF), f"LINK(pos={pos}, index={idx})"
    if kind == "status":
        words = [
            0, 1, 2, 3, 4, 5, 6, 7, 63, 64, 0xFFFFFFFF, 1 << 32, int(C.TIMELINE_FAILED) | 3,
            int(C.TIMELINE_MAX), int(C.TIMELINE_FAILED), 1 << 63, top,
        ]  # fmt: skip
        w = rng.choice(words)
        return w, f"word {w:#x}"
    if kind == "cell":
        wi = s.queue.get("write_index", 0)
        cap = max(1, s.queue.get("capacity", 1))
        seq = rng.choice([wi, wi + 1, wi - 1, wi + cap, wi - cap, (1 << 48) - 1, 0])
        prod = rng.choice([0, 1, pcap, 255])
        st = rng.randrange(6)
        return (seq << 16) | (prod << 8) | st, f"CELL(seq={seq}, producer={prod}, state={st})"
    if kind == "handle":
        h = s.handles
        shared = [h["merged"], h["timeline"], h["buffers"][0], h["queue"], h["fences"][1], h["signaled"]]
        if rng.random() < 0.5:
            hv = int(rng.choice(shared))
            return hv, f"handle {hv:#x} of a shared object"
        k = rng.randrange(8)
        idx = rng.choice([0, fcap - 1, fcap, fcap + 1, (1 << 24) - 2])
        gen = rng.getrandbits(24)
        return (tag << 56) | (k << 48) | (gen << 24) | (
            (idx + 1) & 0xFFFFFF
        ), f"HANDLE(kind={k}, index={idx})"
    b = rng.choice(_boundaries(bits))
    return b, f"boundary {b:#x}"


def _truncate_plan(rng: random.Random, s: _Snap) -> tuple[int, str, bool]:
    h = s.header
    opts = [
        (0, "0"),
        (int(C.HEADER_SIZE) - 1, "header size - 1"),
        (int(C.HEADER_SIZE), "header only"),
        (h["fences_offset"], "up to the fence table"),
        (h["fences_offset"] + 64 * 8, "into the fence table"),
        (h["trace_offset"], "up to the trace ring"),
        (h["heap_offset"], "up to the heap"),
        (s.queue_abs, "up to the queue"),
        (s.total - 4096, "last page cut"),
        (s.total - 1, "last byte cut"),
    ]
    size, how = rng.choice(opts)
    restore = rng.random() < 0.3
    return size, how + (", then extended back (zeroed tail)" if restore else ""), restore
