"""Armed GPU segments: a graph's frames queued ahead on the GPU behind stream waits on its host
word, so that neither a packet nor the cuda agent's process is on a frame's path (the cuda agent,
:mod:`hostless.agents.cuda_agent`, arms and pumps them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import lowlevel
from .._abi import C, handle_kind
from ..cuda import ARMED_WAITS
from .gpufn import Runner

if TYPE_CHECKING:
    from .cuda_agent import CudaLoop

__all__ = ["Armed", "pass_frames"]

_KIND_TIMELINE = int(C.KIND_TIMELINE)
_KIND_BUFFER = int(C.KIND_BUFFER)


class Armed:
    """One frame slot of a segment armed by its graph (direct dispatch, shared data): the GPU
    work of the slot's next frames is queued ahead on a stream of its own, so neither a packet
    nor this process is on a frame's path.

    The slot runs frames ``start``, ``start + step``, ... (``step``: the graph's slots, each
    with its own buffers and timelines), each queued as two operations: a stream wait
    (``cuStreamWaitValue64``) until the graph's *host word* (a u64 of a heap buffer that the
    host's frame program stores the frame number into, a release store after the frame's
    inputs) reaches the frame, then one replay of the slot's captured graph
    (:class:`~hostless.agents.gpufn.Runner`), which holds the whole frame: the wait for the
    predecessors' points in this slot's timelines (one thread, bounded: the frame was
    submitted), which opens or closes the gate (one device int of the runner), the user's
    work, the gated commit of its result into the output buffer, and the gated signal of the
    slot's timeline, which steps the frame counter of the runner's control block (the slot's
    frames run in stream order, so the counter is the frame of the replay that reads it).
    After the replay, on a second stream behind an event, a host function wakes the
    timeline's sleepers (a host function holds its stream until it returns: on the slot's
    stream it would delay the next frame).  It pushes nothing: the GPU's atomics on host
    memory are not atomic against the host's on a PCIe machine without PCIe atomics, so the
    graph's host pushes the stages it feeds (:func:`hostless.segments.arm_plan`).
    :meth:`pump` (the agent's loop, every 100 us) keeps up to ``WINDOW`` of the slot's frames
    queued past the last one it signalled.  What waits indefinitely (for frames the host has
    not submitted) is only the stream wait on the host word: the GPU front end's, no SM.

    Before anything in this process that may synchronize the whole device (a load, a capture,
    a kernel's first run), and when a slot is closed or re-armed, the queued frames of the
    graph's armed slots pass without effect (:func:`pass_frames`) and the ones not signalled
    are queued again by the next :meth:`pump`.  The agent closes the slots of a graph that
    dropped the segment or whose ``fed`` timeline failed (the graph closed or invalidated, or
    its host died).
    """

    WINDOW = 8
    """The slot's frames queued ahead past the last one signalled: each is a stream wait, a
    replay and an event (and a host function on the wake stream), and a stream holds a
    bounded number before a launch blocks (with 32 the GPU tests hung on an H100, not
    analysed: launches blocking behind the queued frames' waits, and the agent with them, is
    the likely cause).  The agent's loop queues more every ``CudaLoop.ARMED_POLL_NS``."""
    PAST = 2**63 - 1

    def __init__(self, loop: CudaLoop, req: dict[str, Any], runner: Runner) -> None:
        import cupyx

        cp, dom, peer = loop.cp, loop.dom, loop.peer
        self.loop, self.runner = loop, runner
        held: list[Any] = []
        try:
            start, step = req.get("start"), req.get("step")
            if not isinstance(start, int) or not 0 < start < 2**62:
                raise ValueError("arm: start is a frame number")
            if not isinstance(step, int) or not 0 < step <= 64:
                raise ValueError("arm: step is the graph's number of frame slots")
            waits = req.get("waits")
            if not isinstance(waits, list) or len(waits) > ARMED_WAITS:
                raise ValueError(f"arm: at most {ARMED_WAITS} wait timelines")
            for h in [*waits, req.get("fed"), req.get("signal")]:
                if not isinstance(h, int) or handle_kind(h) != _KIND_TIMELINE:
                    raise ValueError(f"arm: {h!r} is not a timeline handle")
                held.append(dom.import_timeline(h))
            self.waits, self.fed, self.signal = held[: len(waits)], held[-2], held[-1]
            hw = req.get("host_word")
            if not isinstance(hw, int) or handle_kind(hw) != _KIND_BUFFER:
                raise ValueError("arm: host_word is a buffer handle")
            word = dom.import_buffer(hw)
            held.append(word)
            if word.device != "cpu" or word.nbytes < 8:
                raise ValueError("arm: the host word is a host buffer of at least 8 bytes")
            self.word = peer.buffer_dptr(word)
            self.hostword = word.numpy().view(np.uint64)[:1]  # the host's atomics on it (pass_frames)
        except BaseException:
            for o in held:
                o.release()
            raise
        self.held = held
        self.start, self.step, self.next = start, step, start
        self.stream = cp.cuda.Stream(non_blocking=True)
        # the host function that wakes the timeline's sleepers runs on a stream of its own,
        # behind an event recorded after each frame's signal: a host function blocks its
        # stream until it returned (tens of us), and the slot's next frame must not wait
        self.wake_stream = cp.cuda.Stream(non_blocking=True)
        self.signalled = cp.cuda.Event(block=False, disable_timing=True)
        self.wake_addr = peer.word_addr(self.signal) - peer.dbase + peer.base
        self.cancel = cupyx.zeros_pinned((1,), np.int32)  # mapped: its host address is its device one
        try:  # no frame of the runner is queued now (the agent drained every armed stream first)
            peer.armed_set(runner.ctl, start, step, self.cancel.ctypes.data, self.signal, self.waits)
        except BaseException:
            self.release()
            raise

    def _done(self) -> int:
        """The slot's last frame signalled (``start - step`` before the first)."""
        v = self.signal.value
        return v if v >= self.start else self.start - self.step

    def pump(self) -> bool:
        """Queue the slot's frames up to ``WINDOW`` past the last one signalled; False when
        the graph is over (its ``fed`` timeline failed).  After a failed frame (the slot's
        timeline failed) nothing more is queued: the graph renews the slot and re-arms it."""
        if self.fed.failure is not None:
            return False
        if self.signal.failure is not None:
            return True
        peer, st, r = self.loop.peer, self.stream, self.runner
        while self.next <= self._done() + self.WINDOW * self.step:
            f = self.next
            peer.wait_word(self.word, f, st)
            r.launch(int(st.ptr))  # the frame's wait, work, commit and signal (see the class)
            if self.loop.wake_inline:
                peer.host_wake(self.wake_addr, st)
            else:
                self.signalled.record(st)
                self.wake_stream.wait_event(self.signalled)
                peer.host_wake(self.wake_addr, self.wake_stream)
            self.next = f + self.step
        return True

    def queued(self) -> bool:
        """Whether frames are queued on the slot's stream past the last one signalled."""
        return self.signal.failure is not None or self.next > self._done() + self.step

    def requeue(self) -> None:
        """After a pass (:func:`pass_frames`: nothing of the slot queued): the frames not
        signalled are queued again, the runner's frame counter set back to the first."""
        if self.signal.failure is None:
            self.next = self._done() + self.step
            self.loop.peer.armed_set(self.runner.ctl, self.next)

    def release(self) -> None:
        for o in self.held:
            try:
                o.release()
            except Exception:
                pass
        self.held = []


def pass_frames(group: list[Armed], restore: bool) -> None:
    """Let every frame queued by ``group`` (the armed slots of one graph: one host word) pass
    without effect: their cancel flags set, the host word exchanged for a value past every
    frame, their streams drained (each frame's gate is -1: nothing committed or signalled);
    then (``restore``) the host word put back unless the host stored a newer frame meanwhile,
    and the flags cleared.  All of a graph's slots at once: a frame passing the host word
    while its flag is clear could run before the host wrote it.  The exchange and the
    compare-exchange are the host's atomics, in this process: the host's frame program
    stores the word, and a GPU atomic on host memory is not atomic against a host store
    where the GPU lacks host-native atomics."""
    if not group:
        return
    a0 = group[0]
    for a in group:
        a.cancel[0] = 1
    old = lowlevel.word_exchange(a0.hostword, Armed.PAST)
    for a in group:
        a.stream.synchronize()
        a.wake_stream.synchronize()  # (its host functions touch the mapping)
    if restore:
        lowlevel.word_compare_exchange(a0.hostword, Armed.PAST, old)
        for a in group:
            a.cancel[0] = 0
