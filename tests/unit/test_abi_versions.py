"""A domain of another ABI version (older or newer) is refused with DomainVersionMismatch, by
every way in: Domain.open (also when the other layout's `ready` word is not where ours is),
Domain.from_fd, the read-only view of `hostless info`, and the hostless-agent executable.
The message gives both versions, which one is older, and what to do."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import hostless as hl
from hostless._abi import C
from hostless.agents import executable_path
from hostless.shm import path_of
from hostless.view import open_view


def _put_u32(path: str, offset: int, value: int) -> int:
    fd = os.open(path, os.O_RDWR)
    try:
        old = int.from_bytes(os.pread(fd, 4, offset), "little")
        os.pwrite(fd, value.to_bytes(4, "little"), offset)
    finally:
        os.close(fd)
    return old


@contextmanager
def _as_version(name: str, version: int, ready: int | None = None) -> Iterator[str]:
    """The domain file's header says ABI ``version`` (and ``ready``, when given) until the block
    ends: what a hostless of that version would have written at the two words that never move."""
    path = path_of(name)
    old_v = _put_u32(path, int(C.H_ABI_VERSION), version)
    old_r = _put_u32(path, int(C.H_READY), ready) if ready is not None else None
    try:
        yield path
    finally:
        _put_u32(path, int(C.H_ABI_VERSION), old_v)
        if old_r is not None:
            _put_u32(path, int(C.H_READY), old_r)


OTHER = [(hl.ABI_VERSION - 1, "older"), (hl.ABI_VERSION + 1, "newer")]


def _check_message(msg: str, version: int, word: str) -> None:
    assert f"ABI version {version}, {word} than this hostless (ABI version {hl.ABI_VERSION})" in msg
    assert "CHANGELOG.md" in msg and "create it again" in msg


def test_abi_version_is_the_headers() -> None:
    assert hl.ABI_VERSION == int(C.ABI_VERSION) > 0
    assert issubclass(hl.DomainVersionMismatch, hl.CorruptDomain)


@pytest.mark.parametrize(("version", "word"), OTHER)
def test_open_refuses_another_abi_version(dom: hl.Domain, domain_name: str, version: int, word: str) -> None:
    with _as_version(domain_name, version):
        with pytest.raises(hl.DomainVersionMismatch) as e:
            hl.Domain.open(domain_name)
    _check_message(str(e.value), version, word)
    hl.Domain.open(domain_name).close()  # the same file at our version joins


@pytest.mark.parametrize(("version", "word"), OTHER)
def test_open_does_not_wait_for_another_layouts_ready_word(
    dom: hl.Domain, domain_name: str, version: int, word: str
) -> None:
    # another version's `ready` may lie elsewhere: ours reads 0 there.  Old code waited the
    # whole timeout and said "not initialised"; the version is reported at once
    with _as_version(domain_name, version, ready=0):
        with pytest.raises(hl.DomainVersionMismatch) as e:
            hl.Domain.open(domain_name, timeout=60.0)
    _check_message(str(e.value), version, word)


@pytest.mark.parametrize(("version", "word"), OTHER)
def test_from_fd_refuses_another_abi_version(
    dom: hl.Domain, domain_name: str, version: int, word: str
) -> None:
    with _as_version(domain_name, version) as path:
        fd = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(hl.DomainVersionMismatch) as e:
                hl.Domain.from_fd(fd)
        finally:
            os.close(fd)
    _check_message(str(e.value), version, word)


@pytest.mark.parametrize(("version", "word"), OTHER)
def test_view_refuses_another_abi_version(dom: hl.Domain, domain_name: str, version: int, word: str) -> None:
    with _as_version(domain_name, version) as path:
        with pytest.raises(hl.DomainVersionMismatch) as e:
            open_view(domain_name)
    _check_message(str(e.value), version, word)
    assert path in str(e.value)


@pytest.mark.parametrize(("version", "word"), OTHER)
def test_agent_executable_refuses_another_abi_version(
    dom: hl.Domain, domain_name: str, version: int, word: str
) -> None:
    with _as_version(domain_name, version, ready=0) as path:
        r = subprocess.run(
            [executable_path(), "--domain", domain_name, "--queue-handle", "0x1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode != 0
    _check_message(r.stderr, version, word)
    assert path in r.stderr
