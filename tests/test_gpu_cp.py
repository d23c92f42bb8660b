"""The GPU command processor (GPU tests: run on the GPU machine, skipped elsewhere with the reason).

Execution of built-in kernels by the resident kernel, direct chains GPU ->
GPU and GPU -> CPU agent, follow-ups run in place, the decoded-argument cache
seeing a rewritten block, failure passing (to follow-ups too), a bad packet
failing alone, STOP, a killed host process (its stage fails OWNER_DIED; a new
processor serves), and both isolations (green context, bounded grid).
"""

from __future__ import annotations

import os
import signal
import struct
import time
import uuid

import numpy as np
import pytest

import hostless as hl
from hostless import agents, ert
from hostless.agents import gpucp
from hostless.buffer import bytes_buffer
from hostless.graph import Graph
from hostless.status import Status
from hostless.wire import Follow, Kernargs, Packet, PacketType

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


def _run(ag, args, kernel=4, wait=None, ptype=PacketType.KERNEL):
    """Push one packet (``args``: its argument block) into ``ag``'s queue with a fresh fence as
    its signal (``wait``: (handle, value) of an input); returns the fence's status."""
    f = ag.dom.fence()
    extra = {"wait": wait} if wait else {}
    ag.queue.push(Packet(type=ptype, kernel=kernel, args=args.handle, signal=f.handle, **extra))
    return f.wait(timeout=30)


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
        time.sleep(0.2)  # the counters go out when the queue is idle
        st = gpucp.stats(cp)
        assert st["packets"] >= 20 and st["failed"] == 0
        assert st["hits"] > 0 and st["local"] > 0  # decoded blocks reused; 64x64 jobs run on block 0
        if dispatch == "direct":  # one frame at a time: each follow-up finds the queue empty
            assert st["inplace"] >= 15, st
        else:
            assert st["inplace"] == 0, st
    finally:
        cp.stop()


@pytest.mark.parametrize("isolation", ["green", "grid"])
def test_isolation_is_reported_and_serves(dom, isolation):
    if isolation == "green":
        cu = pytest.importorskip("cuda.bindings.driver")
        if not hasattr(cu, "cuGreenCtxCreate"):
            pytest.skip("these CUDA bindings have no green contexts")
    cp = agents.spawn(dom, "gpucp", device=0, sms=8, isolation=isolation)
    try:
        caps = cp.capabilities
        assert caps["isolation"] == ("green context" if isolation == "green" else "grid")
        assert caps["sms"] >= 8 and caps["workers"] == caps["sms"] - 1 and caps["sms"] <= caps["sms_total"]
        n = 96  # not a multiple of the 32-wide tiles
        rng = np.random.default_rng(1)
        w = rng.standard_normal((n, n)).astype("f4")
        x = rng.standard_normal((n, n)).astype("f4")
        g = Graph(dom).input("x", (n, n), "f4").constant("w", w)
        g.stage("mm", cp, "gemm", ["x", "w"], ("y", (n, n), "f4"))
        with g.compile() as cg:
            assert np.allclose(cg.run({"x": x}, timeout=60)["y"], x @ w, rtol=1e-3, atol=1e-3)
        g2 = Graph(dom).input("x", (n, n), "f4")
        g2.stage("s", cp, "sum", ["x"], ("t", (1,), "f4"))
        with g2.compile() as cg:
            assert np.isclose(cg.run({"x": x}, timeout=60)["t"][0], x.sum(), rtol=1e-3, atol=1e-2)
    finally:
        cp.stop()


def test_rewritten_argument_block_is_seen(dom):
    """The processor keeps decoded argument blocks; a block rewritten between packets
    (another buffer handle in it) must be decoded again, not served from the cache."""
    cp = agents.spawn(dom, "gpucp", device=0)
    try:
        x1 = dom.buffer((8,), "f4")
        x2 = dom.buffer((8,), "f4")
        y = dom.buffer((8,), "f4")
        x1.numpy()[...] = -1
        x2.numpy()[...] = 5
        args = bytes_buffer(dom, Kernargs(buffers=[x1.handle, y.handle]).encode())
        assert _run(cp, args) == Status.SUCCESS and (y.numpy() == 0).all()
        args.numpy()[:] = np.frombuffer(Kernargs(buffers=[x2.handle, y.handle]).encode(), np.uint8)
        assert _run(cp, args) == Status.SUCCESS and (y.numpy() == 5).all()
        # the same block, a released buffer in it: the cached decode must not be used
        x2.release()
        assert _run(cp, args) == Status.ERROR
        assert gpucp.stats(cp)["last_reason"] == "a buffer handle names no live buffer here"
    finally:
        cp.stop()


def test_failure_reaches_the_follow_ups(dom):
    """A packet whose input failed runs nothing and fails its follow-ups' signals, so that
    their waiters are released (here the follow-up was meant to run in place)."""
    cp = agents.spawn(dom, "gpucp", device=0)
    try:
        x = dom.buffer((4,), "f4")
        y = dom.buffer((4,), "f4")
        z = dom.buffer((4,), "f4")
        f2 = dom.fence()
        args2 = bytes_buffer(dom, Kernargs(buffers=[y.handle, z.handle]).encode())
        follow = Packet(type=PacketType.KERNEL, kernel=4, args=args2.handle, signal=f2.handle)
        args1 = bytes_buffer(
            dom, Kernargs(buffers=[x.handle, y.handle], follow=[Follow(cp.queue.handle, follow)]).encode()
        )
        bad = dom.fence()
        bad.signal(Status.CANCEL)
        assert _run(cp, args1, wait=(bad.handle, 0)) == Status.CANCEL
        assert f2.wait(timeout=30) == Status.CANCEL
        # an argument block too large for the processor fails alone
        big = bytes_buffer(dom, Kernargs(buffers=[x.handle, y.handle], scalars=[0] * 200).encode())
        assert _run(cp, big) == Status.ERROR
        assert gpucp.stats(cp)["last_reason"] == "bad argument block"
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
        assert _run(cp, args, kernel=999) == Status.ERROR
        # an input that failed: the stage does not run, its fence carries the input's status
        bad = dom.fence()
        bad.signal(Status.CANCEL)
        y.numpy()[...] = 7
        assert _run(cp, args, wait=(bad.handle, 0)) == Status.CANCEL
        assert (y.numpy() == 7).all()  # nothing ran
        # and it still serves
        x.numpy()[...] = [-1, 2, -3, 4]
        assert _run(cp, args) == Status.SUCCESS
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
        assert _run(cp2, args) == Status.SUCCESS
        assert list(y.numpy()) == [1, 0, 1, 0]
    finally:
        cp2.stop()
        never.signal()


@pytest.mark.parametrize("shape", [(5, 40), (3, 300), (7, 1), (1000, 33)])
def test_kernels_at_odd_shapes(dom, shape):
    """Softmax in registers (rows <= 256) and the generic loop (longer rows), elementwise
    kernels with their unrolled loads over sizes that are no multiple of anything, on block 0
    (small) and on the worker blocks (large)."""
    cp = agents.spawn(dom, "gpucp", device=0)
    try:
        rng = np.random.default_rng(7)
        x = rng.standard_normal(shape).astype("f4")
        g = Graph(dom).input("x", shape, "f4")
        g.stage("sm", cp, "softmax", ["x"], ("s", shape, "f4"))
        g.stage("sc", cp, "scale", ["s"], ("t", shape, "f4"), scalars=[3.0])
        g.stage("ad", cp, "add", ["t", "x"], ("u", shape, "f4"))
        g.stage("re", cp, "relu", ["u"], ("y", shape, "f4"))
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        ref = np.maximum(3 * e / e.sum(axis=-1, keepdims=True) + x, 0)
        with g.compile() as cg:
            for _ in range(2):
                assert np.allclose(cg.run({"x": x}, timeout=60)["y"], ref, rtol=1e-4, atol=1e-5)
    finally:
        cp.stop()


def test_ert_commands_run_on_the_gpu(dom):
    """ERT packets as the emulated NPU takes them: START_CU / START_NPU on the CU their cu_mask
    names (the CU index is the kernel id), buffers and scalars in the command, the state written
    back into the header (COMPLETED; ERROR for a cu_mask naming two CUs and for a CMD_CHAIN,
    which the GPU does not run), and the processor goes on."""
    cp = agents.spawn(dom, "gpucp", device=0)
    try:
        x = dom.buffer((8,), "f4")
        y = dom.buffer((8,), "f4")
        x.numpy()[...] = np.arange(8, dtype="f4") - 4

        def run(cmd: ert.ErtCommand) -> tuple[Status, int]:
            cb = bytes_buffer(dom, cmd.encode())
            ka = bytes_buffer(dom, Kernargs(buffers=[cb.handle]).encode())
            st = _run(cp, ka, kernel=0, ptype=PacketType.ERT)
            return st, ert.parse_header(int(cb.numpy()[:4].view("<u4")[0]))[0]

        st, state = run(ert.start_cu(4, ert.cu_args([x.handle, y.handle], [])))  # CU 4: relu
        assert (st, state) == (Status.SUCCESS, ert.State.COMPLETED)
        assert list(y.numpy()) == list(np.maximum(x.numpy(), 0))
        two_and_a_half = struct.unpack("<Q", struct.pack("<d", 2.5))[0]
        st, state = run(ert.start_npu(3, 0, 0, ert.cu_args([x.handle, y.handle], [two_and_a_half])))  # scale
        assert (st, state) == (Status.SUCCESS, ert.State.COMPLETED)
        assert np.allclose(y.numpy(), 2.5 * x.numpy())
        two_cus = ert.ErtCommand(
            ert.State.NEW, ert.Opcode.START_CU, ert.CmdType.CU, 0b11, ert.cu_args([x.handle, y.handle], [])
        )
        assert run(two_cus) == (Status.ERROR, ert.State.ERROR)
        assert run(ert.cmd_chain([])) == (Status.ERROR, ert.State.ERROR)
        st, state = run(ert.start_cu(4, ert.cu_args([y.handle, x.handle], [])))
        assert (st, state) == (Status.SUCCESS, ert.State.COMPLETED)
    finally:
        cp.stop()
