"""The cuda agent's loop thread sleeps with a timer slack of 1 us (``_precise_sleeps``), so its
looks at the armed segments come near their period (``benchmarks/pop_cycle.py`` measures the
difference), and does not spin on its doorbell while armed frames are all it serves
(``CudaLoop.pop_spin_ns``).  Checked without a GPU."""

from __future__ import annotations

import ctypes
import sys
import threading
import time

import pytest

from hostless._abi import C
from hostless.agents.cuda_agent import CudaLoop, _precise_sleeps

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")

_PR_GET_TIMERSLACK = 30


def test_precise_sleeps_sets_this_threads_timer_slack_to_1_us() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    got: list[int] = []

    def run() -> None:
        before = libc.prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
        _precise_sleeps()
        got.extend([before, libc.prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)])

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert got[1] == 1000, got
    assert libc.prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0) == got[0]  # this thread's is its own


def _loop(armed: bool, last_packet_ns: int) -> CudaLoop:
    """A CudaLoop with only what pop_spin_ns reads (its __init__ needs a GPU)."""
    loop = CudaLoop.__new__(CudaLoop)
    loop.armed = {(1, 0): object()} if armed else {}  # type: ignore[dict-item]
    loop.spin_ns, loop.pop_timeout_ns = 50_000, CudaLoop.ARMED_POLL_NS
    loop.last_packet_ns = last_packet_ns
    return loop


def test_an_armed_loop_without_recent_packets_does_not_spin_on_its_doorbell() -> None:
    now = time.monotonic_ns()
    assert _loop(True, now - C.AGENT_BUSY_NS - 1).pop_spin_ns() == 0  # armed frames only: sleep
    assert _loop(True, 0).pop_spin_ns() == 0  # armed, never a packet
    assert _loop(True, now).pop_spin_ns() == 50_000  # a packet just came: packets come often
    assert _loop(False, 0).pop_spin_ns() == 50_000  # nothing armed: the spin as before
    slow = _loop(False, 0)
    slow.pop_timeout_ns = 20_000
    assert slow.pop_spin_ns() == 20_000  # never past the pop's timeout
