"""A node host: the Ray actor that holds one node's domain, its agents and its parts of graphs.

One per Ray node a cluster uses, pinned to that node (:mod:`hostless.cluster`
starts it with a hard node affinity).  It creates the node's own domain
(``Domain.create(..., replace_stale=True, unlink_on_close=True)``: a domain
left by a host killed before is replaced), spawns the node's agents in it (they
die with the host: an agent exits when its spawner does) and compiles and runs
the node-local parts of cluster graphs (:mod:`hostless.cluster.partition`) as
ordinary hostless graphs: shared memory and direct dispatch inside the node.

Between nodes, a part's inputs arrive as the arguments of :meth:`NodeHost.run`
(deserialized by Ray from the edge's bytes) and are written into the part's
input buffers; its outputs leave as :meth:`NodeHost.run`'s return values.  A
failure is returned, not raised: a :class:`Failure` takes the place of every
output of the failed part, and a part given a failure passes it on without
running, so the driver sees the stage that failed first, its node and why.

This class is plain Python; :mod:`hostless.cluster` makes it a Ray actor.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import agents
from ..agents import Agent
from ..domain import Domain
from ..graph import CompiledGraph, Graph, StageFailed
from ..stagefn import Described

__all__ = ["NodeHost", "Failure", "PartSpec", "FRAME_KEY"]


FRAME_KEY = "__hostless_frame__"
"""The key of the frame number in the dicts parts give each other (the compiled transport
binds the number to the parts the driver feeds only; the others read it here)."""


@dataclass(frozen=True)
class Failure:
    """A frame's failure, travelling in place of a part's outputs to the driver."""

    stage: str
    status: str
    error: str | None
    node: str
    frame: int | None


@dataclass(frozen=True)
class PartSpec:
    """What a node host needs to build one part: its stages (name, agent key, kernel: a
    built-in's name or a described function, inputs, output, shape, dtype, scalars), its
    inputs' shapes, its constants, what it returns per edge out, and the graph's mode."""

    stages: tuple[
        tuple[str, int, str | dict[str, Any], tuple[str, ...], str, tuple[int, ...], str, tuple[Any, ...]],
        ...,
    ]
    inputs: tuple[tuple[str, tuple[int, ...], str], ...]
    """The part's inputs in the order :meth:`NodeHost.run` receives them: the driver's one
    array each, then one dict per edge from an earlier part."""
    driver_inputs: int
    """How many of ``inputs`` come from the driver (one argument each)."""
    edges_in: tuple[tuple[str, ...], ...]
    """The names each later argument (a dict from an earlier part) carries."""
    constants: dict[str, np.ndarray]
    gives: tuple[tuple[str, ...], ...]
    """The names each return value carries (one per edge out)."""
    dispatch: str
    data: str
    timeout: float


class NodeHost:
    """One node's hostless: its domain, its agents, the parts of graphs it runs."""

    def __init__(self, label: str, domain: str, heap: str) -> None:
        self.label = label
        try:  # a host of this cluster that died on this node left its domain: replaced when stale
            self.dom = Domain.create(domain, heap=heap, unlink_on_close=True, replace_stale=True, label=label)
        except FileExistsError:  # still used (its agents not gone yet): a name of its own
            domain = f"{domain}-{os.getpid()}"
            self.dom = Domain.create(domain, heap=heap, unlink_on_close=True, replace_stale=True, label=label)
        self.agents: dict[int, Agent] = {}
        self.parts: dict[tuple[int, int], tuple[CompiledGraph, PartSpec]] = {}
        self.bytes_in = 0
        """Bytes of tensors received from earlier parts through Ray (argument dicts)."""
        self.bytes_out = 0
        self.run_ns: deque[int] = deque(maxlen=100_000)
        """How long each part's local frame took here (``CompiledGraph.run``), newest last."""

    # ------------------------------------------------------------ what it is
    def info(self) -> dict[str, Any]:
        """The host's node, process, domain and agents (for the driver's checks and plan)."""
        node = ""
        # the actor runs under Ray; called directly (tests, a process of its own) there is no
        # node.  Never ask Ray's runtime context first: outside Ray that call runs ray.init(),
        # which joins whatever cluster /tmp/ray/ray_current_cluster names (another process's,
        # perhaps gone: it hung; when that cluster stopped, Ray ended this process) or starts one
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            try:
                node = ray.get_runtime_context().get_node_id()
            except Exception:  # noqa: BLE001 - a driver, or Ray shutting down
                node = ""
        return {
            "label": self.label,
            "node_id": node,
            "pid": os.getpid(),
            "domain": self.dom.name,
            "agents": {k: {"kind": a.kind, "id": a.id, "pid": a.proc.pid} for k, a in self.agents.items()},
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }

    def shm_maps(self) -> dict[int, list[str]]:
        """The /dev/shm files this host and each of its agents map (from /proc/PID/maps):
        the proof that a node's processes touch their own domain only."""
        out: dict[int, list[str]] = {}
        for pid in [os.getpid(), *(a.proc.pid for a in self.agents.values())]:
            files: set[str] = set()
            try:
                with open(f"/proc/{pid}/maps") as f:
                    for line in f:
                        parts = line.split(maxsplit=5)
                        if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                            files.add(parts[5].strip().removesuffix(" (deleted)"))
            except OSError:
                continue
            out[pid] = sorted(files)
        return out

    def timings(self, clear: bool = True) -> list[int]:
        """The local frame times recorded since the last clear (ns): what the node's own
        hostless graph took, without Ray (for the cluster benchmark)."""
        out = list(self.run_ns)
        if clear:
            self.run_ns.clear()
        return out

    # ------------------------------------------------------------ agents
    def spawn(self, key: int, kind: str, opts: dict[str, Any]) -> dict[str, Any]:
        """Spawn an agent of ``kind`` in this node's domain under ``key``; returns what the
        driver's handle shows of it (participant id, pid, user kernels, device)."""
        if key in self.agents:
            raise ValueError(f"agent key {key} is taken on node {self.label}")
        a = agents.spawn(self.dom, kind, **opts)
        self.agents[key] = a
        return {
            "id": a.id,
            "pid": a.proc.pid,
            "kind": a.kind,
            "native": a.native,
            "user_kernels": dict(a.user_kernels),
            "device": a.device,
        }

    def stop_agent(self, key: int) -> None:
        """Stop the agent ``key`` (a STOP packet; it leaves the domain)."""
        a = self.agents.pop(key)
        a.stop()

    # ------------------------------------------------------------ parts
    def compile(self, gid: int, index: int, spec: PartSpec) -> str:
        """Build part ``index`` of graph ``gid`` as a local graph and compile it; returns its plan."""
        g = Graph(self.dom)
        for name, shape, dtype in spec.inputs:
            g.input(name, shape, dtype)
        for name, value in spec.constants.items():
            g.constant(name, value)
        for name, key, kernel, ins, out, shape, dtype, scalars in spec.stages:
            agent = self.agents.get(key)
            if agent is None:
                raise KeyError(
                    f"stage {name!r}: no agent {key} on node {self.label} (stopped, or a host restart)"
                )
            k: str | Callable[..., Any] = Described(kernel) if isinstance(kernel, dict) else kernel
            g.stage(name, agent, k, list(ins), (out, shape, dtype), scalars=list(scalars))
        outputs = tuple(dict.fromkeys(n for names in spec.gives for n in names))
        old = self.parts.pop((gid, index), None)
        if old is not None:
            old[0].close()
        cg = g.compile(dispatch=spec.dispatch, data=spec.data, inflight=1, outputs=outputs)
        self.parts[(gid, index)] = (cg, spec)
        return cg.plan()

    def run(self, gid: int, index: int, frame: int | None, *args: Any) -> Any:
        """Run one frame of part ``index``: the driver's input arrays, then one dict per edge
        from an earlier part; returns one value per edge out (a tuple when several): a dict
        of its tensors (and the frame number under :data:`FRAME_KEY`), or a :class:`Failure`
        (this part's, or one it was given).  ``frame`` None: the number the first dict carries."""
        cg, spec = self.parts[(gid, index)]
        n = len(spec.gives)
        failed = next((a for a in args if isinstance(a, Failure)), None)
        if frame is None:
            first = args[spec.driver_inputs] if len(args) > spec.driver_inputs else None
            frame = first.get(FRAME_KEY) if isinstance(first, dict) else None
        if failed is None:
            inputs: dict[str, Any] = {}
            for (name, _, _), arr in zip(
                spec.inputs[: spec.driver_inputs], args[: spec.driver_inputs], strict=True
            ):
                inputs[name] = arr
            for names, d in zip(spec.edges_in, args[spec.driver_inputs :], strict=True):
                for name in names:
                    inputs[name] = d[name]
                    self.bytes_in += int(np.asarray(d[name]).nbytes)
            try:
                t0 = time.perf_counter_ns()
                outs = cg.run(inputs, timeout=spec.timeout)
                self.run_ns.append(time.perf_counter_ns() - t0)
            except StageFailed as e:
                failed = Failure(e.stage, e.status.name, e.error, self.label, frame)
            except TimeoutError as e:
                failed = Failure("?", "TIMEOUT", str(e), self.label, frame)
        if failed is not None:
            return failed if n == 1 else (failed,) * n
        res = []
        for names in spec.gives:
            d = {name: outs[name] for name in names}
            self.bytes_out += sum(int(v.nbytes) for v in d.values())
            res.append({**d, FRAME_KEY: frame})
        return res[0] if n == 1 else tuple(res)

    def release(self, gid: int) -> None:
        """Close the parts of graph ``gid`` (their buffers, packets and timelines)."""
        for key in [k for k in self.parts if k[0] == gid]:
            self.parts.pop(key)[0].close()

    def shutdown(self) -> None:
        """Close every part, stop every agent, close the domain (its file is removed)."""
        for cg, _ in self.parts.values():
            cg.close()
        self.parts.clear()
        for a in self.agents.values():
            try:
                a.stop()
            except Exception:  # noqa: BLE001 - an agent already gone
                pass
        self.agents.clear()
        self.dom.close()
