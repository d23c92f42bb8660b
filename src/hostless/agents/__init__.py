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
:mod:`~hostless.agents.agent` (the handle :func:`spawn` returns),
:mod:`~hostless.agents.loop` (the loop in Python the cuda agent runs),
:mod:`~hostless.agents.cuda_agent` (the GPU's loop) and
:mod:`~hostless.agents.gpucp` (the GPU command processor).
"""

from __future__ import annotations

import collections
import json
import os
import select
import socket
import stat
import subprocess
import sys
import threading
import time
import warnings
from typing import Any

from ..domain import Domain
from ..errors import DeviceAtomicsWarning, HostlessError, WritableDomainWarning
from ..kernels import USER_KERNEL_BASE
from ..queue import Queue
from .agent import Agent, AgentStartTimeout
from .kinds import spec_for

__all__ = ["Agent", "AgentStartTimeout", "spawn", "executable_path"]


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
