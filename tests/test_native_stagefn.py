# ruff: noqa: F811  (the fixtures imported from the module whose tests run here are used by name)
"""The Python stage-function tests of test_stagefn.py against native (C) cpu agents.

Stage functions are loaded with LOAD_KERNEL and run through the native loop's
Python callback (hostless.agents.native): loading, failures with their
records, shape checks and ``hostless info`` must work as with the Python loop.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from _native_spawn import native_cpu_agents
from hostless import agents
from test_stagefn import (  # noqa: F401  (dom, cpu: the module's fixtures, with native cpu agents)
    cpu,
    dom,
    test_a_failing_function_fails_its_stage,
    test_a_function_is_loaded_once_per_scalars,
    test_an_import_error_in_the_agent_is_shown,
    test_conv2d_output_shape_is_checked,
    test_functions_in_every_mode,
    test_hostless_info_shows_why_a_stage_failed,
    test_run_refuses_unknown_inputs_and_casts_that_change_values,
)


@pytest.fixture(scope="module", autouse=True)
def _native() -> Iterator[None]:
    yield from native_cpu_agents()


def test_the_cpu_agent_is_native(cpu: agents.Agent) -> None:
    assert "--native" in cpu.proc.args
