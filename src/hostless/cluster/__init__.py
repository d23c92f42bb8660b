"""Graphs whose stages span nodes, on Ray: hostless inside each node, Ray between nodes.

A hostless domain is one machine's shared memory.  :class:`Cluster` connects to
Ray (``ray.init()``'s defaults: on a laptop with no cluster, a local one) and
starts one *node host* per Ray node a graph uses: a Ray actor pinned to that
node (a hard node affinity), which creates the node's own domain and spawns
the node's agents in it (:mod:`hostless.cluster.host`).  ``cluster.spawn("cpu",
node=...)`` returns a :class:`RemoteAgent`, a handle :meth:`Cluster.graph`'s
graphs take where a local graph takes an :class:`~hostless.agents.Agent`::

    cl = Cluster()                                   # ray.init() unless Ray is up already
    a = cl.spawn("cpu", node=cl.nodes()[0])          # a node id, or a custom resource's name
    g = cl.graph().input("x", (64,), "f4").stage("s", a, "scale", ["x"], ("y", (64,), "f4"), scalars=[2.0])
    with g.compile() as cg:
        y = cg.run({"x": x})["y"]

Compiling splits the graph into node-local parts (:mod:`hostless.cluster.partition`),
each compiled and run by its node's host as an ordinary hostless graph (shared
memory, direct dispatch: the fast path inside the node), joined by edges Ray
carries (:mod:`hostless.cluster.compiled`): a tensor crosses between two parts
once per frame, whatever the number of stages on either side.

What is not here: a scheduler, a cluster manager or a transport of hostless's
own.  Placement is the user's (``node=``); Ray starts the hosts and carries the
bytes.  Ray is an optional dependency (``pip install 'hostless[ray]'``): it is
imported when a :class:`Cluster` is made.
"""

from __future__ import annotations

import importlib
import itertools
import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .. import _core
from ..agents import Agent
from ..agents.kinds import AgentSpec, spec_for
from ..errors import HostlessError, InvalidOperation
from ..graph import Graph
from .compiled import ClusterCompiledGraph, NodeLost, RemoteStageFailed
from .host import FRAME_KEY, NodeHost

__all__ = [
    "Cluster",
    "ClusterGraph",
    "ClusterCompiledGraph",
    "RemoteAgent",
    "RemoteStageFailed",
    "NodeLost",
    "RayMissing",
    "NodeHost",
]


class RayMissing(HostlessError, ImportError):
    """Ray is not installed: ``pip install 'hostless[ray]'``."""


def _ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError as e:
        raise RayMissing(f"hostless.cluster needs Ray: pip install 'hostless[ray]' ({e})") from None


class RemoteAgent:
    """An agent spawned by a node host on its node (:meth:`Cluster.spawn`): what a cluster
    graph's stages run on.  ``node`` is its Ray node id; ``id`` its participant id in
    that node's domain; ``spec``, ``kind``, ``native``, ``user_kernels`` and ``device``
    as for a local :class:`~hostless.agents.Agent` (the graph checks stages against them)."""

    def __init__(self, cluster: Cluster, node: str, key: int, info: dict[str, Any]) -> None:
        self.cluster, self.node, self.key = cluster, node, key
        self.id: int = int(info["id"])
        self.pid: int = int(info["pid"])
        self.kind: str = str(info["kind"])
        self.native: bool | str = info["native"]
        self.user_kernels: dict[str, int] = dict(info["user_kernels"])
        self.device: str = str(info["device"])
        self.spec: AgentSpec = spec_for(self.kind, self.native if self.native == "exe" else None)

    def stop(self) -> None:
        """Stop the agent on its node (a STOP packet)."""
        self.cluster._ray.get(self.cluster.host(self.node).stop_agent.remote(self.key))

    def __repr__(self) -> str:
        return f"RemoteAgent({self.kind}, node={self.node[:8]}, key={self.key})"


class Cluster:
    """A connection to Ray and the node hosts it started (one per node used).

    ``address``: Ray's (None: ``ray.init()``'s defaults, which start a local Ray when
    there is none; ignored when Ray is initialized already).  ``heap``: each node
    domain's heap.  ``init``: more keyword arguments for ``ray.init``.  ``close()``
    stops the hosts it started (their agents and domains go with them) and, when it
    called ``ray.init``, shuts Ray down."""

    def __init__(self, address: str | None = None, *, heap: str = "64M", **init: Any) -> None:
        self._ray = _ray()
        self._owns_ray = False
        if not self._ray.is_initialized():
            init.setdefault("include_dashboard", False)
            init.setdefault("log_to_driver", False)
            init.setdefault("logging_level", "ERROR")
            self._ray.init(address=address, **init)
            self._owns_ray = True
        # ray.init installs Ray's fatal-signal handlers in front of hostless's SIGBUS guard: put
        # the guard back now (a domain of this process truncated by another would kill it)
        _core.guard_front()
        self.heap = heap
        self._prefix = f"hlc-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._hosts: dict[str, Any] = {}
        self._labels: dict[str, str] = {}
        self._keys = itertools.count(1)
        self._graphs = itertools.count(1)
        self._closed = False
        self._actor = self._ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(NodeHost)

    def _up(self) -> Any:
        """Ray, while this cluster can use it.  Ray's calls outside an initialized Ray run
        ``ray.init()`` by themselves (a new local Ray, or one named in /tmp/ray), so after
        :meth:`close` or a ``ray.shutdown()`` they are refused here instead."""
        if self._closed:
            raise InvalidOperation("this Cluster is closed: make a new Cluster()")
        if not self._ray.is_initialized():
            raise HostlessError("Ray was shut down under this Cluster (ray.shutdown()): make a new Cluster()")
        return self._ray

    # ------------------------------------------------------------ nodes
    def nodes(self) -> list[str]:
        """The ids of the Ray nodes alive now (hex), in Ray's order."""
        return [str(n["NodeID"]) for n in self._up().nodes() if n.get("Alive")]

    def node(self, where: str | None = None) -> str:
        """A node id from ``where``: a node id (or a unique prefix of one), the name of a
        custom resource that exactly one alive node has, or None (the driver's node)."""
        alive = [n for n in self._up().nodes() if n.get("Alive")]
        if where is None:
            return str(self._ray.get_runtime_context().get_node_id())
        ids = [str(n["NodeID"]) for n in alive if str(n["NodeID"]).startswith(where)]
        if len(ids) == 1:
            return ids[0]
        having = [str(n["NodeID"]) for n in alive if where in n.get("Resources", {})]
        if len(having) == 1:
            return having[0]
        if len(having) > 1 or len(ids) > 1:
            raise ValueError(f"node {where!r} is ambiguous: it names {len(having) or len(ids)} alive nodes")
        raise ValueError(
            f"no alive Ray node is {where!r} (a node id, a prefix of one, or a custom resource of one node); "
            f"alive: {[str(n['NodeID'])[:8] for n in alive]}"
        )

    def label(self, node: str) -> str:
        """A short name for a node: its first custom resource's name, else its id's first 8 digits."""
        if node not in self._labels:
            lab = node[:8]
            for n in self._up().nodes():
                if str(n["NodeID"]) == node:
                    own = sorted(
                        r
                        for r in n.get("Resources", {})
                        if not r.startswith("node:")
                        and r not in ("CPU", "GPU", "memory", "object_store_memory")
                        and not r.startswith("accelerator_type")
                    )
                    lab = f"{own[0]}({node[:8]})" if own else node[:8]
            self._labels[node] = lab
        return self._labels[node]

    def host(self, node: str) -> Any:
        """The node host actor of ``node`` (a node id), started on first use and pinned there."""
        h = self._hosts.get(node)
        if h is None:
            self._up()
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            dom = f"{self._prefix}-{node[:16]}"  # the same name again after a lost host: replaced
            h = self._actor.options(scheduling_strategy=strategy).remote(self.label(node), dom, self.heap)
            info = self._ray.get(h.info.remote(), timeout=120)
            if info["node_id"] != node:
                self._ray.kill(h)
                raise HostlessError(f"the node host for {node[:8]} started on {info['node_id'][:8]}")
            self._hosts[node] = h
        return h

    def hosts(self) -> dict[str, Any]:
        """The node hosts started so far, by node id."""
        return dict(self._hosts)

    def forget(self, node: str) -> None:
        """Drop a node's host (dead, or to be replaced): the next :meth:`host` starts a new one."""
        h = self._hosts.pop(node, None)
        if h is not None:
            try:
                self._ray.kill(h)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def spawn(
        self, kind: str = "cpu", node: str | None = None, timeout: float = 60.0, **opts: Any
    ) -> RemoteAgent:
        """Spawn an agent of ``kind`` on ``node`` (see :meth:`node`) in that node's domain; the
        options are :func:`hostless.agents.spawn`'s."""
        nid = self.node(node)
        key = next(self._keys)
        info = self._ray.get(self.host(nid).spawn.remote(key, kind, opts), timeout=timeout)
        return RemoteAgent(self, nid, key, info)

    def graph(self) -> ClusterGraph:
        """A new graph whose stages run on this cluster's remote agents."""
        self._up()
        return ClusterGraph(self)

    def close(self) -> None:
        """Stop every node host (agents, parts and domains), then Ray if this cluster started it.
        Idempotent; the cluster refuses every later use (InvalidOperation)."""
        self._closed = True
        for node in list(self._hosts):
            h = self._hosts.pop(node)
            try:
                self._ray.get(h.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a dead host: its agents died with it
                pass
            try:
                self._ray.kill(h)
            except Exception:  # noqa: BLE001
                pass
        if self._owns_ray:
            self._ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ClusterGraph(Graph):
    """A :class:`~hostless.graph.Graph` whose stages run on :class:`RemoteAgent` s, on any
    nodes of one :class:`Cluster`.  Inputs, constants and stages are declared and checked
    as for a local graph; :meth:`compile` splits it by node."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(None)  # type: ignore[arg-type]  # no domain of its own: each node has one
        self.cluster = cluster

    def stage(
        self,
        name: str,
        agent: Agent | RemoteAgent,
        kernel: str | Callable[..., Any],
        inputs: Sequence[str],
        output: tuple[str, Sequence[int], Any],
        scalars: Sequence[Any] = (),
        arrays: str | None = None,
    ) -> ClusterGraph:
        """As :meth:`hostless.graph.Graph.stage`, on a remote agent of this cluster."""
        if not isinstance(agent, RemoteAgent):
            raise TypeError(
                f"stage {name!r}: a cluster graph's stages run on remote agents: cluster.spawn(kind, node)"
            )
        if agent.cluster is not self.cluster:
            raise ValueError(f"stage {name!r}: the agent belongs to another cluster")
        if arrays is not None:
            raise ValueError(
                f"stage {name!r}: GPU function stages (arrays=) are not carried across nodes yet"
            )
        super().stage(name, agent, kernel, inputs, output, scalars)  # type: ignore[arg-type]
        return self

    def compile(  # type: ignore[override]
        self,
        dispatch: str = "direct",
        data: str = "shared",
        inflight: int = 2,
        transport: str = "compiled",
        timeout: float = 30.0,
    ) -> ClusterCompiledGraph:
        """Split into node-local parts, compile each on its node's host in the given mode,
        and join them with Ray (``transport``: ``"compiled"``, a Ray Compiled Graph over the
        node hosts; ``"actors"``, one actor call per part and frame, tensors passed as object
        references: :mod:`hostless.cluster.compiled`).  ``inflight``: frames a
        :meth:`~ClusterCompiledGraph.stream` keeps in flight across the nodes; ``timeout``:
        the bound on one frame (a node's local run, and the driver's wait)."""
        if dispatch not in ("host", "direct"):
            raise ValueError("dispatch is 'host' or 'direct'")
        if data not in ("shared", "copy"):
            raise ValueError("data is 'shared' or 'copy'")
        if transport not in ("actors", "compiled"):
            raise ValueError("transport is 'actors' or 'compiled'")
        if not self.stages:
            raise ValueError("a graph needs at least one stage")
        if not self.inputs:
            raise ValueError("a cluster graph needs at least one input (it starts every frame)")
        if inflight < 1:
            raise ValueError("inflight must be >= 1")
        names = [*self.inputs, *self.constants, *(s.output for s in self.stages)]
        if FRAME_KEY in names:
            raise ValueError(f"{FRAME_KEY!r} is reserved (the frame number between nodes): rename the tensor")
        return ClusterCompiledGraph(
            self, dispatch, data, inflight, transport, timeout, next(self.cluster._graphs)
        )
