# ruff: noqa: F811  (the fixtures imported from the module whose tests run here are used by name)
"""The C command processor of cpu and npu agents beyond test_agents.py (which runs on it too).

Directed malformed packets for the C decoder (bad kernel id, a buffer handle
of the wrong kind or generation, an argument block shorter than its counts,
shapes that do not fit), each failing that packet with ERROR while the agent
goes on; malformed ERT commands for the C command processor (bad header,
CU, payload count, chained command out of range) likewise, with the states
written back as the reference ErtProcessor (tests/agents/ert_reference.py, the processor
the Python npu agent ran) writes them; the C kernels against
the NumPy ones of hostless.kernels on random and edge shapes (1xN, Nx1,
1x1; heap buffers have no empty dimension), GEMM through the BLAS and, without one, through the Python kernel;
a native npu killed mid-packet gives OWNER_DIED and a respawned one serves.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

import hostless as hl
from ert_reference import ErtProcessor
from hostless import records
from hostless._abi import C
from hostless.agents.loop import ObjectCache
from hostless.kernels import f64, kernel_id
from test_agents import (  # noqa: F401  (env: the module's fixture)
    Env,
    env,
    run_kernel,
)

S = hl.Status


def test_the_agents_are_native(env: Env) -> None:
    """The default cpu and npu agents run the engine's C loop (and say so)."""
    assert env.cpu.native is True and env.npu.native is True
    assert env.cpu.spec.name == "cpu" and env.npu.spec.name == "npu"
    assert env.cpu.capabilities["native"] and env.cpu.capabilities["kind"] == "cpu"
    assert env.npu.capabilities["native"] and env.npu.capabilities["ert"] == "C"


def _raw(env: Env, **kw: Any) -> S:
    f = env.dom.fence(owner=env.cpu.id)
    try:
        env.cpu.queue.push(hl.Packet(signal=f.handle, **kw), timeout=5)
        return f.wait(10)
    finally:
        f.release()


def _block(env: Env, data: bytes) -> int:
    return env.buffer(np.frombuffer(data, np.uint8)).handle


def _ok(env: Env) -> None:
    x = env.buffer(np.array([-1.0, 2.0], np.float32))
    o = env.empty((2,), np.float32)
    assert run_kernel(env, env.cpu, kernel_id("relu"), [x.handle, o.handle]) is S.SUCCESS
    assert o.numpy().tolist() == [0.0, 2.0]


def test_malformed_packets_fail_alone(env: Env) -> None:
    x = env.buffer(np.ones((4, 4), np.float32))
    o = env.empty((4, 4), np.float32)
    relu = kernel_id("relu")
    fence = env.dom.fence()
    gone = env.dom.buffer(64)
    stale = gone.handle
    gone.release()
    kind_shift, kind_mask = 48, 0xFF << 48
    try:
        cases: dict[str, S] = {
            "bad kernel id": run_kernel(env, env.cpu, 4242, [x.handle, o.handle]),
            "huge kernel id": run_kernel(env, env.cpu, (1 << 32) - 1, [x.handle, o.handle]),
            "a fence as a buffer": run_kernel(env, env.cpu, relu, [fence.handle, o.handle]),
            "a queue as a buffer": run_kernel(env, env.cpu, relu, [x.handle, env.cpu.queue.handle]),
            "a stale buffer": run_kernel(env, env.cpu, relu, [stale, o.handle]),
            "a buffer of another generation": run_kernel(
                env, env.cpu, relu, [x.handle ^ (1 << 24), o.handle]
            ),
            "a buffer handle of a forged kind": run_kernel(
                env, env.cpu, relu, [(x.handle & ~kind_mask) | (9 << kind_shift), o.handle]
            ),
            "shape that does not fit": run_kernel(
                env, env.cpu, kernel_id("gemm"), [x.handle, env.empty((3, 4), np.float32).handle, o.handle]
            ),
            "conv2d kernel larger than the image": run_kernel(
                env, env.cpu, kernel_id("conv2d"), [env.empty((2, 2), np.float32).handle, x.handle, o.handle]
            ),
            "copy of another size": run_kernel(
                env, env.cpu, kernel_id("copy"), [x.handle, env.empty((3,), np.float32).handle]
            ),
            "too few buffers": run_kernel(env, env.cpu, relu, [x.handle]),
            "scale without its scalar": run_kernel(env, env.cpu, kernel_id("scale"), [x.handle, o.handle]),
            "normalize by zero": run_kernel(
                env, env.cpu, kernel_id("normalize"), [x.handle, o.handle], [f64(0.0), f64(0.0)]
            ),
            "block shorter than its buffers": _raw(
                env,
                kernel=relu,
                args=_block(env, struct.pack("<IHHHHI", int(C.KERNARG_MAGIC), 200, 0, 0, 0, 0)),
            ),
            "block shorter than its scalars": _raw(
                env,
                kernel=relu,
                args=_block(env, struct.pack("<IHHHHI", int(C.KERNARG_MAGIC), 0, 9, 0, 0, 0) + bytes(64)),
            ),
            "block shorter than its follow-ups": _raw(
                env,
                kernel=relu,
                args=_block(env, struct.pack("<IHHHHI", int(C.KERNARG_MAGIC), 0, 0, 3, 0, 0) + bytes(100)),
            ),
            "block shorter than its header": _raw(env, kernel=relu, args=_block(env, b"KRAK")),
            "block of the wrong kind": _raw(env, kernel=relu, args=fence.handle),
            "barrier waiting on a buffer": _raw(env, type=3, wait=(x.handle, 0)),
            "unknown packet type": _raw(env, type=77),
        }
        assert {k: v for k, v in cases.items() if v is not S.ERROR} == {}
        assert env.cpu.alive
        _ok(env)
    finally:
        fence.release()


def test_a_failure_in_c_is_recorded(env: Env) -> None:
    x = env.buffer(np.ones((4, 4), np.float32))
    f = env.dom.fence(owner=env.cpu.id)
    ka = hl.Kernargs(buffers=[x.handle, x.handle, env.empty((2, 2), np.float32).handle]).to_buffer(env.dom)
    try:
        env.cpu.queue.push(hl.Packet(kernel=kernel_id("gemm"), args=ka.handle, signal=f.handle), timeout=5)
        assert f.wait(10) is S.ERROR
        why = records.read(env.dom, f.handle)
        assert why is not None and "gemm" in why
    finally:
        f.release()
        ka.release()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_kernels_match_numpy_in_c_and_in_the_fallback(env: Env, dtype: Any) -> None:
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((5, 6)) * 4).astype(dtype)
    b = (rng.standard_normal((5, 6)) * 4).astype(dtype)
    ba, bb = env.buffer(a), env.buffer(b)
    out = env.empty((5, 6), dtype)
    assert run_kernel(env, env.cpu, kernel_id("add"), [ba.handle, bb.handle, out.handle]) is S.SUCCESS
    np.testing.assert_allclose(out.numpy(), a + b, rtol=1e-6)
    assert run_kernel(env, env.cpu, kernel_id("relu"), [ba.handle, out.handle]) is S.SUCCESS
    np.testing.assert_allclose(out.numpy(), np.maximum(a, 0))
    # broadcasting (a row onto a matrix) goes to NumPy's rules
    row = env.buffer(b[0].copy())
    assert run_kernel(env, env.cpu, kernel_id("add"), [ba.handle, row.handle, out.handle]) is S.SUCCESS
    np.testing.assert_allclose(out.numpy(), a + b[0], rtol=1e-6)
    if dtype is np.float32:
        w = env.buffer(b.T.copy())
        g = env.empty((5, 5), dtype)
        assert run_kernel(env, env.cpu, kernel_id("gemm"), [ba.handle, w.handle, g.handle]) is S.SUCCESS
        np.testing.assert_allclose(g.numpy(), a @ b.T, rtol=1e-4, atol=1e-4)
        s = env.empty((1,), dtype)
        assert run_kernel(env, env.cpu, kernel_id("sum"), [ba.handle, s.handle]) is S.SUCCESS
        np.testing.assert_allclose(s.numpy()[0], a.sum(), rtol=1e-4, atol=1e-4)
    _ok(env)


# --------------------------------------------------------------------------- C kernels vs NumPy


def _rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    if np.dtype(dtype) == np.int8:
        return rng.integers(-128, 128, shape).astype(np.int8)
    return (rng.standard_normal(shape) * 3).astype(dtype)


def _py_ref(name: str, ins: list[np.ndarray], out: np.ndarray, scalars: list[int]) -> np.ndarray:
    """hostless.kernels' own (NumPy) kernel on copies: the reference the C one must equal."""
    from hostless import kernels

    fn = {**{k: v[1] for k, v in kernels.CPU_KERNELS.items()}, "int8_gemm": kernels.k_int8_gemm}[name]
    ref = np.zeros_like(out)
    fn([a.copy() for a in ins] + [ref], scalars)
    return ref


# (kernel, input shapes, output shape, scalars); edge shapes 1xN, Nx1, 1x1 (a heap buffer has no
# empty dimension, so no empty shapes)
_SHAPES: list[tuple[str, list[tuple[int, ...]], tuple[int, ...], list[int]]] = [
    ("gemm", [(7, 5), (5, 3)], (7, 3), []),
    ("gemm", [(1, 9), (9, 4)], (1, 4), []),
    ("gemm", [(6, 1), (1, 8)], (6, 8), []),
    ("gemm", [(5, 4), (4, 1)], (5, 1), []),
    ("gemm", [(33, 65), (65, 17)], (33, 17), []),
    ("softmax", [(4, 7)], (4, 7), []),
    ("softmax", [(1, 9)], (1, 9), []),
    ("softmax", [(9, 1)], (9, 1), []),
    ("softmax", [(2, 3, 5)], (2, 3, 5), []),
    ("sum", [(6, 5)], (1,), []),
    ("sum", [(1, 1)], (1,), []),
    ("normalize", [(5, 6)], (5, 6), [f64(0.5), f64(2.0)]),
    ("normalize", [(1, 7)], (1, 7), [f64(-1.0)]),
    ("conv2d", [(8, 9), (3, 2)], (6, 8), []),
    ("conv2d", [(1, 9), (1, 3)], (1, 7), []),
    ("conv2d", [(9, 1), (4, 1)], (6, 1), []),
    ("conv2d", [(5, 5), (5, 5)], (1, 1), []),
    ("int8_gemm", [(7, 5), (5, 3)], (7, 3), []),
    ("int8_gemm", [(1, 64), (64, 1)], (1, 1), []),
]


def _run_c(env: Env, name: str, bufs: list[hl.Buffer], scalars: list[int]) -> S:
    from hostless import ert
    from hostless.kernels import cu_index

    if name == "int8_gemm":  # CU 0 of the npu, as an ERT command
        raw = ert.start_cu(cu_index(name), [len(bufs)] + ert.u64_args([b.handle for b in bufs])).encode()
        cb = env.dom.buffer(len(raw))
        cb.numpy()[:] = np.frombuffer(raw, np.uint8)
        env.owned.append(cb)
        ka = hl.Kernargs(buffers=[cb.handle]).to_buffer(env.dom)
        f = env.dom.fence(owner=env.npu.id)
        try:
            env.npu.queue.push(hl.Packet(type=hl.PacketType.ERT, args=ka.handle, signal=f.handle), timeout=5)
            return f.wait(10)
        finally:
            f.release()
            ka.release()
    return run_kernel(env, env.cpu, kernel_id(name), [b.handle for b in bufs], scalars)


@pytest.mark.parametrize("case", range(len(_SHAPES)), ids=lambda i: f"{_SHAPES[i][0]}-{_SHAPES[i][1]}")
def test_c_kernels_equal_the_numpy_kernels(env: Env, case: int) -> None:
    name, shapes, oshape, scalars = _SHAPES[case]
    rng = np.random.default_rng(100 + case)
    dt = np.int8 if name == "int8_gemm" else np.float32
    ins = [_rand(rng, sh, dt) for sh in shapes]
    out = env.empty(oshape, np.int32 if name == "int8_gemm" else np.float32)
    out.numpy()[...] = 7  # stale bytes: the kernel must write every element
    assert _run_c(env, name, [env.buffer(a) for a in ins] + [out], scalars) is S.SUCCESS
    ref = _py_ref(name, ins, out.numpy(), scalars)
    if name == "int8_gemm":
        np.testing.assert_array_equal(out.numpy(), ref)
    else:
        np.testing.assert_allclose(out.numpy(), ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("count", [1, 3, 4, 5, 8, 11, 4099])
def test_c_relu_equals_numpy_bit_for_bit_on_special_values_and_every_tail(env: Env, count: int) -> None:
    """The C relu tests float bits four lanes at a time, then the tail one by one: both
    parts must give NumPy's maximum(x, 0) exactly (NaNs kept with their sign, -0 and
    negatives to +0, infinities, subnormals) on random signs, where the old branching loop
    was 26x slower."""
    rng = np.random.default_rng(count)
    special = np.array(
        [np.nan, -np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, -3.4e38], np.float32
    )
    x = rng.standard_normal(count).astype(np.float32)
    where = rng.integers(0, count, size=min(count, 40))
    x[where] = special[rng.integers(0, len(special), size=len(where))]
    out = env.empty((count,), np.float32)
    out.numpy()[...] = 7  # stale bytes: every element must be written
    assert _run_c(env, "relu", [env.buffer(x), out], []) is S.SUCCESS
    ref = np.maximum(x, np.float32(0))
    np.testing.assert_array_equal(out.numpy().view(np.uint32), ref.view(np.uint32))


def test_c_kernels_on_random_shapes(env: Env) -> None:
    rng = np.random.default_rng(2026)
    for _ in range(12):
        m, k, n = (int(v) for v in rng.integers(1, 40, 3))
        for name, shapes, oshape in (
            ("gemm", [(m, k), (k, n)], (m, n)),
            ("int8_gemm", [(m, k), (k, n)], (m, n)),
            ("softmax", [(m, n)], (m, n)),
            ("conv2d", [(m + 2, n + 3), (3, 4)], (m, n)),
        ):
            dt = np.int8 if name == "int8_gemm" else np.float32
            ins = [_rand(rng, sh, dt) for sh in shapes]
            out = env.empty(oshape, np.int32 if name == "int8_gemm" else np.float32)
            assert _run_c(env, name, [env.buffer(a) for a in ins] + [out], []) is S.SUCCESS, name
            ref = _py_ref(name, ins, out.numpy(), [])
            np.testing.assert_allclose(out.numpy(), ref, rtol=2e-5, atol=2e-4, err_msg=f"{name} {shapes}")
        for o in env.owned:
            if o._held:
                o.release()
        env.owned.clear()


def test_gemm_goes_through_the_blas_when_there_is_one(env: Env) -> None:
    from hostless.agents import native

    caps = env.cpu.capabilities
    if native.blas_path() is None:
        assert caps["gemm"] == "python" and caps["why"]
    else:
        assert caps["gemm"] == "blas" and "sgemm" in caps["blas"], caps


def test_without_a_blas_gemm_runs_in_the_python_kernel(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    from hostless import agents

    monkeypatch.setenv("HOSTLESS_BLAS", "none")
    a = agents.spawn(env.dom, "cpu", native=True, label="no-blas")
    try:
        assert a.capabilities["gemm"] == "python", a.capabilities
        assert "Python" in a.capabilities["why"]
        rng = np.random.default_rng(5)
        x, w = _rand(rng, (9, 4), np.float32), _rand(rng, (4, 6), np.float32)
        out = env.empty((9, 6), np.float32)
        bufs = [env.buffer(x).handle, env.buffer(w).handle, out.handle]
        assert run_kernel(env, a, kernel_id("gemm"), bufs) is S.SUCCESS
        np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5, atol=1e-5)
    finally:
        a.stop()
    assert a.proc.returncode == 0


# --------------------------------------------------------------------------- ERT in C vs ErtProcessor


class _Reference:
    """The reference ERT processor run in this process on command buffers of the domain, as
    the Python npu agent ran an ERT packet: the command's status (SUCCESS, or ERROR for a
    command it refuses or whose kernel raises; a record exactly when it failed)."""

    def __init__(self, dom: hl.Domain) -> None:
        from hostless.kernels import NPU_CUS

        self.cache = ObjectCache(dom)
        self.proc = ErtProcessor(
            self.cache.bytes_view, self.cache.view, {cu: fn for cu, fn in NPU_CUS.values()}
        )

    def run(self, cb: hl.Buffer) -> S:
        try:
            self.proc.run(self.cache.bytes_view(cb.handle))
            return S.SUCCESS
        except Exception:
            return S.ERROR
        finally:
            self.cache.clear()


def _ert_cases(env: Env) -> list[bytes]:
    """Command buffers, good and malformed, whose every byte the processors write back."""
    from hostless import ert
    from hostless.kernels import cu_index

    x = env.buffer(np.arange(-8, 8, dtype=np.float32))
    o = env.empty((16,), np.float32)
    relu = cu_index("relu")
    good = ert.start_cu(relu, [2] + ert.u64_args([x.handle, o.handle])).encode()
    bad = ert.start_cu(cu_index("gemm"), [3] + ert.u64_args([x.handle, x.handle, o.handle])).encode()
    leaf_ok = env.buffer(np.frombuffer(good, np.uint8))
    leaf_bad = env.buffer(np.frombuffer(bad, np.uint8))
    inner = env.buffer(np.frombuffer(ert.cmd_chain([leaf_ok.handle]).encode(), np.uint8))
    hdr = ert.header(ert.State.NEW, 5, ert.Opcode.START_CU).to_bytes(4, "little")
    return [
        good,
        ert.start_npu(relu, 0x1234_5678_9ABC, 64, [2] + ert.u64_args([x.handle, o.handle])).encode(),
        bad,
        hdr + (1 << relu).to_bytes(4, "little"),  # count past the buffer
        hdr[:3],  # shorter than a header
        ert.start_cu(31, [0]).encode(),  # no such CU
        ert.ErtCommand(ert.State.NEW, ert.Opcode.START_CU, ert.CmdType.CU, 0b110, [0]).encode(),
        ert.start_cu(relu, [0xFFFFFFFF, 1, 2]).encode(),  # buffer count past the payload
        ert.start_cu(relu, [2, 1, 2, 3, 4, 5]).encode(),  # odd scalar words
        ert.ErtCommand(ert.State.NEW, ert.Opcode.START_NPU, ert.CmdType.CU, 1 << relu, [1, 2]).encode(),
        ert.start_cu(relu, []).encode(),  # no arguments
        ert.cmd_chain([leaf_ok.handle, leaf_ok.handle]).encode(),
        ert.cmd_chain([leaf_ok.handle, leaf_bad.handle, leaf_ok.handle]).encode(),  # fails at 1
        ert.cmd_chain([leaf_ok.handle, inner.handle]).encode(),  # a chain of a chain
        ert.cmd_chain([leaf_ok.handle, (1 << 62) | 12345]).encode(),  # a missing command
        ert.ErtCommand(
            ert.State.NEW, ert.Opcode.CMD_CHAIN, ert.CmdType.CU, 0, [9, 0, 0, 0, 0, 0, 1]
        ).encode(),
        ert.ErtCommand(ert.State.NEW, ert.Opcode.CMD_CHAIN, ert.CmdType.CU, 0, [1, 0]).encode(),
        ert.ErtCommand(ert.State.NEW, ert.Opcode.CONFIGURE, ert.CmdType.CU, 1, [0]).encode(),
    ]


def test_ert_in_c_writes_back_what_the_python_processor_writes(env: Env) -> None:
    """The same command buffers through the reference processor and the npu agent's C one:
    the same status (a failure record exactly when it failed), the same bytes written back
    (state, chain submit / error index), and the agent goes on."""
    ref = _Reference(env.dom)
    for i, raw in enumerate(_ert_cases(env)):
        got = {}
        for who in ("py", "c"):
            cb = env.dom.buffer(max(len(raw), 1))
            cb.numpy()[: len(raw)] = np.frombuffer(raw, np.uint8)
            env.owned.append(cb)
            if who == "py":
                st = ref.run(cb)
                got[who] = (st, bytes(cb.numpy()[: len(raw)]), st is S.SUCCESS)
                continue
            ka = hl.Kernargs(buffers=[cb.handle]).to_buffer(env.dom)
            f = env.dom.fence(owner=env.npu.id)
            try:
                pkt = hl.Packet(type=hl.PacketType.ERT, args=ka.handle, signal=f.handle)
                env.npu.queue.push(pkt, timeout=5)
                st = f.wait(10)
                why = records.read(env.dom, f.handle)
            finally:
                f.release()
                ka.release()
            got[who] = (st, bytes(cb.numpy()[: len(raw)]), why is None)
        assert got["py"] == got["c"], f"case {i}: reference {got['py']} != C {got['c']}"
    assert env.npu.alive


def test_native_npu_killed_mid_packet_then_respawned(env: Env) -> None:
    """SIGKILL a native npu while it runs a long C kernel: the packet's fence gets
    OWNER_DIED within the recovery bound; a native npu respawned on its queue serves."""
    import time

    from hostless import agents, ert
    from hostless.kernels import cu_index

    victim = agents.spawn(env.dom, "npu", label="npu-victim")
    respawned = None
    try:
        n = 1024  # int8_gemm 1024^3: ~1 s in the C loop
        a = env.buffer(np.ones((n, n), np.int8))
        out = env.empty((n, n), np.int32)
        raw = ert.start_cu(
            cu_index("int8_gemm"), [3] + ert.u64_args([a.handle, a.handle, out.handle])
        ).encode()
        cb = env.buffer(np.frombuffer(raw, np.uint8))
        ka = hl.Kernargs(buffers=[cb.handle]).to_buffer(env.dom)
        env.owned.append(ka)
        f = env.dom.fence(owner=victim.id)
        started = env.dom.fence()
        victim.queue.push(hl.Packet(type=hl.PacketType.ERT, args=ka.handle, signal=f.handle), timeout=5)
        deadline = time.monotonic() + 10
        while int(cb.numpy().view("<u4")[0]) & 0xF != ert.State.RUNNING and time.monotonic() < deadline:
            time.sleep(0.001)
        assert int(cb.numpy().view("<u4")[0]) & 0xF == ert.State.RUNNING, "the command never started"
        victim.kill()
        t0 = time.monotonic()
        assert f.wait(10) is S.OWNER_DIED
        assert time.monotonic() - t0 < 5
        f.release()
        started.release()
        respawned = agents.spawn(env.dom, "npu", queue=victim.queue, label="npu-respawned")
        assert respawned.native is True and respawned.capabilities["ert"] == "C"
        x = env.buffer(np.array([-1.0, 3.0], np.float32))
        o = env.empty((2,), np.float32)
        raw = ert.start_cu(cu_index("relu"), [2] + ert.u64_args([x.handle, o.handle])).encode()
        cb2 = env.buffer(np.frombuffer(raw, np.uint8))
        ka2 = hl.Kernargs(buffers=[cb2.handle]).to_buffer(env.dom)
        env.owned.append(ka2)
        f2 = env.dom.fence(owner=respawned.id)
        respawned.queue.push(hl.Packet(type=hl.PacketType.ERT, args=ka2.handle, signal=f2.handle), timeout=5)
        assert f2.wait(10) is S.SUCCESS
        f2.release()
        assert o.numpy().tolist() == [0.0, 3.0]
    finally:
        victim.kill()
        if respawned is not None:
            respawned.stop()


def test_spawn_options_of_native_agents(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    from hostless import agents

    with pytest.raises(ValueError, match="native agents serve cpu and npu"):
        agents.spawn(env.dom, "cuda", native=True)
    with pytest.raises(ValueError, match="idle_poll"):
        agents.spawn(env.dom, "npu", native=True, idle_poll=-1.0)
    # a BLAS path that cannot be loaded: GEMM in Python, and the agent says why
    monkeypatch.setenv("HOSTLESS_BLAS", "/nonexistent/libnoblas.so")
    a = agents.spawn(env.dom, "npu", native=True, fixed_spin=True, idle_poll=0.0, label="bad-blas")
    try:
        assert a.capabilities["gemm"] == "python"
        assert "cannot load /nonexistent/libnoblas.so" in a.capabilities["why"]
        assert "--fixed-spin" in a.proc.args
        rng = np.random.default_rng(9)
        x, w = _rand(rng, (3, 5), np.float32), _rand(rng, (5, 2), np.float32)
        out = env.empty((3, 2), np.float32)
        # KERNEL packet id 1 on an npu is CU 1 (gemm), as the Python npu agent reads it
        assert run_kernel(env, a, 1, [env.buffer(x).handle, env.buffer(w).handle, out.handle]) is S.SUCCESS
        np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5, atol=1e-5)
    finally:
        a.stop()
    assert a.proc.returncode == 0


def test_random_ert_commands_match_the_python_processor(env: Env) -> None:
    """Mutated commands (random header fields, counts, masks, words, truncations; chains of
    them) through the reference processor and the C one: the same status and the same bytes
    written back."""
    from hostless import ert
    from hostless.kernels import cu_index

    rng = np.random.default_rng(77)
    x = env.buffer(np.linspace(-2, 2, 12, dtype=np.float32))
    o = env.empty((12,), np.float32)
    i8 = env.buffer(np.ones((3, 4), np.int8))
    o32 = env.empty((3, 3), np.int32)
    hs = [x.handle, o.handle, i8.handle, o32.handle, env.dom.fence().handle, 0, (1 << 62) | 7]
    seeds = [
        ert.start_cu(cu_index("relu"), [2] + ert.u64_args([x.handle, o.handle])).encode(),
        ert.start_npu(cu_index("copy"), 1 << 40, 8, [2] + ert.u64_args([x.handle, o.handle])).encode(),
        ert.start_cu(cu_index("int8_gemm"), [3] + ert.u64_args([i8.handle, i8.handle, o32.handle])).encode(),
    ]
    leaves = [env.buffer(np.frombuffer(s, np.uint8)) for s in seeds]
    seeds.append(ert.cmd_chain([lf.handle for lf in leaves]).encode())

    def mutate(raw: bytes) -> bytes:
        w = bytearray(raw)
        for _ in range(int(rng.integers(1, 4))):
            what = int(rng.integers(0, 6))
            if what == 0 and len(w) > 4:  # truncate
                w = w[: int(rng.integers(0, len(w)))]
            elif what == 1 and len(w) >= 4:  # header field
                hdr = int.from_bytes(w[:4], "little") ^ (1 << int(rng.integers(0, 32)))
                w[:4] = hdr.to_bytes(4, "little")
            elif what == 2 and len(w) >= 8:  # a word
                k = int(rng.integers(1, len(w) // 4))
                val = int(rng.choice([0, 1, 2, 0xFFFFFFFF, int(rng.integers(0, 1 << 32))]))
                w[4 * k : 4 * k + 4] = val.to_bytes(4, "little")
            elif what == 3 and len(w) >= 12:  # a handle
                k = int(rng.integers(1, len(w) // 4 - 1))
                w[4 * k : 4 * k + 8] = int(rng.choice(hs)).to_bytes(8, "little")
            elif what == 4:  # extra words
                w += bytes(4 * int(rng.integers(1, 4)))
            elif len(w) >= 8:  # cu_mask
                w[4:8] = int(rng.choice([0, 1, 3, 1 << 31, 1 << 6, 1 << 2])).to_bytes(4, "little")
        return bytes(w)

    ref = _Reference(env.dom)
    seen: dict[S, int] = {}
    for i in range(150):
        raw = mutate(seeds[i % len(seeds)])
        got = {}
        for who in ("py", "c"):
            o.numpy()[...] = 0
            o32.numpy()[...] = 0
            cb = env.dom.buffer(max(len(raw), 1))
            cb.numpy()[: len(raw)] = np.frombuffer(raw, np.uint8)
            if who == "py":
                st = ref.run(cb)
                got[who] = (st, bytes(cb.numpy()[: len(raw)]), o.numpy().tobytes(), o32.numpy().tobytes())
                cb.release()
                continue
            ka = hl.Kernargs(buffers=[cb.handle]).to_buffer(env.dom)
            f = env.dom.fence(owner=env.npu.id)
            try:
                pkt = hl.Packet(type=hl.PacketType.ERT, args=ka.handle, signal=f.handle)
                env.npu.queue.push(pkt, timeout=5)
                st = f.wait(10)
                got[who] = (st, bytes(cb.numpy()[: len(raw)]), o.numpy().tobytes(), o32.numpy().tobytes())
            finally:
                f.release()
                ka.release()
                cb.release()
        assert got["py"] == got["c"], (
            f"command {i} {raw.hex()}: reference {got['py'][:2]} != C {got['c'][:2]}"
        )
        seen[got["c"][0]] = seen.get(got["c"][0], 0) + 1
    assert env.npu.alive
    assert seen.get(S.SUCCESS, 0) >= 5 and seen.get(S.ERROR, 0) >= 5, seen  # both kinds exercised


def test_the_default_tables_of_a_c_program_match_the_registries() -> None:
    """What hle_agent_run loads for a caller that leaves the table empty (hostless-agent):
    the npu's xclbin is NPU_CUS, the cpu's ids are CPU_KERNELS' (the same C kernels)."""
    from hostless import _core, kernels
    from hostless.agents import native

    present, cmap = _core.agent_table(int(C.AGENT_NPU))
    assert present == sum(1 << cu for cu, _fn in kernels.NPU_CUS.values())
    for cu, fn in kernels.NPU_CUS.values():
        assert cmap[cu] == native._C_KERNELS[fn], cu
    everything = sum(1 << kid for kid, _fn in kernels.CPU_KERNELS.values())
    present, cmap = _core.agent_table(int(C.AGENT_CPU), everything)
    assert present == everything
    for kid, fn in kernels.CPU_KERNELS.values():
        assert cmap[kid] == native._C_KERNELS[fn] == kid
