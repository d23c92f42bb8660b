"""How processes share a device heap's allocation (hostless.devmem.Broker), without a GPU.

The broker passes any file descriptor; here a memfd stands for the CUDA
allocation, and its first 16 bytes hold the generation its creator chose, so a
process that reads them back proves it holds the very same file.  Checked: a
second process fetches the first's allocation; it outlives its creator while
another holder lives; with no holder left the next process creates a fresh one;
processes starting at once create exactly one; a holder that answers garbage is
skipped.

Trust (issue 21): holders meet in the user's private directory and both ends check
the peer's uid (SO_PEERCRED).  Checked, with a second user (``nobody``, in a
forked child that drops root) when the tests run as root: a squatter of another
uid that binds the names the old broker used, and plants a socket of its own in
the directory, is refused and the real memory is fetched; squatting the creation
name blocks nothing; a pre-created runtime directory (another user's, a symlink,
too open) is refused with the reason; ten holders that accept and never answer
cost one bounded round; a squatted name leaks no allocation and no descriptor.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pwd
import shutil
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from hostless.devmem import PEER_TIMEOUT, Allocation, Broker, UntrustedPeer, runtime_dir
from hostless.errors import DeviceHeapUnavailable, UnsafeRuntimeDirectory

CHILD = r"""
import os, sys
from hostless.devmem import Allocation, Broker

key, start = sys.argv[1], float(sys.argv[2])
b = Broker(key, 0)

def create():
    fd = os.memfd_create("hostless-test-heap")
    os.ftruncate(fd, 1 << 16)
    gen = os.urandom(16)
    os.pwrite(fd, gen, 0)
    return fd, Allocation(1 << 16, 4096, 0, gen)

import time
while time.time() < start:  # processes started together race for the creation lock
    pass
fd, info, created = b.acquire(create, timeout=20)
if not created:
    b.serve(fd, info)  # a holder serves it too
print(int(created), info.generation.hex(), os.pread(fd, 16, 0).hex(), flush=True)
sys.stdin.readline()  # hold it until told
"""


class Holder:
    def __init__(self, key: str, start: float = 0.0) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-c", CHILD, key, repr(start)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def result(self) -> tuple[bool, str, str]:
        assert self.p.stdout is not None
        line = self.p.stdout.readline().split()
        assert len(line) == 3, f"child said {line!r} (exit {self.p.poll()})"
        return line[0] == "1", line[1], line[2]

    def leave(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write("\n")
        self.p.stdin.flush()
        assert self.p.wait(30) == 0


@pytest.fixture
def key() -> Iterator[str]:
    k = f"test{uuid.uuid4().hex[:12]}"
    yield k
    d = runtime_dir()
    for name in os.listdir(d):  # the heap's lock file (and any socket a test left)
        if name.startswith(k + "."):
            os.unlink(os.path.join(d, name))


def test_a_second_process_gets_the_same_allocation_and_it_outlives_its_creator(key):
    a = Holder(key)
    created_a, gen_a, content_a = a.result()
    assert created_a and content_a == gen_a
    b = Holder(key)
    created_b, gen_b, content_b = b.result()
    assert not created_b and gen_b == gen_a and content_b == gen_a  # the same file
    a.leave()  # the creator goes; b still holds and serves it
    c = Holder(key)
    created_c, gen_c, content_c = c.result()
    assert not created_c and gen_c == gen_a and content_c == gen_a
    b.leave()
    c.leave()
    d = Holder(key)  # no holder left: a fresh allocation
    created_d, gen_d, content_d = d.result()
    assert created_d and gen_d != gen_a and content_d == gen_d
    d.leave()


def test_processes_starting_together_create_exactly_one(key):
    start = time.time() + 1.5
    hs = [Holder(key, start) for _ in range(6)]
    res = [h.result() for h in hs]
    assert sum(1 for created, _, _ in res if created) == 1
    assert len({gen for _, gen, _ in res}) == 1
    assert all(content == gen for _, gen, content in res)
    for h in hs:
        h.leave()


def _sock_in(br: Broker, tag: str, backlog: int = 4) -> tuple[socket.socket, str]:
    """A listening socket published where ``br`` looks for holders (as a holder would be)."""
    path = os.path.join(br.path, f"{br.prefix}{tag}.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(backlog)
    return s, path


def _memfd_create(size: int = 4096, gen: bytes = b"g" * 16) -> tuple[int, Allocation]:
    fd = os.memfd_create("hostless-test-heap")
    os.ftruncate(fd, size)
    os.pwrite(fd, gen, 0)
    return fd, Allocation(size, 4096, 0, gen)


def test_a_holder_answering_garbage_is_skipped(key):
    br = Broker(key, 0)
    bogus, path = _sock_in(br, "0.junk")

    def serve_junk() -> None:
        while True:
            try:
                conn, _ = bogus.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.sendall(b"not a hello")  # and no descriptor

    threading.Thread(target=serve_junk, daemon=True).start()
    try:
        made = []

        def create() -> tuple[int, Allocation]:
            made.append(_memfd_create())
            return made[-1]

        fd, info, created = br.acquire(create, timeout=5)
        assert created and fd == made[0][0] and info.generation == b"g" * 16
        h = Holder(key)  # another process skips the junk server and fetches ours
        created_h, gen_h, _ = h.result()
        assert not created_h and gen_h == (b"g" * 16).hex()
        h.leave()
        br.close()
        os.close(fd)
    finally:
        bogus.close()
        os.unlink(path)


# ----------------------------------------------------------------- a second user
def _nobody() -> tuple[int, int]:
    if os.geteuid() != 0:
        pytest.skip("cross-user test: needs root to drop to a second, unprivileged user (nobody)")
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("cross-user test: no 'nobody' user on this machine")
    if pw.pw_uid == 0:
        pytest.skip("cross-user test: 'nobody' is uid 0 here")
    return pw.pw_uid, pw.pw_gid


class AsUser:
    """A forked child that runs ``body(report)`` as another uid, then holds until :meth:`end`.
    ``before(report)`` runs first, still as root (to plant a file where only root could).
    ``report(text)`` sends one line to the parent, :meth:`line` reads it."""

    def __init__(
        self,
        uid: int,
        gid: int,
        body: Callable[[Callable[[str], None]], object],
        before: Callable[[Callable[[str], None]], object] | None = None,
    ) -> None:
        up_r, up_w = os.pipe()
        down_r, down_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: only plain calls, then _exit
            code = 1
            try:
                os.close(up_r)
                os.close(down_w)

                def report(text: str) -> None:
                    os.write(up_w, (text + "\n").encode())

                kept = [before(report)] if before is not None else []
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
                state = body(report)
                report("ready")
                while os.read(down_r, 1) == b"?":  # hold until the parent ends us
                    report(str(state() if callable(state) else state))
                del kept
                code = 0
            except BaseException as e:  # noqa: BLE001 - reported, then the child exits
                with contextlib.suppress(OSError):
                    os.write(up_w, f"error {type(e).__name__}: {e}\n".encode())
            finally:
                os._exit(code)
        os.close(up_w)
        os.close(down_r)
        self.pid, self._down = pid, down_w
        self._up = os.fdopen(up_r)

    def line(self) -> str:
        return self._up.readline().strip()

    def until_ready(self) -> list[str]:
        lines = []
        while (ln := self.line()) != "ready":
            assert ln and not ln.startswith("error"), f"child said {ln!r}; before that {lines}"
            lines.append(ln)
        return lines

    def ask(self) -> str:
        """What ``body``'s result (called, when callable) says now."""
        os.write(self._down, b"?")
        return self.line()

    def end(self) -> None:
        os.close(self._down)
        _, status = os.waitpid(self.pid, 0)
        self._up.close()
        assert os.waitstatus_to_exitcode(status) == 0


def _serve_fd_forever(srv: socket.socket, fd: int) -> None:
    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                with contextlib.suppress(OSError):
                    socket.send_fds(conn, [_hello_for(fd)], [fd])

    threading.Thread(target=loop, daemon=True).start()


def _hello_for(fd: int) -> bytes:
    """A well-formed hello for the squatter's memfd (the broker's wire format)."""
    return struct.pack("<8sQQQ16s", b"HLDEVHP1", 4096, 4096, 0, os.pread(fd, 16, 0))


def test_a_squatter_of_another_user_is_refused_and_the_real_memory_is_fetched(key):
    uid, gid = _nobody()
    real = Holder(key)  # the real allocation, held by a process of ours
    created, real_gen, _ = real.result()
    assert created
    br = Broker(key, 0)
    trap = os.path.join(br.path, f"{br.prefix}0.squat.sock")  # sorts before every pid
    kept: list[object] = []

    def plant(report: Callable[[str], None]) -> None:
        # a socket in our directory whose process is another user (bound as root, then the
        # process drops to nobody and listens: SO_PEERCRED names nobody)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(trap)
        kept.append(s)

    def squat(report: Callable[[str], None]) -> None:
        fd = os.memfd_create("squatter")
        os.ftruncate(fd, 4096)
        os.pwrite(fd, b"SQUATTER-MEMORY!", 0)
        planted = kept[0]
        assert isinstance(planted, socket.socket)
        planted.listen(4)
        _serve_fd_forever(planted, fd)
        for name in ("p0", "create", f"p{os.getppid()}"):  # the old broker's names
            a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            a.bind(f"\0hostless/{key}/dh0/{name}")
            a.listen(4)
            _serve_fd_forever(a, fd)
            kept.append(a)
        try:  # and it cannot plant anything in our directory itself
            plant2 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            plant2.bind(os.path.join(br.path, f"{br.prefix}1.x.sock"))
            report("dir-writable")
        except PermissionError:
            report("dir-closed")

    sq = AsUser(uid, gid, squat, before=plant)
    try:
        assert sq.until_ready() == ["dir-closed"]
        with pytest.warns(UntrustedPeer, match=rf"pid {sq.pid} \(uid {uid}\)"):
            fd, info, created = br.acquire(lambda: pytest.fail("a holder exists"), timeout=5)
        assert not created
        assert info.generation.hex() == real_gen and os.pread(fd, 16, 0).hex() == real_gen
        assert [(r.pid, r.uid) for r in br.rejected] == [(sq.pid, uid)]
        os.close(fd)
    finally:
        sq.end()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(trap)
        real.leave()


def test_squatting_the_creation_name_blocks_nothing(key):
    uid, gid = _nobody()
    br = Broker(key, 0)
    kept: list[socket.socket] = []

    def squat(report: Callable[[str], None]) -> None:
        for name in ("create", "p0"):  # the old broker's creation lock, and a first holder name
            a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            a.bind(f"\0hostless/{key}/dh0/{name}")
            a.listen(16)  # accepts (backlog) and never answers
            kept.append(a)
        try:
            os.open(os.path.join(br.path, br.prefix + "lock"), os.O_RDONLY | os.O_CREAT, 0o644)
            report("lock-openable")
        except PermissionError:
            report("lock-closed")

    sq = AsUser(uid, gid, squat)
    try:
        assert sq.until_ready() == ["lock-closed"]
        fd, info, created = br.acquire(_memfd_create, timeout=3)
        assert created and info.generation == b"g" * 16
        h = Holder(key)  # and the next process gets it
        assert h.result()[1:] == ((b"g" * 16).hex(), (b"g" * 16).hex())
        h.leave()
        br.close()
        os.close(fd)
    finally:
        sq.end()


def test_a_runtime_directory_made_by_another_user_is_refused(key):
    uid, gid = _nobody()
    base = f"/dev/shm/hltest-base-{uuid.uuid4().hex[:12]}"
    os.mkdir(base)
    os.chmod(base, 0o1777)  # like /dev/shm: anyone may create, only the owner removes
    mine = runtime_dir(base=base)
    try:
        for how in ("dir", "symlink"):

            def squat(report: Callable[[str], None], how: str = how) -> None:
                if how == "dir":
                    os.mkdir(mine, 0o777)
                else:
                    os.mkdir(f"{base}/bait", 0o777)
                    os.symlink(f"{base}/bait", mine)

            sq = AsUser(uid, gid, squat)
            try:
                sq.until_ready()
                with pytest.raises(UnsafeRuntimeDirectory, match=f"uid {uid}"):
                    Broker(key, 0, base=base)
            finally:
                sq.end()
                shutil.rmtree(f"{base}/bait", ignore_errors=True)
                if os.path.islink(mine):
                    os.unlink(mine)
                else:
                    os.rmdir(mine)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_runtime_directory_open_to_others_or_in_an_open_parent_is_refused(key, tmp_path):
    base = tmp_path / "base"
    base.mkdir(mode=0o755)
    mine = runtime_dir(base=str(base))
    os.mkdir(mine, 0o700)
    os.chmod(mine, 0o755)  # ours, but others may list it
    with pytest.raises(UnsafeRuntimeDirectory, match="mode 755"):
        Broker(key, 0, base=str(base))
    os.rmdir(mine)
    os.chmod(base, 0o777)  # world-writable, not sticky: others could rename ours away
    with pytest.raises(UnsafeRuntimeDirectory, match="not sticky"):
        Broker(key, 0, base=str(base))
    os.chmod(base, 0o1777)
    br = Broker(key, 0, base=str(base))  # sticky: fine, and the directory is made 0700
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o700 and br.path == mine


def test_a_holder_gives_nothing_to_a_client_of_another_user(key):
    # root can enter any directory; the holder (nobody) still checks who connects
    uid, gid = _nobody()
    base = f"/dev/shm/hltest-base-{uuid.uuid4().hex[:12]}"
    os.mkdir(base)
    os.chmod(base, 0o1777)

    def hold(report: Callable[[str], None]) -> Callable[[], object]:
        br = Broker(key, 0, base=base)
        fd, info = _memfd_create(gen=b"nobody's memory!")
        br.serve(fd, info)
        report(os.path.join(br.path, next(n for n in os.listdir(br.path) if n.endswith(".sock"))))
        return lambda: [(r.pid, r.uid, r.where) for r in br.rejected]

    h = AsUser(uid, gid, hold)
    try:
        (path,) = h.until_ready()
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(30)
        c.connect(path)
        data, fds, _f, _a = socket.recv_fds(c, 64, 1)
        c.close()
        assert (data, fds) == (b"", [])  # closed with no descriptor
        assert h.ask() == str([(os.getpid(), 0, "client")])  # and recorded, naming us
    finally:
        h.end()
        shutil.rmtree(base, ignore_errors=True)


# ----------------------------------------------------------------- bounded waits
def test_ten_silent_holders_cost_one_bounded_round(key):
    br = Broker(key, 0)
    real = Holder(key)  # a real holder among them: found in one round, not after ten
    created, gen, _ = real.result()
    # accept (into the backlog) and never answer; one of them stops accepting at once
    silent = [_sock_in(br, f"{i}.silent", backlog=0 if i == 9 else 64) for i in range(10)]
    try:
        t0 = time.monotonic()
        got = br.fetch()
        took = time.monotonic() - t0
        assert got is not None and got[1].generation.hex() == gen
        os.close(got[0])
        assert took < PEER_TIMEOUT + 5  # the old broker: 10 x 2 s before reaching it
        real.leave()
        # no real holder left: acquire refuses to create a second allocation beside holders
        # that may be stopped, and says which ones, within timeout + PEER_TIMEOUT
        t0 = time.monotonic()
        with pytest.raises(DeviceHeapUnavailable, match=rf"pid {os.getpid()}\b"):
            br.acquire(lambda: pytest.fail("must not create beside silent holders"), timeout=2)
        assert time.monotonic() - t0 < 2 + PEER_TIMEOUT + 5
        full = f"{br.prefix}9.silent.sock (not accepting)"
        assert sorted(br.silent) == sorted([f"pid {os.getpid()}"] * 9 + [full])
    finally:
        for s, path in silent:
            s.close()
            os.unlink(path)


FORKER = r"""
import os, sys
from hostless.devmem import Allocation, Broker

def create():
    fd = os.memfd_create("hostless-test-heap")
    os.ftruncate(fd, 4096)
    return fd, Allocation(4096, 4096, 0, b"f" * 16)

fd, info, created = Broker(sys.argv[1], 0).acquire(create, timeout=10)
assert created
if os.fork() == 0:  # a child that does not exec (multiprocessing's fork) lives on
    print("forked", flush=True)
    sys.stdin.readline()
    os._exit(0)
os._exit(0)  # the holder dies without closing anything (as if killed)
"""


def test_a_dead_holders_forked_child_is_not_a_silent_holder(key):
    p = subprocess.Popen(
        [sys.executable, "-c", FORKER, key], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdin is not None
    try:
        assert p.stdout.readline().strip() == "forked"
        assert p.wait(30) == 0
        br = Broker(key, 0)
        fd, info, created = br.acquire(_memfd_create, timeout=3)  # nobody holds it: a fresh one
        assert created and info.generation == b"g" * 16
        br.close()
        os.close(fd)
    finally:
        p.stdin.close()  # the forked child exits (stdout EOF once it has)
        p.stdout.read()


def test_dead_holders_names_are_removed_and_skipped(key):
    br = Broker(key, 0)
    s, path = _sock_in(br, "1.dead")
    s.close()  # its process is gone: connections are refused
    fd, _info, created = br.acquire(_memfd_create, timeout=5)
    assert created and not os.path.exists(path)
    br.close()
    os.close(fd)


# ----------------------------------------------------------------- no leaks
def _fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def test_a_squatted_holder_name_leaks_nothing(key):
    # someone binds the name this process would serve under (the old broker's p<pid>):
    # creating still works, and every descriptor made is accounted for
    squat = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squat.bind(f"\0hostless/{key}/dh0/p{os.getpid()}")
    squat.listen(1)
    try:
        before = _fds()
        br = Broker(key, 0)
        made: list[int] = []

        def create() -> tuple[int, Allocation]:
            fd, info = _memfd_create()
            made.append(fd)
            return fd, info

        fd, _info, created = br.acquire(create, timeout=3)
        assert created and made == [fd]
        br.close()
        os.close(fd)
        del br
        gc.collect()
        # no descriptor made here is left open (a descriptor of an earlier test's
        # agent may close meanwhile, so compare what is new, not the whole set)
        assert _fds() - before == set()
    finally:
        squat.close()


def test_a_failing_create_leaves_nothing_behind(key):
    br = Broker(key, 0)
    before = set(os.listdir(br.path))
    fds = _fds()

    def boom() -> tuple[int, Allocation]:
        raise RuntimeError("cuMemCreate failed")

    with pytest.raises(RuntimeError, match="cuMemCreate"):
        br.acquire(boom, timeout=3)
    assert _fds() - fds == set()  # no socket left open
    assert set(os.listdir(br.path)) - before <= {br.prefix + "lock"}  # no socket file
    fd, _info, created = br.acquire(_memfd_create, timeout=3)  # and the lock is free
    assert created
    br.close()
    os.close(fd)
