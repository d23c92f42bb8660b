"""One GPU process per device: a GPU command processor hosted by a cuda agent.

CUDA contexts of different processes share a GPU by time slices (without MPS): while a
resident kernel runs in one process, every other process's CUDA work on that GPU waits for
its slices (a small-chain frame of plain CuPy took 2414 us beside a processor in another
process against 492 us alone, docs/gpu.md).  So a "gpucp" agent runs, by default, *inside*
the process of a cuda agent of the same domain and device that this process spawned: the
user's captured stages (the cuda agent's streams, in its primary context) and the resident
kernel (in a green context holding ``sms`` SMs of its own) are then one process, and neither
waits for the other's time slices.

Spawner side: :func:`host_for` picks the host (``spawn(..., process=)``), :func:`spawn_hosted`
asks it, through its private load channel, to start a processor on a queue, and returns a
:class:`HostedAgent`.  Agent side: :class:`Processors`, the processors a
:class:`~hostless.agents.cuda_agent.CudaLoop` hosts, served by its loop thread between
packets (so a processor starts, as a segment is captured, never behind a pending stream wait).

What hosting changes for the user:

* the processor's participant is its host's (``agent.id`` is the cuda agent's): its fences
  are OWNER_DIED when that process dies;
* ``stop()`` stops the processor alone (a STOP packet; the kernel leaves and the host frees
  it); stopping the cuda agent stops the processors it hosts first;
* ``kill()`` kills the process, so the cuda agent with it;
* a processor needs a green context to be hosted (a resident kernel in the primary context
  would hold up every device-wide synchronization of the host's loads and captures); where
  there is none (an old driver, ``isolation="grid"``) it gets a process of its own, as
  ``process="own"`` asks.
"""

from __future__ import annotations

import time
import warnings
import weakref
from typing import Any

from .. import lowlevel
from ..domain import Domain
from ..errors import DeviceAtomicsWarning, GpuTimeSliceWarning, HostlessError
from ..queue import Packet, PacketType, Queue
from .agent import Agent
from .kinds import AgentSpec, Settings

__all__ = [
    "HostedAgent",
    "HostedUnavailable",
    "Processors",
    "host_for",
    "spawn_hosted",
    "note_spawned",
    "SMS_MAX",
]

SMS_MAX = 1024
"""The most SMs a hosted processor may ask for (the driver rounds a green context's count)."""

_SPAWNED: weakref.WeakSet[Agent] = weakref.WeakSet()  # this process's cuda and gpucp agents


def note_spawned(a: Agent) -> None:
    """Remember a cuda agent (a host for later processors) or a gpucp agent of a process of its
    own; warn (:class:`~hostless.errors.GpuTimeSliceWarning`) when the new agent and a live
    one of the other kind of the same domain and device are separate processes."""
    if a.kind not in ("cuda", "gpucp"):
        return
    other = "gpucp" if a.kind == "cuda" else "cuda"
    for b in list(_SPAWNED):
        if b.kind == other and b.dom is a.dom and b.device == a.device and b.alive:
            if not isinstance(b, HostedAgent) and not isinstance(a, HostedAgent):
                warnings.warn(
                    GpuTimeSliceWarning(
                        f"a cuda agent and a GPU command processor on {a.device} in separate "
                        "processes: the resident kernel makes the cuda agent's GPU work wait for "
                        "time slices (milliseconds a frame). Spawn the cuda agent first and the "
                        "gpucp agent after it: the processor then runs in the cuda agent's process"
                    ),
                    stacklevel=3,
                )
                break
    _SPAWNED.add(a)


def host_for(dom: Domain, s: Settings, process: Any) -> Agent | None:
    """The cuda agent a gpucp agent of settings ``s`` runs in: ``process`` itself (an
    :class:`Agent` of kind cuda), None for ``process="own"``, and for ``process=None`` a live
    cuda agent of ``dom`` on the same device that this process spawned (None if there is none,
    or with ``isolation="grid"``).  ValueError or TypeError for a ``process`` that cannot host."""
    device = f"cuda:{s.device}"
    if process == "own":
        return None
    if process is None:
        if s.isolation == "grid":
            return None
        for b in list(_SPAWNED):
            if b.kind == "cuda" and b.dom is dom and b.device == device and b.alive:
                return b
        return None
    if not isinstance(process, Agent) or isinstance(process, HostedAgent):
        raise TypeError(f"process is a cuda agent, 'own' or None, not {process!r}")
    if process.kind != "cuda":
        raise ValueError(
            f"a GPU command processor runs in a cuda agent's process, not a {process.kind} agent's"
        )
    if process.dom is not dom:
        raise ValueError("process= names a cuda agent of another domain")
    if process.device != device:
        raise ValueError(
            f"process= names a cuda agent of {process.device}: spawn with device={process.device[5:]}"
        )
    if s.isolation == "grid":
        raise ValueError(
            "isolation='grid' puts the resident kernel in the primary context, where it would hold up "
            "the cuda agent's loads and captures: a hosted processor runs in a green context "
            "(leave isolation out, or give it a process of its own: process='own')"
        )
    if not process.alive:
        raise HostlessError(f"cuda agent {process.id} has exited: it cannot host a processor")
    return process


def _ask(host: Agent, req: dict[str, Any], what: str, timeout: float) -> dict[str, Any]:
    """One request on ``host``'s load channel (under a fresh id, as its loads)."""
    with host._channel(timeout) as deadline:
        kid = host._next_kid
        host._next_kid += 1
        return host._checked_reply({**req, "id": kid}, deadline, what, timeout)


class HostedAgent(Agent):
    """A GPU command processor in a cuda agent's process (see the module doc): ``host`` is
    that agent; ``proc`` and ``id`` are its."""

    def __init__(self, dom: Domain, spec: AgentSpec, queue: Queue, host: Agent) -> None:
        super().__init__(dom, spec, queue, host.proc, host.id, None)
        self.host = host
        """The cuda agent whose process runs this processor."""
        self._stopped = False

    @property
    def alive(self) -> bool:
        return not self._stopped and self.host.alive

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the processor (a STOP packet; it leaves after what its queue holds) and have its
        host free it; if it has not left after ``timeout``, the host process is killed (as
        ``Agent.stop`` kills an agent that does not exit)."""
        if self.alive:
            try:
                self.queue.push(Packet(type=PacketType.STOP), timeout=timeout)
            except HostlessError:
                pass
            try:
                _ask(self.host, {"op": "processor_close", "queue": self.queue.handle, "timeout": timeout},
                     f"the processor of queue {self.queue.handle:#x}", timeout + 5.0)
            except (HostlessError, TimeoutError):
                self.host.kill()
        self._stopped = True
        if lowlevel.is_held(self.queue) and not self.dom.closed:
            self.queue.release()

    def kill(self) -> None:
        """SIGKILL the process the processor runs in: its host cuda agent dies with it."""
        self.host.kill()
        self._stopped = True

    def __repr__(self) -> str:
        state = "alive" if self.alive else "exited"
        return f"<hostless.Agent gpucp id={self.id} in the cuda agent pid={self.proc.pid} {state}>"


class HostedUnavailable(HostlessError):
    """The host answered that it cannot run the processor (no green context, say)."""


def spawn_hosted(
    dom: Domain, spec: AgentSpec, s: Settings, host: Agent, queue: Queue | None, capacity: int, timeout: float
) -> HostedAgent:
    """Start a processor of settings ``s`` in ``host``'s process on ``queue`` (a new one of
    ``capacity`` cells by default).  :class:`HostedUnavailable` when the host answered that it
    cannot (nothing is left behind); TimeoutError when it did not answer in ``timeout``."""
    q = queue if queue is not None else dom.queue(capacity)
    req = {"op": "processor", "queue": q.handle, "sms": s.sms}
    try:
        reply = _ask(host, req, "a GPU command processor", timeout)
    except TimeoutError:
        raise  # it may still start one on the queue: never hand the queue to another consumer
    except HostlessError as e:
        if queue is None:
            q.release()
        raise HostedUnavailable(str(e)) from None
    a = HostedAgent(dom, spec, q, host)
    a.device = host.device
    info = reply.get("info")
    a.capabilities = {**(info if isinstance(info, dict) else {}), "native": False, "kind": "gpucp",
                      "process": f"cuda agent {host.id}"}
    if a.capabilities.get("host_native_atomics") is False and a.capabilities.get("pushes") == "device":
        warnings.warn(
            "gpucp agent told to push with device atomics on a GPU without host-native atomics: its "
            "pushes into queues that host producers share can be lost (hostless.errors.DeviceAtomicsWarning)",
            DeviceAtomicsWarning,
            stacklevel=3,
        )
    _SPAWNED.add(a)
    return a


class Processors:
    """The GPU command processors a cuda agent's loop hosts, by queue handle (agent side).
    Every method runs in the loop's thread."""

    WATCH_NS = 10_000_000
    """How often the loop looks for processors that left (after a STOP) to free them."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.live: dict[int, tuple[Any, Queue]] = {}
        self._next_watch = 0

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """``processor``: start one on ``queue`` with ``sms`` SMs (its info in the reply);
        ``processor_close``: stop the one of ``queue`` within ``timeout`` seconds and free it."""
        h = req.get("queue")
        if not isinstance(h, int) or isinstance(h, bool) or h <= 0:
            raise ValueError("a processor request names a queue handle")
        if req.get("op") == "processor_close":
            t = req.get("timeout", 10.0)
            if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 <= t <= 600:
                raise ValueError("processor_close: timeout is seconds in 0..600")
            got = self.live.get(h)
            if got is not None:
                got[0].stop(float(t))
                if not got[0].done:
                    raise HostlessError(f"the GPU command processor of queue {h:#x} did not leave in {t} s")
                self._free(h)
            return {}
        sms = req.get("sms")
        if not isinstance(sms, int) or isinstance(sms, bool) or not 1 <= sms <= SMS_MAX:
            raise ValueError(f"processor: sms is an int in 1..{SMS_MAX}")
        if h in self.live:
            raise ValueError(f"queue {h:#x} has a processor here already")
        return {"info": self._start(h, sms)}

    def _start(self, h: int, sms: int) -> dict[str, Any]:
        from .gpucp import GpuCommandProcessor, discard_stale_on_host

        loop = self.loop
        q = loop.dom.import_queue(h)
        p: Any = None
        try:
            stale = q.bind()
            discard_stale_on_host(loop.dom, q, loop.parent, stale)
            p = GpuCommandProcessor(loop.dom, q, loop.parent, loop.peer.device, sms, "green", peer=loop.peer)
            p.start()
        except BaseException:
            if p is not None:
                p.stop()
                if p.done:
                    p.close()
            q.release()
            raise
        self.live[h] = (p, q)
        return dict(p.info)

    def _free(self, h: int) -> None:
        p, q = self.live.pop(h)
        p.close()
        q.release()

    def watch(self) -> None:
        """Free the processors that left (a STOP packet), at most every ``WATCH_NS``."""
        if not self.live:
            return
        now = time.monotonic_ns()
        if now < self._next_watch:
            return
        self._next_watch = now + self.WATCH_NS
        for h, (p, _q) in list(self.live.items()):
            if p.done:
                self._free(h)

    def close(self, timeout: float = 10.0) -> None:
        """Stop every processor (the loop is ending) and free those that left; one that did
        not leave keeps what it may still write (the process's exit takes it)."""
        for h, (p, _q) in list(self.live.items()):
            p.stop(timeout)
            if p.done:
                self._free(h)
