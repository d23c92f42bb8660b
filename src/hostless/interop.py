"""Interop outside a domain: memory as file descriptors.

* :func:`memfd_buffer` makes an anonymous shareable buffer (a memfd).
* :meth:`ExternalBuffer.from_fd` maps any mmap-able fd (a memfd, a /dev/shm
  file, a dma-buf from a dma-heap) with the same NumPy / buffer-protocol /
  DLPack views as heap buffers, with no copy.
* :func:`export_buffer` turns a heap buffer into (fd, offset, nbytes) for a
  process that is not a participant: the fd is a fresh open of the domain file
  (its own open file description, so it never carries this participant's
  liveness lock), and the offset is page aligned for buffers of 64 KiB and up.
  The fd is read-only unless ``writable=True`` is asked for, and either way it
  gives access to the whole domain file (a read-only one lets the peer read
  every table and buffer; a process of the same user can also reopen it
  writable through /proc): hand it only to trusted peers, or use a memfd
  buffer for isolation.
* :func:`send_fds` / :func:`recv_fds` pass descriptors (and a small payload)
  over a Unix socket with SCM_RIGHTS.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
from typing import Any, cast

from . import lowlevel
from .buffer import ShapeLike, _Views, normalize_layout, pep3118
from .errors import DomainClosed, InvalidHandle

__all__ = ["ExternalBuffer", "memfd_buffer", "export_buffer", "send_fds", "recv_fds", "dma_heap_buffer"]

_PAGE = mmap.PAGESIZE


class ExternalBuffer(_Views):
    """Memory mapped from a file descriptor, with NumPy / buffer-protocol / DLPack views."""

    __slots__ = ("shape", "dtype", "nbytes", "fd", "offset", "_mem")

    fd: int
    """The descriptor (owned by this object; closed by ``close()``)."""

    _mem: mmap.mmap
    offset: int
    shape: tuple[int, ...]
    nbytes: int

    def __new__(cls, *args: Any, **kwargs: Any) -> ExternalBuffer:
        return cast(ExternalBuffer, super().__new__(cls))

    def __init__(self) -> None:
        raise TypeError("use ExternalBuffer.from_fd() or memfd_buffer()")

    @classmethod
    def from_fd(
        cls,
        fd: int,
        shape: ShapeLike,
        dtype: Any = None,
        *,
        offset: int = 0,
        readonly: bool | None = None,
        take: bool = False,
    ) -> ExternalBuffer:
        """Map ``shape``/``dtype`` bytes of ``fd`` starting at ``offset`` (any offset).

        ``readonly``: map (and view) read-only; by default (None) read-only
        exactly when ``fd`` is open read-only (as :func:`export_buffer` gives).
        ``take=True`` transfers ownership of ``fd`` (closed with the buffer);
        otherwise the descriptor is duplicated.  Raises ValueError when the
        region lies beyond the end of the file.
        """
        shp, dt, nbytes = normalize_layout(shape, dtype)
        if offset < 0:
            raise ValueError("offset must be >= 0")
        size = os.fstat(fd).st_size
        if size and offset + nbytes > size:
            raise ValueError(
                f"region [{offset}, {offset + nbytes}) lies beyond the end of the file ({size} bytes)"
            )
        if readonly is None:
            readonly = (fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE) == os.O_RDONLY
        own = fd if take else os.dup(fd)
        base = offset - offset % _PAGE
        try:
            prot = mmap.PROT_READ | (0 if readonly else mmap.PROT_WRITE)
            mem = mmap.mmap(own, nbytes + (offset - base), mmap.MAP_SHARED, prot, offset=base)
        except BaseException:
            if not take:
                os.close(own)
            raise
        self = cast(ExternalBuffer, _Views.__new__(cls))
        self.shape, self.dtype, self.nbytes = shp, dt, nbytes
        self.fd, self.offset, self._mem = own, offset, mem
        self._set_window(mem, offset - base, nbytes, readonly, *pep3118(dt), shp)
        return self

    def close(self) -> None:
        """Unmap (once no view remains) and close the descriptor."""
        self._set_window(None, 0, 0, False)
        try:
            self._mem.close()
        except BufferError:
            pass  # views still alive: the mapping stays until they go
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ExternalBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<hostless.ExternalBuffer fd={self.fd} shape={self.shape} dtype={self.dtype}>"


def memfd_buffer(shape: ShapeLike, dtype: Any = None, *, name: str = "hostless") -> ExternalBuffer:
    """A new buffer backed by its own memfd: pass ``buf.fd`` to another process."""
    _, _, nbytes = normalize_layout(shape, dtype)
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise
    return ExternalBuffer.from_fd(fd, shape, dtype, take=True)


def dma_heap_buffer(shape: ShapeLike, dtype: Any = None, *, heap: str = "system") -> ExternalBuffer:
    """A dma-buf from ``/dev/dma_heap/<heap>`` (where the system has dma-heaps).

    Raises FileNotFoundError when the system has no such heap.
    """
    import fcntl
    import struct

    _, _, nbytes = normalize_layout(shape, dtype)
    path = f"/dev/dma_heap/{heap}"
    hfd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        # struct dma_heap_allocation_data { u64 len; u32 fd; u32 fd_flags; u64 heap_flags; }
        req = bytearray(struct.pack("<QIIQ", nbytes, 0, os.O_RDWR | os.O_CLOEXEC, 0))
        dma_heap_ioctl_alloc = 0xC0184800  # _IOWR('H', 0, 24 bytes)
        fcntl.ioctl(hfd, dma_heap_ioctl_alloc, req)
        fd = struct.unpack_from("<QIIQ", req)[1]
    finally:
        os.close(hfd)
    return ExternalBuffer.from_fd(fd, shape, dtype, take=True)


def export_buffer(buf: Any, *, writable: bool = False) -> tuple[int, int, int]:
    """(fd, offset, nbytes) of a heap buffer for a process outside the domain.

    The caller owns the new fd.  Import it with
    ``ExternalBuffer.from_fd(fd, buf.shape, buf.dtype, offset=offset)`` (a
    read-only view for a read-only fd).  The fd is opened read-only by default:
    the peer can read the whole domain file but write nothing.  ``writable=True``
    hands out read-write access to the whole domain file (every table, every
    buffer): only for a peer you would let join the domain.
    """
    from .buffer import Buffer

    if not isinstance(buf, Buffer):
        raise TypeError("export_buffer() takes a hostless.Buffer")
    if not lowlevel.is_held(buf):
        raise InvalidHandle(f"buffer {buf.handle:#x} was released")
    dom = buf._dom
    if dom._closed:
        raise DomainClosed("the buffer's domain is closed")
    fd = os.open(f"/proc/self/fd/{dom._fd}", (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
    return fd, buf.offset, buf.nbytes


def send_fds(sock: socket.socket, fds: list[int], payload: bytes = b"\0") -> None:
    """Send ``fds`` and ``payload`` (at least one byte) over a Unix socket (SCM_RIGHTS)."""
    if sock.family != socket.AF_UNIX:
        raise ValueError("descriptors travel only over AF_UNIX sockets")
    socket.send_fds(sock, [payload or b"\0"], list(fds))


def recv_fds(sock: socket.socket, maxfds: int = 16, bufsize: int = 65536) -> tuple[bytes, list[int]]:
    """Receive (payload, fds) sent by :func:`send_fds`.  The caller owns the fds."""
    data, fds, _flags, _addr = socket.recv_fds(sock, bufsize, maxfds)
    if not data and not fds:
        raise EOFError("peer closed the socket")
    return data, list(fds)
