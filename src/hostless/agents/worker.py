"""The agent process: consumes one queue and signals fences.

Run by :func:`hostless.agents.spawn` as ``python -m hostless.agents.worker``.
It joins the domain, binds the queue, prints its participant id, then loops:
take a packet (spinning briefly, then a bounded sleep on the doorbell, so an
idle agent costs no CPU), wait for the packet's fences / timeline points, run
the kernel (or the ERT command), signal, and enqueue the follow-up packets.
A wait released by a failure does not run the work: the failure is passed on
to the packet's own signal.  A bad packet fails with ERROR; the agent goes on.
It exits on a STOP packet, on SIGTERM, and when the process that spawned it
dies (PR_SET_PDEATHSIG plus a parent check while idle).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import struct
import sys
from collections import OrderedDict
from typing import Any

import numpy as np

from .. import ert
from .._abi import C
from ..buffer import bytes_buffer
from ..domain import Domain
from ..errors import HostlessError
from ..kernels import CPU_KERNELS, NPU_CUS, Kernel, load_user_kernel
from ..queue import Follow, Kernargs, Packet, PacketType, Queue
from ..status import Status

_KIND_TIMELINE = int(C.KIND_TIMELINE)
_EV_START, _EV_END = int(C.EV_START), int(C.EV_END)


class _Cache:
    """Imported objects by handle (bounded; emptied when idle)."""

    def __init__(self, dom: Domain, size: int = 256) -> None:
        self.dom, self.size = dom, size
        self.items: OrderedDict[int, Any] = OrderedDict()
        self.views: dict[int, np.ndarray] = {}  # NumPy views of cached buffers (made once)

    def view(self, h: int) -> np.ndarray:
        """The NumPy view of buffer ``h`` (imported and viewed once, then reused)."""
        v = self.views.get(h)
        if v is None:
            v = self.views[h] = self.get(h).numpy()
        return v

    def get(self, h: int) -> Any:
        o = self.items.get(h)
        if o is not None:
            self.items.move_to_end(h)
            return o
        kind = (h >> 48) & 0xFF
        if kind == int(C.KIND_BUFFER):
            o = self.dom.import_buffer(h)
        elif kind == int(C.KIND_QUEUE):
            o = self.dom.import_queue(h)
        elif kind == _KIND_TIMELINE:
            o = self.dom.import_timeline(h)
        else:
            o = self.dom.import_fence(h)
        self.items[h] = o
        if len(self.items) > self.size:
            oh, old = self.items.popitem(last=False)
            self.views.pop(oh, None)
            old.release()
        return o

    def clear(self) -> None:
        self.views.clear()
        for o in self.items.values():
            try:
                o.release()
            except HostlessError:
                pass
        self.items.clear()


_KA_HEAD = struct.Struct("<IHHH")
_U64 = struct.Struct("<Q")


def decode_args(arr: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...], list[tuple[int, bytes]]]:
    """(buffers, scalars, [(queue, raw packet)]) of an argument block, without copying it
    (the fast form of ``Kernargs.decode``; ValueError when malformed)."""
    raw: Any = arr  # an ndarray exports the buffer protocol
    n = arr.shape[0]
    if n < 16:
        raise ValueError("argument block shorter than its header")
    magic, nb, ns, nf = _KA_HEAD.unpack_from(raw)
    if magic != int(C.KERNARG_MAGIC):
        raise ValueError(f"argument block has a bad magic {magic:#x}")
    off = 16 + 8 * (nb + ns)
    if off + 72 * nf > n:
        raise ValueError("argument block is shorter than its counts")
    bufs = struct.unpack_from(f"<{nb}Q", raw, 16)
    scal = struct.unpack_from(f"<{ns}Q", raw, 16 + 8 * nb)
    follow = [
        (_U64.unpack_from(raw, off + 72 * j)[0], raw[off + 72 * j + 8 : off + 72 * j + 72].tobytes())
        for j in range(nf)
    ]
    return bufs, scal, follow


class Agent:
    def __init__(self, dom: Domain, queue: Queue, kind: str, user: dict[int, Kernel], parent: int) -> None:
        self.dom, self.queue, self.kind, self.parent = dom, queue, kind, parent
        self.cache = _Cache(dom)
        table = NPU_CUS if kind == "npu" else CPU_KERNELS
        self.kernels: dict[int, Any] = {kid: fn for kid, fn in table.values()}
        self.kernels.update(user)
        self.running = True
        self.spin_ns = 50_000  # how long an idle agent polls its doorbell before sleeping

    # ------------------------------------------------------------------
    def run(self) -> None:
        q = self.queue
        idle = 0
        while self.running:
            r = q.pop_raw(50_000_000, self.spin_ns)  # 50 ms bounded wait after the spin
            if r is None:
                idle += 1
                if os.getppid() != self.parent:
                    return  # the spawner died: no orphans
                if idle == 2:
                    self.cache.clear()
                continue
            idle = 0
            idx, raw = r
            pkt = Packet.decode(raw)
            if pkt.type == PacketType.STOP:
                self.finish(pkt, Status.SUCCESS, idx)
                return
            self.execute(idx, pkt)
            q.completed()

    def execute(self, idx: int, pkt: Packet) -> None:
        core = self.dom._core
        core.trace(_EV_START, self.queue.handle, idx, pkt.signal, pkt.kernel, 0)
        status = self.wait_inputs(pkt)
        follow: list[tuple[int, bytes]] = []
        if status == Status.SUCCESS:
            try:
                if pkt.type == PacketType.KERNEL:
                    follow = self.run_kernel(pkt)
                elif pkt.type == PacketType.ERT:
                    follow = self.run_ert(pkt)
                elif pkt.type != PacketType.BARRIER:
                    raise ValueError(f"unknown packet type {pkt.type}")
            except Exception as e:  # a bad packet fails alone
                status = Status.ERROR
                if os.environ.get("HOSTLESS_AGENT_DEBUG"):
                    print(f"agent {self.kind}: packet {idx} failed: {e!r}", file=sys.stderr)
        self.finish(pkt, status, idx)
        if status != Status.SUCCESS:
            self.fail_downstream(pkt, status)
        else:
            for qh, raw_pkt in follow:
                try:
                    self.cache.get(qh).push(raw_pkt)
                except HostlessError as e:
                    fp = Packet.decode(raw_pkt)
                    self.fail_signal(fp.signal, fp.signal_value, Status.ERROR)
                    if os.environ.get("HOSTLESS_AGENT_DEBUG"):
                        print(f"agent {self.kind}: follow-up failed: {e!r}", file=sys.stderr)

    def wait_inputs(self, pkt: Packet) -> Status:
        for h, v in zip(pkt.wait, pkt.wait_value, strict=True):
            if not h:
                continue
            try:
                o = self.cache.get(h)
                st = o.wait(v) if (h >> 48) & 0xFF == _KIND_TIMELINE else o.wait()
            except HostlessError:
                return Status.ERROR
            if st != Status.SUCCESS:
                return Status(st)  # a failed input fails this stage without running it
        return Status.SUCCESS

    def run_kernel(self, pkt: Packet) -> list[tuple[int, bytes]]:
        fn = self.kernels.get(pkt.kernel)
        if fn is None:
            raise ValueError(f"unknown kernel {pkt.kernel}")
        if not pkt.args:
            raise ValueError("kernel packet without an argument block")
        bufs, scalars, follow = decode_args(self.cache.view(pkt.args))
        view = self.cache.view
        fn([view(h) for h in bufs], scalars)
        return follow

    def run_ert(self, pkt: Packet) -> list[tuple[int, bytes]]:
        """ERT packet: ``args`` is an argument block whose first buffer is the
        command buffer (as EXEC_CMD names a command BO), plus follow-ups."""
        if not pkt.args:
            raise ValueError("ERT packet without an argument block")
        bufs, _scalars, follow = decode_args(self.cache.view(pkt.args))
        if not bufs:
            raise ValueError("ERT packet without a command buffer")
        self.run_ert_buffer(self.cache.view(bufs[0]).view(np.uint8))
        return follow

    def run_ert_buffer(self, raw: np.ndarray) -> None:
        words = raw[: raw.size - raw.size % 4].view("<u4")
        try:
            cmd = ert.ErtCommand.decode(raw.tobytes())
        except ValueError:
            if words.size:
                words[0] = (int(words[0]) & ~0xF) | ert.State.ERROR
            raise
        words[0] = (int(words[0]) & ~0xF) | ert.State.RUNNING
        try:
            if cmd.opcode == ert.Opcode.CMD_CHAIN:
                self.run_chain(cmd, words)
            elif cmd.opcode in (ert.Opcode.START_CU, ert.Opcode.START_NPU):
                self.run_cu(cmd)
            else:
                raise ValueError(f"unsupported ERT opcode {cmd.opcode}")
        except Exception:
            words[0] = (int(words[0]) & ~0xF) | ert.State.ERROR
            raise
        words[0] = (int(words[0]) & ~0xF) | ert.State.COMPLETED

    def run_chain(self, cmd: ert.ErtCommand, words: np.ndarray) -> None:
        # ert_cmd_chain_data right after the header (no cu_mask): count, submit
        # index (word 2), error index (word 3), reserved[3], u64 handles
        n = cmd.payload[0] if cmd.payload else 0
        base = ert.CHAIN_HEADER_WORDS
        if len(cmd.payload) < base + 2 * n:
            raise ValueError("CMD_CHAIN payload shorter than its command count")
        for i in range(n):
            words[2] = i  # submit index
            h = cmd.payload[base + 2 * i] | (cmd.payload[base + 1 + 2 * i] << 32)
            try:
                self.run_ert_buffer(self.cache.view(h).view(np.uint8))
            except Exception:
                words[3] = i  # error index
                raise

    def run_cu(self, cmd: ert.ErtCommand) -> None:
        if cmd.cu_mask == 0 or cmd.cu_mask & (cmd.cu_mask - 1):
            raise ValueError(f"cu_mask {cmd.cu_mask:#x} must name exactly one CU")
        cu = cmd.cu_mask.bit_length() - 1
        fn = self.kernels.get(cu)
        if fn is None:
            raise ValueError(f"no CU {cu} in the loaded xclbin")
        args = cmd.payload[4:] if cmd.opcode == ert.Opcode.START_NPU else cmd.payload
        # arguments: nbuf, then nbuf u64 buffer handles (two words each), then u64 scalars
        if not args:
            raise ValueError("ERT command without arguments")
        nbuf = args[0]
        if len(args) < 1 + 2 * nbuf or (len(args) - 1 - 2 * nbuf) % 2:
            raise ValueError("ERT argument words do not match the buffer count")
        hs = [args[1 + 2 * i] | (args[2 + 2 * i] << 32) for i in range(nbuf)]
        rest = args[1 + 2 * nbuf :]
        scalars = [rest[2 * i] | (rest[2 * i + 1] << 32) for i in range(len(rest) // 2)]
        fn([self.cache.view(h) for h in hs], scalars)

    def finish(self, pkt: Packet, status: Status, idx: int) -> None:
        self.dom._core.trace(_EV_END, self.queue.handle, idx, pkt.signal, int(status), 0)
        if not pkt.signal:
            return
        try:
            o = self.cache.get(pkt.signal)
            if (pkt.signal >> 48) & 0xFF == _KIND_TIMELINE:
                if status == Status.SUCCESS:
                    o.signal(pkt.signal_value)
                else:
                    o.fail(status)
            else:
                o.signal(status)
        except (HostlessError, ValueError) as e:
            if os.environ.get("HOSTLESS_AGENT_DEBUG"):
                print(f"agent {self.kind}: signal failed: {e!r}", file=sys.stderr)

    def fail_downstream(self, pkt: Packet, status: Status, depth: int = 0) -> None:
        """Pass a failure on to the signals of the follow-up packets that will now
        never run (recursively), so that nobody waits for them forever."""
        if not pkt.args or depth > 16:
            return
        try:
            ka = Kernargs.decode(self.cache.get(pkt.args).numpy())
        except (HostlessError, ValueError):
            return
        for f in ka.follow:
            self.fail_signal(f.packet.signal, f.packet.signal_value, status)
            self.fail_downstream(f.packet, status, depth + 1)

    def fail_signal(self, h: int, value: int, status: Status) -> None:
        self.finish(Packet(signal=h, signal_value=value), status, -1)


FLAG_STAGE_COPY = 1  # packet flag: stage the inputs through device memory (copy mode)


class CudaAgent(Agent):
    """A GPU agent: each packet becomes stream work, and the host thread moves on.

    Waits are ``cuStreamWaitValue64`` on the GPU, the kernel runs on CuPy arrays
    (zero-copy views of the heap, or device copies in copy mode), the output is
    committed and the signal stored by the GPU only when every input succeeded,
    and follow-up packets are pushed into their queues by a device-side enqueue
    kernel.  This process never synchronizes the stream in the loop.
    """

    def __init__(self, dom: Domain, queue: Queue, user: dict[int, Kernel], parent: int, device: int) -> None:
        super().__init__(dom, queue, "cuda", user, parent)
        from ..cuda import CudaPeer
        from ..kernels import _cuda_table

        self.peer = CudaPeer(dom, device)
        self.cp = self.peer.cp
        self.kernels = dict(_cuda_table())
        self.kernels.update(user)
        self.inflight: list[tuple[Any, list[Any]]] = []  # (event, objects to keep until it completes)
        # (kernel, layouts) already run once: CuPy compiles and CUDA loads modules
        # on first use, and that must never happen behind a pending stream wait
        # (module loading can wait for the device, which the wait holds: deadlock)
        self.warm: set[Any] = set()

    def _recycle(self) -> None:
        keep = []
        for ev, objs in self.inflight:
            if ev.done:
                for o in objs:
                    o.release()
            else:
                keep.append((ev, objs))
        self.inflight = keep

    def _wait_inputs_on_gpu(self, pkt: Packet) -> Any:
        """Stream waits on the packet's inputs, then the gate over their words."""
        waits = []
        for h, v in zip(pkt.wait, pkt.wait_value, strict=True):
            if h:
                o = self.cache.get(h)
                self.peer.wait(o, v if (h >> 48) & 0xFF == _KIND_TIMELINE else 1)
                waits.append(o)
        return self.peer.gate(waits)

    def execute(self, idx: int, pkt: Packet) -> None:
        cp, peer = self.cp, self.peer
        st = peer.stream
        core = self.dom._core
        core.trace(_EV_START, self.queue.handle, idx, pkt.signal, pkt.kernel, 0)
        self._recycle()
        keep: list[Any] = []
        try:
            gate: Any = None
            follow: list[Follow] = []
            if pkt.type == PacketType.KERNEL:
                fn = self.kernels.get(pkt.kernel)
                if fn is None:
                    raise ValueError(f"unknown kernel {pkt.kernel}")
                ka = Kernargs.decode(self.cache.get(pkt.args).numpy())
                bufs = [self.cache.get(h) for h in ka.buffers]
                if not bufs:
                    raise ValueError("kernel packet without buffers")
                sig = (pkt.kernel, pkt.flags, tuple((b.dtype.str, b.shape) for b in bufs), tuple(ka.scalars))
                if sig not in self.warm:
                    # first run of this signature: without pending waits (the
                    # result goes to a scratch buffer that is never committed)
                    st.synchronize()
                    with st:
                        tmp = cp.empty(bufs[-1].shape, bufs[-1].dtype)
                        fn([cp.asarray(b.numpy()) for b in bufs[:-1]], ka.scalars, tmp)
                        fn([peer.array(b) for b in bufs[:-1]], ka.scalars, tmp)
                    st.synchronize()
                    self.warm.add(sig)
                gate = self._wait_inputs_on_gpu(pkt)
                with st:
                    if pkt.flags & FLAG_STAGE_COPY:  # copy mode: explicit host -> device copies
                        ins = []
                        for b in bufs[:-1]:
                            d = cp.empty(b.shape, b.dtype)
                            d.set(b.numpy(), stream=st)
                            ins.append(d)
                    else:  # shared mode: the GPU reads the heap in place
                        ins = [peer.array(b) for b in bufs[:-1]]
                    out = bufs[-1]
                    scratch = cp.empty(out.shape, out.dtype)
                    fn(ins, ka.scalars, scratch)
                    peer.commit(out, scratch, gate)
                keep += [scratch, *ins]
                follow = ka.follow
            elif pkt.type == PacketType.BARRIER:
                gate = self._wait_inputs_on_gpu(pkt)
            else:
                raise ValueError(f"the cuda agent does not run packets of type {pkt.type}")
            if pkt.signal:
                peer.signal(self.cache.get(pkt.signal), pkt.signal_value, gate)
            packets: list[Any] = []
            for f in follow:
                pb = bytes_buffer(self.dom, f.packet.encode())
                keep.append(peer.enqueue(self.cache.get(f.queue), pb, gate))
                packets.append(pb)
            keep.append(gate)
        except Exception as e:
            if os.environ.get("HOSTLESS_AGENT_DEBUG"):
                print(f"agent cuda: packet {idx} failed: {e!r}", file=sys.stderr)
            st.synchronize()
            self.finish(pkt, Status.ERROR, idx)
            self.fail_downstream(pkt, Status.ERROR)
            return
        # packet buffers of follow-ups and device temporaries live until the GPU passed them
        self.inflight.append((st.record(), packets + [_Keep(keep)]))
        core.trace(_EV_END, self.queue.handle, idx, pkt.signal, 0, 1)


class _Keep:
    """Holds device temporaries until their stream work completed."""

    def __init__(self, objs: list[Any]) -> None:
        self.objs = objs

    def release(self) -> None:
        self.objs = []


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hostless.agents.worker")
    ap.add_argument("domain")
    ap.add_argument("queue", type=lambda s: int(s, 0))
    ap.add_argument("kind", choices=["cpu", "npu", "cuda"])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--spin", type=float, default=50e-6, help="seconds to poll the doorbell before sleeping")
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--label", default=None)
    ap.add_argument("--user", action="append", default=[], help="ID=module:function")
    a = ap.parse_args(argv)
    _set_pdeathsig()
    if os.getppid() != a.parent:
        return 1
    user: dict[int, Kernel] = {}
    for spec in a.user:
        kid, _, fn = spec.partition("=")
        user[int(kid)] = load_user_kernel(fn)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    dom = Domain.open(a.domain, label=a.label or f"{a.kind}-agent", kind=a.kind)
    q = dom.import_queue(a.queue)
    q.bind()
    sys.stdout.write(f"{dom.participant_id}\n")
    sys.stdout.flush()
    if a.kind == "cuda":
        agent: Agent = CudaAgent(dom, q, user, a.parent, a.device)
    else:
        agent = Agent(dom, q, a.kind, user, a.parent)
    agent.spin_ns = int(max(0.0, a.spin) * 1e9)
    try:
        agent.run()
    finally:
        agent.cache.clear()
        dom.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
