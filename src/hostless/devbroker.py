"""Device heaps' descriptor passing: how one user's processes share one allocation.

No CUDA here: a descriptor is any file descriptor, and :mod:`hostless.devmem` (the
CUDA virtual-memory mapping) is this module's one user.  Every process that holds a
device heap's allocation serves its descriptor (``SCM_RIGHTS``) on a Unix socket in its
user's private directory (:func:`runtime_dir`: owned by the uid, mode 0700, verified
before use, :func:`open_private_dir`), and both ends check the other's uid with
``SO_PEERCRED``; a peer of another user is skipped with an :class:`UntrustedPeer`
warning.  A process that needs the heap asks every live holder at once (at most
:data:`PEER_TIMEOUT` seconds); when none answers it creates the allocation under a
creation lock (``flock`` in the same directory), so two processes never create two.
Nothing read from the domain chooses the memory: only the directory and the peer's uid
do (:class:`Broker`).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import secrets
import selectors
import socket
import stat
import struct
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from .errors import DeviceHeapUnavailable, UnsafeRuntimeDirectory, UntrustedPeer

__all__ = [
    "Allocation",
    "Broker",
    "PEER_TIMEOUT",
    "Rejection",
    "UntrustedPeer",
    "open_private_dir",
    "runtime_dir",
]

_HELLO = struct.Struct("<8sQQQ16s")  # magic, size, granularity, ordinal, generation
_MAGIC = b"HLDEVHP1"


@dataclass
class Allocation:
    """What holders of a device heap's allocation pass along with its descriptor."""

    size: int
    """Bytes of the allocation (a multiple of ``granularity``)."""
    granularity: int
    """Its mapping granularity (bytes)."""
    ordinal: int
    """The GPU it lives on."""
    generation: bytes
    """16 random bytes chosen by its creator: which allocation a holder holds."""


PEER_TIMEOUT = 1.0
"""Seconds one round of :meth:`Broker.fetch` waits for answers.  Every holder is asked at
once, so a round lasts at most this long whatever the number of holders (silent ones
included)."""

_MAX_PEERS = 256  # holders asked per round (the rest are not needed: any one answers)


@dataclass(frozen=True)
class Rejection:
    """A peer the broker refused (kept in ``Broker.rejected``)."""

    pid: int
    uid: int
    where: str
    """The socket file (a client-side refusal) or ``"client"`` (the serving side)."""
    reason: str


def _peercred(s: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end (the kernel's word: ``SO_PEERCRED``)."""
    raw = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def runtime_dir(uid: int | None = None, base: str | None = None) -> str:
    """The directory where ``uid``'s processes (default: this one's) meet to pass device-heap
    descriptors: ``<base>/.hostless-<uid>``.  ``base`` defaults to ``/run`` for root (only root
    can create entries there) and ``/dev/shm`` for other users (world-writable and sticky: a
    user that comes first can create the name, which :func:`open_private_dir` then refuses)."""
    if uid is None:
        uid = os.getuid()
    if base is None:
        base = "/dev/shm"
        if uid == 0:
            try:
                st = os.stat("/run")
                if st.st_uid == 0 and stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o022:
                    base = "/run"
            except OSError:
                pass
    return os.path.join(base, f".hostless-{uid}")


def open_private_dir(path: str) -> int:
    """A descriptor of the directory ``path``, created 0700 when missing, after
    checking that it is private: a real directory (not a symbolic link: ``O_NOFOLLOW``), owned
    by this process's uid, with no permission for group or others, in a parent that others
    cannot rename it out of (not writable by others, or sticky).  Everything the broker does
    goes through this descriptor, so a later rename of the path changes nothing.
    UnsafeRuntimeDirectory otherwise (the message says what to remove)."""
    uid = os.getuid()
    parent = os.path.dirname(path) or "."
    pst = os.stat(parent)
    if pst.st_mode & 0o002 and not pst.st_mode & stat.S_ISVTX:
        raise UnsafeRuntimeDirectory(
            f"{parent} is writable by every user and not sticky: others could replace {path}; "
            f"pass a base directory only you (or root) can write"
        )
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        try:
            st = os.lstat(path)
            what = f"a {'symbolic link' if stat.S_ISLNK(st.st_mode) else 'non-directory'} of uid {st.st_uid}"
        except OSError:
            what = "not openable"
        raise UnsafeRuntimeDirectory(
            f"{path} is {what} ({e.strerror}): another user may have created it to intercept "
            f"device-heap descriptors; remove it (as its owner or root) and retry"
        ) from None
    st = os.fstat(fd)
    if st.st_uid != uid or st.st_mode & 0o077:
        os.close(fd)
        raise UnsafeRuntimeDirectory(
            f"{path} belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}; it must be "
            f"this user's (uid {uid}) with mode 700: another user may have created it first; "
            f"remove it (as its owner or root) and retry"
        )
    return fd


class Broker:
    """Passes one device heap's allocation descriptor between the processes of one user.

    No CUDA here: a descriptor is any file descriptor.  **Where.**  Holders meet in a
    private directory (:func:`runtime_dir`, opened by :func:`open_private_dir`: owned by this
    uid, mode 0700, checked once and then used through its descriptor), so no other user can
    list, create, replace or connect to anything there.  Every holder serves the descriptor
    on its own socket ``<domain key>.dh<index>.<pid>.<random>.sock`` there (published by an
    atomic rename once it serves: a name never points at a socket that does not answer
    yet).  **Who.**  Both ends check the other's credentials with ``SO_PEERCRED``: a holder
    sends only to a client of its uid, a client accepts only from a holder of its uid.  A
    peer of another uid is skipped with an :class:`UntrustedPeer` warning naming its pid and
    uid, and recorded in :attr:`rejected`; the same user is trusted (it can ptrace us).
    Cross-user sharing of one allocation is not supported: each user gets its own.
    **How long.**  :meth:`fetch` asks every holder at once and waits at most
    :data:`PEER_TIMEOUT` for the first valid answer, so neither name order nor silent
    holders matter; a holder whose process is gone (connection refused) has its socket file
    removed.  **Creating.**  When no holder answers, :meth:`acquire` creates the allocation
    under the creation lock (``flock`` of ``<key>.dh<index>.lock`` in the same directory),
    binding its socket before it creates, so no later failure can strand the allocation.
    **Left behind.**  A holder unpublishes at :meth:`close` and at exit; a killed one's socket
    file is removed by the next :meth:`fetch` of the heap; the lock file (empty but for a pid)
    stays, one per heap ever used."""

    def __init__(self, key: str, index: int, base: str | None = None) -> None:
        if not key or "/" in key or "\0" in key or key.startswith("."):
            raise ValueError(f"bad domain key {key!r}")
        self.index = index
        self.prefix = f"{key}.dh{index}."
        self.path = runtime_dir(base=base)
        """The private directory (see :func:`runtime_dir`)."""
        self.rejected: list[Rejection] = []
        """Peers refused for their credentials, oldest first (the last 64)."""
        self.silent: list[str] = []
        """Holders of this user that did not answer in the last :meth:`fetch`: ``"pid N"``
        (accepted, no answer within the round) or ``"<socket file> (not accepting)"``."""
        self._uid = os.getuid()
        self._dir = open_private_dir(self.path)
        self._server: socket.socket | None = None
        self._published = ""
        self._wake: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._own = -1

    # --------------------------------------------------------------- helpers
    def _at(self, name: str) -> str:
        """A socket address for ``name`` in the verified directory, through its descriptor."""
        return f"/proc/self/fd/{self._dir}/{name}"

    def _reject(self, pid: int, uid: int, where: str, reason: str) -> None:
        rec = Rejection(pid, uid, where, reason)
        self.rejected.append(rec)
        del self.rejected[:-64]
        warnings.warn(
            UntrustedPeer(
                f"device heap {self.index}: refused pid {pid} (uid {uid}) at {where}: {reason}; "
                f"only processes of uid {self._uid} share this heap's memory"
            ),
            stacklevel=3,
        )

    def _holders(self) -> list[str]:
        """Published holder sockets of this heap: socket files of this uid in the directory."""
        out = []
        for name in os.listdir(self._dir):
            if not (name.startswith(self.prefix) and name.endswith(".sock")):
                continue
            try:
                st = os.stat(name, dir_fd=self._dir, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISSOCK(st.st_mode) and st.st_uid == self._uid:
                out.append(name)
        return out[:_MAX_PEERS]

    # --------------------------------------------------------------- client side
    def fetch(self, timeout: float = PEER_TIMEOUT) -> tuple[int, Allocation] | None:
        """The descriptor from any trusted live holder, or None when none answered within
        ``timeout`` seconds (all holders are asked at once).  Holders that accepted and did
        not answer are listed in :attr:`silent`."""
        self.silent = []
        pending: dict[socket.socket, tuple[str, int]] = {}
        try:
            for name in self._holders():
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                s.setblocking(False)
                try:
                    s.connect(self._at(name))
                    pid, uid, _gid = _peercred(s)
                except ConnectionRefusedError:
                    s.close()  # its process is gone: tidy its name
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=self._dir)
                    continue
                except BlockingIOError:
                    s.close()  # its backlog is full: it has not accepted for a while
                    self.silent.append(f"{name} (not accepting)")
                    continue
                except OSError:
                    s.close()  # exited meanwhile: others will answer
                    continue
                if uid != self._uid:
                    s.close()
                    self._reject(pid, uid, os.path.join(self.path, name), "a holder of another user")
                    continue
                pending[s] = (name, pid)
            deadline = time.monotonic() + timeout
            with selectors.DefaultSelector() as sel:
                for s in pending:
                    sel.register(s, selectors.EVENT_READ, s)
                while pending:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    for ready, _ev in sel.select(left):
                        conn: socket.socket = ready.data
                        sel.unregister(conn)
                        pending.pop(conn)
                        got = self._read_hello(conn)
                        conn.close()
                        if got is not None:
                            return got
            self.silent += [f"pid {pid}" for _name, pid in pending.values()]
            return None
        finally:
            for s in pending:
                s.close()

    @staticmethod
    def _read_hello(s: socket.socket) -> tuple[int, Allocation] | None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(s, _HELLO.size, 1, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            return None
        if len(data) != _HELLO.size or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return None
        magic, size, gran, ordinal, gen = _HELLO.unpack(data)
        if magic != _MAGIC or size == 0 or gran == 0 or size % gran:
            os.close(fds[0])
            return None
        return fds[0], Allocation(size, gran, ordinal, gen)

    def acquire(
        self, create: Callable[[], tuple[int, Allocation]], timeout: float = 30.0
    ) -> tuple[int, Allocation, bool]:
        """(descriptor, allocation, created): fetched from a trusted holder, or made by
        ``create`` under the creation lock and then served (a fetched one is served by
        :meth:`serve` once the caller has mapped it).

        Bounded: returns or raises within ``timeout`` + :data:`PEER_TIMEOUT` seconds (plus the
        time ``create`` takes).  DeviceHeapUnavailable when a holder of this user accepted but
        never answered throughout (creating a second allocation beside a stopped holder would
        split the heap's memory in two: resume or end the pid named), or when another process
        held the creation lock throughout.  A ``create`` that raises, or a failure after it,
        leaves nothing behind: no socket, no lock, and the descriptor ``create`` returned is
        closed (the caller frees whatever else ``create`` made)."""
        deadline = time.monotonic() + timeout
        got = self.fetch()
        if got is not None:
            return got[0], got[1], False
        lock = os.open(
            self.prefix + "lock",
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=self._dir,
        )
        try:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise DeviceHeapUnavailable(
                            f"device heap {self.index}: another process of uid {self._uid} (pid "
                            f"{self._lock_owner(lock)}) holds the creation lock "
                            f"{os.path.join(self.path, self.prefix + 'lock')} for over {timeout:g} s "
                            f"and serves no allocation: end that process if it is hung, then retry"
                        ) from None
                    time.sleep(0.005)  # the holder publishes, then releases the lock
                    continue
                got = self.fetch()  # a holder may have appeared before we took the lock
                if got is not None:
                    return got[0], got[1], False
                if not self.silent:
                    break
                fcntl.flock(lock, fcntl.LOCK_UN)
                if time.monotonic() > deadline:
                    raise DeviceHeapUnavailable(
                        f"device heap {self.index}: holder(s) {', '.join(self.silent)} of uid "
                        f"{self._uid} in {self.path} do not answer (stopped or hung?) for over "
                        f"{timeout:g} s; a second allocation beside them would split the heap: resume "
                        f"or end them, then retry"
                    )
            os.pwrite(lock, f"{os.getpid()}\n".encode(), 0)
            srv, tmp = self._listen()  # before creating: nothing can fail between create and serve
            try:
                fd, info = create()
            except BaseException:
                self._discard(srv, tmp)
                raise
            try:
                self._start(srv, tmp, fd, info)
            except BaseException:
                self._discard(srv, tmp)
                os.close(fd)
                raise
            return fd, info, True
        finally:
            os.close(lock)  # releases the lock

    @staticmethod
    def _lock_owner(lock: int) -> str:
        raw = os.pread(lock, 16, 0).strip()
        return raw.decode() if raw.isdigit() else "unknown"

    # --------------------------------------------------------------- serving side
    def _listen(self) -> tuple[socket.socket, str]:
        """A listening socket bound under a hidden name (not yet published)."""
        tmp = f".tmp.{self.prefix}{os.getpid()}.{secrets.token_hex(6)}"
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            srv.bind(self._at(tmp))
            os.chmod(tmp, 0o600, dir_fd=self._dir)
            srv.listen(64)
        except BaseException:
            self._discard(srv, tmp)
            raise
        return srv, tmp

    def _discard(self, srv: socket.socket, name: str) -> None:
        srv.close()
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=self._dir)

    def _start(self, srv: socket.socket, tmp: str, fd: int, info: Allocation) -> None:
        """Serve a duplicate of ``fd`` on ``srv`` from a thread, then publish its name."""
        hello = _HELLO.pack(_MAGIC, info.size, info.granularity, info.ordinal, info.generation)
        own = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0)  # the thread's own: the caller may close fd
        wake = os.pipe2(os.O_CLOEXEC)
        srv.setblocking(False)  # a client that gave up between select and accept blocks nothing

        def loop() -> None:
            try:
                with selectors.DefaultSelector() as sel:
                    sel.register(srv, selectors.EVENT_READ)
                    sel.register(wake[0], selectors.EVENT_READ)
                    while True:
                        if any(k.fileobj == wake[0] for k, _ in sel.select()):
                            return
                        try:
                            conn, _ = srv.accept()
                        except OSError:
                            continue
                        with conn:
                            try:
                                pid, uid, _gid = _peercred(conn)
                                if uid != self._uid:
                                    self._reject(pid, uid, "client", "a client of another user")
                                    continue
                                conn.settimeout(PEER_TIMEOUT)
                                socket.send_fds(conn, [hello], [own])
                            except OSError:
                                pass  # that client went away
            finally:
                os.close(own)

        name = f"{self.prefix}{os.getpid()}.{secrets.token_hex(6)}.sock"
        thread = threading.Thread(target=loop, name=f"hostless-devheap-{self.index}", daemon=True)
        try:
            thread.start()
            os.rename(tmp, name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
        except BaseException:
            os.write(wake[1], b"x")
            if thread.is_alive():
                thread.join()
            else:
                os.close(own)
            for p in wake:
                os.close(p)
            raise
        self._server, self._published, self._wake, self._thread = srv, name, wake, thread
        self._own = own
        _serving.add(self)

    def serve(self, fd: int, info: Allocation) -> None:
        """Serve ``fd`` (a duplicate of it: the caller keeps its own) to this user's other
        processes until :meth:`close` or exit.  Idempotent."""
        if self._server is not None:
            return
        srv, tmp = self._listen()
        try:
            self._start(srv, tmp, fd, info)
        except BaseException:
            self._discard(srv, tmp)
            raise

    def close(self) -> None:
        """Stop serving and unpublish (the allocation lives on in other holders).  Returns once
        the serving thread has ended and dropped its duplicate of the descriptor."""
        if self._server is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._published, dir_fd=self._dir)
            assert self._wake is not None and self._thread is not None
            os.write(self._wake[1], b"x")
            self._thread.join()
            for p in self._wake:
                os.close(p)
            self._server.close()
            self._server, self._wake, self._thread = None, None, None
            _serving.discard(self)

    def _forget_after_fork(self) -> None:
        """In a forked child: the serving thread did not come along, so drop the copies of its
        socket and descriptors (a listener nobody accepts on would look like a stopped holder)."""
        if self._server is not None and self._wake is not None:
            for f in (*self._wake, self._own):
                with contextlib.suppress(OSError):
                    os.close(f)
            self._server.close()
            self._server, self._wake, self._thread = None, None, None

    def __del__(self) -> None:  # a serving broker is kept alive by its thread
        if getattr(self, "_dir", -1) >= 0:
            with contextlib.suppress(OSError):
                os.close(self._dir)


_serving: weakref.WeakSet[Broker] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for b in list(_serving):
        b._forget_after_fork()
    _serving.clear()


def _at_exit() -> None:  # unpublish, so no socket file outlives a process that exits normally
    for b in list(_serving):
        with contextlib.suppress(OSError):
            os.unlink(b._published, dir_fd=b._dir)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
