"""The agent process: consumes one queue and signals fences.

Run by :func:`hostless.agents.spawn` as ``python -m hostless.agents.worker``.
It joins the domain, binds the queue, prints its participant id, then loops:
take a packet (spinning briefly, then a bounded sleep on the doorbell, so an
idle agent costs no CPU), wait for the packet's fences / timeline points, run
the kernel (or the ERT command), signal, and enqueue the follow-up packets.
It exits on a STOP packet, on SIGTERM, and when the process that spawned it
dies (PR_SET_PDEATHSIG plus a parent check while idle and while waiting).

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
  that raises.  Nothing of a bad packet runs (a wait that fails does not
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

import argparse
import ctypes
import os
import signal
import struct
import sys
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from .. import ert
from .._abi import C
from ..buffer import bytes_buffer
from ..domain import Domain
from ..errors import HostlessError
from ..kernels import CPU_KERNELS, NPU_CUS, Kernel, load_user_kernel
from ..queue import Packet, PacketType, Queue
from ..status import Status

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
_ERT_MAX_BYTES = 4 + 4 * 0x7FF  # a header's count is 11 bits: no command needs more bytes


class BadPacket(ValueError):
    """A malformed packet, argument block or command: it fails with ERROR."""


def _kind(h: int) -> int:
    return (h >> 48) & 0xFF


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


class _Cache:
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


_KA_HEAD = struct.Struct("<IHHH")
_KA_SIZE = 16
_FOLLOW_SIZE = 72
_U64 = struct.Struct("<Q")


def decode_args(arr: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...], list[tuple[int, bytes]]]:
    """(buffers, scalars, [(queue, raw packet)]) of an argument block, without copying it
    (the fast form of ``Kernargs.decode``; BadPacket when malformed).  ``arr`` is read
    as bytes, whatever its dtype and shape; every count is checked by subtraction."""
    raw: Any = arr if arr.ndim == 1 and arr.dtype == np.uint8 else arr.reshape(-1).view(np.uint8)
    n = int(raw.shape[0])
    if n < _KA_SIZE:
        raise BadPacket("argument block shorter than its header")
    magic, nb, ns, nf = _KA_HEAD.unpack_from(raw)
    if magic != int(C.KERNARG_MAGIC):
        raise BadPacket(f"argument block has a bad magic {magic:#x}")
    left = n - _KA_SIZE
    if nb > left // 8:
        raise BadPacket(f"argument block claims {nb} buffers, has room for {left // 8}")
    left -= 8 * nb
    if ns > left // 8:
        raise BadPacket(f"argument block claims {ns} scalars, has room for {left // 8}")
    left -= 8 * ns
    if nf > left // _FOLLOW_SIZE:
        raise BadPacket(f"argument block claims {nf} follow-ups, has room for {left // _FOLLOW_SIZE}")
    bufs = struct.unpack_from(f"<{nb}Q", raw, _KA_SIZE)
    scal = struct.unpack_from(f"<{ns}Q", raw, _KA_SIZE + 8 * nb)
    off = _KA_SIZE + 8 * (nb + ns)
    follow = []
    for j in range(nf):
        o = off + _FOLLOW_SIZE * j
        follow.append((_U64.unpack_from(raw, o)[0], raw[o + 8 : o + _FOLLOW_SIZE].tobytes()))
    return bufs, scal, follow


class Agent:
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
        self.cache = _Cache(dom)
        table = NPU_CUS if kind == "npu" else CPU_KERNELS
        self.kernels: dict[int, Any] = {kid: fn for kid, fn in table.values()}
        self.kernels.update(user)
        self.running = True
        self.spin_ns = 50_000  # how long an idle agent polls its doorbell before sleeping
        self.wait_timeout = wait_timeout
        self.follow_timeout = follow_timeout
        self.hops: dict[int, int] = {}  # write index in our own queue -> hops of the follow-up chain
        self.failures = 0  # packets failed and follow-ups dropped (statistics)

    # ------------------------------------------------------------------
    def run(self) -> None:
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
        core = self.dom._core
        core.trace(_EV_START, self.queue.handle, idx, pkt.signal, pkt.kernel, 0)
        follow: list[tuple[int, bytes]] = []
        try:
            self.check(pkt)
            status = self.wait_inputs(pkt)
            if status == Status.SUCCESS:
                if pkt.type == PacketType.KERNEL:
                    follow = self.run_kernel(pkt)
                elif pkt.type == PacketType.ERT:
                    follow = self.run_ert(pkt)
        except Exception as e:  # a bad packet fails alone
            status = Status.ERROR
            _debug(f"agent {self.kind}: packet {idx} failed: {e!r}")
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
                        _debug(f"agent {self.kind}: input {h:#x} not complete within {self.wait_timeout} s")
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

    def run_kernel(self, pkt: Packet) -> list[tuple[int, bytes]]:
        fn = self.kernels.get(pkt.kernel)
        if fn is None:
            raise BadPacket(f"unknown kernel {pkt.kernel}")
        if not pkt.args:
            raise BadPacket("kernel packet without an argument block")
        bufs, scalars, follow = decode_args(self.cache.bytes_view(pkt.args))
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
        self.run_ert_buffer(self.cache.bytes_view(bufs[0]))
        return follow

    def run_ert_buffer(self, raw: np.ndarray, chained: bool = False) -> None:
        """Run the command in ``raw`` (flat uint8), writing its state into its header word."""
        words = raw[: raw.size - raw.size % 4].view("<u4")
        try:
            cmd = ert.ErtCommand.decode(raw[:_ERT_MAX_BYTES].tobytes())
        except ValueError:
            if words.size:
                words[0] = (int(words[0]) & ~0xF) | ert.State.ERROR
            raise
        words[0] = (int(words[0]) & ~0xF) | ert.State.RUNNING
        try:
            if cmd.opcode == ert.Opcode.CMD_CHAIN:
                if chained:
                    raise BadPacket("a chained command cannot be a CMD_CHAIN")
                self.run_chain(cmd, words)
            elif cmd.opcode in (ert.Opcode.START_CU, ert.Opcode.START_NPU):
                self.run_cu(cmd)
            else:
                raise BadPacket(f"unsupported ERT opcode {cmd.opcode}")
        except Exception:
            words[0] = (int(words[0]) & ~0xF) | ert.State.ERROR
            raise
        words[0] = (int(words[0]) & ~0xF) | ert.State.COMPLETED

    def run_chain(self, cmd: ert.ErtCommand, words: np.ndarray) -> None:
        # ert_cmd_chain_data right after the header (no cu_mask): count, submit
        # index (word 2), error index (word 3), reserved[3], u64 handles
        base = ert.CHAIN_HEADER_WORDS
        if len(cmd.payload) < base:
            raise BadPacket("CMD_CHAIN payload shorter than its fixed words")
        n = cmd.payload[0]
        if n > (len(cmd.payload) - base) // 2:
            raise BadPacket("CMD_CHAIN payload shorter than its command count")
        for i in range(n):
            words[2] = i  # submit index
            h = cmd.payload[base + 2 * i] | (cmd.payload[base + 1 + 2 * i] << 32)
            try:
                self.run_ert_buffer(self.cache.bytes_view(h), chained=True)
            except Exception:
                words[3] = i  # error index
                raise

    def run_cu(self, cmd: ert.ErtCommand) -> None:
        if cmd.cu_mask == 0 or cmd.cu_mask & (cmd.cu_mask - 1):
            raise BadPacket(f"cu_mask {cmd.cu_mask:#x} must name exactly one CU")
        cu = cmd.cu_mask.bit_length() - 1
        fn = self.kernels.get(cu)
        if fn is None:
            raise BadPacket(f"no CU {cu} in the loaded xclbin")
        if cmd.opcode == ert.Opcode.START_NPU:
            # instruction buffer address (2 words), its size, property count, then the arguments
            if len(cmd.payload) < 4:
                raise BadPacket("START_NPU payload shorter than its fixed words")
            args = cmd.payload[4:]
        else:
            args = cmd.payload
        # arguments: nbuf, then nbuf u64 buffer handles (two words each), then u64 scalars
        if not args:
            raise BadPacket("ERT command without arguments")
        nbuf = args[0]
        if nbuf > (len(args) - 1) // 2 or (len(args) - 1 - 2 * nbuf) % 2:
            raise BadPacket("ERT argument words do not match the buffer count")
        hs = [args[1 + 2 * i] | (args[2 + 2 * i] << 32) for i in range(nbuf)]
        rest = args[1 + 2 * nbuf :]
        scalars = [rest[2 * i] | (rest[2 * i + 1] << 32) for i in range(len(rest) // 2)]
        fn([self.cache.view(h) for h in hs], scalars)

    def finish(self, pkt: Packet, status: Status, idx: int) -> None:
        """Trace the end of the packet and signal it (never raises)."""
        try:
            self.dom._core.trace(_EV_END, self.queue.handle, idx, pkt.signal, int(status), 0)
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

    def fail_signal(self, h: int, value: int, status: Status) -> None:
        self.finish(Packet(signal=h, signal_value=value), status, -1)


FLAG_STAGE_COPY = 1  # packet flag: stage the inputs through device memory (copy mode)


class CudaAgent(Agent):
    """A GPU agent: each packet becomes stream work, and the host thread moves on.

    Waits are ``cuStreamWaitValue64`` on the GPU, the kernel runs on CuPy arrays
    (zero-copy views of the heap, or device copies in copy mode), the output is
    committed and the signal stored by the GPU only when every input succeeded,
    and follow-up packets are pushed into their queues by a device-side enqueue
    kernel.  This process never synchronizes the stream in the loop.
    """

    def __init__(
        self,
        dom: Domain,
        queue: Queue,
        user: dict[int, Kernel],
        parent: int,
        device: int,
        wait_timeout: float | None = 60.0,
        follow_timeout: float = 10.0,
    ) -> None:
        super().__init__(dom, queue, "cuda", user, parent, wait_timeout, follow_timeout)
        from ..cuda import CudaPeer
        from ..kernels import _cuda_table

        self.peer = CudaPeer(dom, device)
        self.cp = self.peer.cp
        self.kernels = dict(_cuda_table())
        self.kernels.update(user)
        self.inflight: list[tuple[Any, list[Any]]] = []  # (event, objects to keep until it completes)
        # (kernel, layouts) already run once: CuPy compiles and CUDA loads modules
        # on first use, and that must never happen behind a pending stream wait
        # (module loading can wait for the device, which the wait holds: deadlock)
        self.warm: set[Any] = set()

    def _recycle(self) -> None:
        keep = []
        for ev, objs in self.inflight:
            if ev.done:
                for o in objs:
                    o.release()
            else:
                keep.append((ev, objs))
        self.inflight = keep

    def _wait_inputs_on_gpu(self, pkt: Packet) -> Any:
        """Stream waits on the packet's inputs, then the gate over their words
        (handles and values were checked by :meth:`check`)."""
        waits = []
        for h, v in zip(pkt.wait, pkt.wait_value, strict=True):
            if h:
                o = self.cache.get(h, _WAITABLE)
                self.peer.wait(o, v if _kind(h) == _KIND_TIMELINE else 1)
                waits.append(o)
        return self.peer.gate(waits)

    def _resolve_follow(self, follow: list[tuple[int, bytes]]) -> list[tuple[Any, bytes]]:
        """The follow-ups' queues; a follow-up whose queue handle is bad is dropped now and
        its signal (and those nested in it) fails with ERROR, as on the host path."""
        out = []
        budget = [FAIL_BUDGET]
        for qh, raw in follow:
            try:
                out.append((self.cache.get(qh, (_KIND_QUEUE,)), raw))
            except BadPacket as e:
                _debug(f"agent cuda: follow-up into {qh:#x} dropped: {e!r}")
                fp = Packet.decode(raw)
                self.fail_signal(fp.signal, fp.signal_value, Status.ERROR)
                self.fail_downstream(fp, Status.ERROR, budget)
        return out

    def execute(self, idx: int, pkt: Packet, hops: int = 0) -> None:
        cp, peer = self.cp, self.peer
        st = peer.stream
        core = self.dom._core
        core.trace(_EV_START, self.queue.handle, idx, pkt.signal, pkt.kernel, 0)
        self._recycle()
        keep: list[Any] = []
        packets: list[Any] = []
        queued = False  # stream waits were enqueued: never synchronize behind them
        try:
            # everything that can be checked is checked before the first stream wait
            self.check(pkt)
            follow: list[tuple[int, bytes]] = []
            fn: Any = None
            bufs: list[Any] = []
            scalars: tuple[int, ...] = ()
            if pkt.type == PacketType.KERNEL:
                fn = self.kernels.get(pkt.kernel)
                if fn is None:
                    raise BadPacket(f"unknown kernel {pkt.kernel}")
                if not pkt.args:
                    raise BadPacket("kernel packet without an argument block")
                hs, scalars, follow = decode_args(self.cache.bytes_view(pkt.args))
                bufs = [self.cache.get(h, (_KIND_BUFFER,)) for h in hs]
                if not bufs:
                    raise BadPacket("kernel packet without buffers")
                sig = (pkt.kernel, pkt.flags, tuple((b.dtype.str, b.shape) for b in bufs), scalars)
                if sig not in self.warm:
                    # first run of this signature: without pending waits (the
                    # result goes to a scratch buffer that is never committed)
                    st.synchronize()
                    with st:
                        tmp = cp.empty(bufs[-1].shape, bufs[-1].dtype)
                        fn([cp.asarray(b.numpy()) for b in bufs[:-1]], scalars, tmp)
                        fn([peer.array(b) for b in bufs[:-1]], scalars, tmp)
                    st.synchronize()
                    self.warm.add(sig)
            elif pkt.type != PacketType.BARRIER:
                raise BadPacket(f"the cuda agent does not run packets of type {pkt.type}")
            targets = self._resolve_follow(follow)
            queued = True
            gate = self._wait_inputs_on_gpu(pkt)
            if pkt.type == PacketType.KERNEL:
                with st:
                    if pkt.flags & FLAG_STAGE_COPY:  # copy mode: explicit host -> device copies
                        ins = []
                        for b in bufs[:-1]:
                            d = cp.empty(b.shape, b.dtype)
                            d.set(b.numpy(), stream=st)
                            ins.append(d)
                    else:  # shared mode: the GPU reads the heap in place
                        ins = [peer.array(b) for b in bufs[:-1]]
                    out = bufs[-1]
                    scratch = cp.empty(out.shape, out.dtype)
                    fn(ins, scalars, scratch)
                    peer.commit(out, scratch, gate)
                keep += [scratch, *ins]
            if pkt.signal:
                peer.signal(self.cache.get(pkt.signal, _SIGNALABLE), pkt.signal_value, gate)
            for q, raw in targets:
                pb = bytes_buffer(self.dom, raw)
                packets.append(pb)
                keep.append(peer.enqueue(q, pb, gate))
            keep.append(gate)
        except Exception as e:
            _debug(f"agent cuda: packet {idx} failed: {e!r}")
            if queued:  # the temporaries live until the stream passed them
                self.inflight.append((st.record(), packets + [_Keep(keep)]))
            else:
                st.synchronize()
                for pb in packets:
                    pb.release()
            self.finish(pkt, Status.ERROR, idx)
            self.fail_downstream(pkt, Status.ERROR, [FAIL_BUDGET])
            return
        # packet buffers of follow-ups and device temporaries live until the GPU passed them
        self.inflight.append((st.record(), packets + [_Keep(keep)]))
        core.trace(_EV_END, self.queue.handle, idx, pkt.signal, 0, 1)


class _Keep:
    """Holds device temporaries until their stream work completed."""

    def __init__(self, objs: list[Any]) -> None:
        self.objs = objs

    def release(self) -> None:
        self.objs = []


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hostless.agents.worker")
    ap.add_argument("domain")
    ap.add_argument("queue", type=lambda s: int(s, 0))
    ap.add_argument("kind", choices=["cpu", "npu", "cuda"])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--spin", type=float, default=50e-6, help="seconds to poll the doorbell before sleeping")
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--label", default=None)
    ap.add_argument("--user", action="append", default=[], help="ID=module:function")
    ap.add_argument(
        "--wait-timeout", type=float, default=60.0, help="bound on a packet's input waits (< 0: none)"
    )
    ap.add_argument("--follow-timeout", type=float, default=10.0, help="bound on a packet's follow-up pushes")
    a = ap.parse_args(argv)
    wait_timeout = None if a.wait_timeout < 0 else a.wait_timeout
    follow_timeout = max(0.0, a.follow_timeout)
    _set_pdeathsig()
    if os.getppid() != a.parent:
        return 1
    user: dict[int, Kernel] = {}
    for spec in a.user:
        kid, _, fn = spec.partition("=")
        user[int(kid)] = load_user_kernel(fn)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    dom = Domain.open(a.domain, label=a.label or f"{a.kind}-agent", kind=a.kind)
    q = dom.import_queue(a.queue)
    q.bind()
    sys.stdout.write(f"{dom.participant_id}\n")
    sys.stdout.flush()
    if a.kind == "cuda":
        agent: Agent = CudaAgent(dom, q, user, a.parent, a.device, wait_timeout, follow_timeout)
    else:
        agent = Agent(dom, q, a.kind, user, a.parent, wait_timeout, follow_timeout)
    agent.spin_ns = int(max(0.0, a.spin) * 1e9)
    try:
        agent.run()
    finally:
        agent.cache.clear()
        dom.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
