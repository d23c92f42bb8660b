"""``hostless top`` (issue 26, item 3): a live, read-only view of a domain.

The rendering (hostless.top.snapshot / render) against a running pipeline of two cpu
agents with one of them SIGKILLed: packets/s and busy % from the queues' counters, the
failure count and the reason of the last failure (its record), the killed agent's row
kept with "no consumer" and its participant slot's last recovery (pid, by whom);
labels and names with control characters shown escaped; the view takes no slot.  A
domain removed, replaced by junk, recreated, or with random bytes over its tables never
makes the monitor raise.  Then the real thing under tmux, as a person uses it: keys
sort and quit, a kill shows up, a removal is shown and the view keeps running.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import hostless as hl
from conftest import run_child
from hostless import agents, top
from hostless.kernels import kernel_id
from hostless.view import open_view


class Pipeline:
    """Two cpu agents; a feeder thread keeps stage-a busy (relu packets)."""

    def __init__(self, name: str) -> None:
        self.dom = hl.Domain.create(name, heap="32M", label="host\x1b[31m\u202e", unlink_on_close=True)
        self.a = agents.spawn(self.dom, "cpu", label="stage-a")
        self.b = agents.spawn(self.dom, "cpu", label="stage-b")
        self.x = self.dom.buffer((64,), "f4")
        self.o = self.dom.buffer((64,), "f4")
        self.frames = self.dom.timeline()
        self.dom.publish("frames\x07", self.frames)
        self.stop = threading.Event()
        self.sent = 0
        self.feeder: threading.Thread | None = None

    def run(self, ag: agents.Agent, kernel: int) -> hl.Status:
        ka = hl.Kernargs(buffers=[self.x.handle, self.o.handle]).to_buffer(self.dom)
        f = self.dom.fence(owner=ag.id)
        try:
            ag.queue.push(hl.Packet(kernel=kernel, args=ka.handle, signal=f.handle), timeout=5)
            return f.wait(10)
        finally:
            f.release()
            ka.release()

    def feed(self) -> None:
        relu = kernel_id("relu")

        def loop() -> None:
            while not self.stop.is_set():
                self.run(self.a, relu)
                self.sent += 1
                self.frames.signal(self.sent)
                time.sleep(0.0005)

        self.feeder = threading.Thread(target=loop, daemon=True)
        self.feeder.start()

    def close(self) -> None:
        self.stop.set()
        if self.feeder is not None:
            self.feeder.join(timeout=20)
        for ag in (self.a, self.b):
            if ag.alive:
                ag.stop()
        self.dom.close()


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    p = Pipeline(f"hltest-top-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        yield p
    finally:
        p.close()


def _recovered(p: Pipeline, pid: int, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open_view(p.dom.name) as v:
            if any(r.recovered_pid == pid for r in top.snapshot(v).participants):
                return
        time.sleep(0.02)
    pytest.fail(f"participant pid {pid} was not recovered within {timeout} s")


def _row(lines: list[str], start: str) -> str:
    rows = [ln for ln in lines if ln.startswith(start)]
    assert len(rows) == 1, (start, lines)
    return rows[0]


def test_render_a_running_pipeline_with_an_agent_killed(pipeline: Pipeline) -> None:
    p = pipeline
    assert p.run(p.a, 4242) is hl.Status.ERROR  # a packet that fails, with a record saying why
    p.feed()
    nparts = len(p.dom.participants)
    with open_view(p.dom.name) as v:
        s1 = top.snapshot(v)
        time.sleep(0.3)
        s2 = top.snapshot(v)
    lines = top.render(s2, s1, width=200)
    text = "\n".join(lines)
    a = _row(lines, "stage-a ")
    cols = a.split()
    assert cols[1] == "cpu" and cols[2] == str(p.a.proc.pid) and cols[3] == "alive", a
    assert float(cols[4]) > 0, a  # packets/s from the queue's completed counter
    assert cols[5].endswith("%") and cols[5] != "?", a  # busy % from busy_ns
    assert cols[6] == "1", a  # failures
    assert "unknown kernel 4242" in a, a  # the last failure's record, first line
    b = _row(lines, "stage-b ")
    assert b.split()[6] == "0" and b.split()[4] in ("0.0", "0")
    # untrusted text: shown escaped, never as control characters or reordering marks
    assert "host\\x1b[31m\\u202e" in text and "frames\\x07" in text
    assert not any(re.search(r"[\x00-\x1f\x7f\u202e]", ln) for ln in lines)
    assert len(p.dom.participants) == nparts  # the view took no slot

    bpid = p.b.proc.pid
    p.b.kill()
    _recovered(p, bpid)
    with open_view(p.dom.name) as v:
        s3 = top.remember(top.snapshot(v), s2)
        time.sleep(0.1)
        s4 = top.remember(top.snapshot(v), s3)
    lines = top.render(s4, s3, width=200)
    b = _row(lines, "stage-b (was) ")
    assert "no consumer" in b and str(bpid) in b, b
    slot = [r for r in s4.participants if r.recovered_pid == bpid]
    assert len(slot) == 1 and slot[0].recovered_by.startswith("slot "), slot
    assert f"pid {bpid} by slot" in "\n".join(lines)
    assert s4.recovered >= 1
    assert float(_row(lines, "stage-a ").split()[4]) > 0  # the other agent goes on
    # sort keys: by failures, stage-a (1 failure) first; by label, stage-a before stage-b
    for key in top.SORT_KEYS:
        out = top.render(s4, s3, sort=key, width=200)
        assert f"sort by {top.SORT_KEYS[key]}" in out[0]
    order = [ln.split()[0] for ln in top.render(s4, s3, sort="f") if ln.startswith("stage-")]
    assert order[0] == "stage-a"


def test_monitor_survives_removal_junk_and_recreation(make_name: object, tmp_path: Path) -> None:
    name = f"hltest-topgone-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path = f"/dev/shm/{name}"
    mon = top.Monitor(name)
    try:
        d = hl.Domain.create(name, heap="1M")
        assert not mon.read().error
        d.close()
        os.unlink(path)
        s = mon.read()
        assert "no such domain" in s.error and top.render(s)[-1] == s.error
        Path(path).write_bytes(b"\x1b[2J" * 5000)
        s = mon.read()
        assert s.error.startswith("cannot read the domain"), s.error
        assert "\x1b" not in "\n".join(top.render(s))
        os.unlink(path)
        d = hl.Domain.create(name, heap="1M", label="again")
        s = mon.read()
        assert not s.error and [r.label for r in s.participants] == ["again"]
        os.truncate(path, 8192)  # shrunk under the mapping: not read (it would fault)
        s = mon.read()
        assert s.error, s
        d.close()
    finally:
        mon.close()
        if os.path.exists(path):
            os.unlink(path)


def test_a_view_survives_truncation_during_its_reads(domain_name: str) -> None:
    """The file truncated under a view's mapping while it reads (what a refresh of `top` or
    `hostless info` meets when a hostile peer truncates the domain): the reads see zeros,
    the view says it was truncated, the process lives (before, SIGBUS killed it)."""
    r = run_child(
        """
        from hostless import top
        from hostless.view import open_view
        d = hl.Domain.create(sys.argv[1], heap="4M")
        v = open_view(sys.argv[1])
        assert not v.truncated
        os.truncate(v.path, 4096)  # under the mapping: the participant table, heap... are gone
        snap = top.snapshot(v)  # reads every table past the new end
        print("truncated", v.truncated, len(snap.participants), flush=True)
        v.close()
        mon = top.Monitor(sys.argv[1])
        print("monitor", bool(mon.read().error), flush=True)
        """,
        domain_name,
    )
    assert r.returncode == 0, r.stderr
    assert "truncated True 0" in r.stdout and "monitor True" in r.stdout, r.stdout


def test_monitor_survives_random_bytes_over_the_tables(pipeline: Pipeline, tmp_path: Path) -> None:
    """A copy of a live domain with random bytes over its header, participant and fence
    tables and queue headers: every read is a snapshot or an error, never an exception."""
    p = pipeline
    p.run(p.a, 4242)
    src = Path(f"/dev/shm/{p.dom.name}").read_bytes()
    with open_view(p.dom.name) as v:
        lay = dict(v.layout)
        qs = [a.queue for a in top.snapshot(v).agents]
    assert len(qs) == 2
    rng = np.random.default_rng(26)
    regions = [
        (0, 4096),
        (lay["participants_offset"], lay["participant_capacity"] * 128),
        (lay["fences_offset"], 64 * 64),
        (lay["heap_offset"], 1 << 16),
    ]
    copy = tmp_path / "dom"
    errors = ok = 0
    for i in range(150):
        buf = bytearray(src)
        off, n = regions[i % len(regions)]
        for _ in range(int(rng.integers(1, 40))):
            at = off + int(rng.integers(0, n - 8))
            buf[at : at + 8] = rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
        copy.write_bytes(bytes(buf))
        mon = top.Monitor(str(copy))
        try:
            s = mon.read()
            lines = top.render(s, None)
        finally:
            mon.close()
        assert not any(re.search(r"[\x00-\x1f\x7f]", ln) for ln in lines)
        errors += bool(s.error)
        ok += not s.error
    assert ok > 0  # most corruptions leave a readable, if wrong, domain


# ---------------------------------------------------------------------- tmux


def _tmux(sock: str, *args: str) -> str:
    r = subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=10)
    return r.stdout


def _until(sock: str, pred: object, timeout: float = 20.0) -> str:
    end = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < end:
        screen = _tmux(sock, "capture-pane", "-p", "-t", "top")
        if pred(screen):  # type: ignore[operator]
            return screen
        time.sleep(0.1)
    pytest.fail(f"the screen never showed what was expected; last screen:\n{screen}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_top_in_tmux(pipeline: Pipeline) -> None:
    """As a person would: `hostless top NAME` in a terminal, keys, an agent killed, the
    domain removed, then q."""
    p = pipeline
    p.run(p.a, 4242)
    p.feed()
    sock = f"hltest-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    cmd = f"{sys.executable} -m hostless.cli top {p.dom.name} --interval 0.1; echo TOP-EXIT=$?; sleep 60"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # pytest sets COLUMNS
    env["TERM"] = "xterm-256color"
    subprocess.run(
        [
            "tmux",
            "-L",
            sock,
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "160",
            "-y",
            "50",
            cmd,
        ],
        check=True,
        env=env,
        timeout=10,
    )
    try:
        screen = _until(sock, lambda s: "stage-a" in s and "stage-b" in s and "unknown kernel 4242" in s)
        assert "host\\x1b[31m" in screen
        _tmux(sock, "send-keys", "-t", "top", "f")
        _until(sock, lambda s: "sort by failures" in s)
        bpid = p.b.proc.pid
        p.b.kill()
        _until(sock, lambda s: "stage-b (was)" in s and "no consumer" in s and f"pid {bpid} by slot" in s)
        os.unlink(f"/dev/shm/{p.dom.name}")  # removed under the view: shown, still running
        _until(sock, lambda s: "no such domain" in s)
        _tmux(sock, "send-keys", "-t", "top", "q")
        _until(sock, lambda s: "TOP-EXIT=0" in s)
    finally:
        _tmux(sock, "kill-server")
