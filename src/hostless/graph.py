"""Graphs: pipelines of stages on agents, compiled into one of four modes.

``data``: ``"shared"`` (a stage reads its producer's output buffer in place)
or ``"copy"`` (every stage has private input and output buffers and each edge
is one memcpy, the default stacks' way).  ``dispatch``: ``"host"`` (the host
launches a stage, waits for it, copies if needed and launches the next: write,
sync, launch, wait, sync back) or ``"direct"`` (the host submits the first
packet of a frame, one per root stage; every stage's packet carries the
next ones as follow-ups, so each agent launches the next agent's work; the
host waits for the end: every sink stage).

Each stage signals its own timeline with the frame number; the timeline is
owned by the stage's agent, so an agent's death fails it with OWNER_DIED and
:meth:`CompiledGraph.run` raises :class:`StageFailed` within bounded time.
A failing stage also fails the timelines of the stages after it.

Stages form a DAG (:mod:`hostless.dag`): each stage consumes named
tensors (graph inputs, constants and the outputs of *any* earlier stages), and
one output may feed several stages (fan-out) as several outputs may feed one
stage (fan-in); a chain is the special case where each stage consumes the
previous one.  Every stage output that no stage consumes is a graph output,
and a frame is done when every sink stage is.

* Direct dispatch: the host pushes the packets of the root stages (no
  predecessor).  When a stage finishes, its agent pushes the packets of the
  successors whose *pusher* it is: a stage with several predecessors is pushed
  by the last of them in topological order (so it is enqueued once per frame)
  and its packet waits on the other predecessors' timeline points (the frame
  number), so it runs only when all its inputs are done.  A packet waits on at
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
  :class:`StageFailed` names the failed stage among the ancestors of the
  failing sink that comes first in topological order.
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

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from . import devmem, ert, lowlevel, records, trace
from ._abi import C
from .agents import Agent
from .agents.kinds import AgentSpec
from .buffer import Buffer, bytes_buffer
from .dag import MAX_PACKET_WAITS, Dag
from .domain import Domain
from .errors import CorruptDomain, HostlessError
from .kernels import check_stage, f64
from .queue import _timeout_ns
from .stagefn import describe
from .status import Status, timeline_failure
from .timeline import Timeline
from .wire import FO_PACKET, PK_WAIT_VALUE, Follow, FrameOps, Kernargs, Packet, PacketType, follow_offset

__all__ = ["Graph", "CompiledGraph", "StageFailed", "GraphInvalidated", "Stage", "place_tensors"]

_SLICE_S = 0.05
"""A wait for a stage sleeps in slices this long; after each, the host checks the
stage's ancestors for a failure (a failure passed on through relays past the
agents' follow-up depth never reaches the stage's own timeline)."""


class StageFailed(HostlessError):
    """A stage of a graph failed.

    ``status`` says how (ERROR, OWNER_DIED, ...); ``error``, when the stage's
    agent recorded one (:mod:`hostless.records`), says why: the exception's
    type and message, then the kernel's traceback in the agent, as text.
    """

    def __init__(self, stage: str, status: Status, error: str | None = None) -> None:
        msg = f"stage {stage!r} failed with {status.name}"
        if error:
            msg += f": {error}"
        super().__init__(msg)
        self.stage, self.status, self.error = stage, status, error


class GraphInvalidated(StageFailed):
    """An agent this compiled graph runs on died or was replaced (respawned on its queue).

    The graph's packets, timelines and argument blocks were built for that
    agent: the frame that noticed fails and every later ``run``/``stream``
    raises this, never returning a frame, until the graph is compiled again
    (``g.compile()`` on live agents, a respawned one included).  A
    :class:`StageFailed` (``stage`` is the first stage on that agent,
    ``status`` OWNER_DIED), so code that handles stage failures handles it;
    ``agent_id`` is the participant id the graph was compiled for."""

    def __init__(self, stage: str, agent_id: int, why: str) -> None:
        HostlessError.__init__(
            self,
            f"stage {stage!r} failed with OWNER_DIED: its agent (participant {agent_id}) {why}; "
            "this compiled graph is no longer valid and returns no frame: compile it again with g.compile() "
            "on live agents (a respawned one included)",
        )
        self.stage, self.status, self.error = stage, Status.OWNER_DIED, None
        self.agent_id = agent_id


@dataclass
class Stage:
    name: str
    agent: Agent
    kernel: str | Callable[..., Any]
    """A built-in kernel's name, a user kernel's name (``spawn(user_kernels=...)``)
    or a plain Python function (:mod:`hostless.stagefn`)."""
    inputs: list[str]
    output: str
    shape: tuple[int, ...]
    dtype: np.dtype
    scalars: list[float | int] = field(default_factory=list)


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
    ) -> Graph:
        """Add a stage running ``kernel`` on ``agent``: inputs by name, output (name, shape, dtype).

        ``kernel`` is the name of a built-in kernel of the agent's kind (see
        :mod:`hostless.kernels`), of a user kernel given to ``spawn``, or a
        plain Python function run by a cpu agent, called as
        ``kernel(*inputs, *scalars)`` and returning the output (the contract
        is in :mod:`hostless.stagefn`)."""
        if callable(kernel):
            if not agent.spec.stage_functions:
                where = "hostless-agent (native='exe')" if agent.native == "exe" else agent.kind
                raise TypeError(f"stage {name!r}: Python functions run on cpu agents, not {where}")
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
        self.stages.append(
            Stage(name, agent, kernel, list(inputs), oname, tuple(oshape), np.dtype(odtype), list(scalars))
        )
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

    def compile(self, dispatch: str = "direct", data: str = "shared", inflight: int = 2) -> CompiledGraph:
        """Allocate buffers, queues' packets and timelines for ``inflight`` frames at once."""
        if dispatch not in ("host", "direct"):
            raise ValueError("dispatch is 'host' or 'direct'")
        if data not in ("shared", "copy"):
            raise ValueError("data is 'shared' or 'copy'")
        if not self.stages:
            raise ValueError("a graph needs at least one stage")
        if inflight < 1:
            raise ValueError("inflight must be >= 1")
        return CompiledGraph(self, dispatch, data, inflight if dispatch == "direct" else 1)


def _check_cast(name: str, arr: np.ndarray, dt: np.dtype) -> None:
    """Refuse an input that would change value when written into the graph's dtype: a
    float into an integer input (300.0 into uint8 would become 44), integers out of
    range, complex into real.  Float to a narrower float rounds, as expected."""
    if arr.dtype == dt or np.can_cast(arr.dtype, dt, "safe") or not arr.size:
        return
    if dt.kind == "f" and arr.dtype.kind in "fiub":
        return  # rounding to the nearest float is not a change of meaning
    if arr.dtype.kind in "iub" and dt.kind in "iub":
        info = np.iinfo(dt) if dt.kind != "b" else None
        lo, hi = arr.min(), arr.max()
        if info is not None and info.min <= lo and hi <= info.max:
            return
        raise ValueError(f"input {name!r} has values {lo}..{hi} that do not fit its dtype {dt}")
    raise TypeError(
        f"input {name!r} is {arr.dtype}, the graph's input is {dt}: convert it yourself "
        f"(the cast would change values, e.g. 300.0 into uint8 gives 44)"
    )


def _view(b: Buffer) -> np.ndarray | Buffer:
    """A host buffer's NumPy view, made once; a device buffer itself (it has no host view)."""
    return b.numpy() if b.device == "cpu" else b


def _store(b: Buffer, arr: np.ndarray) -> None:
    """Write ``arr`` into ``b``: in place for host memory, one copy for device memory."""
    if b.device == "cpu":
        b.numpy()[...] = arr
    else:
        devmem.from_host(b, arr)


def _scalar_word(x: float | int) -> int:
    return f64(x) if isinstance(x, float) else int(x) & 0xFFFFFFFFFFFFFFFF


class _Ident:
    """An agent as a compiled graph knows it: the words of its participant slot and of its
    queue's consumer that must keep what they held at compile time."""

    __slots__ = (
        "stage", "agent_id", "index", "ctl", "ctl_want", "consumer", "consumer_want",
        "ctl_off", "consumer_off",
    )

    CTL_MASK = (0xFFFFFF << 16) | 0xFF  # the incarnation's low 24 bits (what an id carries) and state

    def __init__(
        self, stage: str, agent_id: int, index: int, ctl: memoryview, ctl_want: int,
        consumer: memoryview, consumer_want: int, ctl_off: int, consumer_off: int,
    ) -> None:
        self.stage, self.agent_id, self.index = stage, agent_id, index
        self.ctl, self.ctl_want, self.consumer, self.consumer_want = ctl, ctl_want, consumer, consumer_want
        self.ctl_off, self.consumer_off = ctl_off, consumer_off  # the words' offsets in the mapping

    def changed(self) -> str | None:
        """None while the agent is the one compiled for; else what happened (two loads)."""
        cons = self.consumer[0]
        if cons != self.consumer_want and cons != 0:
            return f"was replaced: participant slot {(cons & 0xFF) - 1} consumes its queue now (a respawn)"
        if self.ctl[0] & self.CTL_MASK != self.ctl_want:
            return "died or left (its participant slot no longer holds it)"
        if cons != self.consumer_want:
            return "died (its recovery unbound its queue)"
        return None


class _Engine(Protocol):
    """What the placement rule needs of an agent."""

    @property
    def spec(self) -> AgentSpec: ...  # its kind (hostless.agents.kinds): whether a resident kernel

    @property
    def device(self) -> str: ...  # where its engine reads memory: "cpu" or "cuda:N"


class _Uses(Protocol):
    """What the placement rule needs of a stage."""

    @property
    def agent(self) -> _Engine: ...

    @property
    def inputs(self) -> Sequence[str]: ...

    @property
    def output(self) -> str: ...


def place_tensors(
    stages: Sequence[_Uses],
    inputs: Iterable[str],
    constants: Iterable[str],
    data: str,
    heaps: Collection[str],
) -> dict[str, str]:
    """Where each tensor of a graph lives ("cpu" or "cuda:N"); a pure function of the
    stages' agents (their device and their spec's ``resident``), what each stage reads and
    writes, the data mode and the names of the domain's device heaps.

    Copy mode: every edge is staged through host memory.  Shared mode: a tensor goes to
    GPU N's memory when the stage that writes it and every stage that reads it run on
    GPU N (the host writes graph inputs and constants, and reads outputs, with explicit
    copies), and the domain has a heap there; otherwise host memory, which every engine
    reaches.  Exception: a tensor the host writes or reads every frame (a graph input, a
    sink's output) that a stage of a resident GPU kernel (a gpucp agent: ``spec.resident``)
    touches stays in host memory: a host-side CUDA copy would wait for the resident kernel's time slice (the
    contexts of two processes are time-sliced), while the processor reads and writes
    host memory over the link itself."""
    ins, consts = list(inputs), list(constants)
    names = ins + consts + [s.output for s in stages]
    place = dict.fromkeys(names, "cpu")
    if data != "shared":
        return place
    users: dict[str, set[str]] = {n: set() for n in names}
    for s in stages:
        dev = s.agent.device
        users[s.output].add(dev)
        for i in s.inputs:
            users[i].add(dev)
    read = {i for s in stages for i in s.inputs}
    per_frame = set(ins) | {s.output for s in stages if s.output not in read}  # inputs, sinks' outputs
    resident = {n for s in stages if s.agent.spec.resident for n in [s.output, *s.inputs]}
    for n, devs in users.items():
        if len(devs) == 1:
            (d,) = devs
            if d != "cpu" and d in heaps and not (n in per_frame and n in resident):
                place[n] = d
    return place


class _Slot:
    """The buffers and prepared packets of one frame in flight."""

    def __init__(self) -> None:
        self.tensors: dict[str, Buffer] = {}  # shared mode: one per name
        self.stage_in: list[list[Buffer]] = []  # copy mode: private inputs per stage
        self.stage_out: list[Buffer] = []  # output buffer per stage
        self.packets: list[Packet] = []  # the packet of each stage (host; direct: roots' are pushed)
        self.scratch: list[int] = []  # direct: the two one-byte buffers relay packets copy
        # (argument block, byte offset) of each follow-up packet's signal and wait value:
        # the words the frame program sets to the frame number before each submit
        self.stores: list[tuple[int, int]] = []
        self.owned: list[Any] = []
        # the frame programs (hostless._core.FrameProgram) and their ops' tags (stage index
        # of each wait): submit (direct: stores and the roots' pushes; host: every push,
        # wait and copy of the frame), wait (every sink), run (submit, then wait)
        self.submit: tuple[Any, list[Any]] = (None, [])
        self.wait: tuple[Any, list[Any]] = (None, [])
        self.run: tuple[Any, list[Any]] = (None, [])
        # NumPy views made once: the buffers each graph input is written into, the outputs
        # host buffers as NumPy views, device buffers as themselves (written and read by copies)
        self.in_views: dict[str, list[np.ndarray | Buffer]] = {}
        self.out_views: list[tuple[str, np.ndarray | Buffer]] = []


class CompiledGraph:
    """A graph bound to buffers and packets: :meth:`run` and :meth:`stream`."""

    def __init__(self, g: Graph, dispatch: str, data: str, inflight: int) -> None:
        self.g, self.dispatch, self.data, self.inflight = g, dispatch, data, inflight
        dom = g.dom
        self.dom = dom
        # the agents as compiled for, recorded before anything is built for them
        self._invalid: GraphInvalidated | None = None
        self._fast = False  # run's one-call path (set once everything is built: _bind_io)
        self._idents = self._identities()
        # Python stage functions: loaded into their agents once, here (ImportError etc. surface now)
        self.kids: dict[int, int] = {
            k: s.agent.load_function(s.kernel, s.scalars)
            for k, s in enumerate(g.stages)
            if callable(s.kernel)
        }
        self.timelines: list[Timeline] = [dom.timeline(owner=s.agent.id) for s in g.stages]
        self.dag = Dag.build([s.output for s in g.stages], [s.inputs for s in g.stages])
        # direct + copy: a stage with a successor it does not push signals here when its copies are done
        self.copied: dict[int, Timeline] = {}
        if dispatch == "direct" and data == "copy":
            for k, s in enumerate(g.stages):
                if any(self.dag.pusher(j) != k for j in self.dag.succs[k]):
                    self.copied[k] = dom.timeline(owner=s.agent.id)
        if dom.trace_enabled():  # slices named after stages and kernels in the exported trace
            for k, s in enumerate(g.stages):
                trace.name(dom, self.timelines[k].handle, s.name)
                if k in self.copied:
                    trace.name(dom, self.copied[k].handle, f"{s.name} (copies)")
                if k in self.kids:
                    trace.name_kernel(dom, self.kids[k], getattr(s.kernel, "__qualname__", "function"))
            for a in {id(s.agent): s.agent for s in g.stages}.values():
                for kname, kid in a.user_kernels.items():
                    trace.name_kernel(dom, kid, kname)
        self.frame = 0
        self.place = self._placement()
        self.consts: dict[str, Buffer] = {}
        for name, arr in g.constants.items():
            b = dom.buffer(arr.shape, arr.dtype, device=self.place[name])
            _store(b, arr)
            self.consts[name] = b
        self.outputs = [g.stages[k].output for k in self.dag.sinks]
        self.slots = [self._build_slot() for _ in range(inflight)]
        for sl in self.slots:
            self._build_programs(sl)
        self._closed = False
        # the host's whole frame in one C call (see run): when every graph input and output
        # lives in host memory; otherwise (or when the call declines) the general path
        self._fast = self._bind_io()

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
        for t in self.timelines + list(self.copied.values()):
            try:
                if t.failure is None:
                    t.fail(Status.OWNER_DIED)
            except HostlessError:
                pass  # failed meanwhile (its owner's recovery)
        raise e

    def _exec_checked(self, prog: tuple[Any, list[Any]], value: int, timeout: float | None) -> None:
        """:meth:`_exec`; a failure or timeout first checks whether an agent died or was
        replaced (GraphInvalidated, chained to the failure)."""
        self._checked(self._exec, prog, value, timeout)

    def _checked(self, fn: Callable[..., None], *args: Any) -> None:
        """``fn(*args)``; a StageFailed or TimeoutError first checks whether an agent died
        or was replaced (GraphInvalidated, chained to the failure)."""
        try:
            fn(*args)
        except (StageFailed, TimeoutError) as e:
            try:
                self._check_agents(thorough=True)
            except GraphInvalidated as gi:
                raise gi from e
            raise

    # ------------------------------------------------------------ building
    def _shape_of(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        return self.g._shape_of(name)

    def _placement(self) -> dict[str, str]:
        """Where each tensor lives: :func:`place_tensors` on this graph and the domain's heaps."""
        g = self.g
        heaps = {h.name for h in lowlevel.device_heaps(self.dom)} if self.data == "shared" else set()
        return place_tensors(g.stages, g.inputs, g.constants, self.data, heaps)

    def plan(self) -> str:
        """Where each tensor lives and why, one line per tensor (also what ``print`` shows)."""
        g = self.g
        lines = [f"dispatch={self.dispatch} data={self.data} inflight={self.inflight}"]
        for n, d in self.place.items():
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
            elif d == "cpu":
                devs = sorted({s.agent.device for s in g.stages if n in s.inputs or s.output == n})
                why = "host memory: used on " + ", ".join(devs) if devs else "host memory"
            else:
                why = f"{d} memory: every engine that touches it runs on {d}"
            lines.append(f"  {n:<12} {d:<7} {what}; read by {', '.join(readers) or 'the host'}; {why}")
        return "\n".join(lines)

    def _build_slot(self) -> _Slot:
        dom, g = self.dom, self.g
        sl = _Slot()
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
        # packets, from the last stage backwards so that each can name its follow-ups
        n = len(g.stages)
        dag, direct = self.dag, self.dispatch == "direct"
        entry: dict[int, Follow] = {}  # direct: what stage j's pusher pushes for j (j or its relays)
        pk: list[Packet] = [Packet()] * n
        for k in range(n - 1, -1, -1):
            s = g.stages[k]
            bufs = [b.handle for b in sl.stage_in[k]] + [sl.stage_out[k].handle]
            follow: list[Follow] = []
            if direct:
                follow = [entry[j] for j in dag.succs[k] if dag.pusher(j) == k]
                if self.data == "copy" and dag.succs[k]:
                    follow = self._copy_follows(sl, k, follow)
            words = (
                [] if callable(s.kernel) else [_scalar_word(x) for x in s.scalars]
            )  # functions: bound at load
            p = self._packet(sl, s, bufs, words, k, follow)
            pk[k] = p
            if direct and dag.preds[k]:
                entry[k] = self._join(sl, k, p)
        sl.packets = pk
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
                submit.wait(self.timelines[k].handle, self._watched(k), tag=k)
                done.add(k)
                if self.data == "copy":
                    for j in dag.succs[k]:
                        for pos, name in enumerate(g.stages[j].inputs):
                            if name == g.stages[k].output:
                                submit.copy(sl.stage_in[j][pos].handle, sl.stage_out[k].handle, tag=k)
        wait = FrameOps()
        for k in dag.sinks:
            wait.wait(self.timelines[k].handle, self._watched(k), tag=k)
        run = submit + wait
        core = self.dom._core
        sl.submit = (submit.build(core, _SLICE_S), submit.tags)
        sl.wait = (wait.build(core, _SLICE_S), wait.tags)
        sl.run = (run.build(core, _SLICE_S), run.tags)

    def _bind_io(self) -> bool:
        """Give each slot's frame programs what one call needs to do the host's whole frame
        (``FrameProgram.bind_io``): the graph inputs' buffers (copied into, after the checks
        :meth:`_write_inputs` makes, when an input is an exact NumPy array of the input's
        dtype and shape), the outputs' views (copied out) and the agents' words that
        :meth:`_check_agents` reads.  False (no fast path) when a tensor the host writes or
        reads lives in device memory."""
        g = self.g
        idents = [
            (i.ctl_off, _Ident.CTL_MASK, i.ctl_want, i.consumer_off, i.consumer_want) for i in self._idents
        ]
        for sl in self.slots:
            outs = [(name, v) for name, v in sl.out_views if isinstance(v, np.ndarray)]
            if len(outs) != len(sl.out_views):
                return False
            ins = []
            for name, (shp, dt) in g.inputs.items():
                dsts = self._input_buffers(sl, name)
                if any(b.device != "cpu" for b in dsts):
                    return False
                fmt = np.empty((0,), dt).data.format
                ins.append((name, fmt, dt.itemsize, tuple(shp), [b.handle for b in dsts]))
            sl.run[0].bind_io(ins, outs, idents, np.ndarray)
            sl.submit[0].bind_io(ins, [], idents, np.ndarray)
            sl.wait[0].bind_io([], outs, idents, np.ndarray)
        return True

    def _input_buffers(self, sl: _Slot, name: str) -> list[Buffer]:
        """The buffers graph input ``name`` is written into each frame (those of in_views)."""
        g = self.g
        if self.data == "shared":
            return [sl.tensors[name]]
        return [
            sl.stage_in[k][pos] for k, s in enumerate(g.stages) for pos, i in enumerate(s.inputs) if i == name
        ]

    def _watched(self, k: int) -> list[int]:
        """The timelines checked for a failure while the host waits for stage k (between
        sleep slices): k's and its ancestors', in topological order."""
        return [self.timelines[j].handle for j in sorted(self.dag.ancestors[k] | {k})]

    def _waited(self, j: int) -> int:
        """The timeline a successor that stage j does not push waits on (the frame number)."""
        t = self.copied.get(j)
        return (t if t is not None else self.timelines[j]).handle

    def _join(self, sl: _Slot, k: int, p: Packet) -> Follow:
        """What stage k's pusher pushes for it: k's packet, waiting on up to two other
        predecessors, behind relay packets on the pusher's agent for the rest (two each)."""
        others = [self._waited(j) for j in self.dag.others(k)]
        groups = [others[i : i + MAX_PACKET_WAITS] for i in range(0, len(others), MAX_PACKET_WAITS)]
        out = Follow(self.g.stages[k].agent.queue.handle, p)
        if not groups:
            return out
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
        done = self.copied.get(k)  # the last copy to run (the first built) signals it
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
        kernel = self.kids[k] if callable(s.kernel) else s.kernel
        return self._raw_packet(sl, s.agent, kernel, bufs, scalars, self.timelines[k].handle, 0, follow)

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

    # ------------------------------------------------------------- running
    def _write_inputs(self, sl: _Slot, inputs: Mapping[str, np.ndarray]) -> None:
        g = self.g
        unknown = sorted(name for name in inputs if name not in g.inputs)
        if unknown:
            raise KeyError(f"unknown graph input(s) {unknown}; the graph's inputs are {sorted(g.inputs)}")
        for name, (shp, dt) in g.inputs.items():
            if name not in inputs:
                raise KeyError(f"missing graph input {name!r}")
            arr = np.asarray(inputs[name])
            if arr.shape != shp:
                raise ValueError(f"input {name!r} must have shape {shp}, got {arr.shape}")
            _check_cast(name, arr, dt)
            for v in sl.in_views[name]:
                if isinstance(v, np.ndarray):
                    v[...] = arr
                else:  # a device buffer: one host-to-device copy
                    v.from_host(arr)

    def _read_outputs(self, sl: _Slot) -> dict[str, np.ndarray]:
        return {name: v.copy() if isinstance(v, np.ndarray) else v.to_host() for name, v in sl.out_views}

    def _exec(self, prog: tuple[Any, list[Any]], value: int, timeout: float | None) -> None:
        """Run one of a slot's frame programs for frame ``value`` (one C call, the GIL
        released); StageFailed, TimeoutError and the push errors as the host path
        always raised them."""
        stop = prog[0].run(value, -1 if timeout is None else _timeout_ns(timeout))
        if stop is not None:
            self._stopped(prog, value, stop)

    def _stopped(self, prog: tuple[Any, list[Any]], value: int, stop: tuple[Any, ...]) -> None:
        """Raise what a frame program's stop (``FrameProgram.run``'s tuple) means."""
        k: int = prog[1][stop[0]]
        why, word = stop[1], stop[2]
        if why == "failed":  # stage k's timeline failed (or holds garbage)
            st = timeline_failure(word)
            if st is None:
                raise CorruptDomain(
                    f"timeline {self.timelines[k].handle:#x} holds an invalid word {word:#x} "
                    "(written by a buggy or hostile participant)"
                )
            raise self._failure(k, st)
        # a sleep slice ended with a watched timeline failed, or the wait timed out
        for j in sorted(self.dag.ancestors[k] | {k}):
            f = self.timelines[j].failure
            if f is not None:
                raise StageFailed(self.g.stages[j].name, f)
        if why == "timeout":
            raise TimeoutError(
                f"timeline {self.timelines[k].handle:#x} did not reach {value} within the timeout"
            )
        raise CorruptDomain(f"a watched timeline held the failed word {word:#x}, then no failure")

    def _failure(self, k: int, st: Status) -> StageFailed:
        """The error for stage k failing with ``st``: it names the earliest failed
        ancestor of k in topological order (in direct mode a failure is passed on
        to the descendants, and the stage where it started is the one to report)."""
        for j in sorted(self.dag.ancestors[k]):
            f = self.timelines[j].failure
            if f is not None:
                return StageFailed(self.g.stages[j].name, f, records.read(self.dom, self.timelines[j].handle))
        return StageFailed(self.g.stages[k].name, st, records.read(self.dom, self.timelines[k].handle))

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
            r = prog[0].frame(inputs, f, timeout)
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
        self._check_agents()
        self.frame += 1
        sl = self.slots[self.frame % self.inflight]
        self._write_inputs(sl, inputs)
        self._exec_checked(sl.run, self.frame, timeout)
        self._check_agents()  # an agent replaced while the frame ran: no frame from this graph
        return self._read_outputs(sl)

    def stream(
        self, frames: Iterable[Mapping[str, np.ndarray]], timeout: float | None = 30.0
    ) -> Iterator[dict[str, np.ndarray]]:
        """Run frames with up to ``inflight`` in flight; yields outputs in order.  A frame is a
        mapping input name -> array, or, for a graph with one input, the array itself."""
        self._check()
        self._check_agents()
        pending: list[tuple[int, _Slot]] = []
        for inp in frames:
            if not isinstance(inp, Mapping):
                inp = self._one_input(inp)
            if len(pending) == self.inflight:
                v, sl = pending.pop(0)
                yield self._collect(sl, v, timeout)
            self.frame += 1
            sl = self.slots[self.frame % self.inflight]
            r = sl.submit[0].frame(inp, self.frame, timeout) if self._fast else None
            if r is None:  # the general path
                self._check()
                self._check_agents()
                self._write_inputs(sl, inp)
                self._exec_checked(sl.submit, self.frame, timeout)
            elif r.__class__ is not dict:
                self._ran(sl, sl.submit, self.frame, r)
            pending.append((self.frame, sl))
        for v, sl in pending:
            yield self._collect(sl, v, timeout)

    def _one_input(self, arr: Any) -> dict[str, Any]:
        """A bare array as the frame of a graph with one input; TypeError otherwise."""
        if len(self.g.inputs) != 1:
            raise TypeError(
                f"a frame is a mapping input name -> array (the graph's inputs are {sorted(self.g.inputs)}), "
                f"got {type(arr).__name__}"
            )
        return {next(iter(self.g.inputs)): arr}

    def _collect(self, sl: _Slot, v: int, timeout: float | None) -> dict[str, np.ndarray]:
        """Wait for frame ``v`` of a stream (slot ``sl``) and return its outputs."""
        r = sl.wait[0].frame(None, v, timeout) if self._fast else None
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

    def close(self) -> None:
        """Release buffers, packets and timelines."""
        if self._closed:
            return
        self._closed = True
        self._fast = False
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
        for t in self.timelines + list(self.copied.values()):
            t.release()

    def __enter__(self) -> CompiledGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
