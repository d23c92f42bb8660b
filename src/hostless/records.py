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
at most 12 of the name table's 47 cells (the engine's share, core/names.c): past
it a new record takes another record's cell, never one a user's name could use.
Writing a record never
raises: without a heap, with a full heap or a full name table, the failure
keeps its status alone.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import HostlessError

if TYPE_CHECKING:
    from .domain import Domain

__all__ = ["Recorder", "read", "name_of", "KEEP", "PREFIX"]

PREFIX = "!error:"
KEEP = 8
"""Records a writer keeps alive at once."""


def name_of(handle: int) -> str:
    """The name-table entry of the record of ``handle``."""
    return f"{PREFIX}{handle:x}"


class Recorder:
    """The records one participant writes (not thread-safe: one per loop)."""

    def __init__(self, dom: Domain) -> None:
        self.dom = dom
        self.kept: collections.deque[Any] = collections.deque()

    def write(self, handle: int, text: str) -> bool:
        """Record ``text`` as the why of ``handle``'s failure; False when it could not be kept."""
        if not handle:
            return False
        data = text.encode("utf-8", errors="replace") or b"?"
        try:
            buf = self.dom.buffer((len(data),), "u1")
        except (HostlessError, ValueError):
            return False  # no heap, or a full one: the status stands alone
        try:
            buf.numpy()[:] = np.frombuffer(data, np.uint8)
            self.dom.publish(name_of(handle), buf, replace=True)
        except (HostlessError, ValueError, TypeError):
            buf.release()
            return False
        self.kept.append(buf)
        while len(self.kept) > KEEP:
            self.kept.popleft().release()
        return True

    def close(self) -> None:
        """Release every record (their names die with them)."""
        while self.kept:
            try:
                self.kept.popleft().release()
            except HostlessError:
                pass


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
