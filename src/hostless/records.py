"""Error records: why a fence or timeline failed, kept in the domain.

A status says *that* a stage failed (ERROR, OWNER_DIED, ...); a record says
*why*: the exception's type, message and traceback, as text.  The participant
that fails an object with an exception it caught (an agent whose kernel
raised, for instance) writes the text into a small heap buffer and publishes
it in the domain's name table as ``!error:<handle in hex>``; whoever sees the
failure reads it with :func:`read` (:class:`~hostless.graph.StageFailed` and
``hostless info`` do).

Records are bounded: at most :data:`~hostless.stagefn.MAX_ERROR_BYTES` of
text each, and a writer keeps its last :data:`KEEP` records alive (older ones
are released, and their names die with them), so a stage failing on every
frame does not fill the heap or the name table.  All records together hold
at most 12 of the name table's 239 cells (the engine's share, core/names.c): past
it a new record takes another record's cell, never one a user's name could use.
Writing a record never
raises: without a heap, with a full heap or a full name table, the failure
keeps its status alone.

Records are written by one implementation, the engine's ``hle_record_write``
(``core/records.c``; its limits ``HLE_RECORD_KEEP`` and ``HLE_RECORD_MAX`` in
``hostless_engine.h``), which the native agents and ``hostless-agent`` call
in C and :class:`Recorder` calls through the extension.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._abi import C
from .errors import HostlessError

if TYPE_CHECKING:
    from .domain import Domain

__all__ = ["Recorder", "read", "name_of", "KEEP", "PREFIX"]

PREFIX = "!error:"
KEEP = int(C.RECORD_KEEP)
"""Records a writer keeps alive at once."""
MAX_BYTES = int(C.RECORD_MAX)
"""Bytes of text a record keeps (UTF-8; longer texts are cut)."""


def name_of(handle: int) -> str:
    """The name-table entry of the record of ``handle``."""
    return f"{PREFIX}{handle:x}"


class Recorder:
    """The records one participant writes, through the engine's ``hle_record_write`` (the
    domain's context keeps the last :data:`KEEP`; not thread-safe: one per loop)."""

    def __init__(self, dom: Domain) -> None:
        self.dom = dom

    def write(self, handle: int, text: str) -> bool:
        """Record ``text`` as the why of ``handle``'s failure; False when it could not be kept."""
        if not handle or self.dom.closed:
            return False
        data = text.encode("utf-8", errors="replace")[:MAX_BYTES].decode("utf-8", errors="ignore") or "?"
        return bool(C.record_write(self.dom._core, handle & (2**64 - 1), data))

    def close(self) -> None:
        """Release every record (their names die with them)."""
        if not self.dom.closed:
            C.records_close(self.dom._core)


def read(dom: Domain, handle: int) -> str | None:
    """The text recorded for ``handle``'s failure, or None."""
    try:
        buf = dom.lookup(name_of(handle))
    except (KeyError, HostlessError, ValueError):
        return None
    try:
        return bytes(buf.numpy()).decode("utf-8", errors="replace")
    finally:
        buf.release()
