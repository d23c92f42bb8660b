"""The cuda agent's loop: each packet becomes stream work on one GPU.

It follows the engine's rule for bad packets (the contract of ``hle_agent_run``
in ``core/hostless_engine.h``; :mod:`hostless.agents.loop`), checking
everything before it enqueues any stream wait (so it never synchronizes
behind a wait that may never complete); its waits and follow-up pushes then
run on the GPU (:class:`hostless.cuda.CudaPeer`).  A follow-up packet is
never copied: the GPU pushes it from where it lies in the argument block (a
producer prepares the block once and patches it per use, as
:class:`hostless.graph.CompiledGraph` does), and the agent holds a
reference to the block until the stream has passed the push.
"""

from __future__ import annotations

import ctypes
import os
import queue as _queue
import threading
import time
from collections import OrderedDict
from typing import Any

from .. import stagefn
from .._abi import C
from ..domain import Domain
from ..kernels import Kernel
from ..queue import Queue
from ..status import Status
from ..wire import FO_PACKET, BadPacket, Packet, PacketType, follow_offset
from .cuda_armed import Armed, pass_frames
from .gpufn import MAX_RUNNERS, Runner, Segment
from .kinds import FLAG_STAGE_COPY
from .loop import _EV_END, _EV_START, _SIGNALABLE, _WAITABLE, FAIL_BUDGET, AgentLoop, _debug, _kind

__all__ = ["CudaLoop", "FLAG_STAGE_COPY"]

_KIND_TIMELINE = int(C.KIND_TIMELINE)
_KIND_BUFFER = int(C.KIND_BUFFER)
_KIND_QUEUE = int(C.KIND_QUEUE)


class CudaLoop(AgentLoop):
    """A GPU agent: each packet becomes stream work, and the host thread moves on.

    Waits are ``cuStreamWaitValue64`` on the GPU, the kernel runs on CuPy arrays
    (zero-copy views of the heap, or device copies in copy mode), the output is
    committed and the signal stored by the GPU only when every input succeeded,
    and follow-up packets are pushed into their queues when the stream reaches them, by
    CUDA's callback thread with the host's atomics (:meth:`CudaPeer.enqueue`); a push that
    fails (its queue full for ``follow_timeout``) fails the follow-up's signal and those
    nested in it, as on the host path.  This process never synchronizes the stream in the
    loop.
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
        # GPU stages from user functions (hostless.agents.gpufn): segments by kernel id, their
        # runners by the buffers' handles; requests from the spawner's load channel, served
        # by this thread between packets (never behind a pending stream wait)
        self.runners: dict[int, OrderedDict[tuple[int, ...], Runner]] = {}
        self.requests: _queue.Queue[tuple[dict[str, Any], list[Any], threading.Event]] = _queue.Queue()
        self.armed: dict[tuple[int, int], Armed] = {}  # armed segments' frame slots: by (id, slot)
        # an armed slot wakes the host sleepers of its timeline from a stream of its own, so
        # that the host function never holds up the slot's next frame; "inline" (the old way,
        # for A/B runs of the benchmarks) queues it on the slot's stream
        self.wake_inline = os.environ.get("HOSTLESS_CUDA_ARMED_WAKE", "") == "inline"
        _precise_sleeps()

    ARMED_POLL_NS = 100_000
    """While segments are armed the loop looks at them this often (it queues their next frames):
    ``Armed.WINDOW`` frames per look at most."""

    def pop_spin_ns(self) -> int:
        """No doorbell spin while segments are armed and no packet came within
        ``C.AGENT_BUSY_NS`` (the C loop's rule for packets that come often): an armed
        pipeline's frames bring this loop no packet, and spinning half of every
        ``ARMED_POLL_NS`` cycle for them cost half a core.  A packet still wakes the
        sleeping loop (the doorbell's futex), and the spin comes back with the next."""
        if self.armed and time.monotonic_ns() - self.last_packet_ns >= C.AGENT_BUSY_NS:
            return 0
        return super().pop_spin_ns()

    # ------------------------------------------------------------ load channel
    def load_function(self, req: dict[str, Any]) -> dict[str, Any]:
        """A request of the spawner's private channel (the channel's thread): handed to
        the loop thread, which owns the stream; returns its reply or raises its error."""
        box: list[Any] = []
        done = threading.Event()
        self.requests.put((req, box, done))
        while not done.wait(1.0):
            if not self.running:
                raise RuntimeError("the agent is stopping")
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]  # type: ignore[no-any-return]

    def service(self) -> None:
        for key, a in list(self.armed.items()):
            try:
                ok = a.pump()
            except Exception as e:  # a CUDA error queuing a frame: the slot stops, the agent goes on
                _debug(f"agent cuda: armed segment {key} disarmed: {e!r}")
                ok = False
            if not ok:
                self._disarm(key)
        while True:
            try:
                req, box, done = self.requests.get_nowait()
            except _queue.Empty:
                return
            try:
                box.append(self._request(req))
            except BaseException as e:  # the spawner gets it, with its traceback
                box.append(e)
            done.set()

    def _request(self, req: dict[str, Any]) -> dict[str, Any]:
        """``segment``: load a segment under ``id``; ``prepare``: capture it over ``buffers``;
        ``drop``: forget it.  Every request first lets the stream drain."""
        from ..kernels import FUNCTION_KERNEL_BASE

        op, kid = req.get("op"), req.get("id")
        if not isinstance(kid, int) or isinstance(kid, bool) or kid < FUNCTION_KERNEL_BASE:
            raise ValueError(f"a segment id is an int >= {FUNCTION_KERNEL_BASE}, got {kid!r}")
        self._quiesce()
        self.peer.stream.synchronize()
        self._recycle()
        if op == "segment":
            if kid in self.kernels:
                raise ValueError(f"kernel id {kid} is taken")
            seg = Segment(req, self.peer.device)
            self.kernels[kid] = seg
            self.runners[kid] = OrderedDict()
            return {"id": kid, "mode": seg.mode, "why": seg.why}
        got = self.kernels.get(kid)
        if not isinstance(got, Segment):
            raise ValueError(f"no segment {kid}")
        seg = got
        if op == "prepare":
            hs = req.get("buffers")
            if not isinstance(hs, list) or not all(isinstance(h, int) for h in hs):
                raise ValueError("prepare names a list of buffer handles")
            r = self._runner(kid, seg, tuple(hs), bool(req.get("gated", False)))
            return {"id": kid, "mode": r.mode, "why": r.why}
        if op == "arm":  # one frame slot; a slot armed already is re-armed (its graph renewed it)
            slot = req.get("slot")
            if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < 64:
                raise ValueError("arm: slot is an int in 0..63")
            hs = req.get("buffers")
            if not isinstance(hs, list) or not all(isinstance(h, int) for h in hs):
                raise ValueError("arm: buffers is a list of buffer handles")
            r = self._runner(kid, seg, tuple(hs), True)
            if r.mode != "graph":
                raise ValueError(f"segment {kid} runs eagerly over these buffers ({r.why}): not armed")
            armed = Armed(self, req, r)
            if (kid, slot) in self.armed:
                self._disarm((kid, slot), restore=True)
            self.armed[(kid, slot)] = armed
            self.pop_timeout_ns = self.ARMED_POLL_NS  # pump the armed segments this often
            return {"id": kid}  # (the first pump is the loop's next service(), not this reply's)
        if op == "drop":
            for key in [key for key in self.armed if key[0] == kid]:
                self._disarm(key)
            for r in self.runners.pop(kid, {}).values():
                r.release()
            del self.kernels[kid]
            return {"id": kid}
        raise ValueError(f"unknown request {op!r}")

    def _group(self, a: Armed) -> list[Armed]:
        return [b for b in self.armed.values() if b.word == a.word]

    def _disarm(self, key: tuple[int, int], restore: bool = False) -> None:
        """Close one armed slot: its graph's queued frames pass (:func:`pass_frames`), the
        others of its graph (``restore``: the graph goes on) are queued again."""
        a = self.armed[key]
        group = self._group(a)
        pass_frames(group, restore)
        del self.armed[key]
        a.release()
        for b in group:
            if b is not a:
                b.requeue()
        if not self.armed:
            self.pop_timeout_ns = 50_000_000

    def _quiesce(self) -> None:
        """Before what may synchronize the whole device: no armed frame left waiting."""
        seen: set[int] = set()
        for a in list(self.armed.values()):
            group = self._group(a)
            if a.word in seen or not any(b.queued() for b in group):
                continue
            seen.add(a.word)
            pass_frames(group, restore=True)
            for b in group:
                b.requeue()

    def _runner(self, kid: int, seg: Segment, hs: tuple[int, ...], gated: bool = False) -> Runner:
        """The runner of segment ``kid`` over buffers ``hs`` (``gated``: an armed segment's,
        whose graph commits its result gated: :class:`~hostless.agents.gpufn.Runner`): prepared
        at compile time, or captured now (the stream drained first: never capture behind a
        pending wait)."""
        rs = self.runners[kid]
        key = (*hs, int(gated))
        r = rs.get(key)
        if r is not None:
            return r
        self._quiesce()
        bufs: list[Any] = []
        try:
            for h in hs:
                if _kind(h) != _KIND_BUFFER:
                    raise BadPacket(f"handle {h:#x} is not a buffer")
                try:
                    bufs.append(self.dom.import_buffer(h))
                except Exception as e:
                    raise BadPacket(f"handle {h:#x}: {e}") from None
            self.peer.stream.synchronize()
            try:
                r = seg.runner(self.peer, bufs, gated)
            except ValueError as e:
                raise BadPacket(str(e)) from None
        except BaseException:
            for b in bufs:
                b.release()
            raise
        rs[key] = r
        if len(rs) > MAX_RUNNERS:
            _h, old = rs.popitem(last=False)
            self.inflight.append((self.peer.stream.record(), [old]))
        return r

    def _segment(self, idx: int, pkt: Packet, seg: Segment, hs: tuple[int, ...], follow: list[Any]) -> None:
        """A packet of a segment: waits, the replay (or the eager functions), the gated
        signal and the follow-ups, all queued on the stream."""
        peer, st = self.peer, self.peer.stream
        r = self._runner(pkt.kernel, seg, hs)
        targets = self._resolve_follow(follow)
        block: Any = None
        keep: list[Any] = []
        if targets:
            block = self.dom.import_buffer(pkt.args)
            keep.append(block)
        try:
            gate = self._wait_inputs_on_gpu(pkt)
            keep.append(_Keep([gate]))
            try:
                r.launch(int(st.ptr))
            except Exception as e:
                self.records.write(pkt.signal, stagefn.format_error(e))
                raise
            if pkt.signal:
                peer.signal(self.cache.get(pkt.signal, _SIGNALABLE), pkt.signal_value, gate)
            nb = len(hs)
            for q, j in targets:
                at = follow_offset(nb, 0, j) + FO_PACKET
                keep.append(
                    _Pushed(
                        self,
                        peer.enqueue(q, block, gate, offset=at, timeout=self.follow_timeout),
                        follow[j][1],
                    )
                )
        finally:
            self.inflight.append((st.record(), keep))

    def _recycle(self) -> None:
        """Release what the stream work that has completed kept alive."""
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
        waits, values = [], []
        for h, v in zip(pkt.wait, pkt.wait_value, strict=True):
            if h:
                o = self.cache.get(h, _WAITABLE)
                v = v if _kind(h) == _KIND_TIMELINE else 1
                self.peer.wait(o, v)
                waits.append(o)
                values.append(v)
        return self.peer.gate(waits, values)

    def _resolve_follow(self, follow: list[tuple[int, bytes]]) -> list[tuple[Any, int]]:
        """(queue, index of the follow-up in the block) of each follow-up; one whose queue
        handle is bad is dropped now and its signal (and those nested in it) fails with
        ERROR, as on the host path."""
        out = []
        budget = [FAIL_BUDGET]
        for j, (qh, raw) in enumerate(follow):
            try:
                out.append((self.cache.get(qh, (_KIND_QUEUE,)), j))
            except BadPacket as e:
                _debug(f"agent cuda: follow-up into {qh:#x} dropped: {e!r}")
                fp = Packet.decode(raw)
                self.fail_signal(fp.signal, fp.signal_value, Status.ERROR)
                self.fail_downstream(fp, Status.ERROR, budget)
        return out

    def execute(self, idx: int, pkt: Packet, hops: int = 0) -> None:
        """Turn packet ``idx`` into stream work (waits, kernel, commit, signal, follow-up
        pushes) and return without synchronizing; a bad packet fails alone with ERROR."""
        cp, peer = self.cp, self.peer
        st = peer.stream
        self.trace(_EV_START, self.queue.handle, idx, pkt.signal, pkt.kernel, 0)
        self._recycle()
        keep: list[Any] = []
        packets: list[Any] = []
        queued = False  # stream waits were enqueued: never synchronize behind them
        block: Any = None  # the argument block, held while the GPU reads follow-ups from it
        at: list[int] = []  # offset of each follow-up's packet in the block
        try:
            # everything that can be checked is checked before the first stream wait
            self.check(pkt)
            follow: list[tuple[int, bytes]] = []
            fn: Any = None
            bufs: list[Any] = []
            scalars: tuple[int, ...] = ()
            if pkt.type == PacketType.KERNEL:
                fn, hs, scalars, follow = self.kernel_call(pkt)
                if isinstance(fn, Segment):
                    if scalars:
                        raise BadPacket("a segment's packet carries no scalars")
                    queued = True
                    self._segment(idx, pkt, fn, tuple(hs), follow)
                    self.trace(_EV_END, self.queue.handle, idx, pkt.signal, 0, 1)
                    return
                bufs = [self.cache.get(h, (_KIND_BUFFER,)) for h in hs]
                if not bufs:
                    raise BadPacket("kernel packet without buffers")
                sig = (pkt.kernel, pkt.flags, tuple((b.dtype.str, b.shape) for b in bufs), scalars)
                if sig not in self.warm:
                    # first run of this signature: without pending waits (the
                    # result goes to a scratch buffer that is never committed)
                    self._quiesce()
                    st.synchronize()
                    with st:
                        tmp = cp.empty(bufs[-1].shape, bufs[-1].dtype)
                        fn([_device_copy(cp, peer, b) for b in bufs[:-1]], scalars, tmp)
                        fn([peer.array(b) for b in bufs[:-1]], scalars, tmp)
                    st.synchronize()
                    self.warm.add(sig)
            elif pkt.type != PacketType.BARRIER:
                raise BadPacket(f"the cuda agent does not run packets of type {pkt.type}")
            targets = self._resolve_follow(follow)
            if targets:  # the GPU reads the follow-ups in the block: hold it until the stream passed them
                block = self.dom.import_buffer(pkt.args)
                packets.append(block)
                at = [follow_offset(len(bufs), len(scalars), j) + FO_PACKET for j in range(len(follow))]
            queued = True
            gate = self._wait_inputs_on_gpu(pkt)
            if pkt.type == PacketType.KERNEL:
                with st:
                    if pkt.flags & FLAG_STAGE_COPY:  # copy mode: explicit host -> device copies
                        ins = []
                        for b in bufs[:-1]:
                            ins.append(_device_copy(cp, peer, b, st))
                    else:  # shared mode: the GPU reads the heap in place
                        ins = [peer.array(b) for b in bufs[:-1]]
                    out = bufs[-1]
                    scratch = cp.empty(out.shape, out.dtype)
                    fn(ins, scalars, scratch)
                    peer.commit(out, scratch, gate)
                keep += [scratch, *ins]
            if pkt.signal:
                peer.signal(self.cache.get(pkt.signal, _SIGNALABLE), pkt.signal_value, gate)
            for q, j in targets:
                push = peer.enqueue(q, block, gate, offset=at[j], timeout=self.follow_timeout)
                packets.append(_Pushed(self, push, follow[j][1]))  # checked once the stream passed it
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
        # argument blocks of follow-ups and device temporaries live until the GPU passed them
        self.inflight.append((st.record(), packets + [_Keep(keep)]))
        self.trace(_EV_END, self.queue.handle, idx, pkt.signal, 0, 1)


def _precise_sleeps() -> None:
    """This thread's timer slack to 1 us (``PR_SET_TIMERSLACK``, as the GPU command processor's
    forwarder thread): the loop's bounded sleeps between looks at the armed segments
    (``CudaLoop.ARMED_POLL_NS``) then end nearer their nominal time.  On the 2-core VM an empty
    queue's pop of 100 us (50 us of them spinning, as before :meth:`CudaLoop.pop_spin_ns`
    dropped the spin of an armed loop without packets) took 191 us at the median with the default
    slack of 50 us and 136 us with 1 us (``benchmarks/pop_cycle.py``,
    ``results/pop-cycle-vm-2026-12-07.json``), longer than an armed slot's ``Armed.WINDOW``
    frames of one GPU stage last (19 us each on an H100): a frame submitted past them waits
    for the next look.  (Its effect on armed frames is not measured on a GPU yet.)"""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, ns
    except (OSError, AttributeError):
        pass


def _device_copy(cp: Any, peer: Any, b: Any, stream: Any = None) -> Any:
    """A private device copy of buffer ``b`` (host or device resident), queued on ``stream``."""
    d = cp.empty(b.shape, b.dtype)
    if getattr(b, "device", "cpu") != "cpu":
        with stream or cp.cuda.get_current_stream():
            cp.copyto(d, peer.array(b))
    else:
        d.set(b.numpy(), stream=stream)
    return d


class _Pushed:
    """A follow-up push queued on the stream: once the stream passed it (released by
    :meth:`CudaLoop._recycle`), a push that failed fails the follow-up's signal and those
    nested in it with ERROR."""

    __slots__ = ("loop", "push", "raw")

    def __init__(self, loop: CudaLoop, push: Any, raw: bytes) -> None:
        self.loop, self.push, self.raw = loop, push, raw

    def release(self) -> None:
        ran, result = self.push.state()
        if ran and result in (0, 1):  # pushed, or not pushed because an input failed
            return
        _debug(f"agent cuda: follow-up push failed (ran={ran}, result={result})")
        fp = Packet.decode(self.raw)
        self.loop.fail_signal(fp.signal, fp.signal_value, Status.ERROR)
        self.loop.fail_downstream(fp, Status.ERROR, [FAIL_BUDGET])


class _Keep:
    """Holds device temporaries until their stream work completed."""

    def __init__(self, objs: list[Any]) -> None:
        self.objs = objs

    def release(self) -> None:
        self.objs = []
