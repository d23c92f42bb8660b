"""A fuzz run's configuration, forced corruptions (``--set``), case ids and reproduction lines."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from .plan import _plan_target, _Snap, _Target
from .policy import REGIONS


@dataclass
class Config:
    name: str
    cases: int
    seed: int
    only: str | None
    truncate: int
    innocents: int
    window: float
    deadline: float
    cli: float
    hook: str | None
    victims: float = 0.3
    whole: float = 0.15
    late: float = 0.3
    dry: bool = False
    force: Forced | None = None


@dataclass(frozen=True)
class Forced:
    """An exact corruption (``--set REGION.FIELD[@TARGET]=VALUE``): no planner involved."""

    region: str
    field: str
    target: str
    value: int | bytes
    toggle: bool = False

    def spec(self) -> str:
        tgt = f"@{self.target}" if self.target else ""
        val = f"hex:{self.value.hex()}" if isinstance(self.value, bytes) else f"{self.value:#x}"
        return f"{self.region}.{self.field}{tgt}={val}"


def parse_set(spec: str, toggle: bool = False) -> Forced:
    """``REGION.FIELD[@TARGET]=VALUE``: VALUE an integer (any base, ``-1`` = all ones) or
    ``hex:...`` bytes; TARGET a substring of the instance's name (``timeline``, ``creator``,
    ``packet 3``, ``small buffer``, ``alloc_hint+1``).  ``FIELD`` ``*``: the whole struct instance
    (VALUE then bytes)."""
    m = re.fullmatch(r"(\w+)\.([\w\[\]*]+)(?:@([^=]+))?=(.+)", spec.strip())
    if m is None or m.group(1) not in REGIONS:
        raise ValueError(
            f"--set wants REGION.FIELD[@TARGET]=VALUE with REGION in {', '.join(REGIONS)}: {spec!r}"
        )
    raw = m.group(4).strip()
    value: int | bytes = bytes.fromhex(raw[4:]) if raw.startswith("hex:") else int(raw, 0)
    return Forced(m.group(1), m.group(2), (m.group(3) or "").strip(), value, toggle)


def _forced_target(f: Forced, s: _Snap) -> _Target:
    """The instance of the planner that matches ``f`` (the planner is tried with a fixed sequence
    of generators until one picks that field and target: a pure function of the layout)."""
    for j in range(50000):
        t = _plan_target(random.Random(f"hostless-fuzz:force:{j}"), f.region, s)
        name_ok = f.field == "*" or t.field == f.field or t.field.split("[")[0] == f.field
        if name_ok and f.target in t.target:
            if f.field == "*":
                if not t.span:
                    break
                t.field = "*"
            return t
    raise ValueError(f"no {f.region}.{f.field} with a target matching {f.target!r} in this layout")


def _case_ids(cfg: Config) -> list[str]:
    if cfg.only is not None:
        return [cfg.only]
    return [str(k) for k in range(cfg.cases)] + [f"t{k}" for k in range(cfg.truncate)]


def _repro(cfg: Config, cid: str) -> str:
    extra = f" --innocents {cfg.innocents}" if cfg.innocents != 2 else ""
    if cfg.victims != 0.3:
        extra += f" --victims {cfg.victims}"
    if cfg.force is not None:
        extra += f" --set '{cfg.force.spec()}'" + (" --toggle" if cfg.force.toggle else "")
    return f"hostless fuzz {cfg.name} --seed {cfg.seed} --case {cid}{extra}"


def _exact_repro(cfg: Config, rec: dict[str, Any]) -> str | None:
    """The planner-independent reproduction of a field case: ``--set`` with its field and value."""
    if rec["region"] == "truncate" or "field" not in rec:
        return None
    tgt = str(rec.get("target", ""))
    # the instance, as the planner names it (a resolved "alloc_hint+1 = slot 7" keeps its first part)
    sel = tgt.split(" = ")[0]
    if not sel.startswith("any"):  # a random slot stays that slot; the others are named by role
        sel = sel.split(" (index")[0].split(" slot ")[0]
    val = f"hex:{rec['bytes']}" if rec.get("bytes") else f"{rec.get('value', 0):#x}"
    extra = " --toggle" if rec.get("mode") == "toggle" else ""
    vic = " --victims 1" if rec.get("victim") else " --victims 0"
    return f"hostless fuzz {cfg.name} --case 0 --set '{rec['region']}.{rec['field']}@{sel}={val}'{extra}{vic}"
