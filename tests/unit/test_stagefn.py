"""Plain Python functions as Graph stages (hostless.stagefn): found by name
without PYTHONPATH, called with arrays and Python scalars, returning their
output, in all four modes; and the errors when they cannot be.  They run as
callbacks of the cpu agent's C loop (hostless.agents.native), loaded through
the spawner's private channel."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hostless as hl
from hostless import agents
from hostless.graph import Graph, StageFailed

X = np.arange(64, dtype=np.float32).reshape(8, 8)


# ---- the stage functions (module level: the agent imports them by name)
def scaled(x: np.ndarray, factor: float, tag: str) -> np.ndarray:
    assert isinstance(factor, float) and tag == "grad", (factor, tag)  # Python types, not words
    return x * factor


def plus(a: np.ndarray, b: np.ndarray, offset: int) -> np.ndarray:
    assert isinstance(offset, int)
    return a + b + offset


def in_place(x: np.ndarray, out: np.ndarray) -> None:
    np.negative(x, out=out)


def raises(x: np.ndarray) -> np.ndarray:
    raise ValueError(f"bad frame with sum {float(x.sum())}")


def wrong_shape(x: np.ndarray) -> np.ndarray:
    return x[:2]


def to_float(x: np.ndarray) -> np.ndarray:
    return x + 0.5


def forgets_to_return(x: np.ndarray) -> None:
    x.sum()


@pytest.fixture(scope="module")
def dom() -> Iterator[hl.Domain]:
    name = f"hltest-sf-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with hl.Domain.create(name, heap="32M", label="host", unlink_on_close=True) as d:
        yield d


@pytest.fixture(scope="module")
def cpu(dom: hl.Domain) -> Iterator[agents.Agent]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    old = os.environ.copy()
    os.environ.clear()
    os.environ.update(env)  # no PYTHONPATH: the package passes the path along
    try:
        a = agents.spawn(dom, "cpu", label="cpu-fn")
    finally:
        os.environ.clear()
        os.environ.update(old)
    yield a
    a.stop()


def test_the_cpu_agent_is_native(cpu: agents.Agent) -> None:
    """Stage functions are callbacks of the C loop (there is no Python cpu loop)."""
    assert cpu.native is True and cpu.capabilities["native"] and cpu.spec.stage_functions


@pytest.mark.parametrize("dispatch", ["host", "direct"])
@pytest.mark.parametrize("data", ["shared", "copy"])
def test_functions_in_every_mode(dom: hl.Domain, cpu: agents.Agent, dispatch: str, data: str) -> None:
    g = (
        Graph(dom)
        .input("x", (8, 8), "f4")
        .stage("grad", cpu, scaled, ["x"], ("g", (8, 8), "f4"), scalars=[0.5, "grad"])
        .stage("sum", cpu, plus, ["x", "g"], ("s", (8, 8), "f4"), scalars=[3])
        .stage("neg", cpu, in_place, ["s"], ("n", (8, 8), "f4"))
    )
    with g.compile(dispatch=dispatch, data=data) as cg:
        for k in range(3):
            out = cg.run({"x": X + k})["n"]
            np.testing.assert_allclose(out, -((X + k) + (X + k) * 0.5 + 3))


def test_a_function_is_loaded_once_per_scalars(cpu: agents.Agent) -> None:
    a = cpu.load_function(scaled, [2.0, "grad"])
    assert cpu.load_function(scaled, [2.0, "grad"]) == a
    assert cpu.load_function(scaled, [3.0, "grad"]) != a


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (raises, r"stage 'bad' failed with ERROR: ValueError: bad frame with sum 2016.0\n(?s:.*)in raises\n"),
        (wrong_shape, r"ERROR: ValueError: stage function test_stagefn:wrong_shape returned shape \(2, 8\)"),
        (to_float, r"ERROR: \w*TypeError: Cannot cast .*float64.*int32"),  # float into an int output
        (forgets_to_return, "ERROR: TypeError: .*forgets_to_return returned None and has no 'out' parameter"),
    ],
)
def test_a_failing_function_fails_its_stage(dom: hl.Domain, cpu: agents.Agent, fn: Any, why: str) -> None:
    g = Graph(dom).input("x", (8, 8), "i4").stage("bad", cpu, fn, ["x"], ("y", (8, 8), "i4"))
    with g.compile() as cg, pytest.raises(StageFailed, match=why) as info:
        cg.run({"x": X.astype(np.int32)})
    assert info.value.error and "Traceback" in info.value.error
    # the agent goes on serving
    g2 = Graph(dom).input("x", (8, 8), "f4").stage("ok", cpu, in_place, ["x"], ("y", (8, 8), "f4"))
    with g2.compile() as cg:
        np.testing.assert_array_equal(cg.run({"x": X})["y"], -X)


def test_functions_that_cannot_be_imported_are_refused_when_added(dom: hl.Domain, cpu: agents.Agent) -> None:
    g = Graph(dom).input("x", (8, 8), "f4")
    with pytest.raises(TypeError, match="lambda or a nested function"):
        g.stage("l", cpu, lambda x: x, ["x"], ("y", (8, 8), "f4"))

    def local(x: np.ndarray) -> np.ndarray:
        return x

    with pytest.raises(TypeError, match="lambda or a nested function"):
        g.stage("l", cpu, local, ["x"], ("y", (8, 8), "f4"))
    with pytest.raises(TypeError, match="JSON"):
        g.stage("l", cpu, scaled, ["x"], ("y", (8, 8), "f4"), scalars=[object()])
    with pytest.raises(TypeError, match="int or float scalars"):
        g.stage("l", cpu, "scale", ["x"], ("y", (8, 8), "f4"), scalars=["2"])


def test_an_import_error_in_the_agent_is_shown(dom: hl.Domain, cpu: agents.Agent, tmp_path: Path) -> None:
    mod = tmp_path / f"hl_vanishing_{uuid.uuid4().hex[:8]}.py"
    mod.write_text("def f(x):\n    return x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        m = __import__(mod.stem)
        mod.unlink()  # the agent will not find it
        g = Graph(dom).input("x", (8, 8), "f4").stage("gone", cpu, m.f, ["x"], ("y", (8, 8), "f4"))
        with pytest.raises(hl.HostlessError, match=r"could not load .*ModuleNotFoundError: No module named"):
            g.compile()
    finally:
        sys.path.remove(str(tmp_path))


def test_a_function_of_the_main_script(tmp_path: Path) -> None:
    """A function defined in the script that was run (``__main__``): the agent loads the
    script under another name, so its guarded main block does not run there."""
    script = tmp_path / "my_pipeline.py"
    name = f"hltest-main-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    script.write_text(
        textwrap.dedent(f"""
        import numpy as np
        import hostless as hl
        from hostless import agents
        from hostless.graph import Graph

        def brighten(frame, amount):
            return np.minimum(frame.astype(np.int32) + amount, 255).astype(np.uint8)

        if __name__ == "__main__":
            with hl.Domain.create({name!r}, heap="16M", unlink_on_close=True) as dom:
                cpu = agents.spawn(dom, "cpu")
                g = (Graph(dom).input("frame", (4, 4), "u1")
                     .stage("brighten", cpu, brighten, ["frame"], ("out", (4, 4), "u1"), scalars=[100]))
                with g.compile() as cg:
                    print(int(cg.run({{"frame": np.full((4, 4), 200, np.uint8)}})["out"][0, 0]))
                cpu.stop()
        """)
    )
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "255"


def test_run_refuses_unknown_inputs_and_casts_that_change_values(dom: hl.Domain, cpu: agents.Agent) -> None:
    g = Graph(dom).input("frame", (4, 4), "u1").stage("c", cpu, "copy", ["frame"], ("y", (4, 4), "u1"))
    with g.compile() as cg:
        with pytest.raises(KeyError, match=r"unknown graph input\(s\) \['fram'\]"):
            cg.run({"frame": np.zeros((4, 4), np.uint8), "fram": np.zeros((4, 4), np.uint8)})
        with pytest.raises(TypeError, match="300.0 into uint8 gives 44"):
            cg.run({"frame": np.full((4, 4), 300.0)})
        with pytest.raises(ValueError, match="values 0..300 that do not fit its dtype uint8"):
            cg.run({"frame": np.arange(16).reshape(4, 4) * 20})
        # integers that fit are fine, whatever their dtype (a Python list arrives as int64)
        out = cg.run({"frame": [[1, 2, 3, 4]] * 4})["y"]
        assert out.dtype == np.uint8 and out[0].tolist() == [1, 2, 3, 4]


def test_owner_errors_name_the_participant(dom: hl.Domain) -> None:
    r = subprocess.run(
        [sys.executable, "-c", f"import hostless as hl; print(hl.Domain.open({dom.name!r}).participant_id)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    gone = int(r.stdout)
    with pytest.raises(ValueError, match=f"owner participant {gone} is not alive: it has left"):
        dom.fence(owner=gone)


def test_an_agent_that_cannot_start_shows_why(dom: hl.Domain) -> None:
    with pytest.raises(
        hl.HostlessError, match=r"(?s)failed to start.*ModuleNotFoundError.*no_such_module_hl"
    ):
        agents.spawn(dom, "cpu", user_kernels={"k": "no_such_module_hl:f"})


@pytest.mark.parametrize(
    ("kernel", "inputs", "out", "scalars", "why"),
    [
        (
            "gemm",
            ["a", "a"],
            ((4, 4), "f4"),
            [],
            r"gemm: shapes \(4, 8\) @ \(4, 8\) -> \(4, 4\) do not match",
        ),
        ("relu", ["a"], ((8, 4), "f4"), [], r"the output must have the input's shape \(4, 8\)"),
        ("scale", ["a"], ((4, 8), "f4"), [], "scale takes one scalar, got 0"),
        ("copy", ["a"], ((4, 4), "f4"), [], "copy: 128 bytes into an output of 64"),
        ("add", ["a", "a"], ((4, 9), "f4"), [], "does not broadcast"),
        ("normalize", ["a"], ((4, 8), "u1"), [0.0, 1.0], "must be a float array"),
    ],
)
def test_builtin_stage_shapes_are_checked_when_added(
    dom: hl.Domain, cpu: agents.Agent, kernel: str, inputs: list[str], out: Any, scalars: list[Any], why: str
) -> None:
    g = Graph(dom).input("a", (4, 8), "f4").constant("k", np.ones((3, 3), np.float32))
    with pytest.raises(ValueError, match=f"stage 's': .*{why}"):
        g.stage("s", cpu, kernel, inputs, ("y", *out), scalars=scalars)


def test_conv2d_output_shape_is_checked(dom: hl.Domain, cpu: agents.Agent) -> None:
    g = Graph(dom).input("a", (4, 8), "f4").constant("k", np.ones((3, 3), np.float32))
    with pytest.raises(ValueError, match=r"conv2d: the output must be \(2, 6\), got \(4, 8\)"):
        g.stage("s", cpu, "conv2d", ["a", "k"], ("y", (4, 8), "f4"))
    g.stage("s", cpu, "conv2d", ["a", "k"], ("y", (2, 6), "f4"))


def test_hostless_info_shows_why_a_stage_failed(
    dom: hl.Domain, cpu: agents.Agent, capsys: pytest.CaptureFixture[str]
) -> None:
    from hostless import cli

    g = Graph(dom).input("x", (8, 8), "f4").stage("bad", cpu, raises, ["x"], ("y", (8, 8), "f4"))
    with g.compile() as cg:
        failed = cg.timelines_of(cg.frame + 1)[0]  # the frame's (replaced once it failed, kept held)
        with pytest.raises(StageFailed):
            cg.run({"x": X})
        assert dom.name is not None
        assert cli.main(["--plain", "info", dom.name]) == 0
        out = capsys.readouterr().out
        assert f"why {failed.handle:#x} failed" in out and "ValueError: bad frame with sum" in out


def test_a_load_request_in_a_reused_heap_block(dom: hl.Domain, cpu: agents.Agent) -> None:
    """The request buffer may be a freed block still full of old bytes: the request is
    NUL-terminated, so they are never read as part of it (a fresh-clone run saw 'Extra data')."""
    junk = [dom.buffer((16384,), "u1") for _ in range(32)]
    for b in junk:
        b.numpy()[:] = ord("}")
        b.release()
    for factor in (11.0, 12.0, 13.0):
        cpu.load_function(scaled, [factor, "grad"])
