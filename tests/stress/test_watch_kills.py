"""Watch nodes (docs/abi.md 5a) against a real SIGKILL in the window the protocol model's
watch-creator-dies scenario found: a merge's creator killed after publishing its watch node
and before counting it on the watched fence.  Its recovery must not take back a count it
never gave: that would steal another composite's count, and the fence's signaller (which
scans for watch nodes only when the count is nonzero) would then skip that composite.

The window is reached with the engine's test-only switch HOSTLESS_TEST_KILL_AT=watch-published
(core/merge.c), set only in the child's environment.  The domain runs no watchdog, nothing
waits on a merged fence, and the composite's word is read from the mapping (reading a merged
fence's status through the API sweeps, which would complete the node behind the signaller's
back): what the signal itself completed is what is read.  With the first version's cleanup
(the dead creator's node decrementing the count unconditionally, commit 26975ee) the
composite reads ACTIVE after the signal.

The second test stops (SIGSTOP, HOSTLESS_TEST_STOP_AT=watchers-checked) a watch node's
finalize in the protocol model's watch-target-reuse window, reuses the target's slot, and
resumes it: with the first version's untagged count the finalize's CAS wrote into a link."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
import uuid

import hostless as hl
from conftest import needs_test_hooks
from hostless import Status
from hostless._abi import FENCE_DTYPE, C
from hostless_tools.chaos import leaked_slots


def _raw_word(d: hl.Domain, handle: int) -> int:
    """A slot's completion word read from the mapping (no sweep, unlike Fence.status)."""
    off = int(d.header()["fences_offset"]) + ((handle & 0xFFFFFF) - 1) * int(C.FENCE_SIZE)
    return int(struct.unpack_from("<Q", d.raw(), off + FENCE_DTYPE.fields["word"][1])[0])


def _child_merge_killed(name: str, fence: int) -> subprocess.CompletedProcess[bytes]:
    code = (
        "import hostless as hl\n"
        f"d = hl.Domain.open({name!r}, watchdog_interval=0)\n"
        f"f = d.import_fence({fence})\n"
        "d.merge([f])\n"
        "raise SystemExit('not killed after publishing the watch node')\n"
    )
    env = {**os.environ, "HOSTLESS_TEST_KILL_AT": "watch-published"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)


@needs_test_hooks
def test_creator_killed_between_publish_and_count_steals_no_count() -> None:
    d = hl.Domain.create(
        f"hl_wk_{uuid.uuid4().hex[:8]}", fences=256, watchdog_interval=0, unlink_on_close=True
    )
    try:
        f = d.fence()
        links = [d.merge([f]), d.merge([f])]  # the fence's two parent links
        x = d.merge([f])  # a third composite: through a counted watch node
        p = _child_merge_killed(d.name, f.handle)
        assert p.returncode == -signal.SIGKILL, p.stderr.decode()
        t_end = time.monotonic() + 10
        while [q.id for q in d.participants] != [d.participant_id] and time.monotonic() < t_end:
            d.reap()
            time.sleep(0.01)
        assert [q.id for q in d.participants] == [d.participant_id]
        assert _raw_word(d, x.handle) == 0
        f.signal(Status.ERROR)
        # completed by the signal itself (its scan of the fence's watch nodes), not by a sweep
        assert _raw_word(d, x.handle) == Status.ERROR
        assert all(m.status is Status.ERROR for m in links)
        for m in [x, *links]:
            m.release()
        f.release()
        assert d.check() == []
        assert leaked_slots(d) == []  # the dead creator's node and every other slot freed
    finally:
        d.close()


def _raw_field(d: hl.Domain, index: int, field: str) -> int:
    """Field `field` of fence-table slot `index`, read from the mapping."""
    off = int(d.header()["fences_offset"]) + index * int(C.FENCE_SIZE) + FENCE_DTYPE.fields[field][1]
    return int(struct.unpack_from("<Q", d.raw(), off)[0])


def _slot(h: int) -> tuple[int, int]:
    """(index, generation) of a handle."""
    return (h & 0xFFFFFF) - 1, (h >> 24) & 0xFFFFFF


_CHILD_REUSE = """
import sys
import hostless as hl
d = hl.Domain.open(sys.argv[1], watchdog_interval=0)
t = d.timeline()
m, (w,) = d._core.merge_points([(t.handle, 1)])
print(t.handle, m, w, flush=True)
assert sys.stdin.readline() == "go\\n"  # the parent holds t now
t.release()
d._core.release(w)  # the node's finalize leaves t's watch list (takes its count back): stopped there
print("done", flush=True)
d.close()
"""


@needs_test_hooks
def test_watch_target_reused_while_its_node_leaves() -> None:
    """The protocol model's watch-target-reuse window with real processes: a watch node's
    finalize checks its target timeline t (still t), then stops (HOSTLESS_TEST_STOP_AT=
    watchers-checked, SIGSTOP); meanwhile t's slot is freed and reused by a fence f merged
    into M, whose slot has t's generation, so that f's link to M has the 64 bits of the
    untagged count "t's generation: 1" (and of no watch-list head: no tag bit).  Resumed,
    the finalize must not write t's old field (a count's decrement, a list's unlink): f's
    signal completes M.  With the first version's untagged count (HL_WATCHERS_IS without the
    tag bit) the decrement lands in f's link, and M stays ACTIVE."""
    cap = 16
    d = hl.Domain.create(
        f"hl_wr_{uuid.uuid4().hex[:8]}", fences=cap, watchdog_interval=0, unlink_on_close=True
    )
    child = None
    try:
        # y keeps slot 0 at generation 1 while every other slot goes to generation 1 and
        # free: the child's objects then get generation 2, and slot 0 will too, later
        y = d.fence()
        assert _slot(y.handle) == (0, 1)
        for f in [d.fence() for _ in range(cap - 1)]:
            f.release()
        env = {**os.environ, "HOSTLESS_TEST_STOP_AT": "watchers-checked"}
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD_REUSE, d.name],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdin is not None
        th, mh, wh = (int(v) for v in child.stdout.readline().split())
        assert [_slot(h) for h in (th, mh, wh)] == [(1, 2), (2, 2), (3, 2)]
        t = d.import_timeline(th)  # t stays until the node's finalize has checked it
        child.stdin.write("go\n")
        child.stdin.flush()
        _pid, st = os.waitpid(child.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(st) and os.WSTOPSIG(st) == signal.SIGSTOP, st
        # t's slot (freed) reused by f at generation 3; M in slot 0 at generation 2 = t's
        t.release()
        held = [d.fence() for _ in range(4, cap)]
        f = d.fence()
        assert _slot(f.handle) == (1, 3)
        y.release()
        m = d.merge([f])
        assert _slot(m.handle) == (0, 2)
        link = _raw_field(d, 1, "parents")  # parents[0]: HL_LINK(pos 0, gen 2, slot 0)
        assert link == (2 << 32) | 1
        os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0 and out.split() == ["done"], err
        assert _raw_field(d, 1, "parents") == link, "the node's finalize wrote into f's link"
        f.signal()
        assert _raw_word(d, m.handle) == Status.SUCCESS  # by the signal's propagation, no sweep
        for x in [m, f, *held]:
            x.release()
        assert d.check() == []
        assert leaked_slots(d) == []
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        d.close()
