"""A compiled graph after a bad frame: fresh timelines and packets, the old ones retired.

Why a reset is needed: each stage signals its slot's timeline with the frame number,
and a failed timeline stays failed (the ABI's rule: its word becomes 2**62 | status,
larger than every value, so every waiter of every later point wakes with the
status).  Left alone, one failed frame makes every later frame on its slot fail at
once with the same error.

What the reset does (:func:`renew`, called by :class:`hostless.compiled.CompiledGraph`
when a frame failed with :class:`~hostless.graph.StageFailed` and its agents are the
ones compiled for): it replaces, it repairs nothing in place.  The failed frame's slot
gets a fresh timeline per stage, owned by the same agent (so the agent's death still
fails it with OWNER_DIED), and its packets, argument blocks (with the follow-ups they
carry) and frame programs are built again on them, exactly as ``compile`` built them;
the slot's data buffers, the constants and the agents' loaded functions are kept, and
so are the other slots and the frames in flight on them (each slot has its own
timelines, so they were not failed).  The same reset renews a slot whose frame was left
in flight (a timeout, an interrupt, a stream closed early) before the slot is used
again: its late packets would otherwise read argument-block words patched for the next
frame.

Who may reset: the compiling host alone, the participant that holds every object the
graph is made of.  It writes nothing it does not hold (a failed timeline is never
un-failed: other holders may be waiting on it), asks no agent for anything (the engine
lets a participant create objects owned by another live one, as ``compile`` does), and
what runs next is what the host's :class:`~hostless.graph.Graph` names: nothing read
from the domain chooses code.  An agent that died or was replaced is not a bad frame:
the caller checks the agents first, and such a graph stays invalid
(:class:`~hostless.graph.GraphInvalidated`) until compiled again.

When the old objects go: packets of the failed frame may still be queued or running
when the failure is raised (a branch that does not depend on the failed stage).  They
keep running against the old argument blocks and timelines, which are therefore
*retired*, not released, and they write the slot's data buffers in the same per-stage
order as before: each stage runs on one agent, which completes its queue's packets in
order, and a stage's packets are pushed in frame order (by the host, or by the
previous stage's packets, inductively), so a later frame never reads a straggler's
write.  A retired generation is released at the next reset of its slot that finds a
frame of the current generation finished (every timeline of the slot, stages' and
copies', reached the generation's first frame): every packet of an earlier
generation was ahead of those in its agent's queue, so it has been processed.  At
most :data:`MAX_RETIRED` generations are kept per slot (consecutive failed frames with
none finished in between); past that the oldest is released anyway: a packet still
queued that names one of its objects then fails on the stale handle (every agent
checks a handle's generation; the CPU agents hold what a running packet names).
``close`` releases them all.  The ordering argument assumes in-order agents (the CPU
and NPU agents are; a GPU agent that completes packets out of order would need its own
proof).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .graphparts import GraphResetFailed, Retired, _Slot
from .timeline import Timeline

if TYPE_CHECKING:
    from .compiled import CompiledGraph

__all__ = ["MAX_RETIRED", "reached", "renew"]

MAX_RETIRED = 8
"""Retired generations a compiled graph keeps while no frame finishes between failures."""


def reached(timelines: Sequence[Timeline], first: int) -> bool:
    """Whether every timeline reached ``first`` (before it failed, for one that failed):
    then some frame numbered ``first`` or later finished every stage and copy chain."""
    return all(t.value >= first for t in timelines)


def renew(cg: CompiledGraph, slots: list[_Slot], what: str) -> None:
    """Reset ``slots`` of ``cg`` (a failed frame's, or one whose frame was left in flight:
    ``what`` says which, for the error): new timelines, the slot's packets and frame
    programs built on them, the old ones retired (see the module).  The other slots,
    and the frames in flight on them, are left alone.

    Raises GraphInvalidated when an agent is found gone meanwhile, GraphResetFailed
    (chained to the cause) when the objects cannot be made; either way the graph
    returns no frame until compiled again."""
    for sl in slots:
        try:
            new = cg._new_timelines()
        except BaseException as e:
            cg._fast = False
            cg._check_agents(thorough=True)  # an owner that died since: GraphInvalidated
            cg._broken = _broken(what, e)
            raise cg._broken from e
        old = Retired(sl.timelines + list(sl.copied.values()), sl.owned, sl.first)
        if reached(old.timelines, old.first):  # a frame on them finished: nothing older is in use
            for r in sl.retired:
                r.release()
            sl.retired = []
        sl.retired.append(old)
        sl.timelines, sl.copied = new
        sl.owned, sl.scratch, sl.stores = [], [], []
        sl.first, sl.stale = cg.frame + 1, 0
        cg._fast = False
        try:
            cg._build_packets(sl)
            cg._build_programs(sl)
            cg._renewed(sl)
        except BaseException as e:  # what was built is in the slot: close releases it
            cg._broken = _broken(what, e)
            raise cg._broken from e
        while len(sl.retired) > MAX_RETIRED:
            sl.retired.pop(0).release()
    try:
        cg._bound = cg._bind_io()
    except BaseException as e:
        cg._broken = _broken(what, e)
        raise cg._broken from e
    cg._refast()


def _broken(what: str, e: BaseException) -> GraphResetFailed:
    return GraphResetFailed(
        f"{what} -- and the graph could not be reset for the next frame ({type(e).__name__}: {e}); "
        "it returns no frame: close it and compile it again with g.compile()"
    )
