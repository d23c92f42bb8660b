"""Device-resident buffers (GPU tests: run on the GPU machine, skipped elsewhere with the reason).

Placement (a buffer in the GPU's memory, no host view, explicit copies),
the device heap shared by processes (a child writes, the parent reads; the
allocation outlives its creator), DLPack both ways with no copy (pointer
equality with CuPy and PyTorch), recovery of a SIGKILLed participant's device
buffers, and a Graph placing GPU-only tensors in GPU memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

import hostless as hl
from hostless import agents, devmem, lowlevel
from hostless.errors import DeviceBufferError
from hostless.graph import Graph

cuda = pytest.importorskip("hostless.cuda")
_why = cuda.available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_why is not None, reason=f"no usable GPU: {_why}")]


@pytest.fixture
def name():
    n = f"hldev-{uuid.uuid4().hex[:10]}"
    yield n
    try:
        hl.Domain.unlink(n)
    except Exception:
        pass


@pytest.fixture
def dom(name):
    d = hl.Domain.create(name, heap="64M", device_heaps={"cuda:0": 64 << 20})
    yield d
    d.close()


def _used(dom, dev="cuda:0"):
    return next(h for h in lowlevel.device_heaps(dom) if h.name == dev).used


def _child(code: str, name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    src = "import sys, numpy as np, hostless as hl\nfrom hostless import devmem\n" + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", src, name, *args], capture_output=True, text=True, timeout=timeout
    )


def test_device_buffer_has_no_host_view_and_copies_explicitly(dom):
    b = dom.buffer((256, 4), "f4", device="cuda:0")
    assert b.device == "cuda:0"
    with pytest.raises(DeviceBufferError, match="cuda:0"):
        b.numpy()
    with pytest.raises(DeviceBufferError):
        np.asarray(b)
    with pytest.raises(DeviceBufferError):
        memoryview(b)
    x = np.arange(1024, dtype="f4").reshape(256, 4)
    devmem.from_host(b, x)
    assert (devmem.to_host(b) == x).all()
    h = dom.buffer((4,), "f4")
    assert h.device == "cpu"
    b.release()
    h.release()


def test_dlpack_cupy_and_torch_share_the_memory(dom):
    import cupy as cp

    b = dom.buffer((64, 64), "f4", device="cuda:0")
    ptr = devmem.device_pointer(b)
    assert b.__dlpack_device__() == (2, 0)
    c = cp.from_dlpack(b)
    assert c.data.ptr == ptr and c.shape == (64, 64) and c.dtype == cp.float32
    c[...] = 3.0
    cp.cuda.runtime.deviceSynchronize()
    assert (devmem.to_host(b) == 3.0).all()
    torch = pytest.importorskip("torch")
    t = torch.from_dlpack(b)
    assert t.data_ptr() == ptr and t.is_cuda
    t.mul_(2)
    torch.cuda.synchronize()
    assert (devmem.to_host(b) == 6.0).all()
    # the capsule keeps the buffer: releasing our reference leaves the consumer's memory allocated
    used = _used(dom)
    b.release()
    assert _used(dom) == used
    del c, t
    import gc

    gc.collect()
    assert _used(dom) < used


def test_another_process_writes_the_parent_reads(dom, name):
    b = dom.buffer((1000,), "f8", device="cuda:0")
    devmem.from_host(b, np.zeros(1000))
    r = _child(
        """
        d = hl.Domain.open(sys.argv[1])
        b = d.import_buffer(int(sys.argv[2]))
        assert b.device == "cuda:0", b.device
        a = devmem.cupy_array(b)
        assert float(a.sum()) == 0.0
        import cupy
        a[...] = cupy.asarray(np.arange(1000, dtype="f8"))
        cupy.cuda.runtime.deviceSynchronize()
        print(devmem.device_pointer(b) != 0)
        b.release(); d.close()
        """,
        name,
        str(b.handle),
    )
    assert r.returncode == 0, r.stderr
    assert (devmem.to_host(b) == np.arange(1000)).all()
    b.release()


def test_the_allocation_outlives_its_creator(name):
    # the child creates the domain's device heap allocation and writes; the parent maps it
    # while the child lives, the child exits, and the parent still reads what it wrote
    d = hl.Domain.create(name, heap="16M", device_heaps={"cuda:0": 32 << 20})
    try:
        p = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent("""
                import sys, numpy as np, hostless as hl
                from hostless import devmem
                d = hl.Domain.open(sys.argv[1])
                b = d.buffer((4096,), "i4", device="cuda:0")
                devmem.from_host(b, np.arange(4096, dtype="i4"))
                d.publish("written", b)
                print(devmem.backing(d, "cuda:0").created, flush=True)
                sys.stdin.readline()
                """), name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline().strip() == "True"  # the child made the allocation
        b = d.lookup("written", timeout=30)
        bk = devmem.backing(d, "cuda:0")
        assert not bk.created
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.wait(60) == 0
        assert (devmem.to_host(b) == np.arange(4096, dtype="i4")).all()
        b.release()
    finally:
        d.close()


def test_sigkilled_participants_device_buffers_are_reclaimed(dom, name):
    before = _used(dom)
    p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, numpy as np, hostless as hl
            from hostless import devmem
            d = hl.Domain.open(sys.argv[1])
            bs = [d.buffer((1 << 18,), "f4", device="cuda:0") for _ in range(8)]
            for b in bs:
                devmem.from_host(b, np.ones(1 << 18, "f4"))
            print("ready", flush=True)
            import time; time.sleep(600)
            """), name],
        stdout=subprocess.PIPE, text=True,
    )
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    assert _used(dom) >= before + 8 * (1 << 20)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _used(dom) != before:
        dom.reap()
        time.sleep(0.05)
    assert _used(dom) == before
    assert dom.check() == []
    # the memory is still usable (this process holds the allocation)
    b = dom.buffer((1 << 18,), "f4", device="cuda:0")
    devmem.from_host(b, np.full(1 << 18, 2, "f4"))
    assert float(devmem.to_host(b).sum()) == 2.0 * (1 << 18)
    b.release()


def test_graph_places_gpu_only_tensors_in_gpu_memory(dom):
    gpu = agents.spawn(dom, "cuda", device=0)
    try:
        rng = np.random.default_rng(1)
        w = rng.standard_normal((32, 32)).astype("f4")
        x = rng.standard_normal((32, 32)).astype("f4")
        g = Graph(dom).input("x", (32, 32), "f4").constant("w", w)
        g.stage("mm", gpu, "gemm", ["x", "w"], ("h", (32, 32), "f4"))
        g.stage("act", gpu, "relu", ["h"], ("y", (32, 32), "f4"))
        want = np.maximum(x @ w, 0)
        for dispatch in ("host", "direct"):
            with g.compile(dispatch=dispatch, data="shared") as cg:
                assert cg.place == {"x": "cuda:0", "w": "cuda:0", "h": "cuda:0", "y": "cuda:0"}
                assert "cuda:0 memory" in cg.plan()
                for _ in range(3):
                    out = cg.run({"x": x})["y"]
                    assert np.allclose(out, want, rtol=1e-4, atol=1e-4)
            with g.compile(dispatch=dispatch, data="copy") as cg:
                assert set(cg.place.values()) == {"cpu"}
                assert np.allclose(cg.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)
    finally:
        gpu.stop()


def test_mixed_graph_keeps_shared_edges_in_host_memory(dom):
    gpu = agents.spawn(dom, "cuda", device=0)
    cpu = agents.spawn(dom, "cpu")
    try:
        x = np.linspace(-1, 1, 64, dtype="f4").reshape(8, 8)
        g = Graph(dom).input("x", (8, 8), "f4")
        g.stage("a", gpu, "relu", ["x"], ("h", (8, 8), "f4"))
        g.stage("b", cpu, "scale", ["h"], ("y", (8, 8), "f4"), scalars=[2.0])
        with g.compile(dispatch="direct", data="shared") as cg:
            assert cg.place["x"] == "cuda:0" and cg.place["h"] == "cpu" and cg.place["y"] == "cpu"
            assert np.allclose(cg.run({"x": x})["y"], 2 * np.maximum(x, 0))
    finally:
        gpu.stop()
        cpu.stop()


def test_host_buffer_dlpack_through_the_peer(dom):
    import cupy as cp

    peer = cuda.CudaPeer(dom, 0)
    try:
        b = dom.buffer((16, 16), "f4")
        b.numpy()[...] = 1.0
        assert np.from_dlpack(b).ctypes.data == b.numpy().ctypes.data  # CPU consumers: kDLCPU
        c = cp.from_dlpack(peer.dlpack(b))
        assert c.data.ptr == peer.dptr(b.offset)
        with peer.stream:
            c *= 4
        peer.stream.synchronize()
        assert (b.numpy() == 4.0).all()  # the GPU wrote the host buffer in place
        torch = pytest.importorskip("torch")
        t = torch.from_dlpack(peer.dlpack(b))
        assert t.data_ptr() == peer.dptr(b.offset)
        # a device buffer is its own exporter
        d = dom.buffer((4,), "f4", device="cuda:0")
        assert peer.dlpack(d) is d
        del c, t
        d.release()
        b.release()
    finally:
        peer.close()
