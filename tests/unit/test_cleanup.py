"""Cleanup of domain files: unlink_on_close, replace_stale, the /dev/shm space
check, hostless.cleanup's probe and ``hostless gc``.

``gc`` is always pointed at a private directory holding hard links to the
test's own domain files: a scan of the real /dev/shm could remove the domains
of other test runs sharing this machine between two of their steps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import hostless as hl
from conftest import read_line, spawn_child
from hostless import cleanup
from hostless.domain import SHM_DIR


def shm(name: str) -> str:
    return os.path.join(SHM_DIR, name)


@pytest.fixture
def linkdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private directory on the same file system as /dev/shm (hard links need it)."""
    d = Path(SHM_DIR) / f"hl-gc-test-{os.getpid()}-{os.urandom(4).hex()}"
    d.mkdir()
    try:
        yield d
    finally:
        for f in d.iterdir():
            f.unlink()
        d.rmdir()


def test_unlink_on_close_removes_the_name(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=16, unlink_on_close=True) as d:
        f = d.fence()
        f.signal()
        assert os.path.exists(shm(domain_name))
    assert not os.path.exists(shm(domain_name))


def test_default_keeps_the_name(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=16):
        pass
    assert os.path.exists(shm(domain_name))


def test_unlink_on_close_leaves_a_replacement_alone(domain_name: str) -> None:
    a = hl.Domain.create(domain_name, fences=16, unlink_on_close=True)
    hl.Domain.unlink(domain_name)
    b = hl.Domain.create(domain_name, fences=16)
    try:
        a.close()
        assert os.path.exists(shm(domain_name)), "a.close() removed b's name"
    finally:
        b.close()


def test_other_participants_keep_using_an_unlinked_domain(domain_name: str) -> None:
    a = hl.Domain.create(domain_name, fences=16, unlink_on_close=True)
    b = hl.Domain.open(domain_name)
    f = b.fence()
    a.close()
    assert not os.path.exists(shm(domain_name))
    f.signal()
    assert f.wait(1) == hl.Status.SUCCESS
    b.close()


def test_probe_live_stale_and_foreign(domain_name: str, make_name: object) -> None:
    d = hl.Domain.create(domain_name, fences=16)
    assert cleanup.probe(shm(domain_name), min_age=0).state == "live"
    d.close()
    assert cleanup.probe(shm(domain_name), min_age=0).state == "stale"
    assert cleanup.probe(shm(domain_name), min_age=3600).state == "young"
    other = make_name()  # type: ignore[operator]
    with open(shm(other), "wb") as fh:
        fh.write(b"not a domain".ljust(8192, b"x"))
    found = cleanup.probe(shm(other), min_age=0)
    assert found.state == "foreign" and "not a hostless domain" in found.reason


def test_a_creator_killed_leaves_a_stale_domain_that_replace_stale_replaces(domain_name: str) -> None:
    body = f"d = hl.Domain.create({domain_name!r}, fences=16)\nf = d.fence()\nprint('ready', flush=True)\n"
    child = spawn_child(body + "time.sleep(60)")
    try:
        assert read_line(child) == "ready"
        with pytest.raises(FileExistsError, match="live"):
            hl.Domain.create(domain_name, fences=16, replace_stale=True)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert os.path.exists(shm(domain_name))
    with pytest.raises(FileExistsError):
        hl.Domain.create(domain_name, fences=16)  # without replace_stale: a plain FileExistsError
    d = hl.Domain.create(domain_name, fences=32, replace_stale=True)  # waits out MIN_AGE if needed
    try:
        assert d.capacity["fences"] == 32
        assert d.check() == []
    finally:
        d.close()


def test_replace_stale_replaces_an_uninitialised_file(domain_name: str) -> None:
    with open(shm(domain_name), "wb") as fh:  # a creator that died before writing the header
        fh.truncate(65536)
    with hl.Domain.create(domain_name, fences=16, replace_stale=True) as d:
        assert d.check() == []


def test_replace_stale_never_removes_a_foreign_file(domain_name: str) -> None:
    with open(shm(domain_name), "wb") as fh:
        fh.write(b"someone else's data".ljust(8192, b"\0"))
    with pytest.raises(FileExistsError, match="foreign"):
        hl.Domain.create(domain_name, fences=16, replace_stale=True)
    assert Path(shm(domain_name)).read_bytes().startswith(b"someone else's data")


def test_a_domain_larger_than_free_shm_space_is_refused(domain_name: str) -> None:
    vfs = os.statvfs(SHM_DIR)
    too_big = vfs.f_bavail * vfs.f_frsize + (1 << 30)
    with pytest.raises(hl.OutOfMemory, match="GiB free"):
        hl.Domain.create(domain_name, heap=too_big)
    assert not os.path.exists(shm(domain_name))


def _gc(linkdir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hostless.cli", "gc", "--dir", str(linkdir), "--min-age", "0", *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_gc_removes_stale_domains_only(make_name: object, linkdir: Path) -> None:
    live_name, stale_name, junk_name = (make_name() for _ in range(3))  # type: ignore[operator]
    live = hl.Domain.create(live_name, fences=16)
    hl.Domain.create(stale_name, fences=16).close()
    Path(shm(junk_name)).touch()  # an empty file: could be anyone's, never touched
    for n in (live_name, stale_name, junk_name):
        os.link(shm(n), linkdir / n)
    try:
        dry = _gc(linkdir, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "would remove" in dry.stdout and "1 of 2 domain file(s) would be removed" in dry.stdout
        assert sorted(p.name for p in linkdir.iterdir()) == sorted((live_name, stale_name, junk_name))
        run = _gc(linkdir)
        assert run.returncode == 0, run.stderr
        assert "1 of 2 domain file(s) removed" in run.stdout, run.stdout
        assert sorted(p.name for p in linkdir.iterdir()) == sorted((live_name, junk_name))
        assert live.check() == []
    finally:
        live.close()
    assert _gc(linkdir).stdout.strip().endswith("1 of 1 domain file(s) removed")
    assert [p.name for p in linkdir.iterdir()] == [junk_name]
