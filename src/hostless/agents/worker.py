"""The agent process's entry point: ``python -m hostless.agents.worker``.

:func:`hostless.agents.spawn` starts it (the command line is the agent's spec's,
:mod:`hostless.agents.kinds`).  It joins the domain, binds the queue, prints
its participant id on stdout (the spawner waits for that line; a cpu or npu
agent prints its capabilities as a JSON line after it:
:func:`hostless.agents.native.capabilities`), then runs the loop of its kind:
the engine's C loop (:func:`hostless.agents.native.run_native`) for "cpu" and
"npu", :class:`~hostless.agents.cuda_agent.CudaLoop` for "cuda", the resident
kernel's host side for "gpucp".  It exits on a STOP packet, on SIGTERM, and
when the spawner dies (PR_SET_PDEATHSIG plus the loop's parent checks).  User
kernels are given as ``--user ID=module:function``.  A cpu agent gets
``--control FD``: its end of the spawner's private load channel
(:mod:`hostless.agents.control`), served by a thread; stage functions reach
the agent only through it (a cuda agent gets one too: its GPU stage functions,
:mod:`hostless.agents.gpufn`).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import threading
from typing import Any

from ..domain import Domain
from ..errors import HostlessError
from ..kernels import Kernel, load_user_kernel
from ..status import Status
from .loop import AgentLoop

__all__ = ["main"]


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Run one agent process (arguments as :func:`hostless.agents.spawn` passes them);
    returns the exit status (1 when the spawner is already gone)."""
    ap = argparse.ArgumentParser(prog="hostless.agents.worker")
    ap.add_argument("domain")
    ap.add_argument("queue", type=lambda s: int(s, 0))
    ap.add_argument("kind", choices=["cpu", "npu", "cuda", "gpucp"])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--spin", type=float, default=50e-6, help="seconds to poll the doorbell before sleeping")
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--label", default=None)
    ap.add_argument("--user", action="append", default=[], help="ID=module:function")
    ap.add_argument(
        "--wait-timeout", type=float, default=60.0, help="bound on a packet's input waits (< 0: none)"
    )
    ap.add_argument("--fixed-spin", action="store_true", help="cpu, npu: always spin --spin")
    ap.add_argument(
        "--idle-poll", type=float, default=0.0, help="cpu, npu: longest doorbell sleep once idle (s)"
    )
    ap.add_argument("--follow-timeout", type=float, default=10.0, help="bound on a packet's follow-up pushes")
    ap.add_argument("--sms", type=int, default=8, help="gpucp: worker SMs (a green context's partition)")
    ap.add_argument("--isolation", choices=["auto", "green", "grid"], default="auto", help="gpucp: how")
    ap.add_argument("--control", type=int, default=None, help="cpu: fd of the spawner's private load channel")
    a = ap.parse_args(argv)
    wait_timeout = None if a.wait_timeout < 0 else a.wait_timeout
    follow_timeout = max(0.0, a.follow_timeout)
    _set_pdeathsig()
    if os.getppid() != a.parent:
        return 1
    control = None
    if a.control is not None:
        from .control import adopt

        try:
            control = adopt(a.control, a.parent)
        except (OSError, ValueError) as e:
            print(f"hostless agent: no load channel: {e}", file=sys.stderr)
            return 1
    user: dict[int, Kernel] = {}
    for spec in a.user:
        kid, _, fn = spec.partition("=")
        user[int(kid)] = load_user_kernel(fn)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    dom = Domain.open(a.domain, label=a.label or f"{a.kind}-agent", kind=a.kind)
    q = dom.import_queue(a.queue)
    stale_below = q.bind()  # bound before the id is printed (the C loop reads stale_below from the engine)
    if a.kind == "gpucp":
        _discard_stale_on_host(dom, q, a.parent, stale_below)
        return _run_gpucp(dom, q, a.parent, a.device, a.sms, a.isolation)
    sys.stdout.write(f"{dom.participant_id}\n")
    if a.kind != "cuda":
        from .native import capabilities

        sys.stdout.write(json.dumps(capabilities(a.kind)) + "\n")
    sys.stdout.flush()
    try:
        if a.kind == "cuda":
            from .cuda_agent import CudaLoop

            loop = CudaLoop(dom, q, user, a.parent, a.device, wait_timeout, follow_timeout)
            loop.spin_ns = int(max(0.0, a.spin) * 1e9)
            loop.stale_below = stale_below
            if control is not None:  # GPU stage functions: loaded and captured in the loop's thread
                from .control import serve

                t = threading.Thread(target=serve, args=(control, loop), name="hostless-load", daemon=True)
                t.start()
            try:
                loop.run()
            finally:
                loop.cache.clear()
        else:
            _run_c_loop(dom, q.handle, a, user, control, wait_timeout, follow_timeout)
    finally:
        dom.close()
    return 0


def _run_c_loop(
    dom: Domain,
    queue: int,
    a: argparse.Namespace,
    user: dict[int, Kernel],
    control: Any,
    wait_timeout: float | None,
    follow_timeout: float,
) -> None:
    """A cpu or npu agent: the engine's loop with its Python callbacks (and, for a cpu
    agent, the spawner's load channel served by a thread)."""
    from .native import NativeCallbacks, run_native

    cb = NativeCallbacks(dom, a.kind, user)
    if control is not None and a.kind == "cpu":
        from .control import serve

        threading.Thread(target=serve, args=(control, cb), name="hostless-load", daemon=True).start()
    try:
        run_native(
            cb,
            queue,
            a.parent,
            spin=max(0.0, a.spin),
            wait_timeout=wait_timeout,
            follow_timeout=follow_timeout,
            fixed_spin=a.fixed_spin,
            idle_poll=a.idle_poll,
        )
    finally:
        cb.cache.clear()


def _discard_stale_on_host(dom: Domain, q: Any, parent: int, stale_below: int) -> None:
    """A gpucp agent that took over a dead consumer's queue: fail what was queued for the
    dead one (every index below ``stale_below``) on the host, by the engine's rule
    (:meth:`AgentLoop.discard_stale`), before the resident kernel starts at ``read_index``.

    Only cells below ``stale_below`` are popped; those were reserved before the takeover, so
    they are published soon or skipped by recovery (their producer died).  The one case
    where a pop can reach past ``stale_below`` (the last stale cell was skipped for a dead
    producer inside the pop) fails that packet with ERROR and a record instead of running it
    on the host: nothing is lost silently."""
    import time

    from ..wire import Packet

    if not stale_below:
        return
    loop = AgentLoop(dom, q, "gpucp", {}, parent, 1.0, 1.0)  # its finish / fail rule only
    deadline = time.monotonic() + 30.0
    while q.info()["read_index"] < stale_below:
        r = q.pop_raw(50_000_000, 0)
        if r is None:
            if os.getppid() != parent:
                raise SystemExit(1)
            if time.monotonic() > deadline:
                raise HostlessError(f"queue {q.handle:#x}: stale packets below {stale_below} never came")
            continue
        idx, raw = r
        pkt = Packet.decode(raw)
        if idx < stale_below:
            loop.discard_stale(idx, pkt)
        else:
            loop.records.write(pkt.signal, "gpucp takeover: popped on the host past the stale range; not run")
            loop.finish(pkt, Status.ERROR, idx)
        q.completed()


def _run_gpucp(dom: Domain, q: Any, parent: int, device: int, sms: int, isolation: str) -> int:
    """The GPU command processor's host process: start the resident kernel, then watch it.
    Prints the participant id, then a JSON line of capabilities (isolation, SMs, control block)."""
    import json

    from .gpucp import GpuCommandProcessor

    cpu = GpuCommandProcessor(dom, q, parent, device, sms=sms, isolation=isolation)
    try:
        cpu.start()
        sys.stdout.write(f"{dom.participant_id}\n{json.dumps(cpu.info)}\n")
        sys.stdout.flush()
        cpu.run()
    finally:
        cpu.close()
        dom.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
