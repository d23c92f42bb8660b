"""The cuda agent's loop thread sleeps with a timer slack of 1 us (``_precise_sleeps``), so its
looks at the armed segments come near their period (``benchmarks/pop_cycle.py`` measures the
difference).  Checked on a thread of its own here: no GPU needed."""

from __future__ import annotations

import ctypes
import sys
import threading

import pytest

from hostless.agents.cuda_agent import _precise_sleeps

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
