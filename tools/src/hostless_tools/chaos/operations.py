"""A chaos worker's operations on fences, merged fences and timelines (create, signal, fail,
wait, release), each checked against the model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hostless.errors import AlreadySignaled, DomainFull, InvalidHandle, InvalidOperation

from .checks import WorkerChecks
from .model import _Node, _Tl
from .record import _FAIL_STATUSES, _FAILED, CANCEL, SUCCESS, _sname


def hung_timeout() -> float:
    """:data:`hostless_tools.chaos.HUNG_TIMEOUT` as it is now: the package attribute is the setting (tests of
    the harness lower it there)."""
    from .. import chaos

    return float(chaos.HUNG_TIMEOUT)


class WorkerOperations(WorkerChecks):
    """The operations of a chaos worker on its private fences, merges and timelines, each followed
    by the checks of what it may have changed."""

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
            self.flag("fresh_not_active", n, f"new fence reads {_sname(w)}")
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
            self.flag("fresh_not_active", tl, f"new timeline reads {got}, expected {initial}")
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
        kids = self.flattened(kids)
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
            self.flag("fresh_not_active", n, f"new merge with ACTIVE children reads {_sname(w)}; {n.log}")
        else:
            self.check_node(n, "new merge")
        return n

    @staticmethod
    def flattened(kids: Sequence[_Node]) -> list[_Node]:
        """The children Domain.merge links, as the model sees them (sync_file's flattening): a
        merged child is replaced by its own children while it is ACTIVE, none of them has failed,
        none is a merge and each is still held; otherwise it is a child in its own right."""
        out: list[_Node] = []
        for k in kids:
            flat = (
                k.merged
                and k.final is None
                and all(
                    not c.merged and c.obj._held and (c.final is None or c.final[0] == SUCCESS)
                    for c in k.children
                )
            )
            out += k.children if flat else [k]
        return out

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
            self.flag("already_signaled", n, f"first signal ({_sname(status)}): {e}; {n.log}")
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

    def _wait_done(self, o: _Node | _Tl, wait: Callable[[], int], hung: str, what: str) -> int | None:
        """Wait on ``o``, which the model says is complete (the wait must return at once): its
        status, or None after a ``hung`` anomaly (``hung`` says what did not return within
        HUNG_TIMEOUT) or an unexpected exception (in ``what``)."""
        try:
            return int(wait())
        except TimeoutError:
            self.flag("hung", o, hung)
        except Exception as e:
            self._unexpected(o, what, e)
        return None

    def wait_node(self, n: _Node, what: str = "wait") -> None:
        """Wait on a completed node (must return its status at once) or briefly on an ACTIVE one
        (must time out)."""
        self.rec.op("wait")
        if n.final is not None:
            st = self._wait_done(
                n,
                lambda: n.obj.wait(hung_timeout()),
                f"{what}: not completed within {hung_timeout()} s; {n.log}",
                f"{what} {n.name()}",
            )
            if st is None:
                return
            if st not in n.final:
                exp = " or ".join(sorted({_sname(s) for s in n.final}))
                kind = "merge_status" if n.merged else "wait_status"
                self.flag(kind, n, f"{what} returned {_sname(st)}, expected {exp}; {n.log}")
            return
        try:
            st = int(n.obj.wait(self.rnd.choice((0.0, 0.0, 0.0005))))
        except TimeoutError:
            return
        except Exception as e:
            self._unexpected(n, f"{what} {n.name()}", e)
            return
        kind = "merge_early" if n.merged else "unexpected_completion"
        self.flag(kind, n, f"{what} on an ACTIVE object returned {_sname(st)}; {n.log}")

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
            self.expect_refused(
                t,
                f"signal of failed {t.name()}",
                lambda: t.obj.signal(t.value + 1),
                AlreadySignaled,
                None,
                f"signal after fail({_sname(t.failed)}) accepted",
            )
            return
        v = t.value + self.rnd.choice((1, 1, 2, 5, 1000))
        try:
            t.obj.signal(v)
        except (ValueError, AlreadySignaled) as e:
            if isinstance(e, InvalidHandle):
                self._unexpected(t, f"signal {t.name()}", e)
                return
            kind = "already_signaled" if isinstance(e, AlreadySignaled) else "timeline_value"
            self.flag(kind, t, f"signal({v}) from value {t.value} refused: {e}")
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
                self.flag("already_signaled", t, f"fail({_sname(s)}) of a timeline never failed: {e}")
            return
        except Exception as e:
            self._unexpected(t, f"fail {t.name()}", e)
            return
        if t.failed is not None:
            self.flag("not_refused", t, f"second fail ({_sname(s)}) accepted")
            return
        t.failed = s
        self.check_timeline(t, f"after fail({_sname(s)})")

    def tl_wait(self, t: _Tl) -> None:
        self.rec.op("wait")
        if t.failed is not None or self.rnd.random() < 0.6:
            v = self.rnd.randint(0, t.value) if t.failed is None else self.rnd.randint(0, t.value + 3)
            st = self._wait_done(
                t,
                lambda: t.obj.wait(v, hung_timeout()),
                f"wait({v}) at value {t.value} not returned in {hung_timeout()} s",
                f"wait {t.name()}",
            )
            if st is None:
                return
            # a point reached before the failure stays reached (ABI 6)
            exp = t.failed if t.failed is not None and v > t.value else SUCCESS
            if st != exp:
                self.flag("wait_status", t, f"wait({v}) returned {_sname(st)}, expected {_sname(exp)}")
            return
        v = t.value + 1
        try:
            st = int(t.obj.wait(v, self.rnd.choice((0.0, 0.0005))))
        except TimeoutError:
            return
        except Exception as e:
            self._unexpected(t, f"wait {t.name()}", e)
            return
        self.flag("timeline_value", t, f"wait({v}) at value {t.value} returned {_sname(st)}")
