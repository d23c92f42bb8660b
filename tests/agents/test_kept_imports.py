"""Kept imports of the native agent loop (hle_agent_run's contract in hostless_engine.h).

While packets come often, an agent keeps the objects its packets named imported
(their slots' reference masks keep its bit), so that the next packets import them
from its local count without writing to the slots.  What must hold:

* it keeps them while frames run (what the figures come from: fails on the loop
  that released everything after each packet);
* an object that its other holders released is freed within a sweep, although
  the agent is still keeping (a closed graph's buffers go back to the heap);
* everything kept is released once no packet came for keep_ns;
* a killed agent's kept references are recovered like any other: the objects
  are freed when their owner releases them, and the tables check clean.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

import hostless as hl
from hostless import agents
from hostless._abi import handle_index
from hostless.graph import Graph
from hostless.view import open_view

HEAP = 16 << 20


@pytest.fixture
def dom(domain_name: str) -> Iterator[hl.Domain]:
    with hl.Domain.create(domain_name, heap=HEAP, unlink_on_close=True) as d:
        yield d


def _spawn(dom: hl.Domain, keep_ns: int, monkeypatch: pytest.MonkeyPatch) -> agents.Agent:
    monkeypatch.setenv("HOSTLESS_AGENT_KEEP_NS", str(keep_ns))
    return agents.spawn(dom, "cpu", spin=0.5, label="keeper")


def _graph(dom: hl.Domain, cpu: agents.Agent) -> Graph:
    g = Graph(dom).input("x", (16,), np.float32)
    g.stage("s0", cpu, "copy", ["x"], ("y", (16,), np.float32))
    return g


def _agent_bit(a: agents.Agent) -> int:
    return 1 << (int(a.id) & 0xFF)


def _refs(name: str, handles: list[int]) -> list[int]:
    with open_view(name) as v:
        refs = v.fences()["refs"]
        return [int(refs[handle_index(h)]) for h in handles]


def _held_objects(cg: object) -> list[int]:
    sl = cg.slots[0]  # type: ignore[attr-defined]
    return [sl.tensors["x"].handle, sl.tensors["y"].handle, sl.timelines[0].handle]


def _until(cond: object, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.002)
    return bool(cond())  # type: ignore[operator]


def test_an_agent_keeps_what_its_packets_named_while_frames_come(
    dom: hl.Domain, domain_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cpu stage (a KERNEL packet) then an npu stage (an ERT command, whose buffers the
    command names): each agent keeps its packet's objects, the npu's command buffers too."""
    cpu = _spawn(dom, 5_000_000_000, monkeypatch)
    npu = agents.spawn(dom, "npu", spin=0.5, label="keeper npu")
    try:
        x = np.arange(16, dtype=np.float32)
        g = _graph(dom, cpu)
        g.stage("s1", npu, "copy", ["y"], ("z", (16,), np.float32))
        with g.compile("direct", "shared", inflight=1) as cg:
            for _ in range(300):
                assert np.array_equal(cg.run({"x": x})["z"], x)
            sl = cg.slots[0]
            t = sl.tensors
            mine = {
                cpu: [t["x"].handle, t["y"].handle, sl.timelines[0].handle],
                npu: [t["y"].handle, t["z"].handle, sl.timelines[1].handle],
            }
            for a, objs in mine.items():
                bit = _agent_bit(a)
                assert all(r & bit for r in _refs(domain_name, objs)), (
                    f"{a.kind} kept none of its packets' objects"
                )
            every = sorted({h for objs in mine.values() for h in objs})
        # the graph released them: the agents' sweeps free them, though they keep for 5 s
        assert _until(lambda: all(r == 0 for r in _refs(domain_name, every)), 5.0), _refs(domain_name, every)
        assert dom.check() == []
    finally:
        cpu.stop()
        npu.stop()


def test_everything_kept_is_released_after_keep_ns_without_packets(
    dom: hl.Domain, domain_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = _spawn(dom, 50_000_000, monkeypatch)  # 50 ms
    try:
        x = np.ones(16, np.float32)
        with _graph(dom, cpu).compile("direct", "shared", inflight=1) as cg:
            for _ in range(300):
                cg.run({"x": x})
            objs = _held_objects(cg)
            bit = _agent_bit(cpu)
            # the graph still holds them: only the idle bound releases the agent's references
            assert _until(lambda: not any(r & bit for r in _refs(domain_name, objs)), 5.0)
            assert np.array_equal(cg.run({"x": x})["y"], x)  # and the next frame imports them again
    finally:
        cpu.stop()


def test_keeping_off_holds_nothing_between_packets(
    dom: hl.Domain, domain_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = _spawn(dom, 0, monkeypatch)
    try:
        x = np.ones(16, np.float32)
        with _graph(dom, cpu).compile("direct", "shared", inflight=1) as cg:
            for _ in range(50):
                cg.run({"x": x})
            objs = _held_objects(cg)
            bit = _agent_bit(cpu)
            assert _until(lambda: not any(r & bit for r in _refs(domain_name, objs)), 1.0)
    finally:
        cpu.stop()


def test_a_killed_keeper_is_recovered_and_its_objects_freed(
    dom: hl.Domain, domain_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = _spawn(dom, 5_000_000_000, monkeypatch)
    x = np.ones(16, np.float32)
    try:
        cg = _graph(dom, cpu).compile("direct", "shared", inflight=1)
        for _ in range(200):
            cg.run({"x": x})
        objs = _held_objects(cg)
        bit = _agent_bit(cpu)
        assert all(r & bit for r in _refs(domain_name, objs))
        cpu.kill()
        _until(lambda: bool(dom.reap()) or not any(r & bit for r in _refs(domain_name, objs)), 10.0)
        assert not any(r & bit for r in _refs(domain_name, objs)), (
            "the dead agent's references were not dropped"
        )
        cg.close()
        assert _until(lambda: all(r == 0 for r in _refs(domain_name, objs)), 5.0)
        assert dom.check() == []
    finally:
        cpu.kill()


def test_bad_keep_setting_is_a_clear_error(dom: hl.Domain, monkeypatch: pytest.MonkeyPatch) -> None:
    from hostless.agents.native import _keep_ns

    monkeypatch.setenv("HOSTLESS_AGENT_KEEP_NS", "soon")
    with pytest.raises(ValueError, match="HOSTLESS_AGENT_KEEP_NS must be an integer"):
        _keep_ns()
