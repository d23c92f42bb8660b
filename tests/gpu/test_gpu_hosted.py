"""One GPU process per device (issue 23 item 6): a GPU command processor in a cuda agent's process.

The processor runs in a green context of the cuda agent's process by default: user GPU stages
(PyTorch, captured) and the processor's built-in kernels in one graph; a segment loaded and
captured while the resident kernel runs (no device-wide synchronization waits for it); the
processor stopped alone, and again; the host stopped (its processor leaves first) and killed
(the processor's fences OWNER_DIED); ``process="own"`` with its warning.  GPU tests: skipped
elsewhere with the reason.
"""

from __future__ import annotations

import time
import uuid
import warnings

import numpy as np
import pytest

import gpu_stage_fns as F
import hostless as hl
from hostless import agents
from hostless.agents.hosted import HostedAgent
from hostless.buffer import bytes_buffer
from hostless.errors import GpuTimeSliceWarning
from hostless.graph import Graph
from hostless.status import Status
from hostless.wire import Kernargs, Packet, PacketType

cuda = pytest.importorskip("hostless.cuda")
_why = cuda.available()
torch = pytest.importorskip("torch")
cu = pytest.importorskip("cuda.bindings.driver")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_why is not None, reason=f"no usable GPU: {_why}"),
    pytest.mark.skipif(
        not hasattr(cu, "cuGreenCtxCreate"), reason="these CUDA bindings have no green contexts"
    ),
]


@pytest.fixture
def dom():
    name = f"hlho-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(name, heap="128M", device_heaps={"cuda:0": 64 << 20})
    yield d
    d.close()
    hl.Domain.unlink(name)


@pytest.fixture
def gpu(dom):
    a = agents.spawn(dom, "cuda", device=0, timeout=120)
    yield a
    a.stop()


def _relu_packet(dom, ag):
    """A relu packet of the processor's: (fence, x, y)."""
    x = dom.buffer((4,), "f4")
    y = dom.buffer((4,), "f4")
    x.numpy()[...] = [1, -1, 2, -2]
    args = bytes_buffer(dom, Kernargs(buffers=[x.handle, y.handle]).encode())
    f = dom.fence()
    ag.queue.push(Packet(type=PacketType.KERNEL, kernel=4, args=args.handle, signal=f.handle))
    return f, y


def test_gpucp_runs_in_the_cuda_agents_process_by_default(dom, gpu):
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpuTimeSliceWarning)
        cp = agents.spawn(dom, "gpucp", device=0, timeout=120)
    try:
        assert isinstance(cp, HostedAgent) and cp.host is gpu
        assert cp.id == gpu.id and cp.proc.pid == gpu.proc.pid
        assert cp.capabilities["isolation"] == "green context", cp.capabilities
        assert cp.capabilities["process"] == f"cuda agent {gpu.id}"
        f, y = _relu_packet(dom, cp)
        assert f.wait(timeout=30) == Status.SUCCESS
        assert list(y.numpy()) == [1, 0, 2, 0]
    finally:
        cp.stop()
    assert not cp.alive and gpu.alive


@pytest.mark.parametrize("dispatch,data", [("direct", "shared"), ("host", "copy")])
def test_user_stages_and_processor_kernels_in_one_graph(dom, gpu, dispatch, data):
    """torch affine (cuda agent) -> relu (the hosted processor) -> torch softmax (cuda agent);
    then a second graph's segment is loaded and captured while the resident kernel runs."""
    torch.backends.cuda.matmul.allow_tf32 = False
    cp = agents.spawn(dom, "gpucp", device=0, timeout=120)
    try:
        assert isinstance(cp, HostedAgent)
        n = 64
        rng = np.random.default_rng(1)
        w = (rng.standard_normal((n, n)) / np.sqrt(n)).astype("f4")
        g = Graph(dom).input("x", (n, n), "f4").constant("w", w)
        g.stage("affine", gpu, F.t_affine, ["x", "w"], ("a", (n, n), "f4"), scalars=[0.5], arrays="torch")
        g.stage("relu", cp, "relu", ["a"], ("r", (n, n), "f4"))
        g.stage("soft", gpu, F.t_softmax, ["r"], ("y", (n, n), "f4"), arrays="torch")
        with g.compile(dispatch=dispatch, data=data) as cg:
            for _ in range(4):
                x = rng.standard_normal((n, n)).astype("f4")
                y = cg.run({"x": x}, timeout=60)["y"]
                ref = F.ref_softmax(np.maximum(F.ref_affine(x, w, 0.5), 0))
                np.testing.assert_allclose(y, ref, atol=2e-5)
        # a new segment, captured now: CuPy/PyTorch loads and a graph capture beside the kernel
        t0 = time.monotonic()
        g2 = Graph(dom).input("x", (n,), "f4")
        g2.stage("sc", gpu, F.t_scale_out, ["x"], ("y", (n,), "f4"), scalars=[3.0], arrays="torch")
        with g2.compile(dispatch=dispatch, data=data) as cg2:
            x = np.arange(n, dtype="f4")
            np.testing.assert_allclose(cg2.run({"x": x}, timeout=60)["y"], 3 * x)
        assert time.monotonic() - t0 < 60
        f, y = _relu_packet(dom, cp)  # the processor still serves
        assert f.wait(timeout=30) == Status.SUCCESS and list(y.numpy()) == [1, 0, 2, 0]
    finally:
        cp.stop()


def test_processor_stopped_alone_and_started_again(dom, gpu):
    for _ in range(2):
        cp = agents.spawn(dom, "gpucp", device=0, sms=8, timeout=120)
        assert isinstance(cp, HostedAgent)
        f, _y = _relu_packet(dom, cp)
        assert f.wait(timeout=30) == Status.SUCCESS
        cp.stop()
        assert not cp.alive and gpu.alive
    g = Graph(dom).input("x", (8,), "f4")
    g.stage("r", gpu, F.t_relu, ["x"], ("y", (8,), "f4"), arrays="torch")
    with g.compile() as cg:
        x = np.linspace(-1, 1, 8, dtype="f4")
        np.testing.assert_allclose(cg.run({"x": x}, timeout=60)["y"], np.maximum(x, 0))


def test_stopping_the_host_stops_its_processor(dom):
    gpu = agents.spawn(dom, "cuda", device=0, timeout=120)
    cp = agents.spawn(dom, "gpucp", device=0, timeout=120)
    f, _y = _relu_packet(dom, cp)
    assert f.wait(timeout=30) == Status.SUCCESS
    t0 = time.monotonic()
    gpu.stop(timeout=30)
    assert time.monotonic() - t0 < 30 and gpu.proc.returncode == 0, gpu.proc.returncode
    assert not cp.alive
    cp.stop()  # nothing left to do: no error


def test_killed_host_fails_the_processors_fences(dom):
    gpu = agents.spawn(dom, "cuda", device=0, timeout=120)
    cp = agents.spawn(dom, "gpucp", device=0, timeout=120)
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
    cp.kill()
    assert not gpu.alive
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and t.failure is None:
        dom.reap()
        time.sleep(0.05)
    assert t.failure == Status.OWNER_DIED
    never.signal()


def test_own_process_on_request_warns_of_time_slices(dom, gpu):
    with pytest.warns(GpuTimeSliceWarning, match="separate"):
        cp = agents.spawn(dom, "gpucp", device=0, process="own", timeout=120)
    try:
        assert not isinstance(cp, HostedAgent) and cp.proc.pid != gpu.proc.pid
        f, y = _relu_packet(dom, cp)
        assert f.wait(timeout=30) == Status.SUCCESS and list(y.numpy()) == [1, 0, 2, 0]
    finally:
        cp.stop()


def test_explicit_host_and_bad_hosts(dom, gpu):
    with pytest.raises(ValueError, match="grid"):
        agents.spawn(dom, "gpucp", device=0, process=gpu, isolation="grid")
    with pytest.raises(ValueError, match="cuda:0"):
        agents.spawn(dom, "gpucp", device=1, process=gpu)
    cp = agents.spawn(dom, "gpucp", device=0, process=gpu, timeout=120)
    try:
        assert isinstance(cp, HostedAgent) and cp.host is gpu
    finally:
        cp.stop()
