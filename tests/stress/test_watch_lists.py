"""Watch lists (docs/abi.md 5a, ABI 6) with real processes: a timeline's watch nodes are
linked from it, so that its signal visits its nodes instead of scanning the table.

Workers merge points of one timeline many times and release about half of their composites
at once (neighbouring nodes leave the list concurrently); some are SIGKILLed inside a node's
finalize, between marking its next and unlinking it (HOSTLESS_TEST_KILL_AT=watch-marked), and
their recovery finishes the unlink.  At every quiet point the list, read from the mapping,
holds exactly the timeline's unmarked LIVE nodes (no cycle, no stranger); each signal of the
timeline completes, by itself (no watchdog, no waiter: nothing sweeps), every composite whose
point it reached and no other; when everything is released the list is empty and nothing
leaks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import numpy as np

import hostless as hl
from conftest import needs_test_hooks
from hostless import Status
from hostless._abi import FENCE_DTYPE, C
from hostless_tools.chaos import leaked_slots

TAG, MARK = 1 << 63, 1 << 62


def _table(d: hl.Domain) -> np.ndarray:
    h = d.header()
    return np.frombuffer(d.raw(), FENCE_DTYPE, count=int(h["fence_capacity"]), offset=int(h["fences_offset"]))


def _list(d: hl.Domain, t: int) -> list[tuple[int, bool]]:
    """The watch list of timeline t from the mapping: (slot, marked) per node, head first."""
    tab = _table(d)
    head = int(tab[(t & 0xFFFFFF) - 1]["parents"][0])
    if head == 0:
        return []
    assert head & TAG and (head >> 32) & 0xFFFFFF == (t >> 24) & 0xFFFFFF, hex(head)
    out, cur = [], head & 0xFFFFFF
    while cur:
        i = cur - 1
        assert len(out) <= len(tab) and all(j != i for j, _ in out), f"a cycle at slot {i}"
        s = tab[i]
        ctl, nxt = int(s["ctl"]), int(s["parents"][1])
        assert int(s["aux"]) == t, f"slot {i} in t's list is not one of its nodes"
        assert nxt & TAG and (nxt >> 32) & 0xFFFFFF == (ctl >> 32) & 0xFFFFFF, hex(nxt)
        out.append((i, bool(nxt & MARK)))
        cur = nxt & 0xFFFFFF
    return out


def _live_nodes(d: hl.Domain, t: int) -> set[int]:
    tab = _table(d)
    live = (tab["ctl"] & 0xFF) == int(C.SLOT_LIVE)
    return {int(i) for i in np.nonzero(live & (tab["aux"] == np.uint64(t)))[0]}


def _word(d: hl.Domain, h: int) -> int:
    return int(_table(d)[(h & 0xFFFFFF) - 1]["word"])


_WORKER = """
import random, sys
import hostless as hl
d = hl.Domain.open(sys.argv[1], watchdog_interval=0)
t = d.import_timeline(int(sys.argv[2]))
rnd = random.Random(int(sys.argv[3]))
kept = []
for _ in range(int(sys.argv[4])):
    ms = [(d.merge([t.point(v)]), v) for v in (rnd.randint(1, 40) for _ in range(3))]
    for m, v in ms:
        if rnd.random() < 0.5:
            m.release()  # (a killed worker dies in its first node's finalize, after the mark)
        else:
            kept.append((m, v))
print(" ".join(f"{m.handle}:{v}" for m, v in kept), flush=True)
sys.stdin.readline()
"""


def _spawn(name: str, t: int, seed: int, rounds: int, kill: bool) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("HOSTLESS_TEST_KILL_AT", None)
    if kill:
        env["HOSTLESS_TEST_KILL_AT"] = "watch-marked"
    return subprocess.Popen(
        [sys.executable, "-c", _WORKER, name, str(t), str(seed), str(rounds)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run(workers: int, killed: int, rounds: int) -> None:
    d = hl.Domain.create(
        f"hl_wl_{uuid.uuid4().hex[:8]}", fences=4096, watchdog_interval=0, unlink_on_close=True
    )
    procs: list[subprocess.Popen[str]] = []
    try:
        t = d.timeline()
        procs = [_spawn(d.name, t.handle, k, rounds, k < killed) for k in range(workers)]
        kept: list[tuple[int, int]] = []
        for k, p in enumerate(procs):
            assert p.stdout is not None
            line = p.stdout.readline()
            if k < killed:
                assert p.wait(60) == -9, p.stderr.read() if p.stderr else ""
                continue
            kept += [(int(a), int(b)) for a, b in (x.split(":") for x in line.split())]
        t_end = time.monotonic() + 20
        while len(d.participants) > 1 + workers - killed and time.monotonic() < t_end:
            d.reap()  # the killed workers' recovery: their nodes' finalize, the unlink finished
            time.sleep(0.01)
        assert len(d.participants) == 1 + workers - killed
        nodes = _list(d, t.handle)
        assert [i for i, marked in nodes if marked] == []
        assert {i for i, _ in nodes} == _live_nodes(d, t.handle)
        assert len(nodes) == len(kept) > 0
        for v in range(1, 41):
            t.signal(v)
            for m, pv in kept:
                assert _word(d, m) == (Status.SUCCESS if pv <= v else 0), (m, pv, v)
        for p in procs[killed:]:
            assert p.stdin is not None
            p.stdin.write("\n")
            p.stdin.flush()
            assert p.wait(60) == 0, p.stderr.read() if p.stderr else ""
        assert _list(d, t.handle) == [] and _live_nodes(d, t.handle) == set()
        t.release()
        assert d.check() == []
        assert leaked_slots(d) == []
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        d.close()


def test_watch_list_many_merges_and_releases() -> None:
    _run(workers=4, killed=0, rounds=40)


@needs_test_hooks
def test_watch_list_finalizers_killed_after_marking() -> None:
    _run(workers=6, killed=3, rounds=40)
