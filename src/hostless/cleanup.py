"""Cleanup: finding and removing domains that no live process uses.

A domain file outlives its processes: /dev/shm keeps it until someone unlinks
it.  A creator can ask for the name to go with it
(``Domain.create(..., unlink_on_close=True)``), but a creator killed with
SIGKILL cannot.  This module tells a stale domain from a live one without
joining it, and removes stale ones (``hostless gc``).

Liveness is the participants' own liveness locks: every joined participant
holds an OFD write lock on one byte at ``HL_LOCK_BASE + index`` of the domain
file (see :mod:`hostless.recovery`), and the kernel drops it when the process
dies.  A domain is *stale* when

- its header is a hostless domain of this ABI (or it was never initialised:
  its creator died between creating the file and writing the header),
- no participant lock byte is held, and
- the file is older than ``min_age`` seconds (a creator has just made it
  ready, but has not taken its own lock yet, for a few microseconds).

Removal takes every participant lock byte itself before it unlinks, so no
process can join the domain between the check and the unlink: a process that
tries in that instant sees a full domain (:class:`~hostless.DomainFull`), and
one that opened the file just before keeps using its (now nameless) mapping,
as after any ``unlink``.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import time
from dataclasses import dataclass

from ._abi import C

__all__ = ["MIN_AGE", "DomainFile", "scan", "probe", "remove_if_stale", "gc", "live_participants", "listing"]

MIN_AGE = 1.0
"""Seconds a lock-less domain file must exist before it counts as stale."""

_FLOCK = "hhqqi4x"  # struct flock on Linux x86-64 and AArch64: type, whence, start, len, pid


@dataclass(frozen=True)
class DomainFile:
    """What :func:`probe` found at one path (read without joining)."""

    path: str
    size: int
    age: float
    """Seconds since the file's inode last changed (creation, resize)."""
    state: str
    """'live' (some participant lock is held), 'stale' (none is held and the
    file is older than ``min_age``), 'young' (none is held, but the file is
    newer than ``min_age``), 'foreign' (not a hostless domain of this ABI, or
    owned by another user: never touched)."""
    reason: str
    """One line saying why: the holder's pid for 'live', what is wrong for 'foreign'."""


def _lock_range(fd: int, cmd: int, ltype: int) -> tuple[int, int]:
    """fcntl ``cmd`` (F_OFD_GETLK / F_OFD_SETLK) with ``ltype`` over every
    participant lock byte; returns (l_type, l_pid) as the kernel left them."""
    req = struct.pack(_FLOCK, ltype, os.SEEK_SET, int(C.LOCK_BASE), int(C.MAX_PARTICIPANTS), 0)
    out = fcntl.fcntl(fd, cmd, req)
    ltype_out, _wh, _start, _len, pid = struct.unpack(_FLOCK, out)
    return ltype_out, pid


_PART_FLAGS = int(C.P_PID) + 4  # hl_participant.flags
_PART_FLAG_PIDLIVE = 1


def _lockless_participant(fd: int, head: bytes, size: int) -> int:
    """The pid of a running participant that joined without its liveness lock (a
    reader's read locks kept it off: ``HL_PART_FLAG_PIDLIVE``, docs/abi.md section 8), or 0.
    Errs on "running": a recycled pid keeps a stale domain until that process ends."""

    def u(off: int, n: int, buf: bytes = head) -> int:
        return int.from_bytes(buf[off : off + n], "little")

    cap = min(u(int(C.H_PARTICIPANT_CAPACITY), 4), int(C.MAX_PARTICIPANTS))
    base, psize = u(int(C.H_PARTICIPANTS_OFFSET), 8), int(C.PARTICIPANT_SIZE)
    if base + cap * psize > size:
        return 0
    table = os.pread(fd, cap * psize, base)
    for i in range(cap):
        p = i * psize
        state = u(p + int(C.P_CTL), 8, table) & 0xFF
        if state not in (int(C.PART_ALIVE), int(C.PART_RECOVERING)):
            continue
        pid = u(p + int(C.P_PID), 4, table)
        if not u(p + _PART_FLAGS, 4, table) & _PART_FLAG_PIDLIVE or not 0 < pid < 1 << 31:
            continue
        try:
            os.kill(pid, 0)
        except PermissionError:
            return pid
        except OSError:
            continue
        return pid
    return 0


def _classify(fd: int, path: str, min_age: float, uninitialised: bool) -> DomainFile:
    st = os.fstat(fd)
    age = max(0.0, time.time() - st.st_ctime)

    def found(state: str, reason: str) -> DomainFile:
        return DomainFile(path, st.st_size, age, state, reason)

    if not stat.S_ISREG(st.st_mode):
        return found("foreign", "not a regular file")
    if st.st_uid != os.geteuid():
        return found("foreign", f"owned by user {st.st_uid}")
    hsize = int(C.HEADER_SIZE)
    # what the file holds, also when it is smaller than a header: a foreign file of a few KiB
    # must not pass for an uninitialised domain (whose bytes are all zero)
    head = os.pread(fd, min(st.st_size, hsize), 0)
    magic = int.from_bytes(head[0:8], "little") if len(head) >= 8 else 0
    if magic == 0 and any(head):
        return found("foreign", "not a hostless domain (no magic, but not an uninitialised file either)")
    if magic == int(C.MAGIC) and len(head) < hsize:
        return found("foreign", f"a hostless magic, but {st.st_size} bytes: smaller than a domain header")
    if head and magic not in (0, int(C.MAGIC)):
        return found("foreign", f"not a hostless domain (magic {magic:#x})")
    if magic != int(C.MAGIC) and not uninitialised:
        return found("foreign", "no hostless header (an uninitialised domain looks the same: name it)")
    vo = int(C.H_ABI_VERSION)
    version = int.from_bytes(head[vo : vo + 4], "little") if head else 0
    if magic == int(C.MAGIC) and version != int(C.ABI_VERSION):
        return found("foreign", f"hostless ABI version {version}, this library speaks {int(C.ABI_VERSION)}")
    ltype, pid = _lock_range(fd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK)
    if ltype != fcntl.F_UNLCK:
        return found("live", f"participant lock held (pid {pid})" if pid > 0 else "participant lock held")
    if magic == int(C.MAGIC):
        pid = _lockless_participant(fd, head, st.st_size)
        if pid:
            return found("live", f"participant pid {pid} runs, joined without its lock (a reader held it)")
    what = "initialised" if magic == int(C.MAGIC) else "never initialised"
    if age < min_age:
        return found("young", f"{what}, no participant, but only {age:.1f} s old")
    return found("stale", f"{what}, no participant holds its liveness lock")


def probe(path: str, min_age: float = MIN_AGE, uninitialised: bool = True) -> DomainFile:
    """Classify the file at ``path`` without joining it (see :class:`DomainFile`).

    Opens it without following a symbolic link (a link is 'foreign').  A file
    without a hostless header (its creator died before writing it) counts as
    a domain only with ``uninitialised`` (the default: the caller named the
    file); otherwise it is 'foreign'.  Raises FileNotFoundError when it does
    not exist.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno in (40, 6):  # ELOOP (a symbolic link), ENXIO
            return DomainFile(path, 0, 0.0, "foreign", "a symbolic link or special file")
        raise
    try:
        return _classify(fd, path, min_age, uninitialised)
    finally:
        os.close(fd)


def remove_if_stale(path: str, min_age: float = MIN_AGE, uninitialised: bool = True) -> DomainFile:
    """Unlink ``path`` if it is a stale domain; return what was found.

    The check and the unlink happen while this call holds every participant
    lock byte of the file, and only if ``path`` still names the file that was
    checked: a live domain, a replaced file or a foreign file is never removed.
    The returned state is 'removed' when the file was unlinked.
    """
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        found = _classify(fd, path, min_age, uninitialised)
        if found.state != "stale":
            return found
        try:
            _lock_range(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK)
        except OSError:  # someone joined after the check
            return DomainFile(path, found.size, found.age, "live", "a participant joined during the check")
        try:
            st, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return DomainFile(path, found.size, found.age, "gone", "removed by someone else")
        if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
            return DomainFile(path, found.size, found.age, "live", "the name now points to another file")
        os.unlink(path)
        return DomainFile(path, found.size, found.age, "removed", found.reason)
    finally:
        os.close(fd)  # drops the locks taken above


def scan(directory: str = "/dev/shm", min_age: float = MIN_AGE) -> list[DomainFile]:
    """Probe every regular file of ``directory`` that carries a hostless
    header (files without one are never listed: an empty file may be anyone's),
    skipping files that vanish meanwhile."""
    out = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            d = probe(entry.path, min_age, uninitialised=False)
        except (FileNotFoundError, PermissionError):
            continue
        if d.state != "foreign" or d.reason.startswith("hostless ABI"):  # other ABI versions are listed
            out.append(d)
    return out


def gc(directory: str = "/dev/shm", min_age: float = MIN_AGE, dry_run: bool = False) -> list[DomainFile]:
    """Remove every stale domain of ``directory`` (see the module docstring).

    Returns one entry per hostless domain file seen, with state 'removed' for
    those unlinked ('stale' for those that would be, with ``dry_run``).
    Files of other users and files that are not hostless domains are left
    alone and not listed.
    """
    out = []
    for d in scan(directory, min_age):
        if d.state == "stale" and not dry_run:
            try:
                d = remove_if_stale(d.path, min_age, uninitialised=False)
            except FileNotFoundError:
                continue
        out.append(d)
    return out


def live_participants(path: str) -> int:
    """How many participants of the domain at ``path`` are alive: slots ALIVE or RECOVERING
    whose liveness lock is held (or that joined without it and whose process runs).  Read
    without joining: the file is opened read-only and only F_OFD_GETLK is asked; -1 when the
    file is not a readable domain of this ABI."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return -1
    try:
        st = os.fstat(fd)
        hsize = int(C.HEADER_SIZE)
        if not stat.S_ISREG(st.st_mode) or st.st_size < hsize:
            return -1
        head = os.pread(fd, hsize, 0)

        def u(off: int, n: int, buf: bytes = head) -> int:
            return int.from_bytes(buf[off : off + n], "little")

        if u(0, 8) != int(C.MAGIC) or u(int(C.H_ABI_VERSION), 4) != int(C.ABI_VERSION):
            return -1
        cap = u(int(C.H_PARTICIPANT_CAPACITY), 4)
        base, psize = u(int(C.H_PARTICIPANTS_OFFSET), 8), int(C.PARTICIPANT_SIZE)
        if not 0 < cap <= int(C.MAX_PARTICIPANTS) or not hsize <= base <= st.st_size:
            return -1
        if cap * psize > st.st_size - base:  # the table must lie inside the file
            return -1
        table = os.pread(fd, cap * psize, base)
        n = 0
        for i in range(cap):
            state = u(i * psize + int(C.P_CTL), 8, table) & 0xFF
            if state not in (int(C.PART_ALIVE), int(C.PART_RECOVERING)):
                continue
            req = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, int(C.LOCK_BASE) + i, 1, 0)
            ltype = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_OFD_GETLK, req))[0]
            if ltype == fcntl.F_WRLCK:
                n += 1
            elif u(i * psize + _PART_FLAGS, 4, table) & _PART_FLAG_PIDLIVE:
                pid = u(i * psize + int(C.P_PID), 4, table)
                try:
                    if 0 < pid < 1 << 31:
                        os.kill(pid, 0)
                        n += 1
                except PermissionError:
                    n += 1
                except OSError:
                    pass
        return n
    except OSError:
        return -1
    finally:
        os.close(fd)


def listing(directory: str = "/dev/shm", min_age: float = MIN_AGE) -> list[dict[str, object]]:
    """What ``hostless ls`` shows: one dict per hostless domain file of ``directory`` (name,
    path, owner, size, age, live participants, state, stale, reason), read without joining."""
    import pwd

    out: list[dict[str, object]] = []
    for d in scan(directory, min_age):
        try:
            uid = os.stat(d.path, follow_symlinks=False).st_uid
        except OSError:
            continue
        try:
            owner = pwd.getpwuid(uid).pw_name
        except KeyError:
            owner = str(uid)
        out.append(
            {
                "name": os.path.basename(d.path),
                "path": d.path,
                "owner": owner,
                "size": d.size,
                "age_s": round(d.age, 1),
                "participants": live_participants(d.path),
                "state": d.state,
                "stale": d.state == "stale",
                "reason": d.reason,
            }
        )
    return out
