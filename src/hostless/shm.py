"""A domain's file: its name under /dev/shm, the sizes and join arguments a
creator passes, and waiting for a creator that is still initialising it.

Checked before anything is created or joined, so that a bad argument never
leaves a half-made file behind.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import time

from . import _core
from ._abi import C
from .cleanup import MIN_AGE, remove_if_stale
from .errors import CorruptDomain, DomainExists, OutOfMemory

__all__ = [
    "SHM_DIR",
    "MAX_REGION",
    "path_of",
    "check_join_args",
    "parse_size",
    "wait_ready",
    "check_space",
    "replace_stale",
    "create_file",
    "parse_device",
    "parse_device_heaps",
    "open_file",
]

SHM_DIR = "/dev/shm"
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def path_of(name: str) -> str:
    """``/dev/shm/<name>`` for a valid domain name (ValueError otherwise; a leading / is dropped)."""
    name = name[1:] if name.startswith("/") else name
    if not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"invalid domain name {name!r}: use 1-200 characters from [A-Za-z0-9._-]")
    return os.path.join(SHM_DIR, name)


def check_join_args(label: object, kind: object, watchdog_interval: object, spin: object) -> None:
    """Arguments of create/open/from_fd, checked before anything is joined."""
    if not isinstance(label, str):
        raise TypeError(f"label must be a str, got {type(label).__name__}")
    if not isinstance(kind, str) or not kind:
        raise ValueError("kind must be a non-empty string such as 'cpu'")
    for what, v in (("watchdog_interval", watchdog_interval), ("spin", spin)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{what} must be a number of seconds, got {type(v).__name__}")
        if not 0 <= v <= 3600:
            raise ValueError(f"{what} must be in 0..3600 s (0 disables), got {v!r}")


MAX_SPIN = 3600.0
"""The largest spin, in seconds, any wait or agent takes (as for join arguments)."""


def check_spin(value: object, what: str = "spin") -> float:
    """``value`` as seconds of spinning: a finite number in 0..MAX_SPIN (TypeError /
    ValueError otherwise, before anything stores it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    if not 0 <= value <= MAX_SPIN:  # also refuses nan and inf
        raise ValueError(f"{what} must be seconds in 0..{MAX_SPIN:g}, got {value!r}")
    return float(value)


MAX_REGION = 1 << 46  # 64 TiB: larger heap/queue/trace sizes are refused, never wrapped


def parse_size(size: int | str) -> int:
    """``4096``, ``"64K"``, ``"256M"``, ``"8G"`` -> bytes."""
    if isinstance(size, bool):
        raise TypeError("size must be an int or a string such as '256M'")
    if isinstance(size, int):
        n = size
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(i?B)?\s*", str(size), re.IGNORECASE)
        if not m:
            raise ValueError(f"cannot parse size {size!r} (examples: 4096, '64K', '256M', '8G')")
        mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
        n = int(m.group(1)) * mult
    if not 0 <= n <= MAX_REGION:
        raise ValueError(f"size must be in 0..{MAX_REGION} bytes, got {size!r}")
    return n


def wait_ready(fd: int, timeout: float) -> None:
    """Return once the domain file behind ``fd`` is initialised, or at once when it is a domain
    of another ABI version (the attach then raises DomainVersionMismatch); CorruptDomain when it
    is not a domain, or still not ready after ``timeout`` seconds (its creator died or is slow)."""
    deadline = time.monotonic() + timeout
    hsize = int(C.HEADER_SIZE)
    while True:
        st = os.fstat(fd)
        if st.st_size >= hsize:
            head = os.pread(fd, hsize, 0)
            ready = int.from_bytes(head[int(C.H_READY) : int(C.H_READY) + 4], "little")
            magic = int.from_bytes(head[0:8], "little")
            abi = int.from_bytes(head[int(C.H_ABI_VERSION) : int(C.H_ABI_VERSION) + 4], "little")
            if ready == 1 or (magic == int(C.MAGIC) and abi != int(C.ABI_VERSION)):
                return  # another ABI's `ready` may lie elsewhere: the attach says DomainVersionMismatch
            if magic not in (0, int(C.MAGIC)):
                raise CorruptDomain(f"not a hostless domain (magic {magic:#x})")
        if time.monotonic() >= deadline:
            raise CorruptDomain("domain is not initialised (its creator died or is still starting)")
        time.sleep(0.001)


def check_space(total: int) -> None:
    """Refuse a domain larger than the free space of its file system: tmpfs
    files are sparse, so the creation itself would succeed and the first
    touch of a page past the free space would kill the process with SIGBUS."""
    try:
        vfs = os.statvfs(SHM_DIR)
    except OSError:
        return
    free = vfs.f_bavail * vfs.f_frsize
    if total > free:
        raise OutOfMemory(
            f"the domain needs {total / 2**30:.2f} GiB but {SHM_DIR} has {free / 2**30:.2f} GiB free: "
            "ask for a smaller heap, queue area or trace ring"
        )


_WHAT_NEXT = (
    "pass replace_stale=True to replace it when no live participant uses it, or run `hostless gc` "
    "to remove every stale domain (`hostless ls` lists them)"
)


def _exists_error(path: str) -> DomainExists:
    """The "name taken" error of Domain.create: what holds the name (probed without joining)
    and what to do next."""
    from .cleanup import probe

    try:
        found = probe(path, uninitialised=False)
        what = f"{found.state}: {found.reason}"
    except OSError as e:
        what = e.strerror or str(e)
    if what.startswith("live"):
        hint = "a live domain is never replaced: pick another name, or close the processes that use it"
    else:
        hint = _WHAT_NEXT
    return DomainExists(errno.EEXIST, f"a domain file already exists ({what}); {hint}", path)


def replace_stale(path: str) -> None:
    """Remove ``path`` if it is a stale domain (``Domain.create(replace_stale=True)``);
    DomainExists (a FileExistsError), saying why, when it is live or not a hostless domain."""
    deadline = time.monotonic() + 2 * MIN_AGE
    while True:
        try:
            found = remove_if_stale(path)
        except FileNotFoundError:
            return
        except OSError as e:  # a symbolic link (never followed), another user's file, ...
            link = e.errno == errno.ELOOP
            what = "a symbolic link, never followed" if link else f"cannot check it: {e.strerror}"
            raise DomainExists(errno.EEXIST, f"the file exists and was not replaced: {what}", path) from None
        if found.state in ("removed", "gone"):
            return
        if found.state == "young" and time.monotonic() < deadline:
            # a creator that is starting takes its lock within microseconds: give it MIN_AGE
            time.sleep(min(0.05, max(0.001, MIN_AGE - found.age)))
            continue
        hint = ""
        if found.state != "foreign":
            hint = "; a live domain is never replaced: close the processes that use it"
        raise DomainExists(
            errno.EEXIST, f"the file exists and was not replaced: {found.state} ({found.reason}){hint}", path
        )


DEVICE_ALIGN = int(C.DEVICE_ALIGN)


def parse_device_heaps(spec: object) -> list[tuple[int, int]]:
    """``{"cuda:0": "256M", ...}`` -> ``[(ordinal, bytes rounded up to 2 MiB), ...]`` in the
    given order (heap index = position).  ValueError / TypeError on anything else."""
    if spec is None:
        return []
    if not isinstance(spec, dict):
        raise TypeError(
            f'device_heaps must be a dict such as {{"cuda:0": "256M"}}, got {type(spec).__name__}'
        )
    if len(spec) > int(C.MAX_DEVICE_HEAPS):
        raise ValueError(f"at most {int(C.MAX_DEVICE_HEAPS)} device heaps, got {len(spec)}")
    out: list[tuple[int, int]] = []
    for key, size in spec.items():
        ordinal = parse_device(key)
        if ordinal is None:
            raise ValueError(f'device heap {key!r}: a device heap is on a GPU, "cuda:N"')
        n = parse_size(size)
        if not 0 < n <= int(C.DEVICE_MAX_SIZE):
            raise ValueError(
                f"device heap {key!r}: size must be in 1..{int(C.DEVICE_MAX_SIZE)} bytes, got {size!r}"
            )
        out.append((ordinal, -(-n // DEVICE_ALIGN) * DEVICE_ALIGN))
    return out


_DEVICE_RE = re.compile(r"^cuda:(\d{1,3})$")


def parse_device(device: object) -> int | None:
    """``"cpu"`` -> None (host memory), ``"cuda:N"`` -> N (0..255); ValueError otherwise."""
    if not isinstance(device, str):
        raise TypeError(f'a device is a string, "cpu" or "cuda:N", got {type(device).__name__}')
    if device == "cpu":
        return None
    m = _DEVICE_RE.fullmatch(device)
    if not m or int(m.group(1)) > 255:
        raise ValueError(f'unknown device {device!r}: use "cpu" or "cuda:N" (N = 0..255)')
    return int(m.group(1))


def create_file(
    path: str,
    fences: int,
    participants: int,
    mode: int,
    sizes: tuple[int | str, int | str, int | str],
    poll_interval: float,
    replace: bool,
    device_heaps: list[tuple[int, int]] | None = None,
) -> tuple[int, tuple[object, ...]]:
    """Check a creator's arguments, then make the domain file at ``path`` (``O_EXCL``,
    sized; with ``replace``, after removing a stale domain there).  Returns the fd and
    the core's init tuple; nothing is left behind on an error."""
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise ValueError(f"mode must be file permission bits in 0..0o777, got {mode!r}")
    if not 1 <= fences <= int(C.MAX_FENCES):
        raise ValueError(f"fences must be in 1..{int(C.MAX_FENCES)}, got {fences}")
    if not 1 <= participants <= int(C.MAX_PARTICIPANTS):
        raise ValueError(f"participants must be in 1..{int(C.MAX_PARTICIPANTS)}, got {participants}")
    lo, hi = int(C.POLL_MIN_NS) / 1e9, int(C.POLL_MAX_NS) / 1e9
    if not lo <= poll_interval <= hi:
        raise ValueError(f"poll_interval must be in {lo:g}..{hi:g} s, got {poll_interval!r}")
    qsize, tsize, hsize = (parse_size(x) for x in sizes)
    devs = list(device_heaps or [])
    ords = [o for o, _ in devs]
    if len(set(ords)) != len(ords):
        raise ValueError(f"device heaps name a GPU twice: {ords}")
    lay = _core.layout(fences, participants, qsize, tsize, hsize, devs)
    init = (
        fences,
        participants,
        qsize,
        tsize,
        hsize,
        secrets.randbelow(255) + 1,
        int(poll_interval * 1e9),
        devs,
    )
    check_space(lay["total_size"])
    if replace:
        replace_stale(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    except FileExistsError:
        raise _exists_error(path) from None
    try:
        os.fchmod(fd, mode)
        os.ftruncate(fd, lay["total_size"])
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return fd, init


def open_file(path: str, wait_for: float, timeout: float, allow_other_owner: bool) -> int:
    """Open an existing domain file for joining: wait up to ``wait_for`` s for it to
    appear, refuse what is not a regular file of this user (unless
    ``allow_other_owner``), wait up to ``timeout`` s for its creator to finish."""
    appear_by = time.monotonic() + max(0.0, wait_for)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            break
        except FileNotFoundError:
            if time.monotonic() >= appear_by:
                raise
            time.sleep(0.005)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid() and not allow_other_owner:
            raise PermissionError(
                f"{path} belongs to user {st.st_uid}, not to this user ({os.geteuid()}); "
                "pass allow_other_owner=True to join it anyway"
            )
        wait_ready(fd, timeout)
    except BaseException:
        os.close(fd)
        raise
    return fd
