# ruff: noqa: F811  (the fixtures imported from the module whose tests run here are used by name)
"""The hostile-packet cases of test_agents_hostile.py against hostless-agent (the executable).

Every directed cpu case and the random-packet fuzz run with the cpu agent
spawned ``native="exe"`` (no Python in the agent process): a bad packet fails
alone (its signal ends with ERROR when it can be signaled), the agent never
exits and never wedges.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hostless import agents
from test_agents_hostile import CASES, Env, env, test_random_packets  # noqa: F401
from test_agents_hostile import test_directed as _directed


@pytest.fixture(scope="module", autouse=True)
def _exe() -> Iterator[None]:
    real = agents.spawn

    def spawn(dom: Any, kind: str = "cpu", **kw: Any) -> agents.Agent:
        if kind == "cpu":
            kw.setdefault("native", "exe")
        return real(dom, kind, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(agents, "spawn", spawn)
    try:
        yield
    finally:
        mp.undo()


@pytest.mark.parametrize("name", [n for n, (kind, _fn) in CASES.items() if kind == "cpu"])
def test_directed_cpu(env: Env, name: str) -> None:
    _directed(env, name)


def test_the_cpu_agent_is_the_executable(env: Env) -> None:
    assert env.agent("cpu").proc.args[0] == agents.executable_path()
