"""The DLPack producer of the binding (binding/dlpack.c) and devmem.export, without a GPU.

The capsules the GPU paths hand to CuPy and PyTorch (kDLCUDA) are built by the
same code as a kDLCPU capsule over a host buffer, which NumPy consumes here:
the memory is shared (pointer equality), the capsule keeps its own reference
to the buffer (the block stays allocated after the caller's release() until
the consumer's array dies), legacy and versioned capsules both work, an
unconsumed capsule frees its reference, and the protocol's refusals hold.
"""

from __future__ import annotations

import gc
import uuid

import numpy as np
import pytest

import hostless as hl
from hostless import _core, devmem


class _Exporter:
    """A __dlpack__ producer over a host buffer, as CudaPeer.dlpack is over device memory."""

    def __init__(self, buf: hl.Buffer) -> None:
        self.buf = buf

    def __dlpack_device__(self) -> tuple[int, int]:
        return (devmem.KDL_CPU, 0)

    def __dlpack__(self, **kw: object) -> object:
        mv = kw.get("max_version")
        return devmem.export(
            self.buf,
            self.buf.numpy().ctypes.data,
            (devmem.KDL_CPU, 0),
            stream=kw.get("stream"),
            max_version=mv if isinstance(mv, tuple) else None,
            dl_device=kw.get("dl_device"),  # type: ignore[arg-type]
            copy=kw.get("copy"),  # type: ignore[arg-type]
        )


@pytest.fixture
def dom():
    d = hl.Domain.create(f"hldl-{uuid.uuid4().hex[:10]}", heap="4M", device_heaps={}, unlink_on_close=True)
    yield d
    d.close()


def test_numpy_shares_the_memory_and_the_capsule_keeps_the_block(dom):
    used0 = dom.heap_stats()["used"]
    b = dom.buffer((6, 7), "f4")
    b.numpy()[...] = np.arange(42, dtype="f4").reshape(6, 7)
    ptr = b.numpy().ctypes.data
    a = np.from_dlpack(_Exporter(b))
    assert a.ctypes.data == ptr and a.shape == (6, 7) and a.dtype == np.float32
    assert a.strides == (28, 4)
    used = dom.heap_stats()["used"]
    b.release()  # the caller's reference: the consumer's array still holds the block
    assert dom.heap_stats()["used"] == used
    assert float(a.sum()) == float(np.arange(42).sum())
    del a
    gc.collect()
    assert dom.heap_stats()["used"] == used0


@pytest.mark.parametrize("dtype", ["f4", "f8", "i1", "u2", "i8", "c8", "?"])
def test_dtypes_round_trip(dom, dtype):
    b = dom.buffer((5,), dtype)
    b.numpy()[...] = np.arange(5).astype(dtype)
    a = np.from_dlpack(_Exporter(b))
    assert a.dtype == np.dtype(dtype) and (a == np.arange(5).astype(dtype)).all()
    del a
    b.release()


def test_legacy_and_versioned_capsules_and_an_unconsumed_one(dom):
    used0 = dom.heap_stats()["used"]
    b = dom.buffer((4,), "f4")
    for versioned in (False, True):
        cap = _core.dlpack_capsule(b, b.numpy().ctypes.data, (4,), 2, 32, 1, 0, versioned, False)
        assert "dltensor" in repr(cap)
    own = devmem.own_reference(b)
    cap = _core.dlpack_capsule(own, b.numpy().ctypes.data, (4,), 2, 32, 1, 0, True, False)
    own = None
    b.release()
    del cap  # never consumed: its deleter drops the reference it held
    gc.collect()
    assert dom.heap_stats()["used"] == used0


def test_protocol_refusals(dom):
    b = dom.buffer((4,), "f4")
    ptr = b.numpy().ctypes.data
    with pytest.raises(BufferError, match="without a copy"):
        devmem.export(b, ptr, (devmem.KDL_CUDA, 0), dl_device=(devmem.KDL_CPU, 0))
    with pytest.raises(BufferError, match="copy=True"):
        devmem.export(b, ptr, (devmem.KDL_CPU, 0), copy=True)
    with pytest.raises(BufferError, match="stream 0"):
        devmem.export(b, ptr, (devmem.KDL_CUDA, 0), stream=0)
    with pytest.raises(ValueError, match="dimensions"):
        _core.dlpack_capsule(b, ptr, (1,) * 13, 2, 32, 1, 0, False, False)
    with pytest.raises(ValueError, match="negative"):
        _core.dlpack_capsule(b, ptr, (-1,), 2, 32, 1, 0, False, False)
    with pytest.raises(BufferError, match="no DLPack equivalent"):
        s = dom.buffer((2,), ">f4")
        devmem.export(s, s.numpy().ctypes.data, (devmem.KDL_CPU, 0))
    b.release()
