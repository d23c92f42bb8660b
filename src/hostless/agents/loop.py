"""The agent loop in Python, for the one agent whose loop must be Python: the cuda agent.

cpu and npu agents do not run it: their command processor is the engine's,
in C (``core/agent.c``, served through :mod:`hostless.agents.native`, Python
entered only for Python kernels).  The rule every agent follows on bad
packets (what is bad, how a packet and its follow-ups fail, respawns, the
bounds on waits, follow-up pushes and chains) is stated once, as the engine's
contract in ``core/hostless_engine.h`` (``hle_agent_run``); its limits come
from that header (:data:`FAIL_DEPTH`, :data:`FAIL_BUDGET`, :data:`HOP_LIMIT`).

:class:`AgentLoop` is what a loop in Python needs of that rule: pop (a brief
spin, then a bounded sleep on the doorbell), packets queued for a dead
consumer failed unrun with OWNER_DIED, STOP, the checks of a packet's type,
signal and waits, the finishing of a signal and of the follow-ups that will
never run.  Its subclass :class:`hostless.agents.cuda_agent.CudaLoop` turns
each packet into stream work (its waits and follow-up pushes then run on the
GPU: a stream wait is not bounded by ``wait_timeout``, and a device push into
a queue that stays full gives up after a bounded spin without failing the
follow-up's signal).  The gpucp agent's host process uses its finish rule to
fail a dead consumer's packets before the resident kernel starts.
"""

from __future__ import annotations

import os
import sys
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from .. import lowlevel, records
from .._abi import C, handle_kind
from ..domain import Domain
from ..errors import HostlessError
from ..kernels import LOAD_KERNEL, Kernel
from ..queue import Queue
from ..status import Status
from ..wire import BadPacket, Packet, PacketType, decode_args
from .control import LOAD_REFUSED

__all__ = ["AgentLoop", "ObjectCache", "BadPacket", "decode_kernel", "HOP_LIMIT", "FAIL_DEPTH", "FAIL_BUDGET"]

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

HOP_LIMIT = int(C.AGENT_HOP_LIMIT)
"""Follow-ups through the agent's own queue: at most this many hops (HLE_AGENT_HOP_LIMIT)."""
FAIL_DEPTH = int(C.AGENT_FAIL_DEPTH)
FAIL_BUDGET = int(C.AGENT_FAIL_BUDGET)
"""Failing the follow-ups of a failed packet: at most this deep and this many signals
(HLE_AGENT_FAIL_DEPTH, HLE_AGENT_FAIL_BUDGET)."""
_kind = handle_kind


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


def decode_kernel(
    kernels: dict[int, Any], cache: ObjectCache, pkt: Packet
) -> tuple[Any, tuple[int, ...], tuple[int, ...], list[tuple[int, bytes]]]:
    """(kernel, buffer handles, scalars, follow-ups) of a KERNEL packet from the table
    ``kernels``; BadPacket for LOAD_KERNEL (code comes only through the spawner's channel),
    an unknown kernel or a missing or malformed argument block."""
    if pkt.kernel == LOAD_KERNEL:
        raise BadPacket(LOAD_REFUSED)
    fn = kernels.get(pkt.kernel)
    if fn is None:
        raise BadPacket(f"unknown kernel {pkt.kernel}")
    if not pkt.args:
        raise BadPacket("kernel packet without an argument block")
    bufs, scalars, follow = decode_args(cache.bytes_view(pkt.args))
    return fn, bufs, scalars, follow


class AgentLoop:
    """A consumer loop of one queue in Python (the cuda agent's base; the module says why).

    ``kernels`` starts as ``user`` (kernels by id); a subclass adds its own table and
    implements :meth:`execute`.  ``parent`` is the pid of the spawner: the loop ends when
    it is gone.
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
        self.kernels: dict[int, Any] = dict(user)
        self.running = True
        self.spin_ns = 50_000  # how long an idle agent polls its doorbell before sleeping
        self.last_packet_ns = 0  # time.monotonic_ns() when the last packet was popped
        self.wait_timeout = wait_timeout
        self.follow_timeout = follow_timeout
        self.stale_below = 0
        self.pop_timeout_ns = 50_000_000
        """How long an idle loop sleeps on its doorbell before it looks again (service, parent)."""
        """Packets below this index were queued for the dead consumer this agent replaced
        (what :meth:`Queue.bind` returned): they fail unrun, with OWNER_DIED."""
        self.failures = 0  # packets failed and follow-ups dropped (statistics)
        self.records = records.Recorder(dom)  # why packets failed (hostless.records)
        self.trace = lowlevel.tracer(dom)  # emit(event, a, b, c, d, e) into the domain's trace ring

    # ------------------------------------------------------------------
    def run(self) -> None:
        """Serve the queue until a STOP packet, ``running`` cleared, or the spawner's death."""
        q = self.queue
        idle = 0
        while self.running:
            self.service()
            # a bounded wait after the spin (both at most pop_timeout_ns: service() runs that often)
            r = q.pop_raw(self.pop_timeout_ns, self.pop_spin_ns())
            if r is None:
                idle += 1
                if os.getppid() != self.parent:
                    return  # the spawner died: no orphans
                if idle == 2:
                    self.cache.clear()
                continue
            idle = 0
            self.last_packet_ns = time.monotonic_ns()
            idx, raw = r
            pkt = Packet.decode(raw)
            if idx < self.stale_below:
                self.discard_stale(idx, pkt)
                q.completed()
                continue
            if pkt.type == PacketType.STOP:
                self.finish(pkt, Status.SUCCESS, idx)
                return
            try:
                self.execute(idx, pkt)
            except Exception as e:  # a last resort: a packet never takes the agent down
                self.failures += 1
                _debug(f"agent {self.kind}: packet {idx} raised {e!r}")
                self.finish(pkt, Status.ERROR, idx)
            q.completed()
            self.cache.trim()

    def pop_spin_ns(self) -> int:
        """How long the next pop polls the doorbell before it sleeps on it (at most
        ``pop_timeout_ns``): ``spin_ns`` here; a subclass may spin less."""
        return min(self.spin_ns, self.pop_timeout_ns)

    def execute(self, idx: int, pkt: Packet) -> None:
        """Run packet ``idx`` of the queue (a subclass's); never raises for a bad packet."""
        raise NotImplementedError

    def service(self) -> None:
        """Between packets (and at least every 50 ms when idle): the loop thread's other work
        (a subclass's: the cuda agent serves its spawner's load requests here)."""

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

    def kernel_call(
        self, pkt: Packet
    ) -> tuple[Any, tuple[int, ...], tuple[int, ...], list[tuple[int, bytes]]]:
        """:func:`decode_kernel` on this loop's table."""
        return decode_kernel(self.kernels, self.cache, pkt)

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
