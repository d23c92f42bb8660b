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
composite reads ACTIVE after the signal."""

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
