"""The name table: publish / lookup / unpublish across participants and
processes, entries that die with their objects, a dead writer, garbage in the
table, and the CLI listing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hostless as hl
from conftest import read_line, spawn_child
from hostless import cli, names
from hostless._abi import C


def test_publish_and_lookup_every_kind(domain_name: str) -> None:
    with (
        hl.Domain.create(domain_name, heap="4M", unlink_on_close=True) as a,
        hl.Domain.open(domain_name) as b,
    ):
        objs = {"f": a.fence(), "t": a.timeline(), "b": a.buffer((4,), "u4"), "q": a.queue(8)}
        for n, o in objs.items():
            a.publish(n, o)
        assert a.names() == {n: o.handle for n, o in objs.items()} == b.names()
        got = {n: b.lookup(n) for n in objs}
        for n, o in objs.items():
            assert type(got[n]) is type(o) and got[n].handle == o.handle
        objs["b"].numpy()[:] = [1, 2, 3, 4]
        assert got["b"].numpy().tolist() == [1, 2, 3, 4]  # the same memory
        objs["f"].signal()
        assert got["f"].wait(1) == hl.Status.SUCCESS


def test_an_entry_dies_with_its_object(domain_name: str) -> None:
    with hl.Domain.create(domain_name, unlink_on_close=True) as d:
        f = d.fence()
        d.publish("frames", f)
        g = d.lookup("frames")  # a second reference
        f.release()
        assert d.names() == {"frames": g.handle}  # still alive through g
        g.release()
        assert d.names() == {}
        with pytest.raises(KeyError, match="no live object named 'frames'"):
            d.lookup("frames")
        h = d.fence()  # may land in the same slot: a new generation, never found by the old entry
        assert d.names() == {}
        d.publish("frames", h)  # the stale entry's name is free again
        assert d.lookup("frames").handle == h.handle


def test_names_are_unique_unless_replaced(domain_name: str) -> None:
    with hl.Domain.create(domain_name, unlink_on_close=True) as d:
        f, g = d.fence(), d.fence()
        d.publish("x", f)
        d.publish("x", f)  # the same object again: nothing changes
        with pytest.raises(hl.NameTaken, match="the name 'x' is published already"):
            d.publish("x", g)
        d.publish("x", g, replace=True)
        assert d.names() == {"x": g.handle}
        d.unpublish("x")
        assert d.names() == {}
        with pytest.raises(KeyError):
            d.unpublish("x")


def test_bad_names_and_objects(domain_name: str) -> None:
    with hl.Domain.create(domain_name, unlink_on_close=True) as d:
        f = d.fence()
        for bad in ("", "x" * 48, "a\0b", "é" * 24):
            with pytest.raises(ValueError, match="1..47 bytes"):
                d.publish(bad, f)
        d.publish("é" * 23, f)  # 46 bytes
        with pytest.raises(TypeError, match="a str"):
            d.publish(b"bytes", f)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="only fences, timelines, buffers and queues"):
            d.publish("m", d.merge([d.fence(), d.fence()]))
        with pytest.raises(TypeError):
            d.publish("n", 12345)  # type: ignore[arg-type]


def test_the_table_fills_up_and_frees(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=256, unlink_on_close=True) as d:
        fs = [d.fence() for _ in range(names.MAX_NAMES + 1)]
        for i in range(names.MAX_NAMES):
            d.publish(f"n{i}", fs[i])
        with pytest.raises(hl.DomainFull, match="name table is full"):
            d.publish("one too many", fs[-1])
        fs[0].release()  # its entry dies: the next publish reuses the cell
        d.publish("one too many", fs[-1])
        assert len(d.names()) == names.MAX_NAMES


def test_lookup_waits_for_another_process(domain_name: str) -> None:
    """The detector starts first: it waits for the domain file, then for the name."""
    child = spawn_child(
        f"""
d = hl.Domain.open({domain_name!r}, wait_for=30, label="detector")
t = d.lookup("camera/frames", timeout=30)
print("found", type(t).__name__, flush=True)
print("value", t.wait(7, timeout=30).name, t.value, flush=True)
d.close()
"""
    )
    try:
        time.sleep(0.3)
        with hl.Domain.create(domain_name, label="camera", unlink_on_close=True) as d:
            t = d.timeline()
            time.sleep(0.2)
            d.publish("camera/frames", t)
            assert read_line(child) == "found Timeline"
            t.signal(7)
            assert read_line(child) == "value SUCCESS 7"
            assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()


def test_lookup_timeouts(domain_name: str) -> None:
    with hl.Domain.create(domain_name, unlink_on_close=True) as d:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="after 0.2 s"):
            d.lookup("never", timeout=0.2)
        assert 0.19 <= time.monotonic() - t0 < 2.0
        f = d.fence()
        threading.Timer(0.1, lambda: d.publish("late", f)).start()
        assert d.lookup("late", timeout=10).handle == f.handle


def test_open_wait_for_gives_up(domain_name: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(FileNotFoundError):
        hl.Domain.open(domain_name, wait_for=0.1)
    assert time.monotonic() - t0 >= 0.09


def test_a_writer_that_died_holding_the_lock_is_replaced(domain_name: str) -> None:
    with hl.Domain.create(domain_name, unlink_on_close=True) as d:
        child = spawn_child(
            f"d = hl.Domain.open({domain_name!r})\nprint(d.participant_id, flush=True)\ntime.sleep(60)"
        )
        dead_id = int(read_line(child))
        child.send_signal(signal.SIGKILL)
        child.wait()
        raw = np.frombuffer(d.raw(), dtype=np.uint8)
        off = int(C.NAMES_OFFSET)
        idx, inc = dead_id & 0xFF, dead_id >> 8
        raw[off : off + 4].view("<u4")[0] = ((inc & 0xFFFFFF) << 8) | (
            idx + 1
        )  # the lock, as it died holding it
        cell = raw[off + 64 : off + 128]
        cell[0:8].view("<u8")[0] = (5 << 8) | 1  # a WRITING cell it left
        cell[16:22] = np.frombuffer(b"half\0\0", np.uint8)
        f = d.fence()
        d.publish("after", f)  # takes the lock over, frees the half-written cell
        assert d.names() == {"after": f.handle}
        assert raw[off : off + 4].view("<u4")[0] == 0  # and gave the lock back


def test_garbage_in_the_table_is_skipped_and_freed(domain_name: str) -> None:
    with hl.Domain.create(domain_name, unlink_on_close=True) as d:
        raw = np.frombuffer(d.raw(), dtype=np.uint8)
        off = int(C.NAMES_OFFSET)
        rng = np.random.default_rng(7)
        raw[off + 64 : off + 64 * (names.MAX_NAMES + 1)] = rng.integers(
            0, 256, 64 * names.MAX_NAMES, dtype=np.uint8
        )
        for k in range(names.MAX_NAMES):  # some cells "LIVE" with random handles and names without NUL
            if k % 2:
                raw[off + 64 * (k + 1) : off + 64 * (k + 1) + 8].view("<u8")[0] = 2
        assert d.names() == {}
        with pytest.raises(KeyError):
            d.lookup("anything")
        f = d.fence()
        d.publish("clean", f)  # the sweep frees the garbage
        assert d.names() == {"clean": f.handle}
        assert d.check() == []


def test_hostless_info_lists_names(domain_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with hl.Domain.create(domain_name, unlink_on_close=True) as d:
        t = d.timeline()
        d.publish("camera/frames", t)
        assert cli.main(["--plain", "info", domain_name]) == 0
        out = capsys.readouterr().out
        assert "camera/frames" in out and "timeline" in out
        r = subprocess.run(
            [sys.executable, "-m", "hostless.cli", "info", domain_name, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ},
        )
        assert '"camera/frames"' in r.stdout, r.stderr
