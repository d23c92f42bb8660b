"""GPU segments: a graph's consecutive GPU function stages, run as one captured CUDA graph.

``g.stage("cnn", gpu, my_model, ["x", "w"], ("y", (8, 10), "f4"), arrays="torch")``
adds a stage whose function takes PyTorch tensors (``arrays="cupy"``: CuPy
arrays) on a cuda agent.  The contract is the cpu stage functions' one
(:mod:`hostless.stagefn`: imported by qualified name, also from a script run as
``__main__``; called as ``fn(*inputs, *scalars)``, or with ``out=`` when it has
that parameter; returns an array of the output's shape whose dtype casts to the
output's with NumPy's ``same_kind`` rule), with arrays on the agent's GPU that
are zero-copy views of the stage's device buffers.  The function must only
queue GPU work on the current stream (no host synchronization, no ``.item()``,
no host copies), as for any CUDA graph capture; what breaks that runs eagerly.

At compile time, :func:`fuse` turns each run of such stages into one *segment*:
stages that follow each other in the graph's order, on the same cuda agent, with
the same ``arrays``, where every output but the last is read only inside the run
(so it never needs a buffer of the domain: it lives in the captured graph's own
memory).  A segment is one stage to the rest of the graph: one packet per frame,
one timeline, its external inputs and its last output.  The agent captures it
once per frame slot (:mod:`hostless.agents.gpufn`) and replays it per frame;
:meth:`hostless.graph.CompiledGraph.plan` says for each segment whether it was
captured, or runs eagerly and why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dag import MAX_PACKET_WAITS
from .errors import HostlessError
from .stagefn import describe
from .status import Status

__all__ = [
    "ARRAYS",
    "GpuSegment",
    "fuse",
    "check_gpu_stage",
    "arm_plan",
    "load",
    "prepare",
    "arm_slot",
    "close",
]

ARRAYS = ("torch", "cupy")
"""What a GPU stage function takes: PyTorch tensors or CuPy arrays."""


def check_gpu_stage(name: str, fn: Callable[..., Any], scalars: Sequence[Any], arrays: str | None) -> str:
    """The checks of a GPU function stage when it is added; returns its ``arrays``.  TypeError
    or ValueError, saying what to change, for a function another process cannot import, scalars
    JSON cannot carry, or an unknown array library."""
    if arrays is None:
        raise ValueError(
            f"stage {name!r}: a function on a cuda agent takes PyTorch tensors or CuPy arrays: "
            "say which with arrays='torch' or arrays='cupy'"
        )
    if arrays not in ARRAYS:
        raise ValueError(f"stage {name!r}: arrays is one of {ARRAYS}, got {arrays!r}")
    describe(fn, scalars)
    return arrays


@dataclass
class GpuSegment:
    """Consecutive GPU function stages of one graph on one cuda agent (see the module)."""

    stages: list[Any]
    """The user's stages (:class:`hostless.graph.Stage`), in order."""
    inputs: list[str]
    """The tensors it reads from outside, in order of first use."""
    arrays: str

    @property
    def name(self) -> str:
        return "+".join(s.name for s in self.stages)

    def request(self, shape_of: Callable[[str], tuple[tuple[int, ...], np.dtype]]) -> dict[str, Any]:
        """What the agent loads (``Agent.load_segment``): the functions by name and how each
        stage's arguments are wired (segment inputs, or earlier stages' outputs)."""
        pos = {n: i for i, n in enumerate(self.inputs)}
        made: dict[str, int] = {}
        stages = []
        for k, s in enumerate(self.stages):
            args = [pos[i] if i in pos else -(made[i] + 1) for i in s.inputs]
            stages.append(
                {
                    "name": s.name,
                    "fn": describe(s.kernel, s.scalars),
                    "args": args,
                    "shape": list(s.shape),
                    "dtype": s.dtype.str,
                }
            )
            made[s.output] = k
        ins = []
        for n in self.inputs:
            shp, dt = shape_of(n)
            ins.append({"shape": list(shp), "dtype": dt.str})
        return {"arrays": self.arrays, "inputs": ins, "stages": stages}


def _gpu_fn(s: Any) -> bool:
    return callable(s.kernel) and bool(getattr(s, "arrays", None)) and s.agent.spec.gpu_functions


def fuse(stages: Sequence[Any]) -> list[Any]:
    """The stages with every run of GPU function stages replaced by one stage whose kernel is
    a :class:`GpuSegment` (a lone GPU function stage too: a segment of one)."""
    readers: dict[str, set[int]] = {}
    for k, s in enumerate(stages):
        for i in s.inputs:
            readers.setdefault(i, set()).add(k)
    out: list[Any] = []
    k = 0
    while k < len(stages):
        s = stages[k]
        if not _gpu_fn(s):
            out.append(s)
            k += 1
            continue
        run = [k]
        j = k + 1
        while j < len(stages):
            t = stages[j]
            if not (_gpu_fn(t) and t.agent is s.agent and t.arrays == s.arrays):
                break
            members = set(run) | {j}
            # every output of the run so far is read, and only inside the run
            if not all(readers.get(stages[m].output) and readers[stages[m].output] <= members for m in run):
                break
            run.append(j)
            j += 1
        members_out = {stages[m].output for m in run}
        ins: list[str] = []
        for m in run:
            for i in stages[m].inputs:
                if i not in members_out and i not in ins:
                    ins.append(i)
        seg = GpuSegment([stages[m] for m in run], ins, s.arrays)
        last = stages[run[-1]]
        out.append(
            dataclasses.replace(
                s,
                name=seg.name,
                kernel=seg,
                inputs=ins,
                output=last.output,
                shape=last.shape,
                dtype=last.dtype,
                scalars=[],
            )
        )
        k = run[-1] + 1
    return out


def arm_plan(
    preds: Sequence[Sequence[int]], captured: Collection[int], max_waits: int, gpu_pushers: bool = False
) -> tuple[set[int], set[int]]:
    """Which segments a direct, shared-data graph arms, and which stages the host then pushes.

    An *armed* segment (``captured``: its graph was captured; at most 15 predecessors) has its
    frames queued ahead on the GPU (:class:`hostless.agents.cuda_armed.Armed`), behind a wait
    on the graph's host word and on its predecessors' points; nobody pushes its packets.

    The GPU then pushes nothing into a queue: on a PCIe machine without PCIe atomics its
    system-scope atomics on host memory are not atomic against the host's (docs/gpu.md), and
    every queue has host producers.  So in a graph with armed segments every other stage with
    predecessors is *host-pushed*: the host pushes it when it submits the frame, in
    topological order after the roots, waiting on all its predecessors' points (no follow-up
    packets at all).  Every queue then holds a frame's packets in topological order, frames
    in order, so the earliest unfinished packet is always at the head of its queue with its
    inputs done: no agent waits on a packet queued behind its own.  A packet waits on at most
    ``max_waits`` points: a graph with a wider join arms nothing (and runs as before).
    ``gpu_pushers``: the graph has stages on cuda agents, whose packets' follow-ups the GPU
    would push: the host pushes every stage with predecessors then too, armed or not (same
    bound).  Returns (armed, host-pushed)."""
    armed = {k for k in captured if len(preds[k]) <= 15}
    rest = [j for j in range(len(preds)) if j not in armed and preds[j]]
    if not (armed or gpu_pushers) or any(len(preds[j]) > max_waits for j in rest):
        return set(), set()
    return armed, set(rest)


# ---------------------------------------------------------------- a compiled graph's segments
# (hostless.compiled.CompiledGraph calls these; ``cg`` is the compiled graph)


def load(cg: Any) -> None:
    """Load the compiled graph's segments into their agents (each function imported, run on
    zero tensors, checked; ``cg.segments``: stage -> (mode, why eager)), and decide which are
    armed and which stages the host pushes (:func:`arm_plan`); the armed ones get the graph's
    ``fed`` timeline and host word."""
    cg.segments = {}
    for k, s in enumerate(cg.g.stages):
        if isinstance(s.kernel, GpuSegment):
            kid, mode, why = s.agent.load_segment(s.kernel.request(cg.g._shape_of))
            cg.kids[k], cg.segments[k] = kid, (mode, why)
    cg.armed, cg.hostpushed = set(), set()
    if cg.dispatch == "direct" and cg.data == "shared":
        captured = [k for k, (mode, _w) in cg.segments.items() if mode == "graph"]
        cuda = any(s.agent.kind == "cuda" for s in cg.g.stages)  # the GPU would push follow-ups
        cg.armed, cg.hostpushed = arm_plan(cg.dag.preds, captured, MAX_PACKET_WAITS, cuda)
    cg.fed = cg.dom.timeline() if cg.armed else None
    cg.host_word = cg.dom.buffer((1,), np.uint64) if cg.armed else None
    if cg.host_word is not None:  # a heap block is not cleared: a frame below 1 before the first
        cg.host_word.numpy()[0] = 0


def _slot_buffers(sl: Any, k: int) -> list[int]:
    return [b.handle for b in sl.stage_in[k]] + [sl.stage_out[k].handle]


def prepare(cg: Any) -> None:
    """Capture every segment over each frame slot's buffers (gated for an armed one), then arm
    every slot."""
    for k in cg.segments:
        for sl in cg.slots:
            cg.segments[k] = cg.g.stages[k].agent.prepare_segment(
                cg.kids[k], _slot_buffers(sl, k), gated=k in cg.armed
            )
    for sl in cg.slots:
        arm_slot(cg, sl)


def arm_slot(cg: Any, sl: Any) -> None:
    """Arm (or re-arm, after the slot was renewed) the armed segments in frame slot ``sl`` on
    its current timelines, from the slot's next frame on."""
    if not cg.armed:
        return
    s = cg.slots.index(sl)
    start = cg.frame + 1 + (s - (cg.frame + 1)) % cg.inflight  # the slot's next frame
    for k in sorted(cg.armed):
        cg.g.stages[k].agent.arm_segment(
            cg.kids[k],
            s,
            cg.inflight,
            _slot_buffers(sl, k),
            [sl.timelines[p].handle for p in cg.dag.preds[k]],
            sl.timelines[k].handle,
            cg.fed.handle,
            cg.host_word.handle,
            start,
        )


def plan_lines(cg: Any) -> list[str]:
    """``plan()``'s lines on the segments: captured or eager (and why), armed."""
    lines = []
    for k, (mode, why) in cg.segments.items():
        s = cg.g.stages[k]
        how = "captured as a CUDA graph, replayed per frame"
        if k in cg.armed:
            how += "; armed: queued ahead on the GPU behind waits on its inputs, no packet per frame"
        if mode != "graph":
            how = f"runs eagerly: {why}"
        lines.append(f"  segment {s.name} on {s.agent.kind} ({s.kernel.arrays}): {how}")
    if cg.hostpushed:
        lines.append(
            "  the host pushes every stage with inputs when it submits a frame, waiting on them "
            "(the GPU pushes into no queue)"
        )
    return lines


def close(cg: Any) -> None:
    """The graph is over: its ``fed`` timeline fails (the agents disarm its slots) and its
    segments are dropped (the agents release the buffers their graphs hold)."""
    if cg.fed is not None and cg.fed.failure is None:
        try:
            cg.fed.fail(Status.CANCEL)
        except HostlessError:
            pass
    for k in cg.segments:
        try:
            cg.g.stages[k].agent.drop_segment(cg.kids[k])
        except (HostlessError, TimeoutError):
            pass  # the agent is gone: its references went with it
