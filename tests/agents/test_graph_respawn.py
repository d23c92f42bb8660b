"""A respawned agent and the graphs and packets of the agent it replaces (issue 21, item 4).

Before: killing the middle agent of a 3-stage direct-dispatch graph, respawning
it on its queue (``spawn(queue=old.queue)``, as the docs allow) and calling
``run()`` again on the same compiled graph returned frames with wrong data
and no exception (7 runs of 27), because the packets left in the dead agent's
queue ran on the new one against argument blocks the host had re-patched for
later frames.  Now:

* a replacement never runs a packet queued for the agent it replaces: every
  packet below the write index its bind found fails unrun, its signal and its
  follow-ups' with OWNER_DIED (a STOP does not stop it); a packet pushed
  after the takeover runs, and a producer pushing during the respawn never
  loses one silently (each fails with OWNER_DIED or runs);
* a compiled graph notices that an agent it was built on died or was
  replaced, raises :class:`GraphInvalidated` on that frame and every later
  one, never returning a frame, until compiled again.

Each for the default agent (the engine's C loop in a Python worker) and the
``hostless-agent`` executable where it is installed (the Python agent loop they
once also ran against is gone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import hostless as hl
from hostless import agents
from hostless.graph import Graph, GraphInvalidated, StageFailed
from hostless.kernels import kernel_id
from hostless.status import Status as S

NATIVE = [None, "exe"]  # the default agent, hostless-agent


def _until(pred: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.002)
    return bool(pred())


def _spawn(dom: hl.Domain, native: str | None, **kw: Any) -> agents.Agent:
    if native == "exe":
        try:
            agents.executable_path()
        except FileNotFoundError as e:
            pytest.skip(f"hostless-agent is not installed: {e}")
    return agents.spawn(dom, "cpu", native=native, wait_timeout=None, **kw)


@pytest.fixture
def dom(domain_name: str) -> Iterator[hl.Domain]:
    d = hl.Domain.create(domain_name, fences=4096, participants=32, heap=32 << 20, device_heaps={})
    try:
        yield d
    finally:
        d.close()


def _recovered(dom: hl.Domain, victim: agents.Agent) -> None:
    victim.kill()
    dom.reap()
    assert _until(lambda: all(p.id != victim.id for p in dom.participants)), "the victim was never recovered"


def _block(dom: hl.Domain, a: agents.Agent) -> hl.Fence:
    """Make ``a`` pop a barrier that waits on a fence nobody signals: everything pushed after
    it stays queued.  Returns the gate fence."""
    gate = dom.fence()
    a.queue.push(hl.Packet(type=hl.PacketType.BARRIER, wait=(gate.handle, 0)), timeout=5)
    assert _until(lambda: a.queue.info()["read_index"] >= 1), "the agent never took the barrier"
    return gate


# --------------------------------------------------------------------------- the queue


@pytest.mark.parametrize("native", NATIVE, ids=["default", "exe"])
def test_replacement_never_runs_a_packet_left_by_the_dead_agent(dom: hl.Domain, native: str | None) -> None:
    """Packets queued behind a killed agent's current one (and one pushed after its death,
    and a STOP) fail unrun on its replacement, with OWNER_DIED, their follow-ups' signals
    too; a packet pushed after the respawn runs.  Every fence here is owned by the test,
    so only an agent signals them (recovery of the victim does not)."""
    keep: list[Any] = []
    victim = _spawn(dom, native, label="victim")
    other = _spawn(dom, native, label="other")
    respawned: agents.Agent | None = None
    try:
        x = dom.buffer((8,), np.float32)
        x.numpy()[:] = np.arange(1, 9, dtype=np.float32)
        outs = [dom.buffer((8,), np.float32) for _ in range(4)]
        for o in outs:
            o.numpy()[:] = -7.0  # relu of x never writes -7: a sentinel that shows a run
        keep += [x, *outs]

        def relu(o: hl.Buffer, follow: list[hl.Follow] | None = None) -> hl.Buffer:
            ka = hl.Kernargs(buffers=[x.handle, o.handle], follow=follow or []).to_buffer(dom)
            keep.append(ka)
            return ka

        gate = _block(dom, victim)
        keep.append(gate)
        stale = [dom.fence() for _ in range(4)]
        keep.extend(stale)
        # a follow-up into another agent's queue, which must not be pushed either
        inner = relu(outs[3])
        fol = hl.Follow(other.queue.handle, hl.Packet(kernel=kernel_id("relu"), args=inner.handle,
                                                      signal=stale[3].handle))
        victim.queue.push(hl.Packet(kernel=kernel_id("relu"), args=relu(outs[0]).handle,
                                    signal=stale[0].handle), timeout=5)
        victim.queue.push(hl.Packet(kernel=kernel_id("relu"), args=relu(outs[1], [fol]).handle,
                                    signal=stale[1].handle), timeout=5)
        victim.queue.push(hl.Packet(type=hl.PacketType.STOP), timeout=5)
        _recovered(dom, victim)
        # pushed into the dead agent's queue before the respawn: queued for it too
        victim.queue.push(hl.Packet(kernel=kernel_id("relu"), args=relu(outs[2]).handle,
                                    signal=stale[2].handle), timeout=5)

        respawned = _spawn(dom, native, queue=victim.queue, label="respawned")
        for f in stale:
            assert f.wait(10) is S.OWNER_DIED, "a packet left for the dead agent ran on its replacement"
        for o in outs:
            np.testing.assert_array_equal(o.numpy(), np.full(8, -7.0, np.float32))

        # the STOP was not obeyed, and a packet pushed now runs
        fresh, o = dom.fence(), dom.buffer((8,), np.float32)
        keep += [fresh, o]
        respawned.queue.push(hl.Packet(kernel=kernel_id("relu"), args=relu(o).handle, signal=fresh.handle),
                             timeout=5)
        assert fresh.wait(10) is S.SUCCESS
        np.testing.assert_array_equal(o.numpy(), x.numpy())
        assert respawned.alive
        gate.signal()
    finally:
        for k in keep:
            if hl.lowlevel.is_held(k):
                k.release()
        victim.kill()
        other.stop()
        if respawned is not None:
            respawned.stop()
    assert respawned is not None and respawned.proc.returncode == 0
    dom.reap()
    assert dom.check() == []


def test_a_producer_pushing_during_the_respawn_loses_nothing(dom: hl.Domain) -> None:
    """A producer that keeps pushing while the dead agent is replaced: each packet either
    fails with OWNER_DIED (queued for the dead one: below the takeover's index) or runs
    (above it), in that order by queue index, and none is left pending."""
    victim = _spawn(dom, None, capacity=4096, label="victim")
    respawned: agents.Agent | None = None
    pushed: list[tuple[int, hl.Fence]] = []
    x, o = dom.buffer((4,), np.float32), dom.buffer((4,), np.float32)
    x.numpy()[:] = 1.0
    ka = hl.Kernargs(buffers=[x.handle, o.handle]).to_buffer(dom)
    spawned = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            after = 0
            while after < 50:  # until 50 pushes after spawn() returned
                if spawned.is_set():
                    after += 1
                f = dom.fence()
                try:
                    i = victim.queue.push(
                        hl.Packet(kernel=kernel_id("relu"), args=ka.handle, signal=f.handle), timeout=5
                    )
                except hl.HostlessError:
                    f.release()
                    raise
                pushed.append((i, f))
                time.sleep(0.0005)  # pacing only (the 2-core machine): no assertion depends on it
        except BaseException as e:
            errors.append(e)

    try:
        gate = _block(dom, victim)
        _recovered(dom, victim)
        f0 = dom.fence()  # queued for the dead agent for sure: it must fail, not run
        pushed.append((victim.queue.push(hl.Packet(kernel=kernel_id("relu"), args=ka.handle,
                                                   signal=f0.handle), timeout=5), f0))
        t = threading.Thread(target=produce)
        t.start()
        try:
            respawned = _spawn(dom, None, queue=victim.queue, label="respawned")
        finally:
            spawned.set()
            t.join(60)
        assert not errors, errors
        statuses = [(i, f.wait(10)) for i, f in sorted(pushed, key=lambda p: p[0])]
        kinds = [st for _, st in statuses]
        assert set(kinds) <= {S.OWNER_DIED, S.SUCCESS}, kinds  # none left pending, none ERROR
        assert kinds[0] is S.OWNER_DIED, "the packet pushed after the death ran on the replacement"
        first_ok = kinds.index(S.SUCCESS)
        assert all(st is S.SUCCESS for st in kinds[first_ok:]), "a packet after the takeover failed"
        assert kinds[-50:] == [S.SUCCESS] * 50
        gate.signal()
        gate.release()
    finally:
        for _, f in pushed:
            f.release()
        for b in (x, o, ka):
            b.release()
        victim.kill()
        if respawned is not None:
            respawned.stop()
    dom.reap()
    assert dom.check() == []


# --------------------------------------------------------------------------- the graph

N = 64  # elements per frame


def _frame(k: int) -> dict[str, np.ndarray]:
    return {"x": np.full(N, float(k), np.float32)}


def _expect(k: int) -> np.ndarray:
    return np.full(N, float(k) * 6.0, np.float32)  # (x*2)*3 through the middle relu


def _graph(dom: hl.Domain, a: agents.Agent, b: agents.Agent, c: agents.Agent) -> Graph:
    g = Graph(dom).input("x", (N,), np.float32)
    g.stage("a", a, "scale", ["x"], ("y", (N,), np.float32), scalars=[2.0])
    g.stage("b", b, "relu", ["y"], ("z", (N,), np.float32))
    g.stage("c", c, "scale", ["z"], ("out", (N,), np.float32), scalars=[3.0])
    return g


def test_graph_after_its_middle_agent_is_respawned(dom: hl.Domain) -> None:
    """Kill the middle agent of a 3-stage direct graph with frames in flight and queued,
    respawn it on its queue, keep running the same compiled graph: every frame returned is
    right, the frame that meets the death and every later run raise GraphInvalidated, and a
    graph compiled again on the respawned agent gives right frames.  Looped: the old code
    returned wrong frames in 7 runs of 27."""
    a = _spawn(dom, None, label="a")
    c = _spawn(dom, None, label="c")
    b = _spawn(dom, None, label="b")
    rounds = 8
    returned = 0
    try:
        for r in range(rounds):
            g = _graph(dom, a, b, c)
            cg = g.compile(dispatch="direct", data="shared", inflight=3)
            k0 = 1000 * (r + 1)
            kill_at = 3 + r % 4
            seen: list[int] = []

            def frames(
                cg_k0: int = k0, at: int = kill_at, victim: agents.Agent = b
            ) -> Iterator[dict[str, Any]]:
                for k in range(40):
                    if k == at:
                        victim.kill()  # frames in flight (inflight=3) and queued behind them
                    yield _frame(cg_k0 + k)

            with pytest.raises(StageFailed) as ei:
                for k, out in enumerate(cg.stream(frames(), timeout=20)):
                    np.testing.assert_array_equal(out["out"], _expect(k0 + k))  # never a wrong frame
                    seen.append(k)
            assert isinstance(ei.value, GraphInvalidated), ei.value
            assert ei.value.stage == "b" and ei.value.status is S.OWNER_DIED
            assert "g.compile()" in str(ei.value)
            returned += len(seen)
            dom.reap()

            b = _spawn(dom, None, queue=b.queue, label=f"b{r}")
            for k in range(5):  # the same compiled graph: never a frame again
                with pytest.raises(GraphInvalidated):
                    cg.run(_frame(k0 + 100 + k), timeout=20)
            with pytest.raises(GraphInvalidated):
                next(iter(cg.stream([_frame(k0 + 200)], timeout=20)))
            cg.close()

            # compiled again on the respawned agent: right frames, in run() and stream()
            with _graph(dom, a, b, c).compile(dispatch="direct", data="shared", inflight=3) as cg2:
                for k in range(4):
                    np.testing.assert_array_equal(cg2.run(_frame(k0 + 300 + k), timeout=20)["out"],
                                                  _expect(k0 + 300 + k))
                outs = list(cg2.stream([_frame(k0 + 400 + k) for k in range(6)], timeout=20))
                for k, out in enumerate(outs):
                    np.testing.assert_array_equal(out["out"], _expect(k0 + 400 + k))
        assert returned > 0  # frames did flow before each kill
    finally:
        for ag in (a, b, c):
            ag.kill() if not ag.alive else ag.stop()
    dom.reap()
    assert dom.check() == []


def test_graph_run_after_respawn_between_frames(dom: hl.Domain) -> None:
    """The issue's own steps with run() only: frames pass, the middle agent is killed while
    a frame is queued behind a blocked packet, respawned on its queue, and run() keeps being
    called: GraphInvalidated every time (the old code returned frames), until recompiled."""
    a = _spawn(dom, None, label="a")
    c = _spawn(dom, None, label="c")
    b = _spawn(dom, None, label="b")
    try:
        g = _graph(dom, a, b, c)
        cg = g.compile(dispatch="direct", data="shared", inflight=2)
        for k in range(3):
            np.testing.assert_array_equal(cg.run(_frame(k), timeout=20)["out"], _expect(k))
        gate = _block(dom, b)  # b holds a barrier: the next frame's packet for b stays queued
        with pytest.raises(TimeoutError):
            cg.run(_frame(10), timeout=0.2)  # b alive, only slow: the graph stays valid
        _recovered(dom, b)
        b2 = _spawn(dom, None, queue=b.queue, label="b2")
        for k in range(11, 20):
            with pytest.raises(GraphInvalidated) as ei:
                cg.run(_frame(k), timeout=20)
            assert ei.value.stage == "b"
        cg.close()
        gate.signal()
        gate.release()
        with _graph(dom, a, b2, c).compile(dispatch="direct", data="shared") as cg2:
            for k in range(30, 36):
                np.testing.assert_array_equal(cg2.run(_frame(k), timeout=20)["out"], _expect(k))
        b = b2
    finally:
        for ag in (a, b, c):
            ag.kill() if not ag.alive else ag.stop()
    dom.reap()
    assert dom.check() == []


def _gpu_why() -> str | None:
    try:
        from hostless import cuda
    except ImportError as e:  # no cuda.bindings
        return str(e)
    return cuda.available()


@pytest.mark.gpu
def test_a_gpucp_replacement_never_runs_a_packet_left_by_the_dead_agent(domain_name: str) -> None:
    """The GPU command processor taking over a dead agent's queue: what was queued for the
    dead one fails unrun with OWNER_DIED (its host process discards it by the loop's rule
    before the resident kernel starts), and a packet pushed after the takeover runs on the
    GPU.  Runs on the GPU machine; skipped elsewhere with the reason."""
    why = _gpu_why()
    if why is not None:
        pytest.skip(f"no usable GPU: {why}")
    d = hl.Domain.create(domain_name, heap="64M", device_heaps={"cuda:0": 64 << 20})
    keep: list[Any] = []
    victim = agents.spawn(d, "cpu", wait_timeout=None, label="victim")
    cp: agents.Agent | None = None
    try:
        x = d.buffer((8,), np.float32)
        x.numpy()[:] = np.arange(-4, 4, dtype=np.float32)
        outs = [d.buffer((8,), np.float32) for _ in range(3)]
        for o in outs:
            o.numpy()[:] = -7.0
        keep += [x, *outs]

        def relu(o: hl.Buffer) -> hl.Buffer:
            ka = hl.Kernargs(buffers=[x.handle, o.handle]).to_buffer(d)
            keep.append(ka)
            return ka

        gate = _block(d, victim)
        keep.append(gate)
        stale = [d.fence() for _ in range(2)]
        keep += stale
        for f, o in zip(stale, outs[:2], strict=True):
            pkt = hl.Packet(kernel=kernel_id("relu"), args=relu(o).handle, signal=f.handle)
            victim.queue.push(pkt, timeout=5)
        victim.queue.push(hl.Packet(type=hl.PacketType.STOP), timeout=5)
        _recovered(d, victim)
        cp = agents.spawn(d, "gpucp", device=0, queue=victim.queue)
        for f in stale:
            assert f.wait(30) is S.OWNER_DIED, "a packet left for the dead agent ran on the GPU processor"
        for o in outs[:2]:
            np.testing.assert_array_equal(o.numpy(), np.full(8, -7.0, np.float32))
        fresh = d.fence()
        keep.append(fresh)
        cp.queue.push(hl.Packet(kernel=kernel_id("relu"), args=relu(outs[2]).handle, signal=fresh.handle),
                      timeout=5)
        assert fresh.wait(30) is S.SUCCESS
        np.testing.assert_array_equal(outs[2].numpy(), np.maximum(x.numpy(), 0))
        assert cp.alive
        gate.signal()
    finally:
        for k in keep:
            if hl.lowlevel.is_held(k):
                k.release()
        victim.kill()
        if cp is not None:
            cp.stop()
        d.close()
