"""A chaos worker's fence-algebra operations (issue 27): composites over timeline points of
several timelines and fences, a fence shared by many (> 2, so through watch nodes) composites
released while it is signaled, and ``wait_any`` / ``wait_all`` over them, each checked against
the model: a composite completes exactly when all its children have, with the first failure in
time (failures seen in one model step are equally first)."""

from __future__ import annotations

import threading
from typing import Any

from hostless.errors import DomainFull
from hostless.fence import Fence
from hostless.status import Status
from hostless.waits import wait_all, wait_any

from .model import _Node, _Tl
from .operations import WorkerOperations, hung_timeout
from .record import SUCCESS, _slot, _sname


class _Comp:
    """A composite made by ``Domain.merge`` over plain fences and timeline points.

    ``kids``: ``(node, None)`` for a fence, ``(timeline, value)`` for a point;
    ``failed_at_birth``: the timelines already failed when it was made (their
    points then read the failure whatever their value); ``done``: child index ->
    (model step, status); ``final``: None while it must be ACTIVE, else the set of
    statuses it may read."""

    __slots__ = ("obj", "handle", "kids", "failed_at_birth", "done", "final", "tainted", "log")

    def __init__(self, obj: Fence, kids: list[tuple[Any, int | None]], born_failed: set[int]) -> None:
        self.obj = obj
        self.handle = obj.handle
        self.kids = kids
        self.failed_at_birth = born_failed
        self.done: dict[int, tuple[int, int]] = {}
        self.final: set[int] | None = None
        self.tainted = False
        self.log: list[str] = []

    def name(self) -> str:
        return f"composite {self.handle:#x} (slot {_slot(self.handle)})"


class AlgebraOps(WorkerOperations):
    """Composites over points and shared fences on top of the worker's operations."""

    max_comps = 6

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.comps: list[_Comp] = []
        self.step_no = 0

    # ------------------------------------------------------------- the model
    def _kid_status(self, c: _Comp, kid: tuple[Any, int | None]) -> int | None:
        o, v = kid
        if v is None:
            fin = o.final
            return None if fin is None else int(fin[0])
        t: _Tl = o
        if t.value >= v:  # reached: also when it failed afterwards (ABI 6: a point reached stays reached)
            return SUCCESS
        return t.failed

    def alg_poll(self) -> None:
        """One model step: children completed since the last step get this step's number; a
        composite whose children are all done gets its expected statuses and is checked."""
        self.step_no += 1
        for c in list(self.comps):
            if c.tainted or c.final is not None:
                continue
            for i, kid in enumerate(c.kids):
                if i in c.done:
                    continue
                if getattr(kid[0], "tainted", False):
                    self._comp_taint(c)
                    break
                s = self._kid_status(c, kid)
                if s is not None:
                    c.done[i] = (self.step_no, s)
                    c.log.append(f"{i}:{_sname(s)}@{self.step_no}")
            if c.tainted or len(c.done) < len(c.kids):
                continue
            fails = [(n, s) for n, s in c.done.values() if s != SUCCESS]
            if not fails:
                c.final = {SUCCESS}
            else:
                first = min(n for n, _s in fails)
                c.final = {s for n, s in fails if n == first}
            self.check_comp(c, "on completion of its last child")

    def _complete(self, n: _Node, fin: tuple[int, int]) -> None:
        super()._complete(n, fin)
        if not n.merged:
            self.alg_poll()

    def tl_signal(self, t: _Tl) -> None:
        super().tl_signal(t)
        self.alg_poll()

    def tl_fail(self, t: _Tl) -> None:
        super().tl_fail(t)
        self.alg_poll()

    def _comp_taint(self, c: _Comp) -> None:
        c.tainted = True

    def check_comp(self, c: _Comp, where: str) -> bool:
        if c.tainted:
            return True
        try:
            w = int(c.obj._core.word(c.handle))
        except Exception as e:
            self._unexpected(None, f"reading {c.name()}", e)
            self._comp_taint(c)
            return False
        if c.final is None and w == 0 or c.final is not None and w in c.final:
            return True
        if c.final is None:
            pend = [i for i in range(len(c.kids)) if i not in c.done]
            detail = f"{where}: reads {_sname(w)}, children {pend} pending; {c.log}"
            self.anomaly("merge_early", c.name(), detail)
        else:
            exp = " or ".join(sorted(_sname(s) for s in c.final))
            self.anomaly("merge_status", c.name(), f"{where}: reads {_sname(w)}, expected {exp}; {c.log}")
        self._comp_taint(c)
        return False

    def verify_all(self, where: str = "periodic check") -> None:
        super().verify_all(where)
        for c in self.comps:
            self.check_comp(c, where)

    # ------------------------------------------------------------ operations
    def _fences(self) -> list[_Node]:
        return [n for n in self.nodes.values() if not n.tainted and not n.merged]

    def _tls(self) -> list[_Tl]:
        return [t for t in self.timelines.values() if not t.tainted]

    def _merge(self, kids: list[tuple[Any, int | None]]) -> _Comp | None:
        self.rec.op("point_merge")
        objs = [o.obj if v is None else o.obj.point(v) for o, v in kids]
        try:
            m = self.dom.merge(objs)
        except DomainFull:
            self.rec.op("full")
            return None
        except Exception as e:
            self._unexpected(None, f"merge of {len(objs)} fences and points", e)
            return None
        c = _Comp(m, kids, {id(o) for o, v in kids if v is not None and o.failed is not None})
        c.log.append(f"new@{self.nops}")
        self.comps.append(c)
        self.alg_poll()  # children done at birth
        self.check_comp(c, "new composite")
        return c

    def point_merge(self) -> None:
        """A composite over points of several timelines (some reached, some not) and fences."""
        tls = self._tls()
        if len(tls) < 2:
            for _ in range(2):
                if self.new_timeline(self.rnd.randint(0, 3)) is not None:
                    self.alg_poll()
            tls = self._tls()
            if len(tls) < 2:
                return
        self.rnd.shuffle(tls)
        kids: list[tuple[Any, int | None]] = []
        for t in tls[: self.rnd.randint(2, min(4, len(tls)))]:
            kids.append((t, max(0, t.value + self.rnd.choice((-1, 0, 1, 1, 2, 3)))))
        fs = self._fences()
        self.rnd.shuffle(fs)
        kids += [(f, None) for f in fs[: self.rnd.randint(0, 2)]]
        self._merge(kids)

    def shared_fence(self) -> None:
        """A fence in 3..6 composites (the third on through watch nodes), some over points too; then
        it is signaled in a thread while some composites are released, and the rest checked."""
        f = self.new_fence()
        if f is None:
            return
        comps: list[_Comp] = []
        for _ in range(self.rnd.randint(3, 6)):
            kids: list[tuple[Any, int | None]] = [(f, None)]
            tls = self._tls()
            if tls and self.rnd.random() < 0.5:
                t = self.rnd.choice(tls)
                kids.append((t, t.value + self.rnd.randint(0, 1)))
            c = self._merge(kids)
            if c is not None:
                comps.append(c)
        if self.rnd.random() < 0.5 or f.tainted:
            return  # signaled later by the mix, or released (CANCEL) with the node
        self.rec.op("signal_while_released")
        doomed = [c for c in comps if self.rnd.random() < 0.5]
        status = self._status(0.6)
        err: list[BaseException] = []

        def sig() -> None:
            try:
                f.obj.signal(status)
            except BaseException as e:  # noqa: B036 - reported by the caller
                err.append(e)

        th = threading.Thread(target=sig)
        th.start()
        for c in doomed:
            self.release_comp(c)
        th.join()
        if err:
            self._unexpected(f, f"signal of {f.name()} while composites are released", err[0])
            return
        f.log.append(f"sig {_sname(status)}@{self.nops}")
        self._complete(f, (status, status))
        self.check_around(f, "after a signal racing releases of composites")

    def release_comp(self, c: _Comp) -> None:
        self.rec.op("release_comp")
        if c in self.comps:
            self.comps.remove(c)
        try:
            c.obj.release()
        except Exception as e:
            self._unexpected(None, f"release {c.name()}", e)

    def multi_wait(self) -> None:
        """wait_any / wait_all over composites and points the model knows."""
        objs: list[Any] = []
        finals: list[set[int] | None] = []
        for c in self.comps:
            if not c.tainted:
                objs.append(c.obj)
                finals.append(c.final)
        for t in self._tls()[:3]:
            v = self.rnd.randint(0, t.value + 1)
            objs.append(t.obj.point(v))
            if t.value >= v:  # reached, also before a failure (ABI 6)
                finals.append({SUCCESS})
            else:
                finals.append(None if t.failed is None else {t.failed})
        if not objs:
            return
        done = [i for i, fin in enumerate(finals) if fin is not None]
        self.rec.op("wait_any")
        try:
            if done and self.rnd.random() < 0.5:
                rs = wait_all([objs[i] for i in done], hung_timeout())
                got = [(done[r.index], r.status) for r in rs]
            elif done:
                r = wait_any(objs, hung_timeout())
                got = [(r.index, r.status)]
            else:
                try:
                    r = wait_any(objs, 0.0005)
                except TimeoutError:
                    return
                got = [(r.index, r.status)]
        except TimeoutError:
            self.anomaly("hung", "wait_any/wait_all", f"{len(done)} of {len(objs)} done, not returned")
            return
        except Exception as e:
            self._unexpected(None, "wait_any/wait_all", e)
            return
        for i, s in got:
            fin = finals[i]
            if fin is None or int(s) not in fin:
                exp = "ACTIVE" if fin is None else " or ".join(sorted(_sname(x) for x in fin))
                what = f"multi-wait item {i} ({objs[i]!r})"
                self.anomaly("wait_status", what, f"{Status(s).name}, expected {exp}")

    def algebra_op(self) -> None:
        """One fence-algebra operation (the mix's share)."""
        if len(self.comps) >= self.max_comps:
            self.release_comp(self.comps[self.rnd.randrange(len(self.comps))])
            return
        r = self.rnd.random()
        if r < 0.35:
            self.point_merge()
        elif r < 0.6:
            self.shared_fence()
        elif r < 0.85:
            self.multi_wait()
        elif self.comps:
            self.release_comp(self.rnd.choice(self.comps))

    def finish_comps(self) -> None:
        """Check and release every composite (before the fences and timelines under them)."""
        for c in list(self.comps):
            self.check_comp(c, "final check")
            self.release_comp(c)
