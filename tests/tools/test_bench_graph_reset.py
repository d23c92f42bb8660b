"""Smoke test of ``python -m hostless_tools.bench.graph_reset`` (the pause after a failed
frame, issue 24): a tiny run writes its JSON and report, with every graph and mode measured
and every frame after a failed one right (the benchmark checks it).  The figures themselves
are never checked here."""

from __future__ import annotations

import json
from pathlib import Path

from hostless_tools.bench import graph_reset


def test_a_tiny_run_writes_its_results(tmp_path: Path) -> None:
    assert graph_reset.main(["--quick", "-o", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("graph-reset-*-quick.json")
    result = json.loads(js.read_text())
    assert result["errors"] == {}
    assert len(result["figures"]) == len(graph_reset.GRAPHS) * len(graph_reset.MODES)
    for fig in result["figures"].values():
        for key in ("good_frame", "failed_frame", "next_frame", "reset", "pause", "recompile"):
            assert fig[f"{key}_ns"]["n"] >= 1
    assert len(result["goals"]) == len(result["figures"])
    md = js.with_suffix(".md").read_text()
    assert "## Pause after a failed frame" in md and "recompile (ref.)" in md
