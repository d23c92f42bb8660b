"""Buffers: blocks of the domain's shared heap, mapped by every participant.

A buffer written by one participant is read by the next with no copy: its
``handle`` is valid in every participant (``Domain.import_buffer``), and its
views (NumPy, the buffer protocol, DLPack) point into the same physical pages.

References work as for fences: each participant holds at most one shared
reference, a ``Buffer`` object is one local reference, and the block returns
to the heap when the last reference in the domain is dropped (recovery drops
those of dead participants).

Views stay valid as memory while they exist (they pin the mapping), but after
``release()`` the block can be reused by another allocation: do not keep
views of released buffers.

The copy baseline lives here too: :class:`PrivateBuffer` is process-private
memory with the same views, moved with one ``memcpy`` by :meth:`copy_to`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, Union, cast

import numpy as np

from . import _core
from ._abi import C
from .errors import DeviceBufferError, DomainClosed, InvalidHandle

__all__ = [
    "Buffer",
    "PrivateBuffer",
    "ShapeLike",
    "bytes_buffer",
    "set_device_ops",
    "normalize_layout",
    "pack_meta",
    "unpack_meta",
]

ShapeLike = Union[int, Sequence[int]]  # noqa: UP007 (a runtime alias on Python 3.10)
_KDL_CPU = 1
_KDL_CUDA = int(C.DEVICE_CUDA)  # DLPack's kDLCUDA: device kinds in the ABI are DLPack's


def normalize_layout(shape: ShapeLike, dtype: Any) -> tuple[tuple[int, ...], np.dtype, int]:
    """Validate (shape, dtype) -> (shape tuple, dtype, nbytes).  ``dtype=None`` means raw bytes."""
    if dtype is None:
        dt = np.dtype(np.uint8)
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError as e:
            raise ValueError(f"unknown dtype {dtype!r}: {e}") from None
    if dt.hasobject:
        raise ValueError("object dtypes cannot live in shared memory")
    if dt.itemsize == 0:
        raise ValueError(f"dtype {dt} has no size")
    if isinstance(shape, (bool, np.bool_, str, bytes)) or shape is None:
        raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}")
    if isinstance(shape, (int, np.integer)):
        shp: tuple[int, ...] = (int(shape),)
    else:
        try:
            shp = tuple(int(x) for x in shape)
        except TypeError:
            raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if len(shp) > int(C.BUFFER_MAX_DIMS):
        raise ValueError(f"at most {int(C.BUFFER_MAX_DIMS)} dimensions, got {len(shp)}")
    if any(x <= 0 for x in shp):
        raise ValueError(f"every dimension must be positive, got shape {shp}")
    nbytes = dt.itemsize
    for x in shp:
        nbytes *= x
    if nbytes >= 1 << 62:
        raise ValueError(f"a buffer of shape {shp} and dtype {dt} is {nbytes} bytes: too large for any heap")
    return shp, dt, nbytes


def pep3118(dt: np.dtype) -> tuple[str, int]:
    """(PEP 3118 format, itemsize) of a dtype, as NumPy exports it."""
    return memoryview(cast(Any, np.empty(1, dt))).format, dt.itemsize


def pack_meta(shape: tuple[int, ...], dt: np.dtype, nbytes: int) -> bytes:
    """The struct hl_buffer_meta of a buffer (offsets from the ABI header)."""
    meta = bytearray(int(C.BUFFER_META_SIZE))
    struct.pack_into("<Q", meta, int(C.BM_NBYTES), nbytes)
    struct.pack_into("<II", meta, int(C.BM_NDIM), len(shape), dt.itemsize)
    code = dt.str.encode()
    if len(code) > 15:
        raise ValueError(f"dtype {dt} cannot be described in the buffer metadata")
    meta[int(C.BM_DTYPE) : int(C.BM_DTYPE) + len(code)] = code
    struct.pack_into(f"<{len(shape)}Q", meta, int(C.BM_SHAPE), *shape)
    return bytes(meta)


def unpack_meta(meta: bytes) -> tuple[tuple[int, ...], np.dtype, int]:
    """Inverse of :func:`pack_meta`; raises InvalidHandle on inconsistent metadata."""
    (nbytes,) = struct.unpack_from("<Q", meta, int(C.BM_NBYTES))
    ndim, itemsize = struct.unpack_from("<II", meta, int(C.BM_NDIM))
    code = meta[int(C.BM_DTYPE) : int(C.BM_DTYPE) + 16].split(b"\0", 1)[0].decode(errors="replace")
    if ndim > int(C.BUFFER_MAX_DIMS):
        raise InvalidHandle(f"buffer metadata has {ndim} dimensions")
    shape = struct.unpack_from(f"<{ndim}Q", meta, int(C.BM_SHAPE))
    try:
        dt = np.dtype(code)
    except TypeError:
        raise InvalidHandle(f"buffer metadata names an unknown dtype {code!r}") from None
    n = dt.itemsize
    for x in shape:
        n *= x
    if dt.itemsize != itemsize or n != nbytes:
        raise InvalidHandle("buffer metadata is inconsistent (shape, dtype and size disagree)")
    return tuple(int(x) for x in shape), dt, int(nbytes)


_device_ops: dict[str, Callable[..., Any]] = {}


def set_device_ops(
    *,
    export_dlpack: Callable[..., Any],
    to_host: Callable[..., Any],
    from_host: Callable[..., Any],
) -> None:
    """Install what a device buffer's ``__dlpack__``, ``to_host`` and ``from_host`` run: the
    GPU layer (:mod:`hostless.devmem`) maps device heaps, and registers itself here when
    imported (``import hostless`` imports it), since this layer does not import upward."""
    _device_ops.update(export_dlpack=export_dlpack, to_host=to_host, from_host=from_host)


def _device_op(name: str) -> Callable[..., Any]:
    op = _device_ops.get(name)
    if op is None:  # only when hostless.devmem could not be imported
        raise DeviceBufferError(f"device buffers need hostless.devmem, which is not loaded ({name})")
    return op


def bytes_buffer(dom: Any, data: bytes) -> Buffer:
    """A new heap buffer of ``dom`` holding ``data`` (argument blocks, ERT commands, packets);
    the caller releases it."""
    b: Buffer = dom.buffer(len(data))
    b.numpy()[:] = np.frombuffer(data, np.uint8)
    return b


class _Views(_core.Handle):
    """NumPy, DLPack and buffer-protocol views of a window of memory."""

    __slots__ = ()
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int

    def numpy(self, *, readonly: bool = False) -> np.ndarray:
        """A NumPy array over the memory (no copy).  ``readonly=True`` gives a read-only view."""
        raw = np.frombuffer(cast(Any, self), dtype=np.uint8, count=self.nbytes)
        arr: np.ndarray = raw.view(self.dtype).reshape(self.shape)
        if readonly:
            arr.flags.writeable = False
        return arr

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.numpy()
        if copy:
            arr = arr.copy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """DLPack capsule (kDLCPU) over the same memory.

        ``np.from_dlpack(b)`` and ``torch.from_dlpack(b)`` share it (no copy).
        """
        if stream is not None and stream != -1:
            raise BufferError("hostless buffers are CPU memory: stream must be None")
        if dl_device is not None and tuple(dl_device) != (_KDL_CPU, 0):
            raise BufferError(f"cannot export to device {dl_device}; buffers are kDLCPU")
        if copy:
            raise BufferError("__dlpack__(copy=True) is not supported: buffers are shared by design")
        arr = self.numpy()
        if max_version is None:
            return arr.__dlpack__()
        return arr.__dlpack__(max_version=max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CPU, 0)

    def copy_to(self, dst: _Views | np.ndarray) -> None:
        """Copy this memory into ``dst`` (same nbytes): one memcpy, no pickling."""
        d = dst.numpy() if isinstance(dst, _Views) else dst
        s = self.numpy()
        if d.nbytes != s.nbytes:
            raise ValueError(f"copy_to: size mismatch ({s.nbytes} -> {d.nbytes} bytes)")
        if d.flags.c_contiguous:
            np.copyto(d.reshape(-1).view(np.uint8), s.reshape(-1).view(np.uint8), casting="no")
        elif d.shape == s.shape and d.dtype == s.dtype:
            np.copyto(d, s, casting="no")  # strided destination: element by element
        else:
            raise ValueError("copy_to: a non-contiguous destination needs the source's shape and dtype")


class Buffer(_Views):
    """One reference to a buffer: a block of the shared heap, or an extent of a
    device heap (``Domain.buffer(..., device="cuda:N")``).  Create with
    ``Domain.buffer()`` or ``Domain.import_buffer()``; ``release()`` or ``with``
    drops it.  Its memory returns to its heap when no participant holds the
    buffer any more (a device buffer's device extent and metadata block both).

    A device buffer's data is GPU memory: every host view (``numpy()``,
    ``np.asarray``, the buffer protocol, ``memoryview``, ``copy_to``) raises
    :class:`DeviceBufferError`; ``to_host()`` copies it, DLPack
    (``__dlpack__``, kDLCUDA) hands it to CuPy or PyTorch without a copy."""

    __slots__ = ("shape", "dtype", "nbytes", "_offset", "_device_name", "_heap", "_device_offset")

    def __new__(cls, *args: Any, **kwargs: Any) -> Buffer:
        raise TypeError("use Domain.buffer() or Domain.import_buffer()")

    def _init_layout(
        self,
        shape: tuple[int, ...],
        dtype: np.dtype,
        nbytes: int,
        offset: int,
        device: str = "cpu",
        heap: int | None = None,
        device_offset: int | None = None,
    ) -> None:
        self.shape, self.dtype, self.nbytes, self._offset = shape, dtype, nbytes, offset
        self._device_name, self._heap, self._device_offset = device, heap, device_offset

    @property
    def offset(self) -> int:
        """Offset of the data from the start of the domain mapping (host buffers;
        DeviceBufferError for a device buffer, whose data is not in the mapping)."""
        if self._heap is not None:
            raise self._device_error()
        return self._offset

    @property
    def device(self) -> str:
        """Where the data lives: ``"cpu"`` (the shared heap) or ``"cuda:N"``."""
        return self._device_name

    @property
    def device_offset(self) -> int | None:
        """Bytes from the start of its device heap to the data (a multiple of 256) for a
        device buffer; None for a host buffer."""
        return self._device_offset

    @property
    def device_heap(self) -> int | None:
        """Index of its device heap in the domain (``lowlevel.device_heaps``); None for a host buffer."""
        return self._heap

    def _device_error(self) -> DeviceBufferError:
        return DeviceBufferError(
            f"buffer {self.handle:#x} lives in GPU memory ({self._device_name}): the host cannot view it; "
            "copy it with to_host(), or hand it to a GPU library through DLPack"
        )

    def numpy(self, *, readonly: bool = False) -> np.ndarray:
        if not self._held:
            raise InvalidHandle(f"buffer {self.handle:#x} was released")
        if self._dom._closed:
            raise DomainClosed("the buffer's domain is closed")
        if self._heap is not None:
            raise self._device_error()
        return super().numpy(readonly=readonly)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """DLPack capsule over the same memory: kDLCPU for a host buffer, kDLCUDA for a device
        buffer (through :mod:`hostless.devmem`, which maps the device heap in this process)."""
        if self._heap is None:
            return super().__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
        export = _device_op("export_dlpack")
        return export(self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._heap is None:
            return (_KDL_CPU, 0)
        return (_KDL_CUDA, int(self._device_name.split(":", 1)[1]))

    def to_host(self, out: np.ndarray | None = None) -> np.ndarray:
        """A host copy of the buffer's data (into ``out`` when given: C-contiguous, same
        nbytes), complete on return: NumPy for a host buffer, one device-to-host copy for a
        device buffer (:func:`hostless.devmem.to_host`)."""
        if self._heap is not None:
            got: np.ndarray = _device_op("to_host")(self, out)
            return got
        if out is None:
            out = np.empty(self.shape, self.dtype)
        if not out.flags.c_contiguous or out.nbytes != self.nbytes:
            raise ValueError(f"to_host: out must be C-contiguous with {self.nbytes} bytes")
        out.reshape(-1).view(np.uint8)[...] = self.numpy().reshape(-1).view(np.uint8)
        return out

    def from_host(self, src: Any) -> None:
        """Copy host data ``src`` (any array-like of the buffer's nbytes once cast to its dtype
        and shape) into the buffer, complete on return: NumPy for a host buffer, one
        host-to-device copy for a device buffer (:func:`hostless.devmem.from_host`)."""
        if self._heap is not None:
            _device_op("from_host")(self, src)
            return
        self.numpy()[...] = np.asarray(src, dtype=self.dtype).reshape(self.shape)

    def __len__(self) -> int:
        return self.nbytes

    def __repr__(self) -> str:
        state = "" if self._held else " released"
        where = "" if self._heap is None else f" device={self._device_name}"
        return f"<hostless.Buffer {self.handle:#x} shape={self.shape} dtype={self.dtype}{where}{state}>"


class PrivateBuffer(_Views):
    """Process-private memory with the same views as :class:`Buffer`: the copy baseline.

    Moving data between participants in copy mode means ``copy_to`` into a
    shared staging buffer and ``copy_to`` out of it on the other side, the way
    device stacks move data through the host.
    """

    __slots__ = ("shape", "dtype", "nbytes", "_mem")

    def __new__(cls, shape: ShapeLike, dtype: Any = None) -> PrivateBuffer:
        return cast(PrivateBuffer, super().__new__(cls))

    def __init__(self, shape: ShapeLike, dtype: Any = None) -> None:
        shp, dt, nbytes = normalize_layout(shape, dtype)
        self.shape, self.dtype, self.nbytes = shp, dt, nbytes
        import mmap

        # page-aligned anonymous memory, like a device allocation
        self._mem = mmap.mmap(-1, max(nbytes, 1), mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._set_window(self._mem, 0, nbytes, False, *pep3118(dt), shp)

    def __repr__(self) -> str:
        return f"<hostless.PrivateBuffer shape={self.shape} dtype={self.dtype}>"
