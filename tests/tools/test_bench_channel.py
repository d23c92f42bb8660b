"""The channel benchmark's placement and its readings of the CPUs (``hostless_tools.bench.channel``,
``hostless_tools.bench.cpus``): fast checks, one tiny figure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hostless_tools.bench import channel, cpus, harness


def test_cgroup_quota_v2_and_v1(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("250000 100000\n")
    assert cpus.cgroup_quota([str(v2)])["cpus"] == 2.5
    (v2 / "cpu.max").write_text("max 100000\n")
    q = cpus.cgroup_quota([str(v2)])
    assert q["cpus"] is None and q["source"] == str(v2 / "cpu.max")
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cpus.cgroup_quota([str(tmp_path / "none"), str(v1)])["cpus"] == 1.5
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpus.cgroup_quota([str(v1)])["cpus"] is None
    assert cpus.cgroup_quota([str(tmp_path / "none")]) == {"cpus": None, "source": None, "raw": None}


def test_cgroup_stat_v2_and_v1(tmp_path: Path) -> None:
    (tmp_path / "cpu.stat").write_text("usage_usec 5\nnr_periods 10\nnr_throttled 3\nthrottled_usec 4500\n")
    assert cpus.cgroup_stat([str(tmp_path)]) == {"nr_periods": 10, "nr_throttled": 3, "throttled_usec": 4500}
    (tmp_path / "cpu.stat").write_text("nr_periods 10\nnr_throttled 2\nthrottled_time 7000000\n")
    assert cpus.cgroup_stat([str(tmp_path)]) == {"nr_periods": 10, "nr_throttled": 2, "throttled_usec": 7000}
    (tmp_path / "cpu.stat").write_text("garbage\n")
    assert cpus.cgroup_stat([str(tmp_path)]) is None


def test_usable_cpus_and_disturbance() -> None:
    mine = harness.affinity()[:2]
    u = cpus.usable_cpus(mine, seconds=0.1)
    assert u["cpus"] == len(mine) and len(u["per_cpu"]) == len(mine)
    assert 0 <= u["usable"] <= len(mine) + 0.5  # (0: a machine so busy the spinners never ran)
    d = cpus.Disturbance(mine).delta()
    assert {"throttled", "throttled_ms", "steal_ms", "publisher_ivcsw", "seconds"} <= set(d)


@pytest.mark.skipif(len(harness.affinity()) < 2, reason="needs 2 CPUs to pin a publisher and a subscriber")
def test_a_figure_leaves_the_affinity_as_it_found_it() -> None:
    """The publisher is pinned for its figure only: left pinned (the old code), the next
    figure's subscribers, spawned from it, all ran on its one CPU (ms-scale spin latencies)."""
    before = os.sched_getaffinity(0)
    cfg = channel.ChannelBenchConfig(latency_frames=20, throughput_frames=20, rounds=1, probe_cpus=False)
    for _ in range(2):
        out = channel._measure("hostless", "64B", 1, cfg, True)
        assert os.sched_getaffinity(0) == before
        assert out["pinned"] and out["cpus"]["allowed"] == len(before)
        assert out["cpus"]["publisher"] != out["cpus"]["subscribers"][0]
        assert out["disturbance"]["latency"]["subscriber_ivcsw"][0] >= 0
