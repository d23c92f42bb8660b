"""Running frames on a compiled graph: :meth:`~FrameRunner.run`, :meth:`~FrameRunner.stream`,
and what a frame's failure, timeout or interruption leaves behind.

:class:`~hostless.compiled.CompiledGraph` builds a graph's slots (buffers, timelines,
packets, frame programs: :mod:`hostless.compiled`) and inherits how frames run from
:class:`FrameRunner` here.  Per frame, the host runs one of a slot's frame programs
(one C call); a failure is raised as :class:`~hostless.graph.StageFailed` naming the
frame and the stage after the agents were checked (an agent gone or replaced:
:class:`~hostless.graph.GraphInvalidated`) and the failed slot was renewed
(:mod:`hostless.renewal`), so the next frame runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import records, renewal
from .errors import CorruptDomain, HostlessError, InvalidOperation
from .graphparts import GraphInvalidated, StageFailed, _Slot, checked_inputs
from .queue import _timeout_ns
from .status import Status, timeline_failure
from .timeline import Timeline

if TYPE_CHECKING:
    from .compiled import CompiledGraph
    from .dag import Dag
    from .domain import Domain
    from .graph import Graph

__all__ = ["FrameRunner"]


class FrameRunner:
    """How a compiled graph runs frames (the base of :class:`~hostless.compiled.CompiledGraph`,
    which builds what is used here)."""

    # built by CompiledGraph
    g: Graph
    dom: Domain
    dag: Dag
    inflight: int
    slots: list[_Slot]
    frame: int
    _fast: bool
    _bound: bool
    _streams: int
    _closed: bool
    _invalid: GraphInvalidated | None
    _broken: HostlessError | None

    if TYPE_CHECKING:

        def _check_agents(self, thorough: bool = False) -> None: ...

        def _refast(self) -> None: ...

    def timelines_of(self, frame: int) -> list[Timeline]:
        """The stage timelines frame number ``frame`` signals (stage k's at index k, with the
        frame number): each frame in flight has its own (those of slot ``frame % inflight``),
        so a failed frame fails none of the others; a failed frame's are replaced."""
        return self.slots[frame % self.inflight].timelines

    @property
    def timelines(self) -> list[Timeline]:
        """The stage timelines of the last frame submitted: ``timelines_of(frame)``."""
        return self.timelines_of(self.frame)

    def _exec_checked(self, prog: tuple[Any, list[Any]], value: int, timeout: float | None) -> None:
        """:meth:`_exec`; a failure or timeout first checks whether an agent died or was
        replaced (GraphInvalidated, chained to the failure)."""
        self._checked(self._exec, prog, value, timeout)

    def _checked(self, fn: Callable[..., None], prog: tuple[Any, list[Any]], value: int, arg: Any) -> None:
        """``fn(prog, value, arg)`` for frame ``value``; a StageFailed or TimeoutError first
        checks whether an agent died or was replaced (GraphInvalidated, chained to the
        failure).  A StageFailed on the agents compiled for is a bad frame: the slot's
        timelines and packets are renewed (:func:`hostless.renewal.renew`) before it is
        raised, so the next frame runs.  A frame left in flight (a timeout, an exception
        from a signal handler) leaves its slot to be renewed before it is used again."""
        try:
            fn(prog, value, arg)
        except (StageFailed, TimeoutError) as e:
            try:
                self._check_agents(thorough=True)
            except GraphInvalidated as gi:
                raise gi from e
            if isinstance(e, StageFailed):
                renewal.renew(cast("CompiledGraph", self), [self.slots[value % self.inflight]], str(e))
            else:
                self._abandon(value)
            raise
        except BaseException:
            self._abandon(value)
            raise

    def _abandon(self, frame: int) -> None:
        """Frame ``frame`` may still be in flight and nobody will collect it: its slot's packets
        must not be patched for another frame while it runs, so the slot is renewed (fresh
        argument blocks and timelines) before its next use (:meth:`_unstale`)."""
        if self._invalid is None:
            self.slots[frame % self.inflight].stale = frame
            self._fast = False

    def _unstale(self, sl: _Slot) -> None:
        """Renew ``sl`` if a frame was abandoned on it (see :meth:`_abandon`)."""
        if sl.stale:
            why = "was left in flight (a timeout, an interrupt, a stream closed early)"
            renewal.renew(cast("CompiledGraph", self), [sl], f"frame {sl.stale} {why}")

    def _write_inputs(self, sl: _Slot, inputs: Mapping[str, np.ndarray]) -> None:
        for name, arr in checked_inputs(self.g.inputs, inputs).items():
            for v in sl.in_views[name]:
                if isinstance(v, np.ndarray):
                    v[...] = arr
                else:  # a device buffer: one host-to-device copy
                    v.from_host(arr)

    def _read_outputs(self, sl: _Slot) -> dict[str, np.ndarray]:
        return {name: v.copy() if isinstance(v, np.ndarray) else v.to_host() for name, v in sl.out_views}

    def _exec(self, prog: tuple[Any, list[Any]], value: int, timeout: float | None) -> None:
        """Run one of a slot's frame programs for frame ``value`` (one C call, the GIL
        released where an op blocks: a wait past 2 us, a full queue); StageFailed,
        TimeoutError and the push errors as the host path always raised them."""
        stop = prog[0].run(value, -1 if timeout is None else _timeout_ns(timeout))
        if stop is not None:
            self._stopped(prog, value, stop)

    def _stopped(self, prog: tuple[Any, list[Any]], value: int, stop: tuple[Any, ...]) -> None:
        """Raise what a frame program's stop (``FrameProgram.run``'s tuple) means."""
        k: int = prog[1][stop[0]]
        why, word = stop[1], stop[2]
        tl = self.timelines_of(value)
        if why == "failed":  # stage k's timeline failed (or holds garbage)
            st = timeline_failure(word)
            if st is None:
                raise CorruptDomain(
                    f"timeline {tl[k].handle:#x} holds an invalid word {word:#x} "
                    "(written by a buggy or hostile participant)"
                )
            raise self._failure(k, st, value)
        # a sleep slice ended with a watched timeline failed, or the wait timed out
        for j in sorted(self.dag.ancestors[k] | {k}):
            f = tl[j].failure
            if f is not None:
                raise StageFailed(self.g.stages[j].name, f, records.read(self.dom, tl[j].handle), value)
        if why == "timeout":
            raise TimeoutError(
                f"timeline {tl[k].handle:#x} did not reach {value} within the timeout"
            )
        raise CorruptDomain(f"a watched timeline held the failed word {word:#x}, then no failure")

    def _failure(self, k: int, st: Status, frame: int) -> StageFailed:
        """The error for stage k failing with ``st`` in ``frame``: it names the earliest failed
        ancestor of k in topological order (in direct mode a failure is passed on
        to the descendants, and the stage where it started is the one to report)."""
        tl = self.timelines_of(frame)
        for j in sorted(self.dag.ancestors[k]):
            f = tl[j].failure
            if f is not None:
                return StageFailed(self.g.stages[j].name, f, records.read(self.dom, tl[j].handle), frame)
        return StageFailed(self.g.stages[k].name, st, records.read(self.dom, tl[k].handle), frame)

    def run(self, inputs: Mapping[str, np.ndarray], timeout: float | None = 30.0) -> dict[str, np.ndarray]:
        """Run one frame; returns the graph outputs (copies).  StageFailed on failure.

        The frame's packets are pushed, (host dispatch) its stages waited for and
        copied between, and its sinks waited for by one call into the engine.  When
        every input is a NumPy array of its input's dtype and shape (C-contiguous), that
        call also checks the agents, writes the inputs and copies the outputs out
        (``FrameProgram.frame``); otherwise, or when it declines, the same steps run
        here in Python."""
        if self._fast:
            f = self.frame + 1
            self.frame = f  # before the call: a frame that raised half-way is never reused
            prog = self.slots[f % self.inflight].run
            try:
                r = prog[0].frame(inputs, f, timeout)
            except BaseException:  # an interrupt (a signal handler's exception) while it waited
                self._abandon(f)
                raise
            if r.__class__ is dict:
                return r
            if r is not None:
                return self._ran(self.slots[f % self.inflight], prog, f, r)
            self.frame = f - 1  # declined, nothing done: the general path
        return self._run(inputs, timeout)

    def _ran(self, sl: _Slot, prog: tuple[Any, list[Any]], f: int, r: Any) -> dict[str, np.ndarray]:
        """The end of a frame ``FrameProgram.frame`` ran but did not return outputs for:
        False (an agent's words changed while it ran) or a stop tuple."""
        if r is not False:
            self._checked(self._stopped, prog, f, r)
        self._check_agents()
        return self._read_outputs(sl)

    def _run(self, inputs: Mapping[str, np.ndarray], timeout: float | None) -> dict[str, np.ndarray]:
        """:meth:`run`'s general path (in Python around the frame program)."""
        self._check()
        if self._streams:
            raise InvalidOperation(
                "a stream of this compiled graph has frames in flight: exhaust or close() it before run()"
            )
        self._check_agents()
        sl = self.slots[(self.frame + 1) % self.inflight]
        self._unstale(sl)
        self.frame += 1
        self._write_inputs(sl, inputs)
        self._exec_checked(sl.run, self.frame, timeout)
        self._check_agents()  # an agent replaced while the frame ran: no frame from this graph
        self._refast()
        return self._read_outputs(sl)

    def stream(
        self, frames: Iterable[Mapping[str, np.ndarray]], timeout: float | None = 30.0
    ) -> Iterator[dict[str, np.ndarray]]:
        """Run frames with up to ``inflight`` in flight; yields outputs in order.  A frame is a
        mapping input name -> array, or, for a graph with one input, the array itself.

        A failed frame raises StageFailed (naming it) and ends the stream: the frames
        submitted after it (up to ``inflight - 1``) are dropped, and the graph runs the
        next frames given to ``run`` or another ``stream``.  While a stream has frames in
        flight, ``run`` and a second stream raise InvalidOperation (they would reuse its
        slots): exhaust or ``close()`` it first."""
        self._check()
        if self._streams:
            raise InvalidOperation(
                "another stream of this compiled graph has frames in flight: exhaust or close() it first"
            )
        self._check_agents()
        pending: list[tuple[int, _Slot]] = []
        self._streams += 1
        self._fast = False  # a run() meanwhile takes the general path, which refuses
        fast = self._bound_ok()  # (what changes it while the stream runs also ends it, or closes)
        try:
            for inp in frames:
                if not isinstance(inp, Mapping):
                    inp = self._one_input(inp)
                if len(pending) == self.inflight:
                    out = self._collect(pending[0][1], pending[0][0], timeout, fast)
                    pending.pop(0)
                    yield out
                sl = self.slots[(self.frame + 1) % self.inflight]
                if sl.stale:
                    self._unstale(sl)
                    fast = self._bound_ok()
                self.frame += 1
                pending.append((self.frame, sl))
                r = sl.submit[0].frame(inp, self.frame, timeout) if fast and not self._closed else None
                if r is None:  # the general path
                    self._check()
                    self._check_agents()
                    self._write_inputs(sl, inp)
                    self._exec_checked(sl.submit, self.frame, timeout)
                elif r.__class__ is not dict:
                    self._ran(sl, sl.submit, self.frame, r)
            while pending:
                out = self._collect(pending[0][1], pending[0][0], timeout, fast)
                pending.pop(0)
                yield out
        finally:
            self._streams -= 1
            for v, sl in pending:  # submitted, never collected: maybe in flight
                if sl.first <= v and not sl.stale:  # (not renewed since: its frame failed)
                    self._abandon(v)
            self._refast()

    def _one_input(self, arr: Any) -> dict[str, Any]:
        """A bare array as the frame of a graph with one input; TypeError otherwise."""
        if len(self.g.inputs) != 1:
            raise TypeError(
                f"a frame is a mapping input name -> array (the graph's inputs are {sorted(self.g.inputs)}), "
                f"got {type(arr).__name__}"
            )
        return {next(iter(self.g.inputs)): arr}

    def _bound_ok(self) -> bool:
        """Whether the slots' one-call programs may run a stream's frame."""
        return self._bound and self._invalid is None and self._broken is None

    def _collect(self, sl: _Slot, v: int, timeout: float | None, fast: bool) -> dict[str, np.ndarray]:
        """Wait for frame ``v`` of a stream (slot ``sl``) and return its outputs (``fast``: in
        one call of the slot's wait program)."""
        r = sl.wait[0].frame(None, v, timeout) if fast and not self._closed else None
        if r.__class__ is dict:
            return r
        if r is not None:
            return self._ran(sl, sl.wait, v, r)
        self._check()
        self._exec_checked(sl.wait, v, timeout)
        self._check_agents()
        return self._read_outputs(sl)

    def _check(self) -> None:
        if self._closed:
            raise HostlessError("compiled graph is closed")
        if self._broken is not None:
            raise self._broken
