"""The dependency structure of a :class:`hostless.graph.Graph`: which stages feed which.

Stages are added in order and may only consume graph inputs, constants and the
outputs of earlier stages, so the order of addition is a topological order and
the graph has no cycle by construction.  Stage ``j`` depends on stage ``k``
(``k`` is a predecessor of ``j``) when ``j`` consumes ``k``'s output; a stage
with no predecessor is a root, one whose output no stage consumes is a sink.

In direct dispatch, a stage with predecessors is pushed (as a follow-up) by
exactly one of them, its *pusher*, so the stage is enqueued once per frame; it
waits on the others' timeline points.  Without placement the pusher is the
last predecessor in topological order, the host pushes the roots in order.

With placement (``agents``: each stage's agent), the plan makes sure that no
waiting packet is queued ahead of work it waits for.  An agent runs its queue
in order: a packet that waits blocks everything queued behind it.  Stage k,
pushed by p, waits on each other predecessor j; what j's signal needs and p's
completion does not imply (*late* work) is j and its ancestors that are not
p's (nor p): their packets, their copy packets (copy mode: on their own
agents, pushed when they finish) and the relays of their joins (on their
pushers' agents) may reach a queue *after* k does.  If late work runs where k
waits, k can sit ahead of it forever: the direct+copy deadlock of ``b``
(cpu2), ``a`` (cpu1), ``d = add(b, a)`` (cpu2), where ``a`` pushed ``d``
ahead of ``b``'s copies.  So for each stage with several predecessors the plan
takes the first of:

1. a pusher (the last predecessor first) such that no late work runs on k's
   agent (nor on the pusher's, where relays wait when k has more waits than a
   packet holds);
2. a pusher whose own agent runs no late work: every wait goes into relay
   packets there, which push k once its inputs are complete (k waits on
   nothing);
3. the pusher with the least late work where k waits (ties: the last).

A late *root* is harmless in shared mode when the host pushes it before the
roots p descends from (its packet is then ahead of anything p's chain
pushes, and it signals by itself); the plan orders the host's root pushes so
(:attr:`Dag.root_order`).  In copy mode it is not: its copy packets are pushed
when it finishes, behind whatever arrived meanwhile.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
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
    pushers: tuple[int | None, ...] = ()
    """The predecessor that pushes stage k in direct dispatch (None: a root); empty: the last."""
    relayed: frozenset[int] = frozenset()
    """Stages whose waits are all in relays on their pusher's agent (they wait on nothing)."""
    root_order: tuple[int, ...] = ()
    """The order in which the host pushes the roots; empty: ascending."""
    stuck: bool | None = None
    """With placement: True when an interleaving of one frame of the plan can leave every
    queue's head waiting (:func:`deadlocks`), False when none can, None: not explored."""
    unsafe: tuple[int, ...] = ()
    """Stages for which every candidate could deadlock (the plan fell back to rule 3)."""

    @classmethod
    def build(
        cls,
        outputs: Sequence[str],
        inputs: Sequence[Sequence[str]],
        agents: Sequence[Hashable] | None = None,
        copies: bool = False,
    ) -> Dag:
        """The structure of stages with these outputs and inputs (in order of addition;
        an input that is no stage's output is a graph input or a constant).  ``agents``
        (each stage's agent, any hashable identity): the direct-dispatch plan by placement
        (see the module's docstring), for copy mode when ``copies``; None: the last
        predecessor pushes, the roots go in ascending order."""
        producer = {o: k for k, o in enumerate(outputs)}
        preds = tuple(tuple(sorted({producer[i] for i in ins if i in producer})) for ins in inputs)
        succs = tuple(tuple(j for j in range(len(outputs)) if k in preds[j]) for k in range(len(outputs)))
        anc: list[frozenset[int]] = []
        for ps in preds:
            a: set[int] = set(ps)
            for p in ps:
                a |= anc[p]
            anc.append(frozenset(a))
        if agents is None:
            return cls(preds, succs, tuple(anc))
        if len(agents) != len(outputs):
            raise ValueError(f"agents: one per stage ({len(outputs)}), got {len(agents)}")
        plan = _Plan(preds, anc, agents, copies)
        order = plan.order()
        stuck = (
            deadlocks(preds, plan.pushers, plan.relayed, order, agents, copies)
            if len(preds) <= EXPLORE_STAGES
            else None
        )
        return cls(
            preds,
            succs,
            tuple(anc),
            tuple(plan.pushers),
            frozenset(plan.relayed),
            order,
            stuck,
            tuple(plan.unsafe),
        )

    @property
    def roots(self) -> list[int]:
        """Stages with no predecessor (the host submits them), in the order it pushes them."""
        if self.root_order:
            return list(self.root_order)
        return [k for k, ps in enumerate(self.preds) if not ps]

    @property
    def sinks(self) -> list[int]:
        """Stages no other stage consumes (a frame is done when they all are)."""
        return [k for k, ss in enumerate(self.succs) if not ss]

    def pusher(self, k: int) -> int | None:
        """The predecessor that pushes stage k in direct dispatch, None for a root."""
        if self.pushers:
            return self.pushers[k]
        return self.preds[k][-1] if self.preds[k] else None

    def others(self, k: int) -> tuple[int, ...]:
        """The predecessors of stage k that do not push it: k waits on their timeline points."""
        p = self.pusher(k)
        return tuple(j for j in self.preds[k] if j != p)

    def relay_groups(self, k: int) -> int:
        """Relay packets stage k's pusher pushes for it (each waits on up to two others)."""
        n = -(-len(self.others(k)) // MAX_PACKET_WAITS)
        return n if k in self.relayed else max(0, n - 1)


class _Plan:
    """The choice of the module's docstring, stage by stage in topological order (a stage's
    relays sit on its pusher's agent, which later stages' choices look at)."""

    def __init__(
        self,
        preds: Sequence[Sequence[int]],
        anc: Sequence[frozenset[int]],
        agents: Sequence[Hashable],
        copies: bool,
    ) -> None:
        self.preds, self.anc, self.agents, self.copies = preds, anc, agents, copies
        self.pushers: list[int | None] = []
        self.relayed: set[int] = set()
        self.before: set[tuple[int, int]] = set()  # (a, b): the host pushes root a before root b
        self.unsafe: list[int] = []
        for k, ps in enumerate(preds):
            if len(ps) < 2:
                self.pushers.append(ps[0] if ps else None)
            else:
                self.pushers.append(self._choose(k, ps))

    def _roots_of(self, k: int) -> set[int]:
        return {r for r in self.anc[k] | {k} if not self.preds[r]}

    def _relays_on(self, s: int) -> Hashable:
        p = self.pushers[s]
        if p is None or len(self.preds[s]) < 2:
            return None
        if s in self.relayed or len(self.preds[s]) - 1 > MAX_PACKET_WAITS:
            return self.agents[p]
        return None

    def _late(self, p: int, others: Sequence[int], where: set[Hashable]) -> tuple[int, set[tuple[int, int]]]:
        """(late work that runs in ``where``, root orderings that make the rest harmless)."""
        implied = self.anc[p] | {p}
        late = set().union(*(({j} | self.anc[j]) - implied for j in others))
        need: set[tuple[int, int]] = set()
        risky = 0
        for s in late:
            if self._relays_on(s) in where:
                risky += 1
            elif self.agents[s] in where:
                if not self.preds[s]:  # a root: the host pushes it before p's roots
                    need |= {(s, r) for r in self._roots_of(p)}
                risky += self.copies or bool(self.preds[s])  # copy mode: its copies come later
        return risky, need

    def _acyclic(self, extra: set[tuple[int, int]]) -> bool:
        edges = self.before | extra
        succ: dict[int, set[int]] = {}
        for a, b in edges:
            succ.setdefault(a, set()).add(b)
        state: dict[int, int] = {}

        def cyclic(v: int) -> bool:
            state[v] = 1
            for w in succ.get(v, ()):
                if state.get(w) == 1 or (state.get(w) is None and cyclic(w)):
                    return True
            state[v] = 2
            return False

        return not any(state.get(v) is None and cyclic(v) for v in list(succ))

    def _choose(self, k: int, ps: Sequence[int]) -> int:
        """The first candidate (pusher, relayed) that the exploration of every interleaving of
        stages 0..k (:func:`deadlocks`) finds safe, or, where that is too large to tell, whose
        late work runs nowhere it waits; else the fallback (3)."""
        agents = self.agents
        fallback: tuple[int, int] | None = None
        cands = [(p, False) for p in reversed(ps)] + [(p, True) for p in reversed(ps)]
        for p, relay in cands:  # 1 then 2 of the module's docstring, the last first
            others = [j for j in ps if j != p]
            many = len(others) > MAX_PACKET_WAITS
            where = {agents[p]} if relay else {agents[k]} | ({agents[p]} if many else set())
            risky, need = self._late(p, others, where)
            if not self._acyclic(need):
                risky, need = risky + 1, set()
            if not relay and (fallback is None or risky < fallback[0]):
                fallback = (risky, p)
            stuck = self._explore(k, p, relay, need)
            if stuck is False or (stuck is None and risky == 0):
                self.before |= need
                if relay:
                    self.relayed.add(k)
                return p
        assert fallback is not None
        self.unsafe.append(k)
        return fallback[1]  # 3

    def _explore(self, k: int, p: int, relay: bool, need: set[tuple[int, int]]) -> bool | None:
        """:func:`deadlocks` of stages 0..k with this candidate (None past EXPLORE_STAGES)."""
        if k >= EXPLORE_STAGES:
            return None
        pushers = [*self.pushers, p]
        relayed = self.relayed | ({k} if relay else set())
        saved = self.before
        self.before = saved | need
        order = [r for r in self.order() if r <= k]
        self.before = saved
        return deadlocks(self.preds[: k + 1], pushers, relayed, order, self.agents, self.copies)

    def order(self) -> tuple[int, ...]:
        """The roots in ascending order, moved only as the orderings taken require."""
        roots = [k for k, ps in enumerate(self.preds) if not ps]
        out: list[int] = []
        left = list(roots)
        while left:
            r = next(r for r in left if not any((a, r) in self.before for a in left if a != r))
            out.append(r)
            left.remove(r)
        return tuple(out)


_Pk = tuple[str, int, int]  # ("S", stage, 0), ("C", stage, copy), ("R", stage, relay)
_Queues = tuple[tuple[_Pk, ...], ...]
_State = tuple[int, _Queues, frozenset[_Pk], _Queues]

EXPLORE_STATES = 5000
"""States :func:`deadlocks` explores at most (past it, the plan keeps its rule)."""
EXPLORE_STAGES = 16
"""Graphs of more stages are planned by the rule alone (compile time stays in milliseconds)."""


def deadlocks(
    preds: Sequence[Sequence[int]],
    pushers: Sequence[int | None],
    relayed: set[int] | frozenset[int],
    root_order: Sequence[int],
    agents: Sequence[Hashable],
    copies: bool,
    budget: int = EXPLORE_STATES,
) -> bool | None:
    """Explore every interleaving of one frame of a direct-dispatch plan: the host pushing
    the roots in ``root_order``; each agent running the head of its queue once the packet's
    waits are complete, signalling, then pushing its follow-ups one by one (another agent
    may run in between); copy packets (copy mode) on the producer's agent, chained, the
    last signalling; relays on the pusher's agent.  False when every interleaving completes
    every packet; True when one reaches a state where nothing can run; None when ``budget``
    states did not tell.  (One frame in flight, one copy per successor.)"""
    n = len(preds)
    succs = [[j for j in range(n) if k in preds[j]] for k in range(n)]
    ncopies = [len(succs[k]) if copies else 0 for k in range(n)]  # one per successor (or per input)
    waits: dict[_Pk, tuple[_Pk, ...]] = {}
    follows: dict[_Pk, tuple[_Pk, ...]] = {}

    def done_of(j: int) -> _Pk:  # what a wait on stage j waits for
        return ("C", j, ncopies[j] - 1) if copies and ncopies[j] else ("S", j, 0)

    def entry(j: int) -> _Pk:  # what j's pusher pushes for it
        others = [i for i in preds[j] if i != pushers[j]]
        groups = -(-len(others) // MAX_PACKET_WAITS)
        nrel = groups if j in relayed else max(0, groups - 1)
        return ("R", j, 0) if nrel else ("S", j, 0)

    for j in range(n):
        others = [done_of(i) for i in preds[j] if i != pushers[j]]
        groups = [tuple(others[i : i + MAX_PACKET_WAITS]) for i in range(0, len(others), MAX_PACKET_WAITS)]
        last: tuple[_Pk, ...] = () if j in relayed or not groups else groups.pop()
        waits[("S", j, 0)] = last
        for g, grp in enumerate(groups):  # relays run in this order, then j
            waits[("R", j, g)] = grp
            follows[("R", j, g)] = (("R", j, g + 1),) if g + 1 < len(groups) else (("S", j, 0),)
        pushed = tuple(entry(i) for i in succs[j] if pushers[i] == j)
        if ncopies[j]:
            follows[("S", j, 0)] = (("C", j, 0),)
            for c in range(ncopies[j]):
                waits[("C", j, c)] = ()
                follows[("C", j, c)] = (("C", j, c + 1),) if c + 1 < ncopies[j] else pushed
        else:
            follows[("S", j, 0)] = pushed

    def where(x: _Pk) -> Hashable:
        kind, j, _ = x
        return agents[pushers[j]] if kind == "R" else agents[j]  # type: ignore[index]

    names = sorted({agents[j] for j in range(n)}, key=repr)
    total = len(waits)
    seen: set[_State] = set()
    empty: _Queues = tuple(() for _ in names)
    stack: list[_State] = [(0, empty, frozenset(), empty)]
    while stack:
        host, queues, done, pending = stack.pop()
        key = (host, queues, done, pending)
        if key in seen:
            continue
        seen.add(key)
        if len(seen) > budget:
            return None
        nxt: list[_State] = []
        if host < len(root_order):
            r = ("S", root_order[host], 0)
            q = names.index(where(r))
            nxt.append((host + 1, _put(queues, q, r), done, pending))
        for a in range(len(names)):
            if pending[a]:  # pushing its follow-ups: the next one lands
                x, rest = pending[a][0], pending[a][1:]
                nxt.append((host, _put(queues, names.index(where(x)), x), done, _set(pending, a, rest)))
            elif queues[a] and all(w in done for w in waits[queues[a][0]]):
                x = queues[a][0]
                q2 = _set(queues, a, queues[a][1:])
                nxt.append((host, q2, done | {x}, _set(pending, a, follows[x])))
        if not nxt:
            if len(done) < total:
                return True
            continue
        stack.extend(nxt)
    return False


def _put(t: _Queues, i: int, x: _Pk) -> _Queues:
    return t[:i] + ((*t[i], x),) + t[i + 1 :]


def _set(t: _Queues, i: int, v: tuple[_Pk, ...]) -> _Queues:
    return t[:i] + (v,) + t[i + 1 :]
