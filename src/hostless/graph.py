"""Graphs: pipelines of stages on agents, compiled into one of four modes.

``data``: ``"shared"`` (a stage reads its producer's output buffer in place)
or ``"copy"`` (every stage has private input and output buffers and each edge
is one memcpy, the default stacks' way).  ``dispatch``: ``"host"`` (the host
launches a stage, waits for it, copies if needed and launches the next: write,
sync, launch, wait, sync back) or ``"direct"`` (the host submits the first
packet of a frame, one per root stage; every stage's packet carries the
next ones as follow-ups, so each agent launches the next agent's work; the
host waits for the end: every sink stage).

Each stage signals a timeline with the frame number; each frame in flight
(each of the ``inflight`` slots) has its own, so a frame's failure fails no
other frame.  A timeline is owned by the stage's agent, so an agent's death
fails it with OWNER_DIED and :meth:`CompiledGraph.run` raises
:class:`StageFailed` within bounded time.  A failing stage also fails the
timelines of the stages after it, in its frame.

Stages form a DAG (:mod:`hostless.dag`): each stage consumes named
tensors (graph inputs, constants and the outputs of *any* earlier stages), and
one output may feed several stages (fan-out) as several outputs may feed one
stage (fan-in); a chain is the special case where each stage consumes the
previous one.  Every stage output that no stage consumes is a graph output,
and a frame is done when every sink stage is.

* Direct dispatch: the host pushes the packets of the root stages (no
  predecessor).  When a stage finishes, its agent pushes the packets of the
  successors whose *pusher* it is: a stage with several predecessors is pushed
  by one of them (so it is enqueued once per frame), chosen by placement so
  that no packet is queued on an agent ahead of work it waits for (the last
  predecessor where that is safe; ``hostless.dag`` states the plan and checks
  it against every interleaving of a frame; ``plan()`` says when no plan
  found is safe), and its packet waits on the other predecessors' timeline
  points (the frame number), so it runs only when all its inputs are done.
  A packet waits on at
  most two points (``wait[2]``); a stage with more than three predecessors gets
  *relay* packets in front of it: one-byte copy packets on the pusher's agent,
  each waiting on two more points, chained as follow-ups (one relay per two
  extra predecessors).  Limits: relays pass through the pusher's own queue,
  which an agent cuts after 64 hops (a fan-in of at most ~130 inputs), and
  an agent fails the signals of follow-ups that will never run at most 16
  levels deep: past ~30 inputs a failed pusher is reported by the host's
  check of the failing sink's ancestors (every 50 ms while it waits)
  rather than by the join's own timeline.  Independent
  branches run concurrently on different agents.
* Host dispatch: the host launches every stage whose inputs are done, waits
  for the launched stages in topological order and, on each completion,
  copies (copy mode) and launches what became ready.  Independent branches
  therefore also run concurrently on different agents; packets carry no
  waits (the host is the one that knows when inputs are done, as in the
  default stacks).
* Copy mode: every edge is one copy into the consumer's private input.  In
  direct dispatch the copies run on the producer's agent after its kernel; a
  stage with a successor it does not push also signals a second timeline
  when its copies are done, and that successor waits on it (not on the
  stage's own timeline, which is reached before the copies).
* Per frame, the host runs one *frame program* (:class:`hostless.wire.FrameOps`,
  ``core/frame.c``), built and validated by the engine at compile time (every
  handle held and of its kind, every patched word inside its argument
  block): it writes the frame number into the prepared packets' value words,
  pushes the root packets (direct) or every stage's packet, waiting for each
  and copying between them (host, in the order above, which depends on the
  DAG only), and waits for the sinks: one C call with the GIL released, no
  packet encoded or parsed in Python.
* Failures: a failing stage fails its descendants (a failed input passes its
  failure on; the follow-ups that never run have their signals failed), and
  :class:`StageFailed` names the frame and the failed stage among the
  ancestors of the failing sink that comes first in topological order.
* A graph outlives a bad frame (:mod:`hostless.renewal`): a failed timeline
  stays failed (the ABI's rule), so before :class:`StageFailed` is raised the
  host gives the failed frame's slot fresh timelines (owned by the same
  agents) and packets, and retires the old ones until no packet can name
  them; the next frame runs without a recompile.  A frame left in flight
  (a timeout, an interrupt, a stream closed early) has its slot renewed the
  same way before the slot is used again, so its late packets never see
  another frame's words.  A stream has the slots to itself while it has
  frames in flight (``run`` and another stream meanwhile raise
  InvalidOperation).
* Agents are part of what is compiled: a compiled graph records each agent's
  participant identity (slot index and incarnation) and the consumer word of
  its queue.  Every :meth:`CompiledGraph.run` (and every frame of
  :meth:`CompiledGraph.stream`) reads them in shared memory before it submits
  and again before it returns outputs (no system call); a frame that fails or
  times out also checks each agent's liveness lock.  An agent that died, or
  whose queue was taken over by a respawn (``spawn(queue=old.queue)``),
  invalidates the graph: its timelines are failed with OWNER_DIED (so the
  frames in flight fail), and that frame and every later ``run``/``stream``
  raise :class:`GraphInvalidated` until the graph is compiled again on live
  agents.  So no frame is ever returned from a graph whose agents changed
  under it; and a respawned agent never runs the packets queued for the dead
  one (:meth:`hostless.Queue.bind`), so nothing of an old frame runs against
  argument blocks the host re-patched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .agents import Agent
from .compiled import CompiledGraph
from .domain import Domain
from .graphparts import GraphInvalidated, GraphResetFailed, GraphTooLarge, Stage, StageFailed
from .kernels import check_stage
from .placement import place_tensors
from .segments import check_gpu_stage, fuse
from .stagefn import describe

__all__ = [
    "Graph",
    "CompiledGraph",
    "StageFailed",
    "GraphInvalidated",
    "GraphResetFailed",
    "GraphTooLarge",
    "Stage",
    "place_tensors",
]


class Graph:
    """A pipeline description (a DAG of stages).  Add stages in order (a stage consumes
    graph inputs, constants and outputs of earlier stages), then :meth:`compile`."""

    def __init__(self, dom: Domain) -> None:
        self.dom = dom
        self.stages: list[Stage] = []
        self.inputs: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self.constants: dict[str, np.ndarray] = {}

    def input(self, name: str, shape: Sequence[int], dtype: Any) -> Graph:
        """Declare a graph input fed by ``run``."""
        self._fresh(name)
        self.inputs[name] = (tuple(shape), np.dtype(dtype))
        return self

    def constant(self, name: str, value: np.ndarray) -> Graph:
        """A tensor uploaded once at compile time (weights)."""
        self._fresh(name)
        self.constants[name] = np.ascontiguousarray(value)
        return self

    def stage(
        self,
        name: str,
        agent: Agent,
        kernel: str | Callable[..., Any],
        inputs: Sequence[str],
        output: tuple[str, Sequence[int], Any],
        scalars: Sequence[Any] = (),
        arrays: str | None = None,
    ) -> Graph:
        """Add a stage running ``kernel`` on ``agent``: inputs by name, output (name, shape, dtype).

        ``kernel`` is the name of a built-in kernel of the agent's kind (see
        :mod:`hostless.kernels`), of a user kernel given to ``spawn``, a
        plain Python function run by a cpu agent, called as
        ``kernel(*inputs, *scalars)`` and returning the output (the contract
        is in :mod:`hostless.stagefn`), or a function run by a cuda agent on
        PyTorch tensors (``arrays="torch"``) or CuPy arrays (``arrays="cupy"``),
        captured as a CUDA graph with the GPU stages next to it
        (:mod:`hostless.segments`)."""
        if callable(kernel) and agent.spec.gpu_functions:
            arrays = check_gpu_stage(name, kernel, scalars, arrays)
        elif arrays is not None:
            raise ValueError(f"stage {name!r}: arrays= is for functions on cuda agents")
        elif callable(kernel):
            if not agent.spec.stage_functions:
                where = "hostless-agent (native='exe')" if agent.native == "exe" else agent.kind
                raise TypeError(f"stage {name!r}: Python functions run on cpu and cuda agents, not {where}")
            describe(kernel, scalars)  # refuses lambdas, nested functions, scalars JSON cannot carry
        else:
            agent.spec.kernel(kernel, agent.user_kernels)  # KeyError naming the kernels it has
            for x in scalars:
                if isinstance(x, bool) or not isinstance(x, (int, float)):
                    raise TypeError(f"stage {name!r}: built-in kernels take int or float scalars, got {x!r}")
        known = set(self.inputs) | set(self.constants) | {s.output for s in self.stages}
        for i in inputs:
            if i not in known:
                raise KeyError(
                    f"stage {name!r}: input {i!r} is not a graph input, constant or earlier output"
                )
        oname, oshape, odtype = output
        if isinstance(kernel, str) and kernel not in agent.user_kernels:
            ins = [self._shape_of(i) for i in inputs]
            try:  # what the kernel would refuse at run time, refused now
                check_stage(kernel, ins, (tuple(oshape), np.dtype(odtype)), len(scalars))
            except ValueError as e:
                raise ValueError(f"stage {name!r}: {e}") from None
        self._fresh(oname)
        shp, dt = tuple(oshape), np.dtype(odtype)
        self.stages.append(Stage(name, agent, kernel, list(inputs), oname, shp, dt, list(scalars), arrays))
        return self

    def _shape_of(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        """Shape and dtype of a graph input, constant or stage output."""
        if name in self.inputs:
            return self.inputs[name]
        if name in self.constants:
            return tuple(self.constants[name].shape), self.constants[name].dtype
        s = next(s for s in self.stages if s.output == name)
        return s.shape, s.dtype

    def _fresh(self, name: str) -> None:
        if name in self.inputs or name in self.constants or any(s.output == name for s in self.stages):
            raise ValueError(f"tensor name {name!r} is already used")

    def compile(
        self, dispatch: str = "direct", data: str = "shared", inflight: int = 2, outputs: Sequence[str] = ()
    ) -> CompiledGraph:
        """Allocate buffers, queues' packets and timelines for ``inflight`` frames at once.

        A frame returns every output no stage consumes, and the stage outputs named in
        ``outputs`` too (each frame's value, read once the frame is done)."""
        for o in outputs:
            if not any(s.output == o for s in self.stages):
                raise KeyError(f"outputs: {o!r} is not a stage's output")
        if dispatch not in ("host", "direct"):
            raise ValueError("dispatch is 'host' or 'direct'")
        if data not in ("shared", "copy"):
            raise ValueError("data is 'shared' or 'copy'")
        if not self.stages:
            raise ValueError("a graph needs at least one stage")
        if inflight < 1:
            raise ValueError("inflight must be >= 1")
        return CompiledGraph(
            self._fused(), dispatch, data, inflight if dispatch == "direct" else 1, tuple(outputs)
        )

    def _fused(self) -> Graph:
        """This graph with each run of GPU function stages as one segment stage
        (:func:`hostless.segments.fuse`); itself when there are none."""
        stages = fuse(self.stages)
        if len(stages) == len(self.stages) and all(a is b for a, b in zip(stages, self.stages, strict=True)):
            return self
        g = Graph(self.dom)
        g.inputs, g.constants, g.stages = self.inputs, self.constants, stages
        return g
