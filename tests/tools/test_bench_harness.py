"""The benchmark harness (``hostless_tools.bench.harness`` / ``report``) and the reports built on it.

Fast checks that need no benchmark run: the statistics and goal helpers, the
child-process handshake, the peer-script lookup, and that the goals and
reports regenerated from the committed result files agree with them.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hostless_tools import bench
from hostless_tools.bench import buffers, fences, harness, pipeline, report

ROOT = Path(__file__).resolve().parents[2]
# "pipeline" results (benchmark name of the first pipeline benchmark, before issue 11's agent sets)
# are kept as records: the report code that wrote them is in git history (9b34e6a and before)
BENCHES: dict[str, Any] = {"fences": fences, "buffers": buffers, "pipeline-native": pipeline}
RESULTS = [
    p
    for p in sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    if json.loads(p.read_text(encoding="utf-8")).get("benchmark") in BENCHES
]


def test_summarize_median_and_spread() -> None:
    a = np.arange(1, 1001, dtype=np.int64)
    st = harness.summarize(a)
    assert st["n"] == 1000 and st["min"] == 1 and st["max"] == 1000
    assert st["p50"] == pytest.approx(500.5)
    assert st["p50_lo"] < st["p50"] < st["p50_hi"]  # 5 consecutive blocks of a rising series
    g = harness.summarize(a, groups=[a[:500], a[500:]])
    assert (g["p50_lo"], g["p50_hi"]) == (250.5, 750.5)
    with pytest.raises(ValueError):
        harness.summarize([])


def test_rate_figures_and_goal() -> None:
    def broken() -> float:
        raise AttributeError("internal call changed")

    out = harness.rate_figures({"api": lambda: 2e6, "core": broken}, runs=3, ops=10)
    assert set(out) == {"api"}
    assert out["api"]["ops_per_s_median"] == 2e6 and out["api"]["runs"] == [2e6] * 3
    with pytest.raises(AttributeError):
        harness.rate_figures({"api": broken}, runs=1, ops=1)
    row = harness.rate_goal("throughput", "x", out["api"], ">= 1M", {"reference": "goal", "ratio_p99": None})
    assert list(row) == [
        "figure",
        "label",
        "ops_per_s",
        "ops_per_s_min",
        "ops_per_s_max",
        "reference",
        "ratio_of",
        "ratio",
        "ratio_p99",
        "goal",
        "met",
    ]
    assert row["met"] is True and row["ratio"] == 2.0
    assert harness.met(None, 1.0, True) is None and harness.met(3.0, 2.0, at_most=False) is True
    assert harness.ratio(1.0, 0.0) is None and harness.ratio(3.0, 2.0) == 1.5


def _echo_child(conn: Connection, fail: bool) -> None:
    conn.send(("hello", 42))
    if fail:
        raise ValueError("child failed on purpose")


@pytest.mark.parametrize("fail", [False, True])
def test_child_handshake(fail: bool) -> None:
    child = harness.Child(_echo_child, (fail,), None, role="test child")
    try:
        assert child.expect("hello") == 42
        if fail:
            with pytest.raises(RuntimeError, match="child failed on purpose"):
                child.finish()
        else:
            child.finish()
            assert child.proc.exitcode == 0
    finally:
        child.close()


def test_peer_scripts_found(tmp_path: Path) -> None:
    peers = ROOT / "benchmarks" / "peers"
    assert pipeline.find_peers(peers) == peers
    assert pipeline.find_peers(tmp_path) is None


def test_package_shared_names() -> None:
    # the names hostless_tools.chaos, hostless_tools.fuzz, the CLI and the examples import
    for name in ("machine_info", "markdown_table", "write_results", "print_table", "fmt_ns", "fmt_ratio"):
        assert callable(getattr(bench, name)), name
    assert report.fmt_size(4096) == "4 KiB" and report.fmt_size(1 << 30) == "1 GiB"


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_committed_results_regenerate(path: Path, tmp_path: Path) -> None:
    result = json.loads(path.read_text(encoding="utf-8"))
    mod = BENCHES[result["benchmark"]]
    assert mod.evaluate_goals(result) == result["goals"]
    md = mod.report_markdown(result)
    assert md.startswith("# hostless ") and "## Goals" in md
    with redirect_stdout(io.StringIO()) as out:
        mod.print_report(result, plain=True)
    assert "goals" in out.getvalue()
    written = mod.write_results(result, tmp_path)
    assert json.loads(Path(written[0]).read_text(encoding="utf-8")) == result


GPUCP_RESULTS = sorted((ROOT / "benchmarks" / "results").glob("gpucp-matrix-*.json"))


@pytest.mark.parametrize("path", GPUCP_RESULTS, ids=[p.name for p in GPUCP_RESULTS])
def test_committed_gpucp_results_regenerate(path: Path) -> None:
    """The GPU command processor's committed reports are what their JSON says (goals included)."""
    from hostless_tools.bench import gpucp

    result = json.loads(path.read_text(encoding="utf-8"))
    assert gpucp.goals(result) == result["goals"]
    assert gpucp.report(result) == path.with_suffix(".md").read_text(encoding="utf-8")
