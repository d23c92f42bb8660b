"""GPU tests (run on the GPU machine; skipped elsewhere with the reason).

Zero-copy visibility both ways, a device-side wait released by another
process's signal, a GPU signal waking an async host waiter, a GPU kernel
enqueuing an ERT command that the npu agent completes, the four Graph modes
with cuda stages agreeing with NumPy, and an npu agent SIGKILLed while the GPU
waits on its fence (the GPU stage must fail, not hang).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

import hostless as hl
from hostless import agents, ert, kernels
from hostless.graph import Graph

cuda = pytest.importorskip("hostless.cuda")
_why = cuda.available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_why is not None, reason=f"no usable GPU: {_why}")]


@pytest.fixture
def dom():
    name = f"hlgpu-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(name, heap="256M", trace="1M")
    yield d
    d.close()
    hl.Domain.unlink(name)


@pytest.fixture
def peer(dom):
    p = cuda.CudaPeer(dom, 0)
    yield p
    p.close()


def test_zero_copy_both_ways(dom, peer):
    b = dom.buffer((1024,), "f4")
    b.numpy()[:] = np.arange(1024, dtype="f4")
    g = peer.array(b)
    assert float(g.sum()) == float(np.arange(1024, dtype="f4").sum())  # GPU reads host writes
    with peer.stream:
        g *= 2
    peer.stream.synchronize()
    assert (b.numpy() == 2 * np.arange(1024, dtype="f4")).all()  # host reads GPU writes
    b.release()


def test_device_wait_released_by_another_process(dom, peer):
    f = dom.fence()
    t = dom.timeline()
    out = dom.buffer(4, "i4")
    out.numpy()[:] = 0
    g = peer.array(out)
    with peer.stream:  # compile the kernel first: never compile behind a pending wait
        g += 0
    peer.stream.synchronize()
    peer.wait(f, 1)
    peer.wait(t, 5)
    with peer.stream:
        g += 7
    code = (
        "import hostless as hl, sys, time\n"
        "d = hl.Domain.open(sys.argv[1]); f = d.import_fence(int(sys.argv[2]))\n"
        "t = d.import_timeline(int(sys.argv[3]))\n"
        "time.sleep(0.2); t.signal(5); f.signal(); d.close()\n"
    )
    time.sleep(0.05)
    assert (out.numpy() == 0).all()  # the GPU is held by the wait
    p = subprocess.run([sys.executable, "-c", code, dom.name, str(f.handle), str(t.handle)], timeout=30)
    assert p.returncode == 0
    peer.stream.synchronize()
    assert (out.numpy() == 7).all()


def test_gpu_signal_wakes_async_waiter(dom, peer):
    f = dom.fence()
    t = dom.timeline()
    gate = peer.gate([])

    async def main() -> tuple[hl.Status, hl.Status, float]:
        t0 = time.perf_counter()
        peer.signal(f, 0, gate)
        peer.signal(t, 3, gate)
        a = await asyncio.wait_for(f.wait_async(), 10)
        b = await asyncio.wait_for(t.wait_async(3), 10)
        return a, b, time.perf_counter() - t0

    a, b, dt = asyncio.run(main())
    assert a == hl.Status.SUCCESS and b == hl.Status.SUCCESS and t.value == 3
    assert dt < 5


def test_gpu_enqueues_ert_command_for_npu(dom, peer):
    npu = agents.spawn(dom, "npu")
    try:
        x = dom.buffer((8, 8), "f4")
        y = dom.buffer((8, 8), "f4")
        x.numpy()[:] = np.random.default_rng(1).standard_normal((8, 8))
        cmd = ert.start_cu(kernels.cu_index("relu"), [2, *ert.u64_args([x.handle, y.handle])]).encode()
        cb = dom.buffer(len(cmd))
        cb.numpy()[:] = np.frombuffer(cmd, np.uint8)
        ka = hl.Kernargs(buffers=[cb.handle]).to_buffer(dom)
        done = dom.fence(owner=npu.id)
        pkt = hl.Packet(type=hl.PacketType.ERT, args=ka.handle, signal=done.handle)
        pb = dom.buffer(64)
        pb.numpy()[:] = np.frombuffer(pkt.encode(), np.uint8)
        res = peer.enqueue(npu.queue, pb)
        assert done.wait(10) == hl.Status.SUCCESS
        peer.stream.synchronize()
        assert res.state() == (True, 0)
        assert ert.parse_header(int(cb.numpy().view("<u4")[0]))[0] == ert.State.COMPLETED
        assert np.allclose(y.numpy(), np.maximum(x.numpy(), 0))
    finally:
        npu.stop()


def test_stream_pushes_and_host_pushes_share_a_queue(dom, peer):
    """The GPU's atomics on host memory are not atomic against the host's on a PCIe GPU
    (hostless_tools.bench.gpu_atomics): a stream's pushes racing a host producer on one queue
    lost pushes or corrupted the queue when the GPU made them.  Pushed by the host function,
    every packet of both producers arrives exactly once."""
    import threading

    n = 1500
    q = dom.queue(4096)
    q.bind()
    gate = peer.cp.zeros(1, dtype=peer.cp.int32)
    bufs, pushes = [], []
    for i in range(n):
        pb = dom.buffer(64)
        pb.numpy()[:] = np.frombuffer(hl.Packet(kernel=1, signal_value=i + 1).encode(), np.uint8)
        bufs.append(pb)

    def host() -> None:
        for i in range(n):
            q.push(hl.Packet(kernel=2, signal_value=i + 1))

    t = threading.Thread(target=host)
    t.start()
    for pb in bufs:
        pushes.append(peer.enqueue(q, pb, gate))
    t.join()
    peer.stream.synchronize()
    assert all(p.state() == (True, 0) for p in pushes)
    seen: dict[int, list[int]] = {1: [], 2: []}
    for _ in range(2 * n):
        r = q.pop(timeout=5)
        assert r is not None, f"a push was lost: {len(seen[1])} + {len(seen[2])} of {2 * n} arrived"
        seen[r[1].kernel].append(r[1].signal_value)
        q.completed()
    assert seen[1] == list(range(1, n + 1)) and seen[2] == list(range(1, n + 1))
    assert q.pop(timeout=0.05) is None


def test_gated_stream_push_is_not_made(dom, peer):
    q = dom.queue(8)
    q.bind()
    pb = dom.buffer(64)
    pb.numpy()[:] = np.frombuffer(hl.Packet(kernel=3).encode(), np.uint8)
    gate = peer.cp.full(1, int(hl.Status.ERROR), dtype=peer.cp.int32)
    p = peer.enqueue(q, pb, gate)
    peer.stream.synchronize()
    assert p.state() == (True, 1)
    assert q.pop(timeout=0.05) is None


def test_gpu_packet_on_a_point_reached_before_the_timeline_failed(dom):
    """ABI 6: a point reached stays reached.  The gate of a cuda-agent packet follows the
    header's hl_point_status: waiting on point 5 of a timeline that reached 5, then failed,
    the stage runs and succeeds; waiting on point 6 of it, the stage fails untouched."""
    gpu = agents.spawn(dom, "cuda")
    try:
        tl = dom.timeline()
        tl.signal(5)
        tl.fail(hl.Status.ERROR)
        x = dom.buffer((16,), "f4")
        x.numpy()[:] = np.arange(16, dtype="f4") - 8
        outs = []
        for point in (5, 6):
            y = dom.buffer((16,), "f4")
            y.numpy()[:] = -1
            done = dom.fence(owner=gpu.id)
            ka = hl.Kernargs(buffers=[x.handle, y.handle]).to_buffer(dom)
            gpu.queue.push(
                hl.Packet(
                    kernel=kernels.kernel_id("relu"),
                    args=ka.handle,
                    signal=done.handle,
                    wait=(tl.handle, 0),
                    wait_value=(point, 0),
                )
            )
            outs.append((done.wait(30), y.numpy().copy()))
        assert outs[0][0] == hl.Status.SUCCESS
        assert np.array_equal(outs[0][1], np.maximum(x.numpy(), 0))
        assert outs[1][0] == hl.Status.ERROR
        assert (outs[1][1] == -1).all()
    finally:
        gpu.stop()


def _graph(dom, gpu, npu, cpu):
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((64, 64)).astype("f4")
    w2 = rng.standard_normal((64, 32)).astype("f4")
    g = Graph(dom).input("frame", (64, 64), "f4").constant("W1", w1).constant("W2", w2)
    g.stage("pre", gpu, "normalize", ["frame"], ("x", (64, 64), "f4"), scalars=[0.5, 2.0])
    g.stage("gemm1", gpu, "gemm", ["x", "W1"], ("h", (64, 64), "f4"))
    g.stage("npu", npu, "gemm", ["h", "W2"], ("y", (64, 32), "f4"))
    g.stage("post", cpu, "softmax", ["y"], ("z", (64, 32), "f4"))
    frame = rng.random((64, 64)).astype("f4")
    x = (frame - 0.5) / 2.0
    y = (x @ w1) @ w2
    e = np.exp(y - y.max(-1, keepdims=True))
    return g, frame, e / e.sum(-1, keepdims=True)


def test_graph_modes_with_cuda_stages(dom):
    gpu, npu, cpu = agents.spawn(dom, "cuda"), agents.spawn(dom, "npu"), agents.spawn(dom, "cpu")
    try:
        g, frame, ref = _graph(dom, gpu, npu, cpu)
        for dispatch in ("host", "direct"):
            for data in ("copy", "shared"):
                with g.compile(dispatch=dispatch, data=data) as cg:
                    out = cg.run({"frame": frame}, timeout=60)
                    assert np.allclose(out["z"], ref, atol=1e-4), (dispatch, data)
                    outs = list(cg.stream([{"frame": frame}] * 8, timeout=60))
                    assert all(np.allclose(o["z"], ref, atol=1e-4) for o in outs)
    finally:
        for a in (gpu, npu, cpu):
            a.stop()


def test_npu_killed_while_gpu_waits_fails_the_gpu_stage(dom):
    gpu, npu = agents.spawn(dom, "cuda"), agents.spawn(dom, "npu")
    try:
        blocker = dom.fence()  # the npu stage waits on it, so it is in flight when killed
        x = dom.buffer((16,), "f4")
        y = dom.buffer((16,), "f4")
        z = dom.buffer((16,), "f4")
        x.numpy()[:] = 1
        z.numpy()[:] = -5
        npu_done = dom.fence(owner=npu.id)
        ka = hl.Kernargs(buffers=[x.handle, y.handle]).to_buffer(dom)
        cmd = ert.start_cu(kernels.cu_index("relu"), [2, *ert.u64_args([x.handle, y.handle])]).encode()
        cb = dom.buffer(len(cmd))
        cb.numpy()[:] = np.frombuffer(cmd, np.uint8)
        ka = hl.Kernargs(buffers=[cb.handle]).to_buffer(dom)
        npu.queue.push(
            hl.Packet(
                type=hl.PacketType.ERT, args=ka.handle, signal=npu_done.handle, wait=(blocker.handle, 0)
            )
        )
        gpu_done = dom.fence(owner=gpu.id)
        kg = hl.Kernargs(buffers=[y.handle, z.handle]).to_buffer(dom)
        gpu.queue.push(
            hl.Packet(
                kernel=kernels.kernel_id("relu"),
                args=kg.handle,
                signal=gpu_done.handle,
                wait=(npu_done.handle, 0),
            )
        )
        time.sleep(0.3)
        t0 = time.perf_counter()
        npu.kill()
        st = gpu_done.wait(10)
        assert st == hl.Status.OWNER_DIED, st  # the GPU stage fails with its input's status
        assert time.perf_counter() - t0 < 5
        assert (z.numpy() == -5).all()  # and its output is untouched
        blocker.signal()
    finally:
        gpu.stop()
        npu.kill()
