"""The two hooks hostless.cluster adds to the local graph (no Ray needed): a compiled graph
returns named intermediate outputs (``compile(outputs=...)``: a part hands its edges' tensors
on), and a stage function described in another process (``stagefn.Described``: a node host
builds a driver's function stage by its description)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import cluster_fns
import hostless as hl
from hostless import agents
from hostless.cluster.host import NodeHost
from hostless.graph import Graph
from hostless.stagefn import Described, describe

MODES = [("host", "copy"), ("host", "shared"), ("direct", "copy"), ("direct", "shared")]


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[hl.Domain, agents.Agent, agents.Agent]]:
    with hl.Domain.create(
        f"hlclhook-{os.getpid()}-{uuid.uuid4().hex[:6]}", heap="16M", unlink_on_close=True
    ) as d:
        a, b = agents.spawn(d, "cpu"), agents.spawn(d, "cpu")
        yield d, a, b
        a.stop()
        b.stop()


@pytest.mark.parametrize(("dispatch", "data"), MODES)
def test_compile_returns_the_intermediate_outputs_asked_for(
    env: tuple[hl.Domain, agents.Agent, agents.Agent], dispatch: str, data: str
) -> None:
    d, a, b = env
    g = (
        Graph(d)
        .input("x", (4, 4), "f4")
        .stage("s1", a, "scale", ["x"], ("y1", (4, 4), "f4"), scalars=[2.0])
        .stage("s2", b, "scale", ["y1"], ("y2", (4, 4), "f4"), scalars=[3.0])
    )
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    with g.compile(dispatch=dispatch, data=data) as cg:
        assert set(cg.run({"x": x})) == {"y2"}
    with g.compile(dispatch=dispatch, data=data, outputs=["y1"]) as cg:
        for k in (1, 2, 3):  # every frame's own value (the fast path and the stream alike)
            out = cg.run({"x": k * x})
            np.testing.assert_array_equal(out["y1"], 2 * k * x)
            np.testing.assert_array_equal(out["y2"], 6 * k * x)
        outs = list(cg.stream([x, 2 * x]))
        np.testing.assert_array_equal(outs[1]["y1"], 4 * x)
    with pytest.raises(KeyError, match="'x' is not a stage's output"):
        g.compile(outputs=["x"])


def test_a_described_function_runs_as_the_function_itself(
    env: tuple[hl.Domain, agents.Agent, agents.Agent],
) -> None:
    d, a, _ = env
    desc = describe(cluster_fns.tanh_scale, [0.5])
    stand_in = Described({k: v for k, v in desc.items() if k != "scalars"})
    assert describe(stand_in, [0.25]) == {**desc, "scalars": [0.25]}
    with pytest.raises(TypeError, match="not called here"):
        stand_in(np.zeros(1))
    g = Graph(d).input("x", (4,), "f4").stage("t", a, stand_in, ["x"], ("y", (4,), "f4"), scalars=[0.5])
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    with g.compile() as cg:
        np.testing.assert_allclose(cg.run({"x": x})["y"], np.tanh(x) * 0.5, rtol=1e-6)


@pytest.mark.parametrize(
    "bad",
    [
        {"qualname": "f"},
        {"module": "m", "qualname": 3},
        {"module": "m", "qualname": "f", "path": [1]},
        {"module": "__main__", "qualname": "f", "path": []},
    ],
)
def test_a_bad_description_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(TypeError):
        Described(bad)


def test_a_node_host_replaces_the_domain_a_killed_one_left(tmp_path: Path) -> None:
    """A node host's domain has one name per (cluster, node): a host started after one was killed
    there takes the name over once nobody alive uses it (its agents die with their spawner)."""
    name = f"hlclhost-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    code = (
        "import os, sys\n"
        "from hostless.cluster.host import NodeHost\n"
        f"h = NodeHost('n1', {name!r}, '8M')\n"
        "h.spawn(1, 'cpu', {})\n"
        "print(h.info()['agents'][1]['pid'], flush=True)\n"
        "sys.stdin.read()\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None
        agent = int(p.stdout.readline())
        p.kill()  # SIGKILL: the domain file stays; the agent exits with its spawner
        p.wait(10)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{agent}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.path.exists(f"/dev/shm/{name}")
        h = NodeHost("n1", name, "8M")
        try:
            assert h.info()["domain"] == name  # replaced, not a second name
            h.spawn(1, "cpu", {})
            assert h.info()["agents"][1]["pid"] != agent
        finally:
            h.shutdown()
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        if p.poll() is None:
            p.kill()
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


def test_node_host_info_outside_ray_starts_no_ray() -> None:
    """``NodeHost.info()`` called outside a Ray worker asked Ray's runtime context for the node,
    which runs ``ray.init()`` by itself: it joined whatever cluster /tmp/ray named (in a test
    run, another pytest worker's; once that cluster stopped Ray ended this process, and a
    stopped one hung it for minutes) or started a local Ray.  It must not touch Ray."""
    name = f"hlclinfo-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    code = (
        "import os, sys, time\n"
        "import ray\n"
        "from hostless.cluster.host import NodeHost\n"
        f"h = NodeHost('n1', {name!r}, '8M')\n"
        "t0 = time.monotonic()\n"
        "info = h.info()\n"
        "print(repr(info['node_id']), ray.is_initialized(), round(time.monotonic() - t0, 1), flush=True)\n"
        "h.shutdown()\n"
    )
    env = dict(os.environ, RAY_ADDRESS="127.0.0.1:9")  # what an auto-init would join: nothing
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    node, initialized, took = r.stdout.split()
    assert node == "''" and initialized == "False", r.stdout
    assert float(took) < 5, r.stdout
