"""Armed GPU frames count themselves on the GPU: a reference model of that count (issue 23).

An armed slot's captured graph reads the frame it runs from a counter in device memory (the
slot's control block, ``hostless.cuda.ARMED_CTL``) that the graph's own last kernel steps by
the graph's number of slots (``hl_armed_signal``).  So at every replay the counter must equal
the frame the agent queued that replay for, through passes (a request to the agent lets every
queued frame through without effect and queues the unsignalled ones again), failures and
re-arming; otherwise a replay would wait for, and signal, another frame's points.

The agent's side here is the real code: :meth:`Armed.pump`, :meth:`Armed.requeue`,
:func:`pass_frames`, ``CudaLoop._quiesce`` and ``CudaPeer.armed_set``.  The GPU is a model of
the stream operations they queue, run in stream order with the kernels' rules
(``hl_armed_wait``: closed gate when cancelled or not armed, else the predecessors' status;
``hl_armed_signal``: signal when the gate is not closed, then step the counter).  Random
schedules of submissions, predecessor completions and failures, GPU progress, pumps and
passes; after every step the invariant is checked, and at the end every submitted frame was
signalled with its own number or failed.  Runs without a GPU.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from hostless.agents.cuda_agent import CudaLoop
from hostless.agents.cuda_armed import Armed
from hostless.cuda import ARMED_CTL, ARMED_WAITS, CudaPeer

FRAME, STEP, CANCEL, SIGNAL, N = (ARMED_CTL.index(k) for k in ("frame", "step", "cancel", "signal", "n"))
WORDS = len(ARMED_CTL)


class DevArray:
    """A device array as ``CudaPeer.armed_set`` writes it (slices and ``set``)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __getitem__(self, sl: slice) -> DevArray:
        return DevArray(self.a[sl])

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        self.a[...] = arr


class Timeline:
    """A timeline as the model sees it: its value and its failure (None: not failed)."""

    def __init__(self, addr: int) -> None:
        self.addr, self.value, self.failure = addr, 0, None


class Stream:
    def __init__(self, gpu: Gpu, ptr: int) -> None:
        self.gpu, self.ptr, self.ops = gpu, ptr, []

    def synchronize(self) -> None:
        while self.ops:
            if not self.gpu.step(self):
                raise AssertionError(f"stream {self.ptr} cannot drain: {self.ops[0]}")

    def wait_event(self, ev: Any) -> None:
        pass


class Event:
    def record(self, st: Any) -> None:
        pass


class Cp:
    """The part of CuPy ``armed_set`` uses."""

    class cuda:  # noqa: N801 (CuPy's name)
        class Stream:
            def __init__(self, non_blocking: bool = False) -> None:
                pass

            def synchronize(self) -> None:
                pass


class Peer:
    """The CudaPeer calls of an armed slot: queued on the model's streams; ``armed_set`` is
    the real one."""

    cp = Cp

    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu

    def word_addr(self, t: Timeline) -> int:
        return t.addr

    def wait_word(self, word: int, f: int, st: Stream) -> None:
        st.ops.append(("wait", f))

    def host_wake(self, addr: int, st: Any) -> None:
        pass

    armed_set = CudaPeer.armed_set


class Runner:
    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.ctl = DevArray(np.zeros(WORDS + ARMED_WAITS, dtype=np.uint64))

    def launch(self, ptr: int) -> None:
        st = self.gpu.streams[ptr]
        queued_for = st.ops[-1][1]  # the frame of the wait pump queued just before
        st.ops.append(("replay", self, queued_for))


class Gpu:
    """Stream operations run in order: a wait on the host word blocks until the word reaches
    its frame; a replay runs the armed kernels on the runner's control block."""

    def __init__(self) -> None:
        self.streams: dict[int, Stream] = {}
        self.hostword = np.zeros(1, dtype=np.uint64)
        self.timelines: dict[int, Timeline] = {}
        self.cancels: dict[int, np.ndarray] = {}
        self.replays: list[tuple[int, int, int]] = []  # (queued for, counter seen, gate)

    def stream(self) -> Stream:
        st = Stream(self, 1000 + len(self.streams))
        self.streams[st.ptr] = st
        return st

    def step(self, st: Stream) -> bool:
        """Run the stream's next operation; False when it is blocked."""
        op = st.ops[0]
        if op[0] == "wait":
            if int(self.hostword[0]) < op[1]:
                return False
        else:
            _, runner, queued_for = op
            if not self._replay(runner, queued_for):
                return False
        st.ops.pop(0)
        return True

    def _replay(self, runner: Runner, queued_for: int) -> bool:
        ctl = runner.ctl.a
        frame, n = int(ctl[FRAME]), int(ctl[N])
        cancel = self.cancels.get(int(ctl[CANCEL]))
        # hl_armed_wait
        if cancel is None or n > ARMED_WAITS or cancel[0]:
            gate = -1
        else:
            waits = [self.timelines[int(a)] for a in ctl[WORDS : WORDS + n]]
            if any(t.failure is None and t.value < frame for t in waits):
                return False  # spins until the points are reached (or a cancel)
            gate = next((t.failure for t in waits if t.failure is not None and t.value < frame), 0)
        # hl_armed_signal
        sig = self.timelines.get(int(ctl[SIGNAL]))
        if gate >= 0 and sig is not None and sig.failure is None:
            if gate:
                sig.failure = gate
            else:
                sig.value = max(sig.value, frame)
        ctl[FRAME] += ctl[STEP]
        self.replays.append((queued_for, frame, gate))
        return True


class Loop:
    """The agent loop's armed bookkeeping (CudaLoop's own methods)."""

    _group = CudaLoop._group
    _quiesce = CudaLoop._quiesce

    def __init__(self, gpu: Gpu) -> None:
        self.peer = Peer(gpu)
        self.wake_inline = False
        self.armed: dict[int, Armed] = {}


def arm(loop: Loop, gpu: Gpu, slot: int, runner: Runner, start: int, step: int, pred: Timeline) -> Armed:
    """An armed slot as ``Armed.__init__`` leaves it (its checks and imports aside)."""
    a = object.__new__(Armed)
    a.loop, a.runner = loop, runner
    a.waits, a.fed = [pred], Timeline(0)
    a.signal = Timeline(10_000 + 10 * slot + len(gpu.timelines))
    gpu.timelines[a.signal.addr] = a.signal
    a.word, a.hostword = 0, gpu.hostword
    a.held = []
    a.start, a.step, a.next = start, step, start
    a.stream, a.wake_stream, a.signalled = gpu.stream(), gpu.stream(), Event()
    a.wake_addr = 0
    a.cancel = np.zeros(1, dtype=np.int32)
    gpu.cancels[a.cancel.ctypes.data] = a.cancel
    loop.peer.armed_set(runner.ctl, start, step, a.cancel.ctypes.data, a.signal, a.waits)
    return a


def _check(gpu: Gpu, seed: int) -> None:
    for q, seen, _g in gpu.replays:
        assert seen == q, f"a replay queued for frame {q} ran as frame {seen} (seed {seed})"


@pytest.mark.parametrize("seed", range(40))
def test_each_replay_runs_the_frame_it_was_queued_for(seed: int) -> None:
    rng = random.Random(seed)
    gpu = Gpu()
    loop = Loop(gpu)
    slots = rng.choice([1, 2, 3])
    pred = Timeline(1)  # the predecessor stage's timeline (a cpu stage before the segment)
    gpu.timelines[pred.addr] = pred
    for s in range(slots):
        loop.armed[s] = arm(loop, gpu, s, Runner(gpu), 1 + s, slots, pred)
    total = rng.randrange(30, 80)
    failed_at = rng.randrange(5, total) if rng.random() < 0.5 else None
    submitted = 0

    def complete_pred() -> None:
        f = pred.value + 1
        if f == failed_at:
            pred.failure = 3  # the cpu stage failed this frame (ERROR)
        else:
            pred.value = f

    for _ in range(3000):  # a random schedule
        r = rng.random()
        if r < 0.2 and submitted < total:
            submitted += 1
            gpu.hostword[0] = submitted  # the host's frame program: a store after the inputs
        elif r < 0.4 and pred.value < submitted and pred.failure is None:
            complete_pred()
        elif r < 0.7:
            st = rng.choice(list(gpu.streams.values()))
            if st.ops:
                gpu.step(st)
        elif r < 0.93:
            for a in loop.armed.values():
                a.pump()
        else:
            loop._quiesce()  # a request to the agent: queued frames pass, then are queued again
        _check(gpu, seed)
    gpu.hostword[0] = total  # then every frame submitted, and run to the end
    while pred.failure is None and pred.value < total:
        complete_pred()
    for _ in range(10_000):
        moved = False
        for a in loop.armed.values():
            a.pump()
        for st in gpu.streams.values():
            while st.ops and gpu.step(st):
                moved = True
        if not moved:
            break
    _check(gpu, seed)
    for s, a in loop.armed.items():
        mine = list(range(1 + s, total + 1, slots))
        good = [f for f in mine if failed_at is None or f < failed_at]
        assert a._done() == (good[-1] if good else a.start - a.step), (seed, s, a._done(), good)
        if len(good) < len(mine):
            assert a.signal.failure == 3, (seed, s)
        else:
            assert a.signal.failure is None, (seed, s)
    ran = [q for q, _seen, g in gpu.replays if g == 0]
    assert len(ran) == len(set(ran)), "a frame ran twice with its gate open"
    assert sorted(ran) == sorted(f for f in range(1, total + 1) if failed_at is None or f < failed_at)


def test_a_counter_not_set_back_after_a_pass_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model sees the bug it is for: with ``requeue`` leaving the counter where the passed
    frames left it, some schedule runs a replay as another frame."""

    def requeue_without_reset(self: Armed) -> None:
        if self.signal.failure is None:
            self.next = self._done() + self.step

    monkeypatch.setattr(Armed, "requeue", requeue_without_reset)
    caught = 0
    for seed in range(40):
        try:
            test_each_replay_runs_the_frame_it_was_queued_for(seed)
        except AssertionError:
            caught += 1
    assert caught > 0
