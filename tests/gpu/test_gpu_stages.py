"""GPU stages from user functions (PyTorch, CuPy), captured as CUDA graphs (issue 23).

Skipped without a GPU, PyTorch or CuPy (with the reason).  Run on the GPU machine.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import numpy as np
import pytest

import gpu_stage_fns as F
import hostless as hl
from hostless import agents
from hostless.errors import HostlessError
from hostless.graph import Graph, GraphInvalidated, StageFailed

cuda = pytest.importorskip("hostless.cuda")
_why = cuda.available()
torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_why is not None, reason=f"no usable GPU: {_why}")]

MODES = [("host", "copy"), ("host", "shared"), ("direct", "copy"), ("direct", "shared")]


@pytest.fixture
def dom():
    name = f"hlgs-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(name, heap="256M", device_heaps={"cuda:0": 64 << 20})
    yield d
    d.close()
    hl.Domain.unlink(name)


@pytest.fixture
def gpu(dom):
    a = agents.spawn(dom, "cuda", device=0, timeout=120)
    yield a
    a.stop()


def _chain(dom, gpu, n=64):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((n, n)) / np.sqrt(n)).astype("f4")
    g = Graph(dom).input("x", (n, n), "f4").constant("w", w)
    g.stage("affine", gpu, F.t_affine, ["x", "w"], ("a", (n, n), "f4"), scalars=[0.5], arrays="torch")
    g.stage("relu", gpu, F.t_relu, ["a"], ("r", (n, n), "f4"), arrays="torch")
    g.stage("softmax", gpu, F.t_softmax, ["r"], ("y", (n, n), "f4"), arrays="torch")
    return g, w


@pytest.mark.parametrize("dispatch,data", MODES)
def test_torch_chain_is_one_captured_segment(dom, gpu, dispatch, data):
    torch.backends.cuda.matmul.allow_tf32 = False
    g, w = _chain(dom, gpu)
    rng = np.random.default_rng(2)
    with g.compile(dispatch=dispatch, data=data) as cg:
        plan = cg.plan()
        assert "segment affine+relu+softmax" in plan and "captured as a CUDA graph" in plan, plan
        for _ in range(5):
            x = rng.standard_normal((64, 64)).astype("f4")
            y = cg.run({"x": x}, timeout=60)["y"]
            ref = F.ref_softmax(np.maximum(F.ref_affine(x, w, 0.5), 0))
            np.testing.assert_allclose(y, ref, rtol=2e-3, atol=2e-5)
        xs = [rng.standard_normal((64, 64)).astype("f4") for _ in range(6)]
        outs = list(cg.stream([{"x": x} for x in xs], timeout=60))
        for x, o in zip(xs, outs, strict=True):
            ref = F.ref_softmax(np.maximum(F.ref_affine(x, w, 0.5), 0))
            np.testing.assert_allclose(o["y"], ref, atol=2e-5)


def test_cupy_gemm_runs_eagerly_and_says_why(dom, gpu):
    n = 32
    w = np.eye(n, dtype="f4") * 3
    g = Graph(dom).input("x", (n, n), "f4").constant("w", w)
    g.stage("norm", gpu, F.c_norm, ["x"], ("z", (n, n), "f4"), scalars=[1.0, 2.0], arrays="cupy")
    g.stage("gemm", gpu, F.c_gemm, ["z", "w"], ("y", (n, n), "f4"), arrays="cupy")
    with g.compile() as cg:
        plan = cg.plan()
        assert "segment norm+gemm" in plan
        x = np.arange(n * n, dtype="f4").reshape(n, n)
        y = cg.run({"x": x}, timeout=60)["y"]
        np.testing.assert_allclose(y, ((x - 1) / 2) @ w, rtol=1e-5)
        print(plan)


def test_cupy_elementwise_is_captured(dom, gpu):
    g = Graph(dom).input("x", (16,), "f4")
    g.stage("norm", gpu, F.c_norm, ["x"], ("y", (16,), "f4"), scalars=[1.0, 4.0], arrays="cupy")
    with g.compile() as cg:
        assert "captured as a CUDA graph" in cg.plan(), cg.plan()
        x = np.arange(16, dtype="f4")
        np.testing.assert_allclose(cg.run({"x": x})["y"], (x - 1) / 4)


def test_out_parameter_and_scalars(dom, gpu):
    g = Graph(dom).input("x", (8,), "f4")
    g.stage("scale", gpu, F.t_scale_out, ["x"], ("y", (8,), "f4"), scalars=[3.0], arrays="torch")
    with g.compile() as cg:
        np.testing.assert_allclose(cg.run({"x": np.ones(8, "f4")})["y"], 3.0)


def test_eager_exception_fails_the_frame_with_the_traceback(dom, gpu):
    g = Graph(dom).input("x", (8,), "f4")
    g.stage("checked", gpu, F.t_checked, ["x"], ("y", (8,), "f4"), arrays="torch")
    with g.compile() as cg:
        assert "runs eagerly" in cg.plan(), cg.plan()
        np.testing.assert_allclose(cg.run({"x": np.ones(8, "f4")})["y"], 2.0)
        with pytest.raises(StageFailed) as ei:
            cg.run({"x": np.full(8, 1000, "f4")}, timeout=30)
        assert "frame too hot" in str(ei.value) and "t_checked" in str(ei.value)


def test_wrong_shape_is_refused_at_compile(dom, gpu):
    g = Graph(dom).input("x", (8,), "f4")
    g.stage("bad", gpu, F.t_wrong_shape, ["x"], ("y", (8,), "f4"), arrays="torch")
    with pytest.raises(HostlessError, match="stage 'bad' returned shape"):
        g.compile()


def test_arrays_is_required_and_checked(dom, gpu):
    g = Graph(dom).input("x", (8,), "f4")
    with pytest.raises(ValueError, match="arrays='torch'"):
        g.stage("s", gpu, F.t_relu, ["x"], ("y", (8,), "f4"))
    with pytest.raises(ValueError, match="arrays is one of"):
        g.stage("s", gpu, F.t_relu, ["x"], ("y", (8,), "f4"), arrays="jax")


def test_device_memory_edge_between_segments(dom, gpu):
    """torch -> cupy on one GPU: two segments; the tensor between them lives in device memory."""
    g = Graph(dom).input("x", (16,), "f4")
    g.stage("relu", gpu, F.t_relu, ["x"], ("r", (16,), "f4"), arrays="torch")
    g.stage("norm", gpu, F.c_norm, ["r"], ("y", (16,), "f4"), scalars=[0.0, 2.0], arrays="cupy")
    for dispatch in ("host", "direct"):
        with g.compile(dispatch=dispatch, data="shared") as cg:
            assert cg.place["r"] == "cuda:0", cg.plan()
            assert cg.place["x"] == "cpu" and cg.place["y"] == "cpu", cg.plan()
            x = np.linspace(-4, 4, 16, dtype="f4")
            np.testing.assert_allclose(cg.run({"x": x})["y"], np.maximum(x, 0) / 2)


def test_mixed_gpu_npu_cpu_dag(dom, gpu):
    npu = agents.spawn(dom, "npu")
    cpu = agents.spawn(dom, "cpu")
    try:
        n = 64
        w = np.eye(n, dtype="f4")
        g = Graph(dom).input("x", (n, n), "f4").constant("w", w)
        g.stage("pre", cpu, F.cpu_double, ["x"], ("p", (n, n), "f4"))
        g.stage("affine", gpu, F.t_affine, ["p", "w"], ("a", (n, n), "f4"), scalars=[-1.0], arrays="torch")
        g.stage("relu", npu, "relu", ["a"], ("r", (n, n), "f4"))
        g.stage("side", gpu, F.t_relu, ["p"], ("s", (n, n), "f4"), arrays="torch")
        g.stage("soft", gpu, F.t_softmax, ["r"], ("y", (n, n), "f4"), arrays="torch")
        for dispatch, data in MODES:
            with g.compile(dispatch=dispatch, data=data) as cg:
                x = np.random.default_rng(3).standard_normal((n, n)).astype("f4")
                out = cg.run({"x": x}, timeout=60)
                np.testing.assert_allclose(out["y"], F.ref_softmax(np.maximum(2 * x - 1, 0)), atol=1e-5)
                np.testing.assert_allclose(out["s"], np.maximum(2 * x, 0), atol=1e-6)
    finally:
        npu.stop()
        cpu.stop()


def test_killed_gpu_agent_fails_the_graph_in_bounded_time(dom):
    gpu = agents.spawn(dom, "cuda", device=0, timeout=120)
    g, _w = _chain(dom, gpu)
    cg = g.compile()
    cg.run({"x": np.zeros((64, 64), "f4")}, timeout=60)
    os.kill(gpu.proc.pid, signal.SIGKILL)
    gpu.proc.wait()
    t0 = time.monotonic()
    with pytest.raises((StageFailed, GraphInvalidated)):
        cg.run({"x": np.zeros((64, 64), "f4")}, timeout=20)
    assert time.monotonic() - t0 < 10
    cg.close()


def test_armed_segment_between_cpu_stages_streams_and_fails_cleanly(dom, gpu):
    """cpu -> torch segment -> cpu in direct+shared: the segment is armed (no packet per
    frame); frames stream with 3 in flight; a failing cpu stage before it fails the frame
    with that stage named; closing drains the armed stream (the agent serves the next graph)."""
    cpu = agents.spawn(dom, "cpu")
    try:
        n = 32
        g = Graph(dom).input("x", (n,), "f4")
        g.stage("pre", cpu, F.cpu_double, ["x"], ("p", (n,), "f4"))
        g.stage("relu", gpu, F.t_relu, ["p"], ("r", (n,), "f4"), arrays="torch")
        g.stage("post", cpu, "scale", ["r"], ("y", (n,), "f4"), scalars=[0.5])
        with g.compile(dispatch="direct", data="shared", inflight=3) as cg:
            assert "armed" in cg.plan(), cg.plan()
            xs = [np.linspace(-k, k, n, dtype="f4") for k in range(1, 40)]
            outs = list(cg.stream([{"x": x} for x in xs], timeout=30))
            for x, o in zip(xs, outs, strict=True):
                np.testing.assert_allclose(o["y"], np.maximum(2 * x, 0) * 0.5)
            for x in xs[:5]:
                np.testing.assert_allclose(cg.run({"x": x}, timeout=30)["y"], np.maximum(x, 0))
        g2 = Graph(dom).input("x", (n,), "f4")
        g2.stage("relu", gpu, F.t_relu, ["x"], ("y", (n,), "f4"), arrays="torch")
        with g2.compile() as cg2:  # a root segment: armed on the host's fed timeline
            assert "armed" in cg2.plan(), cg2.plan()
            for k in range(20):
                x = np.linspace(-k, k, n, dtype="f4")
                np.testing.assert_allclose(cg2.run({"x": x}, timeout=30)["y"], np.maximum(x, 0))
    finally:
        cpu.stop()


def test_armed_segment_passes_an_input_failure_on(dom, gpu):
    cpu = agents.spawn(dom, "cpu")
    try:
        g = Graph(dom).input("x", (8,), "f4")
        g.stage("pre", cpu, F.cpu_fail_on_negative, ["x"], ("p", (8,), "f4"))
        g.stage("relu", gpu, F.t_relu, ["p"], ("y", (8,), "f4"), arrays="torch")
        with g.compile(dispatch="direct", data="shared") as cg:
            assert "armed" in cg.plan()
            np.testing.assert_allclose(cg.run({"x": np.ones(8, "f4")}, timeout=30)["y"], 1.0)
            t0 = time.monotonic()
            with pytest.raises(StageFailed) as ei:
                cg.run({"x": -np.ones(8, "f4")}, timeout=30)
            assert ei.value.stage == "pre" and "negative input" in str(ei.value)
            assert time.monotonic() - t0 < 5
            # the graph outlives the bad frame: its slot renewed, the segment re-armed on it
            for k in range(1, 8):
                np.testing.assert_allclose(cg.run({"x": np.full(8, k, "f4")}, timeout=30)["y"], float(k))
    finally:
        cpu.stop()


def test_armed_frames_stay_in_step_when_the_agent_requeues_them(dom, gpu):
    """Each armed slot's graph counts its frames on the GPU (the frame its wait and signal
    use); a request to the agent (here: compiling another graph while one is armed) lets the
    queued frames pass and queues them again, which must set that count back.  Frames run
    before, between and after such requests, and with a second armed graph on the same agent
    interleaved, all come out right and in time."""
    n = 16

    def one():
        g = Graph(dom).input("x", (n,), "f4")
        g.stage("relu", gpu, F.t_relu, ["x"], ("y", (n,), "f4"), arrays="torch")
        return g

    with one().compile(inflight=2) as a:
        assert "armed" in a.plan(), a.plan()
        for k in range(1, 6):
            np.testing.assert_allclose(a.run({"x": np.full(n, k, "f4")}, timeout=30)["y"], float(k))
        with one().compile(inflight=3) as b:  # the agent requeues a's frames to load b
            for k in range(1, 12):
                t0 = time.monotonic()
                np.testing.assert_allclose(a.run({"x": np.full(n, k, "f4")}, timeout=30)["y"], float(k))
                np.testing.assert_allclose(b.run({"x": np.full(n, -k, "f4")}, timeout=30)["y"], 0.0)
                np.testing.assert_allclose(b.run({"x": np.full(n, 2 * k, "f4")}, timeout=30)["y"], 2.0 * k)
                assert time.monotonic() - t0 < 10
                if k == 5:  # another request mid-stream: a third graph compiled and dropped
                    with one().compile() as c:
                        np.testing.assert_allclose(c.run({"x": np.ones(n, "f4")}, timeout=30)["y"], 1.0)
        for k in range(1, 6):
            np.testing.assert_allclose(a.run({"x": np.full(n, 3 * k, "f4")}, timeout=30)["y"], 3.0 * k)
