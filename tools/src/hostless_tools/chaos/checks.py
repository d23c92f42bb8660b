"""A chaos worker's checks: each object it holds against its model, and the merge rule."""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from hostless.domain import Domain
from hostless.errors import InvalidHandle
from hostless.timeline import Timeline

from .model import WorkerConfig, _Buf, _Node, _Shared, _Tl
from .record import _FAILED, SUCCESS, Recorder, _slot, _sname

T = TypeVar("T")


class WorkerChecks:
    """A chaos worker's state and its checks: every object it holds against the model, and the
    merge rule that says what a merged fence must read (:meth:`_child_done`).

    :class:`~hostless_tools.chaos.operations.WorkerOperations` adds the operations on top,
    :class:`~hostless_tools.chaos.worker.ChaosWorker` the random mix and the loop.
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
        """Record an anomaly of ``kind`` about ``what``."""
        self.rec.anomaly(kind, f"{what}: {detail}")

    def flag(self, kind: str, o: _Node | _Tl, detail: str) -> None:
        """Record an anomaly of ``kind`` about ``o``, then stop checking it (:meth:`_taint`)."""
        self.anomaly(kind, o.name(), detail)
        self._taint(o)

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
                self.flag("timeline_value", t, f"{where}: failed at value {aux}, was {t.value}")
                return False
        if not ok:
            got = f"failed {_sname(w & 0xFFFFFFFF)}" if w & _FAILED else f"value {w}"
            exp = f"failed {_sname(t.failed)}" if t.failed is not None else f"value {t.value}"
            self.flag("timeline_value", t, f"{where}: reads {got}, expected {exp}")
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

    def expect_refused(
        self,
        o: _Node | _Tl,
        what: str,
        action: Callable[[], T],
        refused: type[BaseException],
        after: str | None,
        accepted: str,
        skip: tuple[type[BaseException], ...] = (),
    ) -> T | None:
        """Run ``action``, an operation on ``o`` that the API documents as refused with ``refused``.

        Refused: ``o`` (and every merge above a fence) is checked ``after`` it (no check when
        ``after`` is None): a refusal must change nothing.  Accepted: a ``not_refused`` anomaly
        (``accepted`` says what was accepted), ``o`` is tainted and what ``action`` returned is
        returned, for the caller to release.  Any other exception is unexpected (InvalidHandle
        is one, although a ValueError); one of ``skip`` (a full table) ends the probe quietly.
        """
        try:
            got = action()
        except skip:
            return None
        except refused as e:
            if isinstance(e, InvalidHandle):
                self._unexpected(o, what, e)
            elif after is not None and isinstance(o, _Node):
                self.check_around(o, after)
            elif after is not None and isinstance(o, _Tl):
                self.check_timeline(o, after)
            return None
        except Exception as e:
            self._unexpected(o, what, e)
            return None
        self.flag("not_refused", o, accepted)
        return got

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
