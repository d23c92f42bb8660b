"""The order of packets in the agents' FIFO queues in direct dispatch (issue 24's known
direct+copy deadlock): a packet that waits on another predecessor must never sit in a queue
ahead of a packet it needs.  The README's case (``b`` on cpu2, ``a`` on cpu1, ``d = add(b,
a)`` on cpu2) timed out in direct+copy: ``a`` pushed ``d`` onto cpu2 while ``b`` still ran
there, and ``b``'s copy packets, pushed behind ``d``, signal what ``d`` waits for.

Then a property test: random small DAGs and placements over two cpu agents and an npu, in
the four modes, each frame's outputs equal to NumPy's and no frame past a bound."""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

import hostless as hl
from hostless import agents
from hostless.dag import Dag, deadlocks
from hostless.graph import Graph

MODES = [(d, m) for d in ("host", "direct") for m in ("shared", "copy")]
SHAPE = (4, 4)
X = (np.arange(16, dtype=np.float32).reshape(SHAPE) - 6.0) / 4.0
BOUND = 20.0  # seconds a frame may take here (a hang ends at the agents' wait_timeout, 8 s)


def late_scale(x: np.ndarray, factor: float) -> np.ndarray:
    """``x * factor``, late: the stage still runs when the others' packets arrive."""
    time.sleep(0.05)
    return x * factor


@dataclass
class Env:
    dom: hl.Domain
    cpu1: agents.Agent
    cpu2: agents.Agent
    npu: agents.Agent
    cpu3: agents.Agent


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    name = f"hltest-order-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with hl.Domain.create(name, heap="64M", label="host", unlink_on_close=True) as d:
        spawned = [agents.spawn(d, "cpu", label=f"cpu{i}", wait_timeout=8.0) for i in (1, 2)]
        spawned.append(agents.spawn(d, "npu", label="npu", wait_timeout=8.0))
        spawned.append(agents.spawn(d, "cpu", label="cpu3", wait_timeout=8.0))
        try:
            yield Env(d, *spawned)
            for a in spawned:
                a.stop()
        finally:
            for a in spawned:
                a.kill()


@pytest.mark.parametrize("e_on", ["cpu1", "cpu2"])
@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_readme_case_b_cpu2_a_cpu1_d_add_on_cpu2(env: Env, e_on: str, dispatch: str, data: str) -> None:
    """Stages in this order and placement: b (cpu2, late), a (cpu1), d = add(b, a) (cpu2),
    e(a).  Fails on the old plan in direct+copy (the frame times out)."""
    g = (
        Graph(env.dom)
        .input("x", SHAPE, "f4")
        .stage("b", env.cpu2, late_scale, ["x"], ("yb", SHAPE, "f4"), scalars=[3.0])
        .stage("a", env.cpu1, "scale", ["x"], ("ya", SHAPE, "f4"), scalars=[2.0])
        .stage("d", env.cpu2, "add", ["yb", "ya"], ("yd", SHAPE, "f4"))
        .stage("e", getattr(env, e_on), "relu", ["ya"], ("ye", SHAPE, "f4"))
    )
    with g.compile(dispatch=dispatch, data=data) as cg:
        for k in range(3):
            x = X + k
            out = cg.run({"x": x}, timeout=BOUND)
            np.testing.assert_allclose(out["yd"], 3.0 * x + 2.0 * x, rtol=1e-6)
            np.testing.assert_allclose(out["ye"], np.maximum(2.0 * x, 0), rtol=1e-6)


def test_the_plan_queues_nothing_ahead_of_what_it_waits_for() -> None:
    """The plans of the README case and of the race the property test found first."""
    outs, ins = ["yb", "ya", "yd", "ye"], [["x"], ["x"], ["yb", "ya"], ["ya"]]
    # copy mode: d is pushed by b (on d's own agent) and waits on a (cpu1); the old plan had a
    # (the last predecessor) push d onto cpu2, ahead of b's copies
    dag = Dag.build(outs, ins, agents=[2, 1, 2, 1], copies=True)
    assert (dag.pusher(2), dag.others(2), dag.relayed, dag.stuck) == (0, (1,), frozenset(), False)
    assert deadlocks(dag.preds, [None, None, 1, 1], set(), [0, 1], [2, 1, 2, 1], True) is True  # the old plan
    # shared mode: a pushes d (b signals by itself), the host pushes b before a
    dag = Dag.build(outs, ins, agents=[2, 1, 2, 1])
    assert (dag.pusher(2), dag.roots, dag.stuck) == (1, [0, 1], False)
    assert Dag.build(outs[:3], ins[:3]).pusher(2) == 1  # no placement: the last predecessor
    # s0, s1 on cpu1; s2 = f(s0) on the npu; s5 = add(s2, s1) on cpu1: s2 pushed s5 onto cpu1
    # before the host pushed s1 there (a loaded host), or (copy mode) ahead of s1's copies;
    # the host now pushes s1 first
    outs, ins = ["s0", "s1", "s2", "s5"], [["x"], ["x"], ["s0"], ["s2", "s1"]]
    agents_ = ["cpu1", "cpu1", "npu", "cpu1"]
    for copies in (False, True):
        dag = Dag.build(outs, ins, agents=agents_, copies=copies)
        assert (dag.pusher(3), dag.roots, dag.stuck) == (2, [1, 0], False)
        assert deadlocks(dag.preds, [None, None, 0, 2], set(), [0, 1], agents_, copies) is True
    # the last predecessor stays the pusher where it is safe (the diamond: c pushes d, d waits on b)
    diamond = Dag.build(["a", "b", "c", "d"], [["x"], ["a"], ["a"], ["b", "c"]], agents=[1, 3, 2, 1])
    assert (diamond.pusher(3), diamond.others(3), diamond.relayed) == (2, (1,), frozenset())


@pytest.mark.parametrize("data", ["shared", "copy"])
def test_a_relayed_join_runs(env: Env, data: str) -> None:
    """s5 = add(s2, s3) on cpu1: no predecessor can push it with s5 itself waiting (shared
    mode: the other predecessor's work may queue behind it), so its wait goes into a relay on
    its pusher's agent and s5's packet waits on nothing (dag.relayed); the frames match NumPy."""
    a = {"cpu1": env.cpu1, "cpu2": env.cpu2, "cpu3": env.cpu3}
    place = ["cpu3", "cpu1", "cpu2", "cpu1", "cpu3", "cpu1"]
    g = Graph(env.dom).input("x", SHAPE, "f4")
    g.stage("s0", a[place[0]], "scale", ["x"], ("s0", SHAPE, "f4"), scalars=[2.0])
    g.stage("s1", a[place[1]], late_scale, ["s0"], ("s1", SHAPE, "f4"), scalars=[0.5])
    g.stage("s2", a[place[2]], "add", ["s0", "s1"], ("s2", SHAPE, "f4"))
    g.stage("s3", a[place[3]], "scale", ["x"], ("s3", SHAPE, "f4"), scalars=[-1.0])
    g.stage("s4", a[place[4]], "add", ["s2", "s3"], ("s4", SHAPE, "f4"))
    g.stage("s5", a[place[5]], "add", ["s2", "s3"], ("s5", SHAPE, "f4"))
    with g.compile(dispatch="direct", data=data) as cg:
        assert cg.dag.stuck is False
        if data == "shared":
            assert cg.dag.relayed == frozenset({5}) and cg.dag.relay_groups(5) == 1
        for k in range(3):
            x = X + k
            out = cg.run({"x": x}, timeout=BOUND)
            s2 = 2.0 * x + x  # s0 + s1
            np.testing.assert_allclose(out["s4"], s2 - x, rtol=1e-6)
            np.testing.assert_allclose(out["s5"], s2 - x, rtol=1e-6)


def test_explored_plans_of_random_dags_never_deadlock_the_old_ones_did() -> None:
    """Every interleaving of one frame (deadlocks()) of the plans of 300 random DAGs of the
    property test's kind, both data modes: none can hang; the old plans (the last predecessor
    pushes, roots ascending) of the same DAGs could, in both modes."""
    old = {False: 0, True: 0}
    for seed in range(300):
        stages = random_graph(random.Random(seed))
        outs, ins, ags = [s.name for s in stages], [list(s.inputs) for s in stages], [s.agent for s in stages]
        for copies in (False, True):
            dag = Dag.build(outs, ins, ags, copies=copies)
            assert dag.stuck is False, (seed, copies, stages)
            last = Dag.build(outs, ins)
            pushers = [last.pusher(k) for k in range(len(stages))]
            old[copies] += deadlocks(last.preds, pushers, set(), last.roots, ags, copies) is True
    assert old[False] > 0 and old[True] > 0, old


# ---------------------------------------------------------------- the property test
@dataclass(frozen=True)
class RandomStage:
    name: str
    agent: str  # "cpu1", "cpu2", "npu"
    kernel: str  # "scale", "late", "relu", "add", "sum3"
    inputs: tuple[str, ...]
    factor: float


def sum3(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return a + 2.0 * b + 3.0 * c


def random_graph(rng: random.Random) -> list[RandomStage]:
    """2..6 stages; each consumes 1..3 of the graph input and earlier outputs."""
    stages: list[RandomStage] = []
    for k in range(rng.randint(2, 6)):
        names = ["x"] + [s.name for s in stages]
        n_in = rng.choice([1, 1, 2, 2, 3]) if len(names) >= 2 else 1
        n_in = min(n_in, len(names))
        inputs = tuple(rng.sample(names, n_in))
        if n_in == 1:
            kernel = rng.choice(["scale", "late", "relu", "relu"])
        else:
            kernel = "add" if n_in == 2 else "sum3"
        agent = "npu" if kernel == "relu" and rng.random() < 0.5 else rng.choice(["cpu1", "cpu2"])
        stages.append(RandomStage(f"s{k}", agent, kernel, inputs, float(rng.choice([0.5, 2.0, -1.0]))))
    return stages


def reference(stages: list[RandomStage], x: np.ndarray) -> dict[str, np.ndarray]:
    vals: dict[str, np.ndarray] = {"x": x}
    for s in stages:
        ins = [vals[i] for i in s.inputs]
        if s.kernel in ("scale", "late"):
            y = ins[0] * s.factor
        elif s.kernel == "relu":
            y = np.maximum(ins[0], 0)
        elif s.kernel == "add":
            y = ins[0] + ins[1]
        else:
            y = sum3(*ins)
        vals[s.name] = y.astype(np.float32)
    return vals


def build(env: Env, stages: list[RandomStage]) -> Graph:
    g = Graph(env.dom).input("x", SHAPE, "f4")
    for s in stages:
        agent = getattr(env, s.agent)
        out = (s.name, SHAPE, "f4")
        if s.kernel == "scale":
            g.stage(s.name, agent, "scale", list(s.inputs), out, scalars=[s.factor])
        elif s.kernel == "late":
            g.stage(s.name, agent, late_scale, list(s.inputs), out, scalars=[s.factor])
        elif s.kernel == "sum3":
            g.stage(s.name, agent, sum3, list(s.inputs), out)
        else:
            g.stage(s.name, agent, s.kernel, list(s.inputs), out)
    return g


@pytest.mark.parametrize("seed", range(12))
def test_random_dags_in_four_modes_match_numpy_and_never_hang(env: Env, seed: int) -> None:
    rng = random.Random(1000 + seed)
    for _ in range(2):
        stages = random_graph(rng)
        g = build(env, stages)
        for dispatch, data in MODES:
            with g.compile(dispatch=dispatch, data=data, inflight=2) as cg:
                if dispatch == "direct":
                    assert cg.dag.stuck is False
                for k in range(2):
                    x = X * (k + 1) - k
                    t0 = time.monotonic()
                    out = cg.run({"x": x}, timeout=BOUND)
                    assert time.monotonic() - t0 < BOUND
                    ref = reference(stages, x)
                    for name, y in out.items():
                        np.testing.assert_allclose(
                            y, ref[name], rtol=1e-5, atol=1e-5, err_msg=f"{dispatch}+{data} {stages}"
                        )
                frames = [{"x": X + i} for i in range(3)]  # two frames in flight
                for f, o in zip(frames, cg.stream(frames, timeout=BOUND), strict=True):
                    ref = reference(stages, f["x"])
                    for name, y in o.items():
                        np.testing.assert_allclose(y, ref[name], rtol=1e-5, atol=1e-5)


def test_plan_warns_where_no_safe_push_order_was_found(env: Env) -> None:
    """s4 on cpu1 joins s1 (on cpu1, pushed from the npu) and s3 (on cpu1, pushed from cpu2):
    whichever pushes s4, the other one's packet can reach cpu1 behind it, in both data modes,
    and no relay helps (its pusher's agent is cpu1 too).  Its plan() says so and what to do;
    host dispatch runs it."""
    g = (
        Graph(env.dom)
        .input("x", SHAPE, "f4")
        .stage("s0", env.npu, "relu", ["x"], ("s0", SHAPE, "f4"))
        .stage("s1", env.cpu1, "add", ["x", "s0"], ("s1", SHAPE, "f4"))
        .stage("s2", env.cpu2, "scale", ["x"], ("s2", SHAPE, "f4"), scalars=[2.0])
        .stage("s3", env.cpu1, "scale", ["s2"], ("s3", SHAPE, "f4"), scalars=[2.0])
        .stage("s4", env.cpu1, "add", ["s1", "s3"], ("s4", SHAPE, "f4"))
    )
    for data in ("shared", "copy"):
        with g.compile(dispatch="direct", data=data) as cg:
            assert cg.dag.stuck is True and cg.dag.unsafe == (4,)
            plan = cg.plan()
            assert "warning: no push order found for s4" in plan and "dispatch='host'" in plan
        with g.compile(dispatch="host", data=data) as cg:
            assert "warning" not in cg.plan()
            out = cg.run({"x": X}, timeout=BOUND)
            np.testing.assert_allclose(out["s4"], X + np.maximum(X, 0) + 4.0 * X, rtol=1e-6)
