"""The GPU command processor (GPU tests: run on the GPU machine, skipped elsewhere with the reason).

Execution of built-in kernels by the resident kernel, direct chains GPU ->
GPU and GPU -> CPU agent, follow-ups run in place, the decoded-argument cache
seeing a rewritten block, failure passing (to follow-ups too), a bad packet
failing alone, STOP, a killed host process (its stage fails OWNER_DIED; a new
processor serves), and both isolations (green context, bounded grid).  Then
directed hostile packets (``test_hostile_packet_fails_alone``, about 90 cases
mirroring tests/hostile/test_agents_hostile.py plus the GPU's own: lying buffer slots
and metadata, shapes and dtypes, ERT cu_masks and counts): each fails alone and
the processor serves a good packet after it.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import time
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import hostless as hl
import test_agents_hostile as hostile  # the CPU agents' hostile cases: their helpers
from hostless import agents, ert
from hostless._abi import C
from hostless.agents import gpucp
from hostless.buffer import bytes_buffer
from hostless.graph import Graph
from hostless.kernels import USER_KERNEL_BASE, f64, kernel_id
from hostless.status import Status
from hostless.wire import Follow, Kernargs, Packet, PacketType

cuda = pytest.importorskip("hostless.cuda")
_why = cuda.available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_why is not None, reason=f"no usable GPU: {_why}")]


@pytest.fixture
def dom():
    name = f"hlcp-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(name, heap="64M", device_heaps={"cuda:0": 64 << 20})
    yield d
    d.close()
    hl.Domain.unlink(name)


def _run(ag, args, kernel=4, wait=None, ptype=PacketType.KERNEL):
    """Push one packet (``args``: its argument block) into ``ag``'s queue with a fresh fence as
    its signal (``wait``: (handle, value) of an input); returns the fence's status."""
    f = ag.dom.fence()
    extra = {"wait": wait} if wait else {}
    ag.queue.push(Packet(type=ptype, kernel=kernel, args=args.handle, signal=f.handle, **extra))
    return f.wait(timeout=30)


def _chain(dom, ag, n=64):
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((n, n)) / np.sqrt(n)).astype("f4")
    g = Graph(dom).input("x", (n, n), "f4").constant("w", w)
    g.stage("norm", ag, "normalize", ["x"], ("a", (n, n), "f4"), scalars=[0.5, 2.0])
    g.stage("mm", ag, "gemm", ["a", "w"], ("b", (n, n), "f4"))
    g.stage("act", ag, "relu", ["b"], ("c", (n, n), "f4"))
    g.stage("sm", ag, "softmax", ["c"], ("y", (n, n), "f4"))

    def ref(x):
        c = np.maximum(((x - 0.5) / 2.0) @ w, 0)
        e = np.exp(c - c.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return g, ref


@pytest.mark.parametrize("dispatch", ["direct", "host"])
@pytest.mark.parametrize("data", ["shared", "copy"])
def test_chain_runs_on_the_command_processor(dom, dispatch, data):
    cp = agents.spawn(dom, "gpucp", device=0)
    try:
        g, ref = _chain(dom, cp)
        x = np.random.default_rng(0).standard_normal((64, 64)).astype("f4")
        with g.compile(dispatch=dispatch, data=data) as cg:
            for _ in range(5):
                out = cg.run({"x": x}, timeout=60)["y"]
                assert np.allclose(out, ref(x), rtol=1e-4, atol=1e-5)
        time.sleep(0.2)  # the counters go out when the queue is idle
        st = gpucp.stats(cp)
        assert st["packets"] >= 20 and st["failed"] == 0
        assert st["hits"] > 0 and st["local"] > 0  # decoded blocks reused; 64x64 jobs run on block 0
        if dispatch == "direct":  # one frame at a time: each follow-up finds the queue empty
            assert st["inplace"] >= 15, st
        else:
            assert st["inplace"] == 0, st
    finally:
        cp.stop()


def test_pushes_follow_host_native_atomics(dom, monkeypatch):
    """Who pushes the processor's follow-ups: the GPU where its atomics on host memory are atomic
    against the host's, else the host forwarder; forced device pushes without them warn."""
    cu = pytest.importorskip("cuda.bindings.driver")
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED
    err, dev = cu.cuDeviceGet(0)
    err, native = cu.cuDeviceGetAttribute(attr, dev)
    for forced in ("", "device"):
        monkeypatch.setenv("HOSTLESS_GPUCP_PUSHES", forced)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            cp = agents.spawn(dom, "gpucp", device=0)
        try:
            assert cp.capabilities["host_native_atomics"] is bool(native)
            assert cp.capabilities["pushes"] == (forced or ("device" if native else "host"))
            warned = [w for w in got if issubclass(w.category, hl.errors.DeviceAtomicsWarning)]
            assert len(warned) == (1 if forced and not native else 0), [str(w.message) for w in got]
        finally:
            cp.stop()


def test_follow_ups_race_host_pushes_into_one_queue_without_loss(dom):
    """The processor's follow-ups into a queue a host thread pushes into at the same time: each
    arrives once, in order.  With device atomics on a GPU without host-native atomics a push was
    lost or the queue corrupted (45% of updates lost: hostless_tools.bench.gpu_atomics); the
    host forwarder (core/cpfwd.c) pushes them instead.  HOSTLESS_GPUCP_PUSHES=device runs it
    on the device pushes (the old behaviour) to show the race."""
    import threading

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cp = agents.spawn(dom, "gpucp", device=0)
    try:
        native = cp.capabilities["host_native_atomics"]
        want = os.environ.get("HOSTLESS_GPUCP_PUSHES") or ("device" if native else "host")
        assert cp.capabilities["pushes"] == want
        n = 2000
        q = dom.queue(8192)
        q.bind()
        x = dom.buffer((4,), "f4")
        y = dom.buffer((4,), "f4")
        blocks, done = [], []
        for i in range(n):
            f = dom.fence()
            fol = [Follow(q.handle, Packet(kernel=1, signal_value=i + 1))]
            blocks.append(bytes_buffer(dom, Kernargs(buffers=[x.handle, y.handle], follow=fol).encode()))
            done.append(f)

        def host() -> None:
            for i in range(n):
                q.push(Packet(kernel=2, signal_value=i + 1))

        def feed() -> None:
            for b, f in zip(blocks, done, strict=True):
                cp.queue.push(Packet(type=PacketType.KERNEL, kernel=4, args=b.handle, signal=f.handle))

        t, t2 = threading.Thread(target=host), threading.Thread(target=feed)
        t2.start()
        time.sleep(0.002)  # the processor's pushes under way before the host's begin
        t.start()
        t.join()
        t2.join()
        assert all(f.wait(timeout=30) == Status.SUCCESS for f in done)
        seen = {1: [], 2: []}
        for _ in range(2 * n):
            r = q.pop(timeout=10)
            assert r is not None, f"lost: {len(seen[1])} + {len(seen[2])} of {2 * n} arrived"
            seen[r[1].kernel].append(r[1].signal_value)
            q.completed()
        assert seen[1] == list(range(1, n + 1)) and seen[2] == list(range(1, n + 1))
    finally:
        cp.stop()


@pytest.mark.parametrize("isolation", ["green", "grid"])
def test_isolation_is_reported_and_serves(dom, isolation):
    if isolation == "green":
        cu = pytest.importorskip("cuda.bindings.driver")
        if not hasattr(cu, "cuGreenCtxCreate"):
            pytest.skip("these CUDA bindings have no green contexts")
    cp = agents.spawn(dom, "gpucp", device=0, sms=8, isolation=isolation)
    try:
        caps = cp.capabilities
        assert caps["isolation"] == ("green context" if isolation == "green" else "grid")
        assert caps["sms"] >= 8 and caps["workers"] == caps["sms"] - 1 and caps["sms"] <= caps["sms_total"]
        n = 96  # not a multiple of the 32-wide tiles
        rng = np.random.default_rng(1)
        w = rng.standard_normal((n, n)).astype("f4")
        x = rng.standard_normal((n, n)).astype("f4")
        g = Graph(dom).input("x", (n, n), "f4").constant("w", w)
        g.stage("mm", cp, "gemm", ["x", "w"], ("y", (n, n), "f4"))
        with g.compile() as cg:
            assert np.allclose(cg.run({"x": x}, timeout=60)["y"], x @ w, rtol=1e-3, atol=1e-3)
        g2 = Graph(dom).input("x", (n, n), "f4")
        g2.stage("s", cp, "sum", ["x"], ("t", (1,), "f4"))
        with g2.compile() as cg:
            assert np.isclose(cg.run({"x": x}, timeout=60)["t"][0], x.sum(), rtol=1e-3, atol=1e-2)
    finally:
        cp.stop()


def test_rewritten_argument_block_is_seen(dom):
    """The processor keeps decoded argument blocks; a block rewritten between packets
    (another buffer handle in it) must be decoded again, not served from the cache."""
    cp = agents.spawn(dom, "gpucp", device=0)
    try:
        x1 = dom.buffer((8,), "f4")
        x2 = dom.buffer((8,), "f4")
        y = dom.buffer((8,), "f4")
        x1.numpy()[...] = -1
        x2.numpy()[...] = 5
        args = bytes_buffer(dom, Kernargs(buffers=[x1.handle, y.handle]).encode())
        assert _run(cp, args) == Status.SUCCESS and (y.numpy() == 0).all()
        args.numpy()[:] = np.frombuffer(Kernargs(buffers=[x2.handle, y.handle]).encode(), np.uint8)
        assert _run(cp, args) == Status.SUCCESS and (y.numpy() == 5).all()
        # the same block, a released buffer in it: the cached decode must not be used
        x2.release()
        assert _run(cp, args) == Status.ERROR
        assert gpucp.stats(cp)["last_reason"] == "a buffer handle names no live buffer here"
    finally:
        cp.stop()


def test_failure_reaches_the_follow_ups(dom):
    """A packet whose input failed runs nothing and fails its follow-ups' signals, so that
    their waiters are released (here the follow-up was meant to run in place)."""
    cp = agents.spawn(dom, "gpucp", device=0)
    try:
        x = dom.buffer((4,), "f4")
        y = dom.buffer((4,), "f4")
        z = dom.buffer((4,), "f4")
        f2 = dom.fence()
        args2 = bytes_buffer(dom, Kernargs(buffers=[y.handle, z.handle]).encode())
        follow = Packet(type=PacketType.KERNEL, kernel=4, args=args2.handle, signal=f2.handle)
        args1 = bytes_buffer(
            dom, Kernargs(buffers=[x.handle, y.handle], follow=[Follow(cp.queue.handle, follow)]).encode()
        )
        bad = dom.fence()
        bad.signal(Status.CANCEL)
        assert _run(cp, args1, wait=(bad.handle, 0)) == Status.CANCEL
        assert f2.wait(timeout=30) == Status.CANCEL
        # an argument block too large for the processor fails alone
        big = bytes_buffer(dom, Kernargs(buffers=[x.handle, y.handle], scalars=[0] * 200).encode())
        assert _run(cp, big) == Status.ERROR
        assert gpucp.stats(cp)["last_reason"] == "bad argument block"
    finally:
        cp.stop()


def test_gpu_to_cpu_agent_direct(dom):
    cp = agents.spawn(dom, "gpucp", device=0)
    cpu = agents.spawn(dom, "cpu")
    try:
        x = np.linspace(-2, 2, 256, dtype="f4").reshape(16, 16)
        g = Graph(dom).input("x", (16, 16), "f4")
        g.stage("g", cp, "relu", ["x"], ("h", (16, 16), "f4"))
        g.stage("c", cpu, "scale", ["h"], ("h2", (16, 16), "f4"), scalars=[3.0])
        g.stage("g2", cp, "add", ["h2", "h"], ("y", (16, 16), "f4"))
        with g.compile(dispatch="direct", data="shared") as cg:
            for _ in range(3):
                assert np.allclose(cg.run({"x": x}, timeout=60)["y"], 4 * np.maximum(x, 0))
    finally:
        cp.stop()
        cpu.stop()


def test_bad_packet_fails_alone_and_failure_passes_through(dom):
    cp = agents.spawn(dom, "gpucp", device=0)
    try:
        # an unknown kernel id: the packet's fence fails with ERROR, the processor goes on
        x = dom.buffer((4,), "f4")
        y = dom.buffer((4,), "f4")
        args = bytes_buffer(dom, Kernargs(buffers=[x.handle, y.handle]).encode())
        assert _run(cp, args, kernel=999) == Status.ERROR
        # an input that failed: the stage does not run, its fence carries the input's status
        bad = dom.fence()
        bad.signal(Status.CANCEL)
        y.numpy()[...] = 7
        assert _run(cp, args, wait=(bad.handle, 0)) == Status.CANCEL
        assert (y.numpy() == 7).all()  # nothing ran
        # and it still serves
        x.numpy()[...] = [-1, 2, -3, 4]
        assert _run(cp, args) == Status.SUCCESS
        assert list(y.numpy()) == [0, 2, 0, 4]
    finally:
        cp.stop()


def test_stop_packet_ends_the_processor(dom):
    cp = agents.spawn(dom, "gpucp", device=0)
    cp.stop()
    assert cp.proc.wait(30) == 0


def test_killed_host_process_fails_its_stage_and_a_new_one_serves(dom):
    cp = agents.spawn(dom, "gpucp", device=0)
    x = dom.buffer((4,), "f4")
    y = dom.buffer((4,), "f4")
    args = bytes_buffer(dom, Kernargs(buffers=[x.handle, y.handle]).encode())
    never = dom.fence()
    t = dom.timeline(owner=cp.id)
    cp.queue.push(
        Packet(type=PacketType.KERNEL, kernel=4, args=args.handle, signal=t.handle, signal_value=1,
               wait=(never.handle, 0))
    )
    time.sleep(0.5)  # the GPU waits on `never`
    os.kill(cp.proc.pid, signal.SIGKILL)
    cp.proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and t.failure is None:
        dom.reap()
        time.sleep(0.05)
    assert t.failure == Status.OWNER_DIED
    cp2 = agents.spawn(dom, "gpucp", device=0)
    try:
        x.numpy()[...] = [1, -1, 1, -1]
        assert _run(cp2, args) == Status.SUCCESS
        assert list(y.numpy()) == [1, 0, 1, 0]
    finally:
        cp2.stop()
        never.signal()


@pytest.mark.parametrize("shape", [(5, 40), (3, 300), (7, 1), (1000, 33)])
def test_kernels_at_odd_shapes(dom, shape):
    """Softmax in registers (rows <= 256) and the generic loop (longer rows), elementwise
    kernels with their unrolled loads over sizes that are no multiple of anything, on block 0
    (small) and on the worker blocks (large)."""
    cp = agents.spawn(dom, "gpucp", device=0)
    try:
        rng = np.random.default_rng(7)
        x = rng.standard_normal(shape).astype("f4")
        g = Graph(dom).input("x", shape, "f4")
        g.stage("sm", cp, "softmax", ["x"], ("s", shape, "f4"))
        g.stage("sc", cp, "scale", ["s"], ("t", shape, "f4"), scalars=[3.0])
        g.stage("ad", cp, "add", ["t", "x"], ("u", shape, "f4"))
        g.stage("re", cp, "relu", ["u"], ("y", shape, "f4"))
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        ref = np.maximum(3 * e / e.sum(axis=-1, keepdims=True) + x, 0)
        with g.compile() as cg:
            for _ in range(2):
                assert np.allclose(cg.run({"x": x}, timeout=60)["y"], ref, rtol=1e-4, atol=1e-5)
    finally:
        cp.stop()


def test_ert_commands_run_on_the_gpu(dom):
    """ERT packets as the emulated NPU takes them: START_CU / START_NPU on the CU their cu_mask
    names (the CU index is the kernel id), buffers and scalars in the command, the state written
    back into the header (COMPLETED; ERROR for a cu_mask naming two CUs and for a CMD_CHAIN,
    which the GPU does not run), and the processor goes on."""
    cp = agents.spawn(dom, "gpucp", device=0)
    try:
        x = dom.buffer((8,), "f4")
        y = dom.buffer((8,), "f4")
        x.numpy()[...] = np.arange(8, dtype="f4") - 4

        def run(cmd: ert.ErtCommand) -> tuple[Status, int]:
            cb = bytes_buffer(dom, cmd.encode())
            ka = bytes_buffer(dom, Kernargs(buffers=[cb.handle]).encode())
            st = _run(cp, ka, kernel=0, ptype=PacketType.ERT)
            return st, ert.parse_header(int(cb.numpy()[:4].view("<u4")[0]))[0]

        st, state = run(ert.start_cu(4, ert.cu_args([x.handle, y.handle], [])))  # CU 4: relu
        assert (st, state) == (Status.SUCCESS, ert.State.COMPLETED)
        assert list(y.numpy()) == list(np.maximum(x.numpy(), 0))
        two_and_a_half = struct.unpack("<Q", struct.pack("<d", 2.5))[0]
        st, state = run(ert.start_npu(3, 0, 0, ert.cu_args([x.handle, y.handle], [two_and_a_half])))  # scale
        assert (st, state) == (Status.SUCCESS, ert.State.COMPLETED)
        assert np.allclose(y.numpy(), 2.5 * x.numpy())
        two_cus = ert.ErtCommand(
            ert.State.NEW, ert.Opcode.START_CU, ert.CmdType.CU, 0b11, ert.cu_args([x.handle, y.handle], [])
        )
        assert run(two_cus) == (Status.ERROR, ert.State.ERROR)
        assert run(ert.cmd_chain([])) == (Status.ERROR, ert.State.ERROR)
        st, state = run(ert.start_cu(4, ert.cu_args([y.handle, x.handle], [])))
        assert (st, state) == (Status.SUCCESS, ert.State.COMPLETED)
    finally:
        cp.stop()


# --------------------------------------------------------------------------- hostile packets
#
# Directed bad packets for the GPU command processor, mirroring the CPU agents' cases
# (tests/hostile/test_agents_hostile.py) that apply to it, with the GPU's own: buffer slots and
# metadata that lie (offsets and sizes past the heap or the device heap, a placement on a
# device heap that does not exist), shapes and dtypes its kernels refuse, ERT commands with
# bad cu_masks and counts.  Each bad packet must fail alone (its signal ERROR, or the
# failure it passes on; nothing downstream of it runs) and the processor must keep serving:
# after every case a good relu packet must complete with the right output ("ok"), else the
# processor is reported "killed" (its process died) or "wedged" (it stopped answering) and
# replaced, so that the other cases still run.
#
# Not mirrored: the CPU agents' bounded input waits (a packet waiting on a fence nobody
# signals fails after ``wait_timeout``): the processor waits for its inputs without a bound,
# as a GPU stream waits on a semaphore, so such a packet holds its queue until the fence is
# signaled or the processor is stopped.  Nor "args: too many buffers for the cache" as such
# (the processor takes at most 4 buffers: "args: five buffers" covers it).

S = Status
GPU_ANSWER = float(os.environ.get("HL_GPU_ANSWER", "20"))
"""Seconds within which the processor must answer (a follow-up into a full queue is retried
2**22 times over the bus before it fails: several seconds, not the CPU agents' 0.5 s bound)."""
RELU = kernel_id("relu")  # also the ERT CU index of relu on the GPU (its CU index is the kernel id)


class GEnv(hostile.Env):
    """The CPU cases' environment with a GPU command processor ("gpucp") beside an npu agent."""

    def agent(self, kind: str) -> agents.Agent:
        a = self.running.get(kind)
        if a is None or not a.alive:
            if kind == "gpucp":
                a = agents.spawn(self.dom, "gpucp", device=0, capacity=hostile.CAP, label="gpucp-hostile")
            else:
                opts = hostile.AGENT_OPTS
                a = agents.spawn(self.dom, kind, capacity=hostile.CAP, label=f"{kind}-hostile", **opts)
            self.running[kind] = a
        return a

    def run(self, a: agents.Agent, pkt: Packet | bytes, sig: hl.Fence | None = None) -> Status | None:
        a.queue.push(pkt, timeout=GPU_ANSWER)
        if sig is None:
            return None
        try:
            return sig.wait(GPU_ANSWER)
        except TimeoutError:
            return None

    def probe(self, kind: str) -> str:
        """A good relu packet must complete with the right output: "ok", "killed" or "wedged"."""
        if kind != "gpucp":
            return super().probe(kind)
        a = self.running.get("gpucp")
        if a is None or not a.alive:
            self.replace("gpucp")
            return "killed"
        ok = False
        try:
            f = self.fence(a)
            p, out = hostile.relu_packet(self, f.handle)
            a.queue.push(p, timeout=GPU_ANSWER)
            ok = f.wait(GPU_ANSWER) is S.SUCCESS and list(out.numpy()) == [0, 0, 0, 0, 0, 1, 2, 3]
        except (hl.HostlessError, TimeoutError, ValueError):
            pass
        if ok and a.alive:
            return "ok"
        verdict = "killed" if not a.alive else "wedged"
        self.replace("gpucp")
        return verdict

    def poke_slot(self, h: int, fld: str, value: int) -> int:
        """Store ``value`` into a u64 field of ``h``'s slot (a hostile participant's write);
        returns the old value (put it back before the object is released)."""
        from hostless import lowlevel

        off = lowlevel.layout(self.dom)["fences_offset"] + ((h & 0xFFFFFF) - 1) * int(C.FENCE_SIZE)
        off += int(getattr(C, f"F_{fld.upper()}"))
        raw = self.dom.raw()
        old = int.from_bytes(raw[off : off + 8], "little")
        raw[off : off + 8] = value.to_bytes(8, "little")
        return old


@pytest.fixture(scope="module")
def genv():
    name = f"hltest-cph-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(
        name, fences=4096, participants=32, heap="64M", device_heaps={"cuda:0": 64 << 20}, label="host"
    )
    e = GEnv(d)
    try:
        e.agent("gpucp")
        yield e
        for o in e.owned:
            if o._held:
                o.release()
        for a in e.running.values():
            a.stop()
    finally:
        for a in e.running.values():
            a.kill()
        d.close()
        hl.Domain.unlink(name)


GCase = Callable[[GEnv], None]
GPU_CASES: dict[str, GCase] = {}


def gcase(name: str) -> Callable[[GCase], GCase]:
    def deco(fn: GCase) -> GCase:
        GPU_CASES[name] = fn
        return fn

    return deco


def gexpect(e: GEnv, status: Status, **pkt: Any) -> None:
    hostile.expect(e, "gpucp", status, **pkt)


def gexpect_args(e: GEnv, args: int, kernel: int = RELU) -> None:
    a = e.agent("gpucp")
    f = e.fence(a)
    assert e.run(a, Packet(kernel=kernel, args=args, signal=f.handle), f) is S.ERROR


def f32(e: GEnv, *shape: int, fill: float = 1.0) -> hl.Buffer:
    return e.buffer(np.full(shape, fill, np.float32))


# ---- wait handles and values


@gcase("wait: a buffer handle")
def _(e: GEnv) -> None:
    gexpect(e, S.ERROR, **hostile.wait_on(f32(e, 4).handle))


@gcase("wait: a device buffer handle")
def _(e: GEnv) -> None:
    b = e.keep(e.dom.buffer((64,), "f4", device="cuda:0"))
    gexpect(e, S.ERROR, **hostile.wait_on(b.handle))


@gcase("wait: a queue handle")
def _(e: GEnv) -> None:
    gexpect(e, S.ERROR, **hostile.wait_on(e.keep(e.dom.queue(2)).handle))


@gcase("wait: the processor's own queue, second slot")
def _(e: GEnv) -> None:
    gexpect(e, S.ERROR, **hostile.wait_on(e.agent("gpucp").queue.handle, slot=1))


@gcase("wait: a stale fence")
def _(e: GEnv) -> None:
    gexpect(e, S.ERROR, **hostile.wait_on(e.stale()))


@gcase("wait: a forged fence")
def _(e: GEnv) -> None:
    gexpect(e, S.ERROR, **hostile.wait_on(hostile.forged(e.fence().handle)))


@gcase("wait: an unknown kind")
def _(e: GEnv) -> None:
    gexpect(e, S.ERROR, **hostile.wait_on(hostile.with_kind(e.fence().handle, 9)))


@gcase("wait: another domain's tag")
def _(e: GEnv) -> None:
    gexpect(e, S.ERROR, **hostile.wait_on(e.fence().handle ^ (0x5A << 56)))


@gcase("wait: a random u64")
def _(e: GEnv) -> None:
    gexpect(e, S.ERROR, **hostile.wait_on(0xDEADBEEFCAFEF00D))


@gcase("wait: timeline value 2**62")
def _(e: GEnv) -> None:
    gexpect(e, S.ERROR, **hostile.wait_on(e.keep(e.dom.timeline()).handle, 1 << 62))


@gcase("wait: timeline value 2**64-1, second slot")
def _(e: GEnv) -> None:
    gexpect(e, S.ERROR, **hostile.wait_on(e.keep(e.dom.timeline(3)).handle, (1 << 64) - 1, slot=1))


@gcase("wait: fence value is ignored")
def _(e: GEnv) -> None:
    f = e.fence()
    f.signal()
    gexpect(e, S.SUCCESS, **hostile.wait_on(f.handle, (1 << 64) - 1))


@gcase("wait: fence word 5 (not a status)")
def _(e: GEnv) -> None:
    f = e.fence()
    e.poke(f.handle, 5)
    gexpect(e, S.ERROR, **hostile.wait_on(f.handle))


@gcase("wait: fence word 1 (ACTIVE is not a final status)")
def _(e: GEnv) -> None:
    f = e.fence()
    e.poke(f.handle, 1)
    gexpect(e, S.ERROR, **hostile.wait_on(f.handle))


@gcase("wait: fence word 2**63")
def _(e: GEnv) -> None:
    f = e.fence()
    e.poke(f.handle, 1 << 63)
    gexpect(e, S.ERROR, **hostile.wait_on(f.handle))


@gcase("wait: timeline failed with status 5")
def _(e: GEnv) -> None:
    t = e.keep(e.dom.timeline())
    e.poke(t.handle, (1 << 62) | 5)
    gexpect(e, S.ERROR, **hostile.wait_on(t.handle, 1))


@gcase("wait: a custom failure passes on")
def _(e: GEnv) -> None:
    f = e.fence()
    f.signal(100)
    gexpect(e, S(100), **hostile.wait_on(f.handle))


@gcase("wait: a failed timeline passes its failure on")
def _(e: GEnv) -> None:
    t = e.keep(e.dom.timeline())
    t.fail(S.CANCEL)
    gexpect(e, S.CANCEL, **hostile.wait_on(t.handle, 1))


# ---- signal handles and values


def gafter_bad_signal(e: GEnv, signal_h: int, signal_value: int = 0) -> None:
    """A packet whose signal is bad: its follow-up (a barrier with a good fence) must fail with
    ERROR (the packet failed: nothing downstream of it runs) and its kernel must not run."""
    a = e.agent("gpucp")
    g = e.fence(a)
    fol = hl.Follow(a.queue.handle, Packet(type=PacketType.BARRIER, signal=g.handle))
    p, out = hostile.relu_packet(e, signal_h, [fol], signal_value=signal_value)
    e.run(a, p)
    assert g.wait(GPU_ANSWER) is S.ERROR
    assert (out.numpy() == 0).all()


@gcase("signal: a buffer handle")
def _(e: GEnv) -> None:
    gafter_bad_signal(e, f32(e, 4).handle)


@gcase("signal: the processor's own queue")
def _(e: GEnv) -> None:
    gafter_bad_signal(e, e.agent("gpucp").queue.handle)


@gcase("signal: a stale fence")
def _(e: GEnv) -> None:
    gafter_bad_signal(e, e.stale())


@gcase("signal: a forged fence")
def _(e: GEnv) -> None:
    gafter_bad_signal(e, hostile.forged(e.fence().handle))


@gcase("signal: an unknown kind")
def _(e: GEnv) -> None:
    gafter_bad_signal(e, hostile.with_kind(e.fence().handle, 0xEE))


@gcase("signal: a merged fence")
def _(e: GEnv) -> None:
    gafter_bad_signal(e, e.keep(e.dom.merge([e.fence(), e.fence()])).handle)


@gcase("signal: timeline value 2**62 fails the timeline")
def _(e: GEnv) -> None:
    t = e.keep(e.dom.timeline())
    gafter_bad_signal(e, t.handle, 1 << 62)
    assert t.failure is S.ERROR


@gcase("signal: timeline value not above the current one is ignored")
def _(e: GEnv) -> None:
    a = e.agent("gpucp")
    t = e.keep(e.dom.timeline(10))
    p, out = hostile.relu_packet(e, t.handle, signal_value=3)
    e.run(a, p)
    assert e.probe("gpucp") == "ok"
    assert (t.value, t.failure) == (10, None)
    assert out.numpy().max() == 3  # the kernel ran


@gcase("signal: a failure fails a timeline signal")
def _(e: GEnv) -> None:
    t = e.keep(e.dom.timeline())
    a = e.agent("gpucp")
    e.run(a, Packet(kernel=777, args=hostile.relu_block(e)[0].handle, signal=t.handle, signal_value=1))
    assert t.wait(1, GPU_ANSWER) is S.ERROR


# ---- argument blocks, kernels, packet types


@gcase("args: a fence handle")
def _(e: GEnv) -> None:
    gexpect_args(e, e.fence().handle)


@gcase("args: a timeline handle")
def _(e: GEnv) -> None:
    gexpect_args(e, e.keep(e.dom.timeline()).handle)


@gcase("args: a queue handle")
def _(e: GEnv) -> None:
    gexpect_args(e, e.agent("gpucp").queue.handle)


@gcase("args: a stale handle")
def _(e: GEnv) -> None:
    gexpect_args(e, e.stale())


@gcase("args: a device buffer")
def _(e: GEnv) -> None:
    gexpect_args(e, e.keep(e.dom.buffer((64,), "u1", device="cuda:0")).handle)


@gcase("args: bad magic")
def _(e: GEnv) -> None:
    gexpect_args(e, e.raw(hostile.ka_header(0, 0, 0, magic=0x12345678) + bytes(64)).handle)


@gcase("args: shorter than the header")
def _(e: GEnv) -> None:
    gexpect_args(e, e.raw(struct.pack("<I", hostile.MAGIC)).handle)


@gcase("args: buffer count past the block")
def _(e: GEnv) -> None:
    gexpect_args(e, e.raw(hostile.ka_header(0xFFFF, 0, 0) + bytes(48)).handle)


@gcase("args: scalar count past the block")
def _(e: GEnv) -> None:
    gexpect_args(e, e.raw(hostile.ka_header(2, 0xFFFF, 0) + bytes(16)).handle)


@gcase("args: follow-up count past the block")
def _(e: GEnv) -> None:
    gexpect_args(e, e.raw(hostile.ka_header(0, 0, 0xFFFF) + bytes(72 * 3)).handle)


@gcase("args: every count at its maximum")
def _(e: GEnv) -> None:
    gexpect_args(e, e.raw(hostile.ka_header(0xFFFF, 0xFFFF, 0xFFFF) + bytes(4000)).handle)


@gcase("args: a block over 1 KiB")
def _(e: GEnv) -> None:
    x, y = f32(e, 8), f32(e, 8)
    gexpect_args(e, e.block([x.handle, y.handle], [0] * 200).handle)


@gcase("args: five buffers")
def _(e: GEnv) -> None:
    gexpect_args(e, e.block([f32(e, 8).handle for _ in range(5)]).handle, kernel=kernel_id("add"))


@gcase("args: a block in a float64 buffer is read by bytes")
def _(e: GEnv) -> None:
    a = e.agent("gpucp")
    ka, _x, out = hostile.relu_block(e)
    blk = e.raw(bytes(ka.numpy()), np.float64)
    f = e.fence(a)
    assert e.run(a, Packet(kernel=RELU, args=blk.handle, signal=f.handle), f) is S.SUCCESS
    assert out.numpy().max() == 3


@gcase("args: a block in a 2-D buffer is read by bytes")
def _(e: GEnv) -> None:
    a = e.agent("gpucp")
    g = e.fence(a)
    fol = hl.Follow(a.queue.handle, Packet(type=PacketType.BARRIER, signal=g.handle))
    ka, _x, out = hostile.relu_block(e, [fol])
    data = bytes(ka.numpy())
    blk = e.raw(data + bytes((-len(data)) % 16), np.uint16, (-1, 8))
    f = e.fence(a)
    assert e.run(a, Packet(kernel=RELU, args=blk.handle, signal=f.handle), f) is S.SUCCESS
    assert g.wait(GPU_ANSWER) is S.SUCCESS


@gcase("args: a fence among the buffers")
def _(e: GEnv) -> None:
    gexpect_args(e, e.block([f32(e, 8).handle, e.fence().handle]).handle)


@gcase("args: a stale buffer")
def _(e: GEnv) -> None:
    b = e.dom.buffer((8,), "f4")
    h = b.handle
    b.release()
    gexpect_args(e, e.block([h, f32(e, 8).handle]).handle)


@gcase("args: a forged buffer")
def _(e: GEnv) -> None:
    gexpect_args(e, e.block([hostile.forged(f32(e, 8).handle), f32(e, 8).handle]).handle)


@gcase("args: huge and negative scalars")
def _(e: GEnv) -> None:
    a = e.agent("gpucp")
    x, out = f32(e, 8), f32(e, 8, fill=0.0)
    for s in ((1 << 64) - 1, 1 << 63, f64(-1e308), f64(float("inf"))):
        f = e.fence(a)
        blk = e.block([x.handle, out.handle], [s])
        p = Packet(kernel=kernel_id("scale"), args=blk.handle, signal=f.handle)
        assert e.run(a, p, f) in (S.SUCCESS, S.ERROR)


@gcase("args: normalize with a zero std")
def _(e: GEnv) -> None:
    a = e.agent("gpucp")
    x, out = f32(e, 8), f32(e, 8, fill=0.0)
    f = e.fence(a)
    blk = e.block([x.handle, out.handle], [f64(1.0), f64(-0.0)])
    assert e.run(a, Packet(kernel=kernel_id("normalize"), args=blk.handle, signal=f.handle), f) is S.ERROR


@gcase("kernel: unknown ids")
def _(e: GEnv) -> None:
    a = e.agent("gpucp")
    for k in (0, kernel_id("conv2d"), 777, USER_KERNEL_BASE + 50, (1 << 32) - 1):
        f = e.fence(a)
        assert e.run(a, Packet(kernel=k, args=hostile.relu_block(e)[0].handle, signal=f.handle), f) is S.ERROR


@gcase("packet: unknown types")
def _(e: GEnv) -> None:
    a = e.agent("gpucp")
    for t in (0, 5, 99, 0xFFFF):
        f = e.fence(a)
        p = Packet(type=t, kernel=RELU, args=hostile.relu_block(e)[0].handle, signal=f.handle)
        assert e.run(a, p, f) is S.ERROR


# ---- buffer slots and metadata that lie (a hostile participant's stores), shapes, dtypes


def lying_slot(e: GEnv, b: hl.Buffer, fld: str, value: int) -> None:
    """relu on ``b`` (as its input) while ``b``'s slot field ``fld`` says ``value``: ERROR,
    and no fault of the GPU; the field is put back afterwards."""
    out = f32(e, *b.shape, fill=0.0)
    old = e.poke_slot(b.handle, fld, value)
    try:
        gexpect_args(e, e.block([b.handle, out.handle]).handle)
    finally:
        e.poke_slot(b.handle, fld, old)


@gcase("buffer: an offset past the heap")
def _(e: GEnv) -> None:
    lying_slot(e, f32(e, 8), "word", 1 << 40)


@gcase("buffer: an offset that wraps around")
def _(e: GEnv) -> None:
    lying_slot(e, f32(e, 8), "word", (1 << 64) - 16)


@gcase("buffer: a size past the heap")
def _(e: GEnv) -> None:
    lying_slot(e, f32(e, 8), "aux", 1 << 40)


@gcase("buffer: a size its metadata does not have")
def _(e: GEnv) -> None:
    lying_slot(e, f32(e, 8), "aux", 16)


@gcase("buffer: a placement on a device heap that does not exist")
def _(e: GEnv) -> None:
    lying_slot(e, f32(e, 8), "err", (1 << 8) | 6)  # HL_PLACE(heap 5, 1 granule)


@gcase("buffer: a device buffer past its device heap")
def _(e: GEnv) -> None:
    b = e.keep(e.dom.buffer((64,), "f4", device="cuda:0"))
    lying_slot(e, b, "word", (64 << 20) + 256)


@gcase("buffer: a device buffer whose metadata block is outside the heap")
def _(e: GEnv) -> None:
    b = e.keep(e.dom.buffer((64,), "f4", device="cuda:0"))
    lying_slot(e, b, "parents", 1 << 40)


@gcase("buffer: metadata with a shape larger than the data")
def _(e: GEnv) -> None:
    b = f32(e, 8)
    off = b.offset - int(hl._core.BUFFER_META_SIZE) + int(hl._core.BM_SHAPE)
    raw = e.dom.raw()
    old = bytes(raw[off : off + 8])
    raw[off : off + 8] = (1 << 40).to_bytes(8, "little")
    try:
        gexpect_args(e, e.block([b.handle, f32(e, 8, fill=0.0).handle]).handle)
    finally:
        raw[off : off + 8] = old


@gcase("shape: relu into a smaller output")
def _(e: GEnv) -> None:
    gexpect_args(e, e.block([f32(e, 8).handle, f32(e, 4).handle]).handle)


@gcase("shape: add of two sizes")
def _(e: GEnv) -> None:
    blk = e.block([f32(e, 8).handle, f32(e, 4).handle, f32(e, 8).handle])
    gexpect_args(e, blk.handle, kernel=kernel_id("add"))


@gcase("shape: gemm with inner dimensions that differ")
def _(e: GEnv) -> None:
    blk = e.block([f32(e, 4, 5).handle, f32(e, 6, 4).handle, f32(e, 4, 4).handle])
    gexpect_args(e, blk.handle, kernel=kernel_id("gemm"))


@gcase("shape: gemm of 1-D buffers")
def _(e: GEnv) -> None:
    blk = e.block([f32(e, 16).handle, f32(e, 16).handle, f32(e, 16).handle])
    gexpect_args(e, blk.handle, kernel=kernel_id("gemm"))


@gcase("shape: scale without its scalar")
def _(e: GEnv) -> None:
    gexpect_args(e, e.block([f32(e, 8).handle, f32(e, 8).handle]).handle, kernel=kernel_id("scale"))


@gcase("shape: relu with one buffer")
def _(e: GEnv) -> None:
    gexpect_args(e, e.block([f32(e, 8).handle]).handle)


@gcase("dtype: float64 buffers")
def _(e: GEnv) -> None:
    x, y = e.buffer(np.ones(8)), e.buffer(np.zeros(8))
    gexpect_args(e, e.block([x.handle, y.handle]).handle)


@gcase("dtype: int32 buffers")
def _(e: GEnv) -> None:
    x, y = e.buffer(np.ones(8, np.int32)), e.buffer(np.zeros(8, np.int32))
    gexpect_args(e, e.block([x.handle, y.handle]).handle)


# ---- follow-ups


def gbad_follow_queue(e: GEnv, qh: int) -> None:
    """The packet succeeds; the follow-up that cannot be pushed fails its own signal with ERROR,
    and so do the follow-ups nested in it."""
    a = e.agent("gpucp")
    f, g, h = e.fence(a), e.fence(a), e.fence(a)
    nested = hl.Follow(a.queue.handle, Packet(type=PacketType.BARRIER, signal=h.handle))
    inner = hostile.relu_block(e, [nested])[0]
    fol = hl.Follow(qh, Packet(kernel=RELU, args=inner.handle, signal=g.handle))
    p, _out = hostile.relu_packet(e, f.handle, [fol])
    assert e.run(a, p, f) is S.SUCCESS
    assert g.wait(GPU_ANSWER) is S.ERROR
    assert h.wait(GPU_ANSWER) is S.ERROR


@gcase("follow: a fence as the queue")
def _(e: GEnv) -> None:
    gbad_follow_queue(e, e.fence().handle)


@gcase("follow: a stale queue")
def _(e: GEnv) -> None:
    q = e.dom.queue(2)
    h = q.handle
    q.release()
    gbad_follow_queue(e, h)


@gcase("follow: a forged queue")
def _(e: GEnv) -> None:
    gbad_follow_queue(e, hostile.forged(e.keep(e.dom.queue(2)).handle))


@gcase("follow: a buffer as the queue")
def _(e: GEnv) -> None:
    gbad_follow_queue(e, f32(e, 4).handle)


@gcase("follow: a queue that stays full (bounded push)")
def _(e: GEnv) -> None:
    q = e.keep(e.dom.queue(2))  # nobody consumes it
    for _ in range(2):
        q.push(Packet(type=PacketType.BARRIER), timeout=0)
    gbad_follow_queue(e, q.handle)


@gcase("follow: garbage packets into the npu's queue")
def _(e: GEnv) -> None:
    a, npu = e.agent("gpucp"), e.agent("npu")
    rng = random.Random(7)
    fol = []
    for _ in range(4):
        raw = bytearray(rng.randbytes(64))
        raw[0:2] = rng.choice([1, 2, 3, 9]).to_bytes(2, "little")
        fol.append(hl.Follow(npu.queue.handle, Packet.decode(bytes(raw))))
    f = e.fence(a)
    p, _out = hostile.relu_packet(e, f.handle, fol)
    assert e.run(a, p, f) is S.SUCCESS
    assert e.probe("npu") == "ok"


@gcase("follow: into the processor's own full queue")
def _(e: GEnv) -> None:
    a = e.agent("gpucp")
    gate = e.fence()
    g = e.fence(a)
    fol = hl.Follow(a.queue.handle, Packet(type=PacketType.BARRIER, signal=g.handle))
    f = e.fence(a)
    p, _out = hostile.relu_packet(e, f.handle, [fol], **hostile.wait_on(gate.handle))
    a.queue.push(p, timeout=GPU_ANSWER)
    # fill the queue behind it: CAP barriers fit once the processor has taken the relu packet
    # (observable: its cell frees), and none more while it waits for the gate
    n = 0
    deadline = time.monotonic() + GPU_ANSWER
    while n < hostile.CAP and time.monotonic() < deadline:
        try:
            a.queue.push(Packet(type=PacketType.BARRIER), timeout=0)
            n += 1
        except hl.QueueFull:
            time.sleep(0.001)
    assert n == hostile.CAP
    gate.signal()
    assert f.wait(GPU_ANSWER) is S.SUCCESS
    if a.capabilities.get("pushes") == "host":
        # the host forwarder tries it once when it takes it from the outbox: the processor, which
        # goes on meanwhile, may have freed a cell by then (pushed) or not (ERROR); never a hang
        assert g.wait(GPU_ANSWER) in (S.SUCCESS, S.ERROR)
    else:
        assert g.wait(GPU_ANSWER) is S.ERROR  # the follow-up could not be pushed: nobody else frees a cell


def gself_loop(e: GEnv, fanout: int) -> None:
    """A packet whose follow-ups are itself, into the processor's own queue: the loop must end
    by itself, and the processor keep answering meanwhile (the CPU agents cut it after 64 hops)."""
    a = e.agent("gpucp")
    x = f32(e, 8)
    blk = e.raw(bytes(hl.Kernargs(buffers=[x.handle, x.handle]).nbytes() + 72 * fanout))
    me = Packet(kernel=RELU, args=blk.handle)
    blk.numpy()[:] = np.frombuffer(
        hl.Kernargs(buffers=[x.handle, x.handle], follow=[hl.Follow(a.queue.handle, me)] * fanout).encode(),
        np.uint8,
    )
    a.queue.push(me, timeout=GPU_ANSWER)
    assert e.probe("gpucp") == "ok"
    deadline = time.monotonic() + GPU_ANSWER  # the loop ends by itself: the queue drains
    while time.monotonic() < deadline:
        i = a.queue.info()
        if i["write_index"] == i["read_index"]:
            time.sleep(0.5)
            j = a.queue.info()
            if j["write_index"] == j["read_index"] == i["read_index"]:
                break
        time.sleep(0.05)
    else:
        raise AssertionError("the self-enqueueing packet never stopped")


@gcase("follow: a packet that re-enqueues itself")
def _(e: GEnv) -> None:
    gself_loop(e, 1)


@gcase("follow: a packet that re-enqueues itself twice")
def _(e: GEnv) -> None:
    gself_loop(e, 2)


# ---- ERT commands (the CU index is the kernel id on the GPU)


def gexpect_ert(e: GEnv, cmd: bytes | hl.Buffer, status: Status = S.ERROR) -> hl.Buffer:
    a = e.agent("gpucp")
    f = e.fence(a)
    cb = cmd if isinstance(cmd, hl.Buffer) else e.raw(cmd)
    p = Packet(type=PacketType.ERT, args=e.block([cb.handle]).handle, signal=f.handle)
    assert e.run(a, p, f) is status
    return cb


def ert_state(cb: hl.Buffer) -> int:
    return int(cb.numpy().view(np.uint8)[:4].view("<u4")[0]) & 0xF


@gcase("ert: count past the buffer")
def _(e: GEnv) -> None:
    gexpect_ert(e, hostile.hdr(2000) + struct.pack("<I", 1 << RELU))


@gcase("ert: count 0")
def _(e: GEnv) -> None:
    gexpect_ert(e, hostile.hdr(0) + bytes(12))


@gcase("ert: shorter than a header")
def _(e: GEnv) -> None:
    gexpect_ert(e, b"\x01")


@gcase("ert: CU index 31 (no kernel)")
def _(e: GEnv) -> None:
    x, y = f32(e, 8), f32(e, 8)
    cb = gexpect_ert(e, ert.start_cu(31, hostile.cu_args([x.handle, y.handle])).encode())
    assert ert_state(cb) == ert.State.ERROR


@gcase("ert: cu_mask 0")
def _(e: GEnv) -> None:
    x, y = f32(e, 8), f32(e, 8)
    args = hostile.cu_args([x.handle, y.handle])
    cmd = ert.ErtCommand(ert.State.NEW, ert.Opcode.START_CU, ert.CmdType.CU, 0, args)
    gexpect_ert(e, cmd.encode())


@gcase("ert: cu_mask of every CU")
def _(e: GEnv) -> None:
    x, y = f32(e, 8), f32(e, 8)
    cmd = ert.ErtCommand(
        ert.State.NEW, ert.Opcode.START_CU, ert.CmdType.CU, 0xFFFFFFFF, hostile.cu_args([x.handle, y.handle])
    )
    gexpect_ert(e, cmd.encode())


@gcase("ert: buffer count 2**32-1")
def _(e: GEnv) -> None:
    gexpect_ert(e, ert.start_cu(RELU, [0xFFFFFFFF, 1, 2]).encode())


@gcase("ert: buffer count past the command")
def _(e: GEnv) -> None:
    x = f32(e, 8)
    gexpect_ert(e, ert.start_cu(RELU, [5] + ert.u64_args([x.handle])).encode())


@gcase("ert: a fence as a CU buffer")
def _(e: GEnv) -> None:
    gexpect_ert(e, ert.start_cu(RELU, hostile.cu_args([f32(e, 8).handle, e.fence().handle])).encode())


@gcase("ert: a stale CU buffer")
def _(e: GEnv) -> None:
    b = e.dom.buffer((8,), "f4")
    h = b.handle
    b.release()
    gexpect_ert(e, ert.start_cu(RELU, hostile.cu_args([h, f32(e, 8).handle])).encode())


@gcase("ert: START_NPU shorter than its fixed words")
def _(e: GEnv) -> None:
    cmd = ert.ErtCommand(ert.State.NEW, ert.Opcode.START_NPU, ert.CmdType.CU, 1 << RELU, [1, 2])
    gexpect_ert(e, cmd.encode())


@gcase("ert: chain count 2**32-1")
def _(e: GEnv) -> None:
    cmd = ert.ErtCommand(ert.State.NEW, ert.Opcode.CMD_CHAIN, ert.CmdType.CU, 0, [0xFFFFFFFF] + [0] * 7)
    gexpect_ert(e, cmd.encode())


@gcase("ert: a chain that contains itself")
def _(e: GEnv) -> None:
    n = 8
    cb = e.raw(bytes(4 * (1 + ert.CHAIN_HEADER_WORDS + 2 * n)))
    cb.numpy()[:] = np.frombuffer(ert.cmd_chain([cb.handle] * n).encode(), np.uint8)
    gexpect_ert(e, cb)


@gcase("ert: a fence as the command buffer")
def _(e: GEnv) -> None:
    a = e.agent("gpucp")
    f = e.fence(a)
    p = Packet(type=PacketType.ERT, args=e.block([e.fence().handle]).handle, signal=f.handle)
    assert e.run(a, p, f) is S.ERROR


@gcase("ert: a command over 256 bytes")
def _(e: GEnv) -> None:
    x, y = f32(e, 8), f32(e, 8)
    gexpect_ert(e, ert.start_cu(RELU, hostile.cu_args([x.handle, y.handle], [0] * 40)).encode())


@gcase("ert: a command in a float32 2-D buffer is read by bytes")
def _(e: GEnv) -> None:
    x = e.buffer(np.arange(-4, 4, dtype=np.float32))
    out = f32(e, 8, fill=0.0)
    raw = ert.start_cu(RELU, hostile.cu_args([x.handle, out.handle])).encode()
    cb = e.raw(raw + bytes((-len(raw)) % 8), np.float32, (-1, 2))
    gexpect_ert(e, cb, S.SUCCESS)
    assert out.numpy().max() == 3
    assert int(cb.numpy().view("<u4").reshape(-1)[0]) & 0xF == ert.State.COMPLETED


@gcase("ert: unsupported opcodes")
def _(e: GEnv) -> None:
    for op in (ert.Opcode.CONFIGURE, ert.Opcode.EXIT, ert.Opcode.ABORT, 31):
        gexpect_ert(e, hostile.hdr(1, op) + struct.pack("<I", 1 << RELU))


@pytest.mark.parametrize("name", list(GPU_CASES))
def test_hostile_packet_fails_alone(genv: GEnv, name: str) -> None:
    """One directed bad packet (see the section's comment): it fails alone, and the processor
    then runs a good relu packet ("ok"), rather than having died ("killed") or stopped
    answering ("wedged")."""
    err: BaseException | None = None
    try:
        GPU_CASES[name](genv)
    except Exception as ex:  # classified below: a processor that died or stopped answering first
        err = ex
    verdict = genv.probe("gpucp")
    genv.verdicts[name] = verdict
    assert verdict == "ok", f"{name}: the processor is {verdict} ({err!r})"
    if err is not None:
        raise err
