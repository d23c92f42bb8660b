"""The domain: one shared-memory region holding the tables every participant uses.

A domain is a file in /dev/shm (or any file descriptor that can be mapped
shared, passed over a Unix socket).  No process owns it: any process opens it
by name, joins as a participant, and leaves with :meth:`Domain.close`.  A
participant that dies without leaving is recovered by any live participant
(see :mod:`hostless.recovery`).
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import _core, inspection, names, shm, signals
from ._abi import HEADER_DTYPE, C, owner_code
from .buffer import Buffer
from .domain_objects import MAX_QUEUE_CAPACITY as MAX_QUEUE_CAPACITY
from .domain_objects import DomainObjects, _handle
from .errors import DomainClosed
from .fence import Fence
from .inspection import Participant
from .queue import Queue
from .shm import MAX_REGION as MAX_REGION
from .shm import SHM_DIR, check_spin, path_of
from .shm import check_join_args as _check_join_args
from .shm import parse_size as parse_size
from .shm import wait_ready as _wait_ready
from .timeline import Point, Timeline

if TYPE_CHECKING:
    from ._aio import Notifier

__all__ = ["Domain", "Participant", "SHM_DIR"]

_KIND_FENCE = int(C.KIND_FENCE)
_KIND_TIMELINE = int(C.KIND_TIMELINE)

DEFAULT_DEVICE_HEAP = 256 << 20
"""Size of the ``"cuda:0"`` device heap of a domain created without ``device_heaps``."""

_live: weakref.WeakSet[Domain] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A forked child shares the parent's open file description, hence its
    # liveness lock: keeping it would hide the parent's death.  The child must
    # open the domain again.
    for d in list(_live):
        d._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Domain(DomainObjects):
    """A joined domain.  Create one with :meth:`create`, :meth:`open` or :meth:`from_fd`.

    The object is this process's participant: the references it takes, the
    fences it owns and its liveness lock belong to it.  It is safe to use from
    several threads.  After ``fork()`` the child's copy is closed: open the
    domain again in the child.
    """

    _core: _core.Core
    _name: str | None
    _closed: bool
    _lock: threading.Lock
    _notifier: Notifier | None
    _map: mmap.mmap | None
    _layouts: dict[Any, tuple[tuple[int, ...], Any, int, bytes, str]]
    _fd: int
    _unlink_on_close: tuple[str, int, int] | None
    _signal_key: int
    _index: int
    _incarnation: int
    _spin: float
    _devices: dict[str, int]

    def __init__(self, *_: Any, **__: Any) -> None:
        raise TypeError("use Domain.create(), Domain.open() or Domain.from_fd()")

    # ------------------------------------------------------------------ setup
    @classmethod
    def _attach(
        cls,
        fd: int,
        name: str | None,
        init: tuple[object, ...] | None,
        label: str | None,
        kind: str,
        watchdog_interval: float,
        spin: float,
    ) -> Domain:
        """Join through ``fd``, which this call consumes: on success the
        domain owns it, on failure it is closed here (exactly once)."""
        try:
            if label is None:
                label = f"pid{os.getpid()}"
            _check_join_args(label, kind, watchdog_interval, spin)
            self = object.__new__(cls)
            self._core = _core.Core()
            self._name = name
            self._closed = False
            self._lock = threading.Lock()
            self._notifier = None
            self._map = None
            self._layouts = {}
            self._unlink_on_close = None
            self._signal_key = 0
            wd_ns = int(watchdog_interval * 1e9) if watchdog_interval else 0
            self._core.attach(fd, init, label.encode()[:31].decode(errors="ignore"), kind[:15], wd_ns)
        except BaseException:
            os.close(fd)  # the core did not take it
            raise
        # the device heaps as validated at attach: "cuda:N" -> heap index
        self._devices = {f"cuda:{o}": i for i, (_k, o) in enumerate(self._core.device_heaps())}
        try:
            self._fd = fd
            self.spin = spin
            info = self._core.info()
            self._index = int(info["me"])
            self._incarnation = int(info["incarnation"])
            if self._core.trace_enabled():  # the label outlives the participant slot
                # one writer of the trace's user records: the engine (hle_trace_user)
                C.trace_user(self._core, int(C.TRACE_JOIN), self.participant_id & (2**64 - 1),
                             f"{label} ({kind})".replace("\0", " "))
        except BaseException:
            self._core.leave()  # closes fd
            raise
        _live.add(self)
        return self

    @classmethod
    def create(
        cls,
        name: str,
        *,
        fences: int = 4096,
        participants: int = 64,
        mode: int = 0o600,
        heap: int | str = 0,
        device_heaps: dict[str, int | str] | None = None,
        queues: int | str = 0,
        trace: int | str = 0,
        poll_interval: float = 1e-3,
        spin: float = 50e-6,
        watchdog_interval: float = 0.02,
        label: str | None = None,
        kind: str = "cpu",
        unlink_on_close: bool = False,
        replace_stale: bool = False,
    ) -> Domain:
        """Create the domain ``/dev/shm/<name>`` and join it.

        ``fences``: fence/timeline slots (1..2**24).  ``participants``: at most
        64 processes joined at once.  ``mode``: file permissions.
        ``heap``: bytes of the shared (host) heap, 0 for none.
        ``device_heaps``: GPU memory for ``buffer(..., device="cuda:N")``, as
        ``{"cuda:N": bytes}`` (at most 8 heaps; sizes rounded up to 2 MiB, at
        most 1 TiB each); default ``{"cuda:0": 256 MiB}``, ``{}`` for none.
        The domain file holds only their bookkeeping (one bit per 256 bytes);
        the device memory itself is allocated by :mod:`hostless.devmem` when a
        process first touches it.  A domain with device heaps and ``heap=0``
        gets a 256 KiB host heap for the device buffers' metadata.
        ``poll_interval``: the longest a sleeping host waiter goes without
        re-reading a word (bounds how late it sees a device's plain store),
        1 us .. 0.1 s.
        ``spin``: how long a wait spins before it sleeps (per-wait override).
        ``watchdog_interval``: how often this participant checks the others'
        liveness and recovers the dead (0 disables; recovery then happens on
        :meth:`reap` and in other participants).
        ``unlink_on_close``: :meth:`close` also removes the name (if it still
        names this domain); processes that have the domain open keep using it.
        SIGTERM and SIGHUP remove it too, then run the handler the program had
        set, or end the process as their default action does
        (:mod:`hostless.signals`).  A creator killed with SIGKILL cannot
        remove it: see ``replace_stale`` and ``hostless gc``.
        ``replace_stale``: if the name exists but no participant of that domain
        is alive (see :mod:`hostless.cleanup`), remove it and create a new
        one.  A live domain, or a file that is not a hostless domain, is never
        removed: FileExistsError says which it is.

        Raises DomainExists (a FileExistsError) if the name exists and is not
        replaced, saying what holds it and what to do,
        ValueError on bad sizes or device names, OutOfMemory when the domain is larger than the
        free space of /dev/shm.
        """
        if label is None:
            label = f"pid{os.getpid()}"
        _check_join_args(label, kind, watchdog_interval, spin)
        path = path_of(name)
        devs = shm.parse_device_heaps(
            {"cuda:0": DEFAULT_DEVICE_HEAP} if device_heaps is None else device_heaps
        )
        fd, init = shm.create_file(
            path, fences, participants, mode, (queues, trace, heap), poll_interval, replace_stale, devs
        )
        try:
            st = os.fstat(fd)
            self = cls._attach(fd, name, init, label, kind, watchdog_interval, spin)  # consumes fd
        except BaseException:
            os.unlink(path)
            raise
        if unlink_on_close:
            self._unlink_on_close = (path, st.st_dev, st.st_ino)
            self._signal_key = signals.register(path, st.st_dev, st.st_ino)  # SIGTERM, SIGHUP
        return self

    @classmethod
    def open(
        cls,
        name: str,
        *,
        label: str | None = None,
        kind: str = "cpu",
        spin: float = 50e-6,
        watchdog_interval: float = 0.02,
        timeout: float = 2.0,
        allow_other_owner: bool = False,
        wait_for: float = 0.0,
    ) -> Domain:
        """Open ``/dev/shm/<name>`` and join it.

        Waits up to ``wait_for`` seconds for the name to appear (a process
        started before the domain's creator), then up to ``timeout`` seconds
        for a creator that is still initialising.  Raises FileNotFoundError
        when missing (after ``wait_for``), CorruptDomain when
        the file is not a domain of this ABI, DomainFull when every participant
        slot is taken by a live participant.  The file is opened without
        following a symbolic link, and must be a regular file owned by this
        user (PermissionError otherwise) unless ``allow_other_owner`` is true:
        a domain planted by another user could be rewritten by it at will.
        """
        fd = shm.open_file(path_of(name), wait_for, timeout, allow_other_owner)
        return cls._attach(fd, name, None, label, kind, watchdog_interval, spin)  # consumes fd

    @classmethod
    def from_fd(
        cls,
        fd: int,
        *,
        label: str | None = None,
        kind: str = "cpu",
        spin: float = 50e-6,
        watchdog_interval: float = 0.02,
    ) -> Domain:
        """Join the domain behind ``fd`` (for example received with SCM_RIGHTS).

        The domain is reopened through /proc/self/fd so that this participant
        has its own open file description (its liveness lock is its own); the
        caller keeps ownership of ``fd``.
        """
        own = os.open(f"/proc/self/fd/{int(fd)}", os.O_RDWR | os.O_CLOEXEC)
        try:
            _wait_ready(own, 2.0)
        except BaseException:
            os.close(own)
            raise
        return cls._attach(own, None, None, label, kind, watchdog_interval, spin)  # consumes own

    @staticmethod
    def unlink(name: str) -> None:
        """Remove the name.  Participants that have it open keep using it."""
        os.unlink(path_of(name))

    def fileno(self) -> int:
        """The domain's file descriptor (to pass to another process)."""
        self._check_open()
        return self._fd

    # ------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Leave the domain.

        Drops every reference this participant holds (objects nobody else holds
        are freed, ACTIVE ones signaled CANCEL); ACTIVE fences it owns are
        signaled OWNER_LEFT and timelines it owns fail with OWNER_LEFT (leaving
        is not dying: a killed participant's get OWNER_DIED; points a timeline
        reached stay SUCCESS either way; docs/abi.md section 8).  A domain created with
        ``unlink_on_close=True`` also loses its name here, if the name still
        refers to it.  Idempotent.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._notifier is not None:
            self._notifier.stop()
        if self._signal_key:
            signals.unregister(self._signal_key)
        if self._unlink_on_close is not None:
            path, dev, ino = self._unlink_on_close
            try:
                now = os.stat(path, follow_symlinks=False)
                if (now.st_dev, now.st_ino) == (dev, ino):
                    os.unlink(path)
            except FileNotFoundError:
                pass
        self._core.leave()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass
        _live.discard(self)

    def _forked(self) -> None:
        self._closed = True
        self._core.abandon()
        self._notifier = None

    def __enter__(self) -> Domain:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"participant {self.participant_id}"
        return f"<hostless.Domain {self._name or '(fd)'} {state}>"

    def _check_open(self) -> None:
        if self._closed:
            raise DomainClosed("domain is closed")

    # ------------------------------------------------------------ properties
    @property
    def name(self) -> str | None:
        """The /dev/shm name, or None for a domain opened from an fd."""
        return self._name

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def participant_id(self) -> int:
        """This participant's id (incarnation << 8 | slot index)."""
        return (self._incarnation << 8) | self._index

    @property
    def capacity(self) -> dict[str, int]:
        """Table capacities: fences, participants, heap/queue/trace bytes (heap: 0 when
        the domain has only the small heap of its device buffers' metadata; the device
        heaps are in :attr:`devices` and ``lowlevel.device_heaps``)."""
        h = self.header()
        return {
            "fences": int(h["fence_capacity"]),
            "participants": int(h["participant_capacity"]),
            "heap": 0 if self._core.info()["meta_heap"] else int(h["heap_size"]),
            "queues": int(h["queues_size"]),
            "trace": int(h["trace_size"]),
        }

    @property
    def spin(self) -> float:
        """Default seconds a wait spins before it sleeps on a futex."""
        return self._spin

    @spin.setter
    def spin(self, seconds: float) -> None:
        seconds = check_spin(seconds)  # before anything is stored: nan, inf, < 0 and > 3600 s refused
        self._core.set_spin(int(seconds * 1e9))
        self._spin = seconds

    def raw(self) -> mmap.mmap:
        """A read-write mmap of the whole domain (for inspection and tools)."""
        self._check_open()
        return self._raw_map()

    def _raw_map(self) -> mmap.mmap:
        if self._map is None:
            # mmap keeps a dup of the descriptor it maps: map through a fresh
            # open file description, so that it never carries (and, after a
            # fork, never keeps alive) this participant's liveness lock
            fd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDWR | os.O_CLOEXEC)
            try:
                self._map = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            # a truncated file seen through this mapping is an error, not a SIGBUS
            self._core.guard_map(self._map)
        return self._map

    def header(self) -> Any:
        """The header as a NumPy record (a copy)."""
        import numpy as np

        return np.frombuffer(self.raw(), dtype=HEADER_DTYPE, count=1)[0].copy()

    @property
    def participants(self) -> list[Participant]:
        """Every non-free participant slot."""
        return inspection.participants(self)

    # --------------------------------------------------------------- objects
    def _owner(self, owner: int | Participant | None) -> int:
        if owner is None:
            return 0
        if isinstance(owner, Participant):
            owner = owner.id
        if isinstance(owner, bool) or not isinstance(owner, int) or owner < 0:
            raise TypeError("owner must be a participant id (int) or a Participant")
        return owner_code(owner)

    def _owner_error(self, owner: int | Participant | None, e: ValueError) -> ValueError:
        if owner is None or "not alive" not in str(e):
            return e
        return inspection.owner_error(self, owner.id if isinstance(owner, Participant) else int(owner))

    def fence(self, owner: int | Participant | None = None) -> Fence:
        """Create an ACTIVE fence and take a reference to it.

        ``owner`` is the participant expected to signal it (default: this
        one); if the owner dies before signaling, recovery signals OWNER_DIED.
        Raises DomainFull when the fence table is full.
        """
        if self._closed:  # _check_open(), inlined: this is the hot path of create+signal+release
            raise DomainClosed("domain is closed")
        try:  # (free in CPython 3.11+ when nothing is raised)
            f: Fence = self._core.new(Fence, self, _KIND_FENCE, 0 if owner is None else self._owner(owner))
        except ValueError as e:
            raise self._owner_error(owner, e) from None
        return f

    # ------------------------------------------------------------------ names
    def publish(
        self, name: str, obj: Fence | Timeline | Point | Buffer | Queue, *, replace: bool = False
    ) -> None:
        """Publish ``obj`` as ``name`` in the domain's name table, for other processes'
        :meth:`lookup`.  The entry holds no reference: it lives while the object does.
        NameTaken when another live object has the name (``replace=True`` rebinds it),
        DomainFull when the table's 239 entries (names.MAX_NAMES) are taken.  See :mod:`hostless.names`."""
        self._check_open()
        names.publish(self, name, obj, replace)

    def unpublish(self, name: str) -> None:
        """Remove ``name`` from the name table (KeyError when nothing has it)."""
        self._check_open()
        names.unpublish(self, name)

    def lookup(self, name: str, timeout: float | None = 0.0) -> Any:
        """A new reference to the Fence, Timeline, Buffer or Queue published as ``name``,
        waiting up to ``timeout`` seconds (None: forever) for it to be published.
        KeyError (no wait) or TimeoutError when it is not there."""
        self._check_open()
        return names.lookup(self, name, timeout)

    def names(self) -> dict[str, int]:
        """The live entries of the name table: name -> handle."""
        self._check_open()
        return names.entries(self)

    def import_fence(self, handle: int) -> Fence:
        """Take a reference to the fence (or merged fence) ``handle``.

        Raises InvalidHandle for a stale, forged or foreign handle or for a
        timeline handle.
        """
        self._check_open()
        f: Fence = self._core.adopt(Fence, self, _handle(handle), _KIND_FENCE)
        return f

    def timeline(self, initial: int = 0, owner: int | Participant | None = None) -> Timeline:
        """Create a timeline at ``initial`` and take a reference to it."""
        self._check_open()
        if isinstance(initial, bool) or not isinstance(initial, int):
            raise TypeError("initial must be an int")
        if not 0 <= initial <= int(C.TIMELINE_MAX):
            raise ValueError(f"initial must be in 0..2**62-1, got {initial}")
        try:
            t: Timeline = self._core.new(Timeline, self, _KIND_TIMELINE, self._owner(owner))
        except ValueError as e:
            raise self._owner_error(owner, e) from None
        if initial:
            t.signal(initial)
        return t

    def import_timeline(self, handle: int) -> Timeline:
        """Take a reference to the timeline ``handle`` (InvalidHandle otherwise)."""
        self._check_open()
        t: Timeline = self._core.adopt(Timeline, self, _handle(handle), _KIND_TIMELINE)
        return t

    def trace_enabled(self) -> bool:
        """True when the domain was created with a trace ring (``trace=...``)."""
        return bool(self._core.trace_enabled())

    # -------------------------------------------------------------- recovery
    def reap(self) -> list[int]:
        """Recover every dead participant now; returns the ids recovered.

        Their ACTIVE fences and timelines become OWNER_DIED (waiters wake),
        their references are dropped and objects nobody holds are freed.
        """
        self._check_open()
        return [int(x) for x in self._core.reap()]

    def check(self, settle: float = 5.0) -> list[str]:
        """Every invariant violation found in the shared tables (empty when consistent).

        A recovery in flight (a participant RECOVERING while a live recoverer
        holds its liveness lock) is not a violation: ``check`` first waits up
        to ``settle`` seconds for such recoveries to finish.  One still
        running after that is reported as in flight; a RECOVERING participant
        whose recoverer died is reported as stuck (the next :meth:`reap` takes
        it over).  Exact when the domain is quiescent otherwise: operations in
        flight in other processes can show up as transient findings.
        """
        return inspection.check(self, settle)

    def notifier(self) -> Notifier:
        """The per-domain thread that completes asyncio waits and callbacks."""
        from ._aio import Notifier

        self._check_open()
        with self._lock:
            if self._notifier is None:
                self._notifier = Notifier(self._core)
            return self._notifier
