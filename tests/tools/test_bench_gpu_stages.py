"""The GPU-stages matrix's bookkeeping without a GPU: ``--only`` checks its sections before
anything runs, and the goals and the report of a partial run name only the sections it ran."""

from __future__ import annotations

from typing import Any

import pytest

from hostless_tools.bench import gpu_stages as gs


def _row(p50: float) -> dict[str, float]:
    return {"p50_us": p50, "p10_us": p50 * 0.9, "p90_us": p50 * 1.1}


def _partial() -> dict[str, Any]:
    return {
        "gpu": "a GPU",
        "torch": "2.x",
        "when": "now",
        "agent_spin_s": 50e-6,
        "host_spin_s": 500e-6,
        "data": {"n": 2048, "cupy_pinned": _row(100.0), "hostless": {"direct+shared": _row(90.0)}},
        "cross_engine": {
            "hostless": {**_row(50.0), "cpu_us_per_frame": 10.0, "cpu_us_per_frame_by": {"host": 10.0}},
            "host_orchestrated": {**_row(150.0), "cpu_us_per_frame": 200.0},
        },
    }


def test_a_partial_run_has_the_goals_and_report_of_its_sections_only() -> None:
    res = _partial()
    goals = gs.goals(res)
    assert [g["goal"].split(":")[0] for g in goals] == [
        "data-bound chain at least as fast as plain CuPy with pinned I/O (ratio <= 1)",
        "cross-engine chain",
        "cross-engine chain",
    ]
    assert goals[0]["met"] is True and goals[0]["value"] == pytest.approx(0.9)
    assert goals[1]["met"] is True and goals[1]["value"] == pytest.approx(3.0)  # 150 / 50 >= 2
    assert goals[2]["met"] is True and goals[2]["value"] == pytest.approx(20.0)  # 200 / 10 >= 10
    res["goals"] = goals
    text = gs.report(res)
    assert "## data (n=2048)" in text and "## cross-engine" in text
    assert "## gemm" not in text and "hand-offs" not in text and "GPU leg" not in text


@pytest.mark.parametrize("only", ["bogus", "data,bogus", ","])
def test_only_refuses_unknown_sections_before_running_anything(only: str) -> None:
    with pytest.raises(SystemExit) as ei:
        gs.main(["--only", only])
    assert ei.value.code == 2


def test_run_refuses_unknown_sections() -> None:
    with pytest.raises(ValueError, match="sections are some of"):
        gs.run(1, 64, 64, 64, only=frozenset({"bogus"}))
