"""Smoke test of ``python -m hostless_tools.bench.wakeup`` (issue 26, item 5): a tiny run
measures every path (asyncio wait_async, the Poller's eventfd under asyncio and under
selectors, the blocking reference) in one run and writes its JSON and report.  The
figures themselves are never checked here."""

from __future__ import annotations

import json
from pathlib import Path

from hostless_tools.bench import wakeup


def test_a_tiny_run_writes_its_results(tmp_path: Path) -> None:
    assert wakeup.main(["--quick", "-o", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("wakeup-*-quick.json")
    result = json.loads(js.read_text())
    assert result["errors"] == {}
    assert list(result["figures"]) == list(wakeup.PATHS)
    for fig in result["figures"].values():
        assert fig["n"] == 20 and 0 < fig["p50"] < 10e9
    md = js.with_suffix(".md").read_text()
    assert "## Wake-up latency" in md and "Poller + selectors" in md
