"""hostless_tools.bench.cluster without Ray: the goals read as they are written (a value and
its bound in the goal's own direction), the report says the hop-count bound, and bad
options are refused before Ray starts."""

from __future__ import annotations

from typing import Any

import pytest

from hostless_tools.bench import cluster as bc


def _lat(p50_us: float) -> dict[str, Any]:
    ns = p50_us * 1e3
    return {"p50": ns, "p90": ns * 1.1, "p10": ns * 0.9, "n": 10}


def _result(edge_us: float, part_us: float) -> dict[str, Any]:
    figs = {
        "hostless compiled 16": {
            "latency_ns": _lat(3000.0),
            "fps": 400.0,
            "part_ns": [_lat(part_us), _lat(part_us / 2)],
            "edge_ns": _lat(edge_us),
        },
        "ray cg 16": {"latency_ns": _lat(6000.0), "fps": 100.0},
        "ray cg hop 16": {"latency_ns": _lat(3000.0)},  # 1000 us a hop
        "one machine 16": {"latency_ns": _lat(50.0)},  # back to back: not the goal's reference
        "one machine paced 16": {"latency_ns": _lat(100.0), "gap_ns": 3e6},
    }
    return {"figures": figs, "config": {"floats": [16], "frames": 10, "stream_frames": 10, "inflight": 4},
            "errors": {}}  # fmt: skip


def test_goals_read_in_their_own_direction() -> None:
    got = {g["goal"].split(": ", 1)[1]: g for g in bc.goals(_result(edge_us=1200.0, part_us=130.0))}
    lat = got["latency >= 3x lower than Ray CG, same placement"]
    assert lat["value"] == pytest.approx(2.0) and lat["met"] is False
    fps = got["throughput >= 2x Ray CG, same placement"]
    assert fps["value"] == pytest.approx(4.0) and fps["met"] is True
    edge = got["a cross-node edge <= 1.3x a bare Ray CG hop"]
    assert edge["value"] == pytest.approx(1.2) and edge["met"] is True  # ours over Ray's, <= 1.3
    part = got["a node's part <= 1.2x one machine's at the same pace"]
    assert part["value"] == pytest.approx(1.3) and part["met"] is False  # the slower part over paced
    worse = {g["goal"]: g for g in bc.goals(_result(edge_us=1400.0, part_us=110.0))}
    assert [g["met"] for g in worse.values()] == [False, True, False, True]


def test_missing_figures_are_said_not_guessed() -> None:
    r = _result(1000.0, 100.0)
    del r["figures"]["ray cg 16"]
    g = {x["goal"].split(": ", 1)[1]: x for x in bc.goals(r)}
    assert g["latency >= 3x lower than Ray CG, same placement"]["met"] is None
    assert "not measured" in g["latency >= 3x lower than Ray CG, same placement"]["why"]


def test_report_states_the_hop_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    r = _result(1000.0, 100.0)
    r.update(goals=bc.goals(r), machine={}, software={}, started="now", elapsed_s=1.0, kind="cluster")
    monkeypatch.setattr(bc, "header", lambda title, result, notes: [title, *notes])
    text = bc.report(r)
    assert "5/3 = 1.67x" in text and "ray cg hop 16" in text


@pytest.mark.parametrize("argv", [["--frames", "0"], ["--floats", "16", "0"], ["--stream-frames", "-1"]])
def test_bad_options_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        bc.main(argv)
    assert ei.value.code == 2
