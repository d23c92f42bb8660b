"""The per-hop A/B tool (hostless_tools.bench.hops): a tiny run gives every chain's figures
for each setting, restores the environment and the CPU affinity it changed, and refuses a
malformed setting."""

from __future__ import annotations

import os

import pytest

from hostless_tools.bench import hops


def test_a_tiny_run_measures_every_chain_and_setting() -> None:
    before = os.environ.get("HOSTLESS_AGENT_KEEP_NS")
    cpus = os.sched_getaffinity(0)
    cfg = hops.Config(frames=30, warmup=5, rounds=1)
    result = hops.run(cfg)
    assert os.environ.get("HOSTLESS_AGENT_KEEP_NS") == before
    assert os.sched_getaffinity(0) == cpus  # the run pinned this process for its figures only
    for s in cfg.ab:
        for label, _ in hops.CHAINS:
            st = result["figures"][f"{s} / {label}"]
            assert st["n"] == 30 and 0 < st["p10"] <= st["p50"] <= st["p90"]
    assert [g["label"].split(":")[0] for g in result["goals"]] == [label for label, _ in hops.CHAINS]
    assert "per hop p50" in hops.report(result)


def test_a_malformed_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="VAR=value"):
        hops.main(["--ab", "nonsense", "-o", "/nonexistent"])
