"""A reader cannot lock participants out (issue 21, item 3).

Liveness is an OFD write lock on byte 2^40 + i of the domain file.  Anyone who
can open the domain for reading (mode 0o644: every local user) can take OFD
read locks on those bytes, and a read lock keeps every write lock off: before
the fix, a killed participant whose byte a reader locked was never recovered
(read locks counted as alive) and joins failed with DomainFull (no lock could be
taken).  Now read locks never mean alive, and a joiner or recoverer kept off a
byte by one carries on without it, judged by its pid.

The reader runs in its own process: as an unprivileged second user (``nobody``,
when the tests run as root) and as the same user (always), so CI without root
still tests the rule.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import struct
from collections.abc import Iterator

import pytest

import hostless as hl
from conftest import kill_child, read_line, spawn_child
from hostless.status import Status as S

LOCK_BASE = 1 << 40


class Reader:
    """A reader in a forked child (optionally as another user): it opens the domain file
    read-only and, on each lock(), takes an OFD read lock on every liveness byte it can
    (the live participants' bytes refuse: their write lock is there); lock() returns how
    many bytes it holds.  Only os-level calls run in the child (no exec: the interpreter
    may sit where the other user cannot read)."""

    def __init__(self, path: str, cap: int, uid: int | None) -> None:
        cmd_r, self._cmd_w = os.pipe()
        self._ans_r, ans_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.close(self._cmd_w)
                os.close(self._ans_r)
                if uid is not None:
                    gid = pwd.getpwuid(uid).pw_gid
                    os.setgroups([])
                    os.setgid(gid)
                    os.setuid(uid)
                fd = os.open(path, os.O_RDONLY)
                held: set[int] = set()
                while os.read(cmd_r, 1):
                    for i in range(cap):
                        if i in held:
                            continue
                        fl = struct.pack("hhqqi4x", fcntl.F_RDLCK, os.SEEK_SET, LOCK_BASE + i, 1, 0)
                        try:
                            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, fl)
                            held.add(i)
                        except OSError:
                            pass
                    os.write(ans_w, len(held).to_bytes(4, "little"))
                code = 0
            finally:
                os._exit(code)
        os.close(cmd_r)
        os.close(ans_w)

    def lock(self) -> int:
        os.write(self._cmd_w, b"x")
        got = b""
        while len(got) < 4:
            part = os.read(self._ans_r, 4 - len(got))
            if not part:
                pytest.fail("the reader child exited (could it not open the domain read-only?)")
            got += part
        return int.from_bytes(got, "little")

    def stop(self) -> None:
        """Close its command pipe and reap it: its read locks go with it."""
        if self._cmd_w >= 0:
            os.close(self._cmd_w)
            os.close(self._ans_r)
            self._cmd_w = -1
            os.waitpid(self.pid, 0)


VICTIM = """
d = hl.Domain.open(sys.argv[1], watchdog_interval=0)
f = d.fence()
print(f.handle, d.participant_id, flush=True)
time.sleep(120)
"""


def _reader_user(kind: str) -> int | None:
    if kind == "same-user":
        return None
    if os.geteuid() != 0:
        pytest.skip("the cross-user case needs root to run the reader as an unprivileged user")
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no 'nobody' user to run the reader as")


@pytest.fixture(params=["same-user", "other-user"])
def reader_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def shared_domain(domain_name: str) -> Iterator[hl.Domain]:
    """A 0o644 domain (others may read it) of 6 slots, no watchdog: recovery only by reap()."""
    d = hl.Domain.create(domain_name, participants=6, fences=64, mode=0o644, watchdog_interval=0)
    try:
        yield d
    finally:
        d.close()


def _lock_type(path: str, i: int) -> int:
    """What F_OFD_GETLK finds on liveness byte i (F_WRLCK, F_RDLCK or F_UNLCK)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fl = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, LOCK_BASE + i, 1, 0)
        return int(struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_OFD_GETLK, fl))[0])
    finally:
        os.close(fd)


def test_reader_cannot_hide_a_dead_participant_nor_block_joins(
    shared_domain: hl.Domain, domain_name: str, reader_kind: str
) -> None:
    d = shared_domain
    uid = _reader_user(reader_kind)
    cap = d.capacity["participants"]
    path = f"/dev/shm/{domain_name}"
    victim = spawn_child(VICTIM, domain_name)
    reader = Reader(path, cap, uid)
    try:
        fh, vid = map(int, read_line(victim).split())
        f = d.import_fence(fh)
        assert reader.lock() == cap - 2  # every byte but ours and the victim's
        kill_child(victim)
        assert reader.lock() == cap - 1  # the reader now sits on the dead victim's byte too

        # the dead victim is recovered although its byte is read-locked
        assert d.reap() == [vid]
        assert f.wait(5) is S.OWNER_DIED

        # joins work although every free byte is read-locked
        with hl.Domain.open(domain_name, label="late", watchdog_interval=0) as late:
            assert late.participant_id != d.participant_id
            assert d.reap() == []  # a live participant that joined without its lock stays alive
            g = late.fence()
            g2 = d.import_fence(g.handle)
            # a participant that joined without its lock is recovered when it dies
            victim2 = spawn_child(VICTIM, domain_name)
            fh2, vid2 = map(int, read_line(victim2).split())
            f2 = d.import_fence(fh2)
            kill_child(victim2)
            assert d.reap() == [vid2]
            assert f2.wait(5) is S.OWNER_DIED

            # the reader goes: the lockless participant is still alive, and takes its lock
            reader.stop()
            assert d.reap() == []
            assert late.reap() == []  # takes its lock now that the reader has gone
            assert _lock_type(path, late.participant_id & 0xFF) == fcntl.F_WRLCK
            assert d.reap() == []
            assert not g2.done
            g.signal()
            assert g2.wait(5) is S.SUCCESS
        assert {p.pid for p in d.participants} == {os.getpid()}
    finally:
        kill_child(victim)
        reader.stop()


def test_reader_lock_after_lockless_join_still_recovers(
    shared_domain: hl.Domain, domain_name: str, reader_kind: str
) -> None:
    """A participant that joined with its lock, died, and whose byte a reader then locked is
    recovered by a joined participant that itself could not get its lock (lockless recoverer)."""
    uid = _reader_user(reader_kind)
    cap = shared_domain.capacity["participants"]
    shared_domain.close()  # every slot free: the reader takes them all
    reader = Reader(f"/dev/shm/{domain_name}", cap, uid)
    victim = spawn_child(VICTIM, domain_name)
    try:
        fh, vid = map(int, read_line(victim).split())
        assert reader.lock() == cap - 1
        kill_child(victim)
        assert reader.lock() == cap
        with hl.Domain.open(domain_name, watchdog_interval=0) as d:  # joins without a lock
            f = d.import_fence(fh)
            assert d.reap() == [vid]
            assert f.wait(5) is S.OWNER_DIED
            assert [p.pid for p in d.participants] == [os.getpid()]
    finally:
        kill_child(victim)
        reader.stop()


def test_gc_keeps_a_domain_whose_participant_joined_without_its_lock(shared_domain: hl.Domain) -> None:
    """Between the reader's exit and the lockless participant's next reap no lock byte is
    held: `hostless gc` / replace_stale must still see the domain as live."""
    from hostless import cleanup

    name = str(shared_domain.name)
    path = f"/dev/shm/{name}"
    cap = shared_domain.capacity["participants"]
    shared_domain.close()
    reader = Reader(path, cap, None)
    try:
        assert reader.lock() == cap
        with hl.Domain.open(name, watchdog_interval=0) as d:  # joins without its lock
            reader.stop()
            assert _lock_type(path, d.participant_id & 0xFF) == fcntl.F_UNLCK
            found = cleanup.probe(path, min_age=0)
            assert found.state == "live", found
            with pytest.raises(FileExistsError):
                hl.Domain.create(name, replace_stale=True)
            assert d.reap() == []  # takes its lock now
            assert cleanup.probe(path, min_age=0).state == "live"
    finally:
        reader.stop()
