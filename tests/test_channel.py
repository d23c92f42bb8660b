"""Channels (hostless.channel, hostless.subscriber): one publisher, N subscribers over a ring.

Unit tests in one process (two Domain objects are two participants), then processes: four
subscribers, SIGKILL of a subscriber at random points with a replacement that resumes, and
hostile contents under the channel's names.  The skip policy's "never a torn frame" is checked
against a reference model over random interleavings of the publisher's and the subscriber's steps.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hostless as hl
from conftest import SLACK, kill_child, live_slots, read_line, spawn_child, wait_until
from hostless import channel as chmod

S = hl.Status


@pytest.fixture
def two(domain_name: str) -> Iterator[tuple[hl.Domain, hl.Domain]]:
    """The publisher's and a subscriber's participants of one domain."""
    a = hl.Domain.create(domain_name, heap="8M", fences=512, participants=32)
    b = hl.Domain.open(domain_name, label="sub")
    try:
        yield a, b
    finally:
        b.close()
        a.close()


def fill(pub: hl.Channel, n: int, timeout: float | None = 1.0) -> None:
    for _ in range(n):
        with pub.loan(timeout) as f:
            f.data[...] = f.seq % 251


# ------------------------------------------------------------------------------ one process


def test_frames_in_order_with_data_and_read_only_views(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", (8, 8), "u2", depth=3)
    sub = hl.Subscriber(b, "cam", "det", shape=(8, 8), dtype="u2")
    for i in range(1, 11):
        with pub.loan() as f:
            assert f.seq == i and f.data.flags.writeable
            f.data[...] = i
        with sub.receive(timeout=1) as g:
            assert (g.seq, g.lost, int(g.data.sum())) == (i, 0, 64 * i)
            assert not g.data.flags.writeable
            with pytest.raises(hl.InvalidOperation):
                sub.receive(0)  # one frame at a time
    assert sub.acknowledged == 10 and pub.published == 10
    raw = hl.Channel(a, "raw", 64)  # raw bytes
    assert (raw.shape, raw.dtype) == ((64,), np.dtype("u1"))
    with pytest.raises(hl.ChannelError, match="carries"):
        hl.Subscriber(b, "cam", "x", shape=(8, 8), dtype="f4")
    sub.close()
    pub.close()
    raw.close()


def test_bad_arguments_are_refused_before_anything_is_allocated(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, _ = two
    before = live_slots(a)
    for kw in ({"depth": 0}, {"depth": chmod.MAX_DEPTH + 1}, {"timeout": -1}, {"grace": -1.0}):
        with pytest.raises(ValueError):
            hl.Channel(a, "c", 16, **kw)  # type: ignore[arg-type]
    for bad in ("", "a/b", "x" * 21, 5):
        with pytest.raises((ValueError, TypeError)):
            hl.Channel(a, bad, 16)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        hl.Channel(a, "c", (0, 3), "u1")
    pub = hl.Channel(a, "c", 16)
    with pytest.raises(ValueError, match="policy"):
        hl.Subscriber(a, "c", "s", policy="drop")
    with pytest.raises(ValueError, match="start"):
        hl.Subscriber(a, "c", "s", start="middle")
    with pytest.raises(hl.NameTaken, match="live publisher"):
        hl.Channel(a, "c", 16)
    pub.close()
    assert live_slots(a) == before


def test_block_policy_publisher_waits_then_times_out_naming_the_subscriber(
    two: tuple[hl.Domain, hl.Domain],
) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 16, depth=2, timeout=0.2)
    sub = hl.Subscriber(b, "cam", "slow")
    fill(pub, 2)
    t0 = time.monotonic()
    with pytest.raises(hl.SlowSubscriber, match="slow") as ei:
        pub.loan()
    assert isinstance(ei.value, TimeoutError)
    assert 0.2 <= time.monotonic() - t0 < 0.2 + SLACK
    assert pub.published == 2
    with sub.receive(0):
        pass
    fill(pub, 1)  # frame 3 needed frame 1 released
    with pytest.raises(hl.SlowSubscriber):
        pub.loan(timeout=0)
    # a loan waiting for the subscriber is released by its acknowledgement
    threading.Timer(0.1, lambda: sub.receive(0).__exit__(None, None, None)).start()
    with pub.loan(timeout=5) as f:
        assert f.seq == 4
    sub.close()
    pub.close()


def test_a_loan_whose_block_raises_publishes_nothing_and_its_slot_is_reused(
    two: tuple[hl.Domain, hl.Domain],
) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 4, depth=2)
    sub = hl.Subscriber(b, "cam", "s")
    with pytest.raises(RuntimeError):
        with pub.loan() as f:
            f.data[...] = 9
            raise RuntimeError("capture failed")
    assert pub.published == 0
    with pytest.raises(TimeoutError):
        sub.receive(0)
    with pub.loan() as f:
        assert f.seq == 1
        f.data[...] = 1
    with sub.receive(0) as g:
        assert (g.seq, int(g.data[0])) == (1, 1)
    sub.close()
    pub.close()


def test_skip_policy_never_blocks_the_publisher_and_counts_what_it_missed(
    two: tuple[hl.Domain, hl.Domain],
) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 4, depth=3, timeout=0)
    sub = hl.Subscriber(b, "cam", "viewer", policy="skip")
    fill(pub, 10, timeout=0)  # never waits for a skip subscriber
    with sub.receive(0) as g:
        assert (g.seq, g.lost, int(g.data[0])) == (10, 9, 10)  # skipped to the newest
    fill(pub, 2, timeout=0)
    with sub.receive(0) as g:  # frame 11 is still in the ring: no skip
        assert (g.seq, g.lost) == (11, 0)
    with sub.receive(0) as g:
        fill(pub, 3, timeout=0)  # frame 12's slot rewritten during the block
        assert not g.intact
        with pytest.raises(hl.FrameOverwritten):
            g.__exit__(None, None, None)
    assert sub.acknowledged == 12 and sub.lost == 9
    # an exception in the block is not masked by the overwrite
    with pytest.raises(KeyError):
        with sub.receive(0):
            fill(pub, 3, timeout=0)
            raise KeyError("mine")
    sub.close()
    pub.close()


@pytest.mark.parametrize(("start", "first"), [("oldest", 3), ("newest", 6), ("next", 7)])
def test_history_for_late_joiners(two: tuple[hl.Domain, hl.Domain], start: str, first: int) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 4, depth=4)
    fill(pub, 6)  # frames 3..6 retained
    sub = hl.Subscriber(b, "cam", "late", start=start)
    got: list[tuple[int, int]] = []

    def drain() -> None:
        while True:
            try:
                g = sub.receive(0)
            except TimeoutError:
                return
            with g:
                got.append((g.seq, int(g.data[0])))

    drain()
    fill(pub, 1)  # frame 7
    drain()
    assert got == [(n, n) for n in range(first, 8)]
    with pytest.raises(TimeoutError):
        sub.receive(0)
    sub.close()
    pub.close()


def test_clean_close_releases_the_publisher_at_once_and_frees_the_name(
    two: tuple[hl.Domain, hl.Domain],
) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 4, depth=2, timeout=0, grace=60)
    sub = hl.Subscriber(b, "cam", "s")
    fill(pub, 2)
    with pytest.raises(hl.SlowSubscriber):
        pub.loan()
    sub.close()
    fill(pub, 3, timeout=0)  # no grace for a subscriber that left
    assert pub.subscribers == {}
    again = hl.Subscriber(b, "cam", "s", start="next")  # a new subscriber: no resume
    assert not again.resumed
    again.close()
    pub.close()


def test_channel_closed_after_the_last_frame(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 4, depth=4)
    sub = hl.Subscriber(b, "cam", "s", start="next")
    fill(pub, 2)
    pub.close()
    for n in (1, 2):
        with sub.receive(1) as g:
            assert g.seq == n
    with pytest.raises(hl.ChannelClosed, match="closed it after frame 2"):
        sub.receive(1)
    sub.close()
    pub2 = hl.Channel(a, "cam", 4)  # the name is free again
    pub2.close()


def test_live_name_taken_and_subscriber_bound(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 4)
    s = hl.Subscriber(b, "cam", "s")
    with pytest.raises(hl.SubscriberNameTaken):
        hl.Subscriber(a, "cam", "s", timeout=0.1)
    subs = [hl.Subscriber(b, "cam", f"n{i}", policy="skip") for i in range(chmod.MAX_SUBSCRIBERS - 1)]
    with pytest.raises(hl.ChannelFull, match=str(chmod.MAX_SUBSCRIBERS)):
        hl.Subscriber(b, "cam", "extra")
    assert "ch:cam/extra" not in b.names()
    subs.pop().close()
    hl.Subscriber(b, "cam", "extra").close()
    for x in (*subs, s):
        x.close()
    pub.close()


def test_async_receive_and_loan(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 4, depth=1)
    sub = hl.Subscriber(b, "cam", "s", start="next")

    async def main() -> list[int]:
        async def produce() -> None:
            for _ in range(5):
                with await pub.loan_async(timeout=5) as f:  # waits for the subscriber (depth 1)
                    f.data[...] = f.seq

        task = asyncio.ensure_future(produce())
        got = []
        for _ in range(5):
            with await sub.receive_async(timeout=5) as g:
                got.append(int(g.data[0]))
        await task
        with pytest.raises(TimeoutError):
            await sub.receive_async(timeout=0.05)
        return got

    assert asyncio.run(main()) == [1, 2, 3, 4, 5]
    sub.close()
    pub.close()


def test_ctrl_c_ends_a_receive_and_a_loan(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 4, depth=1, timeout=None)
    sub = hl.Subscriber(b, "cam", "s", start="next")
    for what in ("receive", "loan"):
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            if what == "receive":
                sub.receive()
            else:
                fill(pub, 2, timeout=None)  # frame 2 waits for frame 1's release forever
        assert time.monotonic() - t0 < 0.2 + SLACK
    sub.close()
    pub.close()


def test_device_channel_hands_out_device_buffers(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "gpu", (4, 4), "f4", device="cuda:0")
    sub = hl.Subscriber(b, "gpu", "s")
    assert sub.device == "cuda:0"
    with pub.loan() as f:
        assert isinstance(f.data, hl.Buffer) and f.data.device == "cuda:0"
    with sub.receive(1) as g:
        assert g.buffer.device == "cuda:0" and g.data.handle == f.data.handle and g.seq == 1
    sub.close()
    pub.close()


# ------------------------------------------------------------------------ hostile contents


def _record(d: hl.Domain, words: list[int], n: int = 8) -> hl.Buffer:
    r = d.buffer(n, "<u8")
    r.numpy()[:] = 0
    r.numpy()[: len(words)] = words
    return r


def test_hostile_records_are_rejected_and_the_publisher_carries_on(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 4, depth=2, timeout=0.2)
    good = hl.Subscriber(b, "cam", "good", policy="skip")
    m, ph = chmod._REC_MAGIC, pub._pub_h
    fence, tl = b.fence(), b.timeline()
    bad = {
        "short": _record(b, [m, tl.handle, 0, ph], 4),
        "magic": _record(b, [m ^ 1, tl.handle, 0, ph]),
        "forged": _record(b, [m, (tl.handle ^ (1 << 30)) | 1, 0, ph]),
        "fence": _record(b, [m, fence.handle, 0, ph]),
        "policy": _record(b, [m, tl.handle, 7, ph]),
        "ownpub": _record(b, [m, ph, 0, ph]),
        "other": _record(b, [m, tl.handle, 0, ph + 1]),
    }
    for k, r in bad.items():
        b.publish(f"ch:cam/{k}", r)
    b.publish("ch:cam/tl", tl)  # not even a buffer
    fill(pub, 5, timeout=0.2)  # nothing of the above blocks the publisher
    assert set(pub.subscribers) == {"good"}
    assert pub.rejected == len(bad) + 1
    # a subscriber whose name holds garbage takes the name over
    s = hl.Subscriber(b, "cam", "magic", start="next")
    s2 = hl.Subscriber(b, "cam", "tl", start="next", timeout=1)  # (a Timeline held the name)
    fill(pub, 1)
    assert set(pub.subscribers) == {"good", "magic", "tl"}
    for o in (*bad.values(), fence, tl, s, s2, good, pub):
        o.close() if isinstance(o, (hl.Subscriber, hl.Channel)) else o.release()


def _descriptor(d: hl.Domain, words: list[int], n: int | None = None) -> hl.Buffer:
    r = d.buffer(n or len(words), "<u8")
    r.numpy()[: len(words)] = words
    return r


def test_hostile_descriptors_give_corrupt_channel_and_leak_nothing(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "ok", (2, 2), "u1", depth=2)
    d = pub._desc.numpy().copy().tolist()
    other = a.buffer((3, 3), "u1")
    cases = {
        "tiny": [chmod._DESC_MAGIC],
        "magic": [0, *d[1:]],
        "version": [d[0], 2 | 2 << 32, *d[2:]],
        "deep": [d[0], 1 | 1000 << 32, *d[2:]],  # more slots than the buffer holds
        "zero": [d[0], 1, *d[2:]],
        "same": [d[0], d[1], d[2], d[2], *d[4:]],
        "dupslot": [*d[:8], d[8], d[8]],
        "forged": [*d[:8], d[8], d[9] ^ (1 << 33)],
        "slot_tl": [*d[:8], d[8], d[2]],
        "mixed": [*d[:8], d[8], other.handle],
    }
    held = []
    for k, words in cases.items():
        r = _descriptor(a, [int(x) for x in words], 16 if k == "tiny" else None)
        a.publish(f"ch:{k}", r)
        held.append(r)
    a.publish("ch:fence", f := a.fence())
    before = live_slots(b)
    for k in (*cases, "fence"):
        with pytest.raises(hl.CorruptChannel):
            hl.Subscriber(b, k, "s", timeout=0)
        assert live_slots(b) == before, k
    with pytest.raises(TimeoutError):
        hl.Subscriber(b, "absent", "s", timeout=0.05)
    for o in (*held, other, f):
        o.release()
    pub.close()


def test_a_claim_pushed_by_a_hostile_peer_is_survived(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 4, depth=2)
    blk = hl.Subscriber(b, "cam", "blk", start="next")
    skp = hl.Subscriber(b, "cam", "skp", policy="skip", start="next")
    fill(pub, 1)
    b.import_timeline(pub._claim_h).signal(10**9)  # any holder can move a timeline
    with pytest.raises(TimeoutError):  # frame 1 looks overwritten: it waits for the oldest intact
        blk.receive(0.05)
    with pytest.raises(TimeoutError):
        skp.receive(0.05)
    for o in (blk, skp, pub):
        o.close()


# ----------------------------------------------------------------- the skip policy's model


OPS = st.lists(
    st.sampled_from(
        ["begin", "half", "rest", "publish", "abort", "recv", "read", "release", "cycle", "cycle"]
    ),
    min_size=10,
    max_size=60,
)


_MODEL_STATS: list[dict[str, int]] = []


@settings(max_examples=150, deadline=None)
@given(ops=OPS, depth=st.integers(1, 3))
def test_skip_policy_matches_the_model_and_never_yields_a_torn_frame(ops: list[str], depth: int) -> None:
    """Random interleavings of the publisher's steps (claim, write half, write the rest,
    publish or abort) and a skip subscriber's (receive, read a copy, release): every frame
    handed out is the one the model says (newest after an overwrite, with ``lost``), a release
    raises FrameOverwritten exactly when the model says the slot was claimed again, and every
    release that does not raise read a whole frame (all bytes = its number)."""
    name = f"hlch-model-{random.getrandbits(40):x}"
    with hl.Domain.create(name, heap="1M", fences=64, unlink_on_close=True) as d:
        pub = hl.Channel(d, "m", 64, depth=depth, timeout=0)
        sub = hl.Subscriber(d, "m", "s", policy="skip", start="next")
        claim = pub_v = 0
        nxt = 1
        loan = frame = None
        wrote = 0
        reads: list[np.ndarray] = []
        stats = {"torn": 0, "clean": 0}
        for op in ops:
            if op == "cycle" and loan is None:  # a whole frame at once: a fast publisher
                with pub.loan(0) as f:
                    f.data[...] = f.seq % 251
                claim = pub_v = f.seq
            elif op == "begin" and loan is None:
                loan = pub.loan(0).__enter__()
                claim, wrote = max(claim, loan.seq), 0
            elif op in ("half", "rest") and loan is not None:
                part = slice(0, 32) if op == "half" else slice(32, 64)
                loan.data[part] = loan.seq % 251
                wrote |= 1 if op == "half" else 2
            elif op == "publish" and loan is not None:
                if wrote != 3:  # the rest of the frame first
                    loan.data[...] = loan.seq % 251
                loan.__exit__(None, None, None)
                pub_v, loan = loan.seq, None
            elif op == "abort" and loan is not None:
                loan.__exit__(RuntimeError, RuntimeError(), None)
                loan = None
            elif op == "recv" and frame is None:
                n, lost = nxt, 0
                while pub_v >= n and claim >= n + depth:
                    m = max(n + 1, pub_v)
                    lost, n = lost + m - n, m
                if pub_v < n:
                    with pytest.raises(TimeoutError):
                        sub.receive(0)
                    nxt = n
                else:
                    frame = sub.receive(0).__enter__()
                    assert (frame.seq, frame.lost) == (n, lost)
                    reads = []
            elif op == "read" and frame is not None:
                reads.append(np.array(frame.data))
            elif op == "release" and frame is not None:
                overwritten = claim >= frame.seq + depth
                if overwritten:
                    with pytest.raises(hl.FrameOverwritten):
                        frame.__exit__(None, None, None)
                    stats["torn"] += 1
                else:
                    stats["clean"] += 1
                    frame.__exit__(None, None, None)
                    for r in reads:
                        assert (r == frame.seq % 251).all(), f"torn frame {frame.seq}: {r}"
                nxt, frame = frame.seq + 1, None
        if loan is not None:
            loan.__exit__(RuntimeError, RuntimeError(), None)
        _MODEL_STATS.append(stats)
        if frame is not None:
            frame._open = False
            sub._frame = None
        sub.close()
        pub.close()


def test_the_model_saw_overwritten_and_clean_releases() -> None:
    """The model test above is not vacuous: its examples released torn and whole frames."""
    if not _MODEL_STATS:
        pytest.skip("run with the model test")
    torn, clean = (sum(x[k] for x in _MODEL_STATS) for k in ("torn", "clean"))
    assert torn > 0 and clean > 0, (torn, clean, len(_MODEL_STATS))


# ------------------------------------------------------------------------------ processes

# A subscriber process: argv domain, subscriber name, policy.  Prints "joined" once subscribed,
# "ready <next> <resumed>" once the publisher has seen it, then "f <seq> <lost> <ok>" for each
# frame from inside its with block (before the acknowledgement; ok: every byte is seq % 251),
# "torn <seq>" for a skip frame overwritten while read, and "done <lost>" once the channel is
# closed.
SUB = """
dom = hl.Domain.open(sys.argv[1], label="sub-" + sys.argv[2], watchdog_interval=0.01)
sub = hl.Subscriber(dom, "cam", sys.argv[2], policy=sys.argv[3], start="oldest", timeout=20)
print("joined", flush=True)
t = time.monotonic()
while not sub.seen and time.monotonic() < t + 20:  # the publisher takes it in at its next loan
    time.sleep(0.001)
print("ready", sub._next, int(sub.resumed), flush=True)
while True:
    try:
        frame = sub.receive(timeout=20)
    except hl.ChannelClosed:
        break
    try:
        with frame:
            a = frame.data
            ok = int(a.min()) == int(a.max()) == frame.seq % 251
            print("f", frame.seq, frame.lost, int(ok), flush=True)
    except hl.FrameOverwritten:
        print("torn", frame.seq, flush=True)
print("done", sub.lost, flush=True)
sub.close()
dom.close()
"""


def _publisher(pub: hl.Channel, frames: int, pace: float, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            for _ in range(frames):
                with pub.loan(timeout=60) as f:
                    f.data[...] = f.seq % 251
                if pace:
                    time.sleep(pace)
        except BaseException as e:  # the test reports it
            errors.append(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def _lines(proc) -> list[str]:  # type: ignore[no-untyped-def]
    from conftest import _line_queue

    out, q = [], _line_queue(proc)
    while True:
        try:
            line = q.get(timeout=30)
        except Exception:
            break
        if line is None:
            break
        out.append(line.strip())
    return out


def test_four_subscriber_processes_receive_every_frame_or_skip_cleanly(domain_name: str) -> None:
    """Three "block" subscribers get every frame intact and in order; a "skip" one gets
    increasing frames, each intact or reported torn, with ``lost`` accounting for every gap."""
    frames = 300
    with hl.Domain.create(domain_name, heap="16M", participants=16) as d:
        pub = hl.Channel(d, "cam", (64, 1024), "u1", depth=4, grace=30)
        kids = [spawn_child(SUB, domain_name, f"s{i}", "block" if i < 3 else "skip") for i in range(4)]
        try:
            assert wait_until(lambda: len(pub.subscribers) == 4, 20)
            for k in kids:
                assert read_line(k) == "joined" and read_line(k) == "ready 1 0"
            errors: list[BaseException] = []
            _publisher(pub, frames, 0.0, errors).join(120)
            assert not errors, errors
            pub.close()
            for i, k in enumerate(kids):
                out = _lines(k)
                assert out[-1].startswith("done"), out[-3:]
                got = [line.split() for line in out if line.startswith(("f ", "torn "))]
                if i < 3:
                    want = [(n, "0", "1") for n in range(1, frames + 1)]
                    assert [(int(x[1]), x[2], x[3]) for x in got] == want
                else:
                    torn = {int(x[1]) for x in got if x[0] == "torn"}  # its "f" line was printed in the block
                    whole = [x for x in got if x[0] == "f" and int(x[1]) not in torn]
                    seqs = [int(x[1]) for x in got if x[0] == "f"]
                    assert seqs == sorted(set(seqs)) and seqs[-1] == frames
                    assert all(x[3] == "1" for x in whole), "a skip subscriber kept a torn frame"
                    lost = sum(int(x[2]) for x in got if x[0] == "f")
                    assert lost == frames - len(seqs) == int(out[-1].split()[1])
                assert k.wait(20) == 0
        finally:
            for k in kids:
                kill_child(k)


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_of_a_subscriber_and_its_replacement_lose_nothing(domain_name: str, seed: int) -> None:
    """A "block" subscriber is killed with SIGKILL at random points of its loop, four times, and
    replaced each time under the same name: each replacement resumes right after the last frame
    the dead one acknowledged (so at most the one frame it held is received twice), every frame
    arrives intact, none is lost, and the publisher never gave up on the name (grace 30 s)."""
    rng = random.Random(seed)
    frames = 400
    with hl.Domain.create(domain_name, heap="16M", participants=16, watchdog_interval=0.01) as d:
        pub = hl.Channel(d, "cam", 4096, depth=4, grace=30)
        kid = spawn_child(SUB, domain_name, "k", "block")
        assert read_line(kid) == "joined"
        assert wait_until(lambda: "k" in pub.subscribers, 10)
        assert read_line(kid) == "ready 1 0"
        errors: list[BaseException] = []
        th = _publisher(pub, frames, 0.002, errors)
        runs: list[tuple[int, int, list[int]]] = []  # (first, resumed, frames logged)
        first, resumed = 1, 0
        try:
            for _ in range(4):
                time.sleep(rng.uniform(0.05, 0.4))
                kill_child(kid)
                logged = [int(x.split()[1]) for x in _lines(kid) if x.startswith("f ")]
                runs.append((first, resumed, logged))
                kid = spawn_child(SUB, domain_name, "k", "block")
                assert read_line(kid, 30) == "joined"
                _ready, nxt, res = read_line(kid, 30).split()  # the publisher saw it: its record outlives it
                first, resumed = int(nxt), int(res)
            th.join(120)
            assert not errors, errors
            pub.close()
            out = _lines(kid)
            assert out[-1].startswith("done"), out[-3:]
            runs.append((first, resumed, [int(x.split()[1]) for x in out if x.startswith("f ")]))
            assert all(x.split()[3] == "1" for x in out if x.startswith("f "))
        finally:
            kill_child(kid)
        assert runs[0][0] == 1
        for (f0, _r0, got), (f1, r1, _nxt) in zip(runs, runs[1:], strict=False):
            assert got == list(range(f0, f0 + len(got))), "a subscriber skipped or repeated a frame"
            last = got[-1] if got else f0 - 1  # logged before its acknowledgement
            assert r1 == 1 and f1 in (last, last + 1), (f0, got[-3:], f1)
        final = runs[-1][2]
        assert final == list(range(runs[-1][0], frames + 1))


def test_a_dead_subscriber_is_dropped_after_its_grace(domain_name: str) -> None:
    with hl.Domain.create(domain_name, heap="4M", watchdog_interval=0.01) as d:
        pub = hl.Channel(d, "cam", 64, depth=2, grace=0.3, timeout=10)
        kid = spawn_child(SUB, domain_name, "gone", "block")
        try:
            assert read_line(kid) == "joined"
            assert wait_until(lambda: "gone" in pub.subscribers, 10)
            assert read_line(kid) == "ready 1 0"
            held = d.lookup("ch:cam/gone")  # someone keeps the dead one's record (and its entry) alive
            kill_child(kid)
            fill(pub, 2)
            t0 = time.monotonic()
            fill(pub, 1, timeout=10)  # frame 3 needs frame 1: waits for the grace, then drops it
            assert 0.25 <= time.monotonic() - t0 < 0.3 + SLACK
            assert pub.subscribers == {}
            d.publish("unrelated", tl := d.timeline())  # the publisher looks at the names again ...
            t0 = time.monotonic()
            fill(pub, 3, timeout=10)  # ... and does not take the dropped record back (no new grace)
            assert time.monotonic() - t0 < 0.25 and pub.subscribers == {}
            held.release()
            tl.release()
            # after the drop a new subscriber of that name starts anew
            s = hl.Subscriber(d, "cam", "gone", start="next")
            assert not s.resumed and s._next == 7
            s.close()
        finally:
            kill_child(kid)
        pub.close()
        assert d.check() == []


def test_concurrent_replacements_one_wins_the_name(domain_name: str) -> None:
    """Three processes take over one dead subscriber's name at once: one resumes after its last
    acknowledged frame, the others get SubscriberNameTaken."""
    race = """
    dom = hl.Domain.open(sys.argv[1], watchdog_interval=0.01)
    print("up", flush=True)
    sys.stdin.readline()
    try:
        s = hl.Subscriber(dom, "cam", "k", timeout=0.5)
        print("won", s._next, int(s.resumed), flush=True)
        sys.stdin.readline()
    except hl.SubscriberNameTaken:
        print("taken", flush=True)
    """
    with hl.Domain.create(domain_name, heap="4M", watchdog_interval=0.01) as d:
        pub = hl.Channel(d, "cam", 64, depth=4, grace=30)
        kid = spawn_child(SUB, domain_name, "k", "block")
        racers = [spawn_child(race, domain_name) for _ in range(3)]
        try:
            assert read_line(kid) == "joined"
            assert wait_until(lambda: "k" in pub.subscribers, 10)
            assert read_line(kid) == "ready 1 0"
            fill(pub, 3)
            assert [read_line(kid) for _ in range(3)][-1].startswith("f 3")
            assert wait_until(lambda: pub.subscribers["k"]["acknowledged"] == 3, 10)
            kill_child(kid)
            for r in racers:
                assert read_line(r) == "up"
            for r in racers:
                r.stdin.write("go\n")  # type: ignore[union-attr]
                r.stdin.flush()  # type: ignore[union-attr]
            said = sorted(read_line(r, 30) for r in racers)
            assert said == ["taken", "taken", "won 4 1"], said
        finally:
            for k in (kid, *racers):
                kill_child(k)
        pub.close()


@pytest.mark.slow
def test_sigkill_anywhere_including_registration_loses_no_frame(domain_name: str) -> None:
    """Subscribers of one name killed with SIGKILL at any point, from right after their start
    (while registering or taking over) to deep in their loop, each replaced at once: across all
    of them every frame is received, each one's frames are contiguous, and the frames received
    twice are at most one per kill (the frame a killed one held)."""
    rng = random.Random(7)
    frames, kills = 600, 10
    with hl.Domain.create(domain_name, heap="16M", participants=32, watchdog_interval=0.01) as d:
        pub = hl.Channel(d, "cam", 4096, depth=4, grace=30)
        kid = spawn_child(SUB, domain_name, "k", "block")
        assert read_line(kid) == "joined"
        assert wait_until(lambda: "k" in pub.subscribers, 10)
        assert read_line(kid) == "ready 1 0"
        errors: list[BaseException] = []
        th = _publisher(pub, frames, 0.001, errors)
        logs: list[list[int]] = []
        try:
            for i in range(kills):
                time.sleep(rng.choice([rng.uniform(0, 0.08), rng.uniform(0.1, 0.5)]) if i else 0.2)
                kill_child(kid)
                logs.append([int(x.split()[1]) for x in _lines(kid) if x.startswith("f ")])
                kid = spawn_child(SUB, domain_name, "k", "block")
            th.join(180)
            assert not errors, errors
            pub.close()
            out = _lines(kid)
            assert out[-1].startswith("done"), out[-3:]
            logs.append([int(x.split()[1]) for x in out if x.startswith("f ")])
        finally:
            kill_child(kid)
        for got in logs:
            assert got == list(range(got[0], got[0] + len(got))) if got else True
        seen = [n for got in logs for n in got]
        assert set(seen) == set(range(1, frames + 1)), "a frame was lost"
        assert len(seen) - frames <= kills


def test_bench_channel_smoke(tmp_path: object) -> None:
    """`hostless bench channel` end to end on a tiny configuration (iceoryx2 too when it is
    installed): figures, goals, JSON and report."""
    import importlib.util
    import json
    from pathlib import Path

    from hostless_tools.bench import channel as bench

    ice = importlib.util.find_spec("iceoryx2") is not None
    cfg = bench.ChannelBenchConfig(
        subscribers=(1,), payloads=("64B",), latency_frames=40, throughput_frames=60, rounds=1, iceoryx2=ice
    )
    r = bench.run(cfg)
    assert r["errors"] == {}, r["errors"]
    want = {"hostless-spin/64B/1", "hostless-wait/64B/1"} | ({"iceoryx2-poll/64B/1"} if ice else set())
    assert set(r["figures"]) == want
    assert r["figures"]["hostless-wait/64B/1"]["throughput"]["frames"] == 60
    assert r["figures"]["hostless-spin/64B/1"]["latency"]["n"] == 40
    assert len(r["goals"]) == 5 and r["memcpy"]["bytes_per_s"] > 0
    js, md = bench.write_results(r, str(tmp_path))
    assert json.loads(Path(js).read_text())["benchmark"] == "channel"
    assert "iceoryx2" in Path(md).read_text()


def test_a_dead_publisher_ends_the_channel_and_a_new_one_takes_the_name(domain_name: str) -> None:
    """The publisher's process is killed: its subscriber receives what it published, then
    ChannelClosed (OWNER_DIED); a new publisher creates the channel again and the subscriber,
    subscribing again under its name, is served by it (its old record is left behind)."""
    with hl.Domain.create(domain_name, heap="4M", watchdog_interval=0.01) as d:
        kid = spawn_child(
            """
            dom = hl.Domain.open(sys.argv[1])
            pub = hl.Channel(dom, "cam", 8, depth=4)
            print("up", flush=True)
            sys.stdin.readline()
            for i in range(3):
                pub.publish(i + 1)
            print("sent", flush=True)
            time.sleep(60)
            """,
            domain_name,
        )
        try:
            assert read_line(kid) == "up"
            old = hl.Subscriber(d, "cam", "s", start="next")
            kid.stdin.write("go\n")  # type: ignore[union-attr]
            kid.stdin.flush()  # type: ignore[union-attr]
            assert read_line(kid) == "sent"
            held = d.lookup("ch:cam")  # keeps the dead publisher's descriptor (and its name) alive
            kill_child(kid)
            got = []
            with pytest.raises(hl.ChannelClosed, match="OWNER_DIED"):
                while True:
                    with old.receive(timeout=10) as f:
                        got.append(int(f.data[0]))
            assert got == [1, 2, 3]
        finally:
            kill_child(kid)
        pub = hl.Channel(d, "cam", 8, depth=4)  # replaces the dead publisher's entry
        held.release()
        new = hl.Subscriber(d, "cam", "s", start="next")
        assert not new.resumed
        pub.publish(9)
        with new.receive(timeout=1) as f:
            assert (f.seq, int(f.data[0])) == (1, 9)
        assert set(pub.subscribers) == {"s"}
        for x in (new, old, pub):
            x.close()


def test_a_successor_killed_before_the_publisher_saw_it_leaves_the_resume_point(domain_name: str) -> None:
    """A subscriber takes a dead one's name over (as its successor, ``<name>+``) and is killed
    before the publisher has seen it: the dead one's record, which the publisher holds, still
    has the name, so the next replacement resumes after the frame the first one acknowledged.
    Once the publisher sees a successor it promotes it to the name."""
    with hl.Domain.create(domain_name, heap="4M", watchdog_interval=0.01) as d:
        pub = hl.Channel(d, "cam", 64, depth=4, grace=30)
        kid = spawn_child(SUB, domain_name, "k", "block")
        r1 = None
        try:
            assert read_line(kid) == "joined"
            assert wait_until(lambda: "k" in pub.subscribers, 10)
            assert read_line(kid) == "ready 1 0"
            fill(pub, 3)
            assert [read_line(kid) for _ in range(3)][-1].startswith("f 3")
            assert wait_until(lambda: pub.subscribers["k"]["acknowledged"] == 3, 10)
            kill_child(kid)
            r1 = spawn_child(SUB, domain_name, "k", "block")  # the publisher publishes nothing now
            assert read_line(r1, 30) == "joined"
            assert "ch:cam/k+" in d.names()
            kill_child(r1)
            r2 = hl.Subscriber(d, "cam", "k", timeout=10)
            assert r2.resumed and r2._next == 4 and not r2.seen
            fill(pub, 1)  # the publisher sees r2 and promotes it to the name
            assert r2.seen and d.names()["ch:cam/k"] == r2._rec.handle and "ch:cam/k+" not in d.names()
            with r2.receive(1) as f:
                assert f.seq == 4
            r2.close()
        finally:
            for k in (kid, r1):
                if k is not None:
                    kill_child(k)
        pub.close()
