"""What the fuzzer corrupts and how it judges: the regions, the outcomes of a case, and the
exceptions an innocent may raise on a corrupted domain (see :mod:`hostless_tools.fuzz` for why)."""

from __future__ import annotations

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
    from hostless.errors import HostlessError

    return (HostlessError, TimeoutError, ValueError)


ACCEPTED: tuple[str, ...] = ("HostlessError (and subclasses)", "TimeoutError", "ValueError")
"""What an innocent may raise on a corrupted domain (see the module docstring for why)."""
