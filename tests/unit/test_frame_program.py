"""Frame programs (core/frame.c, binding/frame.c): the host's per-frame path in C.

A frame program is validated once (every handle held and of its op's kind,
every store inside its buffer, copies between buffers of one size) and run
per frame in one call: a tampered prepared frame is refused with an error
that names the op; a frame submitted after an agent died fails with the
stage's recorded OWNER_DIED; Ctrl-C (a signal handler that raises) ends a
frame's wait; the ops do what they say (the pushed packet carries the frame
number in its value words, stores, copies, waits and their failures).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import hostless as hl
from conftest import SLACK, thread_in_futex, wait_asleep, waiter_count
from hostless import _core, agents
from hostless.errors import InvalidHandle
from hostless.graph import Graph, StageFailed
from hostless.status import Status
from hostless.wire import FrameOps, Packet

S = Status
NO_TIMEOUT = -1


@pytest.fixture(scope="module")
def dom() -> Iterator[hl.Domain]:
    name = f"hltest-frame-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with hl.Domain.create(name, heap="16M", label="host", unlink_on_close=True) as d:
        yield d
        d.reap()
        assert d.check() == []


def build(dom: hl.Domain, ops: FrameOps, slice_s: float = 0.05) -> Any:
    return ops.build(dom._core, slice_s)


# ------------------------------------------------------------------ the ops


def test_store_push_copy_wait_do_what_they_say(dom: hl.Domain) -> None:
    block = dom.buffer((4,), np.uint64)
    src = dom.buffer((16,), np.float32)
    dst = dom.buffer((16,), np.float32)
    tl = dom.timeline()
    q = dom.queue(4)
    try:
        src.numpy()[:] = np.arange(16, dtype=np.float32)
        ops = FrameOps()
        ops.store(block.handle, 8)
        ops.copy(dst.handle, src.handle)
        ops.push(q.handle, Packet(kernel=7, args=block.handle, signal=tl.handle, wait=(tl.handle, 0)))
        ops.wait(tl.handle, [tl.handle], tag="t")
        prog = build(dom, ops)
        assert prog.nops == 4
        tl.signal(41)  # the wait is for 41: reached already
        assert prog.run(41, NO_TIMEOUT) is None
        assert list(block.numpy()) == [0, 41, 0, 0]
        np.testing.assert_array_equal(dst.numpy(), src.numpy())
        q.bind()
        r = q.pop(timeout=1)
        assert r is not None
        p = r[1]
        # the value words carry the frame number; the handles and the rest are as prepared
        assert (p.kernel, p.args, p.signal, p.signal_value) == (7, block.handle, tl.handle, 41)
        assert p.wait == (tl.handle, 0) and p.wait_value == (41, 0)
        # a wait that times out reports the op (whole slices: at least one)
        t0 = time.monotonic()
        assert prog.run(43, 0) == (3, "timeout", 41)
        assert 0.04 < time.monotonic() - t0 < 2
        # a failed timeline stops the wait at once, with its word
        tl.fail(S.ERROR)
        stop = prog.run(44, NO_TIMEOUT)
        assert stop is not None and stop[:2] == (3, "failed")
        assert stop[2] == int(_core.TIMELINE_FAILED) | int(S.ERROR)
    finally:
        for o in (block, src, dst, tl, q):
            o.release()


def test_a_watched_failure_ends_a_wait_after_a_slice(dom: hl.Domain) -> None:
    waited, watched = dom.timeline(), dom.timeline()
    try:
        ops = FrameOps()
        ops.wait(waited.handle, [watched.handle])
        prog = build(dom, ops, slice_s=0.02)
        main = (os.getpid(), threading.get_native_id())

        def fail_when_asleep() -> None:  # once this thread sleeps in the program's wait
            wait_asleep(dom, waited, 1, [main])
            watched.fail(S.CANCEL)

        th = threading.Thread(target=fail_when_asleep)
        th.start()
        t0 = time.monotonic()
        stop = prog.run(1, int(10e9))
        th.join()
        assert stop == (0, "watch", int(_core.TIMELINE_FAILED) | int(S.CANCEL), 0)
        # after a 0.02 s slice, not at the 10 s timeout (bound: the suite's slack)
        assert time.monotonic() - t0 < 0.02 + SLACK
    finally:
        waited.release()
        watched.release()


# ------------------------------------------------------- a tampered program


def test_a_store_outside_its_buffer_is_refused(dom: hl.Domain) -> None:
    b = dom.buffer((8,), np.uint8)
    try:
        for off in (8, 1 << 40, 2**64 - 8, 4):  # past the end, far outside the mapping, wrapping, unaligned
            ops = FrameOps()
            ops.store(b.handle, 0)
            ops.store(b.handle, off)
            with pytest.raises(IndexError, match=r"frame program op 1 \(store\): .*lies outside the buffer"):
                build(dom, ops)
    finally:
        b.release()


def test_wrong_kinds_and_stale_handles_are_refused(dom: hl.Domain) -> None:
    b = dom.buffer((64,), np.uint8)
    small = dom.buffer((32,), np.uint8)
    tl = dom.timeline()
    q = dom.queue(4)
    gone = dom.buffer((8,), np.uint8)
    gone_h = gone.handle
    gone.release()
    h = "0x[0-9a-f]+"
    IH = InvalidHandle
    cases: list[tuple[Any, type[Exception], str]] = [
        (lambda o: o.push(b.handle, Packet()), IH, rf"op 0 \(push\): queue {h} is a buffer, not a queue"),
        (lambda o: o.push(tl.handle, Packet()), InvalidHandle, r"is a timeline, not a queue"),
        (lambda o: o.store(q.handle, 0), IH, rf"op 0 \(store\): buffer {h} is a queue, not a buffer"),
        (lambda o: o.wait(q.handle), InvalidHandle, rf"op 0 \(wait\): timeline {h} is a queue"),
        (lambda o: o.wait(tl.handle, [b.handle]), InvalidHandle, r"watch entry 0: timeline .* is a buffer"),
        (lambda o: o.copy(b.handle, small.handle), ValueError, r"op 0 \(copy\): size mismatch \(32 -> 64"),
        (lambda o: o.store(gone_h, 0), InvalidHandle, rf"op 0 \(store\): buffer {h}: "),
        (lambda o: o.store(b.handle ^ (1 << 30), 0), InvalidHandle, r"op 0 \(store\)"),  # another generation
    ]
    try:
        for add, exc, msg in cases:
            ops = FrameOps()
            add(ops)
            with pytest.raises(exc, match=msg):
                build(dom, ops)
        # raw tuples: a mask that names a handle word, an unknown op, a short op
        pk = Packet().encode()
        for raw, msg in [
            ((int(_core.FOP_PUSH), q.handle, pk, 1 << 2), r"mask 0x4 names packet words other than"),
            ((99, b.handle, 0), r"unknown op type 99"),
            ((int(_core.FOP_STORE), b.handle), r"expected \(FOP_STORE"),
            ((int(_core.FOP_PUSH), q.handle, b"short", 0), r"a packet is 64 bytes"),
        ]:
            with pytest.raises(ValueError, match=msg):
                _core.FrameProgram(dom._core, [raw], [], 0)
    finally:
        for o in (b, small, tl, q):
            o.release()


def test_a_buffer_released_after_the_check_fails_the_run(dom: hl.Domain) -> None:
    b = dom.buffer((8,), np.uint64)
    ops = FrameOps()
    ops.store(b.handle, 0)
    prog = build(dom, ops)
    assert prog.run(5, NO_TIMEOUT) is None and b.numpy()[0] == 5
    b.release()
    with pytest.raises(InvalidHandle, match=r"op 0 \(store\): buffer 0x[0-9a-f]+ is no longer held"):
        prog.run(6, NO_TIMEOUT)
    with pytest.raises(ValueError, match="frame number"):
        build(dom, FrameOps()).run(0, NO_TIMEOUT)


# ------------------------------------------- the outputs, made while the frame runs


def _wait_program(dom: hl.Domain, tl: Any, out: Any, empty_like: Any) -> Any:
    """A program that waits for ``tl``, its one output ``y`` in ``out`` (bind_io, with the
    given maker of the outputs' arrays)."""
    ops = FrameOps()
    ops.wait(tl.handle, [tl.handle], tag="t")
    prog = build(dom, ops)
    prog.bind_io([], [("y", out.numpy(), out.handle)], [], np.ndarray, empty_like)
    return prog


def _finish_later(tl: Any, out: Any, frame: int, data: np.ndarray, when: threading.Event) -> threading.Thread:
    """A thread that, once ``when`` is set, writes ``data`` into ``out`` and signals ``tl`` to
    ``frame``: the frame's producer."""

    def run() -> None:
        when.wait(10)
        out.numpy()[:] = data
        tl.signal(frame)

    th = threading.Thread(target=run)
    th.start()
    return th


def test_the_outputs_arrays_are_made_while_the_frame_runs(dom: hl.Domain) -> None:
    tl, out = dom.timeline(), dom.buffer((16,), np.float32)
    made: list[int] = []
    called = threading.Event()

    def empty_like(view: np.ndarray) -> np.ndarray:
        made.append(tl.value)  # the frame's producer waits for this call: not done yet
        called.set()
        return np.empty_like(view)

    try:
        prog = _wait_program(dom, tl, out, empty_like)
        data = np.arange(16, dtype=np.float32)
        th = _finish_later(tl, out, 3, data, called)
        r = prog.frame(None, 3, 10.0)
        th.join()
        assert made == [0]  # once, before the frame was done
        assert isinstance(r, dict) and list(r) == ["y"]
        np.testing.assert_array_equal(r["y"], data)
        assert r["y"].flags.owndata and r["y"].flags.writeable  # a copy of its own, as view.copy()
        out.numpy()[:] = -1
        np.testing.assert_array_equal(r["y"], data)  # not a view of the buffer
    finally:
        tl.release()
        out.release()


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda v: (_ for _ in ()).throw(MemoryError("no room")), id="raises"),
        pytest.param(lambda v: np.empty(v.size + 1, v.dtype), id="wrong-size"),
        pytest.param(lambda v: np.empty(2 * v.size, v.dtype)[::2], id="strided"),
        pytest.param(lambda v: np.frombuffer(bytes(v.nbytes), v.dtype), id="read-only"),
        pytest.param(lambda v: "not an array", id="no-buffer"),
    ],
)
def test_an_output_array_not_made_falls_back_to_a_copy_after_the_frame(dom: hl.Domain, bad: Any) -> None:
    """A maker that fails or makes an array that does not fit leaves no error behind: the
    frame is in flight; its outputs are copied after it as before."""
    tl, out = dom.timeline(), dom.buffer((16,), np.float32)
    called = threading.Event()

    def maker(view: np.ndarray) -> Any:
        called.set()
        return bad(view)

    try:
        prog = _wait_program(dom, tl, out, maker)
        data = np.arange(16, dtype=np.float32) + 1
        th = _finish_later(tl, out, 1, data, called)
        r = prog.frame(None, 1, 10.0)
        th.join()
        assert called.is_set()
        np.testing.assert_array_equal(r["y"], data)
        assert r["y"].flags.owndata and r["y"].flags.writeable
    finally:
        tl.release()
        out.release()


def test_an_interrupt_in_the_output_maker_is_raised_once_the_frame_is_done(dom: hl.Domain) -> None:
    """A KeyboardInterrupt raised while the outputs' arrays are made (a signal handler that
    ran in the maker's Python code) is not swallowed with the maker's other failures: the
    frame runs to its end, then the interrupt is raised."""
    tl, out = dom.timeline(), dom.buffer((16,), np.float32)
    called = threading.Event()

    def maker(view: np.ndarray) -> np.ndarray:
        called.set()
        raise KeyboardInterrupt

    try:
        prog = _wait_program(dom, tl, out, maker)
        th = _finish_later(tl, out, 4, np.zeros(16, np.float32), called)
        with pytest.raises(KeyboardInterrupt):
            prog.frame(None, 4, 10.0)
        th.join()
        assert tl.value == 4  # the frame was waited for to its end first
    finally:
        tl.release()
        out.release()


def test_an_output_buffer_released_while_the_frame_ran_is_not_read(dom: hl.Domain) -> None:
    """The output buffer is checked (still held, same generation) before its bytes are
    copied: one released meanwhile (here by the maker itself) is InvalidHandle, not
    whatever the heap holds there now."""
    tl, out = dom.timeline(), dom.buffer((16,), np.float32)
    h = out.handle
    called = threading.Event()
    try:

        def empty_like(view: np.ndarray) -> np.ndarray:
            out.release()
            called.set()
            return np.empty_like(view)

        prog = _wait_program(dom, tl, out, empty_like)
        th = threading.Thread(target=lambda: called.wait(10) and tl.signal(1))
        th.start()
        with pytest.raises(InvalidHandle, match=f"{h:#x}"):
            prog.frame(None, 1, 10.0)
        th.join()
    finally:
        tl.release()


def test_no_output_array_is_made_ahead_for_a_frame_already_done(dom: hl.Domain) -> None:
    """Where the wait finds the frame done there is nothing to overlap: no call back (its
    relock would only add to the host's work); the outputs are copied as before."""
    tl, out = dom.timeline(), dom.buffer((16,), np.float32)
    made: list[int] = []
    try:
        prog = _wait_program(dom, tl, out, lambda v: made.append(1) or np.empty_like(v))
        out.numpy()[:] = 7
        tl.signal(2)
        r = prog.frame(None, 2, 10.0)
        assert made == []
        np.testing.assert_array_equal(r["y"], np.full(16, 7, np.float32))
    finally:
        tl.release()
        out.release()


def test_a_domain_closed_by_the_output_maker_ends_the_frame(make_name: Any) -> None:
    """What the maker runs may close the domain (a finalizer, a signal handler): the frame
    ends with DomainClosed at once, instead of leave() waiting for this busy thread."""
    d = hl.Domain.create(make_name(), heap="1M")
    tl, out = d.timeline(), d.buffer((16,), np.float32)

    def empty_like(view: np.ndarray) -> np.ndarray:
        d.close()
        return np.empty_like(view)

    prog = _wait_program(d, tl, out, empty_like)
    got: list[BaseException] = []

    def run() -> None:
        try:
            prog.frame(None, 1, 10.0)
        except BaseException as e:
            got.append(e)

    th = threading.Thread(target=run, daemon=True)  # (a hang stays in it: the test fails)
    th.start()
    th.join(10)
    assert not th.is_alive(), "close() from inside the frame's hook waited for the frame"
    assert len(got) == 1 and isinstance(got[0], hl.DomainClosed), got
    assert d.closed


def test_a_push_into_a_full_queue_waits_with_the_lock_given_away(dom: hl.Domain) -> None:
    """A frame keeps the GIL until an op must block: its push into a full queue is tried
    once locked, then waited for unlocked, so a thread of this process can free a cell
    (with the lock kept, the consumer below could never run)."""
    q = dom.queue(2)
    tl = dom.timeline()
    try:
        q.bind()
        for _ in range(2):
            q.push(Packet(kernel=1))
        ops = FrameOps()
        ops.push(q.handle, Packet(kernel=9, signal=tl.handle))
        prog = build(dom, ops)
        popped: list[int] = []

        def consumer() -> None:
            time.sleep(0.05)  # the frame is blocked on the full queue by now
            r = q.pop(timeout=5)
            popped.append(r[1].kernel if r else -1)

        th = threading.Thread(target=consumer)
        th.start()
        t0 = time.monotonic()
        assert prog.run(1, 5_000_000_000) is None
        waited = time.monotonic() - t0
        th.join(10)
        assert popped == [1] and 0.04 <= waited < 2  # (a locked try that waited: the whole 5 s)
        kinds = [q.pop(timeout=1)[1].kernel for _ in range(2)]  # type: ignore[index]
        assert kinds == [1, 9]  # the frame's packet went in once a cell was free
    finally:
        tl.release()
        q.release()


# ------------------------------------------------------------------ graphs


@pytest.fixture(scope="module")
def agent(dom: hl.Domain) -> Iterator[agents.Agent]:
    a = agents.spawn(dom, "cpu", label="cpu")
    try:
        yield a
        a.stop()
    finally:
        a.kill()


def chain(dom: hl.Domain, a: agents.Agent, b: agents.Agent) -> Graph:
    g = Graph(dom).input("x", (16,), np.float32)
    g.stage("first", a, "scale", ["x"], ("y", (16,), np.float32), scalars=[2.0])
    g.stage("second", b, "relu", ["y"], ("z", (16,), np.float32))
    return g


def test_a_tampered_prepared_frame_is_refused(dom: hl.Domain, agent: agents.Agent) -> None:
    with chain(dom, agent, agent).compile(dispatch="direct", data="shared") as cg:
        x = np.linspace(-1, 1, 16, dtype=np.float32)
        np.testing.assert_array_equal(cg.run({"x": x})["z"], np.maximum(2 * x, 0))
        sl = cg.slots[0]
        assert sl.stores, "direct dispatch patches the follow-up's signal value per frame"
        h, off = sl.stores[0]
        sl.stores[0] = (h, off + (1 << 32))  # an address far outside the argument block and the mapping
        with pytest.raises(IndexError, match=r"op 0 \(store\): a store at byte \d+ of buffer .* outside"):
            cg._build_programs(sl)
        sl.stores[0] = (h, off)
        cg._build_programs(sl)
        np.testing.assert_array_equal(cg.run({"x": x})["z"], np.maximum(2 * x, 0))


@pytest.mark.parametrize("dispatch", ["host", "direct"])
def test_a_frame_after_an_agent_died_fails_with_owner_died(
    dom: hl.Domain, agent: agents.Agent, dispatch: str
) -> None:
    victim = agents.spawn(dom, "cpu", label="victim")
    try:
        with chain(dom, agent, victim).compile(dispatch=dispatch, data="copy") as cg:
            x = np.linspace(-1, 1, 16, dtype=np.float32)
            np.testing.assert_array_equal(cg.run({"x": x})["z"], np.maximum(2 * x, 0))
            victim.kill()
            tl = cg.timelines[1]
            deadline = time.monotonic() + 10
            while tl.failure is None and time.monotonic() < deadline:  # recovery by the watchdog
                time.sleep(0.01)
            assert tl.failure is S.OWNER_DIED
            for _ in range(2):  # submitted after the death: the recorded status, at once, every time
                t0 = time.monotonic()
                with pytest.raises(StageFailed, match="stage 'second' failed with OWNER_DIED") as ei:
                    cg.run({"x": x}, timeout=10)
                assert (ei.value.stage, ei.value.status) == ("second", S.OWNER_DIED)
                assert time.monotonic() - t0 < 2
            with pytest.raises(StageFailed) as ei:
                list(cg.stream([{"x": x}] * 3, timeout=10))
            assert (ei.value.stage, ei.value.status) == ("second", S.OWNER_DIED)
    finally:
        victim.kill()
        if victim.queue._held:
            victim.queue.release()


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("dispatch", ["host", "direct"])
def test_a_signal_handler_ends_a_frame_wait(dom: hl.Domain, agent: agents.Agent, dispatch: str) -> None:
    """The host blocked in a frame's wait (its agent stopped) gets a signal whose handler
    raises: the exception comes out of run() within a few ms."""
    with chain(dom, agent, agent).compile(dispatch=dispatch, data="shared") as cg:
        x = np.ones(16, np.float32)
        cg.run({"x": x})

        def handler(signum: int, frame: Any) -> None:
            raise Interrupted

        old = signal.signal(signal.SIGUSR1, handler)
        sent: list[float] = []
        main = (os.getpid(), threading.get_native_id())
        stop = threading.Event()

        def send() -> None:  # once the main thread sleeps in the frame's wait on a timeline
            while not stop.is_set():
                if any(waiter_count(dom, t) for t in cg.timelines) and thread_in_futex(*main):
                    sent.append(time.monotonic())
                    os.kill(os.getpid(), signal.SIGUSR1)
                    return
                time.sleep(0.001)

        os.kill(agent.proc.pid, signal.SIGSTOP)
        sender = threading.Thread(target=send)
        try:
            sender.start()
            with pytest.raises(Interrupted):
                cg.run({"x": x}, timeout=20)
            # within a few ms; without the interrupt hook only at the 20 s timeout (the
            # suite's slack, SLACK, as the bound)
            assert time.monotonic() - sent[0] < SLACK
        finally:
            stop.set()
            sender.join()
            os.kill(agent.proc.pid, signal.SIGCONT)
            signal.signal(signal.SIGUSR1, old)
        # the interrupted frame completes what was launched (host: the first stage only,
        # the host launches the next one after its wait); the timelines go on
        assert cg.timelines[0 if dispatch == "host" else 1].wait(cg.frame, 10) is S.SUCCESS
        np.testing.assert_array_equal(cg.run({"x": x})["z"], 2 * x)


def test_a_slow_frame_times_out(dom: hl.Domain, agent: agents.Agent) -> None:
    with chain(dom, agent, agent).compile(dispatch="direct", data="shared") as cg:
        x = np.ones(16, np.float32)
        cg.run({"x": x})
        os.kill(agent.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(TimeoutError, match=rf"timeline 0x[0-9a-f]+ did not reach {cg.frame + 1} "):
                cg.run({"x": x}, timeout=0.1)
            assert 0.09 < time.monotonic() - t0 < 3
        finally:
            os.kill(agent.proc.pid, signal.SIGCONT)
        assert cg.timelines[1].wait(cg.frame, 10) is S.SUCCESS
