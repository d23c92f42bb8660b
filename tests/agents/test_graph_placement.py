"""Graph placement on the CPU: :func:`hostless.graph.place_tensors`, the rule that puts
each tensor in host memory or in a GPU's memory, tested case by case without a GPU.

The rule needs only each stage's agent spec (hostless.agents.kinds: whether it is a
resident GPU kernel) and device, what the stage reads and writes, the data mode and the
names of the domain's device heaps, so agents are faked by plain objects here
(tests/gpu/test_gpu_devmem.py runs the same rule on real GPUs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from hostless.agents.kinds import SPECS, AgentSpec
from hostless.graph import place_tensors

DEVICE = {"cpu": "cpu", "npu": "cpu", "cuda": "cuda:0", "gpucp": "cuda:0"}
"""The device each kind of agent reads memory on (``agents.spawn``; GPU 0 by default)."""


@dataclass(frozen=True)
class FakeAgent:
    kind: str
    device: str

    @property
    def spec(self) -> AgentSpec:
        return SPECS[self.kind]


@pytest.mark.parametrize("kind", list(DEVICE))
def test_the_specs_say_where_each_kind_reads_memory(kind: str) -> None:
    assert SPECS[kind].device_of(0) == DEVICE[kind]
    assert SPECS[kind].resident == (kind == "gpucp")
    if kind in ("cuda", "gpucp"):
        assert SPECS[kind].device_of(1) == "cuda:1"


@dataclass(frozen=True)
class FakeStage:
    agent: FakeAgent
    inputs: Sequence[str]
    output: str


def st(on: str, inputs: Sequence[str], output: str) -> FakeStage:
    """A stage on an agent of kind ``on`` ("cuda:1" / "gpucp:1" pick GPU 1)."""
    kind, _, n = on.partition(":")
    dev = f"cuda:{n}" if n else DEVICE[kind]
    return FakeStage(FakeAgent(kind, dev), tuple(inputs), output)


HEAP0 = {"cuda:0"}
BOTH = {"cuda:0", "cuda:1"}


def place(
    stages: Sequence[FakeStage],
    inputs: Sequence[str] = ("x",),
    constants: Sequence[str] = (),
    data: str = "shared",
    heaps: set[str] = HEAP0,
) -> dict[str, str]:
    return place_tensors(stages, inputs, constants, data, heaps)


# ------------------------------------------------------------------ one engine kind


@pytest.mark.parametrize("kind", ["cpu", "npu"])
def test_host_engines_keep_everything_in_host_memory(kind: str) -> None:
    # cpu and npu agents read host memory: nothing moves, even with a GPU heap in the domain
    g = [st(kind, ["x", "w"], "h"), st(kind, ["h"], "y")]
    assert place(g, constants=["w"], heaps=BOTH) == {"x": "cpu", "w": "cpu", "h": "cpu", "y": "cpu"}


def test_gpu_only_chain_lives_on_the_gpu() -> None:
    # every tensor is touched by GPU 0 only: inputs and constants (host copies in), the
    # intermediate, the output (host copies out)
    g = [st("cuda", ["x", "w"], "h"), st("cuda", ["h"], "y")]
    assert place(g, constants=["w"]) == {"x": "cuda:0", "w": "cuda:0", "h": "cuda:0", "y": "cuda:0"}


def test_gpu_tensors_stay_in_host_memory_without_a_heap_on_that_gpu() -> None:
    g = [st("cuda", ["x", "w"], "h"), st("cuda", ["h"], "y")]
    assert set(place(g, constants=["w"], heaps=set()).values()) == {"cpu"}
    assert set(place(g, constants=["w"], heaps={"cuda:1"}).values()) == {"cpu"}


@pytest.mark.parametrize("kind", ["cpu", "npu", "cuda", "gpucp"])
def test_copy_mode_stages_every_edge_through_host_memory(kind: str) -> None:
    g = [st(kind, ["x", "w"], "h"), st(kind, ["h"], "y")]
    assert set(place(g, constants=["w"], data="copy", heaps=BOTH).values()) == {"cpu"}


# ------------------------------------------------------------------ mixed engines


@pytest.mark.parametrize("other", ["cpu", "npu"])
@pytest.mark.parametrize("gpu_first", [True, False])
def test_an_edge_between_a_gpu_and_a_host_engine_stays_in_host_memory(other: str, gpu_first: bool) -> None:
    a, b = ("cuda", other) if gpu_first else (other, "cuda")
    p = place([st(a, ["x"], "h"), st(b, ["h"], "y")])
    assert p["h"] == "cpu"
    # each end is touched by one engine only: it goes where that engine is
    assert p["x"] == DEVICE[a] and p["y"] == DEVICE[b]


def test_an_edge_between_two_gpus_stays_in_host_memory() -> None:
    # producer on GPU 0, consumer on GPU 1: no single device, so host memory (both reach it)
    p = place([st("cuda:0", ["x"], "h"), st("cuda:1", ["h"], "y")], heaps=BOTH)
    assert p == {"x": "cuda:0", "h": "cpu", "y": "cuda:1"}


def test_a_tensor_with_readers_on_two_engines_stays_in_host_memory() -> None:
    # fan-out: h is written on the GPU, read on the GPU and on a cpu agent
    g = [st("cuda", ["x"], "h"), st("cuda", ["h"], "y1"), st("cpu", ["h"], "y2")]
    p = place(g)
    assert p == {"x": "cuda:0", "h": "cpu", "y1": "cuda:0", "y2": "cpu"}


def test_a_graph_input_read_on_two_engines_stays_in_host_memory() -> None:
    p = place([st("cuda", ["x"], "a"), st("cpu", ["x"], "b")])
    assert p == {"x": "cpu", "a": "cuda:0", "b": "cpu"}


def test_a_constant_goes_where_its_only_reader_runs() -> None:
    g = [st("cpu", ["x"], "h"), st("cuda", ["h", "w"], "y"), st("cpu", ["y", "v"], "z")]
    p = place(g, constants=["w", "v"])
    assert p["w"] == "cuda:0" and p["v"] == "cpu"
    assert p["h"] == "cpu" and p["y"] == "cpu"  # both cross between engines


def test_a_gpu_1_heap_serves_gpu_1_stages_only() -> None:
    g = [st("cuda:0", ["x"], "h0"), st("cuda:0", ["h0"], "y0")]
    g += [st("cuda:1", ["x1"], "h1"), st("cuda:1", ["h1"], "y1")]
    p = place(g, inputs=["x", "x1"], heaps={"cuda:1"})
    assert p == {"x": "cpu", "h0": "cpu", "y0": "cpu", "x1": "cuda:1", "h1": "cuda:1", "y1": "cuda:1"}


def test_unused_inputs_and_constants_stay_in_host_memory() -> None:
    p = place([st("cuda", ["x"], "y")], inputs=["x", "unused"], constants=["spare"])
    assert p == {"x": "cuda:0", "unused": "cpu", "spare": "cpu", "y": "cuda:0"}


# ------------------------------------------------------------------ the GPU command processor


def test_gpucp_per_frame_tensors_stay_in_host_memory() -> None:
    # the input (host writes it every frame) and the output (host reads it) of a gpucp chain
    # stay in host memory; the intermediate and the constant (uploaded once) go on the GPU
    g = [st("gpucp", ["x", "w"], "h"), st("gpucp", ["h"], "y")]
    assert place(g, constants=["w"]) == {"x": "cpu", "w": "cuda:0", "h": "cuda:0", "y": "cpu"}


def test_gpucp_exception_only_touches_its_own_tensors() -> None:
    # a cuda stage's input and a cuda stage's output on the same GPU still go to the GPU
    # although a gpucp stage is in the graph; the gpucp stage's own per-frame output does not
    g = [st("cuda", ["x"], "h"), st("gpucp", ["h"], "y"), st("cuda", ["x2"], "z")]
    p = place(g, inputs=["x", "x2"])
    assert p == {"x": "cuda:0", "h": "cuda:0", "y": "cpu", "x2": "cuda:0", "z": "cuda:0"}


def test_gpucp_and_cuda_share_the_gpu_for_intermediates() -> None:
    g = [st("gpucp", ["x"], "h"), st("cuda", ["h"], "y")]
    p = place(g)
    assert p == {"x": "cpu", "h": "cuda:0", "y": "cuda:0"}


def test_gpucp_output_read_on_the_host_engine_stays_in_host_memory() -> None:
    g = [st("gpucp", ["x"], "h"), st("cpu", ["h"], "y")]
    assert place(g) == {"x": "cpu", "h": "cpu", "y": "cpu"}


def test_a_gpucp_sink_among_several_is_per_frame() -> None:
    # two sinks: the gpucp one stays in host memory, the cuda one goes to the GPU; the
    # gpucp stage's output consumed by another stage is not per-frame
    g = [st("gpucp", ["x"], "h"), st("gpucp", ["h"], "y1"), st("cuda", ["h"], "y2")]
    p = place(g)
    assert p == {"x": "cpu", "h": "cuda:0", "y1": "cpu", "y2": "cuda:0"}


def test_gpucp_on_gpu_1() -> None:
    g = [st("gpucp:1", ["x", "w"], "h"), st("gpucp:1", ["h"], "y")]
    assert place(g, constants=["w"], heaps=BOTH) == {"x": "cpu", "w": "cuda:1", "h": "cuda:1", "y": "cpu"}
    assert set(place(g, constants=["w"], heaps=HEAP0).values()) == {"cpu"}


# ------------------------------------------------------------------ the real GPU tests' graphs


def test_the_gpu_suites_graphs() -> None:
    """The graphs tests/gpu/test_gpu_devmem.py compiles on a GPU, placed here without one (the
    same expectations, so a change to the rule shows on the CPU first)."""
    chain = [st("cuda", ["x", "w"], "h"), st("cuda", ["h"], "y")]
    assert place(chain, constants=["w"]) == {"x": "cuda:0", "w": "cuda:0", "h": "cuda:0", "y": "cuda:0"}
    assert set(place(chain, constants=["w"], data="copy").values()) == {"cpu"}
    mixed = [st("cuda", ["x"], "h"), st("cpu", ["h"], "y")]
    p = place(mixed)
    assert p["x"] == "cuda:0" and p["h"] == "cpu" and p["y"] == "cpu"


def test_a_graph_stage_fits_the_rule() -> None:
    """The rule takes the graph's own Stage objects (an agent with kind and device)."""
    import numpy as np

    from hostless.graph import Stage

    s = Stage("a", FakeAgent("cuda", "cuda:0"), "relu", ["x"], "y", (4,), np.dtype("f4"))  # type: ignore[arg-type]
    assert place_tensors([s], ["x"], [], "shared", HEAP0) == {"x": "cuda:0", "y": "cuda:0"}
