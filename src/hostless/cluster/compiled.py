"""A compiled cluster graph: node-local hostless parts joined by edges Ray carries.

:meth:`ClusterGraph.compile <hostless.cluster.ClusterGraph.compile>` splits the
graph (:func:`hostless.cluster.partition.split`), has each part compiled by its
node's host (:class:`hostless.cluster.host.NodeHost`) in the graph's mode, and
joins the parts with one of two Ray transports:

* ``"compiled"`` (the default): a Ray Compiled Graph over the node hosts
  (``experimental_compile``, ``_max_inflight_executions=inflight``): each part a
  bound method of its host, each edge a compiled-graph channel; the driver's
  inputs go to the parts that read them, the frame number to the parts the
  driver feeds (the others read it from the dicts they are given: a driver input
  read by hosts on two nodes with several frames in flight hung on Ray 2.60).
  Arrays a host gets are zero-copy views of a channel's buffer: they are copied
  into the part's buffers and never returned (returning one hung the channel).
* ``"actors"``: per frame, one actor call per part, in the parts' order; a part's
  outputs go to the later parts as Ray object references, so a tensor goes from
  the producing node's object store to the consuming node's once per edge (Ray
  inlines objects under its ``max_direct_call_object_size``, 100 KiB by default,
  into the call's reply: those small tensors pass through the driver's process,
  as in any chain of Ray tasks).  Frames of a :meth:`stream` are submitted ahead,
  so the nodes work on different frames at once.

Failures.  A stage that fails on a node fails its frame there; the failure
travels in place of the part's outputs (:class:`hostless.cluster.host.Failure`)
and the driver raises :class:`RemoteStageFailed` (a
:class:`~hostless.graph.StageFailed`) naming the stage, its node and the agent's
reason.  The compiled graph goes on with the next frame, as a local one does.
A node host that dies (its process, or its node) fails the frames in flight
within the run's timeout: the driver raises :class:`NodeLost` naming the node,
and the graph returns no frame again; build the graph again on agents of the
nodes left and compile it (the dead host's domain file is replaced when a new
host starts on that node).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import HostlessError
from ..graph import StageFailed
from ..graphparts import checked_inputs
from ..segments import GpuSegment
from ..stagefn import describe
from ..status import Status
from .host import FRAME_KEY, Failure, PartSpec
from .partition import DRIVER, Part, split
from .partition import describe as describe_parts

if TYPE_CHECKING:
    from . import ClusterGraph, RemoteAgent

__all__ = ["ClusterCompiledGraph", "RemoteStageFailed", "NodeLost"]

_SETTLE_S = 10.0
"""How long a frame that Ray failed (an actor or a channel error, not a timeout) waits for
Ray's actor table to show which node host died, before the error is raised as it is."""

_FRAME = FRAME_KEY
"""The compiled transport's input carrying the frame number (a reserved input name)."""


class RemoteStageFailed(StageFailed):
    """A stage of a cluster graph failed on its node: ``stage``, ``status``, ``error`` (the
    agent's reason) and ``frame`` as :class:`~hostless.graph.StageFailed`, and ``node``
    (the node's label, see :meth:`hostless.cluster.Cluster.label`).  The graph goes on."""

    def __init__(self, stage: str, status: Status, error: str | None, frame: int | None, node: str) -> None:
        super().__init__(stage, status, error, frame)
        self.args = (f"node {node}: {self.args[0]}",)
        self.node = node


class NodeLost(StageFailed):
    """A node host (its process, or its node) died with frames in flight: they failed, and
    this compiled graph returns no frame again.  ``node`` names it; ``stage`` is the first
    stage that ran there.  Spawn agents on the nodes left (or a new host on the same node)
    and compile the graph again."""

    def __init__(self, stage: str, node: str, frame: int | None, why: str) -> None:
        HostlessError.__init__(
            self,
            f"frame {frame}: node {node} was lost ({why}); stage {stage!r} ran there: this compiled graph "
            "returns no frame again: build the graph on agents of the nodes left and compile it",
        )
        self.stage, self.status, self.error, self.frame, self.node = (
            stage,
            Status.OWNER_DIED,
            why,
            frame,
            node,
        )


def _gone(ray: Any, host: Any) -> str | None:
    """Why the node host actor ``host`` is gone (Ray's actor table says DEAD), or None while
    it lives (the table is read from Ray's control store: a host busy with frames answers)."""
    try:
        state = ray._private.state.actors(actor_id=host._actor_id.hex())
    except Exception:  # noqa: BLE001 - the table unreadable: ask the host itself, briefly
        try:
            ray.get(host.info.remote(), timeout=10)
            return None
        except Exception as e:  # noqa: BLE001
            return f"its node host does not answer ({type(e).__name__})"
    if state.get("State") != "DEAD":
        return None
    cause = str(state.get("DeathCause") or "").strip().replace("\n", " ")
    return "its node host died" + (f": {cause[:200]}" if cause else "")


def _named_actor(ray: Any, e: BaseException | None) -> Any:
    """The first RayActorError (an actor died or is unreachable) in ``e``'s chain, or None."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, ray.exceptions.RayActorError) and getattr(e, "actor_id", None):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


class ClusterCompiledGraph:
    """A graph over nodes, compiled: :meth:`run`, :meth:`stream`, :meth:`plan`, :meth:`close`."""

    def __init__(
        self,
        g: ClusterGraph,
        dispatch: str,
        data: str,
        inflight: int,
        transport: str,
        timeout: float,
        gid: int,
    ) -> None:
        self.g, self.cluster = g, g.cluster
        self.dispatch, self.data, self.inflight, self.transport = dispatch, data, inflight, transport
        self.timeout, self.gid = timeout, gid
        self._ray = self.cluster._ray
        self.frame = 0
        self._closed = False
        self._lost: NodeLost | None = None
        self._dag: Any = None
        st = g.stages
        nodes = [cast("RemoteAgent", s.agent).node for s in st]
        self.parts: list[Part] = split(
            nodes, [s.output for s in st], [s.inputs for s in st], list(g.inputs), list(g.constants)
        )
        self.hosts = [self.cluster.host(p.node) for p in self.parts]
        self.outputs = [n for p in self.parts for e in p.gives if e.dst == DRIVER for n in e.names]
        self._plans: list[str] = []
        self._compiled: set[Any] = set()
        try:
            refs = [
                h.compile.remote(gid, p.index, self._spec(p))
                for h, p in zip(self.hosts, self.parts, strict=True)
            ]
            self._compiled = set(self.hosts)
            self._plans = list(self._ray.get(refs, timeout=max(120.0, timeout)))
            if transport == "compiled":
                self._dag = self._compile_dag()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ building
    def _spec(self, p: Part) -> PartSpec:
        g = self.g
        stages = []
        for k in p.stages:
            s = g.stages[k]
            agent = cast("RemoteAgent", s.agent)
            fn = s.kernel
            if isinstance(fn, GpuSegment):  # (a cluster graph refuses GPU function stages)
                raise TypeError(f"stage {s.name!r}: GPU segments are not carried across nodes")
            kernel: str | dict[str, Any] = fn if isinstance(fn, str) else describe(fn, ())
            if isinstance(kernel, dict):
                kernel.pop("scalars")  # (the stage's own travel with it)
            stages.append(
                (s.name, agent.key, kernel, tuple(s.inputs), s.output, s.shape, s.dtype.str, tuple(s.scalars))
            )
        inputs = []
        for e in p.takes:
            for name in e.names:
                shp, dt = g._shape_of(name)
                inputs.append((name, tuple(shp), dt.str))
        driver = sum(len(e.names) for e in p.takes if e.src == DRIVER)
        return PartSpec(
            stages=tuple(stages),
            inputs=tuple(inputs),
            driver_inputs=driver,
            edges_in=tuple(e.names for e in p.takes if e.src != DRIVER),
            constants={c: g.constants[c] for c in p.constants},
            gives=tuple(e.names for e in p.gives),
            dispatch=self.dispatch,
            data=self.data,
            timeout=self.timeout,
        )

    def _wire(self, call: Any, driver_value: Any) -> list[Any]:
        """Bind (compiled) or call (actors) every part in order; returns what reaches the
        driver: one value per part's edge to the driver.  ``call(host, part, args, n)``
        returns the part's ``n`` outputs as a list; ``driver_value(name)`` is a graph input."""
        outs: dict[int, list[Any]] = {}
        to_driver: list[Any] = []
        for h, p in zip(self.hosts, self.parts, strict=True):
            args: list[Any] = []
            for e in p.takes:
                if e.src == DRIVER:
                    args += [driver_value(n) for n in e.names]
                else:
                    src = self.parts[e.src]
                    pos = next(i for i, x in enumerate(src.gives) if x.dst == p.index)
                    args.append(outs[e.src][pos])
            res = call(h, p, args, len(p.gives))
            outs[p.index] = res
            to_driver += [r for r, e in zip(res, p.gives, strict=True) if e.dst == DRIVER]
        return to_driver

    def _compile_dag(self) -> Any:
        from ray.dag import InputNode, MultiOutputNode

        with InputNode() as inp:
            frame = getattr(inp, _FRAME)

            def call(h: Any, p: Part, args: list[Any], n: int) -> list[Any]:
                m = h.run.options(num_returns=n) if n > 1 else h.run
                fed = any(e.src == DRIVER for e in p.takes)  # (the others read it from their inputs)
                r = m.bind(self.gid, p.index, frame if fed else None, *args)
                return list(r) if n > 1 else [r]

            outs = self._wire(call, lambda name: getattr(inp, name))
            dag = MultiOutputNode(outs)
        return dag.experimental_compile(_max_inflight_executions=self.inflight)

    # ------------------------------------------------------------ frames
    def _check(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if self._closed:
            raise HostlessError("compiled cluster graph is closed")
        if self._lost is not None:
            raise self._lost
        arrs = checked_inputs(self.g.inputs, inputs)
        return {name: np.ascontiguousarray(arrs[name], dtype=dt) for name, (_s, dt) in self.g.inputs.items()}

    def _submit(self, inputs: Mapping[str, Any]) -> tuple[int, Any]:
        arrays = self._check(inputs)
        self.frame += 1
        f = self.frame
        if self._dag is not None:
            try:
                return f, self._dag.execute(**arrays, **{_FRAME: f})
            except Exception as e:  # noqa: BLE001 - a channel closed by a dead actor, a full graph
                raise self._lost_or(e, f) from e

        def call(h: Any, p: Part, args: list[Any], n: int) -> list[Any]:
            r = h.run.options(num_returns=n).remote(self.gid, p.index, f, *args)
            return list(r) if n > 1 else [r]

        refs = {name: self._ray.put(a) for name, a in arrays.items()}  # each input once, shared by its parts
        return f, self._wire(call, lambda name: refs[name])

    def _collect(self, f: int, pending: Any) -> dict[str, np.ndarray]:
        ray = self._ray
        try:
            vals = ray.get(pending, timeout=self.timeout)
        except Exception as e:  # noqa: BLE001 - Ray's errors: a dead actor, a node, a timeout
            raise self._lost_or(e, f) from e
        out: dict[str, np.ndarray] = {}
        for v in vals:
            if isinstance(v, Failure):
                st = Status[v.status] if v.status in Status.__members__ else Status.ERROR
                raise RemoteStageFailed(v.stage, st, v.error, f, v.node)
            out.update({k: np.array(a, copy=True) for k, a in v.items() if k != FRAME_KEY})
        return out

    def _lost_or(self, e: BaseException, f: int) -> BaseException:
        """The error for a frame whose results did not come: NodeLost when a node host is
        gone (the graph is done for), else a TimeoutError or the error itself."""
        ray = self._ray
        timed_out = isinstance(e, (TimeoutError, ray.exceptions.GetTimeoutError))
        # an actor's or a channel's error: Ray's table marks the dead host within moments
        settle = time.monotonic() + (0.0 if timed_out else _SETTLE_S)
        named = _named_actor(ray, e)  # Ray's error names the host it lost (the table may lag)
        while True:
            dead = [(p, why) for h, p in zip(self.hosts, self.parts, strict=True) if (why := _gone(ray, h))]
            if not dead and named is not None:
                dead = [
                    (p, f"Ray lost its node host: {type(named).__name__}: {str(named)[:200]}")
                    for h, p in zip(self.hosts, self.parts, strict=True)
                    if h._actor_id.hex() == named.actor_id
                ]
            if dead or time.monotonic() >= settle:
                break
            time.sleep(0.1)
        if dead:
            p, why = dead[0]
            stage = self.g.stages[p.stages[0]].name
            self._lost = NodeLost(stage, self.cluster.label(p.node), f, why)
            self.cluster.forget(p.node)  # the next use of the node starts a new host there
            return self._lost
        if timed_out:
            return TimeoutError(f"frame {f} did not finish within {self.timeout} s (every node host answers)")
        return e

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run one frame; returns the graph outputs.  RemoteStageFailed when a stage failed on
        its node (the next frame runs), NodeLost when a node host died (no frame again)."""
        f, pending = self._submit(inputs)
        return self._collect(f, pending)

    def stream(self, frames: Iterable[Mapping[str, Any] | Any]) -> Iterator[dict[str, np.ndarray]]:
        """Run frames with up to ``inflight`` in flight across the nodes; yields outputs in
        order.  A frame is a mapping input name -> array, or the array of a one-input graph.
        A failure ends the stream with the frame's error (the frames after it are dropped)."""
        q: deque[tuple[int, Any]] = deque()
        for x in frames:
            if not isinstance(x, Mapping):
                if len(self.g.inputs) != 1:
                    raise TypeError("a frame is a mapping input name -> array for a graph of several inputs")
                x = {next(iter(self.g.inputs)): x}
            if len(q) == self.inflight:
                yield self._collect(*q.popleft())
            q.append(self._submit(x))
        while q:
            yield self._collect(*q.popleft())

    # ------------------------------------------------------------ what it is
    def plan(self) -> str:
        """Where each stage runs, which edges are local (shared memory inside a node) and
        which go through Ray (between nodes, and to and from the driver), then each part's
        local plan (:meth:`hostless.compiled.CompiledGraph.plan`)."""
        labels = {p.node: self.cluster.label(p.node) for p in self.parts}
        lines = [
            f"cluster graph: {len(self.parts)} part(s) on {len(labels)} node(s), dispatch={self.dispatch} "
            f"data={self.data}, transport={self.transport} (Ray), inflight={self.inflight}"
        ]
        lines += describe_parts(self.parts, [s.name for s in self.g.stages], labels)
        for p, text in zip(self.parts, self._plans, strict=False):
            lines.append(f"  part {p.index} local plan:")
            lines += ["    " + ln for ln in text.splitlines()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.plan()

    def close(self) -> None:
        """Tear the Ray graph down and release every part on its node (a dead host's went with it)."""
        if self._closed:
            return
        self._closed = True
        if self._dag is not None:
            try:
                self._dag.teardown()
            except Exception:  # noqa: BLE001 - a dead actor: its part is gone with it
                pass
            self._dag = None
        refs = []
        for h in self._compiled:
            try:
                refs.append(h.release.remote(self.gid))
            except Exception:  # noqa: BLE001
                pass
        for r in refs:
            try:
                self._ray.get(r, timeout=10)
            except Exception:  # noqa: BLE001 - a dead host
                pass

    def __enter__(self) -> ClusterCompiledGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
