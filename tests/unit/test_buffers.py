"""Buffers of the shared heap: every call and error of the API, alignment, the
views (NumPy, buffer protocol, DLPack into NumPy and PyTorch), the zero-copy
proof across processes, fd export/import over a Unix socket, the copy
baseline, heap statistics, the reclaiming of a killed participant's buffers
and the ``hostless info`` heap section.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

import hostless as hl
from conftest import (
    child_code,
    domain_of_another_tag,
    finish_child,
    kill_child,
    needs_test_hooks,
    read_line,
    send_line,
    spawn_child,
    wait_until,
)

HEAP = 16 << 20
LARGE = 65536
GRANULE = 64
PAGE = 4096


def block_bytes(nbytes: int) -> int:
    """Heap bytes taken by a buffer of ``nbytes`` (metadata head + body, see hostless.h)."""
    if nbytes >= LARGE:
        return PAGE + -(-nbytes // PAGE) * PAGE
    return 128 + -(-nbytes // GRANULE) * GRANULE


@pytest.fixture
def hdom(domain_name: str) -> Iterator[hl.Domain]:
    """A domain with a 16 MiB heap, joined by this process."""
    d = hl.Domain.create(domain_name, fences=256, participants=16, heap=HEAP)
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def hpeer(hdom: hl.Domain) -> Iterator[hl.Domain]:
    """A second participant of ``hdom`` in this process (its own Domain object)."""
    assert hdom.name is not None
    d = hl.Domain.open(hdom.name, label="peer")
    try:
        yield d
    finally:
        d.close()


def used(d: hl.Domain) -> int:
    return int(d.heap_stats()["used"])


def pattern(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def raw_bytes(d: hl.Domain, offset: int, n: int) -> bytes:
    """``n`` bytes of the domain file at ``offset``, read with pread (no mapping at all)."""
    return os.pread(d.fileno(), n, offset)


# --------------------------------------------------------------------------- allocation


def test_buffer_of_nbytes(hdom: hl.Domain) -> None:
    b = hdom.buffer(100)
    assert isinstance(b, hl.Buffer)
    assert b.shape == (100,) and b.dtype == np.uint8 and b.nbytes == 100 and len(b) == 100
    assert isinstance(b.handle, int) and 0 < b.handle < 1 << 64
    assert b.offset % 64 == 0
    assert "shape=(100,)" in repr(b)
    b.release()
    assert "released" in repr(b)
    assert hdom.check() == []


@pytest.mark.parametrize(
    ("shape", "dtype", "want_shape"),
    [
        (10, "f4", (10,)),
        ((3, 4), np.float64, (3, 4)),
        ([2, 3, 5], "<i2", (2, 3, 5)),
        ((np.int64(7),), np.complex64, (7,)),
        ((1,) * 12, "u1", (1,) * 12),
        ((4, 4), np.dtype([("x", "<f4"), ("y", "<i4")]), (4, 4)),
        ((5,), "?", (5,)),
        ((6,), ">u4", (6,)),
    ],
)
def test_buffer_shape_dtype(
    hdom: hl.Domain, shape: object, dtype: object, want_shape: tuple[int, ...]
) -> None:
    b = hdom.buffer(shape, dtype)  # type: ignore[arg-type]
    dt = np.dtype(dtype)  # type: ignore[call-overload]
    assert b.shape == want_shape and b.dtype == dt
    assert b.nbytes == int(np.prod(want_shape)) * dt.itemsize
    a = b.numpy()
    assert a.shape == want_shape and a.dtype == dt and a.flags.writeable and a.flags.c_contiguous
    b.release()
    assert used(hdom) == 0


def test_alignment(hdom: hl.Domain) -> None:
    base = np.frombuffer(hdom.raw(), dtype=np.uint8).ctypes.data
    assert base % PAGE == 0
    held = []
    for n in (1, 3, 63, 64, 65, 127, 1000, 4095, 4097, 65535, 65536, 65537, 100_000, 1 << 20):
        for _ in range(2):
            b = hdom.buffer(n)
            held.append(b)
            addr = b.numpy().ctypes.data
            assert addr == base + b.offset
            assert b.offset % 64 == 0, (n, b.offset)
            if n >= LARGE:
                assert b.offset % PAGE == 0, (n, b.offset)
    # the blocks do not overlap
    spans = sorted((b.offset, b.offset + b.nbytes) for b in held)
    for (_, e0), (s1, _) in zip(spans, spans[1:], strict=False):
        assert e0 <= s1
    assert used(hdom) == sum(block_bytes(b.nbytes) for b in held)
    for b in held:
        b.release()
    assert used(hdom) == 0
    assert hdom.check() == []


def test_with_releases(hdom: hl.Domain) -> None:
    with hdom.buffer(4096) as b:
        b.numpy()[:] = 1
        assert used(hdom) == block_bytes(4096)
    assert not b._held
    assert used(hdom) == 0
    with pytest.raises(hl.InvalidHandle):
        b.release()


def test_garbage_collected_buffer_is_released(hdom: hl.Domain) -> None:
    b = hdom.buffer(1 << 17)
    assert used(hdom) > 0
    del b
    gc.collect()
    assert used(hdom) == 0
    assert hdom.check() == []


def test_buffer_class_cannot_be_built_directly() -> None:
    with pytest.raises(TypeError):
        hl.Buffer()


# --------------------------------------------------------------------------- bad input


def test_zero_dim_buffer(hdom: hl.Domain, hpeer: hl.Domain) -> None:
    b = hdom.buffer((), "f8")
    assert b.nbytes == 8 and b.shape == ()
    b.numpy()[()] = 2.5
    c = hpeer.import_buffer(b.handle)
    assert c.shape == () and c.dtype == np.float64 and c.numpy()[()] == 2.5
    b.release()
    c.release()
    assert used(hdom) == 0


@pytest.mark.parametrize("shape", [0, -1, -4096, (0,), (3, 0), (2, -1)])
def test_bad_size(hdom: hl.Domain, shape: object) -> None:
    with pytest.raises(ValueError):
        hdom.buffer(shape)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        hdom.buffer(shape, "f4")  # type: ignore[arg-type]
    assert used(hdom) == 0 and hdom.check() == []


@pytest.mark.parametrize("dtype", ["nonsense", "f3", object, "O", np.dtype([("a", "O")]), "V0", "U0"])
def test_bad_dtype(hdom: hl.Domain, dtype: object) -> None:
    with pytest.raises(ValueError):
        hdom.buffer(16, dtype)
    assert used(hdom) == 0 and hdom.check() == []


@pytest.mark.parametrize("shape", ["16", 1.5, None, True])
def test_bad_shape_type(hdom: hl.Domain, shape: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        hdom.buffer(shape)  # type: ignore[arg-type]


def test_bad_shape_type_after_equal_shape_was_used(hdom: hl.Domain) -> None:
    """The layout cache must not let ``1.0`` or ``True`` in because ``1`` was used before
    (they compare and hash equal to 1)."""
    hdom.buffer(1).release()
    for shape in (1.0, True):
        with pytest.raises(TypeError):
            hdom.buffer(shape)  # type: ignore[arg-type]


def test_too_many_dimensions(hdom: hl.Domain) -> None:
    with pytest.raises(ValueError):
        hdom.buffer((1,) * 13, "u1")


def test_oversize(hdom: hl.Domain) -> None:
    st = hdom.heap_stats()
    assert st["size"] == HEAP and st["free"] == HEAP
    # more than the whole heap
    with pytest.raises(hl.OutOfMemory) as e:
        hdom.buffer(HEAP + 1)
    assert str(HEAP) in str(e.value)
    assert isinstance(e.value, MemoryError)
    # more than what is free
    keep = hdom.buffer(HEAP // 2)
    free = int(hdom.heap_stats()["free"])
    with pytest.raises(hl.OutOfMemory) as e:
        hdom.buffer(HEAP // 2)
    assert str(free) in str(e.value), str(e.value)
    # and more than the whole heap again, with part of it in use: still says what is free
    with pytest.raises(hl.OutOfMemory) as e:
        hdom.buffer(HEAP * 2)
    assert str(free) in str(e.value), str(e.value)
    assert hdom.check() == []
    assert used(hdom) == block_bytes(HEAP // 2)
    keep.release()
    # nothing leaked by the failed attempts: the whole heap fits in one buffer again
    whole = hdom.buffer(HEAP - PAGE)
    whole.release()
    assert used(hdom) == 0 and hdom.check() == []


def test_domain_without_heap(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=16, device_heaps={}) as d:
        with pytest.raises(hl.OutOfMemory):
            d.buffer(16)
        assert d.heap_stats()["size"] == 0
        assert d.check() == []
    # with device heaps (the default) and no heap=, the small heap holds only device buffers' metadata
    with hl.Domain.create(domain_name + "m", fences=16, unlink_on_close=True) as d:
        with pytest.raises(hl.OutOfMemory, match="no heap"):
            d.buffer(16)
        with pytest.raises(hl.OutOfMemory, match="no heap"):
            d.queue(4)
        d.buffer(16, device="cuda:0").release()
        assert d.check() == []


def test_slot_table_full(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=8, heap="1M") as d:
        held = [d.buffer(64) for _ in range(8)]
        with pytest.raises(hl.DomainFull):
            d.buffer(64)
        assert d.check() == []
        assert used(d) == 8 * block_bytes(64)
        for b in held:
            b.release()
        assert used(d) == 0


def test_use_after_release(hdom: hl.Domain) -> None:
    b = hdom.buffer((8,), "f4")
    b.release()
    with pytest.raises(hl.InvalidHandle):
        b.numpy()
    with pytest.raises(hl.InvalidHandle):
        np.from_dlpack(b)
    with pytest.raises(hl.InvalidHandle):
        b.copy_to(np.zeros(8, "f4"))
    with pytest.raises(hl.InvalidHandle):
        hl.PrivateBuffer((8,), "f4").copy_to(b)
    with pytest.raises(hl.InvalidHandle):
        hl.export_buffer(b)
    with pytest.raises((BufferError, hl.InvalidHandle)):
        memoryview(b)
    with pytest.raises(hl.InvalidHandle):
        b.release()
    # the stale handle is refused everywhere
    with pytest.raises(hl.InvalidHandle):
        hdom.import_buffer(b.handle)
    assert hdom.check() == []


def test_view_taken_before_release_stays_mapped(hdom: hl.Domain) -> None:
    b = hdom.buffer(4096)
    a = b.numpy()
    a[:] = 5
    b.release()
    # the block may be reused, but the memory stays mapped: no crash
    assert int(a[0]) in range(256)
    c = hdom.buffer(4096)
    c.numpy()[:] = 9
    c.release()
    del a


def test_forged_and_foreign_handles(hdom: hl.Domain, make_name: object) -> None:
    b = hdom.buffer(64)
    h = b.handle
    bad = [
        h ^ (1 << 24),  # another generation
        (h & ~(0xFF << 48)) | (1 << 48),  # the kind of a fence
        (h & ~0xFFFFFF) | 0xFFFFFF,  # slot index outside the table
        h ^ (0xFF << 56),  # another domain's tag
        12345,
        (1 << 64) - 1,
    ]
    for x in bad:
        with pytest.raises(hl.InvalidHandle):
            hdom.import_buffer(x)
    for x in (0, -1, 1 << 64, 1 << 70):
        with pytest.raises(hl.InvalidHandle):
            hdom.import_buffer(x)
    for x in (True, "1", 1.0, None):
        with pytest.raises(hl.InvalidHandle):
            hdom.import_buffer(x)  # type: ignore[arg-type]
    # a fence or a timeline is not a buffer, a buffer not a fence
    f, t = hdom.fence(), hdom.timeline()
    with pytest.raises(hl.InvalidHandle):
        hdom.import_buffer(f.handle)
    with pytest.raises(hl.InvalidHandle):
        hdom.import_buffer(t.handle)
    with pytest.raises(hl.InvalidHandle):
        hdom.import_fence(h)
    with pytest.raises(hl.InvalidHandle):
        hdom.import_timeline(h)
    f.signal()
    f.release()
    t.release()
    # a handle of another domain
    other = domain_of_another_tag(hdom, make_name, fences=256, heap="1M")  # type: ignore[arg-type]
    with other:
        ob = other.buffer(64)
        with pytest.raises(hl.InvalidHandle):
            hdom.import_buffer(ob.handle)
        with pytest.raises(hl.InvalidHandle):
            other.import_buffer(h)
        ob.release()
        assert other.check() == []
    b.release()
    assert used(hdom) == 0 and hdom.check() == []


def test_closed_domain(domain_name: str) -> None:
    d = hl.Domain.create(domain_name, fences=16, heap="1M")
    b = d.buffer(64)
    h = b.handle
    d.close()
    with pytest.raises(hl.DomainClosed):
        d.buffer(64)
    with pytest.raises(hl.DomainClosed):
        d.import_buffer(h)
    with pytest.raises(hl.DomainClosed):
        d.heap_stats()
    with pytest.raises(hl.DomainClosed):
        b.numpy()


# --------------------------------------------------------------------------- import, references


def test_import_in_second_participant(hdom: hl.Domain, hpeer: hl.Domain) -> None:
    b = hdom.buffer((16, 16), "<f8")
    b.numpy()[:] = np.arange(256).reshape(16, 16)
    c = hpeer.import_buffer(b.handle)
    for attr in ("handle", "shape", "dtype", "nbytes", "offset"):
        assert getattr(c, attr) == getattr(b, attr), attr
    assert np.array_equal(c.numpy(), b.numpy())
    c.numpy()[3, 4] = -1.0
    assert b.numpy()[3, 4] == -1.0
    # the block lives while anyone holds it
    n = used(hdom)
    b.release()
    assert used(hdom) == n
    assert c.numpy()[3, 4] == -1.0
    with pytest.raises(hl.InvalidHandle):
        b.numpy()
    # the releasing participant can import it again while the other holds it
    b2 = hdom.import_buffer(c.handle)
    c.release()
    assert used(hdom) == n
    b2.release()
    assert used(hdom) == 0
    with pytest.raises(hl.InvalidHandle):
        hpeer.import_buffer(b.handle)
    assert hdom.check() == [] and hpeer.check() == []


def test_import_twice_in_one_participant(hdom: hl.Domain) -> None:
    b = hdom.buffer(1000)
    c = hdom.import_buffer(b.handle)
    d = hdom.import_buffer(b.handle)
    b.release()
    c.release()
    assert used(hdom) == block_bytes(1000)
    d.numpy()[:] = 1
    d.release()
    assert used(hdom) == 0
    assert hdom.check() == []


def test_close_drops_references(hdom: hl.Domain) -> None:
    assert hdom.name is not None
    p = hl.Domain.open(hdom.name)
    big = p.buffer(1 << 18)  # noqa: F841 (held until close)
    kept = p.buffer(100)
    mine = hdom.import_buffer(kept.handle)
    assert used(hdom) == block_bytes(1 << 18) + block_bytes(100)
    p.close()
    assert used(hdom) == block_bytes(100)
    mine.release()
    assert used(hdom) == 0 and hdom.check() == []


# --------------------------------------------------------------------------- views


def test_numpy_views(hdom: hl.Domain) -> None:
    b = hdom.buffer((4, 8), "i4")
    a = b.numpy()
    a[:] = np.arange(32).reshape(4, 8)
    assert np.shares_memory(a, b.numpy())
    ro = b.numpy(readonly=True)
    assert not ro.flags.writeable
    with pytest.raises(ValueError):
        ro[0, 0] = 1
    a[0, 0] = 77
    assert ro[0, 0] == 77
    assert np.shares_memory(ro, a)
    # np.asarray shares the memory
    assert np.shares_memory(np.asarray(b), a)
    c = np.array(b, copy=True)
    assert not np.shares_memory(c, a)
    b.release()


def test_asarray_has_the_buffer_layout(hdom: hl.Domain) -> None:
    """``np.asarray(b)`` / ``np.array(b)`` give the buffer's shape and dtype (what
    ``Buffer.__array__`` returns), not a flat byte view."""
    b = hdom.buffer((4, 8), "i4")
    b.numpy()[:] = np.arange(32).reshape(4, 8)
    x = np.asarray(b)
    assert (x.shape, x.dtype) == ((4, 8), np.int32)
    assert np.array_equal(np.array(b), np.arange(32).reshape(4, 8))
    b.release()


def test_memoryview(hdom: hl.Domain) -> None:
    b = hdom.buffer((4, 4), "f4")
    m = memoryview(b)
    # typed like NumPy's own export: format, shape, itemsize
    assert m.nbytes == 64 and not m.readonly and m.contiguous
    assert (m.format, m.shape, m.itemsize) == (memoryview(np.empty(1, "f4")).format, (4, 4), 4)
    m[0, 1] = 2.5
    assert b.numpy()[0, 1] == 2.5
    raw = m.cast("B")
    raw[0:4] = np.float32(-4.0).tobytes()
    assert b.numpy()[0, 0] == -4.0
    b.numpy()[3, 3] = -1.0
    assert bytes(raw[60:64]) == np.float32(-1.0).tobytes()
    assert bytes(m) == b.numpy().tobytes()
    raw.release()
    m.release()
    ro = memoryview(b.numpy(readonly=True))
    assert ro.readonly
    b.release()


@pytest.mark.parametrize("dtype", ["u1", "<i2", ">u4", "<c16", "?", np.dtype([("x", "<f4"), ("y", "<i4")])])
def test_memoryview_formats(hdom: hl.Domain, dtype: object) -> None:
    b = hdom.buffer((2, 3), dtype)
    want = memoryview(np.empty((2, 3), dtype))  # type: ignore[call-overload]
    m = memoryview(b)
    assert (m.format, m.shape, m.itemsize, m.nbytes) == (want.format, want.shape, want.itemsize, want.nbytes)
    x = np.asarray(b)
    assert (x.shape, x.dtype) == ((2, 3), np.dtype(dtype))  # type: ignore[call-overload]
    assert np.shares_memory(x, b.numpy())
    m.release()
    b.release()


def test_dlpack_numpy_shares_both_ways(hdom: hl.Domain) -> None:
    b = hdom.buffer((3, 5), "<f8")
    assert b.__dlpack_device__() == (1, 0)
    x = np.from_dlpack(b)
    a = b.numpy()
    assert x.shape == (3, 5) and x.dtype == np.float64
    assert np.shares_memory(x, a)
    assert x.ctypes.data == np.frombuffer(hdom.raw(), np.uint8).ctypes.data + b.offset
    x[1, 2] = 42.0
    assert a[1, 2] == 42.0
    a[2, 4] = -7.0
    assert x[2, 4] == -7.0
    # versioned protocol
    caps = b.__dlpack__(max_version=(1, 0))
    assert type(caps).__name__ == "PyCapsule"
    b.release()


def test_dlpack_refusals(hdom: hl.Domain) -> None:
    b = hdom.buffer(64)
    with pytest.raises(BufferError):
        b.__dlpack__(stream=1)
    with pytest.raises(BufferError):
        b.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        b.__dlpack__(copy=True)
    b.__dlpack__(stream=None, dl_device=(1, 0), copy=False)
    b.release()


def test_dlpack_torch_shares_both_ways(hdom: hl.Domain) -> None:
    torch = pytest.importorskip("torch")
    b = hdom.buffer((4, 6), "f4")
    a = b.numpy()
    a[:] = np.arange(24, dtype="f4").reshape(4, 6)
    t = torch.from_dlpack(b)
    assert tuple(t.shape) == (4, 6) and t.dtype == torch.float32 and t.device.type == "cpu"
    assert t.data_ptr() == a.ctypes.data
    t[1, 1] = 100.0
    assert a[1, 1] == 100.0
    a[3, 5] = -3.0
    assert float(t[3, 5]) == -3.0
    # and back from torch into numpy through DLPack: still the heap's memory
    back = np.from_dlpack(t)
    assert back.ctypes.data == a.ctypes.data
    u = hdom.buffer((10,), "i8")
    torch.from_dlpack(u).fill_(11)
    assert (u.numpy() == 11).all()
    del t, back
    b.release()
    u.release()


# --------------------------------------------------------------------------- across processes

ZERO_COPY_CHILD = """
import numpy as np
d = hl.Domain.open(sys.argv[1], label="zero-copy-child")
b = d.import_buffer(int(sys.argv[2]))
v = b.numpy()                    # the child's views, taken once, before any write below
x = np.from_dlpack(b)
m = memoryview(b).cast("B")
base = np.frombuffer(d.raw(), np.uint8).ctypes.data
n = v.size
ok = bool((v == np.arange(n, dtype=np.uint32)).all())
print("imported", b.offset, b.nbytes, str(b.dtype), int(v.ctypes.data - base), int(ok), flush=True)
assert sys.stdin.readline().strip() == "write"
v[:1024] = 0xABCD0000 + np.arange(1024, dtype=np.uint32)     # through the NumPy view
m[4096 * 4:4096 * 4 + 4] = np.uint32(0x5EED).tobytes()      # through the buffer protocol
print("written", flush=True)
assert sys.stdin.readline().strip() == "check"
tail = v[-1024:]
print("seen", int((tail == 7).all()), int(x[-1]), os.pread(d.fileno(), 4, b.offset + b.nbytes - 4).hex(),
      flush=True)
b.release()
d.close()
"""


def test_cross_process_zero_copy(hdom: hl.Domain) -> None:
    n = 1 << 20  # 4 MiB of u32: a large (page aligned) block
    b = hdom.buffer((n,), np.uint32)
    view = b.numpy()  # the parent's view, taken once
    view[:] = np.arange(n, dtype=np.uint32)
    base = np.frombuffer(hdom.raw(), np.uint8).ctypes.data
    child = spawn_child(ZERO_COPY_CHILD, hdom.name, b.handle)
    try:
        word, off, nbytes, dtype, rel, ok = read_line(child).split()
        assert word == "imported"
        # same bytes at the same domain offset in both processes
        assert int(off) == b.offset == int(rel) == view.ctypes.data - base
        assert int(nbytes) == b.nbytes and dtype == "uint32"
        assert ok == "1", "the child did not see the parent's data"
        send_line(child, "write")
        assert read_line(child) == "written"
        # the child's writes, read through the parent's view taken before them
        assert np.array_equal(view[:1024], 0xABCD0000 + np.arange(1024, dtype=np.uint32))
        assert view[4096] == 0x5EED
        assert raw_bytes(hdom, b.offset, 8) == view[:2].tobytes()
        # and the other way round
        view[-1024:] = 7
        send_line(child, "check")
        word, all7, last, raw = read_line(child).split()
        assert (word, all7, last) == ("seen", "1", "7")
        assert bytes.fromhex(raw) == np.uint32(7).tobytes()
        finish_child(child)
    finally:
        kill_child(child)
    assert view[1024] == 1024  # untouched part still the parent's data
    b.release()
    assert used(hdom) == 0 and hdom.check() == []


FD_CHILD = """
import json, socket
import numpy as np
s = socket.socket(fileno=int(sys.argv[1]))
payload, fds = hl.recv_fds(s)
meta = json.loads(payload)
eb = hl.ExternalBuffer.from_fd(fds[0], tuple(meta["shape"]), meta["dtype"], offset=meta["offset"], take=True)
a = eb.numpy()
print("sum", int(a.astype(np.int64).sum()), flush=True)
assert sys.stdin.readline().strip() == "write"
a[:] = a * 2 + 1
print("written", flush=True)
assert sys.stdin.readline().strip() == "check"
print("first", int(a.reshape(-1)[0]), flush=True)
eb.close()
s.close()
"""


def _fd_child(sock: socket.socket) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", child_code(FD_CHILD), str(sock.fileno())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        pass_fds=[sock.fileno()],
    )


def _fd_roundtrip(arr: np.ndarray, fd: int, offset: int) -> None:
    """Send ``fd`` to a child that maps ``arr``'s layout at ``offset``; check both directions."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = _fd_child(theirs)
    theirs.close()
    try:
        expect = int(arr.astype(np.int64).sum())
        meta = {"shape": list(arr.shape), "dtype": arr.dtype.str, "offset": offset}
        hl.send_fds(mine, [fd], json.dumps(meta).encode())
        assert read_line(child) == f"sum {expect}"
        before = arr.copy()
        send_line(child, "write")
        assert read_line(child) == "written"
        assert np.array_equal(arr, before * 2 + 1)
        arr.reshape(-1)[0] = 99
        send_line(child, "check")
        assert read_line(child) == "first 99"
        finish_child(child)
    finally:
        kill_child(child)
        mine.close()


def test_memfd_buffer_across_processes() -> None:
    eb = hl.memfd_buffer((64, 64), "i4")
    assert isinstance(eb, hl.ExternalBuffer) and eb.fd >= 0
    assert eb.shape == (64, 64) and eb.dtype == np.int32 and eb.nbytes == 64 * 64 * 4
    a = eb.numpy()
    a[:] = np.arange(64 * 64).reshape(64, 64)
    assert np.shares_memory(np.from_dlpack(eb), a)
    _fd_roundtrip(a, eb.fd, 0)
    eb.close()
    assert eb.fd == -1


@pytest.mark.parametrize("nbytes", [100, 1 << 17])
def test_export_buffer_across_processes(hdom: hl.Domain, nbytes: int) -> None:
    b = hdom.buffer((nbytes // 4,), "<u4")
    a = b.numpy()
    a[:] = np.arange(a.size, dtype=np.uint32)
    fd, offset, n = hl.export_buffer(b, writable=True)  # the peer writes too
    try:
        assert offset == b.offset and n == b.nbytes
        if nbytes >= LARGE:
            assert offset % PAGE == 0
        assert fd != hdom.fileno()
        _fd_roundtrip(a, fd, offset)
    finally:
        os.close(fd)
    b.release()
    assert hdom.check() == []


def test_external_buffer_from_fd() -> None:
    eb = hl.memfd_buffer(8192)
    eb.numpy()[:] = 3
    # dup (take=False): closing the new object leaves the original fd open
    view = hl.ExternalBuffer.from_fd(eb.fd, (1024,), "u1", offset=100)
    assert view.offset == 100 and (view.numpy() == 3).all()
    view.numpy()[0] = 4
    assert eb.numpy()[100] == 4
    view.close()
    os.fstat(eb.fd)
    ro = hl.ExternalBuffer.from_fd(eb.fd, 16, readonly=True)
    assert not ro.numpy().flags.writeable
    with pytest.raises((ValueError, TypeError)):
        memoryview(ro)[0] = 1
    ro.close()
    with pytest.raises(ValueError):
        hl.ExternalBuffer.from_fd(eb.fd, 8193)
    with pytest.raises(ValueError):
        hl.ExternalBuffer.from_fd(eb.fd, 16, offset=8190)
    with pytest.raises(ValueError):
        hl.ExternalBuffer.from_fd(eb.fd, 16, offset=-1)
    with pytest.raises(ValueError):
        hl.ExternalBuffer.from_fd(eb.fd, 0)
    with pytest.raises(TypeError):
        hl.ExternalBuffer()
    with eb:
        pass
    assert eb.fd == -1


def test_export_buffer_refusals(hdom: hl.Domain) -> None:
    with pytest.raises(TypeError):
        hl.export_buffer(np.zeros(4))
    with pytest.raises(TypeError):
        hl.export_buffer(hl.PrivateBuffer(4))


def test_send_fds_refusals() -> None:
    a, b = socket.socketpair(socket.AF_UNIX)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as inet:
        with pytest.raises(ValueError):
            hl.send_fds(inet, [0])
    a.close()
    with pytest.raises(EOFError):
        hl.recv_fds(b)
    b.close()


def test_dma_heap_absent_is_a_clear_error() -> None:
    if os.path.exists("/dev/dma_heap/system"):
        pytest.skip("/dev/dma_heap/system exists: test_dma_heap_buffer exercises it")
    with pytest.raises(FileNotFoundError):
        hl.dma_heap_buffer(4096)


def test_dma_heap_buffer() -> None:
    if not os.path.exists("/dev/dma_heap/system"):
        pytest.skip("no /dev/dma_heap/system on this machine (a kernel with the dma-buf system heap has it)")
    try:
        eb = hl.dma_heap_buffer((1024,), "u4")
    except PermissionError:
        pytest.skip("no permission on /dev/dma_heap/system")
    eb.numpy()[:] = 5
    assert (eb.numpy() == 5).all()
    eb.close()


# --------------------------------------------------------------------------- the copy baseline


def test_private_buffer_views() -> None:
    p = hl.PrivateBuffer((3, 4), "f4")
    assert p.shape == (3, 4) and p.dtype == np.float32 and p.nbytes == 48
    a = p.numpy()
    a[:] = 1.5
    assert np.shares_memory(np.from_dlpack(p), a)
    assert bytes(memoryview(p)) == a.tobytes()
    with pytest.raises(ValueError):
        hl.PrivateBuffer(0)
    with pytest.raises(ValueError):
        hl.PrivateBuffer(4, "nonsense")


def test_copy_to(hdom: hl.Domain) -> None:
    src = hl.PrivateBuffer((256,), "f8")
    src.numpy()[:] = np.arange(256)
    staging = hdom.buffer((256,), "f8")
    src.copy_to(staging)
    assert np.array_equal(staging.numpy(), np.arange(256))
    # copy_to copies bytes: a different dtype of the same size is fine
    dst = hl.PrivateBuffer((512,), "i4")
    staging.copy_to(dst)
    assert dst.numpy().tobytes() == staging.numpy().tobytes()
    # into an ndarray, and from a buffer into another buffer
    nd = np.zeros((16, 16), "f8")
    staging.copy_to(nd)
    assert np.array_equal(nd.reshape(-1), np.arange(256))
    other = hdom.buffer(2048)
    staging.copy_to(other)
    assert other.numpy().tobytes() == staging.numpy().tobytes()
    # the copy is a copy: later writes do not travel
    src.numpy()[0] = -1
    assert staging.numpy()[0] == 0
    staging.release()
    other.release()


def test_copy_to_size_mismatch(hdom: hl.Domain) -> None:
    src = hl.PrivateBuffer(100)
    b = hdom.buffer(101)
    with pytest.raises(ValueError, match="size mismatch"):
        src.copy_to(b)
    with pytest.raises(ValueError, match="size mismatch"):
        b.copy_to(src)
    with pytest.raises(ValueError, match="size mismatch"):
        b.copy_to(np.zeros(100, "u1"))
    with pytest.raises(ValueError, match="size mismatch"):
        src.copy_to(np.zeros(0, "u1"))
    ro = np.zeros(100, "u1")
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        src.copy_to(ro)
    b.release()


def test_copy_to_non_contiguous_destination() -> None:
    """copy_to into a non-contiguous array must copy every byte or refuse; never copy
    into a temporary and leave the destination unchanged."""
    src = hl.PrivateBuffer(64, "u1")
    src.numpy()[:] = 7
    dst = np.zeros((4, 32), "u1")[:, :16]  # 64 bytes, rows not adjacent
    assert dst.nbytes == 64 and not dst.flags.c_contiguous
    try:
        src.copy_to(dst)
    except ValueError:
        return  # refusing is fine
    assert (dst == 7).all(), "copy_to reported success but the destination was not written"


# --------------------------------------------------------------------------- heap statistics


def test_heap_stats_and_fragmentation(hdom: hl.Domain) -> None:
    st = hdom.heap_stats()
    keys = {"size", "used", "free", "largest_free", "free_runs", "fragmentation", "allocs", "repairs"}
    assert keys <= set(st)
    assert (st["used"], st["free"], st["largest_free"], st["free_runs"]) == (0, HEAP, HEAP, 1)
    assert st["fragmentation"] == 0.0
    allocs0 = st["allocs"]
    blk = block_bytes(LARGE)  # 68 KiB: consecutive large blocks pack exactly (page multiples)
    bs = [hdom.buffer(LARGE) for _ in range(8)]
    st = hdom.heap_stats()
    assert st["used"] == 8 * blk and st["free"] == HEAP - 8 * blk
    assert st["free_runs"] == 1 and st["fragmentation"] == 0.0
    assert st["allocs"] == allocs0 + 8
    for i in (1, 3, 5):
        bs[i].release()
    st = hdom.heap_stats()
    tail = HEAP - 8 * blk
    assert st["used"] == 5 * blk
    assert st["free"] == HEAP - 5 * blk
    assert st["free_runs"] == 4
    assert st["largest_free"] == tail
    assert st["fragmentation"] == pytest.approx(1 - tail / (HEAP - 5 * blk))
    # freeing a neighbour merges runs
    bs[2].release()
    st = hdom.heap_stats()
    assert st["free_runs"] == 3 and st["free"] == HEAP - 4 * blk
    # placement policy: large blocks are packed from the top of the heap down,
    # small ones first-fit from the bottom, so a small buffer lands below them all
    assert all(bs[i].offset > bs[i + 1].offset for i in (4, 6))
    small = hdom.buffer(100)
    assert small.offset < min(bs[i].offset for i in (0, 4, 6, 7))
    small.release()
    # a large buffer reuses the highest hole that fits (the 3-block hole left by 1, 2, 3)
    again = hdom.buffer(LARGE)
    assert bs[4].offset < again.offset < bs[0].offset
    again.release()
    for i in (0, 4, 6, 7):
        bs[i].release()
    st = hdom.heap_stats()
    assert (st["used"], st["free"], st["largest_free"], st["free_runs"], st["fragmentation"]) == (
        0,
        HEAP,
        HEAP,
        1,
        0.0,
    )
    assert st["repairs"] == 0
    assert hdom.check() == []


def test_full_heap_then_free(hdom: hl.Domain) -> None:
    bs = []
    while True:
        try:
            bs.append(hdom.buffer(LARGE))
        except hl.OutOfMemory:
            break
    st = hdom.heap_stats()
    assert len(bs) == HEAP // block_bytes(LARGE)
    assert st["largest_free"] < block_bytes(LARGE)
    assert st["used"] == len(bs) * block_bytes(LARGE)
    assert hdom.check() == []
    for b in bs[::2]:
        b.release()
    for b in bs[1::2]:
        b.release()
    assert used(hdom) == 0 and hdom.check() == []


# --------------------------------------------------------------------------- a killed participant

KILLED_CHILD = """
import numpy as np
d = hl.Domain.open(sys.argv[1], label="victim", watchdog_interval=0)
parent_buf = d.import_buffer(int(sys.argv[2]))
mine = [d.buffer(n) for n in (64, 1000, 5000, 1 << 16, 1 << 20)]
shared = d.buffer((4096,), "u2")
shared.numpy()[:] = np.arange(4096, dtype=np.uint16)
for b in mine:
    b.numpy()[:] = 0xEE
print("ready", shared.handle, flush=True)
time.sleep(60)
"""


def test_killed_participant_buffers_reclaimed(hdom: hl.Domain) -> None:
    keep = hdom.buffer((1 << 16,), "u1")
    keep.numpy()[:] = np.arange(1 << 16, dtype=np.uint64).astype(np.uint8)
    before = used(hdom)
    child = spawn_child(KILLED_CHILD, hdom.name, keep.handle)
    try:
        word, h = read_line(child).split()
        assert word == "ready"
        extra = sum(block_bytes(n) for n in (64, 1000, 5000, 1 << 16, 1 << 20))
        assert used(hdom) == before + extra + block_bytes(8192)
        # the parent holds one of the child's buffers: it must survive the child
        theirs = hdom.import_buffer(int(h))
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        kill_child(child)
    time.sleep(0.2)
    hdom.reap()
    assert wait_until(lambda: used(hdom) == before + block_bytes(8192), 5.0), hdom.heap_stats()
    assert hdom.check() == []
    assert len(hdom.participants) == 1
    assert np.array_equal(theirs.numpy(), np.arange(4096, dtype=np.uint16))
    assert np.array_equal(keep.numpy(), np.arange(1 << 16, dtype=np.uint64).astype(np.uint8))
    theirs.release()
    assert used(hdom) == before
    keep.release()
    assert used(hdom) == 0 and hdom.check() == []


LOCK_CHILD = """
d = hl.Domain.open(sys.argv[1], label="lock-holder", watchdog_interval=0)
b = d.buffer(int(sys.argv[2]))
hl._core.testing.heap_lock_forever(d._core)
print("locked", flush=True)
os.kill(os.getpid(), 9)
"""


@needs_test_hooks
@pytest.mark.parametrize("watchdog", [True, False])
def test_heap_lock_of_dead_holder_is_broken(make_name: object, watchdog: bool) -> None:
    name = make_name()  # type: ignore[operator]
    with hl.Domain.create(name, fences=64, heap="4M", watchdog_interval=0.02 if watchdog else 0) as d:
        keep = d.buffer(3000)
        before, repairs = used(d), d.heap_stats()["repairs"]
        child = spawn_child(LOCK_CHILD, name, 200_000)
        try:
            assert read_line(child) == "locked"
            child.wait(10)
            assert child.returncode == -signal.SIGKILL
        finally:
            kill_child(child)
        if watchdog:
            time.sleep(0.2)  # the watchdog recovers the child and breaks its lock
        # the next allocation breaks the lock if nobody did yet, and rebuilds the bitmap
        b = d.buffer(5000)
        b.release()
        d.reap()
        assert d.heap_stats()["repairs"] == repairs + 1
        assert wait_until(lambda: used(d) == before, 5.0), d.heap_stats()
        assert d.check() == []
        keep.release()
        assert used(d) == 0 and d.check() == []


# --------------------------------------------------------------------------- hostless info


def test_cli_info_heap_section(hdom: hl.Domain, capsys: pytest.CaptureFixture[str]) -> None:
    from hostless.cli import main

    assert hdom.name is not None
    bs = [hdom.buffer(LARGE) for _ in range(4)]
    bs[1].release()
    assert main(["info", hdom.name, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    heap = info["heap"]
    st = hdom.heap_stats()
    for k in ("size", "used", "free", "largest_free", "free_runs", "repairs"):
        assert heap[k] == st[k], k
    assert heap["fragmentation"] == pytest.approx(st["fragmentation"])
    assert heap["buffers"] == 3
    assert main(["--plain", "info", hdom.name]) == 0
    out = capsys.readouterr().out
    assert "heap" in out and "fragmentation" in out and "largest free run" in out
    for b in bs[:1] + bs[2:]:
        b.release()


def test_cli_info_without_heap(domain_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from hostless.cli import main

    with hl.Domain.create(domain_name, fences=16, device_heaps={}):
        assert main(["info", domain_name, "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["heap"]["size"] == 0 and info["device_heaps"] == []
        assert main(["--plain", "info", domain_name]) == 0
        out = capsys.readouterr().out
        assert "no heap" in out and "device heaps: none" in out


def test_cli_info_metadata_heap(domain_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A default domain (device heap cuda:0, no heap=) has a small heap for device buffers'
    metadata only: info says so, and counts device buffers under their device."""
    from hostless.cli import main

    with hl.Domain.create(domain_name, fences=16) as d:
        b = d.buffer((10, 10), "f4", device="cuda:0")
        assert main(["info", domain_name, "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["heap"]["metadata_only"] is True and info["heap"]["buffers"] == 0
        (dh,) = info["device_heaps"]
        assert dh["name"] == "cuda:0" and dh["buffers"] == 1 and dh["used"] == 512 and dh["granule"] == 256
        assert info["live"]["buffer"] == {"in cuda:0": 1}
        assert main(["--plain", "info", domain_name]) == 0
        out = capsys.readouterr().out
        assert "metadata of device buffers only" in out and "cuda:0" in out
        b.release()
