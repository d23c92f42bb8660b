# ruff: noqa: F811  (the fixtures imported from the module whose tests run here are used by name)
"""The hostile-packet cases of test_agents_hostile.py against native (C) cpu agents.

Every directed cpu case and the random-packet fuzz run with the cpu agent
spawned ``native=True``: a bad packet fails alone (its signal ends with ERROR
when it can be signaled), the agent never exits and never wedges.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from _native_spawn import native_cpu_agents
from test_agents_hostile import CASES, Env, env, test_random_packets  # noqa: F401
from test_agents_hostile import test_directed as _directed


@pytest.fixture(scope="module", autouse=True)
def _native() -> Iterator[None]:
    yield from native_cpu_agents()


@pytest.mark.parametrize("name", [n for n, (kind, _fn) in CASES.items() if kind == "cpu"])
def test_directed_cpu(env: Env, name: str) -> None:
    _directed(env, name)


def test_the_cpu_agent_is_native(env: Env) -> None:
    assert "--native" in env.agent("cpu").proc.args
