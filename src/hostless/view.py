"""A domain read without joining it: what ``hostless info``, ``check`` and ``trace`` look at.

:class:`DomainView` opens the file read-only, maps it ``PROT_READ`` and takes no participant
slot, no liveness lock and no reference: the domain is shown as it is, and the tool cannot
change it (a tool that joined took a slot, ran the watchdog's checks, and was itself a
participant in what it showed).  Everything read is shared memory that any participant may
have written: the layout is validated once when the view is made (magic, ABI version, sizes,
every region inside the file) and kept privately, every index and extent read later is
checked against it, and a table that moves while it is read gives a wrong figure, never a
crash.  Liveness comes from the participants' own liveness locks (``F_OFD_GETLK``: asking
takes no lock), as in :mod:`hostless.cleanup`.

The view offers the read side of :class:`~hostless.Domain` that the tools use: ``header()``,
``raw()``, ``layout``, ``participants``, ``names()``, ``heap_stats()``, ``device_heaps()``,
``record(handle)`` and ``check()``.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import stat
import struct
import time
from typing import Any

import numpy as np

from . import _core
from ._abi import DEVHEAP_DTYPE, FENCE_DTYPE, HEADER_DTYPE, PARTICIPANT_DTYPE, C
from .errors import CorruptDomain, DomainVersionMismatch
from .inspection import Participant
from .recovery import check_tables

__all__ = ["DomainView", "open_view"]

_FLOCK = "hhqqi4x"  # struct flock (Linux x86-64 / AArch64): type, whence, start, len, pid
_NAME_CELL = 64
_PREFIX_ERROR = "!error:"


def _u(buf: Any, off: int, n: int) -> int:
    return int.from_bytes(bytes(buf[off : off + n]), "little")


class DomainView:
    """One domain file mapped read-only (see the module docstring).  Use as a context manager,
    or call :meth:`close`."""

    participant_id = -1  # not a participant: nothing to mark "this command"

    def __init__(self, path: str, name: str | None = None) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
            if not stat.S_ISREG(st.st_mode):
                raise CorruptDomain(f"{path} is not a regular file")
            hsize = int(C.HEADER_SIZE)
            if st.st_size < hsize:
                raise CorruptDomain(f"{path} is {st.st_size} bytes, smaller than a domain header")
            self._map = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            raise
        # under the SIGBUS guard: a file truncated under the view reads zeros (and is told by
        # `truncated`) instead of killing the process
        self._guard = _core.view_guard(self._map)
        self._fd = fd
        self.path = path
        self.name = name if name is not None else os.path.basename(path)
        self.size = st.st_size
        try:
            self.layout = self._validate()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if self._fd >= 0:
            try:
                self._map.close()
                _core.view_guard_remove(self._guard)
            except BufferError:  # a NumPy view of it is still alive: the GC unmaps it (guarded
                pass  # until the guard's own destructor runs)
            os.close(self._fd)
            self._fd = -1

    @property
    def truncated(self) -> bool:
        """Whether the file was truncated under the view (a read past its new end read zeros:
        what was read since is not the domain)."""
        return bool(_core.view_guard_hit(self._guard))

    def __enter__(self) -> DomainView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ layout
    def _validate(self) -> dict[str, int]:
        h = self.header()
        size = self.size
        if int(h["magic"]) != int(C.MAGIC):
            raise CorruptDomain(f"{self.path} is not a hostless domain (magic {int(h['magic']):#x})")
        if int(h["abi_version"]) != int(C.ABI_VERSION):
            raise DomainVersionMismatch(_core.version_error(str(self.path), int(h["abi_version"])))
        if int(h["ready"]) != 1:
            raise CorruptDomain(f"{self.path} is not initialised (its creator died or is still starting)")
        if int(h["header_size"]) != int(C.HEADER_SIZE) or int(h["total_size"]) != size:
            raise CorruptDomain(f"{self.path}: header sizes do not match the file ({size} bytes)")

        def region(off: int, n: int, what: str) -> None:
            if n and not (int(C.HEADER_SIZE) <= off <= size and n <= size - off):  # by subtraction
                raise CorruptDomain(f"{self.path}: the {what} lies outside the file")

        pcap, fcap = int(h["participant_capacity"]), int(h["fence_capacity"])
        if not 0 < pcap <= int(C.MAX_PARTICIPANTS) or not 0 < fcap <= int(C.MAX_FENCES):
            raise CorruptDomain(f"{self.path}: table capacities out of range")
        lay = {
            "size": size,
            "participant_capacity": pcap,
            "participants_offset": int(h["participants_offset"]),
            "fence_capacity": fcap,
            "fences_offset": int(h["fences_offset"]),
            "poll_ns": int(h["poll_ns"]),
            "heap_offset": int(h["heap_offset"]),
            "heap_size": int(h["heap_size"]),
            "trace_offset": int(h["trace_offset"]),
            "trace_size": int(h["trace_size"]),
            "devheap_offset": int(h["devheap_offset"]),
            "devheap_size": int(h["devheap_size"]),
            "devheap_count": int(h["devheap_count"]),
        }
        region(lay["participants_offset"], pcap * int(C.PARTICIPANT_SIZE), "participant table")
        region(lay["fences_offset"], fcap * int(C.FENCE_SIZE), "fence table")
        region(lay["heap_offset"], lay["heap_size"], "heap")
        region(lay["trace_offset"], lay["trace_size"], "trace ring")
        region(lay["devheap_offset"], lay["devheap_size"], "device-heap region")
        spans = sorted(
            (off, n)
            for off, n in (
                (0, int(C.HEADER_SIZE)),
                (lay["participants_offset"], pcap * int(C.PARTICIPANT_SIZE)),
                (lay["fences_offset"], fcap * int(C.FENCE_SIZE)),
                (lay["heap_offset"], lay["heap_size"]),
                (lay["trace_offset"], lay["trace_size"]),
                (lay["devheap_offset"], lay["devheap_size"]),
            )
            if n
        )
        for (a, n), (b, _m) in zip(spans, spans[1:], strict=False):
            if b - a < n:  # each region ends before the next starts
                raise CorruptDomain(f"{self.path}: the header's regions overlap (a participant rewrote it?)")
        lay["trace_capacity"] = 0
        if lay["trace_size"] >= 64:
            t = lay["trace_offset"]
            cap = _u(self._map, t + int(C.TR_CAPACITY), 8)
            if _u(self._map, t, 8) == int(C.TRACE_MAGIC) and 0 < cap <= (lay["trace_size"] - 64) // 64:
                lay["trace_capacity"] = cap
        return lay

    def header(self) -> Any:
        """The shared header (``HEADER_DTYPE``), read now: for display only."""
        return np.frombuffer(self._map, dtype=HEADER_DTYPE, count=1)[0]

    def raw(self) -> mmap.mmap:
        """The read-only mapping of the whole domain."""
        return self._map

    @property
    def capacity(self) -> dict[str, int]:
        lay = self.layout
        return {
            "fences": lay["fence_capacity"],
            "participants": lay["participant_capacity"],
            "heap": lay["heap_size"],
            "queues": int(self.header()["queues_size"]),
            "trace": lay["trace_size"],
        }

    def trace_enabled(self) -> bool:
        return self.layout["trace_capacity"] > 0

    # ------------------------------------------------------------------ tables
    def fences(self) -> np.ndarray:
        """A copy of the fence table (``FENCE_DTYPE`` records)."""
        lay = self.layout
        table: np.ndarray = np.frombuffer(
            self._map, dtype=FENCE_DTYPE, count=lay["fence_capacity"], offset=lay["fences_offset"]
        ).copy()
        return table

    def lock_held(self, i: int) -> bool:
        """Whether participant slot ``i`` is alive: its liveness lock is held by a writer, or it
        joined without the lock (a reader held it) and its process runs."""
        req = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, int(C.LOCK_BASE) + i, 1, 0)
        ltype = struct.unpack(_FLOCK, fcntl.fcntl(self._fd, fcntl.F_OFD_GETLK, req))[0]
        if ltype == fcntl.F_WRLCK:
            return True
        base = self.layout["participants_offset"] + i * int(C.PARTICIPANT_SIZE)
        if not _u(self._map, base + int(C.P_FLAGS), 4) & int(C.PART_FLAG_PIDLIVE):
            return False
        pid = _u(self._map, base + int(C.P_PID), 4)
        try:
            if 0 < pid < 1 << 31:
                os.kill(pid, 0)
                return True
        except PermissionError:
            return True
        except OSError:
            pass
        return False

    @property
    def participants(self) -> list[Participant]:
        """Every non-free participant slot (as :attr:`Domain.participants`)."""
        lay = self.layout
        table = np.frombuffer(
            self._map,
            dtype=PARTICIPANT_DTYPE,
            count=lay["participant_capacity"],
            offset=lay["participants_offset"],
        ).copy()
        out = []
        for i, p in enumerate(table):
            ctl = int(p["ctl"])
            st = ctl & 0xFF
            if st == int(C.PART_FREE):
                continue
            if st == int(C.PART_RECOVERING):
                s = "recovering"
            elif st == int(C.PART_ALIVE):
                s = "alive" if self.lock_held(i) else "dead"
            else:
                s = f"invalid state {st}"
            base = lay["participants_offset"] + i * int(C.PARTICIPANT_SIZE)
            out.append(
                Participant(
                    id=(((ctl >> 16) & 0xFFFFFFFF) << 8) | i,
                    index=i,
                    pid=int(p["pid"]),
                    start_time=int(p["start_time"]),
                    joined_ns=_u(self._map, base + int(C.P_JOINED_NS), 8),
                    label=bytes(p["label"]).split(b"\0")[0].decode(errors="replace"),
                    kind=bytes(p["kind"]).split(b"\0")[0].decode(errors="replace"),
                    state=s,
                )
            )
        return out

    def _slot_live(self, h: int) -> bool:
        """Whether handle ``h`` names a LIVE slot of its generation and kind here (the rule a
        name-table entry is trusted by, hl_fence_matches)."""
        lay = self.layout
        tag = int(self.header()["tag"])
        idx = (h & 0xFFFFFF) - 1
        if (h >> 56) != tag or not 0 <= idx < lay["fence_capacity"]:
            return False
        ctl = _u(self._map, lay["fences_offset"] + idx * int(C.FENCE_SIZE) + int(C.F_CTL), 8)
        return (
            ctl & 0xFF == int(C.SLOT_LIVE)
            and (ctl >> 24) & 0xFF == (h >> 48) & 0xFF
            and (ctl >> 32) & 0xFFFFFF == (h >> 24) & 0xFFFFFF
        )

    def names(self) -> dict[str, int]:
        """The live entries of the name table: name -> handle (cells read between two reads of
        their ctl; an entry whose object is gone is left out, as lookups do)."""
        out: dict[str, int] = {}
        base = int(C.NAMES_OFFSET) + 64
        for i in range(int(C.MAX_NAMES)):
            off = base + i * _NAME_CELL
            c1 = _u(self._map, off, 8)
            if c1 & 0xFF != int(C.NAME_LIVE):
                continue
            h = _u(self._map, off + 8, 8)
            raw = bytes(self._map[off + 16 : off + 16 + int(C.NAME_MAX)])
            if _u(self._map, off, 8) != c1 or b"\0" not in raw:
                continue  # being written, or no NUL in its cell: not an entry
            if self._slot_live(h):
                out[raw.split(b"\0")[0].decode(errors="replace")] = h
        return out

    # ------------------------------------------------------------------ heaps
    def _pool(self, bitmap_off: int, granules: int, limit: int) -> tuple[int, int, int]:
        """(free granules, largest free run, free runs) of a bitmap at ``bitmap_off`` (checked
        to lie inside ``limit``), read without its lock: a snapshot for display."""
        nbytes = (granules + 63) // 64 * 8
        if not 0 <= bitmap_off <= limit or nbytes > limit - bitmap_off:
            return 0, 0, 0
        bits = np.unpackbits(
            np.frombuffer(self._map, dtype=np.uint8, count=nbytes, offset=bitmap_off), bitorder="little"
        )[:granules]
        free = bits == 0
        if not free.any():
            return 0, 0, 0
        edges = np.diff(np.concatenate(([0], free.astype(np.int8), [0])))
        starts, ends = np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]
        runs = ends - starts
        return int(free.sum()), int(runs.max()), len(runs)

    def heap_stats(self) -> dict[str, int | float]:
        """The shared heap's figures, as :meth:`Domain.heap_stats` (read without its lock)."""
        lay = self.layout
        ho, hs = lay["heap_offset"], lay["heap_size"]
        if not hs or _u(self._map, ho + int(C.HP_MAGIC), 8) != int(C.HEAP_MAGIC):
            return {"size": 0}
        granules = _u(self._map, ho + int(C.HP_GRANULES), 8)
        if granules > hs // int(C.GRANULE):
            return {"size": 0}
        fr, lg, runs = self._pool(ho + _u(self._map, ho + int(C.HP_BITMAP_OFFSET), 8), granules, ho + hs)
        g = int(C.GRANULE)
        return {
            "size": granules * g,
            "used": _u(self._map, ho + int(C.HP_USED_GRANULES), 8) * g,
            "free": fr * g,
            "largest_free": lg * g,
            "free_runs": runs,
            "fragmentation": (1.0 - lg / fr) if fr else 0.0,
            "allocs": _u(self._map, ho + int(C.HP_ALLOCS), 8),
            "repairs": _u(self._map, ho + int(C.HP_REPAIRS), 8),
        }

    @property
    def meta_heap(self) -> bool:
        return bool(_u(self._map, int(C.H_FLAGS), 4) & int(C.FLAG_META_HEAP))

    def device_heaps(self) -> list[dict[str, Any]]:
        """Each device heap's descriptor and figures (as ``lowlevel.device_heaps``)."""
        lay = self.layout
        off, size, n = lay["devheap_offset"], lay["devheap_size"], lay["devheap_count"]
        dsz = int(C.DEVHEAP_SIZE)
        if not size or not 0 < n <= int(C.MAX_DEVICE_HEAPS) or n * dsz > size:
            return []
        descs = np.frombuffer(self._map, dtype=DEVHEAP_DTYPE, count=n, offset=off)
        out = []
        for i, d in enumerate(descs):
            if int(d["magic"]) != int(C.DEVHEAP_MAGIC):
                continue
            granule, granules = int(d["granule"]), int(d["granules"])
            fr, lg, _runs = self._pool(off + int(d["bitmap_offset"]), granules, off + size)
            out.append(
                {
                    "name": f"cuda:{int(d['device_ordinal'])}",
                    "heap_index": i,
                    "kind": int(d["device_kind"]),
                    "ordinal": int(d["device_ordinal"]),
                    "size": granules * granule,
                    "granule": granule,
                    "used": int(d["used_granules"]) * granule,
                    "free": fr * granule,
                    "largest_free": lg * granule,
                    "allocs": int(d["allocs"]),
                    "repairs": int(d["repairs"]),
                }
            )
        return out

    # ------------------------------------------------------------------ records, check
    def record(self, handle: int) -> str | None:
        """The failure record of ``handle`` (hostless.records), read from the heap; None."""
        h = self.names().get(f"{_PREFIX_ERROR}{handle:x}")
        lay = self.layout
        if h is None or (h >> 48) & 0xFF != int(C.KIND_BUFFER) or not lay["heap_size"]:
            return None
        idx = (h & 0xFFFFFF) - 1
        slot = np.frombuffer(
            self._map, dtype=FENCE_DTYPE, count=1, offset=lay["fences_offset"] + idx * int(C.FENCE_SIZE)
        )[0]
        if int(slot["err"]) & 0xFF:  # a device buffer: not a record
            return None
        ho = lay["heap_offset"]
        data = ho + _u(self._map, ho + int(C.HP_DATA_OFFSET), 8)
        dsize = _u(self._map, ho + int(C.HP_DATA_SIZE), 8)
        start, n = int(slot["word"]), min(int(slot["aux"]), 4000)
        if not data <= ho + lay["heap_size"] or dsize > ho + lay["heap_size"] - data:
            return None
        if start > dsize or n > dsize - start:  # the extent must lie in the data area
            return None
        return bytes(self._map[data + start : data + start + n]).decode("utf-8", errors="replace")

    def check(self, settle: float = 5.0) -> list[str]:
        """Every invariant violation in the tables (as :meth:`Domain.check`, without joining;
        the heaps' bitmaps are not checked: they are only consistent under their locks, which a
        reader does not take).  Waits up to ``settle`` s for recoveries in flight."""
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and any(p.state == "recovering" for p in self.participants):
            if not any(p.state == "recovering" and self.lock_held(p.index) for p in self.participants):
                break
            time.sleep(0.002)
        return check_tables(bytes(self._map), self.lock_held, -1, None, None, None)


def open_view(name_or_path: str) -> DomainView:
    """A :class:`DomainView` of ``/dev/shm/<name>`` (or of a path with a ``/``)."""
    from .shm import path_of

    path = name_or_path if "/" in name_or_path else path_of(name_or_path)
    return DomainView(path, os.path.basename(path))
