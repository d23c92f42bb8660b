"""Protocol stress harness: processes hammer one domain, and any anomaly is a protocol bug.

``hostless chaos`` (and :func:`run`) starts worker processes on one small
domain (a few hundred fence slots, so that slots are reused all the time),
optionally SIGKILLs random workers at random times and starts replacements,
then stops the rest and checks the domain.

**What an anomaly is, and why every anomaly is a protocol bug.**  Each worker
only uses objects that are *private* to it: fences, merged fences (and merges
of merges), timelines and heap buffers that it created and whose handles it
never gives away.  Nobody else may signal, fail, advance, free or write them.
So the worker knows exactly what every one of its objects must read at every
moment, and keeps that knowledge in a model (:class:`ChaosWorker`).  An
anomaly is any observation that differs from the model:

* ``fresh_not_active``: a new fence or merge (of ACTIVE children) is not
  ACTIVE, a new timeline is not at its initial value;
* ``unexpected_completion``: a fence it has not signaled reads signaled (or a
  wait on it returns), a timeline moved or failed without it;
* ``already_signaled``: AlreadySignaled from its first signal of its own fence
  (or from a timeline it never failed);
* ``wrong_status``: a signaled fence reads another status than the one given;
* ``merge_early``: a merged fence completed while a child was still ACTIVE;
* ``merge_status``: a merged fence completed with a status other than the
  documented one: SUCCESS when every child succeeded, else the first failure
  propagated (see :meth:`ChaosWorker._child_done` for the exact rule);
* ``timeline_value``: a timeline value or failure it did not set;
* ``hung``: a wait on an object it had already completed timed out (2 s);
* ``wait_status``: such a wait returned another status than the object's;
* ``invalid_handle``: InvalidHandle on an object it holds;
* ``refused`` / ``not_refused``: an operation the API documents as valid was
  refused, or one it documents as an error (second signal, signal of a merge,
  a third live merge of one fence, a timeline value that does not grow) was
  accepted;
* ``buffer_corrupt``: a heap buffer's contents changed behind its back;
* ``unexpected_exception``: any other exception from the library;
* from the driver: ``worker_crash`` (a worker died on its own), ``worker_stuck``
  (a worker did not stop when asked), ``shared_status`` (see below).

Since no other participant may legally touch these objects, a correct
protocol produces *no* anomaly at all, whatever the interleaving, however
loaded the machine and whoever is killed: there is no "flaky" anomaly.

**The mix** (:meth:`ChaosWorker.step`): create fences and timelines (new
objects are checked at once), merge 1-4 of its fences or merges (trees up to
4 levels; a fence in at most two live merges), signal fences with random
statuses (SUCCESS, ERROR, CANCEL, OWNER_DIED, custom), complete a merge (signal
every ACTIVE leaf under it, then wait on it: it must return at once), advance
and fail timelines, wait (2 s on what it completed, which must return at once;
0-0.5 ms on what is ACTIVE, which must time out), release in random order (an
ACTIVE fence's release is a CANCEL its merges see), probe refused operations,
buffers with a per-buffer pattern, and *churn*: the reported pattern (fences,
a merge of them, signal all, wait, release the merge then the fences, then a
new timeline in a just-freed slot), where freed slots are reused at once by
the other workers while late propagations may still aim at them.  Every
object is checked after each operation that may change it, before its
release, and all of them every 16 operations.  Mode ``"repro"`` runs only the
reported loop.

**Shared objects.**  Some workers also publish fences and timelines (in their
log) that the driver's threads import.  The owner signals a fence with the
status it published in advance, or never; a published timeline only advances;
the owner may also drop its own reference while the driver still holds one.
The driver either waits on the object or holds it a moment and drops it
(which may free it, maybe while its dead owner is being recovered).  When the
owner is SIGKILLed or leaves, every wait must return (OWNER_DIED, or the
fence's published status): a wait still pending ``hung_after`` seconds after
its owner died is a *hung waiter*.

**After the run** (every worker stopped or killed and reaped): ``dom.check()``
must be empty and, once the driver released what it holds, every slot of the
fence table must be FREE with no reference bit and the heap empty (a *leak*
otherwise).

Workers are separate interpreters started with ``sys.executable -m
hostless.chaos worker ...`` (never forked from a process that has a domain
open).  A worker appends JSON lines to its log file with one ``write()`` each
(``ready``, every ``anomaly`` at once, cumulative ``stats`` every 0.2 s,
``pub`` for shared objects, ``done``), so that what it found survives a
SIGKILL.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._abi import FENCE_DTYPE, C
from .buffer import Buffer
from .domain import Domain
from .errors import (
    AlreadySignaled,
    DomainFull,
    InvalidHandle,
    InvalidOperation,
    OutOfMemory,
)
from .fence import Fence
from .status import Status
from .timeline import Timeline

__all__ = [
    "ANOMALY_KINDS",
    "WorkerConfig",
    "Recorder",
    "ChaosWorker",
    "worker_main",
    "run",
    "report_markdown",
    "summary_lines",
    "write_results",
]

SUCCESS = int(Status.SUCCESS)
ERROR = int(Status.ERROR)
CANCEL = int(Status.CANCEL)
OWNER_DIED = int(Status.OWNER_DIED)
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


# --------------------------------------------------------------------------- the worker's model


class _Node:
    """A fence or merged fence of the worker, with what it must read.

    ``final`` is None while the object must be ACTIVE, else its status as two
    readings of the merge rule (``[eager, lazy]``, see ChaosWorker._child_done;
    both equal for a plain fence).  ``parents`` are the live merges it belongs
    to (at most two), ``children`` / ``pending`` those of a merge.
    """

    __slots__ = (
        "obj",
        "handle",
        "merged",
        "final",
        "err",
        "parents",
        "children",
        "pending",
        "tainted",
        "log",
    )

    def __init__(self, obj: Fence, merged: bool, children: Sequence[_Node] = ()) -> None:
        self.obj = obj
        self.handle = obj.handle
        self.merged = merged
        self.final: tuple[int, int] | None = None
        self.err: list[int | None] = [None, None]
        self.parents: list[_Node] = []
        self.children: list[_Node] = list(children)
        self.pending: set[int] = {id(c) for c in children}
        self.tainted = False
        self.log: list[str] = []

    def name(self) -> str:
        kind = "merge" if self.merged else "fence"
        return f"{kind} {self.handle:#x} (slot {_slot(self.handle)})"

    def descendants(self) -> set[int]:
        out = {id(self)}
        for c in self.children:
            out |= c.descendants()
        return out

    def depth(self) -> int:
        return 1 + max((c.depth() for c in self.children), default=0)


class _Tl:
    __slots__ = ("obj", "handle", "value", "failed", "tainted")

    def __init__(self, obj: Timeline, value: int) -> None:
        self.obj = obj
        self.handle = obj.handle
        self.value = value
        self.failed: int | None = None
        self.tainted = False

    def name(self) -> str:
        return f"timeline {self.handle:#x} (slot {_slot(self.handle)})"

    def expected_word(self) -> int:
        return (_FAILED | self.failed) if self.failed is not None else self.value


class _Buf:
    __slots__ = ("obj", "tag")

    def __init__(self, obj: Buffer, tag: int) -> None:
        self.obj = obj
        self.tag = tag


class _Shared:
    """A fence or timeline published to the driver: ``plan`` is the status the fence will get."""

    __slots__ = ("obj", "plan", "signaled", "value", "bad")

    def __init__(self, obj: Fence | Timeline, plan: int) -> None:
        self.obj = obj
        self.plan = plan
        self.signaled = False
        self.value = 0
        self.bad = False


@dataclass
class WorkerConfig:
    """What a worker does.  ``mode``: ``"mix"`` (random operations) or ``"repro"`` (the fixed loop
    fence, fence, merge, signal, signal, wait, release x3, new timeline)."""

    seed: int = 0
    mode: str = "mix"
    iterations: int = 0
    """Operations (mix) or loop iterations (repro) before leaving on its own; 0: until stopped."""
    max_seconds: float = 600.0
    """Leaves on its own after this long (a safety net if the driver is gone)."""
    max_nodes: int = 24
    max_timelines: int = 6
    max_buffers: int = 6
    nested: bool = True
    """Merges of merges (trees up to 4 levels)."""
    buffers: bool = True
    shared: bool = False
    """Publish fences / timelines for the driver to wait on."""
    watchdog: float = 0.02


class ChaosWorker:
    """One participant doing random operations on private objects and checking each against its model.

    Usable in-process (tests of the harness build one on a Domain they
    created) or as a worker process (:func:`worker_main`).
    """

    def __init__(self, dom: Domain, cfg: WorkerConfig, rec: Recorder) -> None:
        self.dom = dom
        self.cfg = cfg
        self.rec = rec
        self.rnd = random.Random(cfg.seed)
        self.nodes: dict[int, _Node] = {}
        self.timelines: dict[int, _Tl] = {}
        self.buffers: list[_Buf] = []
        self.shared: list[_Shared] = []
        self.tainted: list[_Node | _Tl] = []
        self.nops = 0
        self._tag = (dom.participant_id & 0xFFFFFFFF) << 32
        self._nbuf = 0
        self.stop = False

    # ------------------------------------------------------------ anomalies
    def anomaly(self, kind: str, what: str, detail: str) -> None:
        self.rec.anomaly(kind, f"{what}: {detail}")

    def _taint(self, o: _Node | _Tl) -> None:
        """Stop checking ``o`` (its state is unknown after an anomaly) and, for a fence,
        every merge above it; they are released later without checks."""
        if o.tainted:
            return
        o.tainted = True
        if isinstance(o, _Node):
            self.nodes.pop(o.handle, None)
            for p in o.parents:
                self._taint(p)
        else:
            self.timelines.pop(o.handle, None)
        self.tainted.append(o)

    def _unexpected(self, o: _Node | _Tl | None, what: str, e: BaseException) -> None:
        if isinstance(e, InvalidHandle):
            self.anomaly("invalid_handle", what, f"{type(e).__name__}: {e}")
        else:
            tb = "".join(traceback.format_exception_only(type(e), e)).strip()
            self.anomaly("unexpected_exception", what, tb)
        if o is not None:
            self._taint(o)

    # --------------------------------------------------------------- reads
    def _word(self, o: _Node | _Tl) -> int | None:
        try:
            return int(o.obj._core.word(o.handle))
        except Exception as e:
            self._unexpected(o, f"reading {o.name()}", e)
            return None

    def check_node(self, n: _Node, where: str) -> bool:
        """Compare a fence / merge with the model; False (and an anomaly) when it differs."""
        if n.tainted:
            return True
        w = self._word(n)
        if w is None:
            return False
        if n.final is None:
            if w == 0:
                return True
            if n.merged:
                active = [c.name() for c in n.children if c.final is None]
                self.anomaly(
                    "merge_early",
                    n.name(),
                    f"{where}: completed {_sname(w)} while children {active} are ACTIVE; {n.log}",
                )
            else:
                self.anomaly("unexpected_completion", n.name(), f"{where}: reads {_sname(w)}, never signaled")
        else:
            if w in n.final:
                return True
            exp = " or ".join(sorted({_sname(s) for s in n.final}))
            if n.merged:
                kids = [_sname(c.final[0]) if c.final else "ACTIVE" for c in n.children]
                self.anomaly(
                    "merge_status",
                    n.name(),
                    f"{where}: reads {_sname(w)}, expected {exp} (children {kids}; {n.log})",
                )
            else:
                self.anomaly("wrong_status", n.name(), f"{where}: reads {_sname(w)}, signaled {exp}")
        self._taint(n)
        return False

    def check_timeline(self, t: _Tl, where: str) -> bool:
        if t.tainted:
            return True
        w = self._word(t)
        if w is None:
            return False
        ok = w == t.expected_word()
        if ok and t.failed is not None:
            try:
                aux = int(t.obj._core.aux(t.handle))
            except Exception as e:
                self._unexpected(t, f"reading {t.name()}", e)
                return False
            if aux != t.value:
                self.anomaly("timeline_value", t.name(), f"{where}: failed at value {aux}, was {t.value}")
                self._taint(t)
                return False
        if not ok:
            got = f"failed {_sname(w & 0xFFFFFFFF)}" if w & _FAILED else f"value {w}"
            exp = f"failed {_sname(t.failed)}" if t.failed is not None else f"value {t.value}"
            self.anomaly("timeline_value", t.name(), f"{where}: reads {got}, expected {exp}")
            self._taint(t)
        return ok

    def check_buffer(self, b: _Buf, where: str) -> bool:
        try:
            a = b.obj.numpy()
            bad = int(np.count_nonzero(a != np.uint64(b.tag)))
        except Exception as e:
            self._unexpected(None, f"reading buffer {b.obj.handle:#x}", e)
            return False
        if bad:
            first = int(a[np.nonzero(a != np.uint64(b.tag))[0][0]])
            self.anomaly(
                "buffer_corrupt",
                f"buffer {b.obj.handle:#x}",
                f"{where}: {bad} of {a.size} words changed (one reads {first:#x}, wrote {b.tag:#x})",
            )
            b.tag = -1  # checked no more
            return False
        return True

    def check_shared(self, s: _Shared, where: str) -> None:
        """A published object: only its owner signals or advances it (the driver only waits)."""
        if s.bad:
            return
        try:
            w = int(s.obj._core.word(s.obj.handle))
        except Exception as e:
            self._unexpected(None, f"reading published {s.obj.handle:#x}", e)
            s.bad = True
            return
        exp = s.value if isinstance(s.obj, Timeline) else (s.plan if s.signaled else 0)
        if w != exp:
            kind = "timeline_value" if isinstance(s.obj, Timeline) else "unexpected_completion"
            self.anomaly(kind, f"published {s.obj.handle:#x}", f"{where}: reads {w:#x}, expected {exp:#x}")
            s.bad = True  # reported once

    def _ancestors(self, n: _Node) -> list[_Node]:
        out: list[_Node] = []
        todo = list(n.parents)
        while todo:
            p = todo.pop()
            if p not in out:
                out.append(p)
                todo.extend(p.parents)
        return out

    def check_around(self, n: _Node, where: str) -> None:
        """Check ``n`` and every merge above it (the objects an operation on ``n`` may change)."""
        self.check_node(n, where)
        for p in self._ancestors(n):
            self.check_node(p, where)

    def verify_all(self, where: str = "periodic check") -> None:
        """Check every object the worker holds against the model."""
        for n in list(self.nodes.values()):
            self.check_node(n, where)
        for t in list(self.timelines.values()):
            self.check_timeline(t, where)
        for b in self.buffers:
            if b.tag != -1:
                self.check_buffer(b, where)
        for s in self.shared:
            self.check_shared(s, where)

    # -------------------------------------------------- the merge rule (model)
    def _complete(self, n: _Node, fin: tuple[int, int]) -> None:
        n.final = fin
        for p in list(n.parents):
            self._child_done(p, n, fin)

    def _record_eager(self, p: _Node, s: int) -> None:
        if p.final is not None or p.err[0] is not None:
            return
        p.err[0] = s
        for q in p.parents:
            self._record_eager(q, s)

    def _child_done(self, p: _Node, child: _Node, fin: tuple[int, int]) -> None:
        """Child ``child`` of merge ``p`` completed with ``fin``: the documented rule.

        A merge completes when its last child does, with SUCCESS when no
        failure reached it, else the first failure that reached it (docs/abi.md
        section 5: CAS ``err`` from 0 to a failed child's status, clear the
        child's pending bit, the one clearing the last bit stores ``err`` or
        SUCCESS).  For merges of merges two readings are accepted:
        *eager* (index 0), the current core's: a failure is also recorded at
        once in every merge above that has none yet, so the first failure in
        time wins across a tree; *lazy* (index 1): a merged child's failure
        reaches its parent when that child completes.  Both agree on flat
        merges; children already completed when the merge is made count in
        list order.  (Fences belonging to two merges under a common ancestor
        are never built, so the order of a fence's two parent links does not
        matter.)
        """
        if p.final is not None:
            return
        if fin[0] != SUCCESS:
            self._record_eager(p, fin[0])
        if fin[1] != SUCCESS and p.err[1] is None:
            p.err[1] = fin[1]
        p.pending.discard(id(child))
        p.log.append(f"{_slot(child.handle)}:{_sname(fin[0])}")
        if not p.pending:
            self._complete(p, (p.err[0] or SUCCESS, p.err[1] or SUCCESS))

    # ---------------------------------------------------------- operations
    def _status(self, success: float = 0.6) -> int:
        return SUCCESS if self.rnd.random() < success else self.rnd.choice(_FAIL_STATUSES)

    def new_fence(self) -> _Node | None:
        self.rec.op("fence")
        try:
            f = self.dom.fence()
        except DomainFull:
            self.rec.op("full")
            return None
        n = _Node(f, False)
        n.log.append(f"new@{self.nops}")
        self.nodes[n.handle] = n
        w = self._word(n)
        if w is not None and w != 0:
            self.anomaly("fresh_not_active", n.name(), f"new fence reads {_sname(w)}")
            self._taint(n)
        return n

    def new_timeline(self, initial: int = 0) -> _Tl | None:
        self.rec.op("timeline")
        try:
            t = self.dom.timeline(initial)
        except DomainFull:
            self.rec.op("full")
            return None
        except Exception as e:
            # Domain.timeline(initial) signals the initial value: a ValueError or
            # AlreadySignaled there means the fresh word was not 0.
            self.anomaly("fresh_not_active", f"new timeline (initial {initial})", f"{type(e).__name__}: {e}")
            return None
        tl = _Tl(t, initial)
        self.timelines[tl.handle] = tl
        w = self._word(tl)
        if w is not None and w != initial:
            got = f"failed {_sname(w & 0xFFFFFFFF)}" if w & _FAILED else f"value {w}"
            self.anomaly("fresh_not_active", tl.name(), f"new timeline reads {got}, expected {initial}")
            self._taint(tl)
        return tl

    def new_merge(self, kids: Sequence[_Node]) -> _Node | None:
        self.rec.op("merge")
        try:
            m = self.dom.merge([k.obj for k in kids])
        except DomainFull:
            self.rec.op("full")
            return None
        except Exception as e:
            names = [k.name() for k in kids]
            kind = "refused" if isinstance(e, InvalidOperation) else None
            if kind:
                self.anomaly(kind, "merge", f"of {names} (each in < 2 merges): {e}")
            else:
                self._unexpected(None, f"merge of {names}", e)
            for k in kids:
                self._taint(k)
            return None
        n = _Node(m, True, kids)
        n.log.append(f"new@{self.nops}")
        self.nodes[n.handle] = n
        for k in kids:
            k.parents.append(n)
        for k in kids:
            if k.final is not None:
                self._child_done(n, k, k.final)
        if any(k.tainted for k in kids):  # (repro loop) a child already showed an anomaly
            self._taint(n)
            return n
        w = self._word(n)
        if w is not None and w != 0 and n.final is None:
            self.anomaly(
                "fresh_not_active", n.name(), f"new merge with ACTIVE children reads {_sname(w)}; {n.log}"
            )
            self._taint(n)
        else:
            self.check_node(n, "new merge")
        return n

    def signal(self, n: _Node, status: int) -> None:
        """Signal a leaf fence the model says is ACTIVE (a tainted one without checks)."""
        self.rec.op("signal")
        if n.tainted:
            try:
                n.obj.signal(status)
            except Exception:
                pass
            return
        try:
            n.obj.signal(status)
        except AlreadySignaled as e:
            self.anomaly("already_signaled", n.name(), f"first signal ({_sname(status)}): {e}; {n.log}")
            self._taint(n)
            return
        except Exception as e:
            self._unexpected(n, f"signal {n.name()}", e)
            return
        n.log.append(f"sig {_sname(status)}@{self.nops}")
        self._complete(n, (status, status))
        self.check_around(n, f"after signal {_sname(status)}")

    def release_node(self, n: _Node) -> None:
        """Check, then release (a stale write just before the release is seen too)."""
        self.rec.op("release")
        if not self.check_node(n, "before release"):
            return  # tainted: released later without checks
        self.nodes.pop(n.handle, None)
        parents = list(n.parents)
        try:
            n.obj.release()
        except Exception as e:
            self._unexpected(n, f"release {n.name()}", e)
            return
        if n.final is None:  # the last reference of an ACTIVE fence: CANCEL
            self._complete(n, (CANCEL, CANCEL))
        for c in n.children:
            if n in c.parents:
                c.parents.remove(n)
        n.parents = []
        for p in parents:
            self.check_around(p, f"after release of {n.name()}")

    def release_timeline(self, t: _Tl) -> None:
        self.rec.op("release")
        if not self.check_timeline(t, "before release"):
            return
        self.timelines.pop(t.handle, None)
        try:
            t.obj.release()
        except Exception as e:
            self._unexpected(t, f"release {t.name()}", e)

    def wait_node(self, n: _Node, what: str = "wait") -> None:
        """Wait on a completed node (must return its status at once) or briefly on an ACTIVE one
        (must time out)."""
        self.rec.op("wait")
        if n.final is not None:
            try:
                st = int(n.obj.wait(HUNG_TIMEOUT))
            except TimeoutError:
                self.anomaly("hung", n.name(), f"{what}: not completed within {HUNG_TIMEOUT} s; {n.log}")
                self._taint(n)
                return
            except Exception as e:
                self._unexpected(n, f"{what} {n.name()}", e)
                return
            if st not in n.final:
                exp = " or ".join(sorted({_sname(s) for s in n.final}))
                kind = "merge_status" if n.merged else "wait_status"
                self.anomaly(kind, n.name(), f"{what} returned {_sname(st)}, expected {exp}; {n.log}")
                self._taint(n)
            return
        try:
            st = int(n.obj.wait(self.rnd.choice((0.0, 0.0, 0.0005))))
        except TimeoutError:
            return
        except Exception as e:
            self._unexpected(n, f"{what} {n.name()}", e)
            return
        kind = "merge_early" if n.merged else "unexpected_completion"
        self.anomaly(kind, n.name(), f"{what} on an ACTIVE object returned {_sname(st)}; {n.log}")
        self._taint(n)

    def leaves(self, n: _Node) -> list[_Node]:
        if not n.merged:
            return [n]
        out: list[_Node] = []
        for c in n.children:
            out += self.leaves(c)
        return out

    def complete_merge(self, m: _Node) -> None:
        """Signal every ACTIVE leaf under ``m`` in random order (checking ``m`` stays ACTIVE until the
        last), then wait on ``m``: it must return at once with the expected status."""
        self.rec.op("complete_merge")
        todo = [leaf for leaf in self.leaves(m) if leaf.final is None and not leaf.tainted]
        self.rnd.shuffle(todo)
        for leaf in todo:
            if m.tainted:
                return
            self.signal(leaf, self._status(0.8))
        if not m.tainted and m.final is not None:
            self.wait_node(m, "wait on a merge after signaling all its children")

    # ---------------------------------------------------------- timelines
    def tl_signal(self, t: _Tl) -> None:
        self.rec.op("tl_signal")
        if t.failed is not None:
            try:
                t.obj.signal(t.value + 1)
            except AlreadySignaled:
                return
            except Exception as e:
                self._unexpected(t, f"signal of failed {t.name()}", e)
                return
            self.anomaly("not_refused", t.name(), f"signal after fail({_sname(t.failed)}) accepted")
            self._taint(t)
            return
        v = t.value + self.rnd.choice((1, 1, 2, 5, 1000))
        try:
            t.obj.signal(v)
        except (ValueError, AlreadySignaled) as e:
            if isinstance(e, InvalidHandle):
                self._unexpected(t, f"signal {t.name()}", e)
                return
            kind = "already_signaled" if isinstance(e, AlreadySignaled) else "timeline_value"
            self.anomaly(kind, t.name(), f"signal({v}) from value {t.value} refused: {e}")
            self._taint(t)
            return
        except Exception as e:
            self._unexpected(t, f"signal {t.name()}", e)
            return
        t.value = v
        self.check_timeline(t, f"after signal({v})")

    def tl_fail(self, t: _Tl) -> None:
        self.rec.op("tl_fail")
        s = self.rnd.choice(_FAIL_STATUSES)
        try:
            t.obj.fail(s)
        except AlreadySignaled as e:
            if t.failed is None:
                self.anomaly(
                    "already_signaled", t.name(), f"fail({_sname(s)}) of a timeline never failed: {e}"
                )
                self._taint(t)
            return
        except Exception as e:
            self._unexpected(t, f"fail {t.name()}", e)
            return
        if t.failed is not None:
            self.anomaly("not_refused", t.name(), f"second fail ({_sname(s)}) accepted")
            self._taint(t)
            return
        t.failed = s
        self.check_timeline(t, f"after fail({_sname(s)})")

    def tl_wait(self, t: _Tl) -> None:
        self.rec.op("wait")
        if t.failed is not None or self.rnd.random() < 0.6:
            v = self.rnd.randint(0, t.value) if t.failed is None else self.rnd.randint(0, t.value + 3)
            try:
                st = int(t.obj.wait(v, HUNG_TIMEOUT))
            except TimeoutError:
                self.anomaly(
                    "hung", t.name(), f"wait({v}) at value {t.value} not returned in {HUNG_TIMEOUT} s"
                )
                self._taint(t)
                return
            except Exception as e:
                self._unexpected(t, f"wait {t.name()}", e)
                return
            exp = t.failed if t.failed is not None else SUCCESS
            if st != exp:
                self.anomaly(
                    "wait_status", t.name(), f"wait({v}) returned {_sname(st)}, expected {_sname(exp)}"
                )
                self._taint(t)
            return
        v = t.value + 1
        try:
            st = int(t.obj.wait(v, self.rnd.choice((0.0, 0.0005))))
        except TimeoutError:
            return
        except Exception as e:
            self._unexpected(t, f"wait {t.name()}", e)
            return
        self.anomaly("timeline_value", t.name(), f"wait({v}) at value {t.value} returned {_sname(st)}")
        self._taint(t)

    # -------------------------------------------------------------- probes
    def probe(self) -> None:
        """An operation the API must refuse: it must raise the documented error and change nothing."""
        self.rec.op("probe")
        r = self.rnd.random()
        nodes = [n for n in self.nodes.values() if not n.tainted]
        if r < 0.4:
            done = [n for n in nodes if not n.merged and n.final is not None]
            if done:
                n = self.rnd.choice(done)
                try:
                    n.obj.signal(self._status())
                except AlreadySignaled:
                    self.check_around(n, "after a refused second signal")
                    return
                except Exception as e:
                    self._unexpected(n, f"second signal of {n.name()}", e)
                    return
                self.anomaly("not_refused", n.name(), "second signal accepted")
                self._taint(n)
        elif r < 0.6:
            ms = [n for n in nodes if n.merged]
            if ms:
                n = self.rnd.choice(ms)
                try:
                    n.obj.signal(SUCCESS)
                except InvalidOperation:
                    self.check_around(n, "after a refused signal of a merge")
                    return
                except Exception as e:
                    self._unexpected(n, f"signal of {n.name()}", e)
                    return
                self.anomaly("not_refused", n.name(), "signal of a merged fence accepted")
                self._taint(n)
        elif r < 0.8:
            full = [n for n in nodes if len(n.parents) >= 2]
            if full:
                n = self.rnd.choice(full)
                try:
                    m = self.dom.merge([n.obj])
                except InvalidOperation:
                    self.check_around(n, "after a refused third merge")
                    return
                except DomainFull:
                    return
                except Exception as e:
                    self._unexpected(n, f"third merge of {n.name()}", e)
                    return
                self.anomaly("not_refused", n.name(), "a third live merge accepted")
                self._taint(n)
                m.release()
        else:
            tls = [t for t in self.timelines.values() if not t.tainted and t.failed is None]
            if tls:
                t = self.rnd.choice(tls)
                try:
                    t.obj.signal(t.value)
                except ValueError as e:
                    if isinstance(e, InvalidHandle):
                        self._unexpected(t, f"signal {t.name()}", e)
                        return
                    self.check_timeline(t, "after a refused non-growing signal")
                    return
                except Exception as e:
                    self._unexpected(t, f"signal {t.name()}", e)
                    return
                self.anomaly("not_refused", t.name(), f"signal({t.value}) at value {t.value} accepted")
                self._taint(t)

    # ------------------------------------------------------------ buffers
    def buffer_op(self) -> None:
        if len(self.buffers) >= self.cfg.max_buffers or (self.buffers and self.rnd.random() < 0.4):
            b = self.buffers.pop(self.rnd.randrange(len(self.buffers)))
            self.rec.op("buffer_free")
            if b.tag != -1:
                self.check_buffer(b, "before free")
            try:
                b.obj.release()
            except Exception as e:
                self._unexpected(None, f"release buffer {b.obj.handle:#x}", e)
            return
        self.rec.op("buffer")
        n = self.rnd.choice((8, 64, 200, 1024, 2048))
        try:
            obj = self.dom.buffer((n,), "u8")
        except (OutOfMemory, DomainFull):
            self.rec.op("full")
            return
        except Exception as e:
            self._unexpected(None, "buffer allocation", e)
            return
        self._nbuf += 1
        tag = self._tag | (self._nbuf & 0xFFFFFFFF)
        obj.numpy()[:] = np.uint64(tag)
        self.buffers.append(_Buf(obj, tag))

    # ------------------------------------------------------------- shared
    def share_op(self) -> None:
        """Publish a fence (with the status it will get, if any) or a timeline for the driver to wait
        on; signal / advance one; or drop this worker's reference to one (the driver may still hold
        it: it stays owned by this worker, and its other holders release it later, maybe while this
        worker is being recovered)."""
        live = [s for s in self.shared if not s.signaled and not s.bad]
        r = self.rnd.random()
        if len(self.shared) < 4 and r < 0.4:
            self.rec.op("publish")
            try:
                if self.rnd.random() < 0.3:
                    obj: Fence | Timeline = self.dom.timeline()
                    s = _Shared(obj, OWNER_DIED)
                    kind = "T"
                else:
                    obj = self.dom.fence()
                    s = _Shared(obj, self._status(0.5))
                    kind = "F"
            except DomainFull:
                self.rec.op("full")
                return
            self.shared.append(s)
            self.rec.write({"t": "pub", "kind": kind, "handle": obj.handle, "plan": s.plan})
            self.check_shared(s, "new published object")
        elif r < 0.8 and live:
            s = self.rnd.choice(live)
            self.rec.op("publish_signal")
            try:
                if isinstance(s.obj, Timeline):
                    s.value += 1
                    s.obj.signal(s.value)
                else:
                    s.obj.signal(s.plan)
                    s.signaled = True
            except Exception as e:
                self._unexpected(None, f"signal of published {s.obj.handle:#x}", e)
                s.bad = True
            self.check_shared(s, "after signal")
        elif self.shared:
            s = self.shared.pop(self.rnd.randrange(len(self.shared)))
            self.rec.op("unpublish")
            self.check_shared(s, "before release")
            try:
                s.obj.release()
            except Exception as e:
                self._unexpected(None, f"release of published {s.obj.handle:#x}", e)

    # --------------------------------------------------------------- loop
    def churn(self) -> None:
        """The reported pattern, a few times: fences, a merge of them, signal all, wait on the
        merge, release the merge then the fences (freed merges and fences are reused at once by
        the other workers, while late propagations may still aim at them)."""
        self.rec.op("churn")
        for _ in range(self.rnd.randint(1, 4)):
            kids = [self.new_fence() for _ in range(self.rnd.randint(1, 3))]
            fs = [k for k in kids if k is not None]
            m = self.new_merge(fs) if fs else None
            for f in fs:
                self.signal(f, self._status(0.8))
            if m is not None and not m.tainted:
                self.wait_node(m, "wait on a merge after signaling all its children")
            for o in ([m] if m is not None else []) + fs:
                self._release_any(o)
            if self.rnd.random() < 0.5:  # a new timeline in a slot just freed: must read 0
                t = self.new_timeline()
                if t is not None:
                    self._release_any(t)
        while self.tainted and len(self.tainted) > 4:
            self._drop(self.tainted[0])

    def _pick_kids(self) -> list[_Node]:
        cands = [
            n
            for n in self.nodes.values()
            if not n.tainted and len(n.parents) < 2 and (self.cfg.nested or not n.merged) and n.depth() < 4
        ]
        self.rnd.shuffle(cands)
        want = self.rnd.randint(1, 4)
        kids: list[_Node] = []
        seen: set[int] = set()
        for c in cands:
            d = c.descendants()
            if d & seen:  # no fence twice below one merge (see _child_done)
                continue
            kids.append(c)
            seen |= d
            if len(kids) == want:
                break
        return kids

    def release_some(self) -> None:
        """Release a random object (tainted ones first, without checks)."""
        if self.tainted:
            self.rec.op("release")
            self._drop(self.tainted[-1])
            return
        if self.timelines and self.rnd.random() < 0.25:
            self.release_timeline(self.rnd.choice(list(self.timelines.values())))
        elif self.nodes:
            self.release_node(self.rnd.choice(list(self.nodes.values())))

    def step(self) -> None:
        """One random operation (the mix)."""
        self.nops += 1
        rnd = self.rnd
        r = rnd.random() * 100
        nodes = [n for n in self.nodes.values() if not n.tainted]
        if len(self.nodes) >= self.cfg.max_nodes or len(self.tainted) > 4:
            self.release_some()
        elif r < 8:
            self.new_fence()
        elif r < 15:
            kids = self._pick_kids()
            if kids:
                self.new_merge(kids)
        elif r < 24:
            act = [n for n in nodes if not n.merged and n.final is None]
            if act:
                self.signal(rnd.choice(act), self._status())
        elif r < 28:
            ms = [n for n in nodes if n.merged and n.final is None]
            if ms:
                self.complete_merge(rnd.choice(ms))
        elif r < 53:
            self.churn()
        elif r < 57:
            if len(self.timelines) < self.cfg.max_timelines:
                self.new_timeline(0 if rnd.random() < 0.7 else rnd.randint(1, 5))
            else:
                self.release_timeline(rnd.choice(list(self.timelines.values())))
        elif r < 62:
            if self.timelines:
                self.tl_signal(rnd.choice(list(self.timelines.values())))
        elif r < 64:
            if self.timelines:
                self.tl_fail(rnd.choice(list(self.timelines.values())))
        elif r < 73:
            if nodes and (not self.timelines or rnd.random() < 0.7):
                self.wait_node(rnd.choice(nodes))
            elif self.timelines:
                self.tl_wait(rnd.choice(list(self.timelines.values())))
        elif r < 85:
            self.release_some()
        elif r < 88:
            self.probe()
        elif r < 93:
            if self.cfg.buffers:
                self.buffer_op()
        elif r < 98:
            if self.cfg.shared:
                self.share_op()
        elif r < 98.5:
            self.rec.op("reap")
            try:
                self.dom.reap()
            except Exception as e:
                self._unexpected(None, "reap", e)
        else:
            self.verify_all()
        if self.nops % 16 == 0:
            self.verify_all()

    def repro_iteration(self) -> None:
        """The reported loop: ``a, b = fence(), fence(); m = merge([a, b]); a.signal(); b.signal();
        m.wait(1); release m, a, b``, then a new timeline (must read 0), released."""
        self.nops += 1
        self.rec.op("iteration")
        a, b = self.new_fence(), self.new_fence()
        if a is not None and b is not None:
            m = self.new_merge([a, b])
            self.signal(a, SUCCESS)
            self.signal(b, SUCCESS)
            if m is not None:
                if not m.tainted:
                    self.wait_node(m, "m.wait")
                self._release_any(m)
        for n in (a, b):
            if n is not None:
                self._release_any(n)
        t = self.new_timeline()
        if t is not None:
            self.check_timeline(t, "new timeline")
            self._release_any(t)
        while self.tainted:  # objects of this iteration that showed an anomaly
            self._release_any(self.tainted[-1])

    def _drop(self, o: _Node | _Tl) -> None:
        """Release a tainted object without checks (its state is unknown)."""
        if o in self.tainted:
            self.tainted.remove(o)
        try:
            o.obj.release()
        except Exception:
            pass
        if isinstance(o, _Node):
            for c in o.children:
                if o in c.parents:
                    c.parents.remove(o)

    def _release_any(self, o: _Node | _Tl) -> None:
        if o.tainted:
            self._drop(o)
        elif isinstance(o, _Node):
            self.release_node(o)
        else:
            self.release_timeline(o)

    def run(self) -> None:
        """Operate until ``stop`` is set, the iteration count or ``max_seconds`` is reached."""
        deadline = time.monotonic() + self.cfg.max_seconds
        parent = os.getppid()
        i = 0
        while not self.stop:
            i += 1
            if self.cfg.iterations and i > self.cfg.iterations:
                break
            try:
                if self.cfg.mode == "repro":
                    self.repro_iteration()
                else:
                    self.step()
            except Exception as e:  # a bug of the harness or an exception no check expected
                self._unexpected(None, "operation", e)
            if i % 64 == 0:
                self.rec.stats()
                if time.monotonic() > deadline or os.getppid() != parent:
                    break
        self.finish()

    def finish(self) -> None:
        """Check everything, then release every object in random order, checking as it goes."""
        self.verify_all("final check")
        while self.tainted:
            self._drop(self.tainted[-1])
        objs: list[_Node | _Tl | _Buf] = [*self.nodes.values(), *self.timelines.values(), *self.buffers]
        self.rnd.shuffle(objs)
        self.buffers = []
        for o in objs:
            if isinstance(o, _Buf):
                if o.tag != -1:
                    self.check_buffer(o, "before free")
                try:
                    o.obj.release()
                except Exception as e:
                    self._unexpected(None, f"release buffer {o.obj.handle:#x}", e)
            else:
                self._release_any(o)
        while self.tainted:  # those an anomaly found during these releases
            self._drop(self.tainted[-1])


# --------------------------------------------------------------------------- worker process


def _worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hostless.chaos worker")
    p.add_argument("domain")
    p.add_argument("log")
    p.add_argument("--config", required=True, help="WorkerConfig as JSON")
    return p


def worker_main(argv: Sequence[str]) -> int:
    """A worker process: join, say ``ready``, operate until SIGTERM (or the configured end), leave.

    SIGTERM asks it to stop: it finishes its operation, checks and releases
    everything, closes the domain and writes ``done``.
    """
    args = _worker_parser().parse_args(argv)
    cfg = WorkerConfig(**json.loads(args.config))
    rec = Recorder(args.log)
    w: ChaosWorker | None = None

    def on_term(signum: int, frame: object) -> None:
        if w is not None:
            w.stop = True

    signal.signal(signal.SIGTERM, on_term)
    dom = Domain.open(args.domain, label=f"chaos{cfg.seed % 100000}", watchdog_interval=cfg.watchdog)
    w = ChaosWorker(dom, cfg, rec)
    rec.write({"t": "ready", "pid": os.getpid(), "participant": dom.participant_id})
    try:
        w.run()
    except BaseException as e:  # noqa: B036 - recorded, then re-raised
        rec.anomaly("unexpected_exception", "".join(traceback.format_exception(type(e), e, e.__traceback__)))
        rec.stats(force=True)
        raise
    dom.close()
    rec.stats(force=True)
    rec.write({"t": "done"})
    rec.close()
    return 0


# --------------------------------------------------------------------------- driver


@dataclass
class _Proc:
    n: int
    proc: subprocess.Popen[bytes]
    log: Path
    err: Path
    started: float
    ready_at: float | None = None
    kill_at: float | None = None
    ended_at: float | None = None
    killed: bool = False
    stopping: bool = False
    pos: int = 0
    tail: bytes = b""
    stats: dict[str, Any] = field(default_factory=dict)
    lines: collections.Counter[str] = field(default_factory=collections.Counter)
    done: bool = False


class _Waiters:
    """The driver's threads that wait on objects the workers publish (see the module docstring)."""

    def __init__(
        self, dom: Domain, threads: int, hung_after: float, ended: Callable[[int], float | None], seed: int
    ) -> None:
        self.dom = dom
        self.hung_after = hung_after
        self.ended = ended
        self.lock = threading.Lock()
        self.items: collections.deque[tuple[int, str, int, int]] = collections.deque(maxlen=64)
        self.stop = threading.Event()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.hung: list[str] = []
        self.bad: list[str] = []
        self.gone = 0
        self.held = 0
        self.abandoned = 0
        self.published = 0
        self.threads = [
            threading.Thread(target=self._loop, args=(random.Random(seed + k),), daemon=True)
            for k in range(threads)
        ]
        for t in self.threads:
            t.start()

    def add(self, worker: int, kind: str, handle: int, plan: int) -> None:
        with self.lock:
            self.published += 1
            self.items.append((worker, kind, handle, plan))

    def _loop(self, rnd: random.Random) -> None:
        while not self.stop.is_set():
            with self.lock:
                item = self.items.pop() if self.items else None
            if item is None:
                time.sleep(0.01)
                continue
            worker, kind, handle, plan = item
            try:
                o: Fence | Timeline = (
                    self.dom.import_timeline(handle) if kind == "T" else self.dom.import_fence(handle)
                )
            except InvalidHandle:
                with self.lock:
                    self.gone += 1
                continue
            try:
                if rnd.random() < 0.4:
                    # a holder: keeps its reference a moment and drops it whatever the object's
                    # state (its owner may have dropped its own: this release may free it, maybe
                    # while the owner is being recovered)
                    self.stop.wait(rnd.uniform(0.0, 0.03))
                    with self.lock:
                        self.held += 1
                else:
                    self._wait(o, worker, kind, plan)
            finally:
                o.release()

    def _wait(self, o: Fence | Timeline, worker: int, kind: str, plan: int) -> None:
        t0 = time.monotonic()
        while True:
            try:
                st = int(o.wait(1 << 61, 0.2) if isinstance(o, Timeline) else o.wait(0.2))
                break
            except TimeoutError:
                end = self.ended(worker)
                if end is None and time.monotonic() - t0 > 2.0:
                    with self.lock:  # its owner lives on and may never signal it: wait on another
                        self.abandoned += 1
                    return
                if end is not None and time.monotonic() - end > self.hung_after:
                    with self.lock:
                        self.hung.append(
                            f"{kind} {o.handle:#x} of worker {worker}: not completed {self.hung_after:g} s "
                            "after its owner ended"
                        )
                    return
        ok = {OWNER_DIED} if kind == "T" else {plan, OWNER_DIED}
        with self.lock:
            self.statuses[_sname(st)] += 1
            if st not in ok:
                self.bad.append(
                    f"{kind} {o.handle:#x} of worker {worker}: completed {_sname(st)}, "
                    f"expected {' or '.join(sorted(_sname(s) for s in ok))}"
                )

    def close(self, timeout: float) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout)


def _fence_table(dom: Domain) -> Any:
    h = dom.header()
    return np.frombuffer(
        bytes(dom.raw()), dtype=FENCE_DTYPE, count=int(h["fence_capacity"]), offset=int(h["fences_offset"])
    ).copy()


def leaked_slots(dom: Domain, limit: int = 50) -> list[dict[str, int]]:
    """Fence-table slots that are not FREE or keep reference bits (call when nothing should be held)."""
    t = _fence_table(dom)
    ctl = t["ctl"].astype(np.uint64)
    state = (ctl & np.uint64(0xFF)).astype(np.int64)
    busy = np.nonzero((state != _SLOT_FREE) | (t["refs"] != 0))[0]
    return [
        {
            "slot": int(i),
            "state": int(state[i]),
            "kind": int((int(ctl[i]) >> 24) & 0xFF),
            "refs": int(t["refs"][i]),
            "word": int(t["word"][i]),
            "owner": int(t["owner"][i]),
        }
        for i in busy[:limit]
    ]


def run(
    *,
    workers: int = 3,
    seconds: float = 10.0,
    kills: int = 0,
    fences: int = 512,
    seed: int | None = None,
    mode: str = "mix",
    iterations: int = 0,
    nested: bool = True,
    buffers: bool = True,
    shared: bool = True,
    kill_delay: tuple[float, float] = (0.05, 0.4),
    hung_after: float = 5.0,
    waiters: int = 3,
    log_dir: str | os.PathLike[str] | None = None,
    tamper: Callable[[Domain], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the stress and return its result (see :func:`report_markdown` for the fields).

    ``workers`` run at once.  ``kills`` > 0: SIGKILL a worker
    ``kill_delay`` seconds (uniform) after it is ready and start another,
    until ``kills`` kills are done or ``seconds`` have passed; ``kills`` = 0:
    let them run ``seconds`` (mode ``"mix"``) or ``iterations`` loops each
    (mode ``"repro"``; ``seconds`` is then a time limit).  Then the survivors
    stop gracefully and the domain is checked.  ``result["ok"]`` is True when
    no anomaly, hung waiter, leak or check() finding was seen.

    ``tamper(dom)``, called about every 10 ms while workers run, is for tests of
    the harness itself (they write into the domain to make sure it notices).
    """
    if mode not in ("mix", "repro"):
        raise ValueError(f"mode must be 'mix' or 'repro', got {mode!r}")
    if workers < 1:
        raise ValueError("workers must be >= 1")
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    from .bench import machine_info

    rnd = random.Random(seed)
    machine = machine_info()
    config = {
        "workers": workers,
        "seconds": seconds,
        "kills": kills,
        "fences": fences,
        "seed": seed,
        "mode": mode,
        "iterations": iterations,
        "nested": nested,
        "buffers": buffers,
        "shared": shared,
        "kill_delay": list(kill_delay),
        "hung_after": hung_after,
    }
    say = progress or (lambda s: None)
    name = f"hlchaos-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    tmp = tempfile.TemporaryDirectory(prefix="hlchaos-") if log_dir is None else None
    logs = Path(tmp.name if tmp is not None else str(log_dir))
    logs.mkdir(parents=True, exist_ok=True)

    procs: list[_Proc] = []
    active: list[_Proc] = []
    anomalies: list[dict[str, Any]] = []
    counts: collections.Counter[str] = collections.Counter()
    kills_done = 0
    graceful = 0
    t0 = time.monotonic()

    def driver_anomaly(kind: str, detail: str, worker: int | None = None) -> None:
        counts[kind] += 1
        if len(anomalies) < 200:
            anomalies.append({"kind": kind, "detail": detail, "worker": worker})

    dom = Domain.create(
        name,
        fences=fences,
        participants=min(64, max(16, 2 * workers + 8)),
        heap="4M" if buffers else 0,
        watchdog_interval=0.02,
        label="chaos-driver",
    )
    ended_at: dict[int, float | None] = {}
    pool = _Waiters(dom, waiters, hung_after, lambda n: ended_at.get(n), seed) if shared else None
    try:

        def spawn() -> _Proc:
            n = len(procs) + 1
            cfg = WorkerConfig(
                seed=seed * 1000 + n,
                mode=mode,
                iterations=iterations,
                max_seconds=seconds + 120.0,
                nested=nested,
                buffers=buffers,
                shared=shared and rnd.random() < 0.5,
                watchdog=0.02 if rnd.random() < 0.5 else 0.0,
            )
            log, err = logs / f"w{n}.jsonl", logs / f"w{n}.err"
            log.write_bytes(b"")
            with open(err, "wb") as fe:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "hostless.chaos",
                        "worker",
                        name,
                        str(log),
                        "--config",
                        json.dumps(asdict(cfg)),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=fe,
                )
            p = _Proc(n, proc, log, err, time.monotonic())
            ended_at[n] = None
            procs.append(p)
            active.append(p)
            return p

        def read_log(p: _Proc) -> None:
            with open(p.log, "rb") as fh:
                fh.seek(p.pos)
                data = fh.read()
            p.pos += len(data)
            *lines, p.tail = (p.tail + data).split(b"\n")
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    driver_anomaly("worker_crash", f"unreadable log line {line[:200]!r}", p.n)
                    continue
                t = rec.get("t")
                if t == "ready":
                    p.ready_at = time.monotonic()
                elif t == "anomaly":
                    p.lines[rec["kind"]] += 1
                    if len(anomalies) < 200:
                        anomalies.append({"kind": rec["kind"], "detail": rec["detail"], "worker": p.n})
                elif t == "stats":
                    p.stats = rec
                elif t == "pub" and pool is not None:
                    pool.add(p.n, rec["kind"], int(rec["handle"]), int(rec["plan"]))
                elif t == "done":
                    p.done = True

        def reap_exited(p: _Proc) -> None:
            nonlocal kills_done, graceful
            rc = p.proc.wait()
            ended_at[p.n] = time.monotonic()
            active.remove(p)
            read_log(p)
            if p.killed and rc == -signal.SIGKILL:
                if p.ready_at is not None:
                    kills_done += 1
                return
            err = p.err.read_text(errors="replace")
            if rc == 0 and p.done and "Traceback" not in err:
                graceful += 1
            else:
                driver_anomaly("worker_crash", f"worker {p.n} exited with {rc}: {err[-1500:]}", p.n)

        def poll() -> None:
            for p in list(active):
                read_log(p)
                if p.proc.poll() is not None:
                    reap_exited(p)

        say(f"chaos: seed {seed}, {workers} workers, {kills} kills, {fences} fence slots, mode {mode}")
        if kills > 0:
            deadline = t0 + seconds
            while kills_done < kills and time.monotonic() < deadline:
                while len(active) < workers:
                    spawn()
                poll()
                now = time.monotonic()
                for p in list(active):
                    if kills_done >= kills:
                        break  # exactly the kills asked for, even when two are due in one pass
                    if p.ready_at is not None and p.kill_at is None:
                        p.kill_at = p.ready_at + rnd.uniform(*kill_delay)
                    if p.kill_at is not None and now >= p.kill_at and not p.killed:
                        p.killed = True
                        p.proc.kill()  # SIGKILL, by pid: a process this driver started
                        reap_exited(p)
                if tamper is not None:
                    tamper(dom)
                time.sleep(0.01)
        else:
            for _ in range(workers):
                spawn()
            deadline = t0 + seconds
            while active and time.monotonic() < deadline:
                poll()
                if tamper is not None:
                    tamper(dom)
                time.sleep(0.01)
        run_s = time.monotonic() - t0

        # stop the survivors: SIGTERM once they are ready, SIGKILL (and an anomaly) if they do not leave
        stop_t = time.monotonic()
        while active and time.monotonic() - stop_t < 40:
            poll()
            for p in list(active):
                if p.ready_at is not None and not p.stopping:
                    p.stopping = True
                    p.proc.send_signal(signal.SIGTERM)
                elif p.ready_at is None and time.monotonic() - p.started > 20:
                    driver_anomaly("worker_stuck", f"worker {p.n} never became ready", p.n)
                    p.killed = True
                    p.proc.kill()
                    reap_exited(p)
            time.sleep(0.01)
        for p in list(active):
            driver_anomaly("worker_stuck", f"worker {p.n} did not leave within 40 s of SIGTERM", p.n)
            p.killed = True
            p.proc.kill()
            reap_exited(p)

        # every worker is gone: the waiters' objects must all complete
        hung: list[str] = []
        shared_res: dict[str, Any] = {}
        if pool is not None:
            limit = time.monotonic() + hung_after + 5
            while time.monotonic() < limit:
                with pool.lock:
                    busy = bool(pool.items)
                if not busy:
                    break
                time.sleep(0.05)
            pool.close(hung_after + 5)
            if any(t.is_alive() for t in pool.threads):
                hung.append("a waiter thread did not return")
            hung += pool.hung
            for b in pool.bad:
                driver_anomaly("shared_status", b)
            shared_res = {
                "published": pool.published,
                "waits": sum(pool.statuses.values()),
                "statuses": dict(pool.statuses),
                "gone_before_import": pool.gone,
                "held_and_dropped": pool.held,
                "abandoned_owner_alive": pool.abandoned,
            }

        # recovery, then the domain must be consistent and empty
        dom.reap()
        t_end = time.monotonic() + 5
        while time.monotonic() < t_end and [p.id for p in dom.participants] != [dom.participant_id]:
            dom.reap()
            time.sleep(0.02)
        left = [
            f"{p.id} pid {p.pid} {p.label} {p.state}" for p in dom.participants if p.id != dom.participant_id
        ]
        findings = dom.check()
        for _ in range(10):
            if not findings:
                break
            time.sleep(0.1)
            dom.reap()
            findings = dom.check()
        leaks = leaked_slots(dom)
        heap_used = int(dom.heap_stats().get("used", 0)) if buffers else 0

        ops: collections.Counter[str] = collections.Counter()
        for p in procs:
            ops.update(p.stats.get("ops", {}))
            # the stats line counts every anomaly, the anomaly lines may be newer than it
            st = p.stats.get("anomalies", {})
            for k in set(st) | set(p.lines):
                counts[k] += max(int(st.get(k, 0)), p.lines[k])
        started = len(procs)
    finally:
        for p in list(active):
            if p.proc.poll() is None:
                p.proc.kill()
            p.proc.wait()
        if pool is not None:
            pool.stop.set()
        dom.close()
        try:
            Domain.unlink(name)
        except FileNotFoundError:
            pass
        if tmp is not None:
            tmp.cleanup()

    total = sum(counts.values())
    ok = total == 0 and not hung and not leaks and not findings and not left and heap_used == 0
    return {
        "kind": "chaos",
        "ok": ok,
        "config": config,
        "seed": seed,
        "machine": machine,
        "duration_s": round(time.monotonic() - t0, 2),
        "run_s": round(run_s, 2),
        "kills": kills_done,
        "workers_started": started,
        "workers_graceful": graceful,
        "ops": dict(sorted(ops.items())),
        "ops_total": sum(v for k, v in ops.items() if k != "full"),
        "anomalies_total": total,
        "anomaly_counts": dict(sorted(counts.items())),
        "anomalies": anomalies,
        "hung_waiters": len(hung),
        "hung": hung[:50],
        "shared": shared_res,
        "leaked_slots": leaks,
        "heap_used": heap_used,
        "participants_left": left,
        "check": findings[:100],
        "logs": None if tmp is not None else str(logs),
    }


# --------------------------------------------------------------------------- reports


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A few lines for the terminal."""
    cfg = result["config"]
    out = [
        f"chaos {'PASSED' if result['ok'] else 'FAILED'}: seed {result['seed']}, mode {cfg['mode']}, "
        f"{result['workers_started']} workers started, {result['kills']} kills, "
        f"{result['ops_total']} operations in {result['run_s']} s ({result['duration_s']} s in all)",
        f"anomalies: {result['anomalies_total']} "
        + (str(result["anomaly_counts"]) if result["anomaly_counts"] else ""),
        f"hung waiters: {result['hung_waiters']}, leaked slots: {len(result['leaked_slots'])}, "
        f"heap bytes left: {result['heap_used']}, check() findings: {len(result['check'])}, "
        f"participants left: {len(result['participants_left'])}",
    ]
    if result.get("shared"):
        sh = result["shared"]
        out.append(
            f"shared: {sh['published']} published, {sh['waits']} driver waits returned {sh['statuses']}"
        )
    for a in result["anomalies"][:5]:
        out.append(f"  {a['kind']} (worker {a['worker']}): {a['detail'][:300]}")
    for f in result["check"][:5]:
        out.append(f"  check: {f}")
    for h in result["hung"][:5]:
        out.append(f"  hung: {h}")
    return out


def report_markdown(result: dict[str, Any]) -> str:
    """The Markdown report of a run."""
    from .bench import markdown_table

    cfg, m = result["config"], result["machine"]
    lines = [
        f"# hostless chaos: {'passed' if result['ok'] else 'FAILED'}",
        "",
        f"- machine: {m.get('hostname')}, {m.get('cpu_model')}, {m.get('nproc')} CPUs, "
        f"Python {m.get('python')}, git {m.get('git')}, {m.get('date')}",
        f"- seed {result['seed']}; mode {cfg['mode']}; {cfg['workers']} workers at once; "
        f"{cfg['fences']} fence slots; kills asked {cfg['kills']}, done {result['kills']}; "
        f"time limit {cfg['seconds']} s; nested merges {cfg['nested']}, buffers {cfg['buffers']}, "
        f"shared objects {cfg['shared']}",
        f"- {result['workers_started']} workers started, {result['workers_graceful']} left on their own; "
        f"{result['ops_total']} operations in {result['run_s']} s ({result['duration_s']} s with the checks)",
        "",
        "Every worker only uses objects private to it, so any anomaly (an observation that differs "
        "from what the worker's own operations imply) is a protocol bug; see `hostless.chaos`.",
        "",
        "## Verdict",
        "",
        markdown_table(
            ["check", "found"],
            [
                ["anomalies", str(result["anomalies_total"])],
                ["hung waiters", str(result["hung_waiters"])],
                ["leaked slots", str(len(result["leaked_slots"]))],
                ["heap bytes left", str(result["heap_used"])],
                ["check() findings", str(len(result["check"]))],
                ["participants left", str(len(result["participants_left"]))],
            ],
        ),
        "",
    ]
    if result["anomaly_counts"]:
        lines += [
            "## Anomalies by kind",
            "",
            markdown_table(
                ["kind", "count", "meaning"],
                [[k, str(v), ANOMALY_KINDS.get(k, "")] for k, v in result["anomaly_counts"].items()],
            ),
            "",
            "First ones:",
            "",
        ]
        lines += [
            f"- `{a['kind']}` (worker {a['worker']}): {a['detail'][:500]}" for a in result["anomalies"][:30]
        ]
        lines.append("")
    if result["check"] or result["leaked_slots"] or result["hung"] or result["participants_left"]:
        lines += ["## Domain after the run", ""]
        lines += [f"- check: {f}" for f in result["check"][:30]]
        lines += [f"- leaked slot: {s}" for s in result["leaked_slots"][:30]]
        lines += [f"- hung: {h}" for h in result["hung"][:30]]
        lines += [f"- participant left: {p}" for p in result["participants_left"]]
        lines.append("")
    lines += [
        "## Operations",
        "",
        markdown_table(["operation", "count"], [[k, str(v)] for k, v in result["ops"].items()]),
        "",
        "Counts of killed workers stop at their last stats line (written every 0.2 s).",
        "",
    ]
    if result.get("shared"):
        sh = result["shared"]
        lines += [
            "## Shared objects",
            "",
            f"{sh['published']} published; the driver's waits returned {sh['statuses']}; "
            f"{sh['held_and_dropped']} were imported and dropped without waiting; "
            f"{sh['gone_before_import']} were released before the driver could import them.",
            "",
        ]
    lines += [
        f"Reproduce: `hostless chaos --kills {cfg['kills']} --workers {cfg['workers']} "
        f"--seconds {cfg['seconds']} "
        f"--fences {cfg['fences']} --seed {result['seed']}"
        + (f" --mode repro --iterations {cfg['iterations']}" if cfg["mode"] == "repro" else "")
        + "` (the interleaving differs from run to run).",
        "",
    ]
    return "\n".join(lines)


def write_results(
    result: dict[str, Any], out_dir: str | os.PathLike[str] = "benchmarks/results"
) -> tuple[Path, Path]:
    """Write ``chaos-<host>-<date>.json`` and ``.md`` into ``out_dir``; returns both paths."""
    from . import bench

    js, md = bench.write_results("chaos", result, report_markdown(result), out_dir)
    return Path(js), Path(md)


def _main(argv: Iterable[str]) -> int:
    args = list(argv)
    if not args or args[0] != "worker":
        print("usage: python -m hostless.chaos worker DOMAIN LOG --config JSON (use `hostless chaos` to run)")
        return 2
    return worker_main(args[1:])


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
