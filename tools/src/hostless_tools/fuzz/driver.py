"""The fuzzer's driver: run every case (:func:`run`) and gather the result."""

from __future__ import annotations

import collections
import os
import random
import re
import time
from collections.abc import Callable
from typing import Any

from hostless.shm import path_of

from .. import _tooling
from .case import _run_case
from .config import Config, Forced, _case_ids, parse_set
from .layout import abi_layout
from .policy import ACCEPTED, OUTCOMES


def run(
    name: str = "hlfuzz",
    *,
    cases: int = 100,
    seed: int | None = None,
    case: str | int | None = None,
    truncate: int = 0,
    innocents: int = 2,
    window: float = 0.4,
    deadline: float = 10.0,
    cli: float = 0.25,
    hook: str | None = None,
    victims: float = 0.3,
    dry: bool = False,
    force: str | Forced | None = None,
    progress: Callable[[str], object] | None = None,
) -> dict[str, Any]:
    """Run the fuzzer; returns the result dict (``ok`` is False on any crash, hang or setup error).

    ``name``: prefix of the cases' domain names.  ``case``: run only that case (``K`` or ``tK``).
    ``truncate``: truncation cases after the ``cases`` field cases.  ``innocents``: processes per
    case (a creator and ``innocents - 1`` joiners).  ``window``: seconds of work after the first
    write.  ``deadline``: seconds an innocent gets to finish once told to stop.  ``cli``:
    probability of a ``hostless info/check`` probe per case.  ``victims``: probability of a case with
    one more participant that is SIGKILLed right after the first write, so that the innocents'
    watchdogs recover it over the corrupted tables.  ``dry``: plan every case but write nothing (a
    baseline of the harness: every case must be clean).  ``force``: every field case writes exactly
    this (:func:`parse_set`; the region, field, instance and value of the case are ignored).
    ``hook`` (tests): the last innocent
    kills itself with SIGSEGV (``segv``), raises IndexError (``raise``) or never stops (``hang``).
    """
    path_of(name)  # validates the name
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    if innocents < 1:
        raise ValueError("innocents must be >= 1")
    only = None if case is None else str(case)
    if only is not None and not re.fullmatch(r"t?\d+", only):
        raise ValueError(f"case must be K or tK, got {case!r}")
    forced = parse_set(force) if isinstance(force, str) else force
    cfg = Config(name, cases, seed, only, truncate, innocents, window, deadline, cli, hook, victims, dry=dry)
    cfg.force = forced
    abi_layout()  # fail early if the header and the core disagree
    t0 = time.monotonic()
    machine = _tooling.machine_info()
    recs = []
    for cid in _case_ids(cfg):
        rec = _run_case(cfg, cid)
        recs.append(rec)
        if progress is not None:
            line = (
                f"case {cid:>4} {rec['region']:<13} {rec.get('field', '?'):<18} "
                f"{rec.get('how', '')[:40]:<40} {rec.get('mode', ''):<6} {rec['outcome']}"
            )
            if rec["outcome"] != "clean":
                bad = [i for i in rec.get("innocents", []) if i["outcome"] != "clean"]
                line += ": " + "; ".join(f"{i['role']} {i['why']}" for i in bad)
            progress(line)
    return _result(cfg, recs, machine, time.monotonic() - t0)


def _result(cfg: Config, recs: list[dict[str, Any]], machine: dict[str, Any], dt: float) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = {}
    for r in recs:
        c = counts.setdefault(r["region"], dict.fromkeys(OUTCOMES, 0))
        c[r["outcome"]] += 1
    totals = dict.fromkeys(OUTCOMES, 0)
    for r in recs:
        totals[r["outcome"]] += 1
    errs: collections.Counter[str] = collections.Counter()
    for r in recs:
        errs.update(r.get("errors_seen", {}))
    bad = [r for r in recs if r["outcome"] != "clean"]
    return {
        "kind": "fuzz",
        "ok": not bad,
        "seed": cfg.seed,
        "config": {
            "name": cfg.name,
            "cases": cfg.cases,
            "case": cfg.only,
            "truncate": cfg.truncate,
            "innocents": cfg.innocents,
            "window_s": cfg.window,
            "deadline_s": cfg.deadline,
            "cli": cfg.cli,
            "hook": cfg.hook,
            "victims": cfg.victims,
            "dry": cfg.dry,
            "set": cfg.force.spec() if cfg.force is not None else None,
            "sanitizers": {
                k: os.environ[k] for k in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS") if k in os.environ
            },
        },
        "machine": machine,
        "duration_s": round(dt, 1),
        "totals": totals,
        "counts": counts,
        "errors_seen": dict(errs.most_common()),
        "accepted": list(ACCEPTED),
        "findings": bad,
        "cases": recs,
    }
