"""Agent kinds as types (hostless.agents.kinds) and spawn's start-up bound.

One spec per kind (cpu, npu, the executable serving either, cuda, gpucp) holds
what the library knows about it: the kernels its stages name and the ids their
packets carry, the packet format, where it reads memory, what it runs, the
options it takes.  spawn() and the graph ask it.  ``spawn(timeout=)`` bounds the
start even when the child hangs before printing anything: it is killed and
AgentStartTimeout (a TimeoutError) is raised within the timeout.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hostless as hl
from conftest import SLACK
from hostless import agents
from hostless.agents import kinds
from hostless.agents.kinds import SPECS, spec_for
from hostless.graph import Graph
from hostless.kernels import CPU_KERNELS, CUDA_KERNEL_NAMES, NPU_CUS


@pytest.fixture(scope="module")
def dom() -> Iterator[hl.Domain]:
    name = f"hltest-kinds-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with hl.Domain.create(name, heap="8M", label="host", unlink_on_close=True) as d:
        yield d


# ------------------------------------------------------------------ the specs


def test_one_spec_per_kind() -> None:
    assert set(SPECS) == {"cpu", "npu", "cpu-exe", "npu-exe", "cuda", "gpucp"}
    assert spec_for("cpu") is spec_for("cpu", True) is SPECS["cpu"]
    assert spec_for("npu", "exe") is SPECS["npu-exe"] and SPECS["npu-exe"].kind == "npu"
    assert spec_for("gpucp").resident and spec_for("cuda").gpu and not spec_for("cpu").gpu
    assert [s.name for s in SPECS.values() if s.stage_functions] == ["cpu"]
    assert {s.name for s in SPECS.values() if not s.python} == {"cpu-exe", "npu-exe", "gpucp"}


def test_kernel_tables_are_the_registries() -> None:
    ids = {n: kid for n, (kid, _fn) in CPU_KERNELS.items()}
    assert dict(SPECS["cpu"].kernels) == ids == dict(SPECS["cpu-exe"].kernels)
    cus = {n: cu for n, (cu, _fn) in NPU_CUS.items()}
    assert dict(SPECS["npu"].kernels) == cus == dict(SPECS["npu-exe"].kernels)
    assert SPECS["npu"].ert and not SPECS["cpu"].ert
    assert dict(SPECS["cuda"].kernels) == {n: ids[n] for n in CUDA_KERNEL_NAMES}
    assert SPECS["cpu"].kernel("relu") == ids["relu"] and SPECS["npu"].kernel("relu") == cus["relu"]
    assert SPECS["cpu"].kernel("relu", {"relu": 1001}) == 1001  # a user kernel first
    with pytest.raises(KeyError, match="npu agent has no kernel 'sum'"):
        SPECS["npu"].kernel("sum")
    assert SPECS["cuda"].packet_flags("copy") == kinds.FLAG_STAGE_COPY
    assert SPECS["cuda"].packet_flags("shared") == SPECS["cpu"].packet_flags("copy") == 0


def test_spawn_refuses_what_a_kind_does_not_take(dom: hl.Domain) -> None:
    with pytest.raises(ValueError, match="unknown agent kind"):
        agents.spawn(dom, "dsp")
    with pytest.raises(ValueError, match="no Python cpu/npu agent loop"):
        agents.spawn(dom, "cpu", native=False)
    with pytest.raises(ValueError, match="native must be"):
        agents.spawn(dom, "cpu", native="yes")
    with pytest.raises(TypeError, match="cpu agents take no option sms"):
        agents.spawn(dom, "cpu", sms=4)
    with pytest.raises(TypeError, match="cpu-exe agents take no option fixed_spin"):
        agents.spawn(dom, "cpu", native="exe", fixed_spin=True)
    with pytest.raises(TypeError, match="unknown options"):
        agents.spawn(dom, "npu", colour="blue")
    with pytest.raises(ValueError, match="follow_timeout"):
        agents.spawn(dom, "cpu", follow_timeout=float("nan"))


def test_the_graph_asks_the_agent_spec(dom: hl.Domain) -> None:
    """Kernel names are checked against the agent's spec when a stage is added, and a stage
    on an npu becomes an ERT command naming the spec's CU."""
    cpu, npu = agents.spawn(dom, "cpu", label="k-cpu"), agents.spawn(dom, "npu", label="k-npu")
    try:
        assert cpu.spec is SPECS["cpu"] and npu.spec is SPECS["npu"]
        with pytest.raises(KeyError, match="npu agent has no kernel 'sum'"):
            Graph(dom).input("x", (4,), "f4").stage("s", npu, "sum", ["x"], ("y", (1,), "f4"))
        g = (
            Graph(dom)
            .input("x", (8,), "f4")
            .stage("a", cpu, "scale", ["x"], ("h", (8,), "f4"), scalars=[2.0])
            .stage("b", npu, "relu", ["h"], ("y", (8,), "f4"))
        )
        x = np.linspace(-1, 1, 8, dtype=np.float32)
        for dispatch in ("host", "direct"):
            with g.compile(dispatch=dispatch, data="shared") as cg:
                np.testing.assert_allclose(cg.run({"x": x})["y"], np.maximum(2 * x, 0))
                pk = cg.slots[0].packets[1]
                assert pk.type == hl.PacketType.ERT and pk.kernel == NPU_CUS["relu"][0]
    finally:
        cpu.stop()
        npu.stop()


# ------------------------------------------------------------------ spawn's start-up bound


def _hanging_command(pidfile: Path, first: str) -> Any:
    """A command for AgentSpec.command: a Python that writes its pid, prints ``first`` (may be
    empty), then sleeps forever."""
    code = (
        "import os, sys, time\n"
        f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        f"sys.stdout.write({first!r}); sys.stdout.flush()\n"
        "time.sleep(3600)\n"
    )

    def command(self: Any, *_a: Any, **_k: Any) -> list[str]:
        return [sys.executable, "-c", code]

    return command


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize(
    "first",
    ["", "12", "257\n"],
    ids=["prints-nothing", "half-a-line", "id-but-no-capabilities"],
)
def test_spawn_timeout_kills_a_child_that_hangs_before_printing(
    dom: hl.Domain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    pidfile = tmp_path / "pid"
    monkeypatch.setattr(kinds.AgentSpec, "command", _hanging_command(pidfile, first))
    t0 = time.monotonic()
    with pytest.raises(agents.AgentStartTimeout, match=r"did not start within 1\.0 s") as ei:
        agents.spawn(dom, "cpu", timeout=1.0, label="hangs")
    took = time.monotonic() - t0
    assert isinstance(ei.value, TimeoutError) and isinstance(ei.value, hl.HostlessError)
    assert 1.0 <= took < 1.0 + SLACK, took
    pid = int(pidfile.read_text())
    assert _gone(pid), "the child that did not start was left running"


def test_a_child_that_exits_before_printing_shows_why(
    dom: hl.Domain, monkeypatch: pytest.MonkeyPatch
) -> None:
    def command(self: Any, *_a: Any, **_k: Any) -> list[str]:
        return [sys.executable, "-c", "import sys; sys.exit('no domain for me')"]

    monkeypatch.setattr(kinds.AgentSpec, "command", command)
    t0 = time.monotonic()
    with pytest.raises(hl.HostlessError, match=r"(?s)failed to start \(exit code 1\).*no domain for me"):
        agents.spawn(dom, "npu", timeout=30.0)
    assert time.monotonic() - t0 < SLACK
