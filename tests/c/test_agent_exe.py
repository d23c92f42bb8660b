"""hostless-agent: the standalone native agent (src/hostless/agentexe/main.c, no Python).

It joins a domain and serves a queue with the engine's loop and built-in
kernels: a graph of built-in stages on two of them agrees with NumPy in the
four modes; a packet needing Python fails alone with ERROR and a record; bad
arguments exit 2, runtime errors (no domain, no queue, a garbage domain file)
exit 1 with a message and no crash; SIGKILL mid-packet gives the packet's
fence OWNER_DIED within the recovery bound and a respawned executable
serves; STOP and SIGTERM exit 0 and free the participant slot; the spawner's
death ends it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hostless as hl
from conftest import read_line
from hostless import agents, records
from hostless.agents import native
from hostless.graph import Graph
from hostless.kernels import LOAD_KERNEL, USER_KERNEL_BASE, f64, kernel_id

S = hl.Status
RNG = np.random.default_rng(11)
EXE = agents.executable_path()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("Z", "X")


def _until(pred: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def dom() -> Iterator[hl.Domain]:
    name = f"hltest-exe-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(name, fences=2048, participants=16, heap="32M", trace="1M", label="host")
    try:
        yield d
    finally:
        d.close()
        try:
            hl.Domain.unlink(name)
        except FileNotFoundError:
            pass


def _spawned(d: hl.Domain, **kw: Any) -> agents.Agent:
    return agents.spawn(d, "cpu", native="exe", **kw)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _buf(d: hl.Domain, arr: np.ndarray, keep: list[Any]) -> hl.Buffer:
    b = d.buffer(arr.shape, arr.dtype)
    b.numpy()[...] = arr
    keep.append(b)
    return b


def _run_why(
    d: hl.Domain, a: agents.Agent, kernel: int, bufs: list[int], scalars: Sequence[int] = ()
) -> tuple[S, str | None]:
    """One KERNEL packet on ``a``: the status of its fence and the record of its failure."""
    ka = hl.Kernargs(buffers=bufs, scalars=list(scalars)).to_buffer(d)
    f = d.fence(owner=a.id)
    try:
        a.queue.push(hl.Packet(kernel=kernel, args=ka.handle, signal=f.handle), timeout=5)
        st = f.wait(10)
        return st, records.read(d, f.handle)
    finally:
        f.release()
        ka.release()


def _run(d: hl.Domain, a: agents.Agent, kernel: int, bufs: list[int], scalars: Sequence[int] = ()) -> S:
    return _run_why(d, a, kernel, bufs, scalars)[0]


def _exe(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- serving


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_serves_a_builtin_kernel_graph_in_the_four_modes(dom: hl.Domain) -> None:
    a, b = _spawned(dom, label="exe-a"), _spawned(dom, label="exe-b")
    try:
        assert a.native == "exe" and a.proc.args[0] == EXE
        assert os.path.realpath(f"/proc/{a.proc.pid}/exe") == os.path.realpath(EXE)
        with open(f"/proc/{a.proc.pid}/maps") as fh:  # no Python interpreter in the process
            mapped = {ln.split()[-1] for ln in fh if "/" in ln}
        assert not [m for m in mapped if "libpython" in m or os.path.basename(m).startswith("python")]
        mine = {p.pid: p for p in dom.participants}
        assert mine[a.proc.pid].label == "exe-a" and mine[a.proc.pid].kind == "cpu"
        assert mine[a.proc.pid].id == a.id and mine[a.proc.pid].state == "alive"
        w1, w2 = _f32(32, 24) * 0.2, _f32(24, 10) * 0.2
        blas = native.blas_path() is not None  # GEMM in C needs a CBLAS; without one it needs Python
        g = Graph(dom).input("frame", (16, 32), np.float32).constant("w1", w1).constant("w2", w2)
        g.stage("pre", a, "normalize", ["frame"], ("x", (16, 32), np.float32), scalars=[0.5, 0.25])
        if blas:
            g.stage("fc1", b, "gemm", ["x", "w1"], ("h", (16, 24), np.float32))
            g.stage("act", b, "relu", ["h"], ("r", (16, 24), np.float32))
            g.stage("fc2", a, "gemm", ["r", "w2"], ("y", (16, 10), np.float32))
            g.stage("post", b, "softmax", ["y"], ("p", (16, 10), np.float32))
        else:
            g.stage("act", b, "relu", ["x"], ("r", (16, 32), np.float32))
            g.stage("sc", a, "scale", ["r"], ("y", (16, 32), np.float32), scalars=[0.5])
            g.stage("post", b, "softmax", ["y"], ("p", (16, 32), np.float32))
        frames = [RNG.random((16, 32), dtype=np.float32) for _ in range(4)]
        for dispatch in ("host", "direct"):
            for data in ("copy", "shared"):
                with g.compile(dispatch=dispatch, data=data, inflight=2) as cg:
                    for fr, out in zip(
                        frames, cg.stream([{"frame": f} for f in frames], timeout=20), strict=True
                    ):
                        x = (fr.astype(np.float64) - 0.5) / 0.25
                        h = np.maximum(x @ w1, 0) @ w2 if blas else np.maximum(x, 0) * 0.5
                        ref = _softmax(h)
                        np.testing.assert_allclose(out["p"], ref, rtol=1e-4, atol=1e-6)
        # its track in the trace is named after it (the JOIN record, as Python participants write)
        joins = {
            e["b"]: hl.trace._unpack(e["c"], e["d"], e["e"])
            for e in hl.trace.events(dom)
            if e["type"] == int(hl._abi.C.EV_USER) and e["a"] == hl.trace.USER_MAGIC | 1
        }
        assert joins.get(a.id) == "exe-a (cpu)" and joins.get(b.id) == "exe-b (cpu)"
        # `hostless info` shows it as a participant like the others
        r = subprocess.run(
            [sys.executable, "-m", "hostless.cli", "info", str(dom.name), "--json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert {"exe-a", "exe-b"} <= {p["label"] for p in json.loads(r.stdout)["participants"]}
    finally:
        a.stop()
        b.stop()
    assert a.proc.returncode == 0 and b.proc.returncode == 0


def test_a_packet_needing_python_fails_alone_with_why(dom: hl.Domain) -> None:
    keep: list[Any] = []
    a = _spawned(dom)
    try:
        x = _buf(dom, np.array([-1.0, 2.0, -3.0], np.float32), keep)
        o = _buf(dom, np.zeros(3, np.float32), keep)
        st, why = _run_why(dom, a, USER_KERNEL_BASE, [x.handle, o.handle])
        assert (
            st is S.ERROR
            and why == f"kernel {USER_KERNEL_BASE} needs Python; hostless-agent runs built-in kernels only"
        )
        st, why = _run_why(dom, a, LOAD_KERNEL, [x.handle])
        assert st is S.ERROR and (why or "").startswith("LOAD_KERNEL refused: hostless-agent loads no code")
        # a built-in kernel on a dtype the C kernels leave to Python
        xd, od = _buf(dom, np.array([-1.0, 2.0]), keep), _buf(dom, np.zeros(2), keep)
        st, why = _run_why(dom, a, kernel_id("relu"), [xd.handle, od.handle])
        assert st is S.ERROR and "needs Python" in (why or "")
        assert od.numpy().tolist() == [0.0, 0.0]
        # an ERT packet (the NPU's command format) whose buffer holds no ERT command: the C
        # loop decodes ERT itself and fails the packet with the decoder's why
        cb = _buf(dom, np.zeros(16, np.uint8), keep)
        ka = hl.Kernargs(buffers=[cb.handle]).to_buffer(dom)
        keep.append(ka)
        f = dom.fence(owner=a.id)
        a.queue.push(hl.Packet(type=hl.PacketType.ERT, args=ka.handle, signal=f.handle), timeout=5)
        assert f.wait(10) is S.ERROR
        assert "ERT command" in (records.read(dom, f.handle) or "")
        f.release()
        # ... and the agent goes on, computing in C
        assert _run(dom, a, kernel_id("relu"), [x.handle, o.handle]) is S.SUCCESS
        assert o.numpy().tolist() == [0.0, 2.0, 0.0]
        assert _run(dom, a, kernel_id("scale"), [x.handle, o.handle], [f64(-2.0)]) is S.SUCCESS
        assert o.numpy().tolist() == [2.0, -4.0, 6.0]
        with pytest.raises(TypeError, match="built-in kernels only"):
            a.load_function(np.negative)
        with pytest.raises(ValueError, match="no user_kernels"):
            agents.spawn(dom, "cpu", native="exe", user_kernels={"k": "m:f"})
        assert a.alive
    finally:
        for o_ in keep:
            o_.release()
        a.stop()
    assert a.proc.returncode == 0


@pytest.mark.parametrize("blas", ["none", "/nonexistent/libnoblas.so", "installed"])
def test_capabilities_say_what_runs_gemm(dom: hl.Domain, blas: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # without a BLAS the executable (no Python) cannot run GEMM: its capabilities say so, and
    # a GEMM packet fails alone with the record of why; with one, GEMM runs through it
    if blas == "installed":
        if native.blas_path() is None:
            pytest.skip("no BLAS installed (pip install 'hostless[blas]')")
    else:
        monkeypatch.setenv("HOSTLESS_BLAS", blas)
    keep: list[Any] = []
    a = _spawned(dom)
    try:
        caps = a.capabilities
        assert caps["native"] == "exe" and caps["kind"] == "cpu", caps
        x, w = _buf(dom, _f32(3, 4), keep), _buf(dom, _f32(4, 2), keep)
        o = _buf(dom, np.zeros((3, 2), np.float32), keep)
        st, why = _run_why(dom, a, kernel_id("gemm"), [x.handle, w.handle, o.handle])
        if blas == "installed":
            assert caps["gemm"] == "blas" and "sgemm" in caps["blas"] and caps["why"] is None, caps
            assert st is S.SUCCESS
            np.testing.assert_allclose(o.numpy(), x.numpy() @ w.numpy(), rtol=1e-5, atol=1e-5)
        else:
            assert caps["gemm"] == "none" and caps["blas"] is None, caps
            assert "GEMM packets fail" in caps["why"]
            assert ("hostless[blas]" if blas == "none" else "cannot load /nonexistent") in caps["why"]
            assert st is S.ERROR and "needs Python" in (why or ""), why
            assert a.alive
    finally:
        for o_ in keep:
            o_.release()
        a.stop()


def test_records_are_bounded(dom: hl.Domain) -> None:
    """The agent keeps its last 8 records alive (hle_record_write, as hostless.records.Recorder)."""
    keep: list[Any] = []
    a = _spawned(dom)
    try:
        x = _buf(dom, np.zeros(2, np.float32), keep)
        fences = []
        for _ in range(12):
            f = dom.fence(owner=a.id)
            fences.append(f)
            ka = hl.Kernargs(buffers=[x.handle]).to_buffer(dom)
            keep.append(ka)
            a.queue.push(hl.Packet(kernel=USER_KERNEL_BASE + 3, args=ka.handle, signal=f.handle), timeout=5)
        assert all(f.wait(10) is S.ERROR for f in fences)
        kept = [records.read(dom, f.handle) is not None for f in fences]
        assert kept == [False] * 4 + [True] * 8
        for f in fences:
            f.release()
    finally:
        for o_ in keep:
            o_.release()
        a.stop()
    assert not [n for n in dom.names() if n.startswith(records.PREFIX)]  # released on leave


# --------------------------------------------------------------------------- arguments and errors


@pytest.mark.parametrize(
    "args,said",
    [
        ([], "--domain is required"),
        (["--domain"], "--domain needs a value"),
        (["--domain", "x"], "one of --queue NAME or --queue-handle H"),
        (
            ["--domain", "x", "--queue", "q", "--queue-handle", "0x5"],
            "one of --queue NAME or --queue-handle H",
        ),
        (["--domain", "x", "--queue", "q", "--spin-ns", "abc"], "--spin-ns: not a count"),
        (["--domain", "x", "--queue", "q", "--spin-ns", "-5"], "--spin-ns: not a count"),
        (["--domain", "x", "--queue", "q", "--wait-timeout-ns", "1e9"], "--wait-timeout-ns"),
        (["--domain", "x", "--queue-handle", "banana"], "--queue-handle: not a handle"),
        (["--domain", "x", "--queue-handle", "-1"], "--queue-handle: not a handle"),
        (["--domain", "x", "--queue", "q", "--parent", "0"], "--parent: not a pid"),
        (["--domain", "x", "--queue", "q", "--kind", "gpu"], "unknown kind"),
        (["--domain", "x", "--queue", "q", "--label", "L" * 40], "--label is longer"),
        (["--domain", "x", "--queue", "q", "--frobnicate", "1"], "unknown option --frobnicate"),
        (["stray"], "unexpected argument stray"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], said: str) -> None:
    r = _exe(*args)
    assert r.returncode == 2, r
    assert said in r.stderr and "usage: hostless-agent" in r.stderr
    assert r.stdout == ""


def test_runtime_errors_exit_1_with_a_message(dom: hl.Domain) -> None:
    name = str(dom.name)
    missing = f"hltest-exe-missing-{uuid.uuid4().hex[:8]}"
    r = _exe("--domain", missing, "--queue", "q")
    assert r.returncode == 1 and f"cannot open the domain /dev/shm/{missing}" in r.stderr
    r = _exe("--domain", name, "--queue", "nosuchqueue")
    assert r.returncode == 1 and "no queue named nosuchqueue" in r.stderr
    f = dom.fence()
    dom.publish("afence", f)
    r = _exe("--domain", name, "--queue", "afence")
    assert r.returncode == 1 and "not a queue" in r.stderr
    q = dom.queue(8)
    stale = q.handle
    q.release()
    r = _exe("--domain", name, "--queue-handle", hex(stale))
    assert r.returncode == 1 and "cannot hold the queue" in r.stderr
    a = _spawned(dom)
    try:
        r = _exe("--domain", f"/dev/shm/{name}", "--queue-handle", hex(a.queue.handle))
        assert r.returncode == 1 and "live consumer" in r.stderr
    finally:
        a.stop()
    r = _exe("--domain", name, "--queue", "q", "--parent", str(2**22 + 12345))
    assert r.returncode == 1 and "is not running" in r.stderr
    f.release()
    assert r.stdout == ""
    assert len(dom.participants) == 1  # nobody left a slot behind


def _header_cases(good: bytes) -> dict[str, bytes]:
    def patch(off: int, fmt: str, value: int) -> bytes:
        b = bytearray(good)
        struct.pack_into(fmt, b, off, value)
        return bytes(b)

    garbage = np.random.default_rng(5).integers(0, 256, len(good), dtype=np.uint8).tobytes()
    return {
        "garbage": garbage,
        "tiny": good[:100],
        "abi": patch(8, "<I", 0xFFFF),
        "fence_capacity": patch(36, "<I", 0xFFFFFFFF),
        "fences_offset": patch(48, "<Q", 2**60),
        "heap_offset": patch(88, "<Q", len(good) - 64),
        "total_size": patch(16, "<Q", len(good) * 2),
        "truncated": good[: len(good) // 2],
    }


def test_hostile_domain_files_give_a_clean_error(dom: hl.Domain, tmp_path: Path) -> None:
    with open(f"/dev/shm/{dom.name}", "rb") as fh:
        good = fh.read()
    q = dom.queue(8)
    try:
        for case, data in _header_cases(good).items():
            p = tmp_path / case
            p.write_bytes(data)
            r = _exe("--domain", str(p), "--queue-handle", hex(q.handle))
            assert r.returncode == 1, (case, r)
            assert "cannot join the domain" in r.stderr and "hostless domain" in r.stderr, (case, r.stderr)
        link = tmp_path / "link"
        link.symlink_to(f"/dev/shm/{dom.name}")
        r = _exe("--domain", str(link), "--queue-handle", hex(q.handle))  # no symbolic link followed
        assert r.returncode == 1 and "cannot open the domain" in r.stderr
        zeros = tmp_path / "zeros"  # a creator that never finishes: bounded wait (2 s)
        zeros.write_bytes(bytes(len(good)))
        t0 = time.monotonic()
        r = _exe("--domain", str(zeros), "--queue-handle", hex(q.handle))
        assert r.returncode == 1 and "not an initialised hostless domain" in r.stderr
        assert time.monotonic() - t0 < 10
    finally:
        q.release()


# --------------------------------------------------------------------------- lifetime


def test_sigkill_mid_packet_owner_died_then_a_respawn_serves(dom: hl.Domain) -> None:
    keep: list[Any] = []
    victim = _spawned(dom, label="victim")
    respawned = None
    try:
        gate, f = dom.fence(), dom.fence(owner=victim.id)
        x = _buf(dom, _f32(8), keep)
        o = _buf(dom, np.zeros(8, np.float32), keep)
        ka = hl.Kernargs(buffers=[x.handle, o.handle]).to_buffer(dom)
        keep.append(ka)
        victim.queue.push(
            hl.Packet(kernel=kernel_id("relu"), args=ka.handle, signal=f.handle, wait=(gate.handle, 0))
        )

        def started() -> bool:  # the agent popped it and waits on the gate: mid-packet
            return any(
                e["type"] == int(hl._abi.C.EV_START) and e["c"] == f.handle for e in hl.trace.events(dom)
            )

        assert _until(started), "the agent never started the packet"
        t0 = time.monotonic()
        victim.kill()
        assert f.wait(5) is S.OWNER_DIED
        took = time.monotonic() - t0
        assert took < 2.0, f"OWNER_DIED took {took:.2f} s (watchdog every 20 ms)"
        assert _until(lambda: not any(p.id == victim.id and p.state == "alive" for p in dom.participants))
        assert victim.proc.returncode == -signal.SIGKILL
        gate.signal()
        gate.release()
        f.release()

        respawned = agents.spawn(dom, "cpu", native="exe", queue=victim.queue, label="respawned")
        assert respawned.queue.handle == victim.queue.handle and respawned.id != victim.id
        assert _run(dom, respawned, kernel_id("relu"), [x.handle, o.handle]) is S.SUCCESS
        np.testing.assert_array_equal(o.numpy(), np.maximum(x.numpy(), 0))
    finally:
        for o_ in keep:
            o_.release()
        victim.kill()
        if respawned is not None:
            respawned.stop()
    assert respawned is not None and respawned.proc.returncode == 0


def test_stop_exits_0_and_frees_the_slot(dom: hl.Domain) -> None:
    keep: list[Any] = []
    a = _spawned(dom, label="stopper")
    try:
        assert any(p.id == a.id and p.state == "alive" for p in dom.participants)
        x = _buf(dom, _f32(16), keep)
        o = _buf(dom, np.zeros(16, np.float32), keep)
        ka = hl.Kernargs(buffers=[x.handle, o.handle]).to_buffer(dom)
        keep.append(ka)
        f = dom.fence(owner=a.id)
        a.queue.push(hl.Packet(kernel=kernel_id("copy"), args=ka.handle, signal=f.handle))
        t0 = time.monotonic()
        a.stop(timeout=10)  # packets queued before the STOP still run
        assert time.monotonic() - t0 < 5
        assert a.proc.returncode == 0
        assert f.status is S.SUCCESS
        np.testing.assert_array_equal(o.numpy(), x.numpy())
        f.release()
        assert not any(p.id == a.id for p in dom.participants)  # left by itself: no reap needed
    finally:
        for o_ in keep:
            o_.release()
        a.kill()


def test_sigterm_leaves_cleanly(dom: hl.Domain) -> None:
    q = dom.queue(8)
    proc = subprocess.Popen(
        [EXE, "--domain", str(dom.name), "--queue-handle", hex(q.handle), "--trace", "--label", "termed"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pid = int(read_line(proc))
        owned = dom.fence(owner=pid)
        assert any(p.id == pid and p.label == "termed" for p in dom.participants)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0
        assert "on a signal" in (proc.stderr.read() if proc.stderr else "")
        assert not any(p.id == pid for p in dom.participants)
        assert owned.wait(5) is S.OWNER_LEFT  # what it owned failed when it left: left, not died (ABI 6)
        owned.release()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        q.release()


def test_serves_a_queue_by_name(dom: hl.Domain) -> None:
    keep: list[Any] = []
    q = dom.queue(8)
    dom.publish("camera-q", q)
    proc = subprocess.Popen([EXE, "--domain", str(dom.name), "--queue", "camera-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        pid = int(read_line(proc))
        x = _buf(dom, _f32(4), keep)
        o = _buf(dom, np.zeros(4, np.float32), keep)
        ka = hl.Kernargs(buffers=[x.handle, o.handle]).to_buffer(dom)
        keep.append(ka)
        f = dom.fence(owner=pid)
        q.push(hl.Packet(kernel=kernel_id("relu"), args=ka.handle, signal=f.handle))
        assert f.wait(10) is S.SUCCESS
        np.testing.assert_array_equal(o.numpy(), np.maximum(x.numpy(), 0))
        f.release()
        q.push(hl.Packet(type=hl.PacketType.STOP))
        assert proc.wait(10) == 0
    finally:
        for o_ in keep:
            o_.release()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        q.release()


SPAWNER = """
import sys, time
import hostless as hl
from hostless import agents
d = hl.Domain.open(sys.argv[1], label="spawner")
a = agents.spawn(d, "cpu", native="exe", label="orphan?")
print(a.proc.pid, a.id, flush=True)
time.sleep(120)
"""


def test_exits_when_its_parent_dies(dom: hl.Domain) -> None:
    spawner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SPAWNER), str(dom.name)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    agent_pid = None
    try:
        agent_pid, agent_id = (int(v) for v in read_line(spawner).split())
        assert not _gone(agent_pid)
        spawner.kill()
        spawner.wait(10)
        assert _until(lambda: _gone(agent_pid)), "the agent outlived its spawner"

        def left() -> bool:
            dom.reap()
            return not any(p.id == agent_id and p.state == "alive" for p in dom.participants)

        assert _until(left), "the agent still holds its participant slot"
    finally:
        if spawner.poll() is None:
            spawner.kill()
            spawner.wait(10)
        if agent_pid is not None and not _gone(agent_pid):
            os.kill(agent_pid, signal.SIGKILL)  # the agent this test started, by its pid


def test_builds_from_the_engine_library_alone(tmp_path: Path) -> None:
    """What `make agent` does: libhostless.a from the engine sources, main.c linked against it
    (warnings are errors), from the sources shipped in the package."""
    gcc = shutil.which("gcc")
    if gcc is None or shutil.which("ar") is None:
        pytest.skip("gcc and ar are needed to build libhostless.a")
    pkg = Path(hl.__file__).parent
    flags = ["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
             "-Wno-missing-field-initializers", f"-I{hl.get_include()}"]  # fmt: skip
    objs = []
    for src in sorted((pkg / "core").glob("*.c")):
        obj = tmp_path / (src.stem + ".o")
        r = subprocess.run(
            [gcc, *flags, "-DHOSTLESS_INTERNAL", "-c", str(src), "-o", str(obj)],
            capture_output=True, text=True, timeout=120,
        )
        assert r.returncode == 0, r.stderr
        objs.append(str(obj))
    lib = tmp_path / "libhostless.a"
    assert subprocess.run(["ar", "rcs", str(lib), *objs], timeout=60).returncode == 0
    exe = tmp_path / "hostless-agent"
    r = subprocess.run(
        [gcc, *flags, str(pkg / "agentexe" / "main.c"), "-o", str(exe), f"-L{tmp_path}", "-lhostless",
         "-lpthread", "-lm"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0 and r.stdout.startswith("usage: hostless-agent")
    r = subprocess.run([str(exe), "--domain", f"hltest-none-{uuid.uuid4().hex[:8]}", "--queue", "q"],
                       capture_output=True, text=True, timeout=20)  # fmt: skip
    assert r.returncode == 1 and "cannot open the domain" in r.stderr


def test_domain_truncated_under_it(domain_name: str) -> None:
    """Another process truncates the domain file while the agent serves: it exits 1 saying so
    (its SIGBUS guard), never dies of SIGBUS."""
    d = hl.Domain.create(domain_name, heap="1M", fences=1024, label="host", watchdog_interval=0)
    q = d.queue(8)
    proc = subprocess.Popen(
        [EXE, "--domain", domain_name, "--queue-handle", hex(q.handle), "--spin-ns", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        read_line(proc)
        os.truncate(f"/dev/shm/{domain_name}", 4096)
        assert proc.wait(10) == 1
        err = proc.stderr.read() if proc.stderr else ""
        assert "truncated" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        d.close()
