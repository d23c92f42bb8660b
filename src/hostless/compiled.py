"""A compiled graph (:mod:`hostless.graph` describes the modes, the DAG, the frame
program and failures): :class:`CompiledGraph` builds the buffers, packets, timelines
and frame programs of every frame in flight; it runs frames (:meth:`CompiledGraph.run`,
:meth:`CompiledGraph.stream`) as :class:`hostless.running.FrameRunner` says."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import ert, lowlevel, segments, sizes, trace
from ._abi import C
from .agents import Agent
from .buffer import Buffer, bytes_buffer
from .dag import MAX_PACKET_WAITS, Dag
from .errors import DeviceHeapFull, HostlessError, OutOfMemory
from .graphparts import (
    GraphInvalidated,
    GraphTooLarge,
    Stage,
    _Ident,
    _scalar_word,
    _Slot,
    _store,
    _view,
)
from .placement import place_tensors
from .running import FrameRunner
from .segments import GpuSegment
from .status import Status
from .timeline import Timeline
from .wire import FO_PACKET, PK_WAIT_VALUE, Follow, FrameOps, Kernargs, Packet, PacketType, follow_offset

if TYPE_CHECKING:
    from .graph import Graph

_SLICE_S = 0.05
"""A wait for a stage sleeps in slices this long; after each, the host checks the
stage's ancestors for a failure (a failure passed on through relays past the
agents' follow-up depth never reaches the stage's own timeline)."""


class CompiledGraph(FrameRunner):
    """A graph bound to buffers and packets: :meth:`run` and :meth:`stream`."""

    def __init__(
        self, g: Graph, dispatch: str, data: str, inflight: int, outputs: tuple[str, ...] = ()
    ) -> None:
        self.g, self.dispatch, self.data, self.inflight = g, dispatch, data, inflight
        dom = g.dom
        self.dom = dom
        # the agents as compiled for, recorded before anything is built for them
        self._invalid: GraphInvalidated | None = None
        self._fast = False  # run's one-call path (set once everything is built: _bind_io)
        self._bound = False  # whether the slots' frame programs can do the host's whole frame
        self._streams = 0  # open streams with frames in flight (run() waits for none of them)
        self._idents = self._identities()
        # Python stage functions: loaded into their agents once, here (ImportError etc. surface now)
        self.kids: dict[int, int] = {
            k: s.agent.load_function(s.kernel, s.scalars)
            for k, s in enumerate(g.stages)
            if callable(s.kernel)
        }
        # the pushers chosen by placement: no packet queued ahead of one it waits for (dag.py)
        self.dag = Dag.build(
            [s.output for s in g.stages],
            [s.inputs for s in g.stages],
            [s.agent.queue.handle for s in g.stages],
            copies=data == "copy",
        )
        # GPU segments: loaded into their agents (functions imported, run once, checked); which
        # are armed, which stages the host pushes (hostless.segments.load)
        self.segments: dict[int, tuple[str, str]] = {}
        self.armed: set[int] = set()
        self.hostpushed: set[int] = set()
        self.fed: Timeline | None = None
        self.host_word: Buffer | None = None
        segments.load(self)
        self._broken: HostlessError | None = None  # a reset after a failed frame could not finish
        if dom.trace_enabled():  # slices named after stages and kernels in the exported trace
            for k, s in enumerate(g.stages):
                if k in self.kids:
                    trace.name_kernel(dom, self.kids[k], getattr(s.kernel, "__qualname__", "function"))
            for a in {id(s.agent): s.agent for s in g.stages}.values():
                for kname, kid in a.user_kernels.items():
                    trace.name_kernel(dom, kid, kname)
        self.frame = 0
        self.place = self._placement()
        # what the heaps must hold (hostless.sizes): a graph that cannot fit is refused here,
        # before anything is allocated
        self.needs = sizes.needs(
            g.stages, g.inputs, g.constants, self.place, self.dag, dispatch, data, inflight
        )
        self._what = f"dispatch={dispatch} data={data} inflight={inflight}"
        sizes.check_fits(dom, self.needs, self._what)
        self.consts: dict[str, Buffer] = {}
        self.outputs = [g.stages[k].output for k in self.dag.sinks]  # and the ones asked for:
        self.outputs += [o for o in outputs if o not in self.outputs]  # (all done when the sinks are)
        self.slots: list[_Slot] = []
        self._closed = False
        try:
            for name, arr in g.constants.items():
                b = self.consts[name] = dom.buffer(arr.shape, arr.dtype, device=self.place[name])
                _store(b, arr)
            for _ in range(inflight):
                sl = _Slot()
                self.slots.append(sl)  # (what a failure left half built: close releases it)
                self._build_slot(sl)
            for sl in self.slots:
                self._build_programs(sl)
            segments.prepare(self)  # each slot's segments captured as CUDA graphs; armed ones armed
        except BaseException as e:
            self.close()
            if isinstance(e, OutOfMemory) and not isinstance(e, GraphTooLarge):  # scattered free space
                dev = isinstance(e, DeviceHeapFull)
                heap = next((h for h in self.needs.heaps if h != "cpu"), "cpu") if dev else "cpu"
                free, size = sizes.room(dom, heap)
                want = self.needs.heaps.get(heap, 0)
                raise sizes.too_large(heap, want, free, size, self.needs, self._what) from e
            raise
        # the host's whole frame in one C call (see run): when every graph input and output
        # lives in host memory; otherwise (or when the call declines) the general path
        self._bound = self._bind_io()
        self._refast()

    def _refast(self) -> None:
        """Let run() take its one-call path unless something needs the general path: the
        graph invalid or broken, a stream open, a slot whose frame was abandoned."""
        self._fast = (
            self._bound
            and self._invalid is None
            and self._broken is None
            and not self._streams
            and not any(sl.stale for sl in self.slots)
        )

    def _new_timelines(self) -> tuple[list[Timeline], dict[int, Timeline]]:
        """A slot's timelines: one per stage, owned by its agent, and (direct + copy) one per
        stage with a successor it does not push, signalled when its copies are done; named in
        the trace."""
        g, dom = self.g, self.dom
        timelines: list[Timeline] = []
        copied: dict[int, Timeline] = {}
        try:
            for s in g.stages:
                timelines.append(dom.timeline(owner=s.agent.id))
            if self.dispatch == "direct" and self.data == "copy":
                for k, s in enumerate(g.stages):
                    if any(self.dag.pusher(j) != k for j in self.dag.succs[k]):
                        copied[k] = dom.timeline(owner=s.agent.id)
        except BaseException:
            for t in timelines + list(copied.values()):
                t.release()
            raise
        if dom.trace_enabled():
            for k, s in enumerate(g.stages):
                trace.name(dom, timelines[k].handle, s.name)
                if k in copied:
                    trace.name(dom, copied[k].handle, f"{s.name} (copies)")
        return timelines, copied

    def _renewed(self, sl: _Slot) -> None:
        """Called by :func:`hostless.renewal.renew` once slot ``sl`` has new timelines, packets
        and frame programs: what an agent was given with the slot's old timeline handles is
        redone (the GPU segments armed in the slot are armed again on the new ones)."""
        segments.arm_slot(self, sl)

    # ------------------------------------------------------------ agents
    def _identities(self) -> list[_Ident]:
        """Each agent's participant slot and queue as compiled: the words to re-read per run."""
        dom, lay = self.dom, lowlevel.layout(self.dom)
        mv = memoryview(dom._raw_map())
        base = lowlevel.base_address(dom)
        out: list[_Ident] = []
        for a in {id(s.agent): s.agent for s in self.g.stages}.values():
            idx, inc = a.id & 0xFF, (a.id >> 8) & 0xFFFFFF
            if not 0 <= idx < lay["participant_capacity"]:
                raise ValueError(f"agent {a!r} has no participant slot {idx}")
            stage = next(s.name for s in self.g.stages if s.agent is a)
            off = lay["participants_offset"] + idx * int(C.PARTICIPANT_SIZE) + int(C.P_CTL)
            qoff = lowlevel.queue_view(dom, a.queue).queue - base + int(C.Q_CONSUMER)
            out.append(
                _Ident(
                    stage,
                    a.id,
                    idx,
                    mv[off : off + 8].cast("Q"),
                    (inc << 16) | int(C.PART_ALIVE),
                    mv[qoff : qoff + 4].cast("I"),
                    (inc << 8) | (idx + 1),
                    off,
                    qoff,
                )
            )
        return out  # (an agent already gone: the first run raises GraphInvalidated)

    def _check_agents(self, thorough: bool = False) -> None:
        """GraphInvalidated when an agent died or was replaced since compile time: its
        participant slot's incarnation and state and its queue's consumer, read in shared
        memory (``thorough``: its liveness lock too, one system call per agent, for a
        frame that failed or timed out: a killed agent not yet recovered looks alive)."""
        if self._invalid is not None:
            raise self._invalid
        m = _Ident.CTL_MASK
        for ident in self._idents:  # the fast path: two loads and compares per agent
            if ident.consumer[0] != ident.consumer_want or ident.ctl[0] & m != ident.ctl_want:
                why = ident.changed()
                if why is not None:
                    self._invalidate(GraphInvalidated(ident.stage, ident.agent_id, why))
        if thorough:
            held = {p[0]: bool(p[9]) for p in self.dom._core.participants()}
            for ident in self._idents:
                if not held.get(ident.index, False):
                    self._invalidate(GraphInvalidated(ident.stage, ident.agent_id, "died"))

    def _invalidate(self, e: GraphInvalidated) -> None:
        """Remember ``e`` for every later run, fail the graph's timelines (the frames in flight
        fail: packets still queued on live agents that wait on them fail unrun), raise ``e``."""
        self._invalid = e
        self._fast = False  # every later run goes the general path, which raises e
        for t in [t for sl in self.slots for t in sl.timelines + list(sl.copied.values())] + (
            [self.fed] if self.fed is not None else []
        ):
            try:
                if t.failure is None:
                    t.fail(Status.OWNER_DIED)
            except HostlessError:
                pass  # failed meanwhile (its owner's recovery)
        raise e

    # ------------------------------------------------------------ building
    def _shape_of(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        return self.g._shape_of(name)

    def _placement(self) -> dict[str, str]:
        """Where each tensor lives: :func:`place_tensors` on this graph and the domain's heaps."""
        g = self.g
        heaps = {h.name for h in lowlevel.device_heaps(self.dom)} if self.data == "shared" else set()
        return place_tensors(g.stages, g.inputs, g.constants, self.data, heaps)

    def plan(self) -> str:
        """Where each tensor lives and why, one line per tensor (also what ``print`` shows):
        its device, its bytes and how many buffers hold it (one per frame in flight; in copy
        mode one more per reader), then the bytes each heap holds for the graph
        (:class:`hostless.sizes.HeapNeeds`) and the heap's size."""
        g = self.g
        lines = [f"dispatch={self.dispatch} data={self.data} inflight={self.inflight}"]
        for n, d in self.place.items():
            nbuf = 1 if n in g.constants else self.inflight
            if self.data == "copy":  # a private copy per reader (and the constant itself once)
                nread = sum(i == n for s in g.stages for i in s.inputs)
                own = n not in g.inputs and n not in g.constants  # a stage's output buffer
                nbuf = (n in g.constants) + self.inflight * (nread + own)
            size = f"{sizes.fmt_bytes(self.needs.tensor_bytes[n])} x{nbuf}"
            if n in g.inputs:
                what = "input (host writes it)"
            elif n in g.constants:
                what = "constant (uploaded once)"
            else:
                k = next(i for i, s in enumerate(g.stages) if s.output == n)
                what = f"output of {g.stages[k].name} on {g.stages[k].agent.kind}"
            readers = [s.name for s in g.stages if n in s.inputs]
            if self.data == "copy":
                why = "copy mode: staged through host memory, one private copy per reader"
            elif d == "cpu" and any(s.agent.spec.resident for s in g.stages if n in (s.output, *s.inputs)):
                why = "host memory: the host touches it every frame; the GPU command processor reads it"
            elif d == "cpu" and any(
                isinstance(s.kernel, GpuSegment) for s in g.stages if n in (s.output, *s.inputs)
            ):
                why = (
                    "host memory: the host touches it every frame; the segment's graph copies it "
                    "(by DMA; by a kernel for inputs up to hostless.agents.gpufn.COPY_IN_KERNEL_MAX "
                    "bytes and for an armed segment's gated output)"
                )
            elif d == "cpu":
                devs = sorted({s.agent.device for s in g.stages if n in s.inputs or s.output == n})
                why = "host memory: used on " + ", ".join(devs) if devs else "host memory"
            else:
                why = f"{d} memory: every engine that touches it runs on {d}"
            by = ", ".join(readers) or "the host"
            lines.append(f"  {n:<12} {d:<7} {size:<14} {what}; read by {by}; {why}")
        for heap in sorted(self.needs.heaps):
            hfree, hsize = sizes.room(self.dom, heap)
            name = "host heap" if heap == "cpu" else f"{heap} heap"
            room = f"{sizes.fmt_bytes(hsize)} ({sizes.fmt_bytes(hfree)} free now)"
            lines.append(f"  {name}: this graph takes {self.needs.describe(heap)} of {room}")
        if self.dispatch == "direct" and self.dag.stuck and not (self.armed or self.hostpushed):
            names = ", ".join(g.stages[k].name for k in self.dag.unsafe) or "some stage"
            lines.append(
                f"  warning: no push order found for {names} that no interleaving of a frame can hang "
                "(hostless.dag): dispatch='host' or another placement avoids it"
            )
        return "\n".join(lines + segments.plan_lines(self))

    def _build_slot(self, sl: _Slot) -> _Slot:
        dom, g = self.dom, self.g
        if self.data == "shared":
            for name in list(g.inputs) + [s.output for s in g.stages]:
                shp, dt = self._shape_of(name)
                sl.tensors[name] = dom.buffer(shp, dt, device=self.place[name])
            for name, b in self.consts.items():
                sl.tensors[name] = b
            sl.stage_in = [[sl.tensors[i] for i in s.inputs] for s in g.stages]
            sl.stage_out = [sl.tensors[s.output] for s in g.stages]
        else:
            for s in g.stages:
                ins = []
                for i in s.inputs:
                    shp, dt = self._shape_of(i)
                    b = dom.buffer(shp, dt)
                    if i in self.consts:  # each device gets its own copy of the weights, once
                        b.numpy()[...] = self.consts[i].numpy()
                    ins.append(b)
                sl.stage_in.append(ins)
                sl.stage_out.append(dom.buffer(s.shape, s.dtype))
        sl.timelines, sl.copied = self._new_timelines()
        self._build_packets(sl)
        for name in g.inputs:
            if self.data == "shared":
                sl.in_views[name] = [_view(sl.tensors[name])]
            else:
                sl.in_views[name] = [
                    sl.stage_in[k][pos].numpy()
                    for k, s in enumerate(g.stages)
                    for pos, i in enumerate(s.inputs)
                    if i == name
                ]
        sl.out_views = [
            (s.output, _view(sl.stage_out[k])) for k, s in enumerate(g.stages) if s.output in self.outputs
        ]
        return sl

    def _build_packets(self, sl: _Slot) -> None:
        """The slot's packets on the current timelines, from the last stage backwards so that
        each can name its follow-ups; their argument blocks (and ERT commands, relays'
        scratch bytes) go to ``sl.owned``, their per-frame words to ``sl.stores``."""
        g = self.g
        n = len(g.stages)
        dag, direct = self.dag, self.dispatch == "direct"
        entry: dict[int, Follow] = {}  # direct: what stage j's pusher pushes for j (j or its relays)
        pk: list[Packet] = [Packet()] * n
        for k in range(n - 1, -1, -1):
            s = g.stages[k]
            bufs = [b.handle for b in sl.stage_in[k]] + [sl.stage_out[k].handle]
            follow: list[Follow] = []
            if direct:  # (armed and host-pushed stages are pushed by nobody's packet)
                follow = [
                    entry[j]
                    for j in dag.succs[k]
                    if dag.pusher(j) == k and j not in self.armed and j not in self.hostpushed
                ]
                if self.data == "copy" and dag.succs[k]:
                    follow = self._copy_follows(sl, k, follow)
            words = (
                []
                if callable(s.kernel) or isinstance(s.kernel, GpuSegment)
                else [_scalar_word(x) for x in s.scalars]
            )  # functions: bound at load
            p = self._packet(sl, s, bufs, words, k, follow)
            pk[k] = p
            if k in self.hostpushed:
                self._set_waits(p, [self._waited(sl, j) for j in dag.preds[k]])
            elif direct and dag.preds[k] and k not in self.armed:
                entry[k] = self._join(sl, k, p)
        sl.packets = pk

    def _build_programs(self, sl: _Slot) -> None:
        """The slot's frame programs, validated once by the engine (every handle held and
        of its kind, every store inside its argument block); per frame, one call runs
        one (see :meth:`_exec`): no packet is encoded or parsed in Python per frame."""
        g, dag = self.g, self.dag
        submit = FrameOps()
        for h, off in sl.stores:
            submit.store(h, off)
        if self.dispatch == "direct":
            for k in dag.roots:
                if k not in self.armed:
                    submit.push(g.stages[k].agent.queue.handle, sl.packets[k], tag=k)
            if self.host_word is not None:  # the frame is written: armed segments may start it
                submit.store(self.host_word.handle, 0)
            for k in sorted(self.hostpushed):  # (topological order) each waits on its inputs' points
                submit.push(g.stages[k].agent.queue.handle, sl.packets[k], tag=k)
        else:
            # host: launch what is ready, wait for the launched in topological order, copy
            # (sync back into the consuming devices' buffers), repeat: the order the host
            # always followed, unrolled once here (it depends on the DAG only)
            done: set[int] = set()
            running: list[int] = []
            waiting = list(range(len(g.stages)))
            while waiting or running:
                for k in [k for k in waiting if set(dag.preds[k]) <= done]:
                    waiting.remove(k)
                    submit.push(g.stages[k].agent.queue.handle, sl.packets[k], tag=k)
                    running.append(k)
                k = running.pop(0)
                submit.wait(sl.timelines[k].handle, self._watched(sl, k), tag=k)
                done.add(k)
                if self.data == "copy":
                    for j in dag.succs[k]:
                        for pos, name in enumerate(g.stages[j].inputs):
                            if name == g.stages[k].output:
                                submit.copy(sl.stage_in[j][pos].handle, sl.stage_out[k].handle, tag=k)
        wait = FrameOps()
        for k in dag.sinks:
            wait.wait(sl.timelines[k].handle, self._watched(sl, k), tag=k)
        run = submit + wait
        core = self.dom._core
        sl.submit = (submit.build(core, _SLICE_S), submit.tags)
        sl.wait = (wait.build(core, _SLICE_S), wait.tags)
        sl.run = (run.build(core, _SLICE_S), run.tags)

    def _bind_io(self) -> bool:
        """Give each slot's frame programs what one call needs to do the host's whole frame
        (``FrameProgram.bind_io``): the graph inputs' buffers (copied into, after the checks
        :meth:`_write_inputs` makes, when an input is an exact NumPy array of the input's
        dtype and shape), the outputs' views and buffers (copied out, into arrays made
        while the agents work) and the agents' words that :meth:`_check_agents` reads.  False
        (no fast path) when a tensor the host writes or reads lives in device memory."""
        g = self.g
        idents = [
            (i.ctl_off, _Ident.CTL_MASK, i.ctl_want, i.consumer_off, i.consumer_want) for i in self._idents
        ]
        for sl in self.slots:
            made_by = {s.output: sl.stage_out[k] for k, s in enumerate(g.stages)}
            outs = [(name, v, made_by[name].handle) for name, v in sl.out_views if isinstance(v, np.ndarray)]
            if len(outs) != len(sl.out_views):
                return False
            ins = []
            for name, (shp, dt) in g.inputs.items():
                dsts = self._input_buffers(sl, name)
                if any(b.device != "cpu" for b in dsts):
                    return False
                fmt = np.empty((0,), dt).data.format
                ins.append((name, fmt, dt.itemsize, tuple(shp), [b.handle for b in dsts]))
            sl.run[0].bind_io(ins, outs, idents, np.ndarray, np.empty_like)
            sl.submit[0].bind_io(ins, [], idents, np.ndarray, np.empty_like)
            sl.wait[0].bind_io([], outs, idents, np.ndarray, np.empty_like)
        return True

    def _input_buffers(self, sl: _Slot, name: str) -> list[Buffer]:
        """The buffers graph input ``name`` is written into each frame (those of in_views)."""
        g = self.g
        if self.data == "shared":
            return [sl.tensors[name]]
        return [
            sl.stage_in[k][pos] for k, s in enumerate(g.stages) for pos, i in enumerate(s.inputs) if i == name
        ]

    def _watched(self, sl: _Slot, k: int) -> list[int]:
        """The timelines checked for a failure while the host waits for stage k (between
        sleep slices): k's and its ancestors', in topological order."""
        return [sl.timelines[j].handle for j in sorted(self.dag.ancestors[k] | {k})]

    def _waited(self, sl: _Slot, j: int) -> int:
        """The timeline a successor that stage j does not push waits on (the frame number)."""
        t = sl.copied.get(j)
        return (t if t is not None else sl.timelines[j]).handle

    def _join(self, sl: _Slot, k: int, p: Packet) -> Follow:
        """What stage k's pusher pushes for it: k's packet, waiting on up to two other
        predecessors, behind relay packets on the pusher's agent for the rest (two each);
        for a stage the plan relays (``dag.relayed``), every wait is in relays and k's packet
        waits on nothing."""
        others = [self._waited(sl, j) for j in self.dag.others(k)]
        groups = [others[i : i + MAX_PACKET_WAITS] for i in range(0, len(others), MAX_PACKET_WAITS)]
        out = Follow(self.g.stages[k].agent.queue.handle, p)
        if not groups:
            return out
        if k not in self.dag.relayed:
            self._set_waits(p, groups.pop())
        pusher = self.g.stages[self.dag.pusher(k) or 0].agent
        if groups and not sl.scratch:
            for _ in range(2):
                b = self.dom.buffer((1,), np.uint8)
                sl.owned.append(b)
                sl.scratch.append(b.handle)
        while groups:  # relays: a one-byte copy that waits, then pushes what follows
            r = self._raw_packet(sl, pusher, "copy", list(sl.scratch), [], 0, 0, [out])
            self._set_waits(r, groups.pop())
            out = Follow(pusher.queue.handle, r)
        return out

    @staticmethod
    def _set_waits(p: Packet, handles: list[int]) -> None:
        """Make ``p`` wait on these timelines (values patched with the frame number per frame)."""
        h = handles + [0] * (MAX_PACKET_WAITS - len(handles))
        p.wait = (h[0], h[1])

    def _copy_follows(self, sl: _Slot, k: int, then: list[Follow]) -> list[Follow]:
        """Copy packets (on the producer's agent) for the edges out of stage k, chained before ``then``."""
        g = self.g
        src = sl.stage_out[k]
        out = then
        done = sl.copied.get(k)  # the last copy to run (the first built) signals it
        signal = done.handle if done is not None else 0
        for j in range(len(g.stages)):
            for pos, name in enumerate(g.stages[j].inputs):
                if name == g.stages[k].output:
                    dst = sl.stage_in[j][pos]
                    p = self._raw_packet(
                        sl, g.stages[k].agent, "copy", [src.handle, dst.handle], [], signal, 0, out
                    )
                    signal = 0
                    out = [Follow(g.stages[k].agent.queue.handle, p)]
        return out

    def _packet(
        self, sl: _Slot, s: Stage, bufs: list[int], scalars: list[int], k: int, follow: list[Follow]
    ) -> Packet:
        kernel = self.kids[k] if callable(s.kernel) or isinstance(s.kernel, GpuSegment) else s.kernel
        return self._raw_packet(sl, s.agent, kernel, bufs, scalars, sl.timelines[k].handle, 0, follow)

    def _args(self, sl: _Slot, ka: Kernargs) -> int:
        """An argument block of the slot: its buffer (owned by the slot) and the words of its
        follow-ups' signal and wait values to patch per frame.  Returns the buffer's handle."""
        b = ka.to_buffer(self.dom)
        sl.owned.append(b)
        offs = ka.signal_value_offsets()
        nb, ns = len(ka.buffers), len(ka.scalars)
        for j, f in enumerate(ka.follow):
            base = follow_offset(nb, ns, j) + FO_PACKET + PK_WAIT_VALUE
            offs += [base + 8 * i for i in range(MAX_PACKET_WAITS) if f.packet.wait[i]]
        sl.stores += [(b.handle, off) for off in offs]
        return b.handle

    def _raw_packet(
        self,
        sl: _Slot,
        agent: Agent,
        kernel: str | int,
        bufs: list[int],
        scalars: list[int],
        signal: int,
        value: int,
        follow: list[Follow],
    ) -> Packet:
        """The packet of one kernel on ``agent``; the buffers it needs (argument block, ERT
        command) are owned by the slot.  ``kernel``: a name, or the id of a loaded function."""
        spec = agent.spec
        if spec.ert:  # an ERT command naming the kernel's CU
            assert isinstance(kernel, str)
            cu = spec.kernel(kernel)
            cb = bytes_buffer(self.dom, ert.start_cu(cu, ert.cu_args(bufs, scalars)).encode())
            sl.owned.append(cb)
            ka = self._args(sl, Kernargs(buffers=[cb.handle], follow=follow))
            return Packet(type=PacketType.ERT, kernel=cu, args=ka, signal=signal, signal_value=value)
        kid = kernel if isinstance(kernel, int) else spec.kernel(kernel, agent.user_kernels)
        ka = self._args(sl, Kernargs(buffers=bufs, scalars=scalars, follow=follow))
        flags = spec.packet_flags(self.data)  # cuda copy mode: stage through device memory
        return Packet(kernel=kid, args=ka, signal=signal, signal_value=value, flags=flags)

    def close(self) -> None:
        """Release buffers, packets and timelines."""
        if self._closed:
            return
        self._closed = True
        self._fast = False
        segments.close(self)  # the agents disarm and drop this graph's segments
        seen: set[int] = set()
        for sl in self.slots:
            sl.in_views, sl.out_views = {}, []  # no view outlives its buffer
            sl.submit = sl.wait = sl.run = (None, [])
            for b in (
                list(sl.tensors.values()) + [x for xs in sl.stage_in for x in xs] + sl.stage_out + sl.owned
            ):
                if id(b) not in seen and lowlevel.is_held(b):
                    seen.add(id(b))
                    b.release()
        for b in self.consts.values():
            if lowlevel.is_held(b):
                b.release()
        for sl in self.slots:
            for t in sl.timelines + list(sl.copied.values()):
                t.release()
            for r in sl.retired:
                r.release()
            sl.retired = []
        for o in (self.fed, self.host_word):
            if o is not None and lowlevel.is_held(o):
                o.release()

    def __enter__(self) -> CompiledGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
