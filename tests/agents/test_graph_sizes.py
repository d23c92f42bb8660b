"""Sizes the user can see (issue 24): ``plan()`` shows each tensor's bytes and the heap bytes
a compiled graph takes (host heap, each device heap), and ``compile()`` refuses a graph that
cannot fit with GraphTooLarge, saying what it needs and the ``Domain.create`` size that fits.

The figure is exact: a graph's compile takes exactly what :func:`hostless.sizes.needs` says
from the heap (checked against the heap's used bytes in every mode, with an NPU's ERT
commands, fan-out, fan-in and relays).  Before, ``plan()`` had no byte counts and a graph
too large for the heap failed half-built with ``OutOfMemory ... no free run large enough``."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import hostless as hl
from hostless import agents, sizes
from hostless.dag import Dag
from hostless.graph import Graph, GraphTooLarge

MODES = [(d, m) for d in ("host", "direct") for m in ("shared", "copy")]


def sum6(*xs: np.ndarray) -> np.ndarray:
    return np.asarray(sum(xs))


@dataclass
class Env:
    dom: hl.Domain
    cpu: agents.Agent
    npu: agents.Agent


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    name = f"hltest-sizes-{uuid.uuid4().hex[:8]}"
    with hl.Domain.create(name, heap="16M", unlink_on_close=True, device_heaps={}) as d:
        cpu, npu = agents.spawn(d, "cpu", label="cpu"), agents.spawn(d, "npu", label="npu")
        try:
            yield Env(d, cpu, npu)
            cpu.stop()
            npu.stop()
        finally:
            cpu.kill()
            npu.kill()


def diamond(dom: hl.Domain, cpu: agents.Agent, npu: agents.Agent, shape: tuple[int, ...]) -> Graph:
    w = np.full(shape, 0.5, np.float32)
    return (
        Graph(dom)
        .input("x", shape, "f4")
        .constant("w", w)
        .stage("a", cpu, "add", ["x", "w"], ("ya", shape, "f4"))
        .stage("b", npu, "relu", ["ya"], ("yb", shape, "f4"))
        .stage("c", cpu, "scale", ["ya"], ("yc", shape, "f4"), scalars=[2.0])
        .stage("d", cpu, "add", ["yb", "yc"], ("yd", shape, "f4"))
    )


def tree(dom: hl.Domain, cpu: agents.Agent, npu: agents.Agent, shape: tuple[int, ...]) -> Graph:
    g = Graph(dom).input("x", shape, "f4")
    for i in range(5):
        if i % 2:
            g.stage(f"p{i}", npu, "relu", ["x"], (f"y{i}", shape, "f4"))
        else:
            g.stage(f"p{i}", cpu, "scale", ["x"], (f"y{i}", shape, "f4"), scalars=[float(i)])
    g.stage("s01", cpu, "add", ["y0", "y1"], ("s01", shape, "f4"))
    g.stage("s23", cpu, "add", ["y2", "y3"], ("s23", shape, "f4"))
    g.stage("s", cpu, "add", ["s01", "s23"], ("s", shape, "f4"))
    return g.stage("join", cpu, "add", ["s", "y4"], ("out", shape, "f4"))


def relays(dom: hl.Domain, cpu: agents.Agent, npu: agents.Agent, shape: tuple[int, ...]) -> Graph:
    """A join of six inputs (direct: two relay packets on the pusher, the NPU: ERT commands)."""
    g = Graph(dom).input("x", shape, "f4")
    for i in range(6):
        g.stage(f"p{i}", npu if i % 2 else cpu, "relu", ["x"], (f"y{i}", shape, "f4"))
    return g.stage("join", cpu, sum6, [f"y{i}" for i in range(6)], ("out", shape, "f4"))


@pytest.mark.parametrize("build", [diamond, tree, relays])
@pytest.mark.parametrize("shape", [(8, 8), (160, 160)])  # small blocks, large (page) blocks
@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_a_compile_takes_what_it_says(
    env: Env, build: Any, shape: tuple[int, ...], dispatch: str, data: str
) -> None:
    used0 = env.dom.heap_stats()["used"]
    cg = build(env.dom, env.cpu, env.npu, shape).compile(dispatch=dispatch, data=data, inflight=3)
    try:
        assert env.dom.heap_stats()["used"] - used0 == cg.needs.heaps["cpu"]
        assert set(cg.needs.heaps) == {"cpu"}
    finally:
        cg.close()
    assert env.dom.heap_stats()["used"] == used0


def test_plan_shows_bytes_per_tensor_and_per_heap(env: Env) -> None:
    g = diamond(env.dom, env.cpu, env.npu, (160, 160))
    with g.compile(dispatch="direct", data="copy", inflight=2) as cg:
        plan = cg.plan()
        lines = {ln.split()[0]: ln for ln in plan.splitlines()[1:] if not ln.strip().startswith("host heap")}
        kib = "100.0 KiB"  # 160 * 160 * 4 bytes
        assert f"{kib} x2 " in lines["x"]  # one private copy per reader (a) per slot
        assert f"{kib} x3 " in lines["w"]  # the constant once, a's private copy per slot
        assert f"{kib} x6 " in lines["ya"]  # a's output, b's and c's copies, per slot
        assert f"{kib} x2 " in lines["yd"]  # the sink's output
        total = cg.needs.heaps["cpu"]
        assert f"host heap: this graph takes {sizes.fmt_bytes(total)} (tensors " in plan
        assert "for 2 frame(s) in flight, packets " in plan and "of 16.0 MiB" in plan


def test_a_graph_too_large_is_refused_before_anything_is_allocated(env: Env, domain_name: str) -> None:
    used0 = env.dom.heap_stats()["used"]
    g = diamond(env.dom, env.cpu, env.npu, (1024, 1024))  # 4 MiB tensors
    with pytest.raises(GraphTooLarge) as ei:
        g.compile(dispatch="direct", data="copy", inflight=2)
    e = ei.value
    assert isinstance(e, hl.OutOfMemory)  # what compile raised before: handlers still apply
    assert env.dom.heap_stats()["used"] == used0
    assert e.heap == "cpu" and e.needed > e.free and 15 << 20 < e.size <= 16 << 20
    msg = str(e)
    assert f"needs {sizes.fmt_bytes(e.needed)} (tensors " in msg and "of the shared heap" in msg
    assert "inflight=1" in msg and 'data="shared"' in msg and "cg.plan()" in msg
    # the size it suggests fits it
    m = re.search(r'Domain\.create\(name, heap="(\d+)M"\)', msg)
    assert m, msg
    with hl.Domain.create(domain_name, heap=f"{m.group(1)}M", device_heaps={}) as big:
        cpu, npu = agents.spawn(big, "cpu"), agents.spawn(big, "npu")
        try:
            g2 = diamond(big, cpu, npu, (1024, 1024))
            with g2.compile(dispatch="direct", data="copy", inflight=2) as cg:
                x = np.linspace(-1, 1, 1024 * 1024, dtype=np.float32).reshape(1024, 1024)
                a = x + 0.5
                np.testing.assert_allclose(cg.run({"x": x}, timeout=30)["yd"], np.maximum(a, 0) + 2 * a)
        finally:
            cpu.kill()
            npu.kill()


def test_scattered_free_space_fails_whole_and_gives_back_what_it_took(env: Env) -> None:
    """Enough free bytes in all, no run long enough for the tensors: the allocation itself fails,
    and compile releases what it allocated (the constant, allocated first) before it raises
    GraphTooLarge (before: a bare OutOfMemory "no free run large enough")."""
    used0 = env.dom.heap_stats()["used"]
    held: list[hl.Buffer] = []
    try:
        while True:  # fill the heap with 96 KiB buffers
            held.append(env.dom.buffer(96 << 10))
    except hl.OutOfMemory:
        pass
    for b in held[::2]:  # free every other one: free runs of one such block
        b.release()
    keep = held[1::2]
    try:
        used1 = env.dom.heap_stats()["used"]
        g = (  # a small constant (it fits: allocated first), 128 KiB tensors (no run fits one)
            Graph(env.dom)
            .input("x", (128, 256), "f4")
            .constant("w", np.ones((4, 256), np.float32))
            .stage("a", env.cpu, "relu", ["w"], ("ya", (4, 256), "f4"))
            .stage("b", env.npu, "relu", ["x"], ("yb", (128, 256), "f4"))
        )
        with pytest.raises(GraphTooLarge, match="of the shared heap") as ei:
            g.compile(dispatch="host", data="shared", inflight=1)
        assert isinstance(ei.value.__cause__, hl.OutOfMemory)
        assert ei.value.needed <= ei.value.free  # the refusal came from the allocation
        assert env.dom.heap_stats()["used"] == used1  # what it had taken is back
    finally:
        for b in keep:
            b.release()
    assert env.dom.heap_stats()["used"] == used0


def test_a_domain_without_a_host_heap_has_no_room_for_a_graph(domain_name: str) -> None:
    """Device heaps only: the small host heap holds their metadata, nothing of a graph."""
    with hl.Domain.create(domain_name) as dom:
        assert dom.heap_stats()["free"] > 0 and sizes.room(dom, "cpu") == (0, 0)
        need = sizes.HeapNeeds(1, packets=1000)
        with pytest.raises(GraphTooLarge, match=r'has 0 B free of 0 B: .*heap="2M"'):
            sizes.check_fits(dom, need, "dispatch=direct data=shared inflight=1")


def test_device_heaps_are_counted_apart() -> None:
    """Tensors placed on a GPU take device heap blocks (256-byte granules) and a metadata block
    each in the host heap; the refusal for a device heap names device_heaps=, in 2 MiB steps."""
    agent = SimpleNamespace(spec=SimpleNamespace(ert=False))
    one = {"agent": agent, "kernel": "relu", "shape": (100,), "dtype": "f4", "scalars": ()}
    stages = [
        SimpleNamespace(inputs=[i], output=o, **one)
        for i, o in (("x", "y"), ("y", "z"))
    ]
    dag = Dag.build(["y", "z"], [["x"], ["y"]])
    place = {"x": "cpu", "y": "cuda:0", "z": "cpu"}
    need = sizes.needs(stages, {"x": ((100,), np.dtype("f4"))}, {}, place, dag, "direct", "shared", 2)
    assert need.tensor_bytes == {"x": 400, "y": 400, "z": 400}
    assert need.tensors["cuda:0"] == 2 * 512  # 400 bytes -> two 256-byte granules, per slot
    host = 2 * (2 * sizes.host_block_bytes(400) + 128)  # x and z, y's metadata, per slot
    assert need.tensors["cpu"] == host and need.heaps["cpu"] == host + need.packets
    e = sizes.too_large("cuda:0", 5 << 20, 1 << 20, 4 << 20, need, "dispatch=direct data=shared inflight=2")
    assert 'device_heaps={"cuda:0": "8M"}' in str(e) and "the device heap cuda:0" in str(e)
