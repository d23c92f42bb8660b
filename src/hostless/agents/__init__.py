"""Agents: participant processes that each consume one queue.

``spawn(dom, "cpu")`` starts a NumPy worker; ``spawn(dom, "npu")`` starts the
emulated NPU command processor (ERT command buffers, kernels chosen by CU
index as in a loaded xclbin).  Each agent owns the fences of the packets it
runs: create them with ``owner=agent.id`` so that its death makes them
OWNER_DIED.

A bad packet fails alone: the agent finishes it with ERROR (its signal, when
it is a fence or timeline the agent can signal: a fence gets ERROR, a
timeline is failed with ERROR) and goes on with the next packet; it never
exits on one and never wedges: input waits are bounded by ``wait_timeout``,
follow-up pushes by ``follow_timeout`` (never waiting on the agent's own
queue), and a follow-up chain through the agent's own queue is cut after 64
hops.  The full rule is in :mod:`hostless.agents.loop`.

``spawn(dom, "cpu", native="exe")`` starts ``hostless-agent`` instead: a
small C program (``src/hostless/agentexe/main.c`` on the engine library, no
Python interpreter) built with the package (:func:`executable_path`), which
serves the built-in kernels only.

Modules: :mod:`~hostless.agents.worker` (the agent process's entry point),
:mod:`~hostless.agents.loop` (the consumer loop), :mod:`~hostless.agents.npu`
(the ERT command processor) and :mod:`~hostless.agents.cuda_agent` (the
GPU's loop).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import lowlevel
from ..domain import Domain
from ..errors import HostlessError
from ..kernels import FUNCTION_KERNEL_BASE, LOAD_KERNEL, USER_KERNEL_BASE
from ..queue import Packet, PacketType, Queue
from ..status import Status
from ..wire import Kernargs

__all__ = ["Agent", "spawn", "executable_path"]


class Agent:
    """Handle on a spawned agent process."""

    def __init__(self, dom: Domain, kind: str, queue: Queue, proc: subprocess.Popen[str], pid: int) -> None:
        self.dom, self.kind, self.queue, self.proc = dom, kind, queue, proc
        self.native: bool | str = False
        """How it runs: False (the Python loop), True (the native loop in a Python
        worker) or "exe" (the hostless-agent executable)."""
        self.id = pid
        """The agent's participant id (use it as the owner of the fences it signals)."""
        self.user_kernels: dict[str, int] = {}
        self.device = "cpu"
        """Where the agent's engine reads memory: "cpu", or "cuda:N" for a cuda agent."""
        self.capabilities: dict[str, Any] = {"native": False, "kind": kind}
        """What the agent runs natively (a native agent's :func:`hostless.agents.native.capabilities`:
        ``gemm`` is "blas" or "python", ``why`` says why GEMM has no BLAS)."""
        self._functions: dict[str, int] = {}  # stagefn request (JSON) -> kernel id

    def load_function(self, fn: Any, scalars: Sequence[Any] = (), timeout: float = 30.0) -> int:
        """Make the agent import ``fn`` (a plain Python function, see
        :mod:`hostless.stagefn`) bound to ``scalars``; returns the kernel id
        its packets use.  Loaded once per (function, scalars): a second call
        returns the same id.  HostlessError with the agent's own error
        (ImportError and its traceback) when it cannot load it; TypeError when
        ``fn`` cannot be imported by name at all."""
        from ..stagefn import describe

        if self.kind != "cpu":
            raise TypeError(f"Python stage functions run on cpu agents, not on {self.kind} agents")
        if self.native == "exe":
            raise TypeError("hostless-agent (native='exe') runs built-in kernels only, not Python functions")
        desc = describe(fn, scalars)
        key = json.dumps(desc, sort_keys=True)
        if key in self._functions:
            return self._functions[key]
        kid = FUNCTION_KERNEL_BASE + len(self._functions)
        request = json.dumps({**desc, "id": kid}).encode()
        dom = self.dom
        req = dom.buffer((max(8192, len(request) + 1),), "u1")
        done = dom.fence()
        try:
            req.numpy()[: len(request)] = np.frombuffer(request, np.uint8)
            req.numpy()[len(request)] = 0  # NUL-terminated: a reused heap block is not zeroed
            args = Kernargs(buffers=[req.handle]).to_buffer(dom)
            try:
                self.queue.push(
                    Packet(kernel=LOAD_KERNEL, args=args.handle, signal=done.handle), timeout=timeout
                )
                st = done.wait(timeout)
            finally:
                args.release()
            if st != Status.SUCCESS:
                reply = bytes(req.numpy()).split(b"\0", 1)[0]
                why = reply[2:].decode("utf-8", "replace") if reply.startswith(b"!E") else st.name
                raise HostlessError(
                    f"{self.kind} agent {self.id} could not load {desc['module']}:{desc['qualname']}: {why}"
                )
        finally:
            req.release()
            done.release()
        self._functions[key] = kid
        return kid

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
        if lowlevel.is_held(self.queue) and not self.dom.closed:
            self.queue.release()

    def kill(self) -> None:
        """SIGKILL the agent (recovery then signals its fences OWNER_DIED)."""
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

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
    by default).  A "gpucp" agent is the GPU command processor (:mod:`hostless.agents.gpucp`):
    a resident kernel takes the queue's packets with no host in the loop.

    ``device=N`` picks the GPU of a cuda or gpucp agent.  ``sms`` (gpucp, default 8) is
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
    ERROR.  See :mod:`hostless.agents.loop` for the full rule on bad packets.

    ``native=True`` (cpu and npu agents) runs the native agent loop instead
    of the Python one (:mod:`hostless.agents.native`): the same rule, with the
    built-in kernels and the npu's ERT command processor in C, Python entered
    only for other kernels; ``agent.capabilities`` says whether GEMM runs
    through a BLAS.  ``fixed_spin=True`` (native only) spins ``spin`` before
    every park instead of adapting the spin to how often packets come.
    ``idle_poll`` (native only; seconds, default 0.02; 0 = the domain's poll
    interval): once the agent has had no packet for 100 ms it sleeps up to
    this long between looks at its doorbell, so an idle agent costs almost no
    CPU; a host push wakes it at once as ever, a doorbell rung by a device's
    plain store (no wake-up) is seen within ``idle_poll`` instead of the
    domain's poll interval (once a device has pushed into the queue, the
    agent keeps the domain's poll interval for good).
    ``native="exe"`` (cpu and npu agents) starts the ``hostless-agent``
    executable (:func:`executable_path`): the same loop with no Python
    interpreter at all, serving built-in kernels only (a packet needing Python,
    a user kernel or a stage function, fails alone with ERROR and a record
    saying so); ``user_kernels`` are refused.  Its handle works as any other
    (``stop``, ``kill``, ``id`` as the owner of its fences).

    ``user_kernels`` maps names to ``"module:function"`` kernels (taking
    ``(buffers, scalars)``) the agent imports; their ids are in
    ``agent.user_kernels``.  Passing the ``queue`` of a dead agent respawns it: the packets
    queued for the dead agent (below the write index the new one finds when it takes the
    queue over, :meth:`hostless.Queue.bind`) fail unrun, their signals and their follow-ups'
    with OWNER_DIED, and a STOP among them is ignored; packets pushed afterwards run.  A
    graph compiled on the dead agent raises :class:`hostless.graph.GraphInvalidated` until
    compiled again.  (A "gpucp" agent's device loop does not skip them yet.)
    """
    if kind not in ("cpu", "npu", "cuda", "gpucp"):
        raise ValueError(f"unknown agent kind {kind!r} (cpu, npu, cuda, gpucp)")
    device = int(opts.pop("device", 0))
    spin = float(opts.pop("spin", 50e-6))
    if spin < 0:
        raise ValueError("spin must be >= 0")
    wait_timeout = opts.pop("wait_timeout", 60.0)
    if wait_timeout is not None:
        wait_timeout = float(wait_timeout)
        if not wait_timeout >= 0:
            raise ValueError("wait_timeout must be >= 0 or None")
    follow_timeout = float(opts.pop("follow_timeout", 10.0))
    if not follow_timeout >= 0:
        raise ValueError("follow_timeout must be >= 0")
    native_opt = opts.pop("native", False)
    if native_opt not in (False, True, "exe"):
        raise ValueError(f"native must be False, True or 'exe', not {native_opt!r}")
    native: bool | str = native_opt
    fixed_spin = bool(opts.pop("fixed_spin", False))
    idle_poll = float(opts.pop("idle_poll", 0.02))
    if not idle_poll >= 0:
        raise ValueError("idle_poll must be >= 0")
    sms = int(opts.pop("sms", 8))
    isolation = str(opts.pop("isolation", "auto"))
    if kind == "gpucp" and sms < 1:
        raise ValueError("sms must be >= 1")
    if isolation not in ("auto", "green", "grid"):
        raise ValueError(f"isolation must be 'auto', 'green' or 'grid', not {isolation!r}")
    if opts:
        raise TypeError(f"unknown options {sorted(opts)}")
    if native and kind not in ("cpu", "npu"):
        raise ValueError(f"native agents serve cpu and npu queues (not {kind} ones)")
    if native == "exe" and user_kernels:
        raise ValueError("hostless-agent (native='exe') runs built-in kernels only: no user_kernels")
    if kind == "gpucp" and user_kernels:
        raise ValueError("the GPU command processor runs its built-in device kernels only: no user_kernels")
    if kind in ("cuda", "gpucp"):
        from ..cuda import available

        why = available()
        if why is not None:
            from ..cuda import CudaUnavailable

            raise CudaUnavailable(f"cannot start a cuda agent: {why}")
    if dom.name is None:
        raise ValueError("agents open the domain by name: create it with a name")
    q = queue if queue is not None else dom.queue(capacity)
    if native == "exe":
        cmd = _exe_command(dom.name, q, kind, spin, wait_timeout, follow_timeout, label, idle_poll)
    else:
        cmd = _worker_command(
            dom.name, q, kind, spin, wait_timeout, follow_timeout, label, bool(native), device,
            fixed_spin, idle_poll,
        )
        if kind == "gpucp":
            cmd += ["--sms", str(sms), "--isolation", isolation]
    ids: dict[str, int] = {}
    for i, (name, spec) in enumerate(sorted((user_kernels or {}).items())):
        ids[name] = USER_KERNEL_BASE + i
        cmd += ["--user", f"{USER_KERNEL_BASE + i}={spec}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, close_fds=True)
    assert proc.stdout is not None and proc.stderr is not None
    tail = _forward_stderr(proc.stderr)
    deadline = time.monotonic() + timeout
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line or proc.poll() is not None:
            break
    if not line.strip():
        proc.kill()
        proc.wait()
        tail.done.wait(2.0)
        said = "".join(tail.lines).rstrip()
        raise HostlessError(
            f"{kind} agent failed to start (exit code {proc.returncode})"
            + (f"; its error output:\n{said}" if said else "")
        )
    a = Agent(dom, kind, q, proc, int(line))
    a.native = native
    a.user_kernels = ids
    a.device = f"cuda:{device}" if kind in ("cuda", "gpucp") else "cpu"
    if native is True or kind == "gpucp":  # what a native loop runs natively; how a gpucp runs
        caps = proc.stdout.readline()
        try:
            a.capabilities = dict(json.loads(caps))
        except ValueError:
            pass
    return a


def _exe_command(
    name: str,
    q: Queue,
    kind: str,
    spin: float,
    wait_timeout: float | None,
    follow_timeout: float,
    label: str | None,
    idle_poll: float,
) -> list[str]:
    """The command line of a hostless-agent serving ``q`` of domain ``name`` (times in ns)."""
    from .native import blas_path

    blas = blas_path()
    return [
        executable_path(),
        "--domain",
        name,
        "--queue-handle",
        hex(q.handle),
        "--kind",
        kind,
        "--parent",
        str(os.getpid()),
        "--label",
        (label or f"{kind}-agent-exe").encode()[:31].decode(errors="ignore"),
        "--spin-ns",
        str(int(spin * 1e9)),
        "--wait-timeout-ns",
        str(-1 if wait_timeout is None else int(wait_timeout * 1e9)),
        "--follow-timeout-ns",
        str(int(follow_timeout * 1e9)),
        "--idle-poll-ns",
        str(int(idle_poll * 1e9)),
        *(["--blas", blas] if blas else []),
    ]


def _worker_command(
    name: str,
    q: Queue,
    kind: str,
    spin: float,
    wait_timeout: float | None,
    follow_timeout: float,
    label: str | None,
    native: bool,
    device: int,
    fixed_spin: bool,
    idle_poll: float,
) -> list[str]:
    """The command line of a Python agent process (:mod:`hostless.agents.worker`)."""
    cmd = [
        sys.executable,
        "-m",
        "hostless.agents.worker",
        name,
        hex(q.handle),
        kind,
        "--parent",
        str(os.getpid()),
    ]
    if label:
        cmd += ["--label", label]
    cmd += ["--spin", repr(spin)]
    cmd += ["--wait-timeout", repr(-1.0 if wait_timeout is None else wait_timeout)]
    cmd += ["--follow-timeout", repr(follow_timeout)]
    if native:
        cmd += ["--native"]
        if fixed_spin:
            cmd += ["--fixed-spin"]
        cmd += ["--idle-poll", repr(idle_poll)]
    if kind in ("cuda", "gpucp"):
        cmd += ["--device", str(device)]
    return cmd
