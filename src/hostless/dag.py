"""The dependency structure of a :class:`hostless.graph.Graph`: which stages feed which.

Stages are added in order and may only consume graph inputs, constants and the
outputs of earlier stages, so the order of addition is a topological order and
the graph has no cycle by construction.  Stage ``j`` depends on stage ``k``
(``k`` is a predecessor of ``j``) when ``j`` consumes ``k``'s output; a stage
with no predecessor is a root, one whose output no stage consumes is a sink.

In direct dispatch, a stage with predecessors is pushed (as a follow-up) by
exactly one of them, its *pusher*: the last one in topological order, so the
stage is enqueued once per frame; it waits on the others' timeline points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Dag", "MAX_PACKET_WAITS"]

MAX_PACKET_WAITS = 2
"""Timeline points one packet can wait on (``struct hl_packet.wait[2]``)."""


@dataclass(frozen=True)
class Dag:
    """Predecessors, successors, pushers and ancestors of a graph's stages (by index)."""

    preds: tuple[tuple[int, ...], ...]
    """Stages whose outputs stage k consumes, ascending (each listed once)."""
    succs: tuple[tuple[int, ...], ...]
    """Stages that consume stage k's output, ascending."""
    ancestors: tuple[frozenset[int], ...]
    """Every stage that stage k depends on, directly or not."""

    @classmethod
    def build(cls, outputs: Sequence[str], inputs: Sequence[Sequence[str]]) -> Dag:
        """The structure of stages with these outputs and inputs (in order of addition;
        an input that is no stage's output is a graph input or a constant)."""
        producer = {o: k for k, o in enumerate(outputs)}
        preds = tuple(tuple(sorted({producer[i] for i in ins if i in producer})) for ins in inputs)
        succs = tuple(tuple(j for j in range(len(outputs)) if k in preds[j]) for k in range(len(outputs)))
        anc: list[frozenset[int]] = []
        for ps in preds:
            a: set[int] = set(ps)
            for p in ps:
                a |= anc[p]
            anc.append(frozenset(a))
        return cls(preds, succs, tuple(anc))

    @property
    def roots(self) -> list[int]:
        """Stages with no predecessor (the host submits them)."""
        return [k for k, ps in enumerate(self.preds) if not ps]

    @property
    def sinks(self) -> list[int]:
        """Stages no other stage consumes (a frame is done when they all are)."""
        return [k for k, ss in enumerate(self.succs) if not ss]

    def pusher(self, k: int) -> int | None:
        """The predecessor that pushes stage k in direct dispatch (the last one), None for a root."""
        return self.preds[k][-1] if self.preds[k] else None

    def others(self, k: int) -> tuple[int, ...]:
        """The predecessors of stage k that do not push it: k waits on their timeline points."""
        return self.preds[k][:-1]
