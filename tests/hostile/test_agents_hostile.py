"""Hostile packets: an agent fails a bad packet alone, never exits, never wedges.

Directed cases, one per kind of bad input (handles of the wrong kind, stale or
forged in wait / signal / arguments / follow-ups, wait status words that are
not statuses, wait values >= 2**62, malformed argument blocks, unknown kernels
and packet types, malformed ERT command buffers, follow-ups into a full queue
or into the agent's own queue, packets that re-enqueue themselves) and a
random-packet fuzz pushed raw into the agents' queues.  After every case a
probe packet must complete within a few seconds: an agent that exited is
reported as "killed", one that stopped answering as "wedged" (and is replaced,
so that the remaining cases still run).  The signal of a bad packet, when it
is a fence or timeline the agent can signal, must end with ERROR.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import hostless as hl
from hostless import agents, ert
from hostless._abi import FENCE_DTYPE, C
from hostless.kernels import USER_KERNEL_BASE, cu_index, f64, kernel_id

S = hl.Status
CAP = 16  # capacity of the agents' queues
WAIT_TIMEOUT = 0.5  # the agents' bound on a packet's input waits
FOLLOW_TIMEOUT = 0.5  # the agents' bound on pushing follow-ups into another queue
ANSWER = 4.0  # seconds within which an agent must answer a probe
AGENT_OPTS: dict[str, Any] = {"wait_timeout": WAIT_TIMEOUT, "follow_timeout": FOLLOW_TIMEOUT}
TL_MAX = int(C.TIMELINE_MAX)
MAGIC = int(C.KERNARG_MAGIC)
KIND_SHIFT = 48


def with_kind(h: int, kind: int) -> int:
    return (h & ~(0xFF << KIND_SHIFT)) | (kind << KIND_SHIFT)


def forged(h: int) -> int:
    """``h`` with another generation (a stale or forged handle)."""
    return h ^ (0x5A5A << 24)


def ka_header(nb: int, ns: int, nf: int, magic: int = MAGIC) -> bytes:
    return struct.pack("<IHHHHI", magic, nb, ns, nf, 0, 0)


@dataclass(repr=False)
class Env:
    dom: hl.Domain
    running: dict[str, agents.Agent] = field(default_factory=dict)
    owned: list[Any] = field(default_factory=list)
    verdicts: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------ objects
    def keep(self, o: Any) -> Any:
        self.owned.append(o)
        return o

    def buffer(self, arr: np.ndarray) -> hl.Buffer:
        b = self.dom.buffer(arr.shape, arr.dtype)
        b.numpy()[...] = arr
        return self.keep(b)

    def raw(self, data: bytes, dtype: Any = np.uint8, shape: tuple[int, ...] | None = None) -> hl.Buffer:
        """A buffer holding ``data`` (padded with zeros to the dtype), of ``dtype`` / ``shape``."""
        dt = np.dtype(dtype)
        pad = (-len(data)) % dt.itemsize
        arr = np.frombuffer(data + bytes(pad), dt)
        return self.buffer(arr.reshape(shape) if shape is not None else arr)

    def block(self, bufs: list[int], scalars: list[int] = (), follow: list[hl.Follow] = ()) -> hl.Buffer:  # type: ignore[assignment]
        return self.raw(hl.Kernargs(buffers=list(bufs), scalars=list(scalars), follow=list(follow)).encode())

    def fence(self, owner: agents.Agent | None = None) -> hl.Fence:
        return self.keep(self.dom.fence(owner=owner.id if owner else None))

    def stale(self) -> int:
        f = self.dom.fence()
        h = f.handle
        f.release()
        return h

    def poke(self, h: int, word: int) -> None:
        """Store ``word`` into the completion word of ``h`` (as a hostile participant could)."""
        hd = self.dom.header()
        off = int(hd["fences_offset"]) + ((h & 0xFFFFFF) - 1) * FENCE_DTYPE.itemsize
        fd = os.open(f"/dev/shm/{self.dom.name}", os.O_RDWR)
        try:
            os.pwrite(fd, word.to_bytes(8, "little"), off)
        finally:
            os.close(fd)

    # ------------------------------------------------------------- agents
    def agent(self, kind: str) -> agents.Agent:
        a = self.running.get(kind)
        if a is None or not a.alive:
            a = self.running[kind] = agents.spawn(
                self.dom, kind, capacity=CAP, label=f"{kind}-hostile", **AGENT_OPTS
            )
        return a

    def replace(self, kind: str) -> None:
        a = self.running.pop(kind, None)
        if a is not None:
            a.kill()
            self.dom.reap()
            if a.queue._held:
                a.queue.release()
        self.agent(kind)

    def probe(self, kind: str) -> str:
        """Whether the agent answers a barrier within ANSWER seconds: "ok", "killed" or "wedged"."""
        a = self.running[kind]
        if not a.alive:
            self.replace(kind)
            return "killed"
        st = None
        try:
            f = self.dom.fence(owner=a.id)  # ValueError when the agent is gone already
        except ValueError:
            pass
        else:
            try:
                a.queue.push(hl.Packet(type=hl.PacketType.BARRIER, signal=f.handle), timeout=ANSWER)
                st = f.wait(ANSWER)
            except (hl.HostlessError, TimeoutError):
                pass
            finally:
                f.release()
        if st is S.SUCCESS and a.alive:
            return "ok"
        try:
            a.proc.wait(1.0)  # an agent that failed the probe may be on its way out
        except subprocess.TimeoutExpired:
            pass
        verdict = "killed" if not a.alive else "wedged"
        self.replace(kind)
        return verdict

    def run(self, a: agents.Agent, pkt: hl.Packet | bytes, sig: hl.Fence | None = None) -> S | None:
        """Push ``pkt``; the status of ``sig`` (None when it was not signaled in time)."""
        a.queue.push(pkt, timeout=ANSWER)
        if sig is None:
            return None
        try:
            return sig.wait(ANSWER)
        except TimeoutError:
            return None


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    name = f"hltest-agh-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(name, fences=4096, participants=32, heap="32M", label="host")
    e = Env(d)
    try:
        e.agent("cpu")
        e.agent("npu")
        yield e
        report = os.environ.get("HL_HOSTILE_REPORT")  # where to write the verdicts (for before/after counts)
        if report:
            with open(report, "w") as fh:
                json.dump(e.verdicts, fh, indent=1)
        for o in e.owned:
            if o._held:
                o.release()
        for a in e.running.values():
            a.stop()
    finally:
        for a in e.running.values():
            a.kill()
        d.close()
        try:
            hl.Domain.unlink(name)
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- helpers of the cases


def relu_block(e: Env, follow: list[hl.Follow] = ()) -> tuple[hl.Buffer, hl.Buffer, hl.Buffer]:  # type: ignore[assignment]
    """(argument block of relu x -> out, x, out) with out zeroed."""
    x = e.buffer(np.arange(-4, 4, dtype=np.float32))
    out = e.buffer(np.zeros(8, np.float32))
    return e.block([x.handle, out.handle], follow=follow), x, out


def relu_packet(e: Env, sig: int = 0, follow: list[hl.Follow] = (), **kw: Any) -> tuple[hl.Packet, hl.Buffer]:  # type: ignore[assignment]
    ka, _x, out = relu_block(e, follow)
    return hl.Packet(kernel=kernel_id("relu"), args=ka.handle, signal=sig, **kw), out


def expect(e: Env, kind: str, status: S, **pkt: Any) -> None:
    """A relu packet with ``pkt`` fields on agent ``kind`` must end with ``status`` (its output
    written only on SUCCESS)."""
    a = e.agent(kind)
    f = e.fence(a)
    p, out = relu_packet(e, f.handle, **pkt)
    assert e.run(a, p, f) == status
    ran = bool((out.numpy() == np.maximum(np.arange(-4, 4), 0)).all())
    assert ran == (status is S.SUCCESS)


def wait_on(handle: int, value: int = 0, slot: int = 0) -> dict[str, Any]:
    w = [0, 0]
    v = [0, 0]
    w[slot], v[slot] = handle, value
    return {"wait": tuple(w), "wait_value": tuple(v)}


def after_bad_signal(e: Env, kind: str, signal: int, signal_value: int = 0) -> None:
    """A packet whose signal is bad: its follow-up (a barrier with a good fence) must fail
    with ERROR (the packet failed: nothing downstream of it runs) and its kernel must not run."""
    a = e.agent(kind)
    g = e.fence(a)
    fol = hl.Follow(a.queue.handle, hl.Packet(type=hl.PacketType.BARRIER, signal=g.handle))
    p, out = relu_packet(e, signal, [fol], signal_value=signal_value)
    e.run(a, p)
    st = g.wait(ANSWER)
    assert st is S.ERROR
    assert (out.numpy() == 0).all()


def ert_packet(e: Env, a: agents.Agent, cmd: bytes | hl.Buffer, sig: hl.Fence) -> hl.Packet:
    cb = cmd if isinstance(cmd, hl.Buffer) else e.raw(cmd)
    return hl.Packet(type=hl.PacketType.ERT, args=e.block([cb.handle]).handle, signal=sig.handle)


def expect_ert(e: Env, cmd: bytes | hl.Buffer, status: S = S.ERROR) -> None:
    a = e.agent("npu")
    f = e.fence(a)
    assert e.run(a, ert_packet(e, a, cmd, f), f) is status


def cu_args(bufs: list[int], scalars: list[int] = ()) -> list[int]:  # type: ignore[assignment]
    return [len(bufs)] + ert.u64_args(bufs) + ert.u64_args(list(scalars))


# --------------------------------------------------------------------------- directed cases

Case = Callable[[Env], None]
CASES: dict[str, tuple[str, Case]] = {}


def case(name: str, kind: str = "cpu") -> Callable[[Case], Case]:
    def deco(fn: Case) -> Case:
        CASES[name] = (kind, fn)
        return fn

    return deco


# ---- wait handles and values


@case("wait: a buffer handle")
def _(e: Env) -> None:
    expect(e, "cpu", S.ERROR, **wait_on(e.buffer(np.zeros(4)).handle))


@case("wait: a queue handle")
def _(e: Env) -> None:
    expect(e, "cpu", S.ERROR, **wait_on(e.agent("npu").queue.handle))


@case("wait: the agent's own queue, second slot")
def _(e: Env) -> None:
    expect(e, "cpu", S.ERROR, **wait_on(e.agent("cpu").queue.handle, slot=1))


@case("wait: a stale fence")
def _(e: Env) -> None:
    expect(e, "cpu", S.ERROR, **wait_on(e.stale()))


@case("wait: a forged fence")
def _(e: Env) -> None:
    expect(e, "cpu", S.ERROR, **wait_on(forged(e.fence().handle)))


@case("wait: an unknown kind")
def _(e: Env) -> None:
    expect(e, "cpu", S.ERROR, **wait_on(with_kind(e.fence().handle, 9)))


@case("wait: a random u64")
def _(e: Env) -> None:
    expect(e, "cpu", S.ERROR, **wait_on(0xDEADBEEFCAFEF00D))


@case("wait: timeline value 2**62")
def _(e: Env) -> None:
    expect(e, "cpu", S.ERROR, **wait_on(e.keep(e.dom.timeline()).handle, 1 << 62))


@case("wait: timeline value 2**64-1, second slot")
def _(e: Env) -> None:
    expect(e, "cpu", S.ERROR, **wait_on(e.keep(e.dom.timeline(3)).handle, (1 << 64) - 1, slot=1))


@case("wait: fence value is ignored")
def _(e: Env) -> None:
    f = e.fence()
    f.signal()
    expect(e, "cpu", S.SUCCESS, **wait_on(f.handle, (1 << 64) - 1))


@case("wait: fence word 5 (not a status)")
def _(e: Env) -> None:
    f = e.fence()
    e.poke(f.handle, 5)
    expect(e, "cpu", S.ERROR, **wait_on(f.handle))


@case("wait: fence word 1 (ACTIVE is not a final status)")
def _(e: Env) -> None:
    f = e.fence()
    e.poke(f.handle, 1)
    expect(e, "cpu", S.ERROR, **wait_on(f.handle))


@case("wait: fence word 2**63")
def _(e: Env) -> None:
    f = e.fence()
    e.poke(f.handle, 1 << 63)
    expect(e, "cpu", S.ERROR, **wait_on(f.handle))


@case("wait: timeline failed with status 5")
def _(e: Env) -> None:
    t = e.keep(e.dom.timeline())
    e.poke(t.handle, (1 << 62) | 5)
    expect(e, "cpu", S.ERROR, **wait_on(t.handle, 1))


@case("wait: a custom failure passes on")
def _(e: Env) -> None:
    f = e.fence()
    f.signal(100)
    expect(e, "cpu", S(100), **wait_on(f.handle))  # (pseudo-members compare equal)


@case("wait: a fence nobody signals (bounded wait)")
def _(e: Env) -> None:
    t0 = time.monotonic()
    expect(e, "cpu", S.ERROR, **wait_on(e.fence().handle))
    assert time.monotonic() - t0 < WAIT_TIMEOUT + 2


@case("wait: a timeline point nobody reaches (bounded wait)")
def _(e: Env) -> None:
    expect(e, "cpu", S.ERROR, **wait_on(e.keep(e.dom.timeline()).handle, TL_MAX))


# ---- signal handles and values


@case("signal: a buffer handle")
def _(e: Env) -> None:
    after_bad_signal(e, "cpu", e.buffer(np.zeros(4)).handle)


@case("signal: the agent's own queue")
def _(e: Env) -> None:
    after_bad_signal(e, "cpu", e.agent("cpu").queue.handle)


@case("signal: a stale fence")
def _(e: Env) -> None:
    after_bad_signal(e, "cpu", e.stale())


@case("signal: a forged fence")
def _(e: Env) -> None:
    after_bad_signal(e, "cpu", forged(e.fence().handle))


@case("signal: an unknown kind")
def _(e: Env) -> None:
    after_bad_signal(e, "cpu", with_kind(e.fence().handle, 0xEE))


@case("signal: a merged fence")
def _(e: Env) -> None:
    m = e.keep(e.dom.merge([e.fence(), e.fence()]))
    after_bad_signal(e, "cpu", m.handle)


@case("signal: timeline value 2**62 fails the timeline")
def _(e: Env) -> None:
    t = e.keep(e.dom.timeline())
    after_bad_signal(e, "cpu", t.handle, 1 << 62)
    assert t.failure is S.ERROR


@case("signal: timeline value not above the current one is ignored")
def _(e: Env) -> None:
    a = e.agent("cpu")
    t = e.keep(e.dom.timeline(10))
    p, out = relu_packet(e, t.handle, signal_value=3)
    e.run(a, p)
    assert e.probe("cpu") == "ok"
    assert (t.value, t.failure) == (10, None)
    assert out.numpy().max() == 3  # the kernel ran


@case("signal: a failure fails a timeline signal")
def _(e: Env) -> None:
    t = e.keep(e.dom.timeline())
    a = e.agent("cpu")
    p = hl.Packet(kernel=777, args=relu_block(e)[0].handle, signal=t.handle, signal_value=1)
    e.run(a, p)
    assert t.wait(1, ANSWER) is S.ERROR


# ---- argument blocks, kernels, packet types


@case("args: a fence handle")
def _(e: Env) -> None:
    expect_args(e, e.fence().handle)


@case("args: a timeline handle")
def _(e: Env) -> None:
    expect_args(e, e.keep(e.dom.timeline()).handle)


@case("args: a queue handle")
def _(e: Env) -> None:
    expect_args(e, e.agent("cpu").queue.handle)


@case("args: a stale handle")
def _(e: Env) -> None:
    expect_args(e, e.stale())


@case("args: bad magic")
def _(e: Env) -> None:
    expect_args(e, e.raw(ka_header(0, 0, 0, magic=0x12345678) + bytes(64)).handle)


@case("args: shorter than the header")
def _(e: Env) -> None:
    expect_args(e, e.raw(struct.pack("<I", MAGIC)).handle)


@case("args: buffer count past the block")
def _(e: Env) -> None:
    expect_args(e, e.raw(ka_header(0xFFFF, 0, 0) + bytes(48)).handle)


@case("args: scalar count past the block")
def _(e: Env) -> None:
    expect_args(e, e.raw(ka_header(2, 0xFFFF, 0) + bytes(16)).handle)


@case("args: follow-up count past the block")
def _(e: Env) -> None:
    expect_args(e, e.raw(ka_header(0, 0, 0xFFFF) + bytes(72 * 3)).handle)


@case("args: every count at its maximum")
def _(e: Env) -> None:
    expect_args(e, e.raw(ka_header(0xFFFF, 0xFFFF, 0xFFFF) + bytes(4000)).handle)


@case("args: a block in a float64 buffer is read by bytes")
def _(e: Env) -> None:
    a = e.agent("cpu")
    ka, _x, out = relu_block(e)
    blk = e.raw(bytes(ka.numpy()), np.float64)
    f = e.fence(a)
    assert e.run(a, hl.Packet(kernel=kernel_id("relu"), args=blk.handle, signal=f.handle), f) is S.SUCCESS
    assert out.numpy().max() == 3


@case("args: a block in a 2-D buffer is read by bytes")
def _(e: Env) -> None:
    a = e.agent("cpu")
    g = e.fence(a)
    fol = hl.Follow(a.queue.handle, hl.Packet(type=hl.PacketType.BARRIER, signal=g.handle))
    ka, _x, out = relu_block(e, [fol])
    data = bytes(ka.numpy())
    blk = e.raw(data + bytes((-len(data)) % 16), np.uint16, (-1, 8))
    f = e.fence(a)
    assert e.run(a, hl.Packet(kernel=kernel_id("relu"), args=blk.handle, signal=f.handle), f) is S.SUCCESS
    assert g.wait(ANSWER) is S.SUCCESS


@case("args: a fence among the buffers")
def _(e: Env) -> None:
    x = e.buffer(np.zeros(8, np.float32))
    expect_args(e, e.block([x.handle, e.fence().handle]).handle)


@case("args: a stale buffer")
def _(e: Env) -> None:
    b = e.dom.buffer(32)
    h = b.handle
    b.release()
    x = e.buffer(np.zeros(8, np.float32))
    expect_args(e, e.block([h, x.handle]).handle)


@case("args: huge and negative scalars")
def _(e: Env) -> None:
    a = e.agent("cpu")
    x, out = e.buffer(np.ones(8, np.float32)), e.buffer(np.zeros(8, np.float32))
    for s in ((1 << 64) - 1, 1 << 63, f64(-1e308), f64(float("inf"))):
        f = e.fence(a)
        p = hl.Packet(
            kernel=kernel_id("scale"), args=e.block([x.handle, out.handle], [s]).handle, signal=f.handle
        )
        assert e.run(a, p, f) in (S.SUCCESS, S.ERROR)
    f = e.fence(a)
    blk = e.block([x.handle, out.handle], [f64(1.0), f64(-0.0)])
    assert e.run(a, hl.Packet(kernel=kernel_id("normalize"), args=blk.handle, signal=f.handle), f) is S.ERROR


@case("args: too many buffers for the cache")
def _(e: Env) -> None:
    # more handles in one packet than the agent caches: none of them may be released mid-packet
    a = e.agent("cpu")
    bufs = [e.buffer(np.zeros(1, np.float32)).handle for _ in range(300)]
    f = e.fence(a)
    user = USER_KERNEL_BASE + 99  # unknown: fails after the views were taken
    assert e.run(a, hl.Packet(kernel=user, args=e.block(bufs).handle, signal=f.handle), f) is S.ERROR
    f = e.fence(a)
    assert (
        e.run(a, hl.Packet(kernel=kernel_id("add"), args=e.block(bufs).handle, signal=f.handle), f) is S.ERROR
    )


def expect_args(e: Env, args: int, kind: str = "cpu") -> None:
    a = e.agent(kind)
    f = e.fence(a)
    assert e.run(a, hl.Packet(kernel=kernel_id("relu"), args=args, signal=f.handle), f) is S.ERROR


@case("kernel: unknown ids")
def _(e: Env) -> None:
    a = e.agent("cpu")
    for k in (0, 777, USER_KERNEL_BASE + 50, (1 << 32) - 1):
        f = e.fence(a)
        assert e.run(a, hl.Packet(kernel=k, args=relu_block(e)[0].handle, signal=f.handle), f) is S.ERROR


@case("kernel: a conv2d past MAX_WORK fails at once")
def _(e: Env) -> None:
    a = e.agent("cpu")
    img, ker = e.buffer(np.zeros((1024, 1024), np.float32)), e.buffer(np.zeros((512, 512), np.float32))
    out = e.buffer(np.zeros((513, 513), np.float32))
    f = e.fence(a)
    blk = e.block([img.handle, ker.handle, out.handle])
    t0 = time.monotonic()
    assert e.run(a, hl.Packet(kernel=kernel_id("conv2d"), args=blk.handle, signal=f.handle), f) is S.ERROR
    assert time.monotonic() - t0 < 2


@case("packet: unknown types")
def _(e: Env) -> None:
    a = e.agent("cpu")
    for t in (0, 5, 99, 0xFFFF):
        f = e.fence(a)
        p = hl.Packet(type=t, kernel=kernel_id("relu"), args=relu_block(e)[0].handle, signal=f.handle)
        assert e.run(a, p, f) is S.ERROR


# ---- follow-ups


@case("follow: a fence as the queue")
def _(e: Env) -> None:
    bad_follow_queue(e, e.fence().handle)


@case("follow: a stale queue")
def _(e: Env) -> None:
    q = e.dom.queue(2)
    h = q.handle
    q.release()
    bad_follow_queue(e, h)


@case("follow: a buffer as the queue")
def _(e: Env) -> None:
    bad_follow_queue(e, e.buffer(np.zeros(4)).handle)


@case("follow: a queue whose consumer died")
def _(e: Env) -> None:
    dead = agents.spawn(e.dom, "cpu", capacity=2, label="dead")
    dead.kill()
    e.dom.reap()
    e.keep(dead.queue)
    for _ in range(2):  # (a dead consumer's queue takes a push while it has room: a respawn fails it unrun)
        dead.queue.push(hl.Packet(type=hl.PacketType.BARRIER), timeout=0)
    bad_follow_queue(e, dead.queue.handle)


@case("follow: a queue that stays full (bounded push)")
def _(e: Env) -> None:
    q = e.keep(e.dom.queue(2))  # nobody consumes it
    for _ in range(2):
        q.push(hl.Packet(type=hl.PacketType.BARRIER), timeout=0)
    t0 = time.monotonic()
    bad_follow_queue(e, q.handle)
    assert time.monotonic() - t0 < FOLLOW_TIMEOUT + 2


def bad_follow_queue(e: Env, qh: int) -> None:
    """The packet succeeds; the follow-up that cannot be pushed fails its own signal with ERROR,
    and so do the follow-ups nested in it."""
    a = e.agent("cpu")
    f, g, h = e.fence(a), e.fence(a), e.fence(a)
    inner = relu_block(
        e, [hl.Follow(a.queue.handle, hl.Packet(type=hl.PacketType.BARRIER, signal=h.handle))]
    )[0]
    fol = hl.Follow(qh, hl.Packet(kernel=kernel_id("relu"), args=inner.handle, signal=g.handle))
    p, out = relu_packet(e, f.handle, [fol])
    assert e.run(a, p, f) is S.SUCCESS
    assert g.wait(ANSWER) is S.ERROR
    assert h.wait(ANSWER) is S.ERROR


@case("follow: garbage packets into the npu's queue")
def _(e: Env) -> None:
    a, npu = e.agent("cpu"), e.agent("npu")
    rng = random.Random(7)
    fol = []
    for _ in range(5):
        raw = bytearray(rng.randbytes(64))
        raw[0:2] = rng.choice([1, 2, 3, 9]).to_bytes(2, "little")
        fol.append(hl.Follow(npu.queue.handle, hl.Packet.decode(bytes(raw))))
    f = e.fence(a)
    p, _out = relu_packet(e, f.handle, fol)
    assert e.run(a, p, f) is S.SUCCESS
    assert e.probe("npu") == "ok"


@case("follow: into the agent's own full queue")
def _(e: Env) -> None:
    a = e.agent("cpu")
    gate = e.fence()
    g = e.fence(a)
    fol = hl.Follow(a.queue.handle, hl.Packet(type=hl.PacketType.BARRIER, signal=g.handle))
    f = e.fence(a)
    p, _out = relu_packet(e, f.handle, [fol], **wait_on(gate.handle))
    a.queue.push(p, timeout=ANSWER)
    # fill the queue behind it: CAP barriers fit once the agent has taken the relu packet
    # (observable: its cell frees), and none more while the agent waits for the gate
    n = 0
    deadline = time.monotonic() + ANSWER
    while n < CAP and time.monotonic() < deadline:
        try:
            a.queue.push(hl.Packet(type=hl.PacketType.BARRIER), timeout=0)
            n += 1
        except hl.QueueFull:
            time.sleep(0.001)
    assert n == CAP
    with pytest.raises(hl.QueueFull):
        a.queue.push(hl.Packet(type=hl.PacketType.BARRIER), timeout=0)
    gate.signal()
    assert f.wait(ANSWER) is S.SUCCESS
    assert g.wait(ANSWER) is S.ERROR  # the follow-up could not be pushed: nobody else frees a cell


@case("follow: a packet that re-enqueues itself")
def _(e: Env) -> None:
    self_loop(e, 1)


@case("follow: a packet that re-enqueues itself twice")
def _(e: Env) -> None:
    self_loop(e, 2)


def self_loop(e: Env, fanout: int) -> None:
    """A packet whose follow-ups are itself, into the agent's own queue: the loop is cut after a
    bounded number of hops, and the agent keeps answering meanwhile."""
    a = e.agent("cpu")
    x = e.buffer(np.ones(8, np.float32))
    blk = e.raw(bytes(hl.Kernargs(buffers=[x.handle, x.handle]).nbytes() + 72 * fanout))
    me = hl.Packet(kernel=kernel_id("relu"), args=blk.handle)
    blk.numpy()[:] = np.frombuffer(
        hl.Kernargs(buffers=[x.handle, x.handle], follow=[hl.Follow(a.queue.handle, me)] * fanout).encode(),
        np.uint8,
    )
    start = a.queue.info()["completed"]
    a.queue.push(me, timeout=ANSWER)
    t0 = time.monotonic()
    assert e.probe("cpu") == "ok"
    assert time.monotonic() - t0 < ANSWER
    # the loop ends by itself: the agent's count of finished packets stops moving
    # (stable count AND an empty queue: on a loaded machine the agent may run nothing for 0.2 s)
    deadline = time.monotonic() + 20
    done = a.queue.info()["completed"]
    while time.monotonic() < deadline:
        time.sleep(0.2)
        i = a.queue.info()
        now = i["completed"]
        if now == done and i["write_index"] == i["read_index"]:
            break
        done = now
    i = a.queue.info()
    assert i["completed"] == done and i["write_index"] == i["read_index"], (
        "the self-enqueueing packet never stopped"
    )
    # at most 1 + 64 hops, each hop at most a queue's worth of copies (and the probe)
    assert done - start <= CAP * 65 + 1, f"the self-enqueueing packet ran {done - start} times"


# ---- ERT command buffers (npu)


def hdr(count: int, opcode: int = ert.Opcode.START_CU) -> bytes:
    return struct.pack("<I", ert.header(ert.State.NEW, count, opcode))


@case("ert: count past the buffer", "npu")
def _(e: Env) -> None:
    expect_ert(e, hdr(2000) + struct.pack("<I", 1 << cu_index("relu")))


@case("ert: count 0", "npu")
def _(e: Env) -> None:
    expect_ert(e, hdr(0) + bytes(12))


@case("ert: shorter than a header", "npu")
def _(e: Env) -> None:
    expect_ert(e, b"\x01")


@case("ert: CU index 31", "npu")
def _(e: Env) -> None:
    expect_ert(e, ert.start_cu(31, [0]).encode())


@case("ert: buffer count 2**32-1", "npu")
def _(e: Env) -> None:
    expect_ert(e, ert.start_cu(cu_index("relu"), [0xFFFFFFFF, 1, 2]).encode())


@case("ert: a fence as a CU buffer", "npu")
def _(e: Env) -> None:
    x = e.buffer(np.zeros(8, np.float32))
    expect_ert(e, ert.start_cu(cu_index("relu"), cu_args([x.handle, e.fence().handle])).encode())


@case("ert: START_NPU shorter than its fixed words", "npu")
def _(e: Env) -> None:
    expect_ert(e, ert.ErtCommand(ert.State.NEW, ert.Opcode.START_NPU, ert.CmdType.CU, 1, [1, 2]).encode())


@case("ert: chain count 2**32-1", "npu")
def _(e: Env) -> None:
    expect_ert(
        e,
        ert.ErtCommand(
            ert.State.NEW, ert.Opcode.CMD_CHAIN, ert.CmdType.CU, 0, [0xFFFFFFFF] + [0] * 7
        ).encode(),
    )


@case("ert: a chain that contains itself", "npu")
def _(e: Env) -> None:
    n = 500
    cb = e.raw(bytes(4 * (1 + ert.CHAIN_HEADER_WORDS + 2 * n)))
    cb.numpy()[:] = np.frombuffer(ert.cmd_chain([cb.handle] * n).encode(), np.uint8)
    t0 = time.monotonic()
    expect_ert(e, cb)
    assert time.monotonic() - t0 < ANSWER


@case("ert: a chain of chains", "npu")
def _(e: Env) -> None:
    x = e.buffer(np.zeros(8, np.float32))
    leaf = e.raw(ert.start_cu(cu_index("relu"), cu_args([x.handle, x.handle])).encode())
    inner = e.raw(ert.cmd_chain([leaf.handle] * 400).encode())
    mid = e.raw(ert.cmd_chain([inner.handle] * 400).encode())
    t0 = time.monotonic()
    expect_ert(e, ert.cmd_chain([mid.handle] * 400).encode())
    assert time.monotonic() - t0 < ANSWER


@case("ert: a fence as the command buffer", "npu")
def _(e: Env) -> None:
    a = e.agent("npu")
    f = e.fence(a)
    p = hl.Packet(type=hl.PacketType.ERT, args=e.block([e.fence().handle]).handle, signal=f.handle)
    assert e.run(a, p, f) is S.ERROR


@case("ert: a command in a float32 2-D buffer is read by bytes", "npu")
def _(e: Env) -> None:
    x = e.buffer(np.arange(-4, 4, dtype=np.float32))
    out = e.buffer(np.zeros(8, np.float32))
    raw = ert.start_cu(cu_index("relu"), cu_args([x.handle, out.handle])).encode()
    cb = e.raw(raw + bytes((-len(raw)) % 8), np.float32, (-1, 2))
    expect_ert(e, cb, S.SUCCESS)
    assert out.numpy().max() == 3
    assert int(cb.numpy().view("<u4").reshape(-1)[0]) & 0xF == ert.State.COMPLETED


@case("ert: unsupported opcodes", "npu")
def _(e: Env) -> None:
    for op in (ert.Opcode.CONFIGURE, ert.Opcode.EXIT, ert.Opcode.ABORT, 31):
        expect_ert(e, hdr(1, op) + struct.pack("<I", 1))


# --------------------------------------------------------------------------- the directed tests


def test_the_agents_are_native(env: Env) -> None:
    """The cases run against the default cpu and npu agents: the engine's C loop."""
    assert env.agent("cpu").native is True and env.agent("cpu").capabilities["native"]
    assert env.agent("npu").native is True and env.agent("npu").capabilities["ert"] == "C"


@pytest.mark.parametrize("name", list(CASES))
def test_directed(env: Env, name: str) -> None:
    kind, fn = CASES[name]
    err: BaseException | None = None
    try:
        fn(env)
    except Exception as ex:  # classified below: an agent that died or stopped answering first
        err = ex
    verdicts = {k: env.probe(k) for k in ("cpu", "npu")}
    env.verdicts[name] = verdicts[kind]
    assert verdicts == {"cpu": "ok", "npu": "ok"}, f"{name}: agents {verdicts} ({err!r})"
    if err is not None:
        raise err


# --------------------------------------------------------------------------- random packets


@dataclass
class Pool:
    """Interesting values for every packet field."""

    handles: list[int]
    waits: list[tuple[int, int]]
    args: list[int]
    fresh: Callable[[], hl.Fence]


def make_pool(e: Env, rng: random.Random) -> Pool:
    cpu, npu = e.agent("cpu"), e.agent("npu")
    x = e.buffer(np.arange(-8, 8, dtype=np.float32))
    y = e.buffer(np.zeros(16, np.float32))
    w = e.buffer(np.ones((4, 4), np.float32))
    done, failed, w5 = e.fence(), e.fence(), e.fence()
    done.signal()
    failed.signal(S.CANCEL)
    e.poke(w5.handle, 5)
    tl = e.keep(e.dom.timeline(10))
    merged = e.keep(e.dom.merge([done]))
    objs = [x.handle, y.handle, w.handle, done.handle, failed.handle, w5.handle, tl.handle, merged.handle]
    objs += [cpu.queue.handle, npu.queue.handle, e.stale(), forged(x.handle), with_kind(done.handle, 7)]
    handles = objs + [0, (1 << 64) - 1]
    waits = [(h, 0) for h in objs] + [(tl.handle, v) for v in (0, 5, 10, 11, TL_MAX, 1 << 62, (1 << 64) - 1)]

    def rand_packet(depth: int) -> hl.Packet:
        t = rng.choice([1, 1, 2, 3, 0, 77])
        return hl.Packet(
            type=t,
            kernel=rng.choice([kernel_id("relu"), kernel_id("copy"), kernel_id("add"), 5, 999]),
            args=rng.choice(args[:] + [0]) if args and depth < 2 else 0,
            signal=rng.choice(handles),
            signal_value=rng.choice([0, 11, 1 << 62]),
        )

    args: list[int] = []
    good = [[x.handle, y.handle], [x.handle, x.handle, y.handle], [w.handle, w.handle, w.handle], [y.handle]]
    for bufs in good:
        args.append(e.block(bufs).handle)
    for _ in range(6):
        fol = [hl.Follow(rng.choice([cpu.queue.handle, npu.queue.handle, done.handle, 0]), rand_packet(0))]
        args.append(e.block(rng.choice(good), follow=fol).handle)
    for raw in (
        ka_header(0xFFFF, 0xFFFF, 0xFFFF),
        ka_header(1, 1, 1, magic=1),
        ka_header(2, 0, 0) + struct.pack("<2Q", x.handle, done.handle),
        ka_header(0, 0, 1) + struct.pack("<Q", cpu.queue.handle) + bytes(rng.randbytes(64)),
        struct.pack("<I", MAGIC),
    ):
        args.append(e.raw(raw).handle)
    cmds = [
        ert.start_cu(cu_index("relu"), cu_args([x.handle, y.handle])).encode(),
        ert.start_cu(20, [0]).encode(),
        hdr(1500),
        ert.cmd_chain([x.handle, 0]).encode(),
        bytes(rng.randbytes(40)),
    ]
    for c in cmds:
        args.append(e.block([e.raw(c).handle]).handle)
    args += [x.handle, done.handle, tl.handle, cpu.queue.handle, e.stale()]
    return Pool(handles, waits, args, lambda: e.fence())


def random_packet(rng: random.Random, pool: Pool, fresh: hl.Fence, tl: int) -> bytes:
    def u64() -> int:
        return rng.getrandbits(64)

    r = rng.random()  # mostly a good signal, so that most packets get past the signal check
    sig = fresh.handle if r < 0.55 else 0 if r < 0.65 else rng.choice(pool.handles + [u64()])
    sv = rng.choice([0, 1, 11, TL_MAX, 1 << 62, u64()])
    waits = []
    for _ in range(2):
        r = rng.random()
        if r < 0.6:
            waits.append((0, u64() if rng.random() < 0.2 else 0))
        elif r < 0.93:
            waits.append(rng.choice(pool.waits))
        else:
            waits.append((u64(), u64()))
    t = rng.choice([1] * 6 + [2] * 4 + [3] * 2 + [0, 9, 0xFFFF])
    kernel = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1000, 0xFFFFFFFF, u64() & 0xFFFFFFFF])
    args = rng.choice(pool.args + [0, u64()])
    flags = rng.choice([0, 0, 1, 0xFFFF])
    return struct.pack(
        "<HHIQQQ2Q2Q", t, flags, kernel, args, sig, sv, waits[0][0], waits[1][0], waits[0][1], waits[1][1]
    )


N_FUZZ = 140


def test_random_packets(env: Env) -> None:
    rng = random.Random(20240611)
    pool = make_pool(env, rng)
    bad: dict[str, list[int]] = {"killed": [], "wedged": [], "unsignaled": []}
    for i in range(N_FUZZ):
        kind = "cpu" if i % 3 else "npu"
        a = env.agent(kind)
        fresh = env.dom.fence()
        raw = random_packet(rng, pool, fresh, 0)
        try:
            a.queue.push(raw, timeout=ANSWER)
        except hl.HostlessError:
            pass  # the probe tells why
        verdict = env.probe(kind)
        if verdict != "ok":
            bad[verdict].append(i)
            pool = make_pool(env, rng)  # the queues were replaced
        elif hl.Packet.decode(raw).signal == fresh.handle and fresh.status is S.ACTIVE:
            bad["unsignaled"].append(i)
        fresh.release()
    for kind in ("cpu", "npu"):
        assert env.probe(kind) == "ok"
    env.verdicts["random packets"] = json.dumps({k: len(v) for k, v in bad.items()})
    assert bad == {"killed": [], "wedged": [], "unsignaled": []}
    # a valid packet after all of that completes, and both agents are alive
    a = env.agent("cpu")
    f = env.fence(a)
    p, out = relu_packet(env, f.handle)
    assert env.run(a, p, f) is S.SUCCESS
    assert out.numpy().max() == 3
    assert all(x.alive for x in env.running.values())


# --------------------------------------------------------------------------- the cuda agent's checks


class _Recorder:
    """Stands in for the CUDA peer / stream / CuPy: records every call, does nothing."""

    def __init__(self, calls: list[str], name: str = "peer") -> None:
        self._calls, self._name = calls, name

    def __getattr__(self, attr: str) -> Any:
        return _Recorder(self._calls, f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._calls.append(self._name)
        return _Recorder(self._calls, f"{self._name}()")

    def __enter__(self) -> _Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_cuda_agent_checks_packets_before_any_stream_wait(env: Env) -> None:
    """The cuda agent's packet checks need no GPU: a bad packet fails with ERROR before any
    stream wait is enqueued (a synchronize behind a wait that never completes would wedge it)."""
    from hostless.agents.cuda_agent import CudaLoop

    calls: list[str] = []
    q = env.keep(env.dom.queue(4))
    ag = CudaLoop.__new__(CudaLoop)
    super(CudaLoop, ag).__init__(env.dom, q, "cuda", {}, os.getppid(), WAIT_TIMEOUT, FOLLOW_TIMEOUT)
    ag.peer = _Recorder(calls)  # type: ignore[assignment]
    ag.cp = _Recorder(calls, "cp")
    ag.kernels = {kernel_id("relu"): _Recorder(calls, "kernel")}
    ag.inflight, ag.warm, ag.armed, ag.runners = [], set(), {}, {}
    x = env.buffer(np.zeros(8, np.float32))
    good = env.block([x.handle, x.handle]).handle
    relu = kernel_id("relu")
    tl = env.keep(env.dom.timeline())
    bad = {
        "unknown type": hl.Packet(type=9, kernel=relu, args=good),
        "ERT type": hl.Packet(type=hl.PacketType.ERT, kernel=relu, args=good),
        "signal of the wrong kind": hl.Packet(kernel=relu, args=good),
        "wait of the wrong kind": hl.Packet(kernel=relu, args=good, **wait_on(x.handle)),
        "wait value 2**62": hl.Packet(kernel=relu, args=good, **wait_on(tl.handle, 1 << 62)),
        "stale wait": hl.Packet(kernel=relu, args=good, **wait_on(env.stale())),
        "args of the wrong kind": hl.Packet(kernel=relu, args=tl.handle),
        "bad magic": hl.Packet(kernel=relu, args=env.raw(ka_header(0, 0, 0, magic=7)).handle),
        "count past the block": hl.Packet(kernel=relu, args=env.raw(ka_header(9, 0, 0)).handle),
        "unknown kernel": hl.Packet(kernel=4242, args=good),
        "a fence as a buffer": hl.Packet(kernel=relu, args=env.block([env.fence().handle]).handle),
    }
    for what, p in bad.items():
        f = env.fence()
        p.signal = x.handle if what == "signal of the wrong kind" else f.handle
        del calls[:]
        ag.execute(0, p)
        assert not [c for c in calls if c.startswith("peer.wait") or c.startswith("peer.gate")], what
        if what != "signal of the wrong kind":
            assert f.status is S.ERROR, what
    # a follow-up whose queue is bad is dropped (its signal fails) before the stream waits
    g = env.fence()
    fol = hl.Follow(env.fence().handle, hl.Packet(type=hl.PacketType.BARRIER, signal=g.handle))
    del calls[:]
    ag.execute(0, hl.Packet(kernel=relu, args=env.block([x.handle, x.handle], follow=[fol]).handle))
    assert g.status is S.ERROR
    assert "peer.gate" in calls and "peer.enqueue" not in calls


def test_cuda_agent_pushes_follow_ups_from_the_argument_block(env: Env) -> None:
    """The cuda agent copies no follow-up: the push (a host function the stream runs) reads the
    packet where it lies in the argument block, and the agent holds the block until the stream
    has passed the push; a push that did not succeed fails the follow-up's signal then."""
    from hostless import lowlevel, wire
    from hostless.agents.cuda_agent import CudaLoop

    calls: list[str] = []
    pushed: list[tuple[int, hl.Buffer, int]] = []

    class Event:
        done = False

    ev = Event()

    class Push:
        result = (True, 0)

        def state(self) -> tuple[bool, int]:
            return self.result

    push = Push()

    class Peer(_Recorder):
        def enqueue(self, q: Any, buf: hl.Buffer, gate: Any = None, offset: int = 0, **kw: Any) -> Any:
            pushed.append((q.handle, buf, offset))
            return push

    peer = Peer(calls)
    peer.stream = _Recorder(calls, "stream")  # type: ignore[attr-defined]
    peer.stream.record = lambda: ev
    q, q2 = env.keep(env.dom.queue(4)), env.keep(env.dom.queue(4))
    ag = CudaLoop.__new__(CudaLoop)
    super(CudaLoop, ag).__init__(env.dom, q, "cuda", {}, os.getppid(), WAIT_TIMEOUT, FOLLOW_TIMEOUT)
    ag.peer, ag.cp = peer, _Recorder(calls, "cp")  # type: ignore[assignment]
    ag.kernels = {kernel_id("relu"): _Recorder(calls, "kernel")}
    ag.inflight, ag.warm, ag.armed, ag.runners = [], set(), {}, {}
    x = env.buffer(np.zeros(8, np.float32))
    fp = hl.Packet(type=hl.PacketType.BARRIER, signal=env.fence().handle)
    block = env.block([x.handle, x.handle], [7], follow=[hl.Follow(q2.handle, fp)])
    ag.execute(0, hl.Packet(kernel=kernel_id("relu"), args=block.handle))
    ((qh, held, off),) = pushed
    assert qh == q2.handle and held.handle == block.handle
    assert off == wire.follow_offset(2, 1, 0) + wire.FO_PACKET
    assert hl.Packet.decode(bytes(held.numpy()[off : off + wire.PACKET_SIZE])) == fp
    assert lowlevel.is_held(held)  # until the stream passed the push
    ev.done = True
    ag._recycle()
    assert not lowlevel.is_held(held) and ag.inflight == []
    assert env.dom.import_fence(fp.signal).status == hl.Status.ACTIVE  # pushed: not failed
    # a push the host function could not make (its queue stayed full): the follow-up's signal fails
    sig = env.fence()
    fp2 = hl.Packet(type=hl.PacketType.BARRIER, signal=sig.handle)
    block2 = env.block([x.handle, x.handle], [7], follow=[hl.Follow(q2.handle, fp2)])
    push.result = (True, -7)  # HL_E_FULL
    ev.done = False
    ag.execute(1, hl.Packet(kernel=kernel_id("relu"), args=block2.handle))
    assert sig.status == hl.Status.ACTIVE
    ev.done = True
    ag._recycle()
    assert sig.wait(5) == hl.Status.ERROR
    ag.cache.clear()
