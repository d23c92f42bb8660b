"""The handle of a spawned agent: :class:`Agent` (what :func:`hostless.agents.spawn` returns).

It holds the agent's process, its queue and the spawner's end of the agent's private load
channel (:mod:`hostless.agents.control`), through which, and only through which, the agent is
told to load code: Python stage functions (cpu agents) and GPU stage segments (cuda agents).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from .. import lowlevel
from ..domain import Domain
from ..errors import HostlessError
from ..kernels import FUNCTION_KERNEL_BASE
from ..queue import Packet, PacketType, Queue
from . import control as _control
from .kinds import AgentSpec

__all__ = ["Agent", "AgentStartTimeout"]


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
