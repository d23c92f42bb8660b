"""Traces a user can read: tracks named by label (also after the participant
left), user spans and instants, named objects and kernels."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import hostless as hl
from conftest import run_child
from hostless import trace


def _export(d: hl.Domain) -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = trace.to_chrome(d)["traceEvents"]
    return ev


def test_spans_and_instants_on_this_participants_track(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=64, trace="1M", label="camera") as d:
        with hl.trace.span("detect"):
            with hl.trace.span("nms"):
                hl.trace.instant("dropped frame", value=7)
        with pytest.raises(RuntimeError), hl.trace.span("failing"):
            raise RuntimeError("x")
        ev = _export(d)
    me = hl.trace.track_of(d.participant_id)  # one track per participant (slot and incarnation)
    names = [(e["ph"], e["name"]) for e in ev if e.get("cat") == "user"]
    assert names == [
        ("b", "detect"),
        ("b", "nms"),
        ("i", "dropped frame"),
        ("e", "nms"),
        ("e", "detect"),
        ("b", "failing"),
        ("e", "failing"),
    ]
    assert all(e["tid"] == me for e in ev if e.get("cat") == "user")
    ids = {e["name"]: e["id"] for e in ev if e.get("cat") == "user" and e["ph"] == "b"}
    assert len(set(ids.values())) == 3  # each span its own id: begin and end match by it
    inst = next(e for e in ev if e.get("name") == "dropped frame")
    assert inst["args"] == {"value": 7}
    track = next(e for e in ev if e["ph"] == "M" and e["name"] == "thread_name" and e["tid"] == me)
    assert track["args"]["name"].startswith("camera")


def test_a_span_as_a_decorator_is_a_span_per_call_also_when_recursive(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=16, trace="1M") as d:

        @hl.trace.span("walk", dom=d)
        def walk(n: int) -> int:
            return 0 if n == 0 else 1 + walk(n - 1)

        assert walk(2) == 2 and walk(0) == 0
        ev = [e for e in _export(d) if e.get("cat") == "user"]
    assert [e["ph"] for e in ev] == ["b", "b", "b", "e", "e", "e", "b", "e"]
    opened = [e["id"] for e in ev if e["ph"] == "b"]
    assert len(set(opened)) == 4  # each call its own id, the nested ones too
    assert [e["id"] for e in ev if e["ph"] == "e"] == [opened[2], opened[1], opened[0], opened[3]]


def test_a_span_whose_domain_closes_inside_it_records_no_end_and_raises_nothing(domain_name: str) -> None:
    d = hl.Domain.create(domain_name, fences=16, trace="1M")
    with hl.trace.span("closing", dom=d):
        d.close()  # the end is not recorded (the ring is gone) and leaving raises nothing
    hl.Domain.unlink(domain_name)


def test_spans_without_a_traced_domain_record_nothing(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=16) as d:  # no trace ring
        with hl.trace.span("x"):
            hl.trace.instant("y")
        assert not d.trace_enabled()


def test_two_traced_domains_need_dom(make_name: Any) -> None:
    with hl.Domain.create(make_name(), trace="64K") as a, hl.Domain.create(make_name(), trace="64K") as b:
        with pytest.raises(ValueError, match="pass dom="):
            hl.trace.instant("which")
        hl.trace.instant("this one", dom=b)
        assert any(e.get("name") == "this one" for e in _export(b))
        assert not any(e.get("name") == "this one" for e in _export(a))


def test_spans_overlap_across_threads(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=16, trace="1M") as d:
        go = threading.Barrier(4)

        def work(i: int) -> None:
            go.wait()
            for _ in range(50):
                with hl.trace.span(f"t{i}"):
                    pass

        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        ev = [e for e in _export(d) if e.get("cat") == "user"]
    begins = {e["id"] for e in ev if e["ph"] == "b"}
    ends = {e["id"] for e in ev if e["ph"] == "e"}
    assert len(begins) == 200 and begins == ends


def test_a_participant_that_left_keeps_its_label(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=64, trace="1M", label="host") as d:
        body = f"""
d = hl.Domain.open({domain_name!r}, label="detector")
with hl.trace.span("detect", dom=d):
    pass
d.close()
"""
        run_child(body)
        ev = _export(d)
    span = next(e for e in ev if e.get("name") == "detect")
    tracks = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "detector" in tracks[span["tid"]]


def test_named_objects(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=64, trace="1M") as d:
        f = d.fence()
        trace.name(d, f.handle, "frames")
        f.signal()
        ev = _export(d)
    assert any(e.get("name") == "signal frames" for e in ev)


def test_long_and_unicode_names_are_cut_on_a_character(domain_name: str) -> None:
    with hl.Domain.create(domain_name, fences=16, trace="64K") as d:
        hl.trace.instant("é" * 30)  # 60 bytes of UTF-8: cut to 24 bytes, 12 characters
        ev = _export(d)
    assert any(e.get("name") == "é" * 12 for e in ev)


def test_graph_slices_are_named_after_stages(domain_name: str) -> None:
    import numpy as np

    from hostless import agents
    from hostless.graph import Graph

    with hl.Domain.create(domain_name, heap="16M", trace="1M", unlink_on_close=True) as d:
        cpu = agents.spawn(d, "cpu", label="cpu-traced")
        try:
            g = Graph(d).input("x", (4, 4), "f4").stage("preprocess", cpu, "relu", ["x"], ("y", (4, 4), "f4"))
            g.stage("double", cpu, "scale", ["y"], ("z", (4, 4), "f4"), scalars=[2.0])
            for dispatch in ("host", "direct"):
                with g.compile(dispatch=dispatch) as cg:
                    cg.run({"x": np.ones((4, 4), np.float32)})
            ev = _export(d)
        finally:
            cpu.stop()
    slices = {e["name"] for e in ev if e.get("cat") == "packet"}
    assert {"preprocess", "double"} <= slices, slices
    assert "packet" not in slices and not any(n.startswith("k") and n[1:].isdigit() for n in slices)
    tracks = [e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"]
    assert any("cpu-traced" in t for t in tracks), tracks
