"""Agents (cpu NumPy worker, emulated NPU speaking ERT), graphs and the trace.

One domain with one cpu agent (with a user-registered kernel) and one npu
agent serves the whole module; tests that stop or kill an agent spawn their
own.  Every kernel is checked against NumPy; bad packets fail with ERROR and
the agent goes on; the four graph modes agree with each other and with a
NumPy reference; a SIGKILLed agent fails the graph with OWNER_DIED in bounded
time, and a respawned agent on the same queue rejoins.  The domain must check
clean at the end.

The agents are the default ones: the engine's C loop, C kernels and the C ERT
command processor, with the Python kernels as its callbacks (these tests once
ran against a Python agent loop as well; there is one loop now).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hostless as hl
from conftest import wait_asleep
from hostless import agents, ert, trace
from hostless._abi import C
from hostless.graph import Graph, StageFailed
from hostless.kernels import CPU_KERNELS, NPU_CUS, cu_index, f64, kernel_id

S = hl.Status
TESTS_DIR = str(Path(__file__).resolve().parent)
RNG = np.random.default_rng(1234)


@dataclass
class Env:
    dom: hl.Domain
    cpu: agents.Agent
    npu: agents.Agent
    owned: list[Any]

    def buffer(self, arr: np.ndarray) -> hl.Buffer:
        b = self.dom.buffer(arr.shape, arr.dtype)
        b.numpy()[...] = arr
        self.owned.append(b)
        return b

    def empty(self, shape: Sequence[int], dtype: Any) -> hl.Buffer:
        b = self.dom.buffer(tuple(shape), dtype)
        b.numpy()[...] = 0
        self.owned.append(b)
        return b


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    name = f"hltest-ag-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(name, fences=4096, participants=32, heap="128M", trace="4M", label="host")
    spawned: list[agents.Agent] = []
    old = os.environ.get("PYTHONPATH")
    try:
        # the cpu agent imports hl_user_kernels from this folder
        os.environ["PYTHONPATH"] = TESTS_DIR + (os.pathsep + old if old else "")
        cpu = agents.spawn(
            d,
            "cpu",
            label="cpu0",
            user_kernels={"axpy": "hl_user_kernels:axpy", "fail": "hl_user_kernels:fail"},
        )
        spawned.append(cpu)
        npu = agents.spawn(d, "npu", label="npu0")
        spawned.append(npu)
        e = Env(d, cpu, npu, [])
        yield e
        for o in e.owned:
            if o._held:
                o.release()
        for a in spawned:
            a.stop()
            assert a.proc.returncode == 0
        d.reap()
        assert d.check() == []
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
        for a in spawned:
            a.kill()
        d.close()
        try:
            hl.Domain.unlink(name)
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- submitting


def run_kernel(
    e: Env, agent: agents.Agent, kernel: int, bufs: Sequence[int], scalars: Sequence[int] = (), **pkt: Any
) -> S:
    """One KERNEL packet on ``agent``; returns the status of its fence."""
    ka = hl.Kernargs(buffers=list(bufs), scalars=list(scalars)).to_buffer(e.dom)
    f = e.dom.fence(owner=agent.id)
    try:
        agent.queue.push(hl.Packet(kernel=kernel, args=ka.handle, signal=f.handle, **pkt), timeout=5)
        return f.wait(10)
    finally:
        f.release()
        ka.release()


def run_cpu(e: Env, name: str, bufs: Sequence[hl.Buffer], scalars: Sequence[int] = ()) -> S:
    return run_kernel(e, e.cpu, kernel_id(name), [b.handle for b in bufs], scalars)


def command_buffer(e: Env, cmd: ert.ErtCommand | bytes) -> hl.Buffer:
    raw = cmd.encode() if isinstance(cmd, ert.ErtCommand) else cmd
    cb = e.dom.buffer(len(raw))
    cb.numpy()[:] = np.frombuffer(raw, np.uint8)
    e.owned.append(cb)
    return cb


def cu_args(bufs: Sequence[hl.Buffer], scalars: Sequence[int] = ()) -> list[int]:
    """The ERT argument words of the emulated CUs: nbuf, u64 buffer handles, u64 scalars."""
    return [len(bufs)] + ert.u64_args([b.handle for b in bufs]) + ert.u64_args(list(scalars))


def run_ert(e: Env, cb: hl.Buffer, agent: agents.Agent | None = None) -> tuple[S, int]:
    """One ERT packet naming command buffer ``cb``; returns (fence status, header state)."""
    agent = agent or e.npu
    ka = hl.Kernargs(buffers=[cb.handle]).to_buffer(e.dom)
    f = e.dom.fence(owner=agent.id)
    try:
        agent.queue.push(hl.Packet(type=hl.PacketType.ERT, args=ka.handle, signal=f.handle), timeout=5)
        st = f.wait(10)
    finally:
        f.release()
        ka.release()
    return st, header_state(cb)


def header_state(cb: hl.Buffer) -> int:
    return int(cb.numpy().view("<u4")[0]) & 0xF


def run_npu(e: Env, cu: str, bufs: Sequence[hl.Buffer], scalars: Sequence[int] = ()) -> tuple[S, int]:
    return run_ert(e, command_buffer(e, ert.start_cu(cu_index(cu), cu_args(bufs, scalars))))


# --------------------------------------------------------------------------- cpu kernels


def test_registries_are_complete() -> None:
    assert sorted(CPU_KERNELS) == sorted(
        ["copy", "add", "scale", "relu", "gemm", "sum", "softmax", "conv2d", "normalize"]
    )
    assert sorted(NPU_CUS) == sorted(["int8_gemm", "gemm", "relu", "softmax", "conv2d", "copy"])
    assert len({k for k, _ in CPU_KERNELS.values()}) == len(CPU_KERNELS)
    assert sorted(i for i, _ in NPU_CUS.values()) == list(range(len(NPU_CUS)))


def softmax_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def conv_ref(img: np.ndarray, ker: np.ndarray) -> np.ndarray:
    kh, kw = ker.shape
    out = np.zeros((img.shape[0] - kh + 1, img.shape[1] - kw + 1))
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = float((img[i : i + kh, j : j + kw].astype(np.float64) * ker).sum())
    return out


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_cpu_elementwise_kernels(env: Env) -> None:
    x, y = _f32(257), _f32(257)
    bx, by = env.buffer(x), env.buffer(y)
    out = env.empty((257,), np.float32)
    assert run_cpu(env, "copy", [bx, out]) is S.SUCCESS
    np.testing.assert_array_equal(out.numpy(), x)
    assert run_cpu(env, "add", [bx, by, out]) is S.SUCCESS
    np.testing.assert_array_equal(out.numpy(), x + y)
    assert run_cpu(env, "scale", [bx, out], [f64(-2.5)]) is S.SUCCESS
    np.testing.assert_allclose(out.numpy(), x * -2.5, rtol=1e-6)
    assert run_cpu(env, "relu", [bx, out]) is S.SUCCESS
    np.testing.assert_array_equal(out.numpy(), np.maximum(x, 0))


def test_cpu_gemm_sum_softmax(env: Env) -> None:
    a, w = _f32(33, 17), _f32(17, 9)
    out = env.empty((33, 9), np.float32)
    assert run_cpu(env, "gemm", [env.buffer(a), env.buffer(w), out]) is S.SUCCESS
    np.testing.assert_allclose(out.numpy(), a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    x = _f32(1000)
    s = env.empty((1,), np.float64)
    assert run_cpu(env, "sum", [env.buffer(x), s]) is S.SUCCESS
    assert s.numpy()[0] == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-5, abs=1e-4)
    z = _f32(7, 31) * 5
    sm = env.empty((7, 31), np.float32)
    assert run_cpu(env, "softmax", [env.buffer(z), sm]) is S.SUCCESS
    np.testing.assert_allclose(sm.numpy(), softmax_ref(z), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(sm.numpy().sum(axis=-1), 1.0, rtol=1e-5)


def test_cpu_conv2d_and_normalize(env: Env) -> None:
    img, ker = _f32(19, 23), _f32(3, 5)
    out = env.empty((17, 19), np.float32)
    assert run_cpu(env, "conv2d", [env.buffer(img), env.buffer(ker), out]) is S.SUCCESS
    np.testing.assert_allclose(out.numpy(), conv_ref(img, ker), rtol=1e-4, atol=1e-4)
    raw = RNG.integers(0, 256, (12, 16), dtype=np.uint8)
    norm = env.empty((12, 16), np.float32)
    assert run_cpu(env, "normalize", [env.buffer(raw), norm], [f64(127.5), f64(64.0)]) is S.SUCCESS
    np.testing.assert_allclose(norm.numpy(), (raw.astype(np.float64) - 127.5) / 64.0, rtol=1e-6)


def test_user_registered_kernel(env: Env) -> None:
    assert set(env.cpu.user_kernels) == {"axpy", "fail"}
    x, y = _f32(100), _f32(100)
    out = env.empty((100,), np.float32)
    st = run_kernel(
        env,
        env.cpu,
        env.cpu.user_kernels["axpy"],
        [env.buffer(x).handle, env.buffer(y).handle, out.handle],
        [f64(3.0)],
    )
    assert st is S.SUCCESS
    np.testing.assert_allclose(out.numpy(), 3.0 * x + y, rtol=1e-6)
    assert run_kernel(env, env.cpu, env.cpu.user_kernels["fail"], [out.handle]) is S.ERROR
    assert env.cpu.alive
    # a user kernel can be a graph stage
    g = Graph(env.dom).input("x", (100,), np.float32).constant("y", y)
    g.stage("axpy", env.cpu, "axpy", ["x", "y"], ("out", (100,), np.float32), scalars=[3.0])
    with g.compile(dispatch="direct", data="shared") as cg:
        np.testing.assert_allclose(cg.run({"x": x})["out"], 3.0 * x + y, rtol=1e-6)


# --------------------------------------------------------------------------- npu compute units


def test_npu_int8_gemm(env: Env) -> None:
    a = RNG.integers(-128, 128, (24, 40), dtype=np.int8)
    w = RNG.integers(-128, 128, (40, 12), dtype=np.int8)
    out = env.empty((24, 12), np.int32)
    st, state = run_npu(env, "int8_gemm", [env.buffer(a), env.buffer(w), out])
    assert (st, state) == (S.SUCCESS, ert.State.COMPLETED)
    np.testing.assert_array_equal(out.numpy(), a.astype(np.int32) @ w.astype(np.int32))


def test_npu_float_cus(env: Env) -> None:
    a, w = _f32(16, 32), _f32(32, 8)
    out = env.empty((16, 8), np.float32)
    assert run_npu(env, "gemm", [env.buffer(a), env.buffer(w), out]) == (S.SUCCESS, ert.State.COMPLETED)
    np.testing.assert_allclose(out.numpy(), a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    x = _f32(6, 50)
    bx = env.buffer(x)
    r = env.empty((6, 50), np.float32)
    assert run_npu(env, "relu", [bx, r]) == (S.SUCCESS, ert.State.COMPLETED)
    np.testing.assert_array_equal(r.numpy(), np.maximum(x, 0))
    sm = env.empty((6, 50), np.float32)
    assert run_npu(env, "softmax", [bx, sm]) == (S.SUCCESS, ert.State.COMPLETED)
    np.testing.assert_allclose(sm.numpy(), softmax_ref(x), rtol=1e-5, atol=1e-7)
    c = env.empty((6, 50), np.float32)
    assert run_npu(env, "copy", [bx, c]) == (S.SUCCESS, ert.State.COMPLETED)
    np.testing.assert_array_equal(c.numpy(), x)
    img, ker = _f32(12, 12), _f32(3, 3)
    co = env.empty((10, 10), np.float32)
    assert run_npu(env, "conv2d", [env.buffer(img), env.buffer(ker), co]) == (S.SUCCESS, ert.State.COMPLETED)
    np.testing.assert_allclose(co.numpy(), conv_ref(img, ker), rtol=1e-4, atol=1e-4)


def test_npu_start_npu_opcode(env: Env) -> None:
    a, w = _f32(8, 8), _f32(8, 4)
    out = env.empty((8, 4), np.float32)
    instr = env.empty((64,), np.uint32)  # the instruction buffer: named, not interpreted
    cmd = ert.start_npu(cu_index("gemm"), instr.handle, 256, cu_args([env.buffer(a), env.buffer(w), out]))
    cb = command_buffer(env, cmd)
    assert ert.parse_header(int(cb.numpy().view("<u4")[0]))[3] == ert.Opcode.START_NPU
    assert run_ert(env, cb) == (S.SUCCESS, ert.State.COMPLETED)
    np.testing.assert_allclose(out.numpy(), a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)


def test_npu_cmd_chain(env: Env) -> None:
    x = _f32(64)
    bx = env.buffer(x)
    mid, out = env.empty((64,), np.float32), env.empty((64,), np.float32)
    c0 = command_buffer(env, ert.start_cu(cu_index("relu"), cu_args([bx, mid])))
    c1 = command_buffer(env, ert.start_cu(cu_index("copy"), cu_args([mid, out])))
    chain = command_buffer(env, ert.cmd_chain([c0.handle, c1.handle]))
    assert run_ert(env, chain) == (S.SUCCESS, ert.State.COMPLETED)
    np.testing.assert_array_equal(out.numpy(), np.maximum(x, 0))
    assert header_state(c0) == header_state(c1) == ert.State.COMPLETED
    words = chain.numpy().view("<u4")
    assert (int(words[1]), int(words[2]), int(words[3])) == (2, 1, 0)  # count, submit index, error index

    # a chain whose second command is malformed: the chain fails at index 1
    good = command_buffer(env, ert.start_cu(cu_index("relu"), cu_args([bx, mid])))
    bad = command_buffer(env, ert.ErtCommand(ert.State.NEW, ert.Opcode.START_CU, ert.CmdType.CU, 0b11, [0]))
    chain2 = command_buffer(env, ert.cmd_chain([good.handle, bad.handle]))
    assert run_ert(env, chain2) == (S.ERROR, ert.State.ERROR)
    assert header_state(good) == ert.State.COMPLETED and header_state(bad) == ert.State.ERROR
    words = chain2.numpy().view("<u4")
    assert (int(words[2]), int(words[3])) == (1, 1)


# --------------------------------------------------------------------------- bad packets


def test_bad_cpu_packets_fail_with_error_and_the_agent_goes_on(env: Env) -> None:
    a, w = env.buffer(_f32(4, 4)), env.buffer(_f32(4, 4))
    out = env.empty((4, 4), np.float32)
    gemm = kernel_id("gemm")
    good = [a.handle, w.handle, out.handle]
    gone = env.dom.buffer(16)
    stale = gone.handle
    gone.release()
    tl = env.dom.timeline()
    try:
        # unknown kernel, stale buffer handle, wrong sizes, wrong count, a fence as a buffer
        assert run_kernel(env, env.cpu, 777, good) is S.ERROR
        assert run_kernel(env, env.cpu, gemm, [a.handle, stale, out.handle]) is S.ERROR
        wrong = env.empty((3, 4), np.float32)
        assert run_kernel(env, env.cpu, gemm, [a.handle, w.handle, wrong.handle]) is S.ERROR
        assert run_kernel(env, env.cpu, gemm, [a.handle, w.handle]) is S.ERROR
        assert run_kernel(env, env.cpu, gemm, [a.handle, tl.handle, out.handle]) is S.ERROR
        assert (
            run_kernel(env, env.cpu, kernel_id("scale"), [a.handle, out.handle], []) is S.ERROR
        )  # no scalar
        assert run_kernel(env, env.cpu, (1 << 32) - 1, [(1 << 64) - 1]) is S.ERROR  # forged handle

        def raw_packet(**kw: Any) -> S:
            f = env.dom.fence(owner=env.cpu.id)
            try:
                env.cpu.queue.push(hl.Packet(signal=f.handle, **kw), timeout=5)
                return f.wait(10)
            finally:
                f.release()

        assert raw_packet(kernel=gemm, args=0) is S.ERROR  # no argument block
        assert raw_packet(kernel=gemm, args=stale) is S.ERROR  # stale argument block
        junk = env.buffer(np.frombuffer(b"NOPE" + bytes(60), np.uint8))
        assert raw_packet(kernel=gemm, args=junk.handle) is S.ERROR  # bad magic
        short = hl.Kernargs(buffers=[a.handle, w.handle, out.handle]).encode()[:30]
        assert raw_packet(kernel=gemm, args=env.buffer(np.frombuffer(short, np.uint8)).handle) is S.ERROR
        assert raw_packet(type=99, kernel=gemm) is S.ERROR  # unknown packet type
        # a bad signal handle: nothing to fail, the agent must just go on
        other = env.empty((4, 4), np.float32)
        ka = hl.Kernargs(buffers=[a.handle, w.handle, other.handle]).to_buffer(env.dom)
        env.owned.append(ka)
        env.cpu.queue.push(hl.Packet(kernel=gemm, args=ka.handle, signal=(1 << 63) | 12345), timeout=5)
        # an input fence that failed: the stage does not run, its signal gets the failure
        failed = env.dom.fence()
        failed.signal(S.CANCEL)
        out.numpy()[...] = -7
        assert run_kernel(env, env.cpu, gemm, good, wait=(failed.handle, 0)) is S.CANCEL
        assert (out.numpy() == -7).all()
        failed.release()
        # a timeline point to wait for: the kernel runs once the host signals it
        ka2 = hl.Kernargs(buffers=good).to_buffer(env.dom)
        env.owned.append(ka2)
        f = env.dom.fence(owner=env.cpu.id)
        env.cpu.queue.push(
            hl.Packet(kernel=gemm, args=ka2.handle, signal=f.handle, wait=(tl.handle, 0), wait_value=(5, 0))
        )
        wait_asleep(env.dom, tl)  # the agent asleep on the point: the signal must wake it
        assert f.status is S.ACTIVE
        tl.signal(5)
        assert f.wait(10) is S.SUCCESS
        f.release()
        np.testing.assert_allclose(out.numpy(), a.numpy() @ w.numpy(), rtol=1e-5)
        # and after all of that a good packet still runs
        assert env.cpu.alive
        assert run_kernel(env, env.cpu, gemm, good) is S.SUCCESS
    finally:
        tl.release()


def test_bad_ert_commands_fail_with_error_and_the_npu_goes_on(env: Env) -> None:
    x = env.buffer(_f32(16))
    out = env.empty((16,), np.float32)
    relu = cu_index("relu")
    cases = {
        # count 5 in the header, but the buffer holds only header + cu_mask
        "count past the buffer": (ert.header(ert.State.NEW, 5, ert.Opcode.START_CU)).to_bytes(4, "little")
        + (1 << relu).to_bytes(4, "little"),
        "two CUs in the mask": ert.ErtCommand(
            ert.State.NEW, ert.Opcode.START_CU, ert.CmdType.CU, 0b101, cu_args([x, out])
        ),
        "no CU in the mask": ert.ErtCommand(
            ert.State.NEW, ert.Opcode.START_CU, ert.CmdType.CU, 0, cu_args([x, out])
        ),
        "CU not in the xclbin": ert.start_cu(17, cu_args([x, out])),
        "unsupported opcode": ert.ErtCommand(
            ert.State.NEW, ert.Opcode.EXEC_WRITE, ert.CmdType.CU, 1 << relu, cu_args([x, out])
        ),
        "buffer count too large": ert.start_cu(relu, [3] + ert.u64_args([x.handle, out.handle])),
        "no arguments": ert.start_cu(relu, []),
        "wrong sizes": ert.start_cu(cu_index("gemm"), cu_args([x, x, out])),
        "chain of a missing command": ert.cmd_chain([(1 << 62) | 99]),
        "chain shorter than its count": ert.ErtCommand(
            ert.State.NEW, ert.Opcode.CMD_CHAIN, ert.CmdType.CU, 0, [4, 0, 0, 0, 0, 0]
        ),
    }
    for what, cmd in cases.items():
        cb = command_buffer(env, cmd)
        st, state = run_ert(env, cb)
        assert st is S.ERROR, what
        assert state == ert.State.ERROR, what
    # an ERT packet without a command buffer, and one with no argument block
    ka = hl.Kernargs(buffers=[]).to_buffer(env.dom)
    env.owned.append(ka)
    for args in (ka.handle, 0):
        f = env.dom.fence(owner=env.npu.id)
        env.npu.queue.push(hl.Packet(type=hl.PacketType.ERT, args=args, signal=f.handle), timeout=5)
        assert f.wait(10) is S.ERROR
        f.release()
    assert env.npu.alive
    assert run_npu(env, "relu", [x, out]) == (S.SUCCESS, ert.State.COMPLETED)
    np.testing.assert_array_equal(out.numpy(), np.maximum(x.numpy(), 0))


# --------------------------------------------------------------------------- graphs


def vision_graph(e: Env, npu: agents.Agent | None = None) -> tuple[Graph, np.ndarray, np.ndarray]:
    npu = npu or e.npu
    w1, w2 = _f32(32, 24) * 0.2, _f32(24, 10) * 0.2
    g = Graph(e.dom).input("frame", (16, 32), np.float32).constant("w1", w1).constant("w2", w2)
    g.stage("pre", e.cpu, "normalize", ["frame"], ("x", (16, 32), np.float32), scalars=[0.5, 0.25])
    g.stage("fc1", npu, "gemm", ["x", "w1"], ("h", (16, 24), np.float32))
    g.stage("act", npu, "relu", ["h"], ("a", (16, 24), np.float32))
    g.stage("fc2", npu, "gemm", ["a", "w2"], ("y", (16, 10), np.float32))
    g.stage("post", e.cpu, "softmax", ["y"], ("p", (16, 10), np.float32))
    return g, w1, w2


def vision_ref(frame: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    x = (frame.astype(np.float64) - 0.5) / 0.25
    return softmax_ref(np.maximum(x @ w1, 0) @ w2)


MODES = [("host", "copy"), ("host", "shared"), ("direct", "copy"), ("direct", "shared")]


def test_four_modes_agree_with_numpy(env: Env) -> None:
    g, w1, w2 = vision_graph(env)
    frames = [RNG.random((16, 32), dtype=np.float32) for _ in range(7)]
    refs = [vision_ref(f, w1, w2) for f in frames]
    results: dict[tuple[str, str], list[np.ndarray]] = {}
    for dispatch, data in MODES:
        with g.compile(dispatch=dispatch, data=data, inflight=3) as cg:
            outs = [cg.run({"frame": frames[0]})["p"], cg.run({"frame": frames[1]})["p"]]
            outs += [o["p"] for o in cg.stream({"frame": f} for f in frames[2:])]
        assert len(outs) == len(frames)
        for o, r in zip(outs, refs, strict=True):
            np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-6)
        results[(dispatch, data)] = outs
    base = results[("host", "copy")]
    for mode, outs in results.items():
        for o, b in zip(outs, base, strict=True):
            np.testing.assert_array_equal(o, b, err_msg=f"{mode} differs from host+copy")


def test_int8_graph_in_four_modes(env: Env) -> None:
    w = RNG.integers(-8, 8, (32, 16), dtype=np.int8)
    g = Graph(env.dom).input("q", (8, 32), np.int8).constant("w", w)
    g.stage("mm", env.npu, "int8_gemm", ["q", "w"], ("acc", (8, 16), np.int32))
    g.stage("dq", env.cpu, "scale", ["acc"], ("y", (8, 16), np.float32), scalars=[0.125])
    g.stage("act", env.cpu, "relu", ["y"], ("z", (8, 16), np.float32))
    q = RNG.integers(-128, 128, (8, 32), dtype=np.int8)
    ref = np.maximum((q.astype(np.int32) @ w.astype(np.int32)) * 0.125, 0).astype(np.float32)
    for dispatch, data in MODES:
        with g.compile(dispatch=dispatch, data=data, inflight=2) as cg:
            outs = list(cg.stream([{"q": q}] * 4))
            assert len(outs) == 4
            for o in outs:
                np.testing.assert_array_equal(o["z"], ref)


def test_graph_rejects_bad_descriptions(env: Env) -> None:
    g = Graph(env.dom).input("x", (4,), np.float32)
    with pytest.raises(KeyError):
        g.stage("s", env.npu, "normalize", ["x"], ("y", (4,), np.float32))  # not an npu CU
    with pytest.raises(KeyError):
        g.stage("s", env.cpu, "relu", ["nope"], ("y", (4,), np.float32))
    with pytest.raises(ValueError):
        g.stage("s", env.cpu, "relu", ["x"], ("x", (4,), np.float32))
    g.stage("s", env.cpu, "relu", ["x"], ("y", (4,), np.float32))
    for kw in ({"dispatch": "gpu"}, {"data": "zero"}, {"inflight": 0}):
        with pytest.raises(ValueError):
            g.compile(**kw)
    with pytest.raises(ValueError):
        Graph(env.dom).compile()
    with g.compile() as cg:
        with pytest.raises(ValueError):
            cg.run({"x": np.zeros(5, np.float32)})
        with pytest.raises(KeyError):
            cg.run({})
    with pytest.raises(hl.HostlessError):
        cg.run({"x": np.zeros(4, np.float32)})


def test_failing_stage_fails_the_run_naming_that_stage(env: Env) -> None:
    g = Graph(env.dom).input("x", (4,), np.float32)
    g.stage("boom", env.cpu, "fail", ["x"], ("y", (4,), np.float32))
    g.stage("after", env.npu, "relu", ["y"], ("z", (4,), np.float32))
    for dispatch in ("host", "direct"):
        with g.compile(dispatch=dispatch, data="shared") as cg:
            t0 = time.monotonic()
            with pytest.raises(StageFailed) as ei:
                cg.run({"x": np.ones(4, np.float32)}, timeout=10)
            assert (ei.value.stage, ei.value.status) == ("boom", S.ERROR), dispatch
            assert time.monotonic() - t0 < 5
    assert env.cpu.alive and env.npu.alive


# --------------------------------------------------------------------------- lifecycle and failures


def test_agent_kill_mid_graph_then_respawn(env: Env) -> None:
    victim = agents.spawn(env.dom, "npu", label="victim")
    respawned: agents.Agent | None = None
    try:
        owned = env.dom.fence(owner=victim.id)
        g, w1, w2 = vision_graph(env, npu=victim)
        frame = RNG.random((16, 32), dtype=np.float32)
        ref = vision_ref(frame, w1, w2)
        cg = g.compile(dispatch="direct", data="shared", inflight=3)
        killed_at: list[float] = []

        def frames() -> Iterator[dict[str, np.ndarray]]:
            for k in range(40):
                if k == 6:
                    victim.kill()
                    killed_at.append(time.monotonic())
                yield {"frame": frame}

        done = 0
        with pytest.raises(StageFailed) as ei:
            for out in cg.stream(frames(), timeout=20):
                np.testing.assert_allclose(out["p"], ref, rtol=1e-4, atol=1e-6)  # no silent wrong output
                done += 1
        elapsed = time.monotonic() - killed_at[0]
        assert ei.value.status is S.OWNER_DIED
        assert ei.value.stage in ("fc1", "act", "fc2")
        assert elapsed < 5, f"the failure took {elapsed:.1f} s to surface"
        assert 3 <= done <= 6
        assert owned.wait(5) is S.OWNER_DIED  # every fence the agent owned
        owned.release()
        cg.close()

        # the other agents stay usable
        x = _f32(32)
        out = env.empty((32,), np.float32)
        assert run_cpu(env, "relu", [env.buffer(x), out]) is S.SUCCESS
        assert run_npu(env, "relu", [env.buffer(x), out]) == (S.SUCCESS, ert.State.COMPLETED)

        # a respawned agent on the dead one's queue rejoins, in a recompiled graph
        respawned = agents.spawn(env.dom, "npu", queue=victim.queue, label="respawned")
        assert respawned.queue.handle == victim.queue.handle
        g2, w1, w2 = vision_graph(env, npu=respawned)
        ref2 = vision_ref(frame, w1, w2)
        for dispatch, data in MODES:
            with g2.compile(dispatch=dispatch, data=data, inflight=2) as cg2:
                for o in cg2.stream([{"frame": frame}] * 3):
                    np.testing.assert_allclose(o["p"], ref2, rtol=1e-4, atol=1e-6)
    finally:
        victim.kill()
        if respawned is not None:
            respawned.stop()
            assert respawned.proc.returncode == 0
    env.dom.reap()
    assert env.dom.check() == []


def test_host_mode_reports_a_dead_agent(env: Env) -> None:
    victim = agents.spawn(env.dom, "cpu", label="victim-host")
    try:
        g = Graph(env.dom).input("x", (8,), np.float32)
        g.stage("a", env.npu, "relu", ["x"], ("y", (8,), np.float32))
        g.stage("b", victim, "relu", ["y"], ("z", (8,), np.float32))
        with g.compile(dispatch="host", data="copy") as cg:
            x = _f32(8)
            np.testing.assert_array_equal(cg.run({"x": x})["z"], np.maximum(x, 0))
            victim.kill()
            t0 = time.monotonic()
            with pytest.raises(StageFailed) as ei:
                cg.run({"x": x}, timeout=10)
            assert (ei.value.stage, ei.value.status) == ("b", S.OWNER_DIED)
            assert time.monotonic() - t0 < 5
    finally:
        victim.kill()
        if victim.queue._held:
            victim.queue.release()


def test_agent_stops_on_stop_packet(env: Env) -> None:
    a = agents.spawn(env.dom, "cpu", label="stopper")
    try:
        pid = a.id
        assert any(p.id == pid for p in env.dom.participants)
        x = _f32(8)
        out = env.empty((8,), np.float32)
        assert run_kernel(env, a, kernel_id("relu"), [env.buffer(x).handle, out.handle]) is S.SUCCESS
        # packets queued before the STOP still run
        f = env.dom.fence(owner=a.id)
        ka = hl.Kernargs(buffers=[env.buffer(x).handle, out.handle]).to_buffer(env.dom)
        env.owned.append(ka)
        a.queue.push(hl.Packet(kernel=kernel_id("copy"), args=ka.handle, signal=f.handle))
        t0 = time.monotonic()
        a.stop(timeout=10)
        assert time.monotonic() - t0 < 5
        assert a.proc.returncode == 0
        assert f.status is S.SUCCESS
        f.release()
        assert not any(p.id == pid and p.state == "alive" for p in env.dom.participants)
    finally:
        a.kill()


SPAWNER = """
import sys, time
import hostless as hl
from hostless import agents
d = hl.Domain.open(sys.argv[1], label="spawner")
a = agents.spawn(d, "cpu", label="orphan?")
print(a.proc.pid, a.id, flush=True)
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("Z", "X")


def test_agent_dies_with_its_spawner(env: Env) -> None:
    spawner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SPAWNER), str(env.dom.name)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    agent_pid = None
    try:
        assert spawner.stdout is not None
        line = spawner.stdout.readline().split()
        assert len(line) == 2, spawner.stderr.read() if spawner.stderr else ""
        agent_pid, agent_id = int(line[0]), int(line[1])
        assert not _gone(agent_pid)
        spawner.send_signal(signal.SIGKILL)
        spawner.wait(10)
        deadline = time.monotonic() + 5
        while not _gone(agent_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(agent_pid), "the agent outlived its spawner"

        # (a killed process shows as a zombie while its threads are torn down,
        # and its liveness lock goes with the last of them)
        def left() -> bool:
            env.dom.reap()
            return not any(p.id == agent_id and p.state == "alive" for p in env.dom.participants)

        deadline = time.monotonic() + 5
        while not left() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert left(), "the dead agent still holds its participant slot"
    finally:
        if spawner.poll() is None:
            spawner.kill()
            spawner.wait(10)
        if agent_pid is not None and not _gone(agent_pid):
            os.kill(agent_pid, signal.SIGKILL)  # the agent this test started, by its pid


# --------------------------------------------------------------------------- trace


def test_trace_export_has_every_packet(env: Env, tmp_path: Path) -> None:
    x = env.buffer(_f32(64))
    mid, out = env.empty((64,), np.float32), env.empty((64,), np.float32)
    ka = hl.Kernargs(buffers=[x.handle, mid.handle]).to_buffer(env.dom)
    cb = command_buffer(env, ert.start_cu(cu_index("relu"), cu_args([mid, out])))
    ka_npu = hl.Kernargs(buffers=[cb.handle]).to_buffer(env.dom)
    env.owned += [ka, ka_npu]
    pushed: list[tuple[int, int]] = []  # (queue, index)
    for _ in range(3):
        f = env.dom.fence(owner=env.cpu.id)
        pushed.append(
            (
                env.cpu.queue.handle,
                env.cpu.queue.push(hl.Packet(kernel=kernel_id("copy"), args=ka.handle, signal=f.handle)),
            )
        )
        assert f.wait(10) is S.SUCCESS
        f.release()
        g = env.dom.fence(owner=env.npu.id)
        pushed.append(
            (
                env.npu.queue.handle,
                env.npu.queue.push(hl.Packet(type=hl.PacketType.ERT, args=ka_npu.handle, signal=g.handle)),
            )
        )
        assert g.wait(10) is S.SUCCESS
        g.release()
    parts = {p.id: p.index for p in env.dom.participants}
    me = parts[env.dom.participant_id]
    consumer = {env.cpu.queue.handle: parts[env.cpu.id], env.npu.queue.handle: parts[env.npu.id]}
    cons_id = {env.cpu.queue.handle: env.cpu.id, env.npu.queue.handle: env.npu.id}
    evs = trace.events(env.dom)
    for qh, idx in pushed:
        mine = [e for e in evs if e["a"] == qh and e["b"] == idx and e["type"] in (1, 2, 3)]
        by = {e["type"]: e for e in mine}
        assert set(by) == {int(C.EV_ENQUEUE), int(C.EV_START), int(C.EV_END)}, (hex(qh), idx, mine)
        enq, start, end = by[int(C.EV_ENQUEUE)], by[int(C.EV_START)], by[int(C.EV_END)]
        assert enq["part"] == me and start["part"] == end["part"] == consumer[qh]
        # The core stamps an enqueue after publishing the packet and retaking the
        # GIL, so the consumer may have started (even finished) it by then: only
        # start <= end is an ordering the trace guarantees.
        assert start["ts"] <= end["ts"] and enq["ts"] > 0
        assert end["d"] == int(S.SUCCESS)
    assert any(e["type"] == int(C.EV_SIGNAL) for e in evs)

    path = tmp_path / "trace.json"
    n = trace.export(env.dom, str(path))
    doc = json.loads(path.read_text())
    tev = doc["traceEvents"]
    assert n == len(tev) > 0
    for qh, idx in pushed:
        pid = f"{qh:#x}:{idx}"
        mine = {e["ph"]: e for e in tev if e.get("id") == pid}
        assert set(mine) == {"b", "e", "s", "f"}, (pid, mine)
        assert (
            mine["s"]["ts"] <= mine["f"]["ts"] == mine["b"]["ts"] <= mine["e"]["ts"]
        )  # the flow runs forward
        assert mine["s"]["tid"] == trace.track_of(env.dom.participant_id)
        assert mine["b"]["tid"] == mine["e"]["tid"] == trace.track_of(cons_id[qh])
    names = [e["args"]["name"] for e in tev if e.get("ph") == "M" and e["name"] == "thread_name"]
    assert any("cpu0" in nm for nm in names) and any("npu0" in nm for nm in names)
    assert all(isinstance(e.get("ts", 0), (int, float)) for e in tev)


def test_gpucp_refuses_user_kernels_before_starting_anything() -> None:
    import uuid

    d = hl.Domain.create(f"hlgcp-{uuid.uuid4().hex[:8]}", heap="1M", unlink_on_close=True)
    try:
        with pytest.raises(ValueError, match="built-in device kernels only"):
            agents.spawn(d, "gpucp", user_kernels={"k": "mod:fn"})
        with pytest.raises(ValueError, match="cpu and npu"):
            agents.spawn(d, "gpucp", native=True)
    finally:
        d.close()
