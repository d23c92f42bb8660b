"""SIGTERM and friends: a creator with ``unlink_on_close=True`` removes its domain file on
SIGTERM and SIGHUP as on a normal exit (hostless.signals), chaining to the program's handler
or to the default action; the "name taken" error says what to do; ``hostless ls`` lists
domains without joining them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import hostless as hl
from conftest import kill_child, read_line, spawn_child, wait_until
from hostless import cleanup, cli

CREATOR = """
import signal
how = sys.argv[2]
if how == "handler":
    def h(signum, frame):
        print("handled", signum, flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, h)
    signal.signal(signal.SIGHUP, h)
elif how == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
d = hl.Domain.create(sys.argv[1], unlink_on_close=True)
print("ready", flush=True)
while True:
    line = sys.stdin.readline()
    if line.strip() == "close":
        d.close()
        print("closed", flush=True)
    elif not line:
        break
"""


def _path(name: str) -> str:
    return f"/dev/shm/{name}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_removes_the_file_and_still_kills(domain_name: str, sig: int) -> None:
    p = spawn_child(CREATOR, domain_name, "default")
    try:
        assert read_line(p) == "ready"
        assert os.path.exists(_path(domain_name))
        p.send_signal(sig)
        assert p.wait(timeout=10) == -sig  # the exit status still says "killed by the signal"
        assert not os.path.exists(_path(domain_name))
    finally:
        kill_child(p)


def test_signal_chains_to_the_programs_handler(domain_name: str) -> None:
    p = spawn_child(CREATOR, domain_name, "handler")
    try:
        assert read_line(p) == "ready"
        p.send_signal(signal.SIGTERM)
        assert read_line(p) == f"handled {int(signal.SIGTERM)}"
        assert p.wait(timeout=10) == 3
        assert not os.path.exists(_path(domain_name))
    finally:
        kill_child(p)


def test_ignored_signal_stays_ignored(domain_name: str) -> None:
    from conftest import send_line

    p = spawn_child(CREATOR, domain_name, "ignore")
    try:
        assert read_line(p) == "ready"
        p.send_signal(signal.SIGTERM)
        send_line(p, "close")
        assert read_line(p) == "closed"  # still running: SIGTERM was ignored before, and stays so
        assert not os.path.exists(_path(domain_name))  # close() removed it
    finally:
        kill_child(p)


def test_close_puts_the_handlers_back(domain_name: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    d = hl.Domain.create(domain_name, unlink_on_close=True)
    assert signal.getsignal(signal.SIGTERM) is not before
    d.close()
    assert signal.getsignal(signal.SIGTERM) is before


def test_name_taken_says_what_to_do(domain_name: str) -> None:
    with hl.Domain.create(domain_name):
        with pytest.raises(hl.DomainExists) as ei:
            hl.Domain.create(domain_name)
        assert isinstance(ei.value, FileExistsError)
        assert "live" in str(ei.value)
    hl.Domain.unlink(domain_name)
    # a stale one (its creator was killed): the message names replace_stale and hostless gc
    code = "d = hl.Domain.create(sys.argv[1]); print('ready', flush=True); time.sleep(60)"
    p = spawn_child(code, domain_name)
    try:
        assert read_line(p) == "ready"
    finally:
        kill_child(p)
    with pytest.raises(FileExistsError) as ei2:
        hl.Domain.create(domain_name)
    msg = str(ei2.value)
    assert "replace_stale=True" in msg and "hostless gc" in msg and "stale" in msg
    hl.Domain.create(domain_name, replace_stale=True).close()


def test_ls_lists_without_joining(domain_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with hl.Domain.create(domain_name) as d:
        peer = hl.Domain.open(domain_name)
        try:
            before = [p.index for p in d.participants]
            assert cli.main(["ls", "--json"]) == 0
            rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
            r = rows[domain_name]
            assert r["participants"] == 2 and not r["stale"] and r["state"] == "live"
            assert r["size"] == os.path.getsize(_path(domain_name)) and r["owner"]
            assert [p.index for p in d.participants] == before  # ls took no participant slot
        finally:
            peer.close()
    hl.Domain.unlink(domain_name)
    # stale: every participant killed
    code = "d = hl.Domain.create(sys.argv[1]); print('ready', flush=True); time.sleep(60)"
    p = spawn_child(code, domain_name)
    try:
        assert read_line(p) == "ready"
    finally:
        kill_child(p)
    assert wait_until(lambda: cleanup.live_participants(_path(domain_name)) == 0)
    rows2 = {r["name"]: r for r in cleanup.listing(min_age=0)}
    assert rows2[domain_name]["stale"] and rows2[domain_name]["participants"] == 0
    out = subprocess.run(
        [sys.executable, "-m", "hostless.cli", "--plain", "ls", "--min-age", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert domain_name in out.stdout and "hostless gc" in out.stdout
