"""The GPU command processor (GPU tests: run on the GPU machine, skipped elsewhere with the reason).

Execution of built-in kernels by the resident kernel, direct chains GPU ->
GPU and GPU -> CPU agent, failure passing, a bad packet failing alone, STOP,
and a killed host process (its stage fails OWNER_DIED; a new processor serves).
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import numpy as np
import pytest

import hostless as hl
from hostless import agents
from hostless.buffer import bytes_buffer
from hostless.graph import Graph
from hostless.status import Status
from hostless.wire import Kernargs, Packet, PacketType

cuda = pytest.importorskip("hostless.cuda")
_why = cuda.available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_why is not None, reason=f"no usable GPU: {_why}")]


@pytest.fixture
def dom():
    name = f"hlcp-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(name, heap="64M", device_heaps={"cuda:0": 64 << 20})
    yield d
    d.close()
    hl.Domain.unlink(name)


def _chain(dom, ag, n=64):
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((n, n)) / np.sqrt(n)).astype("f4")
    g = Graph(dom).input("x", (n, n), "f4").constant("w", w)
    g.stage("norm", ag, "normalize", ["x"], ("a", (n, n), "f4"), scalars=[0.5, 2.0])
    g.stage("mm", ag, "gemm", ["a", "w"], ("b", (n, n), "f4"))
    g.stage("act", ag, "relu", ["b"], ("c", (n, n), "f4"))
    g.stage("sm", ag, "softmax", ["c"], ("y", (n, n), "f4"))

    def ref(x):
        c = np.maximum(((x - 0.5) / 2.0) @ w, 0)
        e = np.exp(c - c.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return g, ref


@pytest.mark.parametrize("dispatch", ["direct", "host"])
@pytest.mark.parametrize("data", ["shared", "copy"])
def test_chain_runs_on_the_command_processor(dom, dispatch, data):
    cp = agents.spawn(dom, "gpucp", device=0)
    try:
        g, ref = _chain(dom, cp)
        x = np.random.default_rng(0).standard_normal((64, 64)).astype("f4")
        with g.compile(dispatch=dispatch, data=data) as cg:
            for _ in range(5):
                out = cg.run({"x": x}, timeout=60)["y"]
                assert np.allclose(out, ref(x), rtol=1e-4, atol=1e-5)
    finally:
        cp.stop()


def test_gpu_to_cpu_agent_direct(dom):
    cp = agents.spawn(dom, "gpucp", device=0)
    cpu = agents.spawn(dom, "cpu")
    try:
        x = np.linspace(-2, 2, 256, dtype="f4").reshape(16, 16)
        g = Graph(dom).input("x", (16, 16), "f4")
        g.stage("g", cp, "relu", ["x"], ("h", (16, 16), "f4"))
        g.stage("c", cpu, "scale", ["h"], ("h2", (16, 16), "f4"), scalars=[3.0])
        g.stage("g2", cp, "add", ["h2", "h"], ("y", (16, 16), "f4"))
        with g.compile(dispatch="direct", data="shared") as cg:
            for _ in range(3):
                assert np.allclose(cg.run({"x": x}, timeout=60)["y"], 4 * np.maximum(x, 0))
    finally:
        cp.stop()
        cpu.stop()


def test_bad_packet_fails_alone_and_failure_passes_through(dom):
    cp = agents.spawn(dom, "gpucp", device=0)
    try:
        # an unknown kernel id: the packet's fence fails with ERROR, the processor goes on
        x = dom.buffer((4,), "f4")
        y = dom.buffer((4,), "f4")
        args = bytes_buffer(dom, Kernargs(buffers=[x.handle, y.handle]).encode())
        f = dom.fence()
        cp.queue.push(Packet(type=PacketType.KERNEL, kernel=999, args=args.handle, signal=f.handle))
        assert f.wait(timeout=30) == Status.ERROR
        # an input that failed: the stage does not run, its fence carries the input's status
        bad = dom.fence()
        bad.signal(Status.CANCEL)
        f2 = dom.fence()
        y.numpy()[...] = 7
        cp.queue.push(
            Packet(type=PacketType.KERNEL, kernel=4, args=args.handle, signal=f2.handle, wait=(bad.handle, 0))
        )
        assert f2.wait(timeout=30) == Status.CANCEL
        assert (y.numpy() == 7).all()  # nothing ran
        # and it still serves
        x.numpy()[...] = [-1, 2, -3, 4]
        f3 = dom.fence()
        cp.queue.push(Packet(type=PacketType.KERNEL, kernel=4, args=args.handle, signal=f3.handle))
        assert f3.wait(timeout=30) == Status.SUCCESS
        assert list(y.numpy()) == [0, 2, 0, 4]
    finally:
        cp.stop()


def test_stop_packet_ends_the_processor(dom):
    cp = agents.spawn(dom, "gpucp", device=0)
    cp.stop()
    assert cp.proc.wait(30) == 0


def test_killed_host_process_fails_its_stage_and_a_new_one_serves(dom):
    cp = agents.spawn(dom, "gpucp", device=0)
    x = dom.buffer((4,), "f4")
    y = dom.buffer((4,), "f4")
    args = bytes_buffer(dom, Kernargs(buffers=[x.handle, y.handle]).encode())
    never = dom.fence()
    t = dom.timeline(owner=cp.id)
    cp.queue.push(
        Packet(type=PacketType.KERNEL, kernel=4, args=args.handle, signal=t.handle, signal_value=1,
               wait=(never.handle, 0))
    )
    time.sleep(0.5)  # the GPU waits on `never`
    os.kill(cp.proc.pid, signal.SIGKILL)
    cp.proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and t.failure is None:
        dom.reap()
        time.sleep(0.05)
    assert t.failure == Status.OWNER_DIED
    cp2 = agents.spawn(dom, "gpucp", device=0)
    try:
        x.numpy()[...] = [1, -1, 1, -1]
        f = dom.fence()
        cp2.queue.push(Packet(type=PacketType.KERNEL, kernel=4, args=args.handle, signal=f.handle))
        assert f.wait(timeout=30) == Status.SUCCESS
        assert list(y.numpy()) == [1, 0, 1, 0]
    finally:
        cp2.stop()
        never.signal()
