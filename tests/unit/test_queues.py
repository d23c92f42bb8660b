"""Command queues: packet / argument-block / ERT encodings and the MPSC ring.

Encodings are checked against bytes and words computed by hand (and the packet
layout against the C header, compiled with gcc).  The ring is checked against
a model (hypothesis), under several producer processes pushing concurrently
into one small queue (per-producer order kept, nothing lost or duplicated, the
index a producer got is the index the consumer saw), when full (QueueFull,
never overwritten) and when a producer dies after reserving a cell (the cell
is skipped, its fence becomes OWNER_DIED, the consumer goes on).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostless as hl
from conftest import ident, needs_test_hooks, thread_in_futex, wait_until
from hostless import ert, lowlevel
from hostless._abi import C

U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
U32 = st.integers(min_value=0, max_value=(1 << 32) - 1)


# --------------------------------------------------------------------------- helpers


def _name() -> str:
    return f"hltest-q-{os.getpid()}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def qdom() -> Iterator[hl.Domain]:
    """A domain with a heap (queues live in the heap); unlinked afterwards."""
    name = _name()
    d = hl.Domain.create(name, fences=512, participants=16, heap="16M", trace="256K", label="host")
    try:
        yield d
    finally:
        d.close()
        try:
            hl.Domain.unlink(name)
        except FileNotFoundError:
            pass


def _child(code: str, *args: object) -> subprocess.Popen[str]:
    """A child participant running ``code`` (argv[1:] = args), stdout piped."""
    prelude = "import os, sys, time, json\nimport hostless as hl\n"
    return subprocess.Popen(
        [sys.executable, "-c", prelude + textwrap.dedent(code), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(10)


# --------------------------------------------------------------------------- packets


# Every field distinct, so that a field at the wrong offset shows.
HAND_PACKET = hl.Packet(
    type=hl.PacketType.ERT,
    flags=0x0A0B,
    kernel=0x0C0D0E0F,
    args=0x0102030405060708,
    signal=0x1112131415161718,
    signal_value=42,
    wait=(0xA1, 0xA2),
    wait_value=(3, 4),
)
HAND_BYTES = bytes.fromhex(
    "0200"  # 0 type = HL_PKT_ERT
    "0b0a"  # 2 flags
    "0f0e0d0c"  # 4 kernel
    "0807060504030201"  # 8 args
    "1817161514131211"  # 16 signal
    "2a00000000000000"  # 24 signal_value
    "a100000000000000"  # 32 wait[0]
    "a200000000000000"  # 40 wait[1]
    "0300000000000000"  # 48 wait_value[0]
    "0400000000000000"  # 56 wait_value[1]
)


def test_packet_types_match_the_header() -> None:
    assert (hl.PacketType.KERNEL, hl.PacketType.ERT, hl.PacketType.BARRIER, hl.PacketType.STOP) == (
        1,
        2,
        3,
        4,
    )
    assert int(C.PACKET_SIZE) == 64 == len(HAND_BYTES)


def test_packet_encode_against_hand_computed_bytes() -> None:
    assert HAND_PACKET.encode() == HAND_BYTES
    assert hl.Packet.decode(HAND_BYTES) == HAND_PACKET
    # a default packet: KERNEL, everything else zero
    assert hl.Packet().encode() == b"\x01" + bytes(63)


def test_packet_offsets_match_the_python_abi_constants() -> None:
    raw = HAND_BYTES
    assert int.from_bytes(raw[int(C.PK_TYPE) : int(C.PK_TYPE) + 2], "little") == 2
    assert int.from_bytes(raw[int(C.PK_KERNEL) : int(C.PK_KERNEL) + 4], "little") == 0x0C0D0E0F
    assert int.from_bytes(raw[int(C.PK_ARGS) : int(C.PK_ARGS) + 8], "little") == 0x0102030405060708
    assert int.from_bytes(raw[int(C.PK_SIGNAL) : int(C.PK_SIGNAL) + 8], "little") == 0x1112131415161718
    assert int.from_bytes(raw[int(C.PK_SIGNAL_VALUE) : int(C.PK_SIGNAL_VALUE) + 8], "little") == 42
    assert int.from_bytes(raw[int(C.PK_WAIT) : int(C.PK_WAIT) + 8], "little") == 0xA1
    assert int.from_bytes(raw[int(C.PK_WAIT_VALUE) + 8 : int(C.PK_WAIT_VALUE) + 16], "little") == 4


C_LAYOUT = r"""
#include <stddef.h>
#include <stdio.h>
#include "hostless.h"
#define P(s, f) printf("\"%s.%s\": %zu,\n", #s, #f, offsetof(struct s, f))
int main(void) {
    printf("{\n");
    P(hl_packet, type); P(hl_packet, flags); P(hl_packet, kernel); P(hl_packet, args);
    P(hl_packet, signal); P(hl_packet, signal_value); P(hl_packet, wait); P(hl_packet, wait_value);
    P(hl_kernarg, magic); P(hl_kernarg, nbuffers); P(hl_kernarg, nscalars); P(hl_kernarg, nfollow);
    P(hl_follow, queue); P(hl_follow, packet);
    printf("\"sizeof.hl_packet\": %zu, \"sizeof.hl_kernarg\": %zu, \"sizeof.hl_follow\": %zu}\n",
           sizeof(struct hl_packet), sizeof(struct hl_kernarg), sizeof(struct hl_follow));
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_packet_and_kernarg_layout_match_the_c_header(tmp_path: Path) -> None:
    src = tmp_path / "layout.c"
    src.write_text(C_LAYOUT)
    exe = tmp_path / "layout"
    inc = os.path.dirname(hl.abi_header_path())
    subprocess.run(["gcc", "-std=c11", "-I", inc, "-o", str(exe), str(src)], check=True, capture_output=True)
    lay = json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
    # the Python encoders' offsets (struct formats "<HHIQQQ2Q2Q" and "<IHHHHI")
    assert [lay[f"hl_packet.{f}"] for f in ("type", "flags", "kernel", "args", "signal")] == [0, 2, 4, 8, 16]
    assert [lay[f"hl_packet.{f}"] for f in ("signal_value", "wait", "wait_value")] == [24, 32, 48]
    assert [lay[f"hl_kernarg.{f}"] for f in ("magic", "nbuffers", "nscalars", "nfollow")] == [0, 4, 6, 8]
    assert (lay["hl_follow.queue"], lay["hl_follow.packet"]) == (0, 8)
    assert (lay["sizeof.hl_packet"], lay["sizeof.hl_kernarg"], lay["sizeof.hl_follow"]) == (64, 16, 72)


@settings(max_examples=200, deadline=None)
@given(
    t=st.integers(0, 0xFFFF),
    fl=st.integers(0, 0xFFFF),
    k=U32,
    a=U64,
    s=U64,
    sv=U64,
    w=st.tuples(U64, U64),
    wv=st.tuples(U64, U64),
)
def test_packet_round_trip(
    t: int, fl: int, k: int, a: int, s: int, sv: int, w: tuple[int, int], wv: tuple[int, int]
) -> None:
    p = hl.Packet(type=t, flags=fl, kernel=k, args=a, signal=s, signal_value=sv, wait=w, wait_value=wv)
    raw = p.encode()
    assert len(raw) == 64
    assert hl.Packet.decode(raw) == p


# --------------------------------------------------------------------------- argument blocks


def test_kernargs_encode_against_hand_computed_bytes() -> None:
    follow = hl.Follow(0x20, hl.Packet(type=hl.PacketType.KERNEL, kernel=3))
    ka = hl.Kernargs(buffers=[0x10], scalars=[-1], follow=[follow])
    raw = ka.encode()
    expect = (
        b"KRAK"  # magic 0x4b41524b, little-endian
        + bytes.fromhex("010001000100000000000000")  # nbuffers, nscalars, nfollow, reserved
        + bytes.fromhex("1000000000000000")  # buffers[0]
        + b"\xff" * 8  # scalars[0] = -1 as a u64 word
        + bytes.fromhex("2000000000000000")  # follow[0].queue
        + bytes.fromhex("0100000003000000")
        + bytes(56)  # follow[0].packet
    )
    assert raw == expect
    assert ka.nbytes() == len(raw) == 16 + 8 + 8 + 72
    back = hl.Kernargs.decode(raw)
    assert back.buffers == [0x10] and back.scalars == [(1 << 64) - 1] and back.follow == [follow]


packets = st.builds(
    hl.Packet,
    type=st.integers(1, 4),
    kernel=U32,
    args=U64,
    signal=U64,
    signal_value=U64,
    wait=st.tuples(U64, U64),
    wait_value=st.tuples(U64, U64),
)


@settings(max_examples=150, deadline=None)
@given(
    bufs=st.lists(U64, max_size=8),
    scal=st.lists(U64, max_size=8),
    fol=st.lists(st.builds(hl.Follow, U64, packets), max_size=3),
)
def test_kernargs_round_trip(bufs: list[int], scal: list[int], fol: list[hl.Follow]) -> None:
    ka = hl.Kernargs(buffers=bufs, scalars=scal, follow=fol)
    raw = ka.encode()
    assert len(raw) == ka.nbytes()
    assert hl.Kernargs.decode(raw) == ka
    # trailing bytes (a heap block is rounded up) are ignored
    assert hl.Kernargs.decode(raw + bytes(40)) == ka


def _ka_header(magic: int, nb: int, ns: int, nf: int) -> bytes:
    return (
        magic.to_bytes(4, "little")
        + nb.to_bytes(2, "little")
        + ns.to_bytes(2, "little")
        + nf.to_bytes(2, "little")
        + bytes(6)
    )


@pytest.mark.parametrize(
    "raw, what",
    [
        (b"", "shorter than its header"),
        (b"KRAK" + bytes(8), "shorter than its header"),
        (_ka_header(0x4B41524C, 0, 0, 0), "bad magic"),
        (_ka_header(0, 0, 0, 0), "bad magic"),
        (_ka_header(0x4B41524B, 2, 0, 0) + bytes(8), "claims"),  # 2 buffers, 1 present
        (_ka_header(0x4B41524B, 0, 1, 0), "claims"),  # 1 scalar, none present
        (_ka_header(0x4B41524B, 0, 0, 1) + bytes(71), "claims"),  # follow one byte short
        (_ka_header(0x4B41524B, 0xFFFF, 0xFFFF, 0xFFFF), "claims"),
    ],
)
def test_malformed_kernargs_raise_value_error(raw: bytes, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        hl.Kernargs.decode(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_kernargs_decode_of_garbage_is_value_error_or_a_block(raw: bytes) -> None:
    # with the right magic most of the time, so that the length checks are reached
    for blob in (raw, b"KRAK" + raw):
        try:
            ka = hl.Kernargs.decode(blob)
        except ValueError:
            continue
        assert ka.nbytes() <= len(blob)


# --------------------------------------------------------------------------- ERT commands


def test_ert_enums_are_xrt_values() -> None:
    # ert.h: enum ert_cmd_opcode / ert_cmd_type / ert_cmd_state
    assert (ert.Opcode.START_CU, ert.Opcode.CMD_CHAIN, ert.Opcode.START_NPU) == (0, 19, 20)
    assert ert.CmdType.CU == 3 and ert.CmdType.CTRL == 2 and ert.CmdType.SCU == 4
    assert [ert.State.NEW, ert.State.QUEUED, ert.State.RUNNING, ert.State.COMPLETED, ert.State.ERROR] == [
        1,
        2,
        3,
        4,
        5,
    ]


@pytest.mark.parametrize(
    "fields, word",
    [
        # state NEW, count 5, opcode START_CU, type CU: 1 | 5 << 12 | 0 << 23 | 3 << 28
        ((ert.State.NEW, 5, ert.Opcode.START_CU, ert.CmdType.CU, 0), 0x30005001),
        # state NEW, count 9, START_NPU (20 << 23 = 0x0a000000), CU
        ((ert.State.NEW, 9, ert.Opcode.START_NPU, ert.CmdType.CU, 0), 0x3A009001),
        # state NEW, count 10, CMD_CHAIN (19 << 23 = 0x09800000), CU
        ((ert.State.NEW, 10, ert.Opcode.CMD_CHAIN, ert.CmdType.CU, 0), 0x3980A001),
        # COMPLETED, custom 0xab, count 1, CONFIGURE (2 << 23), CTRL (2 << 28)
        ((ert.State.COMPLETED, 1, ert.Opcode.CONFIGURE, ert.CmdType.CTRL, 0xAB), 0x21001AB4),
        # every field at its maximum
        ((15, 2047, 31, 15, 255), 0xFFFFFFFF),
        ((ert.State.ERROR, 0, 0, 0, 0), 0x00000005),
    ],
)
def test_ert_header_words_against_hand_computed_values(fields: tuple[int, ...], word: int) -> None:
    state, count, opcode, type_, custom = fields
    assert ert.header(state, count, opcode, type_, custom) == word
    assert ert.parse_header(word) == (state, custom, count, opcode, type_)


@pytest.mark.parametrize(
    "bad",
    [
        (16, 1, 0, 3, 0),
        (1, 2048, 0, 3, 0),
        (1, 1, 32, 3, 0),
        (1, 1, 0, 16, 0),
        (1, 1, 0, 3, 256),
        (-1, 1, 0, 3, 0),
    ],
)
def test_ert_header_field_overflow_is_value_error(bad: tuple[int, ...]) -> None:
    state, count, opcode, type_, custom = bad
    with pytest.raises(ValueError):
        ert.header(state, count, opcode, type_, custom)


def _words(raw: bytes) -> list[int]:
    return [int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4)]


def test_ert_start_cu_encode_decode() -> None:
    # CU 2, four argument words: header, cu_mask, 4 data words -> count 5
    cmd = ert.start_cu(2, [7, 0x1_0000_0001, 0xDEADBEEF, 0])
    raw = cmd.encode()
    assert _words(raw) == [0x30005001, 0b100, 7, 1, 0xDEADBEEF, 0]  # args are truncated to 32 bits
    back = ert.ErtCommand.decode(raw)
    assert (back.state, back.opcode, back.type, back.cu_mask) == (
        ert.State.NEW,
        ert.Opcode.START_CU,
        ert.CmdType.CU,
        4,
    )
    assert back.payload == [7, 1, 0xDEADBEEF, 0]


def test_ert_start_npu_encode_decode() -> None:
    # ert_npu_data: instruction buffer (u64), its size (u32), property count (u32), then args
    cmd = ert.start_npu(1, 0x1122334455667788, 4096, [9, 8], props=0)
    raw = cmd.encode()
    assert _words(raw) == [
        0x30007001 | (20 << 23),  # NEW, count 7 (cu_mask + 4 + 2 args), START_NPU, CU
        0b10,
        0x55667788,
        0x11223344,
        4096,
        0,
        9,
        8,
    ]
    back = ert.ErtCommand.decode(raw)
    assert back.opcode == ert.Opcode.START_NPU and back.cu_mask == 2
    assert back.payload == [0x55667788, 0x11223344, 4096, 0, 9, 8]


def test_ert_cmd_chain_encode_decode() -> None:
    # ert_cmd_chain_data, right after the header (no cu_mask): count, submit
    # index, error index, reserved[3], then u64 command handles
    h0, h1 = 0x0004_0001_0000_0007, 0x0004_0002_0000_0009
    raw = ert.cmd_chain([h0, h1]).encode()
    assert _words(raw) == [
        0x3980A001,  # NEW, count 10 = 6 + 2 * 2, CMD_CHAIN, CU
        2,
        0,
        0,
        0,
        0,
        0,
        0x0000_0007,
        0x0004_0001,
        0x0000_0009,
        0x0004_0002,
    ]
    back = ert.ErtCommand.decode(raw)
    assert back.opcode == ert.Opcode.CMD_CHAIN and back.cu_mask == 0
    assert back.payload[0] == 2 and len(back.payload) == ert.CHAIN_HEADER_WORDS + 4
    assert ert.u64_args([h0, h1]) == back.payload[ert.CHAIN_HEADER_WORDS :]


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x01\x50\x00",  # shorter than a header word
        (0x30005001).to_bytes(4, "little") + bytes(4 * 4),  # count 5 but 4 words follow
        (0x30000001).to_bytes(4, "little"),  # START_CU with count 0: no cu_mask
    ],
)
def test_ert_decode_of_a_truncated_command_is_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        ert.ErtCommand.decode(raw)


def test_ert_u64_args_split_little_endian() -> None:
    assert ert.u64_args([0x1122334455667788, 5]) == [0x55667788, 0x11223344, 5, 0]


# --------------------------------------------------------------------------- the ring, one process


def test_queue_full_raises_and_never_overwrites(qdom: hl.Domain) -> None:
    q = qdom.queue(4)
    try:
        sent = [hl.Packet(kernel=10 + i, signal_value=1000 + i) for i in range(4)]
        assert [q.push(p, timeout=0) for p in sent] == [0, 1, 2, 3]
        with pytest.raises(hl.QueueFull):
            q.push(hl.Packet(kernel=99), timeout=0)
        t0 = time.monotonic()
        with pytest.raises(hl.QueueFull):
            q.push(hl.Packet(kernel=98), timeout=0.05)
        assert time.monotonic() - t0 >= 0.04
        info = q.info()
        assert (info["write_index"], info["read_index"], info["capacity"]) == (4, 0, 4)
        q.bind()
        got = [q.pop(timeout=1) for _ in range(4)]
        assert got == [(i, p) for i, p in enumerate(sent)]
        assert q.pop(timeout=0) is None
        assert q.info()["read_index"] == 4
    finally:
        q.release()


def test_push_blocks_until_the_consumer_frees_a_cell(qdom: hl.Domain) -> None:
    q = qdom.queue(2)
    try:
        q.bind()
        q.push(hl.Packet(kernel=1), timeout=0)
        q.push(hl.Packet(kernel=2), timeout=0)
        result: list[object] = []

        def producer() -> None:
            try:
                result.append(q.push(hl.Packet(kernel=3), timeout=10))
            except Exception as e:  # pragma: no cover - reported below
                result.append(e)

        t = threading.Thread(target=producer)
        t.start()
        # the producer asleep: counted in struct hl_queue.space_waiters (the u32 after
        # read_index, offset 136) and its thread in a futex wait; the pop must wake it
        space_waiters = ctypes.c_uint32.from_address(
            lowlevel.queue_view(qdom, q).queue + int(C.Q_READ_INDEX) + 8
        )
        assert wait_until(lambda: space_waiters.value >= 1 and thread_in_futex(*ident(t)), 20)
        assert not result, "push into a full queue returned before a cell was freed"
        r = q.pop(timeout=1)
        assert r is not None and r[1].kernel == 1
        t.join(10)
        assert result == [2]
        assert [p.kernel for _, p in (q.pop(timeout=1), q.pop(timeout=1))] == [2, 3]  # type: ignore[misc]
    finally:
        q.release()


def test_pop_needs_the_bound_consumer(qdom: hl.Domain) -> None:
    q = qdom.queue(4)
    try:
        with pytest.raises(hl.InvalidOperation):
            q.pop(timeout=0)
        q.bind()
        q.bind()  # idempotent for the consumer itself
        assert q.pop(timeout=0) is None
    finally:
        q.release()


def test_queue_capacity_must_be_a_power_of_two(qdom: hl.Domain) -> None:
    for bad in (0, 1, 3, 12):
        with pytest.raises(ValueError):
            qdom.queue(bad)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.sampled_from(["push", "pop"]), max_size=60), cap=st.sampled_from([2, 4, 8]))
def test_queue_against_a_model(qdom: hl.Domain, ops: list[str], cap: int) -> None:
    q = qdom.queue(cap)
    try:
        q.bind()
        model: deque[tuple[int, int]] = deque()
        pushed = 0
        for op in ops:
            if op == "push":
                pkt = hl.Packet(kernel=pushed % 1000, signal_value=pushed)
                if len(model) == cap:
                    with pytest.raises(hl.QueueFull):
                        q.push(pkt, timeout=0)
                else:
                    assert q.push(pkt, timeout=0) == pushed
                    model.append((pushed, pushed))
                    pushed += 1
            else:
                r = q.pop(timeout=0)
                if not model:
                    assert r is None
                else:
                    idx, sv = model.popleft()
                    assert r is not None and r[0] == idx and r[1].signal_value == sv
            info = q.info()
            assert info["write_index"] - info["read_index"] == len(model)
    finally:
        q.release()


# --------------------------------------------------------------------------- many producers


PRODUCER = """
name, qh, go = sys.argv[1], int(sys.argv[2], 0), int(sys.argv[3], 0)
me, n = int(sys.argv[4]), int(sys.argv[5])
d = hl.Domain.open(name, label=f"producer{me}")
q = d.import_queue(qh)
f = d.import_fence(go)
print("ready", flush=True)
assert f.wait(30) is hl.Status.SUCCESS
idx = [q.push(hl.Packet(kernel=me, signal_value=s, args=me << 32 | s), timeout=30) for s in range(n)]
print(json.dumps(idx), flush=True)
q.release(); f.release(); d.close()
"""


def test_many_producers_one_consumer_model_check(qdom: hl.Domain) -> None:
    """4 processes push numbered packets into one 16-cell queue at once; the
    consumer (this process) checks order per producer, no loss, no duplicate,
    and that each packet arrives at the index its producer was given."""
    nprod, n = 4, 1500
    q = qdom.queue(16)
    go = qdom.fence()
    procs: list[subprocess.Popen[str]] = []
    try:
        q.bind()
        for me in range(nprod):
            procs.append(_child(PRODUCER, qdom.name, hex(q.handle), hex(go.handle), me, n))
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
        go.signal()
        seen: list[tuple[int, int, int]] = []
        deadline = time.monotonic() + 60
        while len(seen) < nprod * n and time.monotonic() < deadline:
            r = q.pop(timeout=1)
            if r is not None:
                i, pkt = r
                assert pkt.args == (pkt.kernel << 32 | pkt.signal_value)  # not torn
                seen.append((i, pkt.kernel, pkt.signal_value))
        given_idx = {}
        for me, p in enumerate(procs):
            out, err = p.communicate(timeout=30)
            assert p.returncode == 0, err
            for s, i in enumerate(json.loads(out.splitlines()[-1])):
                given_idx[i] = (me, s)
        assert len(seen) == nprod * n, f"lost packets: got {len(seen)} of {nprod * n}"
        assert [i for i, _, _ in seen] == list(range(nprod * n))  # consumed in index order, no gap
        per: dict[int, list[int]] = {me: [] for me in range(nprod)}
        for i, me, s in seen:
            per[me].append(s)
            assert given_idx[i] == (me, s)
        for me in range(nprod):
            assert per[me] == list(range(n)), f"producer {me}: order broken or packets lost/duplicated"
        assert q.pop(timeout=0) is None
        info = q.info()
        assert info["write_index"] == info["read_index"] == nprod * n
    finally:
        for p in procs:
            _kill(p)
        q.release()
        go.release()


# --------------------------------------------------------------------------- dead producer


STUCK = """
name, qh, sig = sys.argv[1], int(sys.argv[2], 0), int(sys.argv[3], 0)
d = hl.Domain.open(name, label="stuck-producer")
q = d.import_queue(qh)
print(hl._core.testing.queue_reserve_stuck(d._core, qh, sig), flush=True)
time.sleep(120)
"""


@needs_test_hooks
def test_producer_killed_while_filling_is_skipped(qdom: hl.Domain) -> None:
    q = qdom.queue(8)
    f = qdom.fence()  # the stuck packet's signal
    child = _child(STUCK, qdom.name, hex(q.handle), hex(f.handle))
    try:
        q.bind()
        before = hl.Packet(kernel=1)
        assert q.push(before, timeout=0) == 0
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        assert line == "1", child.stderr.read() if child.stderr else ""
        after = hl.Packet(kernel=2, signal_value=77)
        assert q.push(after, timeout=0) == 2
        assert q.pop(timeout=1) == (0, before)
        # cell 1 is RESERVED by a live producer: the consumer must wait, not skip
        assert q.pop(timeout=0.2) is None
        assert f.status is hl.Status.ACTIVE
        child.kill()
        child.wait(10)
        t0 = time.monotonic()
        assert f.wait(5) is hl.Status.OWNER_DIED
        assert q.pop(timeout=5) == (2, after)
        assert time.monotonic() - t0 < 5
        assert q.pop(timeout=0) is None
        # the ring goes on past the skipped cell
        assert q.push(hl.Packet(kernel=3), timeout=0) == 3
        r = q.pop(timeout=1)
        assert r is not None and r[0] == 3 and r[1].kernel == 3
        assert q.info()["read_index"] == 4
    finally:
        _kill(child)
        q.release()
        f.release()
    assert qdom.check() == []


def test_trace_records_enqueues(qdom: hl.Domain) -> None:
    from hostless import trace

    q = qdom.queue(4)
    try:
        q.push(hl.Packet(kernel=5, signal=0), timeout=0)
        q.push(hl.Packet(kernel=6), timeout=0)
        evs = [e for e in trace.events(qdom) if e["type"] == int(C.EV_ENQUEUE) and e["a"] == q.handle]
        assert [(e["b"], e["d"]) for e in evs] == [(0, 5), (1, 6)]
        me = next(p.index for p in qdom.participants if p.id == qdom.participant_id)
        assert all(e["part"] == me for e in evs)
        assert evs[0]["ts"] <= evs[1]["ts"]
    finally:
        q.release()
