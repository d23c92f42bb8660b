"""Graphs as DAGs (hostless.dag): fan-out, fan-in (more inputs than a packet's
two waits), concurrent branches on different agents, failures in a branch
and streaming, in the four modes, checked against NumPy."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest

import hostless as hl
from hostless import agents
from hostless.dag import Dag
from hostless.graph import Graph, StageFailed
from hostless.status import Status

MODES = [(d, m) for d in ("host", "direct") for m in ("shared", "copy")]
X = (np.arange(64, dtype=np.float32).reshape(8, 8) - 30.0) / 8.0
W = (np.arange(64, dtype=np.float32).reshape(8, 8) % 7 - 3.0) / 4.0


# ---- stage functions (module level: the agents import them by name)
def slow_twice(x: np.ndarray) -> np.ndarray:
    time.sleep(0.2)
    return x * 2.0


def rendezvous_twice(x: np.ndarray, tag: float) -> np.ndarray:
    """Meets the other branch's call: arrives (appends a line to a file named by ``tag``), then
    waits until the other branch of the same frame arrived too; raises after 30 s alone, which
    only a serial run of the two branches causes (no timing assert: a meeting is observable)."""
    path = f"/tmp/hl-rendezvous-{int(tag)}"
    with open(path, "a") as f:
        f.write("x\n")
    with open(path) as f:
        mine = len(f.readlines())
    need = 2 * ((mine + 1) // 2)
    deadline = time.monotonic() + 30.0
    while True:
        with open(path) as f:
            if len(f.readlines()) >= need:
                return x * 2.0
        if time.monotonic() > deadline:
            raise RuntimeError("the other branch never ran alongside this one")
        time.sleep(0.001)


def late_scale(x: np.ndarray, factor: float) -> np.ndarray:
    time.sleep(0.03)  # late, so that a join that did not wait for it would read a stale value
    return x * factor


def sum3(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return a + 10.0 * b + 100.0 * c


def sum5(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, e: np.ndarray) -> np.ndarray:
    return a + 2.0 * b + 3.0 * c + 4.0 * d + 5.0 * e


def boom(x: np.ndarray) -> np.ndarray:
    raise ValueError("branch broke")


@dataclass
class Env:
    dom: hl.Domain
    cpu1: agents.Agent
    cpu2: agents.Agent
    npu: agents.Agent


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    name = f"hltest-dag-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with hl.Domain.create(name, heap="64M", label="host", unlink_on_close=True) as d:
        spawned = [agents.spawn(d, "cpu", label=f"cpu{i}") for i in (1, 2)]
        spawned.append(agents.spawn(d, "npu", label="npu"))
        try:
            yield Env(d, *spawned)
            for a in spawned:
                a.stop()
        finally:
            for a in spawned:
                a.kill()


def diamond(env: Env) -> Graph:
    """a = 2x (cpu1); b = relu(a) (npu); c = a @ W (cpu2); d = b + c (cpu1)."""
    return (
        Graph(env.dom)
        .input("x", (8, 8), "f4")
        .constant("W", W)
        .stage("a", env.cpu1, "scale", ["x"], ("ya", (8, 8), "f4"), scalars=[2.0])
        .stage("b", env.npu, "relu", ["ya"], ("yb", (8, 8), "f4"))
        .stage("c", env.cpu2, "gemm", ["ya", "W"], ("yc", (8, 8), "f4"))
        .stage("d", env.cpu1, "add", ["yb", "yc"], ("yd", (8, 8), "f4"))
    )


def diamond_ref(x: np.ndarray) -> np.ndarray:
    a = x * 2.0
    return np.maximum(a, 0) + a @ W


def test_dag_structure() -> None:
    dag = Dag.build(["a", "b", "c", "d"], [["x"], ["a"], ["a", "W"], ["b", "c"]])
    assert dag.preds == ((), (0,), (0,), (1, 2))
    assert dag.succs == ((1, 2), (3,), (3,), ())
    assert (dag.roots, dag.sinks, dag.pusher(3), dag.others(3)) == ([0], [3], 2, (1,))
    assert dag.ancestors[3] == {0, 1, 2}


@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_diamond_in_four_modes(env: Env, dispatch: str, data: str) -> None:
    with diamond(env).compile(dispatch=dispatch, data=data) as cg:
        assert cg.outputs == ["yd"]
        for k in range(3):
            out = cg.run({"x": X + k})
            assert list(out) == ["yd"]
            np.testing.assert_allclose(out["yd"], diamond_ref(X + k), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_fan_out_of_one_output_to_three_stages(env: Env, dispatch: str, data: str) -> None:
    g = (
        Graph(env.dom)
        .input("x", (8, 8), "f4")
        .stage("a", env.cpu1, "scale", ["x"], ("ya", (8, 8), "f4"), scalars=[1.5])
        .stage("relu", env.npu, "relu", ["ya"], ("r", (8, 8), "f4"))
        .stage("neg", env.cpu2, "scale", ["ya"], ("n", (8, 8), "f4"), scalars=[-1.0])
        .stage("soft", env.cpu1, "softmax", ["ya"], ("s", (8, 8), "f4"))
    )
    with g.compile(dispatch=dispatch, data=data) as cg:
        assert sorted(cg.outputs) == ["n", "r", "s"]
        for k in range(2):
            a = (X + k) * 1.5
            out = cg.run({"x": X + k})
            np.testing.assert_allclose(out["r"], np.maximum(a, 0), rtol=1e-6)
            np.testing.assert_allclose(out["n"], -a, rtol=1e-6)
            e = np.exp(a - a.max(axis=-1, keepdims=True))
            np.testing.assert_allclose(out["s"], e / e.sum(axis=-1, keepdims=True), rtol=1e-5)


def fan_in(env: Env, n: int, first: Callable[..., np.ndarray] = late_scale) -> Graph:
    """n branches p0..p{n-1} from x (p0 late, on cpu2), joined by sum{n} on cpu1."""
    g = Graph(env.dom).input("x", (8, 8), "f4")
    g.stage("p0", env.cpu2, first, ["x"], ("y0", (8, 8), "f4"), scalars=[1.0] if first is late_scale else [])
    for i in range(1, n):
        agent = env.npu if i % 2 else env.cpu1
        if agent is env.npu:
            g.stage(f"p{i}", agent, "relu", ["x"], (f"y{i}", (8, 8), "f4"))
        else:
            g.stage(f"p{i}", agent, "scale", ["x"], (f"y{i}", (8, 8), "f4"), scalars=[float(i)])
    fn = sum3 if n == 3 else sum5
    return g.stage("join", env.cpu1, fn, [f"y{i}" for i in range(n)], ("out", (8, 8), "f4"))


def fan_in_ref(x: np.ndarray, n: int) -> np.ndarray:
    ys = [x] + [np.maximum(x, 0) if i % 2 else x * float(i) for i in range(1, n)]
    if n == 3:
        return np.asarray(ys[0] + 10.0 * ys[1] + 100.0 * ys[2])
    return np.asarray(sum((i + 1.0) * y for i, y in enumerate(ys)))


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_fan_in_beyond_two_waits(env: Env, n: int, dispatch: str, data: str) -> None:
    # 3 inputs: the join waits on two timelines; 5: a relay packet waits on two more
    with fan_in(env, n).compile(dispatch=dispatch, data=data) as cg:
        for k in range(3):
            out = cg.run({"x": X * (k + 1)})["out"]
            np.testing.assert_allclose(out, fan_in_ref(X * (k + 1), n), rtol=1e-5, atol=1e-5)


def two_slow_branches(env: Env) -> Graph:
    return (
        Graph(env.dom)
        .input("x", (8, 8), "f4")
        .stage("a", env.cpu1, "relu", ["x"], ("ya", (8, 8), "f4"))
        .stage("b", env.cpu1, slow_twice, ["ya"], ("yb", (8, 8), "f4"))
        .stage("c", env.cpu2, slow_twice, ["ya"], ("yc", (8, 8), "f4"))
        .stage("d", env.cpu2, "add", ["yb", "yc"], ("yd", (8, 8), "f4"))
    )


@pytest.mark.parametrize("dispatch", ["direct", "host"])
def test_branches_on_two_agents_run_concurrently(env: Env, dispatch: str) -> None:
    # b and c each wait, inside their stage, until the other is running: a serial run fails
    tag = float(int.from_bytes(os.urandom(3), "little"))
    path = f"/tmp/hl-rendezvous-{int(tag)}"
    g = (
        Graph(env.dom)
        .input("x", (8, 8), "f4")
        .stage("a", env.cpu1, "relu", ["x"], ("ya", (8, 8), "f4"))
        .stage("b", env.cpu1, rendezvous_twice, ["ya"], ("yb", (8, 8), "f4"), scalars=[tag])
        .stage("c", env.cpu2, rendezvous_twice, ["ya"], ("yc", (8, 8), "f4"), scalars=[tag])
        .stage("d", env.cpu2, "add", ["yb", "yc"], ("yd", (8, 8), "f4"))
    )
    try:
        with g.compile(dispatch=dispatch, data="shared") as cg:
            for k in range(3):
                np.testing.assert_allclose(cg.run({"x": X + k})["yd"], 4.0 * np.maximum(X + k, 0))
    finally:
        if os.path.exists(path):
            os.unlink(path)


@pytest.mark.parametrize("failing", ["b", "c"])  # the waited-on branch, the join's pusher
@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_a_failing_branch_fails_the_join(env: Env, failing: str, dispatch: str, data: str) -> None:
    g = Graph(env.dom).input("x", (8, 8), "f4")
    g.stage("a", env.cpu1, "relu", ["x"], ("ya", (8, 8), "f4"))
    for name, agent in (("b", env.cpu1), ("c", env.cpu2)):
        if name == failing:
            g.stage(name, agent, boom, ["ya"], (f"y{name}", (8, 8), "f4"))
        else:
            g.stage(name, agent, "scale", ["ya"], (f"y{name}", (8, 8), "f4"), scalars=[2.0])
    g.stage("d", env.npu, "copy", ["yb"], ("yd", (8, 8), "f4"))  # a second sink on b
    g.stage("join", env.cpu2, "add", ["yb", "yc"], ("yj", (8, 8), "f4"))
    with g.compile(dispatch=dispatch, data=data) as cg:
        join = cg.timelines_of(cg.frame + 1)[4]  # the frame's (replaced once it failed, kept held)
        t0 = time.monotonic()
        with pytest.raises(StageFailed, match="branch broke") as ei:
            cg.run({"x": X}, timeout=10)
        assert (ei.value.stage, ei.value.status) == (failing, Status.ERROR)
        assert time.monotonic() - t0 < 5
        if dispatch == "direct":  # the failure reached the join's timeline too
            deadline = time.monotonic() + 5
            while join.failure is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert join.failure == Status.ERROR
    assert env.cpu1.alive and env.cpu2.alive and env.npu.alive


def test_a_failure_through_a_relay_fails_the_join(env: Env) -> None:
    with fan_in(env, 5, first=boom).compile(dispatch="direct", data="copy") as cg:
        with pytest.raises(StageFailed) as ei:
            cg.run({"x": X}, timeout=10)
        assert ei.value.stage == "p0"


@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_streaming_a_dag_with_frames_in_flight(env: Env, dispatch: str, data: str) -> None:
    frames = [{"x": X + k} for k in range(8)]
    with diamond(env).compile(dispatch=dispatch, data=data, inflight=3) as cg:
        outs = list(cg.stream(frames))
    assert len(outs) == len(frames)
    for f, o in zip(frames, outs, strict=True):
        np.testing.assert_allclose(o["yd"], diamond_ref(f["x"]), rtol=1e-5, atol=1e-5)
