"""Hostile-memory fuzzer: an innocent process that has a domain mapped gets errors, never a crash,
a hang or a write outside the mapping, whatever another participant writes into the shared memory.

``hostless fuzz NAME --cases N --seed S -o DIR`` (and :func:`run`) runs N *cases*.  Each case:

1. starts the *innocents*, fresh interpreters (``python -m hostless.fuzz innocent ...``): the
   ``creator`` creates a fresh domain ``NAME-<pid>-<case>`` (heap, trace ring, a small fence table)
   with shared objects (fences, a merge of two of them, a timeline, a small and a large heap
   buffer, a command queue it consumes) and ``joiner`` processes open it and import them.  They all
   attach BEFORE the corruption and then keep doing ordinary work: fence / merge / timeline /
   buffer / queue life cycles, waits with timeouts on the shared objects, imports of the shared
   handles, queue pushes and pops, ``Domain.check()``, ``hostless info``'s ``domain_info()``,
   ``heap_stats()``, trace export, ``reap()``, and at the end releases and ``close()``;
2. corrupts the live domain with one ``pwrite()`` into its file (repeated once half-way through
   the window): a boundary value (0, 1, -1, 2^31, 2^32, 2^63, a size just past the region, an
   offset that overflows when added, ...), a random value or a structured one (a slot control
   word with another kind / state / participant, a link or handle to an index past the table,
   a queue cell of another lap, a dtype string such as ``'|V2147483647'``) into one field of one
   region: the header, a participant entry, a fence slot (of each kind, or a free one), the heap
   header or its bitmap, a buffer's metadata, the queue header, its cells or packets, the trace
   ring's header or its events.  In toggle cases (30 %) it alternates the hostile and the original
   bytes for half the window (a reader that validates a field and then reads it again sees both).
   In some cases it also runs ``hostless info`` / ``hostless check`` subprocesses that attach AFTER
   the corruption (they are innocents too), and in some a third participant (``victim``) is
   SIGKILLed right after the write, so that the innocents' watchdogs run recovery over the
   corrupted tables (the victim itself is not classified), and in some a ``late`` innocent joins
   right after the write and does the same work (refusing to join with an accepted error is clean);
3. tells the innocents to stop and waits for them.

A separate case class, ``--truncate N``, truncates the file under the innocents instead (to 0, to
the header, into a table, ...; sometimes extended back to its size, i.e. zeroed), which a process
survives only if it handles SIGBUS; its counts are reported apart.

**Outcome of a case** (the worst of its innocents):

* ``crash``: an innocent died by a signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT...), a sanitizer
  reported an error (``make sanitize``), or an operation raised an exception of a type that is not
  accepted (the innocent prints the traceback and exits with status 3), or a CLI probe ended with
  such a traceback;
* ``hang``: an innocent was still running ``deadline`` seconds (10 by default) after it was asked
  to stop (every operation it does has a timeout, so nothing may block that long); it is sent
  SIGUSR1 (``faulthandler`` dumps every thread's Python stack to its stderr), then SIGKILL;
* ``clean``: only accepted errors, or no visible effect at all;
* ``error``: the harness could not set the case up (the domain was never created): not a finding
  about the core, but the run is not valid either.

**Accepted exceptions**, and why: :class:`~hostless.errors.HostlessError` and its subclasses (the
library's documented answer to a corrupt domain, a stale or forged handle, a full table or heap),
:class:`TimeoutError` (a wait on an object whose word was overwritten may never complete; every wait
of an innocent has a timeout; :class:`~hostless.errors.QueueFull` is one) and :class:`ValueError`
(the documented error for bad values: :class:`~hostless.errors.InvalidHandle` is one; ``Status(w)``
of an overwritten status word, NumPy refusing a view of a table whose offset was overwritten).
Every other type (TypeError, IndexError, KeyError, OverflowError, a plain MemoryError, OSError,
SystemError, RuntimeError, struct.error, BufferError, ...) shows a code path that trusts shared
memory, and is a crash.

Every field offset comes from the ABI: the ``hostless._core`` constants (``H_*``, ``P_*``, ``F_*``,
``PK_*``, ``BM_*``) where the extension exports them, otherwise from the ``struct`` definitions of
the ``hostless.h`` installed with the extension (``abi_layout()`` parses them and checks them
against every exported constant and size, so the two cannot drift apart silently).

Reproduction: the region, field, target and value of case K are a function of ``(seed, K)`` only
(the region is ``REGIONS[K % len(REGIONS)]``), so ``hostless fuzz NAME --seed S --case K`` (``--case
tK`` for a truncation case) repeats the same corruption (the interleaving with the innocents' work
differs from run to run).
"""

from __future__ import annotations

import argparse
import ast
import collections
import faulthandler
import functools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._abi import C

__all__ = [
    "REGIONS",
    "ACCEPTED",
    "Field",
    "Struct",
    "abi_layout",
    "run",
    "summary_lines",
    "report_markdown",
    "write_results",
    "findings_markdown",
]

REGIONS = (
    "header",
    "participant",
    "fence",
    "heap",
    "heap_bitmap",
    "buffer_meta",
    "queue",
    "queue_cells",
    "queue_packets",
    "trace",
    "trace_event",
)
"""Regions corrupted by the field cases; case K corrupts ``REGIONS[K % len(REGIONS)]``."""

OUTCOMES = ("crash", "hang", "error", "clean")
EXIT_UNEXPECTED = 3
"""Exit status of an innocent that met an exception of a type that is not accepted."""

_M64 = (1 << 64) - 1


def _accepted() -> tuple[type[BaseException], ...]:
    from .errors import HostlessError

    return (HostlessError, TimeoutError, ValueError)


ACCEPTED: tuple[str, ...] = ("HostlessError (and subclasses)", "TimeoutError", "ValueError")
"""What an innocent may raise on a corrupted domain (see the module docstring for why)."""


# --------------------------------------------------------------------------- the ABI layout


@dataclass(frozen=True)
class Field:
    """One field of an ABI struct."""

    name: str
    offset: int
    size: int
    """bytes of one element"""
    count: int = 1
    """elements (1 for a scalar)"""
    text: bool = False
    """a char array"""

    @property
    def nbytes(self) -> int:
        return self.size * self.count


@dataclass(frozen=True)
class Struct:
    """An ABI struct: its size and its fields by name (``parents``, ``shape`` are arrays)."""

    name: str
    size: int
    align: int
    fields: dict[str, Field]


STRUCTS = {
    "header": "hl_header",
    "participant": "hl_participant",
    "fence": "hl_fence",
    "heap": "hl_heap",
    "buffer_meta": "hl_buffer_meta",
    "queue": "hl_queue",
    "packet": "hl_packet",
    "trace": "hl_trace",
    "trace_event": "hl_trace_event",
}

# (struct, field) -> the _core constant that exports its offset
_CORE_OFFSETS: dict[str, dict[str, str]] = {
    "hl_header": {
        "magic": "H_MAGIC",
        "abi_version": "H_ABI_VERSION",
        "header_size": "H_HEADER_SIZE",
        "total_size": "H_TOTAL_SIZE",
        "participant_capacity": "H_PARTICIPANT_CAPACITY",
        "fence_capacity": "H_FENCE_CAPACITY",
        "participants_offset": "H_PARTICIPANTS_OFFSET",
        "fences_offset": "H_FENCES_OFFSET",
        "queues_offset": "H_QUEUES_OFFSET",
        "queues_size": "H_QUEUES_SIZE",
        "trace_offset": "H_TRACE_OFFSET",
        "trace_size": "H_TRACE_SIZE",
        "heap_offset": "H_HEAP_OFFSET",
        "heap_size": "H_HEAP_SIZE",
        "tag": "H_TAG",
        "created_ns": "H_CREATED_NS",
        "poll_ns": "H_POLL_NS",
        "epoch": "H_EPOCH",
        "ready": "H_READY",
        "stats_recovered": "H_STATS_RECOVERED",
    },
    "hl_participant": {
        "ctl": "P_CTL",
        "pid": "P_PID",
        "start_time": "P_START_TIME",
        "label": "P_LABEL",
        "kind": "P_KIND",
    },
    "hl_fence": {
        "word": "F_WORD",
        "ctl": "F_CTL",
        "refs": "F_REFS",
        "waiters": "F_WAITERS",
        "owner": "F_OWNER",
        "aux": "F_AUX",
        "parents": "F_PARENTS",
        "err": "F_ERR",
    },
    "hl_packet": {
        "type": "PK_TYPE",
        "kernel": "PK_KERNEL",
        "args": "PK_ARGS",
        "signal": "PK_SIGNAL",
        "signal_value": "PK_SIGNAL_VALUE",
        "wait": "PK_WAIT",
        "wait_value": "PK_WAIT_VALUE",
    },
    "hl_buffer_meta": {
        "nbytes": "BM_NBYTES",
        "ndim": "BM_NDIM",
        "itemsize": "BM_ITEMSIZE",
        "dtype": "BM_DTYPE",
        "shape": "BM_SHAPE",
    },
}
_CORE_SIZES = {
    "hl_header": "HEADER_SIZE",
    "hl_participant": "PARTICIPANT_SIZE",
    "hl_fence": "FENCE_SIZE",
    "hl_packet": "PACKET_SIZE",
    "hl_buffer_meta": "BUFFER_META_SIZE",
}
# sizes the header itself asserts (static_assert) through a define
_DEFINE_SIZES = {"hl_queue": "HL_QUEUE_HEADER_SIZE", "hl_packet": "HL_PACKET_SIZE"}

_SCALARS = {
    "hl_u64": 8,
    "hl_i64": 8,
    "hl_u32": 4,
    "hl_u16": 2,
    "hl_u8": 1,
    "char": 1,
    "uint64_t": 8,
    "int64_t": 8,
    "uint32_t": 4,
    "int32_t": 4,
    "uint16_t": 2,
    "uint8_t": 1,
}


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", " ", src)


_BINOPS: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a // b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.LShift: lambda a, b: a << b,
    ast.RShift: lambda a, b: a >> b,
    ast.BitOr: lambda a, b: a | b,
    ast.BitAnd: lambda a, b: a & b,
    ast.BitXor: lambda a, b: a ^ b,
}


def _ev(n: ast.AST) -> int:
    if isinstance(n, ast.Constant) and isinstance(n.value, int) and not isinstance(n.value, bool):
        return n.value
    if isinstance(n, ast.UnaryOp):
        v = _ev(n.operand)
        if isinstance(n.op, ast.USub):
            return -v
        if isinstance(n.op, ast.UAdd):
            return v
        if isinstance(n.op, ast.Invert):
            return ~v
    if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
        return _BINOPS[type(n.op)](_ev(n.left), _ev(n.right))
    raise ValueError(f"not an integer constant expression: {ast.dump(n)}")


def _eval_c(expr: str, defs: dict[str, int]) -> int:
    """Value of an integer constant expression of the header (literals, defines, + - * / << >> | &)."""
    s = re.sub(r"\b(0[xX][0-9a-fA-F]+|[0-9]+)[uUlL]*\b", r"\1", expr.strip())
    s = re.sub(r"\(\s*(?:hl_u64|hl_u32|hl_u16|hl_u8|hl_i64)\s*\)", " ", s)

    def name(m: re.Match[str]) -> str:
        if m.group(0) not in defs:
            raise KeyError(m.group(0))
        return str(defs[m.group(0)])

    s = re.sub(r"\b[A-Za-z_]\w*\b", name, s)
    return _ev(ast.parse(s, mode="eval").body)


def _defines(src: str) -> dict[str, int]:
    raw = dict(re.findall(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+([^\n]+?)[ \t]*$", src, re.M))
    out: dict[str, int] = {}
    progress = True
    while progress:
        progress = False
        for k, v in raw.items():
            if k in out:
                continue
            try:
                out[k] = _eval_c(v, out)
            except (KeyError, ValueError, SyntaxError, ZeroDivisionError):
                continue
            progress = True
    return out


def _decls(body: str) -> list[str]:
    """Split a struct body into its declarations (``;`` at brace depth 0)."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == ";" and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        raise ValueError(f"unterminated declaration {''.join(cur).strip()!r}")
    return [d for d in out if d]


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _members(
    body: str, defs: dict[str, int], src: str, cache: dict[str, Struct], union: bool = False
) -> tuple[list[Field], int, int]:
    """Fields (offsets relative to the body), size and alignment of a struct or union body."""
    fields: list[Field] = []
    off = size = 0
    align = 1
    for decl in _decls(body):
        if "{" in decl:  # an anonymous union / struct
            inner = decl[decl.index("{") + 1 : decl.rindex("}")]
            is_union = decl.lstrip().startswith("union")
            sub, ssize, salign = _members(inner, defs, src, cache, union=is_union)
            start = 0 if union else _align_up(off, salign)
            fields += [Field(f.name, start + f.offset, f.size, f.count, f.text) for f in sub]
            align = max(align, salign)
            if union:
                size = max(size, ssize)
            else:
                off = start + ssize
            continue
        m = re.fullmatch(r"(?:(?:const|volatile)\s+)*(struct\s+\w+|\w+)\s+(.+)", decl, re.S)
        if m is None:
            raise ValueError(f"cannot parse declaration {decl!r}")
        tname, rest = m.group(1), m.group(2)
        for d in rest.split(","):
            dm = re.fullmatch(r"\s*(\*?)\s*(\w+)\s*(?:\[(.+)\])?\s*", d, re.S)
            if dm is None:
                raise ValueError(f"cannot parse declarator {d!r} in {decl!r}")
            ptr, fname, dim = dm.group(1), dm.group(2), dm.group(3)
            text = False
            if ptr:
                esize = ealign = 8
            elif tname.startswith("struct"):
                st = _parse_struct(src, tname.split()[1], defs, cache)
                esize, ealign = st.size, st.align
            elif tname in _SCALARS:
                esize = ealign = _SCALARS[tname]
                text = tname == "char"
            else:
                raise ValueError(f"unknown type {tname!r} in {decl!r}")
            count = _eval_c(dim, defs) if dim else 1
            start = 0 if union else _align_up(off, ealign)
            fields.append(Field(fname, start, esize, count, text and count > 1))
            align = max(align, ealign)
            if union:
                size = max(size, esize * count)
            else:
                off = start + esize * count
    if not union:
        size = off
    return fields, _align_up(size, align), align


def _parse_struct(src: str, cname: str, defs: dict[str, int], cache: dict[str, Struct]) -> Struct:
    if cname in cache:
        return cache[cname]
    m = re.search(r"\bstruct\s+" + re.escape(cname) + r"\s*\{", src)
    if m is None:
        raise ValueError(f"struct {cname} not found in hostless.h")
    depth, i = 1, m.end()
    while depth:
        if i >= len(src):
            raise ValueError(f"struct {cname}: unbalanced braces")
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        i += 1
    fields, size, align = _members(src[m.end() : i - 1], defs, src, cache)
    st = Struct(cname, size, align, {f.name: f for f in fields})
    cache[cname] = st
    return st


def header_path() -> Path:
    """The ``hostless.h`` installed with the extension (the one it was compiled from)."""
    return Path(C.__file__).with_name("hostless.h")


def header_text(path: str | os.PathLike[str]) -> str:
    """The text of the header at ``path`` with its local ``#include "..."`` files inlined (once each):
    ``hostless.h`` is an umbrella over ``hostless_layout.h`` and the others, in its directory."""
    seen: set[Path] = set()

    def expand(p: Path) -> str:
        p = p.resolve()
        if p in seen:
            return ""
        seen.add(p)
        text = p.read_text(encoding="utf-8")
        return re.sub(
            r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[^\n]*$',
            lambda m: expand(p.with_name(m.group(1))),
            text,
            flags=re.M,
        )

    return expand(Path(path))


@functools.cache
def abi_layout(path: str | None = None) -> dict[str, Struct]:
    """The ABI structs by role (``header``, ``fence``, ``heap``, ``queue``, ``trace_event``, ...).

    Parsed from ``hostless.h`` and checked against every offset and size that ``hostless._core``
    exports: RuntimeError if they disagree."""
    src = _strip_comments(header_text(path or header_path()))
    defs = _defines(src)
    cache: dict[str, Struct] = {}
    out = {role: _parse_struct(src, cname, defs, cache) for role, cname in STRUCTS.items()}
    bad = []
    for cname, consts in _CORE_OFFSETS.items():
        st = cache[cname]
        for fname, const in consts.items():
            if not hasattr(C, const):
                continue
            if fname not in st.fields or st.fields[fname].offset != int(getattr(C, const)):
                got = st.fields[fname].offset if fname in st.fields else None
                bad.append(f"{cname}.{fname}: parsed {got}, _core.{const} = {int(getattr(C, const))}")
    for cname, const in _CORE_SIZES.items():
        if hasattr(C, const) and cache[cname].size != int(getattr(C, const)):
            bad.append(
                f"sizeof {cname}: parsed {cache[cname].size}, _core.{const} = {int(getattr(C, const))}"
            )
    for cname, define in _DEFINE_SIZES.items():
        if define in defs and cache[cname].size != defs[define]:
            bad.append(f"sizeof {cname}: parsed {cache[cname].size}, {define} = {defs[define]}")
    if bad:
        raise RuntimeError("hostless.h and the compiled core disagree: " + "; ".join(bad))
    return out


def _fuzzable(st: Struct) -> list[str]:
    return sorted(
        (n for n in st.fields if not n.startswith(("reserved", "pad"))), key=lambda n: st.fields[n].offset
    )


# --------------------------------------------------------------------------- the innocents

_POLL = 0.005


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj), encoding="utf-8")
    os.replace(tmp, path)


class _Innocent:
    """An ordinary participant: every operation has a timeout; accepted errors are counted,
    any other exception ends the process with EXIT_UNEXPECTED after printing its traceback."""

    def __init__(self, role: str, name: str, casedir: Path, seed: str, hook: str | None) -> None:
        self.role, self.name, self.casedir, self.hook = role, name, casedir, hook
        self.rng = random.Random(f"innocent:{seed}:{role}")
        self.ops: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.samples: dict[str, str] = {}
        self.accepted = _accepted()
        self.stop = threading.Event()
        self.held: list[Any] = []
        self.signaled: set[int] = set()
        self.tl_value = 0
        self.callbacks = 0
        self.dom: Any = None
        self.handles: dict[str, Any] = {}
        self.shared: dict[str, Any] = {}
        self.tmpfile = str(casedir / f"{role}.trace.json")

    # -- error policy
    def guard(self, what: str, fn: Callable[[], object]) -> None:
        self.ops[what] += 1
        try:
            fn()
        except self.accepted as e:
            self.errors[type(e).__name__] += 1
            if type(e).__name__ not in self.samples and len(self.samples) < 8:
                self.samples[type(e).__name__] = f"{what}: {str(e)[:200]}"
        except BaseException as e:  # noqa: B036 - every other type is the finding
            sys.stdout.flush()
            print(
                f"UNEXPECTED {type(e).__module__}.{type(e).__qualname__} in {what} ({self.role})",
                file=sys.stderr,
            )
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(EXIT_UNEXPECTED)

    def release(self, obj: Any) -> None:
        if obj is not None and getattr(obj, "_held", False):
            self.guard("release", obj.release)

    # -- setup (before the corruption: any failure here is a harness error)
    def setup(self) -> None:
        import numpy as np

        import hostless as hl

        if self.role == "creator":
            d = hl.Domain.create(
                self.name, fences=128, participants=8, heap="1M", trace="64K", label=self.role
            )
            self.dom = d
            fs = [d.fence() for _ in range(4)]
            m = d.merge(fs[:2])
            t = d.timeline()
            small = d.buffer((64,), np.float32)
            large = d.buffer((40000,), np.float32)  # >= LARGE_BUFFER: page-aligned data
            small.numpy()[:] = np.arange(64, dtype=np.float32)
            large.numpy()[:] = 1.0
            q = d.queue(8)
            q.bind()
            done = d.fence()
            done.signal()
            self.shared = {"fences": fs, "merged": m, "timeline": t, "buffers": [small, large], "queue": q}
            self.held = [*fs, m, t, small, large, q, done]
            self.handles = {
                "fences": [f.handle for f in fs],
                "merged": m.handle,
                "timeline": t.handle,
                "buffers": [small.handle, large.handle],
                "queue": q.handle,
                "signaled": done.handle,
            }
        else:
            path = self.casedir / "creator.ready"
            deadline = time.monotonic() + 60
            while not path.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("the creator never became ready")
                time.sleep(0.002)
            self.handles = json.loads(path.read_text(encoding="utf-8"))["handles"]
            d = hl.Domain.open(self.name, label=self.role)
            self.dom = d
            h = self.handles
            fs = [d.import_fence(x) for x in h["fences"]]
            m = d.import_fence(h["merged"])
            t = d.import_timeline(h["timeline"])
            bufs = [d.import_buffer(x) for x in h["buffers"]]
            q = d.import_queue(h["queue"])
            self.shared = {"fences": fs, "merged": m, "timeline": t, "buffers": bufs, "queue": q}
            self.held = [*fs, m, t, *bufs, q]
        me = self.dom.participant_id & 0xFF
        _write_json_atomic(
            self.casedir / f"{self.role}.ready",
            {"role": self.role, "pid": os.getpid(), "index": me, "handles": self.handles},
        )

    # -- operations
    def op_fence_cycle(self) -> None:
        d = self.dom
        f = d.fence()
        try:
            f.signal(self.rng.choice([2, 3, 4, 6, 64, 0xFFFFFFFF]))
            f.wait(0.01)
            _ = f.status
        finally:
            self.release(f)

    def op_merge_cycle(self) -> None:
        d = self.dom
        a = d.fence()
        b: Any = None
        m: Any = None
        try:
            b = d.fence()
            m = d.merge([a, b])
            a.signal()
            b.signal(self.rng.choice([2, 3]))
            m.wait(0.01)
            _ = m.status
        finally:
            self.release(m)
            self.release(b)
            self.release(a)

    def op_timeline_cycle(self) -> None:
        t = self.dom.timeline(self.rng.randrange(4))
        try:
            t.signal(t.value + 5)
            t.wait(t.value - 1, 0.01)
            if self.rng.random() < 0.3:
                t.fail()
                _ = t.failure
        finally:
            self.release(t)

    def op_buffer_cycle(self) -> None:
        import numpy as np

        n = self.rng.choice([1, 16, 100, 1024, 20000])
        b = self.dom.buffer((n,), self.rng.choice([np.uint8, np.float32, np.int64]))
        try:
            a = b.numpy()
            a[:] = 3
            int(a[-1])
        finally:
            self.release(b)

    def op_queue_cycle(self) -> None:
        from .queue import Packet, PacketType

        q = self.dom.queue(4)
        try:
            q.bind()
            q.push(Packet(type=PacketType.BARRIER), timeout=0.005)
            q.pop(timeout=0.005)
            q.info()
        finally:
            self.release(q)

    def op_shared_fence(self) -> None:
        f = self.rng.choice([*self.shared["fences"], self.shared["merged"]])
        _ = f.status
        f.wait(0.002)

    def op_shared_signal(self) -> None:
        fs = self.shared["fences"]
        f = fs[0] if self.role == "creator" else fs[2]
        if f.handle not in self.signaled:
            self.signaled.add(f.handle)
            f.signal()

    def op_shared_timeline(self) -> None:
        t = self.shared["timeline"]
        if self.role == "creator":
            self.tl_value += 1
            t.signal(self.tl_value)
        else:
            v = t.value
            t.wait(v + 1, 0.003)

    def op_shared_buffer(self) -> None:
        b = self.rng.choice(self.shared["buffers"])
        a = b.numpy()
        float(a.sum())
        a.reshape(-1)[:1] = 1

    def op_import(self) -> None:
        d, h = self.dom, self.handles
        kind = self.rng.choice(["fence", "merged", "timeline", "buffer", "queue", "signaled"])
        obj: Any = None
        try:
            if kind == "fence":
                obj = d.import_fence(self.rng.choice(h["fences"]))
                _ = obj.status
            elif kind == "merged":
                obj = d.import_fence(h["merged"])
                obj.wait(0.001)
            elif kind == "signaled":
                obj = d.import_fence(h["signaled"])
                obj.wait(0.01)
            elif kind == "timeline":
                obj = d.import_timeline(h["timeline"])
                _ = obj.value
            elif kind == "buffer":
                obj = d.import_buffer(self.rng.choice(h["buffers"]))
                float(obj.numpy().sum())
            else:
                obj = d.import_queue(h["queue"])
                obj.info()
        finally:
            self.release(obj)

    def op_push(self) -> None:
        from .queue import Packet, PacketType

        self.shared["queue"].push(Packet(type=PacketType.BARRIER, kernel=7), timeout=0.005)

    def op_pop(self) -> None:
        q = self.shared["queue"]
        for _ in range(4):
            if q.pop(timeout=0.002) is None:
                break
            q.completed()

    def op_queue_info(self) -> None:
        self.shared["queue"].info()

    def op_check(self) -> None:
        self.dom.check(settle=0.05)

    def op_info(self) -> None:
        from .cli import domain_info

        d = self.dom
        json.dumps(domain_info(d))
        _ = d.participants
        d.heap_stats()
        _ = d.capacity

    def op_trace(self) -> None:
        from . import trace

        if self.dom.trace_enabled():
            trace.export(self.dom, self.tmpfile)

    def op_reap(self) -> None:
        self.dom.reap()

    def op_async(self) -> None:
        import asyncio

        if self.rng.random() < 0.5:
            f = self.rng.choice([*self.shared["fences"], self.shared["merged"]])
            asyncio.run(f.wait_async(timeout=0.003))
        else:
            t = self.shared["timeline"]
            asyncio.run(t.wait_async(t.value + 1, timeout=0.003))

    def op_callback(self) -> None:
        # callbacks run in the notifier thread (futex_waitv on the shared words); a few per process
        if self.callbacks >= 16:
            return
        self.callbacks += 1
        if self.rng.random() < 0.5:
            f = self.rng.choice([*self.shared["fences"], self.shared["merged"]])
            f.add_done_callback(lambda _f: None)
        else:
            t = self.shared["timeline"]
            t.add_callback(t.value + self.rng.randrange(1, 4), lambda _t, _s: None)

    def ops_table(self) -> list[tuple[str, Callable[[], None], int]]:
        t: list[tuple[str, Callable[[], None], int]] = [
            ("fence_cycle", self.op_fence_cycle, 6),
            ("merge_cycle", self.op_merge_cycle, 4),
            ("timeline_cycle", self.op_timeline_cycle, 4),
            ("buffer_cycle", self.op_buffer_cycle, 4),
            ("queue_cycle", self.op_queue_cycle, 2),
            ("shared_fence", self.op_shared_fence, 4),
            ("shared_signal", self.op_shared_signal, 1),
            ("shared_timeline", self.op_shared_timeline, 3),
            ("shared_buffer", self.op_shared_buffer, 3),
            ("import", self.op_import, 4),
            ("push", self.op_push, 4),
            ("queue_info", self.op_queue_info, 1),
            ("check", self.op_check, 1),
            ("info", self.op_info, 1),
            ("trace", self.op_trace, 1),
            ("reap", self.op_reap, 1),
            ("async", self.op_async, 1),
            ("callback", self.op_callback, 1),
        ]
        if self.role == "creator":
            t.append(("pop", self.op_pop, 5))
        return t

    def run_hook(self) -> None:
        if self.hook == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif self.hook == "raise":
            self.guard("hook", lambda: [][1])  # IndexError: not an accepted type
        elif self.hook == "hang":
            while True:
                time.sleep(1)

    def loop(self) -> None:
        if self.dom is None or not self.shared:
            return
        table = self.ops_table()
        names = [n for n, _, _ in table]
        fns = {n: f for n, f, _ in table}
        weights = [w for _, _, w in table]
        hooked = False
        while not self.stop.is_set():
            if self.hook and not hooked:
                hooked = True
                self.run_hook()
            name = self.rng.choices(names, weights)[0]
            self.guard(name, fns[name])
            time.sleep(0.0005)

    def finish(self) -> None:
        if self.dom is None:
            return
        for name, fn in (("check", self.op_check), ("info", self.op_info), ("trace", self.op_trace)):
            self.guard("final_" + name, fn)
        for obj in reversed(self.held):
            self.release(obj)
        if self.dom is not None:
            self.guard("close", self.dom.close)


def _innocent_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m hostless.fuzz innocent")
    p.add_argument("role")
    p.add_argument("name")
    p.add_argument("--dir", required=True)
    p.add_argument("--seed", required=True)
    p.add_argument("--hook", default=None, choices=["segv", "raise", "hang"])
    a = p.parse_args(argv)
    # Python stacks on a fatal signal (not under ASan: its own report has the C stack) and on SIGUSR1
    # (what the fuzzer sends a hung innocent before killing it)
    if "asan" not in os.environ.get("LD_PRELOAD", ""):
        faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    inn = _Innocent(a.role, a.name, Path(a.dir), a.seed, a.hook)

    def watch_stdin() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        inn.stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    if a.role == "late":
        # joins a domain that is already corrupted: refusing to join is a clear error, not a finding
        joined = False

        def join() -> None:
            nonlocal joined
            inn.setup()
            joined = True

        inn.guard("join", join)
        if not joined:
            inn.stop.set()
    else:
        inn.setup()
    inn.loop()
    inn.finish()
    print(
        json.dumps(
            {"done": True, "ops": sum(inn.ops.values()), "errors": dict(inn.errors), "samples": inn.samples}
        ),
        flush=True,
    )
    # no interpreter teardown: the domain is closed, nothing else needs it
    os._exit(0)


# --------------------------------------------------------------------------- corruption planning


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


# --------------------------------------------------------------------------- running cases


@dataclass
class _Proc:
    role: str
    popen: subprocess.Popen[bytes]
    out: Path
    err: Path
    cli: bool = False
    hung: bool = False
    victim: bool = False


_SAN_MARKERS = (
    "ERROR: AddressSanitizer",
    "runtime error:",
    "ERROR: LeakSanitizer",
    "SUMMARY: UndefinedBehavior",
)


def _tail(path: Path, n: int = 20) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return text.splitlines()[-n:]


def _exc_types(text: str) -> list[str]:
    """The exception type names of every traceback printed to ``text`` (uncaught, in a thread, in a
    callback the notifier caught, or "Exception ignored in" a destructor), in order."""
    out = []
    blocks = text.split("Traceback (most recent call last)")[1:]
    for block in blocks:
        for line in block.splitlines()[1:]:
            if line.startswith((" ", "\t")) or not line.strip():
                continue
            m = re.match(r"^([A-Za-z_][\w.]*)(?::|$)", line)
            if m:
                out.append(m.group(1))
            break
    return out


def _exc_type(text: str) -> str | None:
    """The type name of the last exception in a traceback printed to ``text``."""
    types = _exc_types(text)
    return types[-1] if types else None


def _type_accepted(qualname: str) -> bool:
    """True when the exception type named ``qualname`` (``hostless.errors.X``, ``ValueError``) is accepted."""
    import builtins
    import importlib

    mod, _, name = qualname.rpartition(".")
    obj: Any = None
    try:
        obj = getattr(importlib.import_module(mod), name, None) if mod else getattr(builtins, name, None)
    except ImportError:
        obj = None
    return isinstance(obj, type) and issubclass(obj, _accepted())


def _sig_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _classify(p: _Proc, san: list[str]) -> dict[str, Any]:
    rc = p.popen.returncode
    err_text = p.err.read_text(encoding="utf-8", errors="replace") if p.err.exists() else ""
    rec: dict[str, Any] = {"role": p.role, "pid": p.popen.pid, "rc": rc}
    done: dict[str, Any] = {}
    if p.out.exists():
        for line in reversed(p.out.read_text(encoding="utf-8", errors="replace").splitlines()):
            if line.startswith("{"):
                try:
                    done = json.loads(line)
                except ValueError:
                    pass
                break
    if done:
        rec["ops"] = done.get("ops")
        rec["errors"] = done.get("errors", {})
        rec["samples"] = done.get("samples", {})
    exc = _exc_type(err_text)
    outcome, why = "clean", ""
    if p.victim:
        why = "SIGKILLed on purpose after the first write (not classified)"
    elif p.hung:
        outcome, why = "hang", "still running after the deadline (SIGUSR1 stack dump, then SIGKILL)"
    elif san or any(m in err_text for m in _SAN_MARKERS):
        outcome, why = "crash", "sanitizer report"
    elif rc is not None and rc < 0:
        outcome, why = "crash", f"killed by {_sig_name(-rc)}"
    elif p.cli:
        if exc is not None and not _type_accepted(exc):
            outcome, why = "crash", f"unexpected exception {exc}"
        elif rc not in (0, 1, 2):
            outcome, why = "crash", f"exit status {rc}"
    elif rc == EXIT_UNEXPECTED:
        m = re.search(r"^UNEXPECTED (\S+) in (\S+)", err_text, re.M)
        outcome, why = (
            "crash",
            f"unexpected exception {m.group(1)} in {m.group(2)}" if m else "unexpected exception",
        )
    elif rc != 0:
        if exc is not None and _type_accepted(exc):
            why = f"exited with accepted {exc}"
        else:
            outcome, why = "crash", f"exit status {rc}" + (f" ({exc})" if exc else "")
    else:
        swallowed = [t for t in _exc_types(err_text) if not _type_accepted(t)]
        if swallowed:
            outcome, why = (
                "crash",
                f"unexpected exception {swallowed[0]} printed (in a thread, callback or __del__)",
            )
    rec["outcome"], rec["why"] = outcome, why
    if (outcome != "clean" or rc != 0) and not p.victim:
        rec["stderr_tail"] = _tail(p.err, 40 if p.hung else 20)
    if san:
        rec["sanitizer"] = san[:60]
    return rec


def _san_env(env: dict[str, str], logbase: Path) -> dict[str, str]:
    """Point the sanitizers' reports of one innocent at its own log files."""
    for key in ("ASAN_OPTIONS", "UBSAN_OPTIONS"):
        if key in env:
            env[key] = env[key] + f":log_path={logbase}.{key[:5].lower()}"
    return env


def _san_reports(casedir: Path, role: str) -> list[str]:
    out: list[str] = []
    for f in sorted(casedir.glob(f"{role}.san.*")):
        out += f.read_text(encoding="utf-8", errors="replace").splitlines()
    return out


@dataclass
class Config:
    name: str
    cases: int
    seed: int
    only: str | None
    truncate: int
    innocents: int
    window: float
    deadline: float
    cli: float
    hook: str | None
    victims: float = 0.3
    whole: float = 0.15
    late: float = 0.3
    dry: bool = False
    force: Forced | None = None


@dataclass(frozen=True)
class Forced:
    """An exact corruption (``--set REGION.FIELD[@TARGET]=VALUE``): no planner involved."""

    region: str
    field: str
    target: str
    value: int | bytes
    toggle: bool = False

    def spec(self) -> str:
        tgt = f"@{self.target}" if self.target else ""
        val = f"hex:{self.value.hex()}" if isinstance(self.value, bytes) else f"{self.value:#x}"
        return f"{self.region}.{self.field}{tgt}={val}"


def parse_set(spec: str, toggle: bool = False) -> Forced:
    """``REGION.FIELD[@TARGET]=VALUE``: VALUE an integer (any base, ``-1`` = all ones) or
    ``hex:...`` bytes; TARGET a substring of the instance's name (``timeline``, ``creator``,
    ``packet 3``, ``small buffer``, ``alloc_hint+1``).  ``FIELD`` ``*``: the whole struct instance
    (VALUE then bytes)."""
    m = re.fullmatch(r"(\w+)\.([\w\[\]*]+)(?:@([^=]+))?=(.+)", spec.strip())
    if m is None or m.group(1) not in REGIONS:
        raise ValueError(
            f"--set wants REGION.FIELD[@TARGET]=VALUE with REGION in {', '.join(REGIONS)}: {spec!r}"
        )
    raw = m.group(4).strip()
    value: int | bytes = bytes.fromhex(raw[4:]) if raw.startswith("hex:") else int(raw, 0)
    return Forced(m.group(1), m.group(2), (m.group(3) or "").strip(), value, toggle)


def _forced_target(f: Forced, s: _Snap) -> _Target:
    """The instance of the planner that matches ``f`` (the planner is tried with a fixed sequence
    of generators until one picks that field and target: a pure function of the layout)."""
    for j in range(50000):
        t = _plan_target(random.Random(f"hostless-fuzz:force:{j}"), f.region, s)
        name_ok = f.field == "*" or t.field == f.field or t.field.split("[")[0] == f.field
        if name_ok and f.target in t.target:
            if f.field == "*":
                if not t.span:
                    break
                t.field = "*"
            return t
    raise ValueError(f"no {f.region}.{f.field} with a target matching {f.target!r} in this layout")


def _case_ids(cfg: Config) -> list[str]:
    if cfg.only is not None:
        return [cfg.only]
    return [str(k) for k in range(cfg.cases)] + [f"t{k}" for k in range(cfg.truncate)]


def _repro(cfg: Config, cid: str) -> str:
    extra = f" --innocents {cfg.innocents}" if cfg.innocents != 2 else ""
    if cfg.victims != 0.3:
        extra += f" --victims {cfg.victims}"
    if cfg.force is not None:
        extra += f" --set '{cfg.force.spec()}'" + (" --toggle" if cfg.force.toggle else "")
    return f"hostless fuzz {cfg.name} --seed {cfg.seed} --case {cid}{extra}"


def _exact_repro(cfg: Config, rec: dict[str, Any]) -> str | None:
    """The planner-independent reproduction of a field case: ``--set`` with its field and value."""
    if rec["region"] == "truncate" or "field" not in rec:
        return None
    tgt = str(rec.get("target", ""))
    # the instance, as the planner names it (a resolved "alloc_hint+1 = slot 7" keeps its first part)
    sel = tgt.split(" = ")[0]
    if not sel.startswith("any"):  # a random slot stays that slot; the others are named by role
        sel = sel.split(" (index")[0].split(" slot ")[0]
    val = f"hex:{rec['bytes']}" if rec.get("bytes") else f"{rec.get('value', 0):#x}"
    extra = " --toggle" if rec.get("mode") == "toggle" else ""
    vic = " --victims 1" if rec.get("victim") else " --victims 0"
    return f"hostless fuzz {cfg.name} --case 0 --set '{rec['region']}.{rec['field']}@{sel}={val}'{extra}{vic}"


def _spawn(role: str, name: str, casedir: Path, seed: str, hook: str | None) -> _Proc:
    out, err = casedir / f"{role}.out", casedir / f"{role}.err"
    cmd = [
        sys.executable,
        "-m",
        "hostless.fuzz",
        "innocent",
        role,
        name,
        "--dir",
        str(casedir),
        "--seed",
        seed,
    ]
    if hook:
        cmd += ["--hook", hook]
    with open(out, "wb") as fo, open(err, "wb") as fe:
        pop = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=fo,
            stderr=fe,
            env=_san_env(dict(os.environ), casedir / f"{role}.san"),
        )
    return _Proc(role, pop, out, err)


def _spawn_cli(args: list[str], tag: str, casedir: Path) -> _Proc:
    out, err = casedir / f"{tag}.out", casedir / f"{tag}.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        pop = subprocess.Popen(
            [sys.executable, "-m", "hostless.cli", "--plain", *args],
            stdin=subprocess.DEVNULL,
            stdout=fo,
            stderr=fe,
            env=_san_env(dict(os.environ), casedir / f"{tag}.san"),
        )
    return _Proc(tag, pop, out, err, cli=True)


def _stop(p: _Proc) -> None:
    if p.popen.stdin is not None:
        try:
            p.popen.stdin.close()
        except OSError:
            pass


def _reap(procs: Sequence[_Proc], deadline: float) -> None:
    """Wait for every process until ``deadline`` (monotonic); the late ones are dumped, then killed."""
    for p in procs:
        left = deadline - time.monotonic()
        try:
            p.popen.wait(timeout=max(0.01, left))
        except subprocess.TimeoutExpired:
            p.hung = True
            try:
                p.popen.send_signal(signal.SIGUSR1)
            except OSError:
                pass
            time.sleep(0.5)
            p.popen.kill()
            p.popen.wait()


def _whole_data(rng: random.Random, fd: int, t: _Target) -> tuple[bytes, str]:
    """Bytes replacing the whole struct instance of ``t`` (its first ``span`` bytes)."""
    n = t.span
    choice = rng.randrange(5)
    if choice == 0 and t.siblings:
        src = rng.choice(t.siblings)
        return os.pread(fd, n, src), f"whole {t.region} struct cloned from offset {src}"
    if choice == 1:
        return b"\x00" * n, f"whole {t.region} struct zeroed"
    if choice == 2:
        return b"\xff" * n, f"whole {t.region} struct all 0xff"
    return rng.randbytes(n), f"whole {t.region} struct random"


def _toggle(fd: int, offset: int, hostile: bytes, orig: bytes, seconds: float) -> int:
    """Alternate the hostile and the original bytes for ``seconds`` (a reader that validates a
    field and reads it again sees both); ends on the hostile value.  Returns the number of pairs."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        for _ in range(32):
            os.pwrite(fd, hostile, offset)
            os.pwrite(fd, orig, offset)
        n += 32
    os.pwrite(fd, hostile, offset)
    return n


def _run_case(cfg: Config, cid: str) -> dict[str, Any]:
    trunc = cid.startswith("t")
    k = int(cid[1:] if trunc else cid)
    rng = random.Random(f"hostless-fuzz:{cfg.seed}:{cid}")
    region = "truncate" if trunc else REGIONS[k % len(REGIONS)]
    if cfg.force is not None and not trunc:
        region = cfg.force.region
    name = f"{cfg.name}-{os.getpid()}-{cid}"
    path = os.path.join("/dev/shm", name)
    casedir = Path(tempfile.mkdtemp(prefix="hlfuzz-"))
    roles = ["creator"] + [f"joiner{i}" for i in range(1, cfg.innocents)]
    # a participant SIGKILLed right after the first write (so that the survivors recover it over the
    # corrupted tables); its own generator, so that the corruption plan does not depend on it
    with_victim = random.Random(f"hostless-fuzz:{cfg.seed}:{cid}:victim").random() < cfg.victims
    procs: list[_Proc] = []
    rec: dict[str, Any] = {"case": cid, "seed": cfg.seed, "region": region, "repro": _repro(cfg, cid)}
    rec["victim"] = with_victim
    # an innocent that joins right after the first write (like the CLI probes, with the full work)
    with_late = random.Random(f"hostless-fuzz:{cfg.seed}:{cid}:late").random() < cfg.late
    rec["late"] = with_late
    t0 = time.monotonic()
    try:
        for i, role in enumerate(roles):
            hook = cfg.hook if i == len(roles) - 1 else None
            procs.append(_spawn(role, name, casedir, f"{cfg.seed}:{cid}", hook))
        if with_victim:
            procs.append(_spawn("victim", name, casedir, f"{cfg.seed}:{cid}", None))
            procs[-1].victim = True
            roles.append("victim")
        ready: dict[str, dict[str, Any]] = {}
        limit = time.monotonic() + 60
        while len(ready) < len(roles):
            for p in procs:
                f = casedir / f"{p.role}.ready"
                if p.role not in ready and f.exists():
                    ready[p.role] = json.loads(f.read_text(encoding="utf-8"))
            dead = [p for p in procs if p.role not in ready and p.popen.poll() is not None]
            if dead or time.monotonic() > limit:
                for p in procs:
                    _stop(p)
                _reap(procs, time.monotonic() + 5)
                rec["outcome"] = "error"
                rec["why"] = "setup failed: " + (
                    f"{dead[0].role} exited with {dead[0].popen.returncode}"
                    if dead
                    else "no ready within 60 s"
                )
                # nothing was corrupted yet: whatever happened is not a finding about hostile memory
                # (but the run is not valid either: "error" fails it too)
                rec["innocents"] = [_classify(p, _san_reports(casedir, p.role)) for p in procs]
                return rec
            time.sleep(_POLL)
        snap = _snapshot(path, ready)
        if trunc:
            size, how, restore = _truncate_plan(rng, snap)
            rec.update(field="file size", target="file", offset=size, size=0, value=size, how=how)
        else:
            tg = _plan_target(rng, region, snap) if cfg.force is None else _forced_target(cfg.force, snap)
            if tg.ahead is None:
                with open(path, "rb") as fh:
                    fh.seek(tg.offset)
                    tg.orig = int.from_bytes(fh.read(tg.size), "little")
            value, how = _pick_value(rng, tg, snap)
            if cfg.force is not None:
                value, how = cfg.force.value, "given (--set)"
                if tg.field == "*":
                    if not isinstance(value, bytes):
                        raise ValueError("--set REGION.*=... takes hex:BYTES")
                    tg.offset, tg.size = tg.base, len(value)
                elif isinstance(value, int):
                    value &= (1 << (8 * tg.size)) - 1
                else:
                    value = value[: tg.size].ljust(tg.size, b"\x00")
            data = value if isinstance(value, bytes) else int(value).to_bytes(tg.size, "little")
            rec.update(field=tg.field, target=tg.target, offset=tg.offset, size=tg.size, how=how)
            if isinstance(value, bytes):
                rec["value"] = None
                rec["bytes"] = value.hex()
            else:
                rec["value"] = int(value)
                rec["value_hex"] = f"{int(value):#x}"
        pre = rng.uniform(0.02, 0.1)
        cli_cmd: list[str] | None = None
        if rng.random() < cfg.cli:
            cli_cmd = rng.choice([["info", name], ["info", name, "--json"], ["check", name]])
        mode = "write" if trunc or rng.random() < 0.7 else "toggle"
        # whole-struct cases: their own generator, so that the field plans do not depend on them
        wrng = random.Random(f"hostless-fuzz:{cfg.seed}:{cid}:whole")
        whole = not trunc and wrng.random() < cfg.whole and tg.span > 0
        if cfg.force is not None and not trunc:
            mode, whole = ("toggle" if cfg.force.toggle else "write"), False
        rec["mode"] = mode
        time.sleep(pre)
        fd = os.open(path, os.O_RDWR)
        try:
            if not trunc and tg.ahead is not None:
                # a slot about to be allocated: resolved now, from the live alloc_hint
                hf = abi_layout()["header"].fields["alloc_hint"]
                hint = int.from_bytes(os.pread(fd, hf.size, hf.offset), "little")
                idx = (hint + tg.ahead) % snap.header["fence_capacity"]
                tg.offset += snap.header["fences_offset"] + idx * abi_layout()["fence"].size
                tg.base += snap.header["fences_offset"] + idx * abi_layout()["fence"].size
                rec["offset"], rec["target"] = tg.offset, f"{tg.target} = slot {idx}"
            if whole:
                data, how = _whole_data(wrng, fd, tg)
                tg.offset, tg.size = tg.base, len(data)
                rec.update(field="*", offset=tg.offset, size=tg.size, how=how, value=None, bytes=data.hex())
                rec.pop("value_hex", None)
            orig = b"" if trunc else os.pread(fd, tg.size, tg.offset)
            for rep in range(2):
                if cfg.dry:
                    pass
                elif trunc:
                    if rep == 0:
                        os.ftruncate(fd, size)
                    elif restore:
                        os.ftruncate(fd, snap.total)
                elif mode == "toggle" and rep == 0:
                    rec["toggles"] = _toggle(fd, tg.offset, data, orig, cfg.window / 2)
                else:
                    os.pwrite(fd, data, tg.offset)
                if rep == 0:
                    for p in procs:
                        if p.victim:
                            p.popen.kill()
                if rep == 0 and with_late:
                    procs.append(_spawn("late", name, casedir, f"{cfg.seed}:{cid}", None))
                if rep == 0 and cli_cmd is not None:
                    procs.append(_spawn_cli(cli_cmd, "cli", casedir))
                    rec["cli"] = "hostless " + " ".join(cli_cmd)
                if mode == "write" or rep == 1:
                    time.sleep(cfg.window / 2)
        finally:
            os.close(fd)
        for p in procs:
            _stop(p)
        _reap(procs, time.monotonic() + cfg.deadline)
        rec["innocents"] = [_classify(p, _san_reports(casedir, p.role)) for p in procs]
        outs = {i["outcome"] for i in rec["innocents"]}
        rec["outcome"] = next(o for o in OUTCOMES if o in outs or o == "clean")
        errs: collections.Counter[str] = collections.Counter()
        for i in rec["innocents"]:
            errs.update(i.get("errors", {}))
        rec["errors_seen"] = dict(errs)
        if rec["outcome"] != "clean":
            rec["exact_repro"] = _exact_repro(cfg, rec)
    finally:
        for p in procs:
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait()
            _stop(p)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        shutil.rmtree(casedir, ignore_errors=True)
        rec["duration_s"] = round(time.monotonic() - t0, 2)
    return rec


def run(
    name: str = "hlfuzz",
    *,
    cases: int = 100,
    seed: int | None = None,
    case: str | int | None = None,
    truncate: int = 0,
    innocents: int = 2,
    window: float = 0.4,
    deadline: float = 10.0,
    cli: float = 0.25,
    hook: str | None = None,
    victims: float = 0.3,
    dry: bool = False,
    force: str | Forced | None = None,
    progress: Callable[[str], object] | None = None,
) -> dict[str, Any]:
    """Run the fuzzer; returns the result dict (``ok`` is False on any crash, hang or setup error).

    ``name``: prefix of the cases' domain names.  ``case``: run only that case (``K`` or ``tK``).
    ``truncate``: truncation cases after the ``cases`` field cases.  ``innocents``: processes per
    case (a creator and ``innocents - 1`` joiners).  ``window``: seconds of work after the first
    write.  ``deadline``: seconds an innocent gets to finish once told to stop.  ``cli``:
    probability of a ``hostless info/check`` probe per case.  ``victims``: probability of a case with
    one more participant that is SIGKILLed right after the first write, so that the innocents'
    watchdogs recover it over the corrupted tables.  ``dry``: plan every case but write nothing (a
    baseline of the harness: every case must be clean).  ``force``: every field case writes exactly
    this (:func:`parse_set`; the region, field, instance and value of the case are ignored).
    ``hook`` (tests): the last innocent
    kills itself with SIGSEGV (``segv``), raises IndexError (``raise``) or never stops (``hang``).
    """
    from .bench import machine_info
    from .domain import _path

    _path(name)  # validates the name
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    if innocents < 1:
        raise ValueError("innocents must be >= 1")
    only = None if case is None else str(case)
    if only is not None and not re.fullmatch(r"t?\d+", only):
        raise ValueError(f"case must be K or tK, got {case!r}")
    forced = parse_set(force) if isinstance(force, str) else force
    cfg = Config(name, cases, seed, only, truncate, innocents, window, deadline, cli, hook, victims, dry=dry)
    cfg.force = forced
    abi_layout()  # fail early if the header and the core disagree
    t0 = time.monotonic()
    machine = machine_info()
    recs = []
    for cid in _case_ids(cfg):
        rec = _run_case(cfg, cid)
        recs.append(rec)
        if progress is not None:
            line = (
                f"case {cid:>4} {rec['region']:<13} {rec.get('field', '?'):<18} "
                f"{rec.get('how', '')[:40]:<40} {rec.get('mode', ''):<6} {rec['outcome']}"
            )
            if rec["outcome"] != "clean":
                bad = [i for i in rec.get("innocents", []) if i["outcome"] != "clean"]
                line += ": " + "; ".join(f"{i['role']} {i['why']}" for i in bad)
            progress(line)
    return _result(cfg, recs, machine, time.monotonic() - t0)


def _result(cfg: Config, recs: list[dict[str, Any]], machine: dict[str, Any], dt: float) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = {}
    for r in recs:
        c = counts.setdefault(r["region"], dict.fromkeys(OUTCOMES, 0))
        c[r["outcome"]] += 1
    totals = dict.fromkeys(OUTCOMES, 0)
    for r in recs:
        totals[r["outcome"]] += 1
    errs: collections.Counter[str] = collections.Counter()
    for r in recs:
        errs.update(r.get("errors_seen", {}))
    bad = [r for r in recs if r["outcome"] != "clean"]
    return {
        "kind": "fuzz",
        "ok": not bad,
        "seed": cfg.seed,
        "config": {
            "name": cfg.name,
            "cases": cfg.cases,
            "case": cfg.only,
            "truncate": cfg.truncate,
            "innocents": cfg.innocents,
            "window_s": cfg.window,
            "deadline_s": cfg.deadline,
            "cli": cfg.cli,
            "hook": cfg.hook,
            "victims": cfg.victims,
            "dry": cfg.dry,
            "set": cfg.force.spec() if cfg.force is not None else None,
            "sanitizers": {
                k: os.environ[k] for k in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS") if k in os.environ
            },
        },
        "machine": machine,
        "duration_s": round(dt, 1),
        "totals": totals,
        "counts": counts,
        "errors_seen": dict(errs.most_common()),
        "accepted": list(ACCEPTED),
        "findings": bad,
        "cases": recs,
    }


# --------------------------------------------------------------------------- reports


def _value_text(r: dict[str, Any]) -> str:
    if r.get("value_hex"):
        return str(r["value_hex"])
    if r.get("bytes"):
        return "bytes " + str(r["bytes"])[:40]
    return str(r.get("value", ""))


def _finding_line(r: dict[str, Any]) -> str:
    bad = [i for i in r.get("innocents", []) if i["outcome"] != "clean"]
    why = "; ".join(f"{i['role']}: {i['why']}" for i in bad) or r.get("why", "")
    return (
        f"{r['outcome'].upper()} {r['region']}.{r.get('field', '?')} ({r.get('target', '')}) "
        f"offset {r.get('offset')} value {_value_text(r)} [{r.get('how', '')}]"
        + (" toggled" if r.get("mode") == "toggle" else "")
        + f": {why}"
    )


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A few lines for the terminal."""
    t = result["totals"]
    dry = " (dry run)" if result["config"].get("dry") else ""
    out = [
        f"fuzz {'PASSED' if result['ok'] else 'FAILED'}{dry}: seed {result['seed']}, {sum(t.values())} cases "
        f"in {result['duration_s']} s: {t['crash']} crash, {t['hang']} hang, {t['error']} setup error, "
        f"{t['clean']} clean",
    ]
    if result["errors_seen"]:
        out.append(
            "accepted errors seen by the innocents: "
            + ", ".join(f"{k} {v}" for k, v in list(result["errors_seen"].items())[:8])
        )
    for r in result["findings"][:20]:
        out.append("  " + _finding_line(r))
        out.append(f"    repro: {r['repro']}")
        if r.get("exact_repro"):
            out.append(f"    exact: {r['exact_repro']}")
    return out


def report_markdown(result: dict[str, Any]) -> str:
    """The Markdown report of a run."""
    from .bench import markdown_table

    cfg, m, t = result["config"], result["machine"], result["totals"]
    lines = [
        f"# hostless fuzz: {'passed' if result['ok'] else 'FAILED'}"
        + (" (dry run: nothing was written)" if cfg.get("dry") else ""),
        "",
        f"- machine: {m.get('hostname')}, {m.get('cpu_model')}, {m.get('nproc')} CPUs, Python "
        f"{m.get('python')}, git {m.get('git')}, {m.get('date')}",
        f"- seed {result['seed']}; {cfg['cases']} field cases"
        + (f", {cfg['truncate']} truncation cases" if cfg["truncate"] else "")
        + (f" (only case {cfg['case']})" if cfg["case"] is not None else "")
        + f"; {cfg['innocents']} innocents per case (and a victim SIGKILLed after the write in "
        f"{cfg.get('victims', 0):.0%} of the cases); window {cfg['window_s']} s; hang deadline "
        f"{cfg['deadline_s']} s; CLI probes in {cfg['cli']:.0%} of the cases; {result['duration_s']} s",
    ]
    if cfg["sanitizers"]:
        lines.append(f"- sanitizers: {cfg['sanitizers']}")
    lines += [
        "",
        "Each case writes one field of the live domain (twice) while innocent processes that attached "
        "before keep working.  `crash`: an innocent died by a signal, a sanitizer reported, or an "
        "exception of a type other than " + ", ".join(ACCEPTED) + " escaped; `hang`: an innocent "
        "outlived the deadline; see `hostless.fuzz`.",
        "",
        "## Outcomes",
        "",
        f"{t['crash']} crash, {t['hang']} hang, {t['error']} setup error, {t['clean']} clean.",
        "",
    ]
    field_rows = [
        [reg, *(str(c[o]) for o in OUTCOMES)] for reg, c in result["counts"].items() if reg != "truncate"
    ]
    lines += [markdown_table(["region", *OUTCOMES], field_rows), ""]
    if "truncate" in result["counts"]:
        c = result["counts"]["truncate"]
        lines += [
            "## Truncation cases (reported apart: surviving them needs SIGBUS handling)",
            "",
            markdown_table(["class", *OUTCOMES], [["truncate", *(str(c[o]) for o in OUTCOMES)]]),
            "",
        ]
    by_field: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in result["findings"]:
        by_field.setdefault((r["region"], r.get("field", "?"), r["outcome"]), []).append(r)
    if by_field:
        lines += ["## Crashes and hangs by field", ""]
        lines += [
            markdown_table(
                ["region", "field", "outcome", "cases", "repro (first)"],
                [
                    [reg, fld, out, str(len(rs)), f"`{rs[0]['repro']}`"]
                    for (reg, fld, out), rs in by_field.items()
                ],
            ),
            "",
            "## Every crash and hang",
            "",
        ]
        for r in result["findings"]:
            lines.append(f"### case {r['case']}: {r['outcome']} ({r['region']}.{r.get('field', '?')})")
            lines.append("")
            lines.append(f"- {_finding_line(r)}")
            lines.append(f"- reproduce: `{r['repro']}`")
            if r.get("exact_repro"):
                lines.append(f"- exactly this write: `{r['exact_repro']}`")
            if r.get("cli"):
                lines.append(f"- CLI probe: `{r['cli']}`")
            for i in r.get("innocents", []):
                if i["outcome"] == "clean":
                    continue
                lines.append(f"- {i['role']} (pid {i['pid']}, rc {i['rc']}): {i['why']}; last stderr lines:")
                lines.append("")
                lines.append("```")
                lines += [ln[:300] for ln in (i.get("sanitizer") or i.get("stderr_tail") or [])[-40:]]
                lines.append("```")
            lines.append("")
    if result["errors_seen"]:
        lines += [
            "## Accepted errors the innocents met",
            "",
            markdown_table(["type", "count"], [[k, str(v)] for k, v in result["errors_seen"].items()]),
            "",
        ]
    lines += ["## Cases", ""]
    lines += [
        markdown_table(
            ["case", "region", "field", "target", "offset", "value", "how", "mode", "outcome", "s"],
            [
                [
                    str(r["case"]),
                    r["region"],
                    str(r.get("field", "")),
                    str(r.get("target", "")),
                    str(r.get("offset", "")),
                    _value_text(r),
                    str(r.get("how", ""))[:50],
                    str(r.get("mode", "")),
                    r["outcome"],
                    str(r.get("duration_s", "")),
                ]
                for r in result["cases"]
            ],
        ),
        "",
    ]
    return "\n".join(lines)


def findings_markdown(result: dict[str, Any]) -> str:
    """One line per crash or hang with its reproduction (for a running findings list)."""
    out = []
    git = result["machine"].get("git")
    for r in result["findings"]:
        exact = f" (exact: `{r['exact_repro']}`)" if r.get("exact_repro") else ""
        out.append(f"- [{git}] `{r['repro']}`{exact}: {_finding_line(r)}")
    return "\n".join(out) + ("\n" if out else "")


def write_results(
    result: dict[str, Any], out_dir: str | os.PathLike[str] = "benchmarks/results"
) -> tuple[Path, Path]:
    """Write ``fuzz-<host>-<date>.json`` and ``.md`` into ``out_dir``; returns both paths."""
    from . import bench

    js, md = bench.write_results("fuzz", result, report_markdown(result), out_dir)
    return Path(js), Path(md)


def _main(argv: Iterable[str]) -> int:
    args = list(argv)
    if not args or args[0] != "innocent":
        print("usage: python -m hostless.fuzz innocent ROLE NAME --dir DIR --seed S (run `hostless fuzz`)")
        return 2
    return _innocent_main(args[1:])


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
