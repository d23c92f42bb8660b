"""A chaos worker: the random mix of operations (and the reported loop), probes of refused
operations, buffers, published objects, and the worker process (``python -m hostless_tools.chaos worker``)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
import traceback
from collections.abc import Sequence

import numpy as np

from hostless.domain import Domain
from hostless.errors import AlreadySignaled, DomainFull, InvalidOperation, OutOfMemory
from hostless.fence import Fence
from hostless.timeline import Timeline

from .algebra import AlgebraOps
from .model import WorkerConfig, _Buf, _Node, _Shared, _Tl
from .record import OWNER_DIED, SUCCESS, Recorder


class ChaosWorker(AlgebraOps):
    """One participant doing random operations on private objects and checking each against its model.

    Usable in-process (tests of the harness build one on a Domain they
    created) or as a worker process (:func:`worker_main`).
    """

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
                self.expect_refused(
                    n,
                    f"second signal of {n.name()}",
                    lambda: n.obj.signal(self._status()),
                    AlreadySignaled,
                    "after a refused second signal",
                    "second signal accepted",
                )
        elif r < 0.6:
            ms = [n for n in nodes if n.merged]
            if ms:
                n = self.rnd.choice(ms)
                self.expect_refused(
                    n,
                    f"signal of {n.name()}",
                    lambda: n.obj.signal(SUCCESS),
                    InvalidOperation,
                    "after a refused signal of a merge",
                    "signal of a merged fence accepted",
                )
        else:  # (a third merge of a fence is no longer refused: AlgebraOps.shared_fence)
            tls = [t for t in self.timelines.values() if not t.tainted and t.failed is None]
            if tls:
                t = self.rnd.choice(tls)
                self.expect_refused(
                    t,
                    f"signal {t.name()}",
                    lambda: t.obj.signal(t.value),
                    ValueError,
                    "after a refused non-growing signal",
                    f"signal({t.value}) at value {t.value} accepted",
                )

    # ------------------------------------------------------------ buffers
    def _free_buffer(self, b: _Buf) -> None:
        """Check a buffer's pattern (unless it was reported already), then release it."""
        if b.tag != -1:
            self.check_buffer(b, "before free")
        try:
            b.obj.release()
        except Exception as e:
            self._unexpected(None, f"release buffer {b.obj.handle:#x}", e)

    def buffer_op(self) -> None:
        if len(self.buffers) >= self.cfg.max_buffers or (self.buffers and self.rnd.random() < 0.4):
            b = self.buffers.pop(self.rnd.randrange(len(self.buffers)))
            self.rec.op("buffer_free")
            self._free_buffer(b)
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
        elif r < 53 and (r < 45 or not self.cfg.algebra):
            self.churn()
        elif r < 53:
            self.algebra_op()
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
        self.finish_comps()
        while self.tainted:
            self._drop(self.tainted[-1])
        objs: list[_Node | _Tl | _Buf] = [*self.nodes.values(), *self.timelines.values(), *self.buffers]
        self.rnd.shuffle(objs)
        self.buffers = []
        for o in objs:
            if isinstance(o, _Buf):
                self._free_buffer(o)
            else:
                self._release_any(o)
        while self.tainted:  # those an anomaly found during these releases
            self._drop(self.tainted[-1])


# --------------------------------------------------------------------------- worker process

WORKER_MODULE = "hostless_tools.chaos"
"""The module whose ``python -m`` entry point (``__main__.py``) runs :func:`worker_main`."""
USAGE = "usage: python -m hostless_tools.chaos worker DOMAIN LOG --config JSON (use `hostless chaos` to run)"


def _worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hostless_tools.chaos worker")
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
