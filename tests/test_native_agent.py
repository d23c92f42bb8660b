# ruff: noqa: F811  (the fixtures imported from the module whose tests run here are used by name)
"""The native (C) agents beyond test_agents.py (which runs every test against them too).

Directed malformed packets for the C decoder (bad kernel id, a buffer handle
of the wrong kind or generation, an argument block shorter than its counts,
shapes that do not fit), each failing that packet with ERROR while the agent
goes on; malformed ERT commands for the C command processor (bad header,
CU, payload count, chained command out of range) likewise, with the states
written back as the Python ErtProcessor writes them; the C kernels against
the NumPy ones of hostless.kernels on random and edge shapes (1xN, Nx1,
empty), GEMM through the BLAS and, without one, through the Python kernel;
a native npu killed mid-packet gives OWNER_DIED and a respawned one serves.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import hostless as hl
from _native_spawn import native_agents
from hostless import records
from hostless._abi import C
from hostless.kernels import f64, kernel_id
from test_agents import (  # noqa: F401  (env: the module's fixture, with native agents)
    Env,
    env,
    run_kernel,
)

S = hl.Status


@pytest.fixture(scope="module")
def native() -> Iterator[bool]:
    """Only native agents in this module (test_agents' env takes it)."""
    yield from native_agents()


def test_the_agents_are_native(env: Env) -> None:
    assert "--native" in env.cpu.proc.args
    assert "--native" in env.npu.proc.args
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
