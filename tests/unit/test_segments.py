"""GPU segments without a GPU: which stages fuse (hostless.segments.fuse), what the agent is
asked to load (GpuSegment.request), which segments a graph arms and which stages the host
then pushes (arm_plan), and the checks when a GPU stage is added."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from hostless.segments import GpuSegment, arm_plan, check_gpu_stage, fuse


@dataclass
class _Spec:
    gpu_functions: bool


@dataclass
class _Agent:
    name: str
    spec: _Spec


@dataclass
class _Stage:
    name: str
    agent: Any
    kernel: Any
    inputs: list[str]
    output: str
    shape: tuple[int, ...] = (4,)
    dtype: np.dtype = field(default_factory=lambda: np.dtype("f4"))
    scalars: list[Any] = field(default_factory=list)
    arrays: str | None = None


GPU, GPU2, CPU = _Agent("gpu", _Spec(True)), _Agent("gpu2", _Spec(True)), _Agent("cpu", _Spec(False))


def f1(x: Any) -> Any:
    return x


def f2(x: Any, y: Any) -> Any:
    return x


def _g(name: str, ins: list[str], out: str, agent: Any = GPU, arrays: str = "torch", fn: Any = f1) -> _Stage:
    return _Stage(name, agent, fn, ins, out, arrays=arrays)


def test_a_chain_on_one_agent_is_one_segment() -> None:
    st = [_g("a", ["x"], "ya"), _g("b", ["ya"], "yb"), _g("c", ["yb", "w"], "yc", fn=f2)]
    (seg,) = fuse(st)
    assert isinstance(seg.kernel, GpuSegment) and seg.name == "a+b+c"
    assert seg.inputs == ["x", "w"] and seg.output == "yc"
    req = seg.kernel.request(lambda n: ((4,), np.dtype("f4")))
    assert [s["args"] for s in req["stages"]] == [[0], [-1], [-2, 1]]  # inputs >= 0, stages -(k+1)
    assert req["arrays"] == "torch" and req["stages"][0]["fn"]["qualname"] == "f1"


@pytest.mark.parametrize(
    "stages,names",
    [
        # an intermediate also read outside the run ends it
        (
            [_g("a", ["x"], "ya"), _g("b", ["ya"], "yb"), _Stage("c", CPU, "relu", ["ya"], "yc")],
            ["a", "b", "c"],
        ),
        # another agent, another array library, a cpu stage between
        ([_g("a", ["x"], "ya"), _g("b", ["ya"], "yb", agent=GPU2)], ["a", "b"]),
        ([_g("a", ["x"], "ya"), _g("b", ["ya"], "yb", arrays="cupy")], ["a", "b"]),
        (
            [_g("a", ["x"], "ya"), _Stage("n", CPU, "relu", ["ya"], "yn"), _g("b", ["yn"], "yb")],
            ["a", "n", "b"],
        ),
        # a sink in the middle (read by nobody) is a graph output: not fused away
        ([_g("a", ["x"], "ya"), _g("b", ["x"], "yb")], ["a", "b"]),
    ],
)
def test_runs_end_where_they_must(stages: list[_Stage], names: list[str]) -> None:
    assert [s.name for s in fuse(stages)] == names


def test_arm_plan() -> None:
    # x -> a (segment) -> b (cpu) -> c (segment): both armed, b host-pushed
    preds = [[], [0], [1]]
    assert arm_plan(preds, [0, 2], 2) == ({0, 2}, {1})
    # nothing captured: nothing armed, the agents push as before ...
    assert arm_plan(preds, [], 2) == (set(), set())
    # ... unless the GPU would push follow-ups (cuda stages): then the host pushes
    assert arm_plan(preds, [], 2, gpu_pushers=True) == (set(), {1, 2})
    # a join wider than a packet's waits: nothing armed, nothing host-pushed
    wide = [[], [0], [0], [0], [1, 2, 3]]
    assert arm_plan(wide, [1], 2) == (set(), set())
    # a segment with too many predecessors for its wait is not armed
    many = [[]] * 16 + [list(range(16))]
    assert arm_plan(many, [16], 2) == (set(), set())


def test_gpu_stage_checks() -> None:
    with pytest.raises(ValueError, match="arrays='torch' or arrays='cupy'"):
        check_gpu_stage("s", f1, [], None)
    with pytest.raises(ValueError, match="arrays is one of"):
        check_gpu_stage("s", f1, [], "jax")
    with pytest.raises(TypeError, match="lambda"):
        check_gpu_stage("s", lambda x: x, [], "torch")
    with pytest.raises(TypeError, match="JSON"):
        check_gpu_stage("s", f1, [object()], "torch")
    assert check_gpu_stage("s", f1, [1.5], "cupy") == "cupy"
