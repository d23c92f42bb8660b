"""Tools that only look (issue 24, item 6): ``hostless info``, ``check`` and ``trace`` read the
domain without joining it (hostless.view.DomainView: read-only mapping, no participant slot);
``check`` tells a dead-but-unreaped domain from a corrupt one and says what to run; a device
heap no GPU here can back is reported as declared; traces name objects by their published
names, show waits as spans, and give each process its own track."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import hostless as hl
from conftest import kill_child, read_line, spawn_child
from hostless import cli, info, trace
from hostless.view import DomainView, open_view


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = cli.main(["--plain", *argv])
    return rc, capsys.readouterr().out


def test_info_and_check_take_no_participant_slot(
    domain_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with hl.Domain.create(domain_name, participants=2, heap="1M") as d:
        t = d.timeline()
        d.publish("frames", t)
        peer = hl.Domain.open(domain_name)  # the table is now full: a tool that joined would fail
        try:
            rc, out = _run(["info", domain_name], capsys)
            assert rc == 0, out
            assert "frames" in out and "this command" not in out
            rc, out = _run(["info", domain_name, "--json"], capsys)
            doc = json.loads(out)
            assert len(doc["participants"]) == 2 and not any(p["this_cli"] for p in doc["participants"])
            assert doc["names"]["frames"]["kind"] == "timeline"
            rc, out = _run(["check", domain_name], capsys)
            assert rc == 0 and "consistent" in out
            assert int(d.header()["epoch"]) == 0  # nobody joined, left or was recovered
        finally:
            peer.close()


def test_view_is_read_only(domain_name: str) -> None:
    with hl.Domain.create(domain_name) as d:
        with open_view(domain_name) as v:
            with pytest.raises(TypeError):
                v.raw()[0] = 0  # type: ignore[index]
            assert v.layout["fence_capacity"] == d.capacity["fences"]
            assert [p.index for p in v.participants] == [p.index for p in d.participants]


def test_view_refuses_what_is_not_a_domain(tmp_path: Path) -> None:
    p = tmp_path / "junk"
    p.write_bytes(b"x" * 20000)
    with pytest.raises(hl.CorruptDomain):
        DomainView(str(p))
    p.write_bytes(b"\0" * 100)
    with pytest.raises(hl.CorruptDomain):
        DomainView(str(p))


def test_check_tells_unreaped_from_corrupt(domain_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = """
d = hl.Domain.create(sys.argv[1], watchdog_interval=0)
f = d.fence()
t = d.timeline()
print("ready", flush=True)
time.sleep(60)
"""
    p = spawn_child(code, domain_name)
    try:
        assert read_line(p) == "ready"
    finally:
        kill_child(p)
    rc, out = _run(["check", domain_name], capsys)
    assert rc == 3, out  # not corrupt: dead and not recovered yet
    assert f"hostless reap {domain_name}" in out and "inconsistent" not in out
    assert _run(["reap", domain_name], capsys)[0] == 0
    rc, out = _run(["check", domain_name], capsys)
    assert rc == 0 and "consistent" in out
    # corrupt: a fence slot in an invalid state
    with open_view(domain_name) as v:
        off = v.layout["fences_offset"] + int(hl._abi.C.F_CTL)
    with open(f"/dev/shm/{domain_name}", "r+b") as f:
        f.seek(off)
        f.write((9).to_bytes(8, "little"))
    rc, out = _run(["check", domain_name], capsys)
    assert rc == 1 and "invalid state" in out and "inconsistent" in out


def test_device_heap_without_gpu_is_declared(domain_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with hl.Domain.create(domain_name, device_heaps={"cuda:7": "2M"}):
        with open_view(domain_name) as v:
            doc = info.domain_info(v)
        (dh,) = doc["device_heaps"]
        assert dh["gpu_here"] == os.path.exists("/dev/nvidia7")
        rc, out = _run(["info", domain_name], capsys)
        if not dh["gpu_here"]:
            assert "cuda:7: declared (2.0 MiB), no GPU here" in out


def test_trace_names_waits_and_tracks(domain_name: str, tmp_path: Path) -> None:
    code = """
d = hl.Domain.open(sys.argv[1])
t = d.lookup("frames")
print("waiting", flush=True)
t.wait(1, 10)
print("done", flush=True)
d.close()
"""
    with hl.Domain.create(domain_name, trace="256K") as d:
        t = d.timeline()
        d.publish("frames", t)
        children = [spawn_child(code, domain_name) for _ in range(2)]  # the second may reuse a slot
        try:
            for c in children:
                assert read_line(c) == "waiting"
            time.sleep(0.3)  # let them wait
            t.signal(1)
            for c in children:
                assert read_line(c) == "done"
                c.wait(timeout=10)
        finally:
            for c in children:
                kill_child(c)
        out = tmp_path / "t.json"
        with open_view(domain_name) as v:
            trace.export(v, str(out))
        ev = json.loads(out.read_text())["traceEvents"]
    waits = [e for e in ev if e.get("ph") == "X" and e["name"].startswith("wait")]
    assert len(waits) == 2 and all(e["name"] == "wait frames" for e in waits)
    assert all(e["dur"] > 100_000 * 0.5 for e in waits)  # ~0.3 s, in microseconds
    assert len({e["pid"] for e in waits}) == 2  # each process its own track
    signals = [e for e in ev if e.get("name") == "signal frames"]
    assert signals, [e.get("name") for e in ev]
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    assert all(pid in names for pid in {e["pid"] for e in waits})


def test_trace_records_no_wait_that_did_not_wait(domain_name: str) -> None:
    with hl.Domain.create(domain_name, trace="64K") as d:
        t = d.timeline()
        t.signal(1)
        assert t.wait(1) is hl.Status.SUCCESS
        assert not [e for e in trace.events(d) if e["type"] == int(hl._abi.C.EV_WAIT)]
        assert any(e["type"] == int(hl._abi.C.EV_SIGNAL) for e in trace.events(d))


def test_view_refuses_overlapping_regions(domain_name: str) -> None:
    """A header whose fence table was enlarged over the heap (every region still inside the
    file) is refused by the view as by hl_attach: info would walk the heap as slots."""
    with hl.Domain.create(domain_name, heap="1M", fences=128) as d:
        fcap = int(d.header()["fence_capacity"])
        fd = os.open(f"/dev/shm/{domain_name}", os.O_RDWR)
        try:
            os.pwrite(fd, (fcap + 4096).to_bytes(4, "little"), int(hl._abi.C.H_FENCE_CAPACITY))
        finally:
            os.close(fd)
        with pytest.raises(hl.CorruptDomain, match="overlap|outside"):
            open_view(domain_name)
