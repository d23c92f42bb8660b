"""Test helper: make agents.spawn start native cpu agents (for the test_native_agent* modules)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hostless import agents


def native_cpu_agents() -> Iterator[None]:
    """Patch :func:`hostless.agents.spawn` so that cpu agents default to ``native=True``."""
    real = agents.spawn

    def spawn(dom: Any, kind: str = "cpu", **kw: Any) -> agents.Agent:
        if kind == "cpu":
            kw.setdefault("native", True)
        return real(dom, kind, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(agents, "spawn", spawn)
    try:
        yield
    finally:
        mp.undo()
