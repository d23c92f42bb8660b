# ruff: noqa: F811  (the fixtures imported from the module whose tests run here are used by name)
"""The hostile-packet cases of test_agents_hostile.py against native (C) cpu and npu agents.

Every directed case (cpu packets, malformed ERT command buffers for the C
command processor: bad header, count past the buffer, bad cu_mask, a CU not
in the xclbin, argument words that do not match their counts, chains out of
range or of chains, a fence as the command buffer, unsupported opcodes) and
the random-packet fuzz run with both agents spawned ``native=True``: a bad
packet fails alone (its signal ends with ERROR when it can be signaled), the
agent never exits and never wedges.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from _native_spawn import native_agents
from test_agents_hostile import CASES, Env, env, test_random_packets  # noqa: F401
from test_agents_hostile import test_directed as _directed


@pytest.fixture(scope="module", autouse=True)
def _native() -> Iterator[bool]:
    yield from native_agents()


@pytest.mark.parametrize("name", [n for n, (kind, _fn) in CASES.items() if kind in ("cpu", "npu")])
def test_directed_native(env: Env, name: str) -> None:
    _directed(env, name)


def test_the_agents_are_native(env: Env) -> None:
    assert "--native" in env.agent("cpu").proc.args
    assert "--native" in env.agent("npu").proc.args
