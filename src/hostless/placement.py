"""Where a graph's tensors live: :func:`place_tensors`, a pure function of the stages'
agents, what each stage reads and writes, the data mode and the domain's device heaps
(used by :class:`~hostless.compiled.CompiledGraph`, re-exported by :mod:`hostless.graph`)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Protocol

from .agents.kinds import AgentSpec
from .segments import GpuSegment


class _Engine(Protocol):
    """What the placement rule needs of an agent."""

    @property
    def spec(self) -> AgentSpec: ...  # its kind (hostless.agents.kinds): whether a resident kernel

    @property
    def device(self) -> str: ...  # where its engine reads memory: "cpu" or "cuda:N"


class _Uses(Protocol):
    """What the placement rule needs of a stage."""

    @property
    def agent(self) -> _Engine: ...

    @property
    def inputs(self) -> Sequence[str]: ...

    @property
    def output(self) -> str: ...


def place_tensors(
    stages: Sequence[_Uses],
    inputs: Iterable[str],
    constants: Iterable[str],
    data: str,
    heaps: Collection[str],
) -> dict[str, str]:
    """Where each tensor of a graph lives ("cpu" or "cuda:N"); a pure function of the
    stages' agents (their device and their spec's ``resident``), what each stage reads and
    writes, the data mode and the names of the domain's device heaps.

    Copy mode: every edge is staged through host memory.  Shared mode: a tensor goes to
    GPU N's memory when the stage that writes it and every stage that reads it run on
    GPU N (the host writes graph inputs and constants, and reads outputs, with explicit
    copies), and the domain has a heap there; otherwise host memory, which every engine
    reaches.  Exception: a tensor the host writes or reads every frame (a graph input, a
    sink's output) that a stage of a resident GPU kernel (a gpucp agent: ``spec.resident``)
    touches stays in host memory: a host-side CUDA copy would wait for the resident kernel's time slice (the
    contexts of two processes are time-sliced), while the processor reads and writes
    host memory over the link itself."""
    ins, consts = list(inputs), list(constants)
    names = ins + consts + [s.output for s in stages]
    place = dict.fromkeys(names, "cpu")
    if data != "shared":
        return place
    users: dict[str, set[str]] = {n: set() for n in names}
    for s in stages:
        dev = s.agent.device
        users[s.output].add(dev)
        for i in s.inputs:
            users[i].add(dev)
    read = {i for s in stages for i in s.inputs}
    per_frame = set(ins) | {s.output for s in stages if s.output not in read}  # inputs, sinks' outputs
    # per-frame tensors of a resident kernel, or of a GPU segment (its captured graph moves them by
    # DMA from the pinned heap), stay in host memory
    resident = {
        n
        for s in stages
        if s.agent.spec.resident or isinstance(getattr(s, "kernel", None), GpuSegment)
        for n in [s.output, *s.inputs]
    }
    for n, devs in users.items():
        if len(devs) == 1:
            (d,) = devs
            if d != "cpu" and d in heaps and not (n in per_frame and n in resident):
                place[n] = d
    return place
