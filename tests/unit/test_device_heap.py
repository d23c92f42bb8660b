"""Device heaps in the domain's bookkeeping (ABI v4): buffers placed in GPU memory
(``Domain.buffer(..., device="cuda:N")``) whose handles, references and recovery are
those of host buffers.  No GPU is needed: to the engine a device heap is an address
range it allocates extents from; these tests check the bookkeeping (placement,
extents, bitmaps, locks, recovery, hostile descriptors), never device memory.
"""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

import hostless as hl
from conftest import (
    kill_child,
    needs_test_hooks,
    read_line,
    run_child,
    spawn_child,
    unique_name,
    unlink_quietly,
    wait_until,
)
from hostless import lowlevel
from hostless._abi import DEVHEAP_DTYPE, FENCE_DTYPE, C

G = int(C.DEVICE_GRANULE)
MIB = 1 << 20


def dev_used(d: hl.Domain, device: str = "cuda:0") -> int:
    return int(d.heap_stats(device)["used"])


def extents(bufs: list[hl.Buffer]) -> list[tuple[int, int]]:
    out = []
    for b in bufs:
        assert b.device_offset is not None
        out.append((b.device_offset, -(-b.nbytes // G) * G))
    return sorted(out)


def assert_disjoint(ext: list[tuple[int, int]], size: int) -> None:
    end = 0
    for off, n in ext:
        assert off % G == 0 and off >= end and off + n <= size, ext
        end = off + n


# --------------------------------------------------------------------------- creation


def test_default_domain_has_cuda0(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=64) as d:
        assert d.devices == ["cuda:0"]
        (dh,) = lowlevel.device_heaps(d)
        assert (dh.name, dh.heap_index, dh.kind, dh.ordinal) == ("cuda:0", 0, int(C.DEVICE_CUDA), 0)
        assert (dh.size, dh.granule, dh.used, dh.allocs, dh.repairs) == (256 * MIB, G, 0, 0, 0)
        assert d.capacity["heap"] == 0  # the small heap holds device buffers' metadata only
        # 5: watch nodes (issue 27); 6: reached points, OWNER_LEFT, and watch lists (issue 27)
        assert d.header()["abi_version"] == 6


def test_device_heaps_argument(domain_name: str) -> None:
    spec = {"cuda:3": 1, "cuda:0": "3M", "cuda:255": 2 * MIB}
    with hl.Domain.create(domain_name, fences=64, heap="1M", device_heaps=spec) as d:
        assert d.devices == ["cuda:3", "cuda:0", "cuda:255"]
        assert [(h.name, h.ordinal, h.size) for h in lowlevel.device_heaps(d)] == [
            ("cuda:3", 3, 2 * MIB),
            ("cuda:0", 0, 4 * MIB),  # rounded up to 2 MiB
            ("cuda:255", 255, 2 * MIB),
        ]
        assert d.heap_stats()["size"] == 1 << 20 and d.capacity["heap"] > 1 << 20
        b = d.buffer(100, device="cuda:255")
        assert (b.device, b.device_heap, b.__dlpack_device__()) == ("cuda:255", 2, (int(C.DEVICE_CUDA), 255))
        b.release()
    unlink_quietly(domain_name)
    with hl.Domain.create(domain_name, fences=64, device_heaps={}) as d:
        assert d.devices == [] and lowlevel.device_heaps(d) == []
        with pytest.raises(ValueError, match="no device heap for cuda:0"):
            d.buffer(16, device="cuda:0")


@pytest.mark.parametrize(
    "spec, err",
    [
        ({"cpu": 1 << 20}, ValueError),
        ({"cuda:x": 1 << 20}, ValueError),
        ({"gpu:0": 1 << 20}, ValueError),
        ({"cuda:256": 1 << 20}, ValueError),
        ({"cuda:0": 0}, ValueError),
        ({"cuda:0": (1 << 40) + 1}, ValueError),
        ({"cuda:0": "lots"}, ValueError),
        ({f"cuda:{i}": 1 for i in range(9)}, ValueError),
        ({"cuda:0": 1, "cuda:000": 1}, ValueError),
        ([("cuda:0", 1)], TypeError),
        ({0: 1}, TypeError),
    ],
)
def test_bad_device_heaps(domain_name: str, spec: object, err: type[Exception]) -> None:
    with pytest.raises(err):
        hl.Domain.create(domain_name, device_heaps=spec)  # type: ignore[arg-type]
    assert not os.path.exists(f"/dev/shm/{domain_name}")


def test_unknown_devices(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=64) as d:
        for dev in ("cuda:1", "cuda", "gpu", "CUDA:0", "cuda:-1", ""):
            with pytest.raises(ValueError) as e:
                d.buffer(16, device=dev)
            assert dev in str(e.value) or "device" in str(e.value)
        with pytest.raises(TypeError):
            d.buffer(16, device=0)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            d.heap_stats("cuda:7")
        assert d.check() == []


# --------------------------------------------------------------------------- allocation


def test_alloc_free_reuse(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=256, device_heaps={"cuda:0": "8M"}) as d:
        sizes = [1, 255, 256, 257, 4096, 65536, 100_000, 1 << 20, 3]
        bufs = [d.buffer((n,), "u1", device="cuda:0") for n in sizes]
        assert_disjoint(extents(bufs), 8 * MIB)
        assert dev_used(d) == sum(n for _, n in extents(bufs))
        assert d.check() == []
        for b, n in zip(bufs, sizes, strict=True):
            assert (b.device, b.nbytes, b.shape, b.dtype) == ("cuda:0", n, (n,), np.dtype("u1"))
        # typed shapes round-trip through the metadata block
        t = d.buffer((3, 5, 7), "<f8", device="cuda:0")
        assert (t.shape, t.dtype, t.nbytes) == ((3, 5, 7), np.dtype("<f8"), 3 * 5 * 7 * 8)
        t2 = d.import_buffer(t.handle)
        assert (t2.shape, t2.dtype, t2.device_offset, t2.device) == (
            t.shape,
            t.dtype,
            t.device_offset,
            "cuda:0",
        )
        t2.release()
        t.release()
        # freeing one small buffer and allocating the same size reuses its extent (first fit from the hint)
        off = bufs[1].device_offset
        bufs[1].release()
        again = d.buffer(255, device="cuda:0")
        assert again.device_offset == off
        bufs[1] = again
        for b in bufs:
            b.release()
        assert dev_used(d) == 0 and d.heap_stats()["used"] == 0
        st = d.heap_stats("cuda:0")
        assert st["free_runs"] == 1 and st["largest_free"] == 8 * MIB
        # the whole heap in one buffer
        whole = d.buffer(8 * MIB, device="cuda:0")
        assert whole.device_offset == 0
        whole.release()
        assert d.check() == []


def test_full_device_heap(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=256, device_heaps={"cuda:1": "2M"}) as d:
        meta0 = d.heap_stats()["used"]
        held = [d.buffer(512 * 1024, device="cuda:1") for _ in range(4)]
        with pytest.raises(hl.DeviceHeapFull) as e:
            d.buffer(1, device="cuda:1")
        assert "cuda:1" in str(e.value) and "0 of 2097152 bytes free" in str(e.value)
        assert isinstance(e.value, hl.OutOfMemory)
        with pytest.raises(hl.DeviceHeapFull, match="cuda:1"):
            d.buffer(3 * MIB, device="cuda:1")  # larger than the heap
        # failures gave their metadata block and slot back
        assert d.heap_stats()["used"] == meta0 + 4 * 128
        assert d.check() == []
        held.pop(2).release()
        with pytest.raises(hl.DeviceHeapFull, match="no free run"):
            d.buffer(512 * 1024 + 1, device="cuda:1")
        held.append(d.buffer(512 * 1024, device="cuda:1"))
        for b in held:
            b.release()
        assert dev_used(d, "cuda:1") == 0 and d.heap_stats()["used"] == meta0
        assert d.check() == []


def test_metadata_heap_full(domain_name: str) -> None:
    """Device buffers need a 128-byte metadata block: a full host heap is OutOfMemory, not a leak."""
    with hl.Domain.create(domain_name, fences=8192, device_heaps={"cuda:0": "2M"}) as d:
        held = []
        with pytest.raises(hl.OutOfMemory, match="metadata"):
            for _ in range(4096):
                held.append(d.buffer(1, device="cuda:0"))
        assert len(held) == 2048  # 256 KiB / 128 B
        assert dev_used(d) == len(held) * G
        assert d.check() == []
        for b in held:
            b.release()
        assert dev_used(d) == 0 and d.check() == []


def test_host_access_to_device_buffer(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=64, heap="1M") as d:
        b = d.buffer((4, 4), "f4", device="cuda:0")
        h = d.buffer((4, 4), "f4")
        for access in (
            b.numpy,
            lambda: np.asarray(b),
            lambda: np.array(b),
            lambda: memoryview(b),
            lambda: bytes(b),
            lambda: b.copy_to(h),
            lambda: h.copy_to(b),
            lambda: b.offset,
        ):
            with pytest.raises(hl.DeviceBufferError) as e:
                access()
            assert "cuda:0" in str(e.value) and "to_host()" in str(e.value)
            assert isinstance(e.value, BufferError) and isinstance(e.value, hl.HostlessError)
        assert b.__dlpack_device__() == (2, 0) and h.__dlpack_device__() == (1, 0)
        assert (h.device, h.device_offset, h.device_heap) == ("cpu", None, None)
        assert b.device_offset == 0 and "device=cuda:0" in repr(b)
        b.release()
        assert "released" in repr(b)
        h.release()
        assert d.check() == []


def test_names_lookup_and_second_process(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=64, device_heaps={"cuda:0": "4M", "cuda:1": "2M"}) as d:
        pad = d.buffer(1000, device="cuda:1")
        b = d.buffer((6, 7), "<i2", device="cuda:1")
        d.publish("dev-b", b)
        same = d.lookup("dev-b")
        assert (same.device, same.device_offset, same.shape, same.dtype) == (
            "cuda:1",
            1024,
            (6, 7),
            np.dtype("<i2"),
        )
        same.release()
        child = spawn_child(
            """
            import json
            d = hl.Domain.open(sys.argv[1])
            b = d.lookup("dev-b")
            c = d.import_buffer(b.handle)
            mine = d.buffer((3,), "<f8", device="cuda:0")
            d.publish("from-child", mine)
            try:
                b.numpy()
                err = None
            except hl.DeviceBufferError as e:
                err = str(e)
            print(json.dumps([b.device, b.device_offset, list(b.shape), b.dtype.str, c.device_offset,
                              list(b.__dlpack_device__()), mine.handle, mine.device_offset, err]))
            sys.stdin.readline()
            """,
            domain_name,
        )
        try:
            dev, off, shape, dt, off2, dl, mh, moff, err = json.loads(read_line(child))
            assert (dev, off, shape, dt, off2, dl) == ("cuda:1", 1024, [6, 7], "<i2", 1024, [2, 1])
            assert err is not None and "cuda:1" in err
            theirs = d.import_buffer(mh)
            assert (theirs.device, theirs.device_offset, theirs.shape, theirs.dtype) == (
                "cuda:0",
                moff,
                (3,),
                np.dtype("<f8"),
            )
        finally:
            kill_child(child)
        # the child was killed holding its buffer and a reference to ours: recovery drops both
        d.reap()
        assert dev_used(d, "cuda:0") == G  # the child's buffer lives on: we hold it
        theirs.release()
        assert dev_used(d, "cuda:0") == 0
        b.release()
        pad.release()
        assert dev_used(d, "cuda:1") == 0 and d.check() == []


# --------------------------------------------------------------------------- recovery


def test_sigkilled_participant_device_buffers_reclaimed(domain_name: str) -> None:
    with hl.Domain.create(
        domain_name, fences=256, heap="1M", device_heaps={"cuda:0": "4M", "cuda:2": "2M"}
    ) as d:
        keep = d.buffer(5000, device="cuda:2")
        child = spawn_child(
            """
            d = hl.Domain.open(sys.argv[1], watchdog_interval=0)
            sizes = [(1, "cuda:0"), (70000, "cuda:0"), (3 << 20, "cuda:0"), (100, "cuda:2"), (4096, "cuda:2")]
            held = [d.buffer((n,), "u1", device=dev) for n, dev in sizes]
            held.append(d.buffer(300))  # and a host buffer
            theirs = d.import_buffer(int(sys.argv[2]))
            print("ready", sum(b.nbytes for b in held))
            sys.stdin.readline()
            """,
            domain_name,
            keep.handle,
        )
        try:
            assert read_line(child).startswith("ready")
            assert dev_used(d, "cuda:0") > 3 << 20 and dev_used(d, "cuda:2") > 5000
        finally:
            kill_child(child)
        assert wait_until(lambda: len(d.participants) == 1 or bool(d.reap()), 5.0)
        d.reap()
        assert len(d.participants) == 1
        assert dev_used(d, "cuda:0") == 0
        assert dev_used(d, "cuda:2") == -(-5000 // G) * G  # ours survives, its reference dropped
        assert d.check() == []
        keep.release()
        assert dev_used(d, "cuda:2") == 0 and d.heap_stats()["used"] == 0 and d.check() == []


@needs_test_hooks
def test_killed_inside_a_device_allocation(domain_name: str) -> None:
    """A participant killed after taking the metadata block, or after the device extent too,
    before the buffer is published: its ALLOC slot is freed by recovery with both extents."""
    with hl.Domain.create(domain_name, fences=64, device_heaps={"cuda:0": "2M"}) as d:
        meta0 = d.heap_stats()["used"]
        for stage in (1, 2):
            child = spawn_child(
                """
                d = hl.Domain.open(sys.argv[1], watchdog_interval=0)
                hl._core.testing.device_buffer_stuck(d._core, 0, 100_000, int(sys.argv[2]))
                print("stuck")
                sys.stdin.readline()
                """,
                domain_name,
                stage,
            )
            try:
                assert read_line(child) == "stuck"
                assert d.heap_stats()["used"] == meta0 + 128
                assert dev_used(d) == (-(-100_000 // G) * G if stage == 2 else 0)
                assert any("stuck in a transient state 1" in p for p in d.check(settle=0))
            finally:
                kill_child(child)
            assert wait_until(lambda: len(d.participants) == 1 or bool(d.reap()), 5.0)
            assert d.heap_stats()["used"] == meta0 and dev_used(d) == 0
            assert d.check() == []


@needs_test_hooks
def test_device_lock_holder_killed(domain_name: str) -> None:
    """A participant SIGKILLed holding a device heap's lock: the next allocator breaks the
    lock and rebuilds that heap's bitmap from the slots (the other heap is untouched)."""
    with hl.Domain.create(domain_name, fences=256, device_heaps={"cuda:0": "4M", "cuda:1": "2M"}) as d:
        mine = [d.buffer(n, device="cuda:1") for n in (300, 5000, 70000)]
        offs = [b.device_offset for b in mine]
        other = d.buffer(1000, device="cuda:0")
        child = spawn_child(
            """
            d = hl.Domain.open(sys.argv[1], watchdog_interval=0)
            held = [d.buffer(n, device="cuda:1") for n in (1000, 20000)]  # dies holding these too
            hl._core.testing.heap_lock_forever(d._core, 1)
            print("locked")
            os.kill(os.getpid(), 9)
            """,
            domain_name,
        )
        assert read_line(child) == "locked"
        child.wait(10)
        assert child.returncode == -signal.SIGKILL
        r0 = lowlevel.device_heaps(d)
        assert r0[1].repairs == 1  # the stats read itself broke the lock
        assert r0[0].repairs == 0
        d.reap()
        extra = d.buffer(2000, device="cuda:1")
        assert extra.device_offset not in offs
        assert [b.device_offset for b in mine] == offs
        assert d.check() == []
        assert dev_used(d, "cuda:1") == sum(-(-b.nbytes // G) * G for b in [*mine, extra])
        for b in [*mine, extra, other]:
            b.release()
        assert dev_used(d, "cuda:1") == 0 and dev_used(d, "cuda:0") == 0 and d.check() == []


def test_device_lock_kept_by_live_holder(domain_name: str) -> None:
    """A device-heap lock word naming a live participant that never lets go: an allocation
    fails after the bounded wait with an error naming the device, the host heap still works."""
    with hl.Domain.create(
        domain_name, fences=64, heap="64K", device_heaps={"cuda:0": "2M", "cuda:5": "2M"}
    ) as d:
        desc = int(d.header()["devheap_offset"]) + 1 * int(C.DEVHEAP_SIZE)
        d.raw()[desc + int(C.DH_LOCK) : desc + int(C.DH_LOCK) + 8] = lowlevel_owner(d).to_bytes(8, "little")
        t0 = time.monotonic()
        with pytest.raises(hl.HostlessError, match="device heap cuda:5 is locked by participant"):
            d.buffer(10, device="cuda:5")
        assert time.monotonic() - t0 >= 1.5
        d.buffer(10, device="cuda:0").release()
        d.buffer(10).release()
        d.raw()[desc + int(C.DH_LOCK) : desc + int(C.DH_LOCK) + 8] = bytes(8)
        d.buffer(10, device="cuda:5").release()
        assert d.check() == []


def lowlevel_owner(d: hl.Domain) -> int:
    """This participant's owner code (HL_OWNER): what a lock word holds while it is the holder."""
    from hostless._abi import owner_code

    return owner_code(d.participant_id)


# --------------------------------------------------------------------------- hostile memory

HOSTILE = """
import os
from hostless._abi import C
name = sys.argv[1]
d = hl.Domain.create(name, fences=64, device_heaps={"cuda:0": "4M", "cuda:1": "2M"})
h = d.header()
roff, rsize = int(h["devheap_offset"]), int(h["devheap_size"])
D = int(C.DEVHEAP_SIZE)
d.close()  # the file stays: every case below changes it and opens it again
fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
orig = os.pread(fd, os.fstat(fd).st_size, 0)

def put(off, value, size=8):
    os.pwrite(fd, value.to_bytes(size, "little"), off)

def bm(i):
    return int.from_bytes(orig[roff + i * D + int(C.DH_BITMAP_OFFSET):][:8], "little")

cases = {
    "count 9": [(int(C.H_DEVHEAP_COUNT), 9, 4)],
    "count 3": [(int(C.H_DEVHEAP_COUNT), 3, 4)],
    "count 2**32-1": [(int(C.H_DEVHEAP_COUNT), 2**32 - 1, 4)],
    "region offset past the end": [(int(C.H_DEVHEAP_OFFSET), 2**64 - 4096)],
    "region size huge": [(int(C.H_DEVHEAP_SIZE), 2**63)],
    "region over the fences": [(int(C.H_DEVHEAP_OFFSET), int(h["fences_offset"]))],
    "magic": [(roff + int(C.DH_MAGIC), 0)],
    "kind": [(roff + int(C.DH_DEVICE_KIND), 1, 4)],
    "ordinal 256": [(roff + int(C.DH_DEVICE_ORDINAL), 256, 4)],
    "same ordinal twice": [(roff + D + int(C.DH_DEVICE_ORDINAL), 0, 4)],
    "granule": [(roff + int(C.DH_GRANULE), 64)],
    "granules 0": [(roff + int(C.DH_GRANULES), 0), (roff + int(C.DH_SIZE), 0)],
    "granules huge": [(roff + int(C.DH_GRANULES), 2**62), (roff + int(C.DH_SIZE), 2**62 * 256 % 2**64)],
    "granules wrap": [(roff + int(C.DH_GRANULES), 2**56), (roff + int(C.DH_SIZE), 0)],
    "size mismatch": [(roff + int(C.DH_SIZE), 8 << 20)],
    "size not 2 MiB": [(roff + int(C.DH_GRANULES), 8192 + 1), (roff + int(C.DH_SIZE), (8192 + 1) * 256)],
    "bitmap misaligned": [(roff + int(C.DH_BITMAP_OFFSET), bm(0) + 4)],
    "bitmap over descriptors": [(roff + int(C.DH_BITMAP_OFFSET), 8)],
    "bitmap past region": [(roff + int(C.DH_BITMAP_OFFSET), rsize - 8)],
    "bitmap offset huge": [(roff + int(C.DH_BITMAP_OFFSET), 2**64 - 8)],
    "bitmaps overlap": [(roff + D + int(C.DH_BITMAP_OFFSET), bm(0) + 64)],
}
for what, pokes in cases.items():
    os.pwrite(fd, orig, 0)
    for p in pokes:
        put(*p)
    try:
        x = hl.Domain.open(name)
        x.close()
        print("OPENED", what)
    except hl.CorruptDomain as e:
        print("corrupt", what, "|", e)

# a slot whose placement names a heap that does not exist, or an extent outside its heap
os.pwrite(fd, orig, 0)
d = hl.Domain.open(name)
b = d.buffer(100, device="cuda:1")
foff = int(d.header()["fences_offset"])
i = (b.handle & 0xFFFFFF) - 1
err_at = foff + i * int(C.FENCE_SIZE) + int(C.F_ERR)
word_at = foff + i * int(C.FENCE_SIZE) + int(C.F_WORD)
good = [os.pread(fd, 8, err_at), os.pread(fd, 8, word_at)]
for label, err, word in [("heap 5", (1 << 8) | 6, 0), ("outside", (8193 << 8) | 2, 0),
                         ("misaligned", (1 << 8) | 2, 100), ("offset huge", (1 << 8) | 2, 2**64 - 256)]:
    put(err_at, err)
    put(word_at, word)
    try:
        d.import_buffer(b.handle)
        print("IMPORTED", label)
    except hl.CorruptDomain as e:
        print("import corrupt", label, "|", e)
    probs = d.check()
    print("check", label, "|", "; ".join(probs))
    # a repair (the lock of a dead holder broken) walks the slots: it must skip the bad extent
    desc = roff + 1 * D
    put(desc + int(C.DH_LOCK), (5 << 8) | 40)  # participant 39, not alive
    x = d.buffer(10, device="cuda:1")
    print("repaired", label, lowlevel.device_heaps(d)[1].repairs)
    x.release()
os.pwrite(fd, good[0], err_at)
os.pwrite(fd, good[1], word_at)
put(roff + D + int(C.DH_LOCK), (5 << 8) | 40)  # one more repair: the bitmap from the restored slot
d.buffer(10, device="cuda:1").release()
print("final", d.check())
# descriptors rewritten after attach: this participant keeps using its private view
for field, value in (("DH_GRANULES", 2**62), ("DH_BITMAP_OFFSET", 2**63), ("DH_GRANULE", 1), ("DH_SIZE", 0)):
    put(roff + D + int(getattr(C, field)), value)
put(int(C.H_DEVHEAP_OFFSET), 2**62)
xs = [d.buffer(3000, device="cuda:1") for _ in range(20)]
print("after rewrite", len({x.device_offset for x in xs}), lowlevel.device_heaps(d)[1].size)
for x in xs:
    x.release()
b.release()
print("empty", lowlevel.device_heaps(d)[1].used, d.check())
d.close()
os.close(fd)
print("done")
"""


def test_hostile_device_heap_descriptors(domain_name: str) -> None:
    r = run_child("from hostless import lowlevel\n" + HOSTILE, domain_name, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "OPENED" not in out and "IMPORTED" not in out, out
    assert sum(line.startswith("corrupt ") for line in out.splitlines()) == 21, out
    assert "not a valid hostless domain" in out
    for label in ("heap 5", "outside", "misaligned", "offset huge"):
        assert f"import corrupt {label}" in out, out
    assert "check heap 5 | buffer slot 0 names device heap 5: there is none" in out
    assert "outside device heap cuda:1" in out and "not a multiple of 256" in out
    assert "repaired offset huge 4" in out
    assert "final []" in out and "empty 0 []" in out and "done" in out
    assert "after rewrite 20 2097152" in out


def test_devheap_dtype_matches_the_header(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=64, device_heaps={"cuda:4": "2M"}) as d:
        h = d.header()
        assert int(h["devheap_count"]) == 1
        rec = np.frombuffer(bytes(d.raw()), DEVHEAP_DTYPE, count=1, offset=int(h["devheap_offset"]))[0]
        assert int(rec["magic"]) == int(C.DEVHEAP_MAGIC) and int(rec["device_ordinal"]) == 4
        assert int(rec["size"]) == 2 * MIB == int(rec["granules"]) * int(rec["granule"])
        b = d.buffer(1000, device="cuda:4")
        rec = np.frombuffer(bytes(d.raw()), DEVHEAP_DTYPE, count=1, offset=int(h["devheap_offset"]))[0]
        assert int(rec["used_granules"]) == 4 and int(rec["allocs"]) == 1
        # the slot: placement in err, device offset in word, nbytes in aux
        t = np.frombuffer(bytes(d.raw()), FENCE_DTYPE, count=64, offset=int(h["fences_offset"]))
        s = t[(b.handle & 0xFFFFFF) - 1]
        assert int(s["err"]) == (4 << 8) | 1 and int(s["word"]) == b.device_offset and int(s["aux"]) == 1000
        b.release()


def test_layout_function_counts_device_heaps() -> None:
    from hostless import _core

    base = _core.layout(64, 8, 0, 0, 0)
    with_dev = _core.layout(64, 8, 0, 0, 0, [(0, 256 * MIB), (1, 2 * MIB)])
    assert with_dev["devheap_offset"] == base["total_size"] + with_dev["heap_size"]
    # two descriptors, then 128 KiB + 1 KiB of bitmaps, page aligned
    assert with_dev["devheap_size"] == 135168
    name = unique_name()
    try:
        with hl.Domain.create(
            name, fences=64, participants=8, device_heaps={"cuda:0": "256M", "cuda:1": "2M"}
        ) as d:
            assert d.raw().size() == with_dev["total_size"]
    finally:
        unlink_quietly(name)
