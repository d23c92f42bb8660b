"""How a graph over nodes splits into node-local parts joined by Ray edges (pure, no Ray).

A *part* is a set of stages on one node that run as one local hostless graph
(compiled by that node's host: shared memory and direct dispatch inside).  Parts
are formed in the graph's topological order (the order stages were added): a
stage joins the latest part of its node when every stage it reads from on other
nodes is in an earlier part, else it opens a new part of its node.  So every
edge between parts goes from an earlier part to a later one: the parts form a
DAG, and a chain ``a(n1) -> b(n2) -> c(n1)`` gives three parts (n1, n2, n1), not
a cycle between two nodes.

An *edge* carries, once per frame, the tensors one part (or the driver: graph
inputs) gives another part (or the driver: graph outputs); a tensor read by
several stages of one part crosses once.  The edges are what Ray carries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Part", "Edge", "DRIVER", "split"]

DRIVER = -1
"""The driver as an edge's end: it sends graph inputs and receives graph outputs."""


@dataclass(frozen=True)
class Edge:
    """The tensors ``src`` gives ``dst`` each frame (parts by index; :data:`DRIVER`)."""

    src: int
    dst: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class Part:
    """Stages (indices into the graph's stages, in order) that one node runs as one local graph."""

    index: int
    node: str
    stages: tuple[int, ...]
    constants: tuple[str, ...]
    """Constants its stages read (each part that reads one holds its own copy)."""
    takes: tuple[Edge, ...]
    """Edges into it: the driver's (graph inputs) first, then earlier parts', by source."""
    gives: tuple[Edge, ...]
    """Edges out of it: later parts', by destination, then the driver's (graph outputs) last."""

    @property
    def inputs(self) -> tuple[str, ...]:
        """The local graph's inputs, in the order of its edges in."""
        return tuple(n for e in self.takes for n in e.names)

    @property
    def outputs(self) -> tuple[str, ...]:
        """What the local graph returns each frame (every tensor an edge out carries, once)."""
        return tuple(dict.fromkeys(n for e in self.gives for n in e.names))


def split(
    nodes: Sequence[str],
    outputs: Sequence[str],
    reads: Sequence[Sequence[str]],
    inputs: Sequence[str],
    constants: Sequence[str],
) -> list[Part]:
    """The parts of a graph whose stage k runs on ``nodes[k]``, writes ``outputs[k]`` and
    reads ``reads[k]`` (graph inputs, constants and earlier outputs).  Graph outputs are the
    stage outputs no stage reads (as in :mod:`hostless.dag`)."""
    producer = {o: k for k, o in enumerate(outputs)}
    part_of: list[int] = []
    members: list[list[int]] = []
    part_node: list[str] = []
    latest: dict[str, int] = {}
    for k, node in enumerate(nodes):
        cross = [part_of[producer[i]] for i in reads[k] if i in producer and nodes[producer[i]] != node]
        p = latest.get(node)
        if p is None or any(q > p for q in cross):
            p = len(members)
            members.append([])
            part_node.append(node)
            latest[node] = p
        part_of.append(p)
        members[p].append(k)
    read_anywhere = {i for r in reads for i in r}
    sinks = [o for o in outputs if o not in read_anywhere]
    consts = set(constants)
    graph_inputs = set(inputs)
    parts: list[Part] = []
    for p, ks in enumerate(members):
        own = {outputs[k] for k in ks}
        need: dict[int, list[str]] = {}  # source part (or DRIVER) -> names, in first-read order
        used_consts: list[str] = []
        for k in ks:
            for i in reads[k]:
                if i in own:
                    continue
                if i in consts:
                    if i not in used_consts:
                        used_consts.append(i)
                    continue
                src = DRIVER if i in graph_inputs else part_of[producer[i]]
                names = need.setdefault(src, [])
                if i not in names:
                    names.append(i)
        takes = tuple(Edge(s, p, tuple(need[s])) for s in sorted(need))
        gives_to: dict[int, list[str]] = {}
        for j, ls in enumerate(members):
            if j == p:
                continue
            for k in ls:
                for i in reads[k]:
                    if i in own:
                        names = gives_to.setdefault(j, [])
                        if i not in names:
                            names.append(i)
        gives = [Edge(p, j, tuple(gives_to[j])) for j in sorted(gives_to)]
        mine = [outputs[k] for k in ks if outputs[k] in sinks]
        if mine:
            gives.append(Edge(p, DRIVER, tuple(mine)))
        parts.append(Part(p, part_node[p], tuple(ks), tuple(used_consts), takes, tuple(gives)))
    return parts


def describe(parts: Sequence[Part], stage_names: Sequence[str], labels: Mapping[str, str]) -> list[str]:
    """One line per part and per edge: what :meth:`ClusterCompiledGraph.plan` prints about
    where stages run and what crosses between nodes (``labels``: node key -> a short name)."""
    lines = []
    for pt in parts:
        names = ", ".join(stage_names[k] for k in pt.stages)
        lines.append(
            f"  part {pt.index} on node {labels.get(pt.node, pt.node)}: {names} (local edges: shared memory)"
        )
    for pt in parts:
        for e in pt.takes:
            src = "driver" if e.src == DRIVER else f"part {e.src} ({labels.get(parts[e.src].node, '?')})"
            lines.append(
                f"  ray edge {src} -> part {pt.index} ({labels.get(pt.node, '?')}): {', '.join(e.names)}"
            )
        for e in pt.gives:
            if e.dst == DRIVER:
                lines.append(
                    f"  ray edge part {pt.index} ({labels.get(pt.node, '?')}) -> driver: {', '.join(e.names)}"
                )
    return lines
