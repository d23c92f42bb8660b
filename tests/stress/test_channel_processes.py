"""Channels across processes: four subscribers, SIGKILL of subscribers at random points with
replacements that resume, dead publishers, concurrent takeovers; and the benchmark's smoke run.
The one-process tests are in test_channel.py."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

import hostless as hl
from conftest import SLACK, kill_child, read_line, spawn_child, wait_until
from test_channel import fill

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
            # the last one subscribed before the channel closes (else it finds no channel: seen
            # failing after 20 s, the publisher done and closed before it started)
            assert read_line(kid, 30) == "joined"
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
    from hostless_tools.bench import harness

    ice = importlib.util.find_spec("iceoryx2") is not None
    cfg = bench.ChannelBenchConfig(
        subscribers=(1,), payloads=("64B",), latency_frames=40, throughput_frames=60, rounds=1, iceoryx2=ice
    )
    r = bench.run(cfg)
    assert r["errors"] == {}, r["errors"]
    want = {"hostless-spin/64B/1", "hostless-wait/64B/1"} | (
        {"iceoryx2-poll/64B/1", "iceoryx2-wait/64B/1"} if ice else set()
    )
    assert set(r["figures"]) == want
    assert r["figures"]["hostless-wait/64B/1"]["throughput"]["frames"] == 60
    assert r["figures"]["hostless-spin/64B/1"]["latency"]["n"] == 40
    # every figure says where it ran and what disturbed it; the run, the CPUs it had
    for v in r["figures"].values():
        assert v["cpus"]["allowed"] == len(harness.affinity())
        assert "publisher_ivcsw" in v["disturbance"]["latency"]
    assert r["cpu"]["usable"]["cpus"] == len(harness.affinity()) and r["cpu"]["usable"]["usable"] >= 0
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


# A subscriber that reports where it starts at once (no wait for the publisher to take it in)
# and logs "f <seq>" for each frame, printed after its with block (after its acknowledgement).
SUB_NOW = """
dom = hl.Domain.open(sys.argv[1], label="sub-" + sys.argv[2], watchdog_interval=0.01)
sub = hl.Subscriber(dom, "cam", sys.argv[2], policy="block", start="oldest", timeout=20)
print("ready", sub._next, int(sub.resumed), flush=True)
while True:
    try:
        frame = sub.receive(timeout=20)
    except hl.ChannelClosed:
        break
    with frame:
        seq = frame.seq
    print("f", seq, flush=True)
"""


def _holder_dies_after_three(pub: hl.Channel, domain_name: str, kids: list[Any]) -> None:
    """Subscriber "k" (a SUB_NOW child, added to ``kids``) receives and acknowledges frames 1-3,
    then is killed."""
    kids.append(spawn_child(SUB_NOW, domain_name, "k"))
    assert read_line(kids[0]) == "ready 1 0"
    assert wait_until(lambda: "k" in pub.subscribers, 10)
    fill(pub, 3, timeout=10)
    assert [read_line(kids[0]) for _ in range(3)] == ["f 1", "f 2", "f 3"]  # acknowledged
    kill_child(kids[0])


def test_a_successor_killed_before_the_publisher_took_it_in_is_resumed_after(domain_name: str) -> None:
    """The name's holder dies; its successor (``<name>+``, not yet promoted: the publisher has
    loaned nothing since) receives and acknowledges frames, then dies too; the next successor
    resumes after the frames that one acknowledged, not after the holder's (seen once in a
    fresh clone's run of the SIGKILL test above: two frames delivered twice after the
    publisher's last frame)."""
    with hl.Domain.create(domain_name, heap="16M", participants=16, watchdog_interval=0.01) as d:
        pub = hl.Channel(d, "cam", 64, depth=4, grace=30)
        kids: list[Any] = []
        try:
            _holder_dies_after_three(pub, domain_name, kids)
            fill(pub, 3, timeout=10)  # within the ring: 3 acknowledged + depth 4, no wait for the dead
            kids.append(spawn_child(SUB_NOW, domain_name, "k"))
            assert read_line(kids[1], 30) == "ready 4 1"  # after the holder's last frame
            assert [read_line(kids[1]) for _ in range(3)] == ["f 4", "f 5", "f 6"]
            kill_child(kids[1])
            kids.append(spawn_child(SUB_NOW, domain_name, "k"))
            assert read_line(kids[2], 30) == "ready 7 1"  # after its successor's, not "ready 4 1"
            fill(pub, 1, timeout=10)  # the publisher takes it in and goes on
            assert read_line(kids[2]) == "f 7"
            pub.close()
        finally:
            for k in kids:
                kill_child(k)


def test_a_successors_progress_word_past_the_published_frames_is_not_believed(domain_name: str) -> None:
    """The progress a successor finds in its dead predecessor's record is shared memory: a value
    written there past the frames published (a hostile or broken participant) does not make the
    next one skip frames; it resumes after the dead one's own acknowledgement."""
    from hostless import names
    from hostless.channel import _REC_AFTER

    with hl.Domain.create(domain_name, heap="16M", participants=16, watchdog_interval=0.01) as d:
        pub = hl.Channel(d, "cam", 64, depth=4, grace=30)
        kids: list[Any] = []
        try:
            _holder_dies_after_three(pub, domain_name, kids)
            rec = d.import_buffer(names.peek(d, "ch:cam/k"))
            rec.numpy()[_REC_AFTER] = 1 << 40  # as a hostile participant could
            rec.release()
            kids.append(spawn_child(SUB_NOW, domain_name, "k"))
            assert read_line(kids[1], 30) == "ready 4 1"  # min(that, published 3) + 1
            pub.close()
        finally:
            for k in kids:
                kill_child(k)
