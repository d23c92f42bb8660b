"""The ABI layout as the fuzzer sees it: the structs of ``hostless.h`` parsed (its local includes
inlined) and checked against every offset and size the compiled core exports."""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hostless._abi import C


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
    return Path(C.__file__).parent / "include" / "hostless" / "hostless.h"


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
