"""The channels' C fast path (binding/channel.c): ``Channel.loan``, ``Subscriber.receive`` and
``Frame.__exit__`` are C, and take the common case without entering a Python function; every
unusual case goes to the general path (``Channel._loan``, ``Subscriber._receive``, the owner's
``_finish``), which keeps the behaviour and the errors of the Python code.  Each test checks
which path ran: ``_fast_hits`` counts (fast loans or receives, fast exits) per ring, and a spy
on the general path counts its calls.  The behaviour itself is test_channel.py's."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import hostless as hl
from conftest import SLACK, kill_child, read_line, spawn_child, wait_until


@pytest.fixture
def two(domain_name: str) -> Iterator[tuple[hl.Domain, hl.Domain]]:
    """The publisher's and the subscribers' participants of one domain."""
    a = hl.Domain.create(domain_name, heap="8M", fences=512, participants=32, watchdog_interval=0.01)
    b = hl.Domain.open(domain_name, label="sub")
    try:
        yield a, b
    finally:
        b.close()
        a.close()


def spy(obj: Any, name: str) -> list[Any]:
    """Count the calls of ``obj``'s general path ``name`` (an instance attribute shadows the
    method: the C code looks it up on the instance); returns the list of their arguments."""
    calls: list[Any] = []
    real: Callable[..., Any] = getattr(obj, name)

    def wrapped(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    setattr(obj, name, wrapped)
    return calls


def step(pub: hl.Channel, subs: list[hl.Subscriber]) -> int:
    with pub.loan() as f:
        f.data[0] = f.seq % 251
    for s in subs:
        with s.receive(1) as g:
            assert g.seq == f.seq and g.data[0] == f.seq % 251
    return f.seq


def test_the_common_case_enters_no_python_function(two: tuple[hl.Domain, hl.Domain]) -> None:
    """Steady state, four subscribers (one "skip"): a loan and its publication, a receive and its
    release run without a single Python function call (sys.setprofile sees no "call" event), and
    each counts one fast call and one fast exit."""
    import sys

    a, b = two
    pub = hl.Channel(a, "cam", 64, depth=4)
    subs = [hl.Subscriber(b, "cam", f"s{i}", policy="skip" if i == 3 else "block") for i in range(4)]
    for _ in range(6):  # adoption, then the ring wrapped
        step(pub, subs)
    hp, hs = pub._fast_hits, subs[0]._fast_hits
    events: list[tuple[str, str]] = []

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            name = getattr(arg, "__name__", "") if event == "c_call" else frame.f_code.co_name
            events.append((event, name))

    sys.setprofile(prof)
    try:
        with pub.loan() as f:
            f.data[0] = 1
        with subs[0].receive() as g:
            assert g.seq == f.seq and g.data[0] == 1 and g.lost == 0
    finally:
        sys.setprofile(None)
    assert [e for e in events if e[0] == "call"] == [], events
    assert {n for _e, n in events} <= {"loan", "receive", "__exit__", "setprofile"}, events
    assert pub._fast_hits == (hp[0] + 1, hp[1] + 1)
    assert subs[0]._fast_hits == (hs[0] + 1, hs[1] + 1)
    assert isinstance(f, hl.Frame) and isinstance(g, hl.Frame) and not g.data.flags.writeable
    assert repr(g) == f"<hostless.channel.Frame {g.seq} released>"
    for s in subs[1:]:
        with s.receive(1):
            pass
    assert pub.subscribers["s0"]["acknowledged"] == f.seq and subs[0]._next == f.seq + 1
    for o in (*subs, pub):
        o.close()


def test_a_new_subscriber_makes_one_loan_take_the_general_path(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 8, depth=2)
    s0 = hl.Subscriber(b, "cam", "s0", start="next")
    general = spy(pub, "_loan")
    step(pub, [s0])  # the first loan adopts s0: general
    assert len(general) == 1 and s0.seen
    for _ in range(3):
        step(pub, [s0])
    assert len(general) == 1  # the name table did not change: fast
    s1 = hl.Subscriber(b, "cam", "s1", start="next")
    assert not s1.seen
    step(pub, [s0, s1])  # a new entry in the name table: the general path adopts s1
    assert len(general) == 2 and s1.seen and set(pub.subscribers) == {"s0", "s1"}
    seq = step(pub, [s0, s1])
    assert len(general) == 2 and pub.published == seq
    # s1, a "block" subscriber, falls behind: the fast path sees it and the general one waits
    step(pub, [s0])
    step(pub, [s0])  # frame 8: s1 holds frame 7 unreleased, frame 9's slot
    with pytest.raises(hl.SlowSubscriber, match=r"s1 \(acknowledged 6\)"):
        pub.loan(0.05)
    assert len(general) == 3
    for _ in range(2):
        with s1.receive(1):
            pass
    step(pub, [s0, s1])
    assert len(general) == 3
    for o in (s0, s1, pub):
        o.close()


# a subscriber process: joins, says "ready" once seen, receives n frames (saying each), then waits
_SUB = """
dom = hl.Domain.open(sys.argv[1], label="sub", watchdog_interval=0.01)
sub = hl.Subscriber(dom, "cam", "doomed", start="next", timeout=20)
t = time.monotonic()
while not sub.seen and time.monotonic() < t + 20:
    time.sleep(0.001)
print("ready", flush=True)
for line in sys.stdin:
    with sub.receive(timeout=20) as f:
        print("f", f.seq, flush=True)
"""


def test_a_subscriber_killed_mid_stream_goes_through_the_general_path(
    two: tuple[hl.Domain, hl.Domain], domain_name: str
) -> None:
    """A "block" subscriber in another process is killed with SIGKILL while holding the ring:
    the fast path sees its failed acknowledgement timeline and leaves it to the general path
    (its grace, then dropping it); once it is dropped, loans are fast again."""
    a, b = two
    pub = hl.Channel(a, "cam", 8, depth=2, timeout=5, grace=0.2)
    live = hl.Subscriber(b, "cam", "live", start="next")
    kid = spawn_child(_SUB, domain_name)
    try:
        assert wait_until(lambda: len(pub.subscribers) == 2, 20)  # (adopted by the look itself)
        assert read_line(kid) == "ready"
        for _ in range(2):
            seq = step(pub, [live])
            kid.stdin.write("\n")  # type: ignore[union-attr]
            kid.stdin.flush()  # type: ignore[union-attr]
            assert read_line(kid) == f"f {seq}"
        general = spy(pub, "_loan")
        step(pub, [live])
        assert general == []  # both alive and caught up: fast
        kill_child(kid)
        assert wait_until(lambda: not pub.subscribers["doomed"]["alive"], 5 + SLACK)
        n0 = len(general)
        t0 = time.monotonic()
        for _ in range(4):  # frames past its slots: the general path waits out its grace
            step(pub, [live])
        assert len(general) > n0 and time.monotonic() - t0 >= 0.2
        assert set(pub.subscribers) == {"live"}
        n1, hits = len(general), pub._fast_hits[0]
        for _ in range(3):
            step(pub, [live])
        assert len(general) == n1 and pub._fast_hits[0] == hits + 3
    finally:
        kill_child(kid)
    live.close()
    pub.close()


def test_frame_overwritten_and_skipping_leave_the_fast_path(two: tuple[hl.Domain, hl.Domain]) -> None:
    """A "skip" subscriber receives on the fast path; the publisher laps it while the block
    reads: the exit goes to _finish, which raises FrameOverwritten; the next receive skips to
    the newest frame on the general path (``lost``); the one after is fast again."""
    a, b = two
    pub = hl.Channel(a, "cam", 8, depth=2)
    skp = hl.Subscriber(b, "cam", "k", policy="skip", start="next")
    step(pub, [skp])
    general, finishes = spy(skp, "_receive"), spy(skp, "_finish")
    hits = skp._fast_hits
    step(pub, [])
    with pytest.raises(hl.FrameOverwritten, match="frame 2 was overwritten while subscriber 'k' read it"):
        with skp.receive(1) as f:
            assert f.intact
            for _ in range(3):
                step(pub, [])
            assert not f.intact
    assert len(finishes) == 1 and skp._fast_hits == (hits[0] + 1, hits[1])
    assert skp.acknowledged == 2 and skp._next == 3
    with skp.receive(1) as g:  # frames 3 and 4 were overwritten: the newest, 5
        assert (g.seq, g.lost) == (5, 2)
    assert len(general) == 1 and skp.lost == 2
    step(pub, [skp])
    assert len(general) == 1 and skp._fast_hits == (hits[0] + 2, hits[1] + 2)
    skp.close()
    pub.close()


def test_timeout_and_ctrl_c_end_the_fast_wait(two: tuple[hl.Domain, hl.Domain]) -> None:
    """The fast path waits in C (the engine's wait: Timeline.wait's): its timeout raises the
    general path's error (from None), Ctrl-C ends it, and the general path is never called."""
    a, b = two
    pub = hl.Channel(a, "cam", 8, depth=2)
    sub = hl.Subscriber(b, "cam", "s", start="next")
    general = spy(sub, "_receive")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as ei:
        sub.receive(0.05)
    assert str(ei.value) == "channel 'cam': no frame 1 within 0.05 s" and ei.value.__suppress_context__
    assert 0.05 <= time.monotonic() - t0 < 0.05 + SLACK
    with pytest.raises(TimeoutError, match="no frame 1 within 0 s"):
        sub.receive(timeout=0)
    threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        sub.receive()
    assert time.monotonic() - t0 < 0.2 + SLACK
    assert general == [] and sub._frame is None and sub._next == 1
    threading.Timer(0.1, lambda: step(pub, [])).start()
    with sub.receive(5) as f:  # woken by the publication
        assert f.seq == 1
    assert general == [] and sub._fast_hits == (1, 1)
    with pytest.raises(ValueError, match="timeout must be >= 0"):  # the general path's errors
        sub.receive(-1)
    assert len(general) == 1
    sub.close()
    pub.close()


def test_the_publisher_closing_during_a_fast_wait_is_channel_closed(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 8, depth=2)
    sub = hl.Subscriber(b, "cam", "s", start="next")
    step(pub, [sub])
    general = spy(sub, "_receive")
    threading.Timer(0.1, pub.close).start()
    with pytest.raises(hl.ChannelClosed, match="the publisher closed it after frame 1"):
        sub.receive(5)
    assert len(general) == 1  # woken by the failure in C, decided in Python
    sub.close()


def test_a_block_that_raises_publishes_nothing_on_the_fast_path(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 8, depth=2)
    sub = hl.Subscriber(b, "cam", "s", start="next")
    step(pub, [sub])
    general, hits = spy(pub, "_loan"), pub._fast_hits
    with pytest.raises(RuntimeError):
        with pub.loan() as f:
            raise RuntimeError
    assert pub._frame is None and pub.published == 1 and pub._claimed == 2
    with pub.loan() as g:  # the same slot and number, the claim not signaled again
        assert g.seq == f.seq == 2
    assert general == [] and pub._fast_hits == (hits[0] + 2, hits[1] + 1)
    with sub.receive(1) as h:
        assert h.seq == 2
    sub.close()
    pub.close()


def test_a_frame_left_loaned_and_closed_sides_take_the_general_path(two: tuple[hl.Domain, hl.Domain]) -> None:
    a, b = two
    pub = hl.Channel(a, "cam", 8, depth=2)
    sub = hl.Subscriber(b, "cam", "s", start="next")
    step(pub, [sub])
    f = pub.loan()
    with pytest.raises(hl.InvalidOperation, match="frame 2 is still loaned"):
        pub.loan()
    f.__exit__(None, None, None)
    f.__exit__(None, None, None)  # a second exit does nothing
    assert pub.published == 2
    g = sub.receive(1)
    with pytest.raises(hl.InvalidOperation, match="frame 2 is still loaned"):
        sub.receive(0)
    g.__exit__(None, None, None)
    pub.close()
    with pytest.raises(hl.InvalidOperation, match="Channel 'cam' is closed"):
        pub.loan()
    with pytest.raises(hl.ChannelClosed):
        sub.receive(0)
    sub.close()
    with pytest.raises(hl.InvalidOperation, match="Subscriber 'cam' is closed"):
        sub.receive(0)


def test_a_closed_domain_is_seen_by_the_general_path(domain_name: str) -> None:
    """The ring holds no pointer into the mapping: with its domain closed, a loan, a receive and
    a frame's exit reach the engine's check through the general path (DomainClosed, as before)."""
    a = hl.Domain.create(domain_name, heap="8M")
    b = hl.Domain.open(domain_name, label="sub")
    pub = hl.Channel(a, "cam", 8, depth=2)
    sub = hl.Subscriber(b, "cam", "s", start="next")
    step(pub, [sub])
    f = pub.loan()
    g = sub.receive  # (bound before the close)
    b.close()
    with pytest.raises(hl.DomainClosed):
        g(0)
    with pytest.raises(hl.DomainClosed):
        g()
    f.__exit__(None, None, None)  # the publisher's domain is open: published
    f = pub.loan()
    a.close()
    with pytest.raises(hl.DomainClosed):
        f.__exit__(None, None, None)
    with pytest.raises(hl.DomainClosed):
        pub.loan()
    pub.close()
    sub.close()


def test_a_loan_left_open_is_collected(two: tuple[hl.Domain, hl.Domain]) -> None:
    """A frame never exited and its channel form a cycle (the ring holds the frame, the frame its
    owner): the collector frees both (the C types take part in garbage collection)."""
    a, _b = two
    pub = hl.Channel(a, "leaked", 8, depth=2)
    f = pub.loan()
    pub.close()
    ref = weakref.ref(pub)
    del pub, f
    gc.collect()
    assert ref() is None
    assert not [o for o in gc.get_objects() if isinstance(o, hl.Frame) and o._owner.name == "leaked"]
