"""What a chaos worker records: the statuses it uses, the anomaly kinds, and the
:class:`Recorder` that counts operations and appends anomalies to the worker's log."""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Any

from hostless._abi import C
from hostless.status import Status

SUCCESS = int(Status.SUCCESS)
ERROR = int(Status.ERROR)
CANCEL = int(Status.CANCEL)
OWNER_DIED = int(Status.OWNER_DIED)
OWNER_LEFT = int(Status.OWNER_LEFT)  # its owner left with close() (ABI 6: leaving is not dying)
_FAILED = int(C.TIMELINE_FAILED)
_SLOT_FREE = int(C.SLOT_FREE)

# Statuses a worker signals with.  77 is never used: tests of the harness
# write it into words to play a stale write.
_FAIL_STATUSES = (ERROR, ERROR, CANCEL, OWNER_DIED, 64, 1000, 0xFFFFFFFF)
HUNG_TIMEOUT = 2.0
"""Seconds a worker waits on an object it already completed before calling it hung."""

ANOMALY_KINDS: dict[str, str] = {
    "fresh_not_active": "a new fence/merge not ACTIVE, a new timeline not at its initial value",
    "unexpected_completion": "an object completed, moved or failed that its owner had not signaled",
    "already_signaled": "AlreadySignaled from the first signal of a private fence (or timeline)",
    "wrong_status": "a signaled fence reads another status than the one it was signaled with",
    "merge_early": "a merged fence completed while one of its children was still ACTIVE",
    "merge_status": "a merged fence's status is not SUCCESS / the first failure propagated",
    "timeline_value": "a timeline value or failure that its owner did not set",
    "hung": "a wait on an already completed object timed out",
    "wait_status": "a wait returned another status than the object's",
    "invalid_handle": "InvalidHandle on an object the worker holds",
    "refused": "a valid operation was refused",
    "not_refused": "an invalid operation (second signal, signal of a merge, ...) was accepted",
    "buffer_corrupt": "a heap buffer's contents changed behind its owner's back",
    "unexpected_exception": "any other exception from the library",
    "worker_crash": "a worker process died on its own (traceback or unexpected exit status)",
    "worker_stuck": "a worker never became ready, or did not stop within 40 s when asked to",
    "shared_status": "a published object completed with a status other than its plan or OWNER_DIED",
}


def _sname(w: int) -> str:
    """A status word as a name (``SUCCESS``, ``CUSTOM_64``) or in hex when it is none."""
    if w == 0:
        return "ACTIVE"
    try:
        return Status(w).name
    except ValueError:
        return f"{w:#x}"


def _slot(handle: int) -> int:
    return (handle & 0xFFFFFF) - 1


# --------------------------------------------------------------------------- recording


class Recorder:
    """Counts operations and records anomalies; with a path, appends them as JSON lines.

    Every line is one ``write()`` on an ``O_APPEND`` descriptor, so a record is
    either entirely in the file or not at all when the process is SIGKILLed.
    At most ``max_lines`` anomaly lines are written (the counts go on).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, max_lines: int = 300) -> None:
        self.fd = -1 if path is None else os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC)
        self.ops: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()
        self.anomalies: list[dict[str, Any]] = []
        self.max_lines = max_lines
        self._last_stats = time.monotonic()

    def write(self, rec: dict[str, Any]) -> None:
        if self.fd >= 0:
            os.write(self.fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())

    def op(self, name: str) -> None:
        self.ops[name] += 1

    def anomaly(self, kind: str, detail: str) -> None:
        self.counts[kind] += 1
        rec = {"t": "anomaly", "kind": kind, "detail": detail, "op": sum(self.ops.values())}
        if len(self.anomalies) < self.max_lines:
            self.anomalies.append(rec)
            self.write(rec)

    def stats(self, *, force: bool = False) -> None:
        """Write the cumulative counts (at most every 0.2 s unless ``force``)."""
        now = time.monotonic()
        if force or now - self._last_stats >= 0.2:
            self._last_stats = now
            self.write({"t": "stats", "ops": dict(self.ops), "anomalies": dict(self.counts)})

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
