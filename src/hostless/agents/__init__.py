"""Agents: participant processes that each consume one queue.

``spawn(dom, "cpu")`` starts a NumPy worker; ``spawn(dom, "npu")`` starts the
emulated NPU command processor (ERT command buffers, kernels chosen by CU
index as in a loaded xclbin).  Both run the engine's command processor in C
(``core/agent.c``): Python kernels, user kernels and stage functions are its
callbacks (:mod:`hostless.agents.native`).  Each agent owns the fences of the
packets it runs: create them with ``owner=agent.id`` so that its death makes
them OWNER_DIED.

A bad packet fails alone: the agent finishes it with ERROR (its signal, when
it is a fence or timeline the agent can signal: a fence gets ERROR, a
timeline is failed with ERROR) and goes on with the next packet; it never
exits on one and never wedges: input waits are bounded by ``wait_timeout``,
follow-up pushes by ``follow_timeout`` (never waiting on the agent's own
queue), and a follow-up chain through the agent's own queue is cut after 64
hops.  The full rule is the engine's contract, stated once in
``core/hostless_engine.h`` (``hle_agent_run``).

Code is loaded only on the spawner's word: user kernels on the agent's command
line, stage functions through a private channel only the spawner holds
(:meth:`Agent.load_function`, :mod:`hostless.agents.control`).  A LOAD_KERNEL
packet in a queue, from anyone, fails alone with a record and imports nothing.

``spawn(dom, "cpu", native="exe")`` starts ``hostless-agent`` instead: a
small C program (``src/hostless/agentexe/main.c`` on the engine library, no
Python interpreter) built with the package (:func:`executable_path`), which
serves the built-in kernels only.

Each kind of agent is a spec (:mod:`~hostless.agents.kinds`, ``agent.spec``):
its kernels, packet format, placement, options and command line.  Modules:
:mod:`~hostless.agents.worker` (the agent process's entry point),
:mod:`~hostless.agents.native` (the C loop's Python callbacks),
:mod:`~hostless.agents.loop` (the loop in Python the cuda agent runs) and
:mod:`~hostless.agents.cuda_agent` (the GPU's loop).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from .. import lowlevel
from ..domain import Domain
from ..errors import DeviceAtomicsWarning, HostlessError, WritableDomainWarning
from ..kernels import FUNCTION_KERNEL_BASE, USER_KERNEL_BASE
from ..queue import Packet, PacketType, Queue
from . import control as _control
from .kinds import AgentSpec, spec_for

__all__ = ["Agent", "AgentStartTimeout", "spawn", "executable_path"]


class AgentStartTimeout(HostlessError, TimeoutError):
    """An agent did not start within ``spawn``'s ``timeout`` (it was killed)."""


class Agent:
    """Handle on a spawned agent process."""

    def __init__(
        self,
        dom: Domain,
        spec: AgentSpec,
        queue: Queue,
        proc: subprocess.Popen[str],
        pid: int,
        control: socket.socket | None = None,
    ) -> None:
        self.dom, self.spec, self.queue, self.proc = dom, spec, queue, proc
        self.kind = spec.kind
        """The kind of queue it serves: "cpu", "npu", "cuda" or "gpucp"."""
        self.native: bool | str = spec.native
        """How its loop runs: True (the engine's C loop in a Python worker: cpu and npu),
        "exe" (the same loop in the hostless-agent executable) or False (a loop in Python
        feeding CUDA streams: cuda; a resident GPU kernel: gpucp)."""
        self.id = pid
        """The agent's participant id (use it as the owner of the fences it signals)."""
        self.user_kernels: dict[str, int] = {}
        self.device = "cpu"
        """Where the agent's engine reads memory: "cpu", or "cuda:N" for a cuda or gpucp agent."""
        self.capabilities: dict[str, Any] = {"native": spec.native, "kind": spec.kind}
        """What the agent runs natively (a cpu or npu agent's :func:`hostless.agents.native.capabilities`:
        ``gemm`` is "blas", "python" or, for the hostless-agent executable, "none" (its GEMM
        packets fail); ``why`` says why GEMM has no BLAS; a gpucp agent's isolation and SMs)."""
        self._functions: dict[str, int] = {}  # stagefn request (JSON) -> kernel id
        self._control = control  # our end of the private load channel (hostless.agents.control)
        self._control_lock = threading.Lock()
        self._rx = _control.Reader()
        self._seq = 0
        self._next_kid = FUNCTION_KERNEL_BASE  # never reused: a late load cannot land on a newer id
        self._broken: str | None = None

    def load_function(self, fn: Any, scalars: Sequence[Any] = (), timeout: float = 30.0) -> int:
        """Make the agent import ``fn`` (a plain Python function, see
        :mod:`hostless.stagefn`) bound to ``scalars``; returns the kernel id
        its packets use.  Loaded once per (function, scalars): a second call
        returns the same id.

        The request goes through the agent's private load channel
        (:mod:`hostless.agents.control`), which only this process (the spawner)
        holds; the agent loads code on no one else's word (a LOAD_KERNEL packet
        in its queue is refused).  Thread-safe (one request at a time).

        Errors: HostlessError with the agent's own error (ImportError and its
        traceback) when it cannot load it, or when the agent is gone;
        TimeoutError when the agent has not answered within ``timeout``
        seconds (it may still load the function later, under an id no later
        call uses); TypeError when ``fn`` cannot be imported by name at all or
        the agent runs no Python (npu, cuda, gpucp, ``native="exe"``)."""
        from ..stagefn import describe

        if not self.spec.stage_functions:
            if self.native == "exe":
                raise TypeError(
                    "hostless-agent (native='exe') runs built-in kernels only, not Python functions"
                )
            raise TypeError(f"Python stage functions run on cpu agents, not on {self.kind} agents")
        desc = describe(fn, scalars)
        key = json.dumps(desc, sort_keys=True)
        what = f"{desc['module']}:{desc['qualname']}"
        with self._channel(timeout) as deadline:
            if key in self._functions:
                return self._functions[key]
            kid = self._next_kid
            self._next_kid += 1
            self._checked_reply({**desc, "id": kid}, deadline, what, timeout)
            self._functions[key] = kid
            return kid

    def load_segment(self, desc: dict[str, Any], timeout: float = 120.0) -> tuple[int, str, str]:
        """Make a cuda agent load a segment of GPU stage functions (``desc``: what
        :mod:`hostless.segments` builds); returns (kernel id, "graph" or "eager", why eager).
        The agent imports each function, runs it on zero tensors and checks its result
        (:mod:`hostless.agents.gpufn`).  Errors as :meth:`load_function`'s."""
        if not self.spec.gpu_functions:
            raise TypeError(f"GPU stage functions run on cuda agents, not on {self.kind} agents")
        what = "segment " + "+".join(str(s.get("name")) for s in desc.get("stages", []))
        with self._channel(timeout) as deadline:
            kid = self._next_kid
            self._next_kid += 1
            reply = self._checked_reply({**desc, "op": "segment", "id": kid}, deadline, what, timeout)
            return kid, str(reply.get("mode", "eager")), str(reply.get("why", ""))

    def prepare_segment(
        self, kid: int, buffers: Sequence[int], gated: bool = False, timeout: float = 120.0
    ) -> tuple[str, str]:
        """Capture segment ``kid`` over ``buffers`` (handles: inputs, then the output) as a
        CUDA graph in the agent (``gated``: its result into scratch, committed per frame only
        when the frame's inputs succeeded: for :meth:`arm_segment`); returns ("graph" or
        "eager", why eager)."""
        with self._channel(timeout) as deadline:
            req = {"op": "prepare", "id": kid, "buffers": [int(h) for h in buffers], "gated": bool(gated)}
            reply = self._checked_reply(req, deadline, f"segment {kid}", timeout)
            return str(reply.get("mode", "eager")), str(reply.get("why", ""))

    def arm_segment(
        self,
        kid: int,
        slot: int,
        step: int,
        buffers: Sequence[int],
        waits: Sequence[int],
        signal: int,
        fed: int,
        host_word: int,
        start: int,
        timeout: float = 120.0,
    ) -> None:
        """Arm frame slot ``slot`` of segment ``kid`` (prepared ``gated`` over ``buffers``): from
        frame ``start`` on, every ``step``-th frame is queued ahead on the GPU, behind a stream
        wait on the u64 of the host buffer ``host_word`` (the host stores the frame number there
        once it wrote the frame) and a wait on the ``waits`` timelines reaching the frame
        number, then committed and signalled on ``signal``
        (:class:`hostless.agents.cuda_armed.Armed`; it pushes nothing).  A slot armed already is
        re-armed.  ``fed`` is a timeline of the graph's host: when it fails (the graph closed or
        invalidated, or its host died) the agent disarms the graph's slots."""
        req = {
            "op": "arm",
            "id": kid,
            "slot": int(slot),
            "step": int(step),
            "buffers": [int(h) for h in buffers],
            "waits": [int(h) for h in waits],
            "signal": int(signal),
            "fed": int(fed),
            "host_word": int(host_word),
            "start": int(start),
        }
        with self._channel(timeout) as deadline:
            self._checked_reply(req, deadline, f"segment {kid}", timeout)

    def drop_segment(self, kid: int, timeout: float = 30.0) -> None:
        """Make the agent forget segment ``kid`` and release the buffers its graphs hold."""
        with self._channel(timeout) as deadline:
            self._checked_reply({"op": "drop", "id": kid}, deadline, f"segment {kid}", timeout)

    @contextlib.contextmanager
    def _channel(self, timeout: float) -> Iterator[float]:
        """The load channel's lock, held for one request; yields the deadline."""
        deadline = time.monotonic() + timeout
        if not self._control_lock.acquire(timeout=max(0.0, timeout)):
            raise TimeoutError(f"{self.kind} agent {self.id}: another load held the channel for {timeout} s")
        try:
            yield deadline
        finally:
            self._control_lock.release()

    def _checked_reply(
        self, req: dict[str, Any], deadline: float, what: str, timeout: float
    ) -> dict[str, Any]:
        reply = self._request(req, deadline, what, timeout)
        if not reply.get("ok"):
            why = str(reply.get("error", "no reason given"))
            raise HostlessError(f"{self.kind} agent {self.id} could not load {what}: {why}")
        if reply.get("id") != req["id"]:
            raise HostlessError(
                f"{self.kind} agent {self.id} answered id {reply.get('id')!r}, not {req['id']}"
            )
        return reply

    def _request(self, req: dict[str, Any], deadline: float, what: str, timeout: float) -> dict[str, Any]:
        """Send ``req`` on the load channel and read its reply (the lock held)."""
        sock = self._control
        if sock is None or self._broken:
            raise HostlessError(
                f"{self.kind} agent {self.id} has no usable load channel"
                + (f" ({self._broken})" if self._broken else " (stopped)")
                + ": spawn a new agent"
            )
        self._seq += 1
        seq = self._seq
        late = TimeoutError(
            f"{self.kind} agent {self.id} did not answer the load request for {what} within {timeout} s"
        )
        if time.monotonic() >= deadline:
            raise late  # nothing sent: the channel stays in step
        try:
            _control.send(sock, {**req, "seq": seq}, deadline)
        except TimeoutError:
            self._broken = "a request was cut by a timeout"
            raise late from None
        except OSError as e:
            raise HostlessError(f"{self.kind} agent {self.id} closed its load channel: {e}") from None
        while True:
            try:
                reply = self._rx.read(sock, deadline)
            except TimeoutError:
                raise late from None
            except ValueError as e:
                self._broken = f"a malformed reply: {e}"
                raise HostlessError(f"{self.kind} agent {self.id} sent a malformed reply: {e}") from None
            except OSError as e:
                raise HostlessError(f"{self.kind} agent {self.id} closed its load channel: {e}") from None
            if reply is None:
                code = self.proc.poll()
                raise HostlessError(
                    f"{self.kind} agent {self.id} closed its load channel"
                    + (f" (exit code {code})" if code is not None else "")
                )
            if reply.get("seq") == seq:
                return reply
            # the late reply to a request that timed out: not ours

    def _close_control(self) -> None:
        sock, self._control = self._control, None
        if sock is not None:
            sock.close()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the agent to finish its queue and exit (a STOP packet); kill it after ``timeout``."""
        if self.alive:
            try:
                self.queue.push(Packet(type=PacketType.STOP), timeout=timeout)
            except HostlessError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc.wait()
        self._close_control()
        if lowlevel.is_held(self.queue) and not self.dom.closed:
            self.queue.release()

    def kill(self) -> None:
        """SIGKILL the agent (recovery then signals its fences OWNER_DIED)."""
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._close_control()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "alive" if self.alive else "exited"
        return f"<hostless.Agent {self.kind} id={self.id} pid={self.proc.pid} {state}>"


class _Tail:
    def __init__(self) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=40)
        self.done = threading.Event()


def _forward_stderr(stream: Any) -> _Tail:
    """Copy an agent's stderr to ours as it comes (a thread), keeping its last lines for
    the error of an agent that could not start."""
    tail = _Tail()

    def run() -> None:
        try:
            for ln in stream:
                tail.lines.append(ln)
                try:
                    sys.stderr.write(ln)
                except (OSError, ValueError):
                    pass
        finally:
            tail.done.set()

    threading.Thread(target=run, name="hostless-agent-stderr", daemon=True).start()
    return tail


def executable_path() -> str:
    """The path of the ``hostless-agent`` executable built with this package
    (``hostless/_bin/hostless-agent``).  FileNotFoundError, saying how to build
    it, when the installed package lacks it (a build without a C compiler
    for executables, or a source tree used without installing)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_bin", "hostless-agent")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(
            f"hostless-agent is not installed at {path}: reinstall the package (pip install .) "
            "or build it with `make agent` (build/hostless-agent)"
        )
    return path


def spawn(
    dom: Domain,
    kind: str = "cpu",
    *,
    queue: Queue | None = None,
    capacity: int = 64,
    label: str | None = None,
    user_kernels: dict[str, str] | None = None,
    timeout: float = 30.0,
    **opts: Any,
) -> Agent:
    """Start an agent of ``kind`` ("cpu", "npu", "cuda" or "gpucp") consuming ``queue`` (a new one
    by default); what each kind is and which options it takes is its spec
    (:mod:`hostless.agents.kinds`, ``agent.spec``).

    cpu and npu agents run the engine's command processor, ``core/agent.c``: the
    doorbell, packet checks, input waits, the built-in kernels (GEMM through a
    BLAS when there is one: ``agent.capabilities``), the npu's ERT command
    processor, signals and follow-ups in C with the GIL released; Python is entered
    only for the kernels that are Python (user kernels, stage functions, dtypes the
    C kernels do not take), as callbacks (:mod:`hostless.agents.native`).  A "cuda"
    agent feeds CUDA streams from a loop in Python
    (:mod:`hostless.agents.cuda_agent`); a "gpucp" agent is the GPU command processor
    (:mod:`hostless.agents.gpucp`): a resident kernel takes the queue's packets with no
    host in the loop.

    ``device=N`` (cuda, gpucp) picks the GPU.  ``sms`` (gpucp, default 8) is
    the number of SMs it holds, one block each (a front end and ``sms - 1`` workers): a green
    context's partition where the driver has them, else a bounded grid (``isolation="grid"``
    asks for that; ``"green"`` refuses to start without one); ``agent.capabilities`` says
    which was used.  ``spin`` (seconds, default 50 us)
    is how long an idle agent polls its doorbell before a bounded sleep: longer
    spins cut the hand-off latency and cost CPU while idle.

    ``wait_timeout`` (seconds, default 60; None = forever) bounds how long a
    packet waits for its input fences / timeline points: past it the packet
    fails with ERROR (the queue runs in order, so an input that never
    completes would otherwise hold every later packet).  ``follow_timeout``
    (seconds, default 10) bounds the pushes of one packet's follow-ups into
    other consumers' queues (a push into the agent's own queue never waits);
    a follow-up that cannot be pushed is dropped and its signal fails with
    ERROR.  The full rule on bad packets is the engine's contract, in
    ``core/hostless_engine.h`` (``hle_agent_run``).

    ``fixed_spin=True`` (cpu, npu) spins ``spin`` before every park instead of
    adapting the spin to how often packets come.  ``idle_poll`` (cpu, npu and
    ``native="exe"``; seconds, default 0.02; 0 = the domain's poll interval): once
    the agent has had no packet for 100 ms it sleeps up to this long between looks
    at its doorbell, so an idle agent costs almost no CPU; a host push wakes it at
    once as ever, a doorbell rung by a device's plain store (no wake-up) is seen
    within ``idle_poll`` instead of the domain's poll interval (once a device has
    pushed into the queue, the agent keeps the domain's poll interval for good).
    An option a kind does not take is a TypeError.

    ``native="exe"`` (cpu and npu agents) starts the ``hostless-agent``
    executable (:func:`executable_path`): the same loop with no Python
    interpreter at all, serving built-in kernels only (a packet needing Python,
    a user kernel or a stage function, fails alone with ERROR and a record
    saying so); ``user_kernels`` are refused.  Its handle works as any other
    (``stop``, ``kill``, ``id`` as the owner of its fences).  ``native=True`` is
    accepted for cpu and npu agents (it is what they run anyway); ``native=False``
    is refused: the Python cpu/npu loop is gone.

    ``user_kernels`` maps names to ``"module:function"`` kernels (taking
    ``(buffers, scalars)``) the agent imports; their ids are in
    ``agent.user_kernels``.  Passing the ``queue`` of a dead agent respawns it: the packets
    queued for the dead agent (below the write index the new one finds when it takes the
    queue over, :meth:`hostless.Queue.bind`) fail unrun, their signals and their follow-ups'
    with OWNER_DIED, and a STOP among them is ignored; packets pushed afterwards run.  A
    graph compiled on the dead agent raises :class:`hostless.graph.GraphInvalidated` until
    compiled again.  (A "gpucp" agent's host process fails them by the same rule before its
    resident kernel starts.)

    ``timeout`` (seconds) bounds the start: an agent that has not said it serves
    (its participant id on its stdout) within it is killed and
    :class:`AgentStartTimeout` (a TimeoutError) is raised; one that exits first gives
    a HostlessError with its error output.

    Who decides what code runs: only the spawner.  User kernels come on the
    agent's command line; stage functions through a private load channel
    (a socket pair only this process and the agent hold,
    :mod:`hostless.agents.control`, used by :meth:`Agent.load_function`).
    Whoever can push into the agent's queue can run the kernels it has
    loaded, on buffers of the domain, but cannot make it load anything: a
    LOAD_KERNEL packet fails alone with ERROR and a record saying so.
    Because those pushers may be other users when the domain's file lets
    them write it, spawning an agent that runs Python code (a cpu agent
    other than ``native="exe"``, or any agent given ``user_kernels``) on a
    domain that is group- or world-writable, or owned by another user, gives
    a :class:`~hostless.errors.WritableDomainWarning` (a warning, not a
    refusal: sharing a domain between users is allowed, and it can no longer
    make the agent load code; filter the warning where the sharing is
    intended, keep ``mode=0o600`` otherwise).
    """
    spec = spec_for(kind, opts.pop("native", None))
    settings = spec.settings(opts)
    spec.check(user_kernels)
    if dom.name is None:
        raise ValueError("agents open the domain by name: create it with a name")
    q = queue if queue is not None else dom.queue(capacity)
    cmd = spec.command(dom.name, q.handle, settings, label)
    ids: dict[str, int] = {}
    for i, (name, what) in enumerate(sorted((user_kernels or {}).items())):
        ids[name] = USER_KERNEL_BASE + i
        cmd += ["--user", f"{USER_KERNEL_BASE + i}={what}"]
    if spec.stage_functions or user_kernels:
        _warn_if_writable(dom, kind, stacklevel=3)
    mine: socket.socket | None = None
    theirs: socket.socket | None = None
    pass_fds: tuple[int, ...] = ()
    if spec.stage_functions or spec.gpu_functions:  # the private load channel (hostless.agents.control)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # both close-on-exec
        cmd += ["--control", str(theirs.fileno())]
        pass_fds = (theirs.fileno(),)
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, close_fds=True, pass_fds=pass_fds
        )
    except BaseException:
        if mine is not None:
            mine.close()
        raise
    finally:
        if theirs is not None:
            theirs.close()  # the child holds the only other end
    assert proc.stdout is not None and proc.stderr is not None
    tail = _forward_stderr(proc.stderr)
    try:
        lines = _read_lines(proc, 2 if spec.reports_capabilities else 1, time.monotonic() + timeout)
    except TimeoutError:
        proc.kill()
        proc.wait()
        if mine is not None:
            mine.close()
        raise AgentStartTimeout(
            f"{kind} agent (pid {proc.pid}) did not start within {timeout} s: killed"
        ) from None
    if not lines or not lines[0].strip():
        proc.kill()
        proc.wait()
        if mine is not None:
            mine.close()
        tail.done.wait(2.0)
        said = "".join(tail.lines).rstrip()
        raise HostlessError(
            f"{kind} agent failed to start (exit code {proc.returncode})"
            + (f"; its error output:\n{said}" if said else "")
        )
    a = Agent(dom, spec, q, proc, int(lines[0]), mine)
    a.user_kernels = ids
    a.device = spec.device_of(settings.device)
    if spec.native == "exe":  # it prints no capabilities: the same probe of the BLAS it was given
        from .native import capabilities

        a.capabilities = capabilities(spec.kind, executable=True)
    if len(lines) > 1:  # what a native loop runs natively; how a gpucp runs
        try:
            a.capabilities = dict(json.loads(lines[1]))
        except ValueError:
            pass
    if a.capabilities.get("host_native_atomics") is False and a.capabilities.get("pushes") == "device":
        warnings.warn(
            f"{kind} agent told to push with device atomics on a GPU without host-native atomics: its "
            "pushes into queues that host producers share can be lost (hostless.errors.DeviceAtomicsWarning)",
            DeviceAtomicsWarning,
            stacklevel=2,
        )
    return a


def _read_lines(proc: subprocess.Popen[str], n: int, deadline: float) -> list[str]:
    """The first ``n`` lines the child writes on its stdout (fewer when it closes it first),
    read without blocking past ``deadline`` (``time.monotonic()``): TimeoutError then."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()  # read raw: the text wrapper is never read from
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    buf = b""
    lines: list[str] = []
    while len(lines) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if not poller.poll(max(1, int(left * 1000) + 1)):
            continue
        chunk = os.read(fd, 65536)
        if not chunk:  # end of file: the child exited or closed its stdout
            break
        buf += chunk
        while len(lines) < n and b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            lines.append(line.decode(errors="replace"))
    if len(lines) < n and buf:
        lines.append(buf.decode(errors="replace"))
    return lines


def _warn_if_writable(dom: Domain, kind: str, stacklevel: int) -> None:
    """WritableDomainWarning when users other than this one may write ``dom``'s file."""
    try:
        st = os.fstat(dom.fileno())
    except (OSError, HostlessError):
        return
    who = []
    if st.st_uid != os.geteuid():
        who.append(f"its owner uid {st.st_uid}")
    if st.st_mode & stat.S_IWGRP:
        who.append(f"group {st.st_gid}")
    if st.st_mode & stat.S_IWOTH:
        who.append("every user")
    if who:
        warnings.warn(
            WritableDomainWarning(
                f"domain {dom.name} (mode {stat.S_IMODE(st.st_mode):#o}) is writable by other users "
                f"({', '.join(who)}): they can push packets that run this {kind} agent's kernels and "
                "stage functions on buffers of their choice (not load code: only the spawner can). "
                "Create the domain with mode=0o600 to keep them out, or filter this warning if the "
                "sharing is intended"
            ),
            stacklevel=stacklevel,
        )
