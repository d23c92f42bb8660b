"""The small items of a user's second day (issue 24, item 7): each fails on the code before.

* ``cg.stream(list_of_arrays)`` on a one-input graph (was ``unhashable type: 'numpy.ndarray'``);
* ``await timeline`` says what to await instead; ``await timeline.point(v)`` and
  ``await fence`` work;
* the ``wait_async`` docstring says what it waits for;
* the name table holds 239 names (ABI 6; was 47);
* the demo says "x higher latency" when latency was higher (was "0.82x lower latency").
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import hostless as hl
from hostless import agents, names
from hostless.graph import Graph

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def graph_dom() -> Iterator[tuple[hl.Domain, agents.Agent]]:
    import os
    import uuid

    name = f"hltest-small-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with hl.Domain.create(name, heap="16M", unlink_on_close=True) as dom:
        cpu = agents.spawn(dom, "cpu")
        try:
            yield dom, cpu
        finally:
            cpu.stop()


def test_stream_takes_bare_arrays_for_a_one_input_graph(graph_dom: tuple[hl.Domain, agents.Agent]) -> None:
    dom, cpu = graph_dom
    g = Graph(dom).input("x", (4, 4), "f4")
    g.stage("a", cpu, "scale", ["x"], ("y", (4, 4), "f4"), scalars=[2.0])
    frames = [np.full((4, 4), k, np.float32) for k in range(5)]
    with g.compile(dispatch="direct", data="shared", inflight=2) as cg:
        outs = list(cg.stream(frames, timeout=20))
        assert [float(o["y"][0, 0]) for o in outs] == [2.0 * k for k in range(5)]
        outs2 = list(cg.stream([{"x": f} for f in frames], timeout=20))  # mappings still work
        assert len(outs2) == 5


def test_stream_bare_array_needs_one_input(graph_dom: tuple[hl.Domain, agents.Agent]) -> None:
    dom, cpu = graph_dom
    g = (
        Graph(dom)
        .input("x", (4, 4), "f4")
        .input("z", (4, 4), "f4")
        .stage("a", cpu, "add", ["x", "z"], ("y", (4, 4), "f4"))
    )
    with g.compile(dispatch="direct", data="shared") as cg:
        with pytest.raises(TypeError, match="mapping input name"):
            list(cg.stream([np.zeros((4, 4), np.float32)], timeout=20))


def test_await_timeline_says_what_to_await(dom: hl.Domain) -> None:
    t = dom.timeline()
    f = dom.fence()

    async def main() -> None:
        with pytest.raises(TypeError, match=r"point\(value\)"):
            await t  # type: ignore[misc]
        t.signal(3)
        f.signal(hl.Status.SUCCESS)
        assert await t.point(3) is hl.Status.SUCCESS
        assert await f is hl.Status.SUCCESS

    asyncio.run(main())


def test_wait_async_docstring() -> None:
    doc = hl.Timeline.wait_async.__doc__ or ""
    assert "value >= value" not in doc
    assert "timeline's value is >= ``value``" in doc


def test_name_table_holds_239_names(dom: hl.Domain) -> None:
    assert names.MAX_NAMES == 239 == int(hl._abi.C.MAX_NAMES)
    fs = [dom.fence() for _ in range(200)]
    for i, f in enumerate(fs):
        dom.publish(f"n{i}", f)
    assert len(dom.names()) == 200
    assert dom.lookup("n199").handle == fs[199].handle


def _demo() -> object:
    spec = importlib.util.spec_from_file_location("pipeline_demo", ROOT / "examples" / "pipeline_demo.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["pipeline_demo"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_demo_says_higher_when_higher() -> None:
    pytest.importorskip("hostless_tools")
    versus = _demo().versus  # type: ignore[attr-defined]
    assert versus(0.82, "lower", "higher", "latency") == "1.22x higher latency"
    assert versus(2.0, "lower", "higher", "latency") == "2.00x lower latency"
    assert versus(0.5, "less", "more", "host CPU per frame") == "2.00x more host CPU per frame"
