"""The native agent: :class:`~hostless.agents.loop.AgentLoop`'s rule, run by the engine in C.

:func:`run_native` hands the agent's queue to ``Core.agent_run`` (the engine's
``hle_agent_run``, ``core/agent.c``), which serves it with the GIL released:
pop (spin, then a bounded futex sleep), check, wait on the inputs, run,
signal, push the follow-ups, trace START / END, exactly as the Python loop
does (the rule in :mod:`hostless.agents.loop`).  A KERNEL packet whose kernel
is a built-in cpu kernel runs in C (``core/kernels.c``: float32, and copy of
any dtype) with no Python at all; any other kernel (user kernels, stage
functions loaded with ``LOAD_KERNEL``, dtypes or broadcasts the C kernels do
not take) and every ERT packet is run by :meth:`NativeCallbacks.kernel`, with
the GIL held only for that call, through the same :class:`AgentLoop` methods
(so error records and ``load_function`` keep working).  Guarantees: a bad
packet fails alone with ERROR and the agent goes on; the loop ends on STOP,
on the spawner's death (checked while idle and between input-wait slices)
and on a signal handler that raises (SIGTERM: the worker's ``sys.exit``; its
exception propagates out of :func:`run_native`).  The Python callback holds
no object between packets (its cache is emptied after each one).
"""

from __future__ import annotations

from .. import stagefn
from ..kernels import CPU_KERNELS
from ..status import Status
from ..wire import Packet, PacketType
from .loop import AgentLoop

__all__ = ["NativeCallbacks", "run_native", "c_kernel_mask"]


def c_kernel_mask(loop: AgentLoop) -> int:
    """Bit ``i`` set: built-in kernel id ``i`` may run in C (not replaced by a user kernel)."""
    mask = 0
    for kid, fn in CPU_KERNELS.values():
        if loop.kernels.get(kid) is fn and kid < 32:
            mask |= 1 << kid
    return mask


class NativeCallbacks:
    """What the native loop calls back into Python for (with the GIL held)."""

    def __init__(self, loop: AgentLoop) -> None:
        self.loop = loop

    def kernel(self, idx: int, raw: bytes) -> int:
        """Run packet ``idx``'s kernel (or ERT command) in Python; returns its status.
        Never raises: a failure is recorded for the packet's signal and returns ERROR."""
        loop = self.loop
        pkt = Packet.decode(raw)
        try:
            if pkt.type == PacketType.ERT:
                loop.run_ert(pkt)
            else:
                loop.run_kernel(pkt)
            status = Status.SUCCESS
        except Exception as e:  # a bad packet fails alone, with the why recorded for its signal
            loop.records.write(pkt.signal, stagefn.format_error(e))
            status = Status.ERROR
        loop.cache.clear()  # hold nothing between packets (the Python loop empties it when idle)
        return int(status)

    def record(self, signal: int, why: str) -> None:
        """Keep the why of a packet the C loop failed (:mod:`hostless.records`)."""
        self.loop.records.write(signal, why)


def run_native(loop: AgentLoop) -> tuple[int, int]:
    """Serve ``loop``'s queue with the native loop until STOP, the spawner's death or a
    signal handler that raises; returns (packets run, packets failed or follow-ups dropped)."""
    cb = NativeCallbacks(loop)
    wto = -1 if loop.wait_timeout is None else int(loop.wait_timeout * 1e9)
    core = loop.dom._core
    packets, failures = core.agent_run(
        loop.queue.handle,
        int(loop.spin_ns),
        wto,
        int(loop.follow_timeout * 1e9),
        int(loop.parent),
        cb.kernel,
        cb.record,
        c_kernel_mask(loop),
    )
    loop.failures += int(failures)
    return int(packets), int(failures)
