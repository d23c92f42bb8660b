"""The ABI as Python sees it: constants and NumPy record types built from the
offsets that the C extension computed from ``hostless.h`` (the single source
of truth).  Nothing here hard-codes a field offset."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import _core as C

__all__ = [
    "C",
    "HEADER_DTYPE",
    "PARTICIPANT_DTYPE",
    "FENCE_DTYPE",
    "DEVHEAP_DTYPE",
    "owner_code",
    "split_participant_id",
    "handle_kind",
    "handle_index",
    "abi_header_path",
    "get_include",
]


def get_include() -> str:
    """The folder of hostless's public C headers, for ``-I``: C programs include
    ``<hostless/hostless.h>`` (the ABI: a participant that links nothing) or
    ``<hostless/hostless_engine.h>`` (the engine library's API), as NumPy's
    ``get_include()`` serves extensions."""
    return os.path.join(os.path.dirname(__file__), "include")


def abi_header_path() -> str:
    """Path of ``hostless.h``, the ABI header (for C programs and NVRTC: ``-I`` on its folder
    finds its parts, ``#include "hostless.h"``)."""
    return os.path.join(get_include(), "hostless", "hostless.h")


def _dtype(fields: list[tuple[str, int, Any]], size: int) -> np.dtype:
    return np.dtype(
        {
            "names": [f[0] for f in fields],
            "offsets": [f[1] for f in fields],
            "formats": [f[2] for f in fields],
            "itemsize": size,
        }
    )


HEADER_DTYPE = _dtype(
    [
        ("magic", C.H_MAGIC, "<u8"),
        ("abi_version", C.H_ABI_VERSION, "<u4"),
        ("header_size", C.H_HEADER_SIZE, "<u4"),
        ("total_size", C.H_TOTAL_SIZE, "<u8"),
        ("participant_capacity", C.H_PARTICIPANT_CAPACITY, "<u4"),
        ("fence_capacity", C.H_FENCE_CAPACITY, "<u4"),
        ("participants_offset", C.H_PARTICIPANTS_OFFSET, "<u8"),
        ("fences_offset", C.H_FENCES_OFFSET, "<u8"),
        ("queues_offset", C.H_QUEUES_OFFSET, "<u8"),
        ("queues_size", C.H_QUEUES_SIZE, "<u8"),
        ("trace_offset", C.H_TRACE_OFFSET, "<u8"),
        ("trace_size", C.H_TRACE_SIZE, "<u8"),
        ("heap_offset", C.H_HEAP_OFFSET, "<u8"),
        ("heap_size", C.H_HEAP_SIZE, "<u8"),
        ("tag", C.H_TAG, "<u4"),
        ("created_ns", C.H_CREATED_NS, "<u8"),
        ("poll_ns", C.H_POLL_NS, "<u8"),
        ("epoch", C.H_EPOCH, "<u8"),
        ("ready", C.H_READY, "<u4"),
        ("stats_recovered", C.H_STATS_RECOVERED, "<u8"),
        ("devheap_offset", C.H_DEVHEAP_OFFSET, "<u8"),
        ("devheap_size", C.H_DEVHEAP_SIZE, "<u8"),
        ("devheap_count", C.H_DEVHEAP_COUNT, "<u4"),
    ],
    C.HEADER_SIZE,
)

DEVHEAP_DTYPE = _dtype(
    [
        ("magic", C.DH_MAGIC, "<u8"),
        ("lock", C.DH_LOCK, "<u8"),
        ("device_kind", C.DH_DEVICE_KIND, "<u4"),
        ("device_ordinal", C.DH_DEVICE_ORDINAL, "<u4"),
        ("granule", C.DH_GRANULE, "<u8"),
        ("granules", C.DH_GRANULES, "<u8"),
        ("size", C.DH_SIZE, "<u8"),
        ("used_granules", C.DH_USED_GRANULES, "<u8"),
        ("hint", C.DH_HINT, "<u8"),
        ("repairs", C.DH_REPAIRS, "<u8"),
        ("allocs", C.DH_ALLOCS, "<u8"),
        ("bitmap_offset", C.DH_BITMAP_OFFSET, "<u8"),
    ],
    C.DEVHEAP_SIZE,
)
"""struct hl_devheap: one device heap's descriptor (hostless_layout_regions.h, "Device heaps")."""

PARTICIPANT_DTYPE = _dtype(
    [
        ("ctl", C.P_CTL, "<u8"),
        ("pid", C.P_PID, "<u4"),
        ("start_time", C.P_START_TIME, "<u8"),
        ("label", C.P_LABEL, "S32"),
        ("kind", C.P_KIND, "S16"),
    ],
    C.PARTICIPANT_SIZE,
)

FENCE_DTYPE = _dtype(
    [
        ("word", C.F_WORD, "<u8"),
        ("ctl", C.F_CTL, "<u8"),
        ("refs", C.F_REFS, "<u8"),
        ("waiters", C.F_WAITERS, "<u4"),
        ("owner", C.F_OWNER, "<u4"),
        ("aux", C.F_AUX, "<u8"),
        ("parents", C.F_PARENTS, ("<u8", (int(C.MAX_PARENTS),))),
        ("err", C.F_ERR, "<u8"),
    ],
    C.FENCE_SIZE,
)


def split_participant_id(pid: int) -> tuple[int, int]:
    """Participant id -> (slot index, incarnation)."""
    return pid & 0xFF, pid >> 8


def owner_code(participant_id: int) -> int:
    """Participant id -> the owner field stored in a fence slot (HL_OWNER)."""
    idx, inc = split_participant_id(participant_id)
    return ((inc & 0xFFFFFF) << 8) | (idx + 1)


def handle_kind(h: int) -> int:
    """The kind (``KIND_*``) a 64-bit handle names (HL_HANDLE_KIND)."""
    return (h >> 48) & 0xFF


def handle_index(h: int) -> int:
    """The slot index a 64-bit handle names, -1 for none (HL_HANDLE_INDEX)."""
    return (h & 0xFFFFFF) - 1
