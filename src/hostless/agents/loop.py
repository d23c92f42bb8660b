"""The agent loop: consumes one queue and signals fences.

It runs in the agent process that :func:`hostless.agents.spawn` starts
(``python -m hostless.agents.worker``, which joins the domain, binds the
queue and prints its participant id).  The loop: take a packet (spinning
briefly, then a bounded sleep on the doorbell, so an idle agent costs no
CPU), wait for the packet's fences / timeline points, run the kernel (or the
ERT command, :mod:`hostless.agents.npu`), signal, and enqueue the follow-up
packets.  It ends on a STOP packet, on SIGTERM, and when the process that
spawned it dies (PR_SET_PDEATHSIG plus a parent check while idle and while
waiting).

Hostile packets (the rule every agent follows):

* A bad packet fails alone: it never stops the agent and never wedges it.
  Bad is: an unknown type; a signal handle that is not a fence or timeline
  the agent can import (wrong kind, merged, stale, forged) or a timeline
  signal value >= 2**62; a wait handle that is not a fence, merged fence or
  timeline the agent can import, or a timeline wait value >= 2**62; an input
  that completes with a word that is not a final status (ACTIVE, 5, ...); a
  missing, malformed or wrong-kind argument block or buffer handle (every
  count and offset is checked against the block by subtraction before it is
  read); an unknown kernel id or CU; a malformed ERT command buffer (header
  count past the buffer, a cu_mask naming no CU or several, argument counts
  past the payload, a chained command that is itself a CMD_CHAIN); a kernel
  that raises; a LOAD_KERNEL packet (code is loaded only through the
  spawner's private channel, :mod:`hostless.agents.control`: a packet
  asking for code fails with a record saying so, and nothing is imported).
  Nothing of a bad packet runs (a wait that fails does not
  run the work), and it is finished with ERROR (a failed input passes its
  own failure status on instead).
* Finishing with a failure: a fence signal gets the status; a timeline
  signal is *failed* with it (sticky: every waiter of every later point
  wakes with the failure), because its point will never be reached.  A
  signal handle that cannot be signaled (wrong kind, stale) is left alone.
  A timeline that is already at or past ``signal_value`` when a successful
  packet finishes is left as it is (several producers may race on one
  timeline).  The signals of the follow-up packets that will now never run
  are failed with the same status (recursively, at most 16 levels and 256
  signals per packet), so nobody waits for them forever.
* A respawned agent (``spawn(queue=...)`` of a dead agent's queue) does not
  run what was queued for the dead one: every packet below the write index
  its bind found (:meth:`hostless.Queue.bind`) fails unrun, a STOP
  included, its signal and its follow-ups' with OWNER_DIED; a packet pushed
  after the takeover runs.
* Input waits are bounded: a packet whose inputs have not completed within
  ``wait_timeout`` seconds (spawn option, default 60 s; None waits forever)
  fails with ERROR.  Waits are taken in short slices, between which the
  agent notices SIGTERM and the death of its spawner.
* Follow-up pushes are bounded: the follow-ups of one packet share a
  deadline of ``follow_timeout`` seconds (spawn option, default 10 s) for
  queues of other consumers; a push into the agent's own queue never waits
  (only this agent frees its cells).  A chain of follow-ups through the
  agent's own queue is cut after 64 hops (a packet that re-enqueues itself
  runs at most 1 + 64 times).  A follow-up that cannot be pushed (full
  until the deadline, its queue handle of the wrong kind, stale, its
  consumer dead, or past the hop limit) is dropped and its own signal (and
  those of the follow-ups nested in it) fails with ERROR; the packet that
  carried it has already finished with its own status (its work did
  complete).  A cycle through several agents' queues is not cut (a packet
  carries no hop count).
* The cuda agent makes the same checks before it enqueues any stream wait
  (so it never synchronizes behind a wait that may never complete); its
  waits and follow-up pushes then run on the GPU: a stream wait is not
  bounded by ``wait_timeout``, and a device push into a queue that stays
  full gives up after a bounded spin without failing the follow-up's signal.
"""

from __future__ import annotations

import os
import sys
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from .. import lowlevel, records, stagefn
from .._abi import C, handle_kind
from ..domain import Domain
from ..errors import HostlessError
from ..kernels import CPU_KERNELS, FUNCTION_KERNEL_BASE, LOAD_KERNEL, NPU_CUS, Kernel
from ..queue import Queue
from ..status import Status
from ..wire import BadPacket, Packet, PacketType, decode_args
from .control import LOAD_REFUSED
from .npu import ErtProcessor

__all__ = ["AgentLoop", "ObjectCache", "BadPacket", "HOP_LIMIT", "FAIL_DEPTH", "FAIL_BUDGET", "WAIT_SLICE"]

_KIND_FENCE = int(C.KIND_FENCE)
_KIND_TIMELINE = int(C.KIND_TIMELINE)
_KIND_MERGED = int(C.KIND_MERGED)
_KIND_BUFFER = int(C.KIND_BUFFER)
_KIND_QUEUE = int(C.KIND_QUEUE)
_TL_MAX = int(C.TIMELINE_MAX)
_EV_START, _EV_END = int(C.EV_START), int(C.EV_END)
_RUNNABLE = (PacketType.KERNEL, PacketType.ERT, PacketType.BARRIER)
_WAITABLE = (_KIND_FENCE, _KIND_MERGED, _KIND_TIMELINE)
_SIGNALABLE = (_KIND_FENCE, _KIND_TIMELINE)

HOP_LIMIT = 64
"""Follow-ups through the agent's own queue: at most this many hops (a self-enqueueing packet)."""
FAIL_DEPTH = 16
FAIL_BUDGET = 256
"""Failing the follow-ups of a failed packet: at most this deep and this many signals."""
WAIT_SLICE = 0.05
"""Seconds of one slice of an input wait (parent and SIGTERM checks between slices)."""
_kind = handle_kind


def _final(st: Any) -> Status:
    """A completed input's status, as a final status (ERROR for what is not one)."""
    try:
        s = Status(int(st))
    except (TypeError, ValueError):
        return Status.ERROR
    return Status.ERROR if s == Status.ACTIVE else s


def _debug(msg: str) -> None:
    if os.environ.get("HOSTLESS_AGENT_DEBUG"):
        print(msg, file=sys.stderr)


class ObjectCache:
    """Imported objects by handle (bounded; emptied when idle).

    Every lookup names the kinds it accepts: a handle of another kind is a
    BadPacket, never an object of the wrong type.  Nothing is evicted while a
    packet runs (its views must stay valid): :meth:`trim` between packets.
    """

    def __init__(self, dom: Domain, size: int = 256) -> None:
        self.dom, self.size = dom, size
        self.items: OrderedDict[int, Any] = OrderedDict()
        self.views: dict[int, np.ndarray] = {}  # NumPy views of cached buffers (made once)
        self.bviews: dict[int, np.ndarray] = {}  # their flat uint8 views

    def get(self, h: int, kinds: tuple[int, ...]) -> Any:
        k = _kind(h)
        if k not in kinds:
            raise BadPacket(f"handle {h:#x} is of kind {k}, not one of {kinds}")
        o = self.items.get(h)
        if o is not None:
            self.items.move_to_end(h)
            return o
        try:
            if k == _KIND_BUFFER:
                o = self.dom.import_buffer(h)
            elif k == _KIND_QUEUE:
                o = self.dom.import_queue(h)
            elif k == _KIND_TIMELINE:
                o = self.dom.import_timeline(h)
            else:
                o = self.dom.import_fence(h)
        except Exception as e:  # stale, forged, foreign, corrupt metadata
            raise BadPacket(f"handle {h:#x}: {e}") from None
        self.items[h] = o
        return o

    def view(self, h: int) -> np.ndarray:
        """The NumPy view of buffer ``h`` (imported and viewed once, then reused)."""
        v = self.views.get(h)
        if v is None:
            b = self.get(h, (_KIND_BUFFER,))
            v = self.views[h] = b.numpy()
        return v

    def bytes_view(self, h: int) -> np.ndarray:
        """Buffer ``h`` as a flat uint8 array, whatever its dtype and shape (made once)."""
        v = self.bviews.get(h)
        if v is None:
            v = self.bviews[h] = self.view(h).reshape(-1).view(np.uint8)
        return v

    def trim(self) -> None:
        while len(self.items) > self.size:
            oh, old = self.items.popitem(last=False)
            self.views.pop(oh, None)
            self.bviews.pop(oh, None)
            try:
                old.release()
            except HostlessError:
                pass

    def clear(self) -> None:
        self.views.clear()
        self.bviews.clear()
        for o in self.items.values():
            try:
                o.release()
            except HostlessError:
                pass
        self.items.clear()


class AgentLoop:
    """The consumer loop of one queue, in the agent process (the rule above).

    ``kind`` picks the kernel table ("cpu": kernels by id; "npu": CUs by
    index, run from ERT commands); ``user`` adds kernels by id.  ``parent``
    is the pid of the spawner: the loop ends when it is gone.
    """

    def __init__(
        self,
        dom: Domain,
        queue: Queue,
        kind: str,
        user: dict[int, Kernel],
        parent: int,
        wait_timeout: float | None = 60.0,
        follow_timeout: float = 10.0,
    ) -> None:
        self.dom, self.queue, self.kind, self.parent = dom, queue, kind, parent
        self.cache = ObjectCache(dom)
        table = NPU_CUS if kind == "npu" else CPU_KERNELS
        self.kernels: dict[int, Any] = {kid: fn for kid, fn in table.values()}
        self.kernels.update(user)
        self.running = True
        self.spin_ns = 50_000  # how long an idle agent polls its doorbell before sleeping
        self.wait_timeout = wait_timeout
        self.follow_timeout = follow_timeout
        self.hops: dict[int, int] = {}  # write index in our own queue -> hops of the follow-up chain
        self.stale_below = 0
        """Packets below this index were queued for the dead consumer this agent replaced
        (what :meth:`Queue.bind` returned): they fail unrun, with OWNER_DIED."""
        self.failures = 0  # packets failed and follow-ups dropped (statistics)
        self.ert = ErtProcessor(self.cache.bytes_view, self.cache.view, self.kernels)
        self.records = records.Recorder(dom)  # why packets failed (hostless.records)
        self.trace = lowlevel.tracer(dom)  # emit(event, a, b, c, d, e) into the domain's trace ring

    # ------------------------------------------------------------------
    def run(self) -> None:
        """Serve the queue until a STOP packet, ``running`` cleared, or the spawner's death."""
        q = self.queue
        idle = 0
        while self.running:
            r = q.pop_raw(50_000_000, self.spin_ns)  # 50 ms bounded wait after the spin
            if r is None:
                idle += 1
                if os.getppid() != self.parent:
                    return  # the spawner died: no orphans
                if idle == 2:
                    self.cache.clear()
                    self.hops.clear()
                continue
            idle = 0
            idx, raw = r
            pkt = Packet.decode(raw)
            hops = self.hops.pop(idx, 0)
            if idx < self.stale_below:
                self.discard_stale(idx, pkt)
                q.completed()
                continue
            if pkt.type == PacketType.STOP:
                self.finish(pkt, Status.SUCCESS, idx)
                return
            try:
                self.execute(idx, pkt, hops)
            except Exception as e:  # a last resort: a packet never takes the agent down
                self.failures += 1
                _debug(f"agent {self.kind}: packet {idx} raised {e!r}")
                self.finish(pkt, Status.ERROR, idx)
            q.completed()
            self.cache.trim()

    def check(self, pkt: Packet) -> None:
        """Validate the packet's type, signal and waits before anything runs (BadPacket)."""
        if pkt.type not in _RUNNABLE:
            raise BadPacket(f"unknown packet type {pkt.type}")
        if pkt.signal:
            self.cache.get(pkt.signal, _SIGNALABLE)
            if _kind(pkt.signal) == _KIND_TIMELINE and pkt.signal_value > _TL_MAX:
                raise BadPacket(f"timeline signal value {pkt.signal_value:#x} is not below 2**62")
        for h, v in zip(pkt.wait, pkt.wait_value, strict=True):
            if h:
                self.cache.get(h, _WAITABLE)
                if _kind(h) == _KIND_TIMELINE and v > _TL_MAX:
                    raise BadPacket(f"timeline wait value {v:#x} is not below 2**62")

    def execute(self, idx: int, pkt: Packet, hops: int = 0) -> None:
        """Run packet ``idx`` of the queue: check, wait, run, signal, push its follow-ups
        (``hops``: follow-up hops through the own queue that led to it).  Never raises
        for a bad packet: it fails alone with ERROR."""
        self.trace(_EV_START, self.queue.handle, idx, pkt.signal, pkt.kernel, 0)
        follow: list[tuple[int, bytes]] = []
        try:
            self.check(pkt)
            status = self.wait_inputs(pkt)
            if status == Status.SUCCESS:
                if pkt.type == PacketType.KERNEL:
                    follow = self.run_kernel(pkt)
                elif pkt.type == PacketType.ERT:
                    follow = self.run_ert(pkt)
        except Exception as e:  # a bad packet fails alone, with the why recorded for its signal
            status = Status.ERROR
            _debug(f"agent {self.kind}: packet {idx} failed: {e!r}")
            self.records.write(pkt.signal, stagefn.format_error(e))
        self.finish(pkt, status, idx)
        if status != Status.SUCCESS:
            self.failures += 1
            self.fail_downstream(pkt, status, [FAIL_BUDGET])
        elif follow:
            self.push_follow(follow, hops)

    def push_follow(self, follow: list[tuple[int, bytes]], hops: int) -> None:
        """Push the follow-ups of a packet that succeeded, within the bounds of the module rule."""
        deadline = time.monotonic() + self.follow_timeout
        budget = [FAIL_BUDGET]
        own = self.queue.handle
        for qh, raw_pkt in follow:
            try:
                if qh == own:
                    if hops + 1 > HOP_LIMIT:
                        raise BadPacket(f"follow-up chain through the own queue longer than {HOP_LIMIT}")
                    w = self.queue.push(raw_pkt, timeout=0)  # only we free cells of our own queue
                    self.hops[w] = hops + 1
                else:
                    q = self.cache.get(qh, (_KIND_QUEUE,))
                    q.push(raw_pkt, timeout=max(0.0, deadline - time.monotonic()))
            except Exception as e:  # full, stale, wrong kind, consumer dead, hop limit
                self.failures += 1
                _debug(f"agent {self.kind}: follow-up into {qh:#x} dropped: {e!r}")
                fp = Packet.decode(raw_pkt)
                self.fail_signal(fp.signal, fp.signal_value, Status.ERROR)
                self.fail_downstream(fp, Status.ERROR, budget)

    def wait_inputs(self, pkt: Packet) -> Status:
        """SUCCESS when every input succeeded, else the first failure (ERROR for a wait that
        timed out or a word that is not a final status).  Handles were checked by :meth:`check`."""
        if not (pkt.wait[0] or pkt.wait[1]):
            return Status.SUCCESS
        deadline = None if self.wait_timeout is None else time.monotonic() + self.wait_timeout
        for h, v in zip(pkt.wait, pkt.wait_value, strict=True):
            if not h:
                continue
            o = self.cache.get(h, _WAITABLE)
            timeline = _kind(h) == _KIND_TIMELINE
            while True:
                left = WAIT_SLICE if deadline is None else min(WAIT_SLICE, deadline - time.monotonic())
                try:
                    st = o.wait(v, max(0.0, left)) if timeline else o.wait(max(0.0, left))
                except TimeoutError:
                    if deadline is not None and time.monotonic() >= deadline:
                        why = f"input {h:#x} not complete within {self.wait_timeout} s"
                        _debug(f"agent {self.kind}: {why}")
                        self.records.write(pkt.signal, f"TimeoutError: {why} (the agent's wait_timeout)")
                        return Status.ERROR
                    if os.getppid() != self.parent:
                        self.running = False  # the spawner died: finish this packet and go
                        return Status.ERROR
                    continue
                except (HostlessError, ValueError):  # released under us, a word that is no status
                    return Status.ERROR
                break
            s = _final(st)
            if s != Status.SUCCESS:
                return s  # a failed input fails this stage without running it
        return Status.SUCCESS

    def kernel_call(
        self, pkt: Packet
    ) -> tuple[Any, tuple[int, ...], tuple[int, ...], list[tuple[int, bytes]]]:
        """(kernel, buffer handles, scalars, follow-ups) of a KERNEL packet; BadPacket for an
        unknown kernel or a missing or malformed argument block."""
        fn = self.kernels.get(pkt.kernel)
        if fn is None:
            raise BadPacket(f"unknown kernel {pkt.kernel}")
        if not pkt.args:
            raise BadPacket("kernel packet without an argument block")
        bufs, scalars, follow = decode_args(self.cache.bytes_view(pkt.args))
        return fn, bufs, scalars, follow

    def load_function(self, req: dict[str, Any]) -> int:
        """Import the stage function a request of the spawner describes
        (:func:`hostless.stagefn.describe` plus ``id``) and register it under that id;
        returns the id.  Called only for requests that came through the spawner's
        private channel (:mod:`hostless.agents.control`), never for a queue's packet.
        Raises what the import raises, ValueError for a malformed request."""
        if self.kind != "cpu":
            raise ValueError(f"{self.kind} agents do not run Python stage functions")
        kid = req.get("id")
        if not isinstance(kid, int) or isinstance(kid, bool) or kid < FUNCTION_KERNEL_BASE:
            raise ValueError(f"stage function id {kid!r} is not an int >= {FUNCTION_KERNEL_BASE}")
        module, qualname = req.get("module"), req.get("qualname")
        if not isinstance(module, str) or not isinstance(qualname, str):
            raise ValueError("a load request names a module and a qualified name (strings)")
        scalars = req.get("scalars", [])
        if not isinstance(scalars, list):
            raise ValueError("a load request's scalars are a list")
        what = f"stage function {module}:{qualname}"
        self.kernels[kid] = stagefn.bind(stagefn.load(req), scalars, what)
        return kid

    def run_kernel(self, pkt: Packet) -> list[tuple[int, bytes]]:
        """KERNEL packet: run the kernel on its argument block; returns the follow-ups."""
        if pkt.kernel == LOAD_KERNEL:  # code comes only through the spawner's channel
            raise BadPacket(LOAD_REFUSED)
        fn, bufs, scalars, follow = self.kernel_call(pkt)
        view = self.cache.view
        fn([view(h) for h in bufs], scalars)
        return follow

    def run_ert(self, pkt: Packet) -> list[tuple[int, bytes]]:
        """ERT packet: ``args`` is an argument block whose first buffer is the
        command buffer (as EXEC_CMD names a command BO), plus follow-ups."""
        if not pkt.args:
            raise BadPacket("ERT packet without an argument block")
        bufs, _scalars, follow = decode_args(self.cache.bytes_view(pkt.args))
        if not bufs:
            raise BadPacket("ERT packet without a command buffer")
        self.ert.run(self.cache.bytes_view(bufs[0]))
        return follow

    def finish(self, pkt: Packet, status: Status, idx: int) -> None:
        """Trace the end of the packet and signal it (never raises)."""
        try:
            self.trace(_EV_END, self.queue.handle, idx, pkt.signal, int(status), 0)
        except Exception:  # (a closed domain while stopping)
            pass
        if not pkt.signal:
            return
        try:
            o = self.cache.get(pkt.signal, _SIGNALABLE)
            if _kind(pkt.signal) == _KIND_TIMELINE:
                if status == Status.SUCCESS:
                    o.signal(pkt.signal_value)
                else:
                    o.fail(status)
            else:
                o.signal(status)
        except Exception as e:  # not signalable, already signaled, a value not above the current one
            _debug(f"agent {self.kind}: signal {pkt.signal:#x} failed: {e!r}")

    def fail_downstream(self, pkt: Packet, status: Status, budget: list[int], depth: int = 0) -> None:
        """Pass a failure on to the signals of the follow-up packets that will now
        never run (recursively, bounded by depth and by ``budget`` signals)."""
        if pkt.type not in (PacketType.KERNEL, PacketType.ERT) or not pkt.args or depth >= FAIL_DEPTH:
            return
        try:
            _b, _s, follow = decode_args(self.cache.bytes_view(pkt.args))
        except Exception:
            return
        for _q, raw in follow:
            if budget[0] <= 0:
                return
            budget[0] -= 1
            fp = Packet.decode(raw)
            self.fail_signal(fp.signal, fp.signal_value, status)
            self.fail_downstream(fp, status, budget, depth + 1)

    def discard_stale(self, idx: int, pkt: Packet) -> None:
        """A packet queued for the dead consumer this agent replaced: nothing of it runs
        (a STOP included); its signal and its follow-ups' fail with OWNER_DIED."""
        self.failures += 1
        self.finish(pkt, Status.OWNER_DIED, idx)
        self.fail_downstream(pkt, Status.OWNER_DIED, [FAIL_BUDGET])

    def fail_signal(self, h: int, value: int, status: Status) -> None:
        """Finish the signal ``h`` (value ``value`` of a timeline) with the failure ``status``."""
        self.finish(Packet(signal=h, signal_value=value), status, -1)
