"""Graphs that outlive a bad frame (issue 24): a frame whose stage fails raises
StageFailed naming the frame and the stage, and the next frame runs on the same
compiled graph, in the four modes, in DAGs (fan-out, fan-in, relays), with frames
in flight, after repeated failures; an agent that died or was replaced still
invalidates the graph (a respawn is not a bad frame).

On the code before the reset (hostless.renewal) every frame after a failed one
failed at once with the same error: every test here that runs a frame after a
failure fails there."""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import hostless as hl
from hostless import agents, lowlevel
from hostless.graph import Graph, GraphInvalidated, GraphResetFailed, StageFailed
from hostless.renewal import MAX_RETIRED
from hostless.status import Status

MODES = [(d, m) for d in ("host", "direct") for m in ("shared", "copy")]
BAD = -1000.0  # x[0, 0] of a frame that must fail
SLOW = -2000.0  # x[0, 1] of a frame whose first stage is slow (a straggler after a failure)


# ---- stage functions (module level: the agents import them by name)
def picky(x: np.ndarray) -> np.ndarray:
    """x + 1, and a failure for a frame marked bad (directly or doubled by lazy)."""
    if x[0, 0] <= BAD:
        raise ValueError(f"bad frame marked {x[0, 0]}")
    return x + 1.0


def lazy(x: np.ndarray) -> np.ndarray:
    """2x, slowly for a frame marked slow."""
    if x[0, 1] == SLOW:
        time.sleep(0.05)
    return x * 2.0


def sum5(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, e: np.ndarray) -> np.ndarray:
    return a + 2.0 * b + 3.0 * c + 4.0 * d + 5.0 * e


@dataclass
class Env:
    dom: hl.Domain
    cpu1: agents.Agent
    cpu2: agents.Agent
    npu: agents.Agent


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    name = f"hltest-badframe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with hl.Domain.create(name, heap="64M", label="host", unlink_on_close=True, device_heaps={}) as d:
        spawned = [agents.spawn(d, "cpu", label=f"cpu{i}") for i in (1, 2)]
        spawned.append(agents.spawn(d, "npu", label="npu"))
        try:
            yield Env(d, *spawned)
            for a in spawned:
                a.stop()
        finally:
            for a in spawned:
                a.kill()


def frame(k: int, bad: bool = False, slow: bool = False) -> dict[str, np.ndarray]:
    x = (np.arange(64, dtype=np.float32).reshape(8, 8) - 20.0) / 4.0 + k
    if bad:
        x[0, 0] = BAD
    if slow:
        x[0, 1] = SLOW
    return {"x": x}


def chain(env: Env) -> Graph:
    """a = 2x (cpu1, slow when marked); b = a + 1 (cpu2, fails when marked); c = relu(b) (npu)."""
    return (
        Graph(env.dom)
        .input("x", (8, 8), "f4")
        .stage("a", env.cpu1, lazy, ["x"], ("ya", (8, 8), "f4"))
        .stage("b", env.cpu2, picky, ["ya"], ("yb", (8, 8), "f4"))
        .stage("c", env.npu, "relu", ["yb"], ("yc", (8, 8), "f4"))
    )


def chain_ref(x: np.ndarray) -> np.ndarray:
    return np.maximum(x * 2.0 + 1.0, 0)


def diamond(env: Env) -> Graph:
    """Fan-out of ya to b (the failing branch, cpu2) and c (cpu1); fan-in d = b + c (cpu1);
    e = relu(ya) (npu): a second sink that does not depend on the failing stage."""
    return (
        Graph(env.dom)
        .input("x", (8, 8), "f4")
        .stage("a", env.cpu1, lazy, ["x"], ("ya", (8, 8), "f4"))
        .stage("b", env.cpu2, picky, ["ya"], ("yb", (8, 8), "f4"))
        .stage("c", env.cpu1, "scale", ["ya"], ("yc", (8, 8), "f4"), scalars=[3.0])
        .stage("d", env.cpu1, "add", ["yb", "yc"], ("yd", (8, 8), "f4"))
        .stage("e", env.npu, "relu", ["ya"], ("ye", (8, 8), "f4"))
    )


def diamond_ref(x: np.ndarray) -> dict[str, np.ndarray]:
    a = x * 2.0
    return {"yd": (a + 1.0) + 3.0 * a, "ye": np.maximum(a, 0)}


def fan_in(env: Env) -> Graph:
    """Five branches joined by one stage: in direct mode the join waits behind a relay;
    the failing branch p0 is the one the relay waits on."""
    g = Graph(env.dom).input("x", (8, 8), "f4")
    g.stage("p0", env.cpu2, picky, ["x"], ("y0", (8, 8), "f4"))
    for i in range(1, 5):
        if i % 2:
            g.stage(f"p{i}", env.npu, "relu", ["x"], (f"y{i}", (8, 8), "f4"))
        else:
            g.stage(f"p{i}", env.cpu1, "scale", ["x"], (f"y{i}", (8, 8), "f4"), scalars=[float(i)])
    return g.stage("join", env.cpu1, sum5, [f"y{i}" for i in range(5)], ("out", (8, 8), "f4"))


def fan_in_ref(x: np.ndarray) -> np.ndarray:
    ys = [x + 1.0] + [np.maximum(x, 0) if i % 2 else x * float(i) for i in range(1, 5)]
    return np.asarray(sum((i + 1.0) * y for i, y in enumerate(ys)))


def check_failure(e: StageFailed, stage: str, frame_no: int) -> None:
    assert not isinstance(e, GraphInvalidated)
    assert (e.stage, e.status, e.frame) == (stage, Status.ERROR, frame_no)
    assert str(e).startswith(f"frame {frame_no}: stage {stage!r} failed with ERROR")
    assert "bad frame marked" in str(e)


@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_the_frame_after_a_failed_one_runs(env: Env, dispatch: str, data: str) -> None:
    """Frame 4 fails in its middle stage; frames 5.. of the same compiled graph are right."""
    with chain(env).compile(dispatch=dispatch, data=data) as cg:
        for k in range(1, 12):
            if k == 4:
                with pytest.raises(StageFailed) as ei:
                    cg.run(frame(k, bad=True), timeout=10)
                check_failure(ei.value, "b", cg.frame)
                continue
            np.testing.assert_allclose(cg.run(frame(k), timeout=10)["yc"], chain_ref(frame(k)["x"]))


@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_a_dag_outlives_a_failed_branch(env: Env, dispatch: str, data: str) -> None:
    """The failing branch of a diamond (fan-out, fan-in, a sink that does not depend on
    it): the frame fails naming the branch, the frames after give both sinks right."""
    with diamond(env).compile(dispatch=dispatch, data=data) as cg:
        for k in range(8):
            if k in (2, 5):
                with pytest.raises(StageFailed) as ei:
                    cg.run(frame(k, bad=True), timeout=10)
                check_failure(ei.value, "b", cg.frame)
                continue
            out = cg.run(frame(k), timeout=10)
            for name, want in diamond_ref(frame(k)["x"]).items():
                np.testing.assert_allclose(out[name], want, rtol=1e-6)


@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_a_fan_in_through_relays_outlives_a_failed_input(env: Env, dispatch: str, data: str) -> None:
    with fan_in(env).compile(dispatch=dispatch, data=data) as cg:
        for k in range(6):
            if k == 1:
                with pytest.raises(StageFailed) as ei:
                    cg.run(frame(k, bad=True), timeout=10)
                check_failure(ei.value, "p0", cg.frame)
                continue
            out = cg.run(frame(k), timeout=10)["out"]
            np.testing.assert_allclose(out, fan_in_ref(frame(k)["x"]), rtol=1e-5)


@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_a_straggler_of_the_failed_frame_does_not_touch_the_next(env: Env, dispatch: str, data: str) -> None:
    """The failed frame's slow first stage of the independent sink e... is still running
    when the failure of b is raised (host dispatch: c and e launched; direct: e queued
    behind a): the next frames, pushed behind it, read none of its writes."""
    g = (
        Graph(env.dom)
        .input("x", (8, 8), "f4")
        .stage("b", env.cpu2, picky, ["x"], ("yb", (8, 8), "f4"))
        .stage("a", env.cpu1, lazy, ["x"], ("ya", (8, 8), "f4"))
        .stage("d", env.cpu1, "add", ["yb", "ya"], ("yd", (8, 8), "f4"))
        .stage("e", env.cpu1, "relu", ["ya"], ("ye", (8, 8), "f4"))
    )
    with g.compile(dispatch=dispatch, data=data) as cg:
        for k in range(6):
            if k == 2:
                with pytest.raises(StageFailed) as ei:
                    cg.run(frame(k, bad=True, slow=True), timeout=10)
                check_failure(ei.value, "b", cg.frame)
                continue
            x = frame(k)["x"]
            out = cg.run(frame(k), timeout=10)
            np.testing.assert_allclose(out["yd"], (x + 1.0) + 2.0 * x, rtol=1e-6)
            np.testing.assert_allclose(out["ye"], np.maximum(2.0 * x, 0), rtol=1e-6)


@pytest.mark.parametrize("inflight", [2, 3, 4])
@pytest.mark.parametrize("data", ["shared", "copy"])
def test_a_failure_with_frames_in_flight(env: Env, inflight: int, data: str) -> None:
    """A stream with ``inflight`` frames in flight: frame 6 fails (the frames after it are
    in flight, slow, so they still run while the stream resumes); the stream raises for
    frame 6; streaming the frames after it again on the same graph gives right values."""
    inputs = [frame(k, bad=k == 6, slow=6 < k <= 6 + inflight) for k in range(20)]
    with chain(env).compile(dispatch="direct", data=data, inflight=inflight) as cg:
        got: list[np.ndarray] = []
        base = cg.frame
        with pytest.raises(StageFailed) as ei:
            for out in cg.stream(inputs, timeout=10):
                got.append(out["yc"])
        assert len(got) == 6, (len(got), str(ei.value)[:300], cg.frame - base)
        check_failure(ei.value, "b", base + 7)  # frames are numbered from 1
        assert cg.frame == base + 6 + inflight  # the stream had submitted up to here
        for k, want in enumerate(got):
            np.testing.assert_allclose(want, chain_ref(inputs[k]["x"]))
        rest = list(cg.stream(inputs[7:], timeout=10))
        assert len(rest) == len(inputs) - 7
        for k, out in enumerate(rest, start=7):
            np.testing.assert_allclose(out["yc"], chain_ref(inputs[k]["x"]))
        for k in range(3):  # and run() after it
            out = cg.run(frame(100 + k), timeout=10)["yc"]
            np.testing.assert_allclose(out, chain_ref(frame(100 + k)["x"]))


@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_repeated_failures_keep_bounded_state(env: Env, dispatch: str, data: str) -> None:
    """Many consecutive failed frames (more than MAX_RETIRED), failures between good frames:
    every failure names its frame, every good frame is right, the retired objects stay
    bounded and close() releases every one of them."""
    cg = diamond(env).compile(dispatch=dispatch, data=data, inflight=2)
    per_generation = len(graph_objects(cg)) // cg.inflight
    seen: dict[int, Any] = {}
    try:
        pattern = [False, True, False, True, True] + [True] * (2 * MAX_RETIRED + 4)
        pattern += [False] * 4 + [True, False]
        for k, bad in enumerate(pattern):
            if bad:
                with pytest.raises(StageFailed) as ei:
                    cg.run(frame(k, bad=True), timeout=10)
                check_failure(ei.value, "b", cg.frame)
                assert 1 <= len(cg.slots[cg.frame % cg.inflight].retired) <= MAX_RETIRED
                held = graph_objects(cg)
                seen.update((id(o), o) for o in held)
                assert len(held) <= (MAX_RETIRED + 1) * per_generation * cg.inflight
            else:
                out = cg.run(frame(k), timeout=10)
                np.testing.assert_allclose(out["yd"], diamond_ref(frame(k)["x"])["yd"], rtol=1e-6)
        # the last failure came after good frames on its slot: only the generation it retired is kept
        assert len(cg.slots[(cg.frame - 1) % cg.inflight].retired) == 1
        assert all(len(sl.retired) <= MAX_RETIRED for sl in cg.slots)
        assert len(seen) > 2 * MAX_RETIRED * per_generation  # more generations made than kept
        most = (MAX_RETIRED + 1) * per_generation * cg.inflight
        assert sum(lowlevel.is_held(o) for o in seen.values()) <= most
    finally:
        cg.close()
    assert not any(lowlevel.is_held(o) for o in seen.values())


def graph_objects(cg: Any) -> list[Any]:
    """Every timeline and packet object a compiled graph holds now, retired ones included."""
    out: list[Any] = []
    for sl in cg.slots:
        out += sl.owned + sl.timelines + list(sl.copied.values())
        for r in sl.retired:
            out += r.owned + r.timelines
    return out


def test_stage_failed_without_a_frame_reads_as_before() -> None:
    e = StageFailed("s", Status.ERROR, "why")
    assert (str(e), e.frame) == ("stage 's' failed with ERROR: why", None)


def test_a_reset_that_cannot_finish_leaves_no_frame(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the objects of the reset cannot be made, the failed frame's error says so and every
    later run raises GraphResetFailed (never a frame on half-built packets); close() frees all."""
    cg = chain(env).compile(dispatch="direct", data="shared")
    np.testing.assert_allclose(cg.run(frame(0), timeout=10)["yc"], chain_ref(frame(0)["x"]))
    real = cg._build_packets

    def failing(sl: Any) -> None:
        real(sl)  # the slot's packets, then no room for its programs
        raise hl.OutOfMemory("heap full (test)")

    monkeypatch.setattr(cg, "_build_packets", failing)
    why = r"(?s)frame 2: stage 'b' failed with ERROR.*heap full \(test\).*g\.compile"
    with pytest.raises(GraphResetFailed, match=why) as ei:
        cg.run(frame(1, bad=True), timeout=10)
    assert isinstance(ei.value.__context__, StageFailed) or isinstance(ei.value.__cause__, hl.OutOfMemory)
    for k in range(3):
        with pytest.raises(GraphResetFailed):
            cg.run(frame(k), timeout=10)
    with pytest.raises(GraphResetFailed):
        next(iter(cg.stream([frame(0)], timeout=10)))
    held = graph_objects(cg)
    cg.close()
    assert not any(lowlevel.is_held(o) for o in held)


def test_a_respawned_agent_still_invalidates_after_a_bad_frame(env: Env) -> None:
    """A bad frame resets the graph; the death of an agent does not: GraphInvalidated, from
    then on, also for a graph that had outlived bad frames."""
    victim = agents.spawn(env.dom, "cpu", label="victim")
    try:
        g = (
            Graph(env.dom)
            .input("x", (8, 8), "f4")
            .stage("a", env.cpu1, lazy, ["x"], ("ya", (8, 8), "f4"))
            .stage("b", victim, picky, ["ya"], ("yb", (8, 8), "f4"))
        )
        with g.compile(dispatch="direct", data="shared") as cg:
            with pytest.raises(StageFailed) as ei:
                cg.run(frame(0, bad=True), timeout=10)
            check_failure(ei.value, "b", 1)
            np.testing.assert_allclose(cg.run(frame(1), timeout=10)["yb"], frame(1)["x"] * 2.0 + 1.0)
            victim.kill()
            with pytest.raises(GraphInvalidated):
                cg.run(frame(2), timeout=10)
            env.dom.reap()
            victim = agents.spawn(env.dom, "cpu", queue=victim.queue, label="victim2")
            for k in range(3):
                with pytest.raises(GraphInvalidated):
                    cg.run(frame(3 + k), timeout=10)
    finally:
        victim.kill() if not victim.alive else victim.stop()
    env.dom.reap()


# --------------------------------------------------------------------------- frames left in flight


def sleepy(x: np.ndarray) -> np.ndarray:
    """2x, after 0.3 s for a frame marked slow (of x as it was when the stage began)."""
    x = x.copy()
    if x[0, 1] == SLOW:
        time.sleep(0.3)
    return x * 2.0


def sleepy_chain(env: Env) -> Graph:
    return (
        Graph(env.dom)
        .input("x", (8, 8), "f4")
        .stage("a", env.cpu1, sleepy, ["x"], ("ya", (8, 8), "f4"))
        .stage("b", env.cpu2, picky, ["ya"], ("yb", (8, 8), "f4"))
        .stage("c", env.npu, "relu", ["yb"], ("yc", (8, 8), "f4"))
    )


@pytest.mark.parametrize("inflight", [1, 2])
def test_a_timed_out_frame_does_not_answer_for_the_next(env: Env, inflight: int) -> None:
    """A frame times out while its first stage still runs; the next frames reuse its slot at
    once.  Before, the next frame patched the slot's argument blocks under the late frame,
    whose follow-ups then signalled the new frame's number over the old frame's data (the
    host returned the late frame's output as the new one's)."""
    with sleepy_chain(env).compile(dispatch="direct", data="shared", inflight=inflight) as cg:
        np.testing.assert_allclose(cg.run(frame(0), timeout=10)["yc"], chain_ref(frame(0)["x"]))
        for k in range(1, 1 + inflight):  # every slot gets a late frame
            with pytest.raises(TimeoutError):
                cg.run(frame(k, slow=True), timeout=0.05)
        for k in range(5, 11):
            np.testing.assert_allclose(cg.run(frame(k), timeout=10)["yc"], chain_ref(frame(k)["x"]))


@pytest.mark.parametrize("data", ["shared", "copy"])
def test_a_stream_closed_early_leaves_no_late_frame_behind(env: Env, data: str) -> None:
    """A stream left with slow frames in flight (break): the next stream reuses their slots at
    once (before, it patched their argument blocks under them and got their outputs)."""
    inputs = [frame(k, slow=k >= 2) for k in range(10)]
    with sleepy_chain(env).compile(dispatch="direct", data=data, inflight=3) as cg:
        it = cg.stream(inputs, timeout=10)
        for k, out in enumerate(it):
            np.testing.assert_allclose(out["yc"], chain_ref(inputs[k]["x"]))
            if k == 1:
                break
        it.close()
        again = [frame(k) for k in range(20, 26)]
        outs = list(cg.stream(again, timeout=10))
        for f, out in zip(again, outs, strict=True):
            np.testing.assert_allclose(out["yc"], chain_ref(f["x"]))
        for k in range(30, 33):
            np.testing.assert_allclose(cg.run(frame(k), timeout=10)["yc"], chain_ref(frame(k)["x"]))


def test_run_while_a_stream_has_frames_in_flight_is_refused(env: Env) -> None:
    with chain(env).compile(dispatch="direct", data="shared", inflight=2) as cg:
        it = cg.stream([frame(k) for k in range(6)], timeout=10)
        np.testing.assert_allclose(next(it)["yc"], chain_ref(frame(0)["x"]))
        with pytest.raises(hl.InvalidOperation, match="exhaust or close"):
            cg.run(frame(50), timeout=10)
        with pytest.raises(hl.InvalidOperation, match="another stream"):
            next(iter(cg.stream([frame(51)], timeout=10)))
        outs = list(it)  # the stream goes on, undisturbed
        for k, out in enumerate(outs, start=1):
            np.testing.assert_allclose(out["yc"], chain_ref(frame(k)["x"]))
        np.testing.assert_allclose(cg.run(frame(60), timeout=10)["yc"], chain_ref(frame(60)["x"]))


# --------------------------------------------------------------------------- all of it, at random
# A compiled graph under a seeded random mix of good frames, bad frames, timeouts and streams
# closed early or failing, with frames in flight: every frame returned is right, every failure
# names its frame, and closing the graph leaves no object of it held and a consistent domain.

STRESS_MODES = [("host", "shared"), ("direct", "shared"), ("direct", "copy")]


def stress_graph(env: Env) -> Graph:
    return (
        Graph(env.dom)
        .input("x", (8, 8), "f4")
        .stage("a", env.cpu1, sleepy, ["x"], ("ya", (8, 8), "f4"))
        .stage("b", env.cpu2, picky, ["ya"], ("yb", (8, 8), "f4"))
        .stage("c", env.npu, "relu", ["yb"], ("yc", (8, 8), "f4"))
        .stage("d", env.cpu2, "scale", ["ya"], ("yd", (8, 8), "f4"), scalars=[3.0])
    )


def right(out: dict[str, np.ndarray], inp: dict[str, np.ndarray]) -> None:
    x = inp["x"]  # (a slow mark is data like any other)
    np.testing.assert_allclose(out["yc"], chain_ref(x))
    np.testing.assert_allclose(out["yd"], 6.0 * x)


@pytest.mark.parametrize(("dispatch", "data"), STRESS_MODES)
def test_random_failures_timeouts_and_early_stream_ends(env: Env, dispatch: str, data: str) -> None:
    rnd = random.Random(f"{dispatch}-{data}")
    inflight = 3 if dispatch == "direct" else 1
    cg = stress_graph(env).compile(dispatch=dispatch, data=data, inflight=inflight)
    seen: dict[int, Any] = {}
    counts = {"good": 0, "bad": 0, "timeout": 0, "stream": 0}
    try:
        for step in range(60):
            seen.update((id(o), o) for o in graph_objects(cg))
            what = rnd.choice(["good", "good", "bad", "timeout", "stream"])
            k = 1000 + step
            if what == "good":
                inp = frame(k)
                right(cg.run(inp, timeout=10), inp)
            elif what == "bad":
                with pytest.raises(StageFailed) as ei:
                    cg.run(frame(k, bad=True), timeout=10)
                assert not isinstance(ei.value, GraphInvalidated)
                assert (ei.value.stage, ei.value.frame) == ("b", cg.frame)
            elif what == "timeout":
                with pytest.raises(TimeoutError):
                    cg.run(frame(k, slow=True), timeout=0.02)
            else:
                n = rnd.randint(1, 7)
                bad_at = rnd.choice([None, rnd.randrange(n)])
                stop_at = rnd.choice([None, rnd.randrange(n)])
                inputs = [frame(k * 10 + i, bad=i == bad_at, slow=rnd.random() < 0.2) for i in range(n)]
                it = cg.stream(inputs, timeout=10)
                try:
                    for i, out in enumerate(it):
                        assert i != bad_at, "a bad frame returned outputs"
                        right(out, inputs[i])
                        if i == stop_at:
                            break
                except StageFailed as e:
                    assert bad_at is not None and e.stage == "b" and not isinstance(e, GraphInvalidated)
                finally:
                    it.close()
            counts[what] += 1
        inp = frame(7)  # and it still works
        right(cg.run(inp, timeout=10), inp)
    finally:
        seen.update((id(o), o) for o in graph_objects(cg))
        cg.close()
    assert all(counts.values()), counts
    assert not any(lowlevel.is_held(o) for o in seen.values())
    assert env.dom.check() == []
