"""Test helper: make agents.spawn start native agents (cpu and npu) by default."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from hostless import agents


def native_agents(kinds: Sequence[str] = ("cpu", "npu")) -> Iterator[bool]:
    """Patch :func:`hostless.agents.spawn` so that agents of ``kinds`` default to
    ``native=True`` for as long as the generator is suspended (yields True)."""
    real = agents.spawn

    def spawn(dom: Any, kind: str = "cpu", **kw: Any) -> agents.Agent:
        if kind in kinds:
            kw.setdefault("native", True)
        return real(dom, kind, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(agents, "spawn", spawn)
    try:
        yield True
    finally:
        mp.undo()


def native_cpu_agents() -> Iterator[bool]:
    """:func:`native_agents` for cpu agents only."""
    yield from native_agents(("cpu",))
