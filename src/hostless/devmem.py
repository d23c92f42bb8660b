"""Device memory: the backing of a domain's device heaps, shared by every process.

A domain declares its device heaps at creation (``Domain.create(...,
device_heaps={"cuda:0": bytes})``); the engine hands out extents of them as it
does host blocks (placement, handles, references and crash recovery are the
host heap's: :mod:`hostless.buffer`).  This module gives those extents memory:

* **One allocation per heap**, made with the CUDA virtual-memory API
  (``cuMemCreate``, pinned device memory of the heap's GPU, exportable as a
  POSIX file descriptor), mapped in each process with ``cuMemAddressReserve``
  + ``cuMemMap`` + ``cuMemSetAccess``.  A buffer's device address in a process
  is that process's mapping of its heap plus the buffer's ``device_offset``.
* **Shared by descriptor passing, within one user.**  Every process that holds a
  heap's allocation serves its descriptor (``SCM_RIGHTS``) on a Unix socket in its
  user's private directory (:func:`runtime_dir`: owned by the uid, mode 0700, verified
  before use), and both ends check the other's uid with ``SO_PEERCRED``; a peer of
  another user is skipped with an :class:`UntrustedPeer` warning.  A process that
  needs the heap asks every live holder at once (at most :data:`PEER_TIMEOUT` seconds);
  when none answers it creates the allocation under a creation lock (``flock`` in the
  same directory), so two processes never create two.  The allocation therefore
  outlives its creator: it lives while any participant holds it.  When every holder has
  exited the memory is gone (as after a device reset): the heap's extents stay valid,
  their contents are lost, and the next user creates a fresh allocation.  The
  ``generation`` the holders pass along tells which allocation one holds.  Nothing read
  from the domain chooses the memory: only the directory and the peer's uid do
  (:class:`Broker`, in :mod:`hostless.devbroker`, re-exported here).
* **Host access is explicit.**  A device buffer has no host view
  (:class:`~hostless.errors.DeviceBufferError`); :func:`to_host` and
  :func:`from_host` copy, :func:`cupy_array` gives a CuPy view with no copy,
  and ``Buffer.__dlpack__`` (:func:`export_dlpack`) hands the memory to CuPy
  or PyTorch as ``kDLCUDA`` with no copy.

A host buffer stays ``kDLCPU`` (NumPy, PyTorch CPU).  For CUDA consumers,
``CudaPeer.dlpack(buf)`` exports a host buffer of a registered domain as
``kDLCUDA`` over its device address (unified addressing: the registered host
pages), with no copy.  ``kDLCUDAHost``, the type meant for this, is refused
by CuPy 13 ("Unsupported array type: 3") and PyTorch 2 ("Unsupported
device_type: 3"), measured on the H200 machine, so it is not used.

Stream semantics (DLPack): hostless queues no work of its own on any stream
for a buffer; readiness is the fence's.  ``__dlpack__(stream=s)`` therefore
needs no synchronisation and accepts any stream the protocol allows
(``None``, ``-1``, ``1``, ``2`` or a stream pointer; ``0`` is refused, as the
protocol says).  Wait on the buffer's fence (on the host, or on the stream
with ``CudaPeer.wait``) before reading what another participant wrote.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import weakref
from typing import Any

import numpy as np

from . import _core, lowlevel
from . import buffer as _buffer
from ._abi import C
from .devbroker import PEER_TIMEOUT, Allocation, Broker, Rejection, open_private_dir, runtime_dir
from .errors import CudaUnavailable, HostlessError, UntrustedPeer

__all__ = [
    "CudaUnavailable",
    "available",
    "cuda_modules",
    "DeviceHeapBacking",
    "Broker",
    "Allocation",
    "Rejection",
    "UntrustedPeer",
    "PEER_TIMEOUT",
    "runtime_dir",
    "open_private_dir",
    "backing",
    "device_pointer",
    "cupy_array",
    "to_host",
    "from_host",
    "export_dlpack",
    "export",
    "capsule",
    "parse_device",
]

KDL_CPU, KDL_CUDA = 1, 2
_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


def parse_device(device: str) -> tuple[str, int]:
    """``"cuda:N"`` -> ("cuda", N); ``"cpu"`` -> ("cpu", 0).  ValueError otherwise."""
    d = device.strip().lower()
    if d == "cpu":
        return ("cpu", 0)
    kind, sep, idx = d.partition(":")
    if kind == "cuda" and (not sep or idx.isdigit()):
        return ("cuda", int(idx) if sep else 0)
    raise ValueError(f"unknown device {device!r}: expected 'cpu' or 'cuda:N'")


def cuda_modules() -> tuple[Any, Any]:
    """(cupy, the CUDA driver bindings), imported on first use: CudaUnavailable, saying what
    to install, when either is missing."""
    try:
        import cupy as cp
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise CudaUnavailable(
            f"CuPy is not installed ({e}); install the CUDA extra: pip install 'hostless[cuda]'"
        ) from None
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        try:
            from cuda import cuda as cu  # older cuda-python layout
        except ImportError as e:  # pragma: no cover
            raise CudaUnavailable(
                f"cuda.bindings is not installed ({e}); install the CUDA extra: pip install 'hostless[cuda]'"
            ) from None
    return cp, cu


def available() -> str | None:
    """None when CUDA peers work here, otherwise the reason why not."""
    try:
        cp, cu = cuda_modules()
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as e:
        return str(e)
    if n < 1:
        return "no CUDA device"
    return None




def _check(cu: Any, err: Any, what: str) -> None:
    if int(err) != 0:
        name = cu.cuGetErrorName(err)[1] if hasattr(cu, "cuGetErrorName") else b""
        raise HostlessError(f"{what} failed: CUDA error {int(err)} {name!r}")


def _domain_key(dom: Any) -> str:
    """A name for the domain unique on this host: its path and creation time."""
    base = lowlevel.base_address(dom)
    created = ctypes.c_uint64.from_address(base + int(C.H_CREATED_NS)).value
    return hashlib.sha1(f"{dom.name}:{created}".encode()).hexdigest()[:20]


class DeviceHeapBacking:
    """This process's mapping of one device heap's allocation (see the module doc).

    Made by :func:`backing`; lives until the process exits or :meth:`close`.
    ``va`` is the device address of heap offset 0 in this process."""

    def __init__(self, key: str, index: int, ordinal: int, size: int, timeout: float = 30.0) -> None:
        cp, cu = cuda_modules()
        self.cp, self.cu = cp, cu
        self.key, self.index, self.ordinal = key, index, ordinal
        self._broker = Broker(key, index)
        self._fd = -1
        self._handle: Any = None
        self.va = 0
        cp.cuda.Device(ordinal).use()  # a context on the heap's device
        try:
            self._setup(size, timeout)
        except BaseException:
            self.close()  # nothing stranded: an allocation made here is released, not leaked
            raise

    def _setup(self, size: int, timeout: float) -> None:
        cu, index, ordinal = self.cu, self.index, self.ordinal
        self._fd, info, self.created = self._broker.acquire(lambda: self._create(size), timeout)
        self.size, self.granularity, self.generation = info.size, info.granularity, info.generation
        if info.size < size:
            raise HostlessError(
                f"device heap {index}: the shared allocation has {info.size} bytes, the domain {size}"
            )
        if info.ordinal != ordinal:
            raise HostlessError(
                f"device heap {index}: allocation on device {info.ordinal}, the domain says {ordinal}"
            )
        if self._handle is None:
            err, self._handle = cu.cuMemImportFromShareableHandle(
                self._fd, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            )
            _check(cu, err, "cuMemImportFromShareableHandle")
        self._map()
        self._broker.serve(self._fd, info)  # a holder now: serve it too

    # --------------------------------------------------------------- allocation
    def _prop(self) -> Any:
        cu = self.cu
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.ordinal
        prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        return prop

    def _create(self, size: int) -> tuple[int, Allocation]:
        cu = self.cu
        prop = self._prop()
        err, gran = cu.cuMemGetAllocationGranularity(
            prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
        )
        _check(cu, err, "cuMemGetAllocationGranularity")
        gran = int(gran) or (2 << 20)
        size = -(-size // gran) * gran
        err, self._handle = cu.cuMemCreate(size, prop, 0)
        _check(cu, err, f"cuMemCreate({size} bytes on device {self.ordinal})")
        err, fd = cu.cuMemExportToShareableHandle(
            self._handle, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0
        )
        _check(cu, err, "cuMemExportToShareableHandle")
        return int(fd), Allocation(size, gran, self.ordinal, os.urandom(16))

    def _map(self) -> None:
        cu = self.cu
        err, va = cu.cuMemAddressReserve(self.size, self.granularity, 0, 0)
        _check(cu, err, "cuMemAddressReserve")
        self.va = int(va)
        (err,) = cu.cuMemMap(self.va, self.size, 0, self._handle, 0)
        _check(cu, err, "cuMemMap")
        self.grant(self.ordinal)

    def grant(self, ordinal: int) -> None:
        """Let GPU ``ordinal`` read and write this mapping (a peer over NVLink/PCIe too)."""
        cu = self.cu
        desc = cu.CUmemAccessDesc()
        desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = ordinal
        desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        (err,) = cu.cuMemSetAccess(self.va, self.size, [desc], 1)
        _check(cu, err, f"cuMemSetAccess(device {ordinal})")

    def close(self) -> None:
        """Unmap and stop serving (the allocation lives on in other holders)."""
        self._broker.close()
        cu = self.cu
        if self.va:
            cu.cuMemUnmap(self.va, self.size)
            cu.cuMemAddressFree(self.va, self.size)
            self.va = 0
        if self._handle is not None:
            cu.cuMemRelease(self._handle)
            self._handle = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_lock = threading.Lock()
_backings: dict[tuple[str, int], DeviceHeapBacking] = {}
# (id(domain), device) -> (weak reference to the domain, its backing): the per-call fast path
_fast: dict[tuple[int, str], tuple[weakref.ref[Any], DeviceHeapBacking]] = {}


def _heap_of(dom: Any, device: str) -> Any:
    for h in lowlevel.device_heaps(dom):
        if h.name == device:
            return h
    raise HostlessError(f"the domain has no {device} heap (declare it: Domain.create(..., device_heaps=...))")


def backing(dom: Any, device: str) -> DeviceHeapBacking:
    """This process's mapping of ``dom``'s heap on ``device`` ("cuda:N"), made on first use.
    CudaUnavailable without CUDA; HostlessError when the domain has no such heap."""
    fast = _fast.get((id(dom), device))
    if fast is not None and fast[0]() is dom and fast[1].va:
        return fast[1]
    heap = _heap_of(dom, device)
    key = (_domain_key(dom), int(heap.heap_index))
    with _lock:
        b = _backings.get(key)
        if b is None or not b.va:
            b = DeviceHeapBacking(key[0], key[1], int(heap.ordinal), int(heap.size))
            _backings[key] = b
        _fast[(id(dom), device)] = (weakref.ref(dom), b)
        return b


def device_pointer(buf: Any) -> int:
    """Device address of ``buf``'s data in this process (a device-resident buffer)."""
    dev = buf.device
    if dev == "cpu":
        raise HostlessError("device_pointer: this buffer lives in host memory (see CudaPeer.array)")
    return backing(buf._dom, dev).va + int(buf.device_offset)


def cupy_array(buf: Any) -> Any:
    """A CuPy array over a device buffer's memory (no copy); it keeps ``buf`` alive."""
    cp, _cu = cuda_modules()
    b = backing(buf._dom, buf.device)
    mem = cp.cuda.UnownedMemory(b.va + int(buf.device_offset), buf.nbytes, buf, device_id=b.ordinal)
    return cp.ndarray(buf.shape, dtype=buf.dtype, memptr=cp.cuda.MemoryPointer(mem, 0))


def to_host(buf: Any, out: np.ndarray | None = None) -> np.ndarray:
    """A host copy of a buffer's data (into ``out`` when given: C-contiguous, same nbytes).
    Returns when the copy is complete; a host buffer is copied with NumPy (no CUDA needed:
    ``Buffer.to_host``)."""
    if buf.device == "cpu":
        host: np.ndarray = buf.to_host(out)
        return host
    if out is None:
        out = np.empty(buf.shape, buf.dtype)
    if not out.flags.c_contiguous or out.nbytes != buf.nbytes:
        raise ValueError(f"to_host: out must be C-contiguous with {buf.nbytes} bytes")
    cp, _cu = cuda_modules()
    if buf.nbytes:
        with cp.cuda.Device(backing(buf._dom, buf.device).ordinal):
            cp.cuda.runtime.memcpy(out.ctypes.data, device_pointer(buf), buf.nbytes, 2)  # DtoH
    return out


def from_host(buf: Any, src: Any) -> None:
    """Copy host data ``src`` (any array-like of ``buf``'s nbytes once cast to its dtype and
    shape) into a buffer.  Returns when the copy is complete; a host buffer is written with
    NumPy (no CUDA needed: ``Buffer.from_host``)."""
    if buf.device == "cpu":
        buf.from_host(src)
        return
    arr = np.ascontiguousarray(np.asarray(src, dtype=buf.dtype).reshape(buf.shape))
    cp, _cu = cuda_modules()
    if buf.nbytes:
        with cp.cuda.Device(backing(buf._dom, buf.device).ordinal):
            cp.cuda.runtime.memcpy(device_pointer(buf), arr.ctypes.data, buf.nbytes, 1)  # HtoD
            # from pageable memory cudaMemcpy may return once the data is staged, before the
            # DMA lands: another engine (a resident kernel) could read the old bytes
            cp.cuda.runtime.streamSynchronize(0)


def _dl_dtype(dt: np.dtype) -> tuple[int, int]:
    code = _DL_CODES.get(dt.kind)
    if code is None or dt.byteorder == ">" or dt.fields is not None:
        raise BufferError(f"dtype {dt} has no DLPack equivalent")
    return code, dt.itemsize * 8


def _check_stream(stream: Any) -> None:
    if stream is None or stream == -1:
        return
    if not isinstance(stream, int) or stream == 0 or stream < -1:
        raise BufferError(f"__dlpack__: stream {stream!r} is not a CUDA stream the protocol allows")


def capsule(
    owner: Any,
    ptr: int,
    shape: tuple[int, ...],
    dtype: np.dtype,
    device: tuple[int, int],
    *,
    stream: Any = None,
    max_version: tuple[int, int] | None = None,
) -> Any:
    """A DLPack capsule over ``ptr`` (C-contiguous ``shape`` of ``dtype`` on ``device``) that
    keeps ``owner`` alive while a consumer holds it (versioned when ``max_version`` >= 1)."""
    _check_stream(stream)
    code, bits = _dl_dtype(np.dtype(dtype))
    versioned = max_version is not None and max_version[0] >= 1
    return _core.dlpack_capsule(owner, ptr, tuple(shape), code, bits, device[0], device[1], versioned, False)


def own_reference(buf: Any) -> Any:
    """A second reference to ``buf`` in its domain, for a consumer to hold: the memory stays
    allocated while the consumer's tensor lives, even after the caller's ``release()``."""
    return buf._dom.import_buffer(buf.handle)


def export(
    buf: Any,
    ptr: int,
    device: tuple[int, int],
    *,
    stream: Any = None,
    max_version: tuple[int, int] | None = None,
    dl_device: tuple[int, int] | None = None,
    copy: bool | None = None,
) -> Any:
    """A ``__dlpack__`` export of ``buf``'s memory at ``ptr`` on ``device``, no copy: the
    protocol's arguments checked (a request for another device or a copy is refused), the
    capsule holding a reference of its own (:func:`own_reference`)."""
    _check_stream(stream)
    if dl_device is not None and tuple(dl_device) != tuple(device):
        raise BufferError(f"cannot export memory of device {device} to device {dl_device} without a copy")
    if copy:
        raise BufferError("__dlpack__(copy=True) is not supported: buffers are shared by design")
    return capsule(own_reference(buf), ptr, tuple(buf.shape), buf.dtype, device, max_version=max_version)


def export_dlpack(
    buf: Any,
    *,
    stream: Any = None,
    max_version: tuple[int, int] | None = None,
    dl_device: tuple[int, int] | None = None,
    copy: bool | None = None,
) -> Any:
    """``Buffer.__dlpack__`` for a device buffer: a kDLCUDA capsule over its memory, no copy."""
    b = backing(buf._dom, buf.device)
    ptr = b.va + int(buf.device_offset)
    return export(
        buf,
        ptr,
        (KDL_CUDA, b.ordinal),
        stream=stream,
        max_version=max_version,
        dl_device=dl_device,
        copy=copy,
    )


# the handle layer's device buffers run these (it does not import this layer)
_buffer.set_device_ops(export_dlpack=export_dlpack, to_host=to_host, from_host=from_host)
