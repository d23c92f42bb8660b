"""A point reached stays reached; leaving is not dying (ABI 6, docs/abi.md 3 and 8).

Real processes: a child owns a timeline and a fence, signals the timeline to
200 and then either leaves with ``close()`` or is SIGKILLed.  The waiter in
this process then sees:

* ``wait(200)`` (and every point below) -> SUCCESS in both cases: the value
  was reached before the failure (ABI 5 said OWNER_DIED for every point);
* ``wait(201)`` -> OWNER_LEFT after ``close()``, OWNER_DIED after SIGKILL;
* the fence it owned -> OWNER_LEFT / OWNER_DIED.

The protocol (aux only grows, read after the word) is checked by the model
(tests/model/protocol_model.py, timeline-reached-point and timeline-owner-left).
"""

from __future__ import annotations

import asyncio
import signal

import pytest

import hostless as hl
from conftest import kill_child, read_line, send_line, spawn_child, wait_until
from hostless import Status

OWNER = """
d = hl.Domain.open(sys.argv[1], watchdog_interval=0)
t = d.timeline()
f = d.fence()
d.publish("tl", t)
d.publish("f", f)
t.signal(200)
print("ready", flush=True)
line = sys.stdin.readline().strip()
if line == "close":
    d.close()
    print("closed", flush=True)
    sys.stdin.readline()
else:
    time.sleep(60)
"""


def _owner_then(domain_name: str, dom: hl.Domain, how: str) -> tuple[hl.Timeline, hl.Fence]:
    p = spawn_child(OWNER, domain_name)
    try:
        assert read_line(p) == "ready"
        t = dom.lookup("tl")
        f = dom.lookup("f")
        assert isinstance(t, hl.Timeline) and isinstance(f, hl.Fence)
        if how == "close":
            send_line(p, "close")
            assert read_line(p) == "closed"
        else:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
            assert wait_until(lambda: bool(dom.reap()) or t.failure is not None, timeout=10)
        return t, f
    finally:
        kill_child(p)


@pytest.mark.parametrize("how", ["close", "kill"])
def test_reached_point_stays_reached(domain_name: str, dom: hl.Domain, how: str) -> None:
    t, f = _owner_then(domain_name, dom, how)
    left = Status.OWNER_LEFT if how == "close" else Status.OWNER_DIED
    assert t.failure is left
    assert t.value == 200
    # reached before the failure: SUCCESS, by every way of asking
    assert t.wait(200, timeout=5) is Status.SUCCESS
    assert t.wait(1, timeout=5) is Status.SUCCESS
    assert t.point(200).status is Status.SUCCESS
    assert t.point(200).wait(timeout=5) is Status.SUCCESS
    assert hl.wait_any([t.point(200)], timeout=5).status is Status.SUCCESS
    assert asyncio.run(hl.wait_any_async([t.point(200)], timeout=5)).status is Status.SUCCESS
    assert asyncio.run(t.wait_async(200, timeout=5)) is Status.SUCCESS
    # never reached: the failure
    assert t.wait(201, timeout=5) is left
    assert t.point(201).status is left
    assert asyncio.run(t.wait_async(201, timeout=5)) is left
    assert f.wait(timeout=5) is left
    assert f.status is left
    t.release()
    f.release()


def test_merge_over_reached_point(domain_name: str, dom: hl.Domain) -> None:
    """A merge over a point reached before the failure completes SUCCESS (the watch node reads
    aux too, core/merge.c), and one over a point never reached fails."""
    t, f = _owner_then(domain_name, dom, "close")
    ok = dom.merge([t.point(150)])
    bad = dom.merge([t.point(250)])
    assert ok.wait(timeout=5) is Status.SUCCESS
    assert bad.wait(timeout=5) is Status.OWNER_LEFT
    for o in (ok, bad, t, f):
        o.release()


def test_holder_fail_keeps_reached_points(dom: hl.Domain) -> None:
    t = dom.timeline()
    t.signal(7)
    t.fail(Status.ERROR)
    assert t.wait(7) is Status.SUCCESS
    assert t.wait(8) is Status.ERROR
    assert t.value == 7
    t2 = dom.timeline(initial=3)
    t2.fail(Status.CANCEL)
    assert t2.wait(3) is Status.SUCCESS and t2.wait(4) is Status.CANCEL


def test_owner_left_is_a_valid_status() -> None:
    assert Status(7) is Status.OWNER_LEFT and Status.OWNER_LEFT.failed
    for m in ("SUCCESS", "ERROR", "CANCEL", "OWNER_DIED", "OWNER_LEFT"):  # one home: the ABI header
        assert int(getattr(hl._abi.C, "STATUS_" + m)) == Status[m]
