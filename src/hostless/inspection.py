"""Inspecting a domain: its participants and the consistency of its shared tables.

The implementation behind :attr:`Domain.participants` and :meth:`Domain.check`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._abi import C
from .recovery import check_tables

if TYPE_CHECKING:
    from .domain import Domain

__all__ = ["Participant", "participants", "check"]


@dataclass(frozen=True)
class Participant:
    """A participant of a domain as recorded in its participant table."""

    id: int
    """Domain-wide id: incarnation << 8 | slot index (unique over the domain's life)."""
    index: int
    pid: int
    start_time: int
    joined_ns: int
    label: str
    kind: str
    state: str
    """'alive', 'dead' (lock released, not recovered yet) or 'recovering'."""


def participants(dom: Domain) -> list[Participant]:
    """Every non-free participant slot of ``dom``'s table."""
    dom._check_open()
    out = []
    for idx, inc, state, _rec, pid, st, joined, label, kind, held in dom._core.participants():
        if state == C.PART_RECOVERING:
            s = "recovering"
        else:
            s = "alive" if held else "dead"
        out.append(
            Participant(
                id=(inc << 8) | idx,
                index=idx,
                pid=pid,
                start_time=st,
                joined_ns=joined,
                label=label.decode(errors="replace"),
                kind=kind.decode(errors="replace"),
                state=s,
            )
        )
    return out


def check(dom: Domain, settle: float = 5.0) -> list[str]:
    """Every invariant violation found in ``dom``'s shared tables (see :meth:`Domain.check`)."""
    dom._check_open()
    deadline = time.monotonic() + settle
    while time.monotonic() < deadline and any(
        p[2] == int(C.PART_RECOVERING) and p[9] for p in dom._core.participants()
    ):
        time.sleep(0.002)
    heap = dom._core.heap_snapshot(0)
    devs = [(name, int(C.DEVICE_GRANULE), dom._core.heap_snapshot(i + 1)) for name, i in dom._devices.items()]
    return check_tables(bytes(dom.raw()), dom._core.lock_held, dom._index, heap, dom._core.view(), devs)


def owner_error(dom: Domain, pid: int) -> ValueError:
    """The core's "owner participant N is not alive", naming who N was and who holds its slot."""
    table = {p.index: p for p in participants(dom)}
    p = table.get(pid & 0xFF)
    if p is not None and p.id == pid:
        who = f"{p.label!r} ({p.kind}, pid {p.pid}) is {p.state}"
    elif p is not None:
        who = f"it has left; its slot holds {p.label!r} ({p.kind}, pid {p.pid}, participant {p.id})"
    else:
        who = "it has left, or never joined"
    return ValueError(f"owner participant {pid} is not alive: {who}")
