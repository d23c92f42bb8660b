"""One fuzz case: start the innocents, corrupt the live domain (one field, a whole struct, a
toggle, or a truncation), stop them and classify each (:func:`_run_case`)."""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from .classify import _classify, _san_reports
from .config import Config, _exact_repro, _forced_target, _repro
from .innocent import _POLL
from .layout import abi_layout
from .plan import _plan_target, _snapshot, _Target
from .policy import OUTCOMES, REGIONS
from .procs import _Proc, _reap, _spawn, _spawn_cli, _stop
from .values import _pick_value, _truncate_plan


def _whole_data(rng: random.Random, fd: int, t: _Target) -> tuple[bytes, str]:
    """Bytes replacing the whole struct instance of ``t`` (its first ``span`` bytes)."""
    n = t.span
    choice = rng.randrange(5)
    if choice == 0 and t.siblings:
        src = rng.choice(t.siblings)
        return os.pread(fd, n, src), f"whole {t.region} struct cloned from offset {src}"
    if choice == 1:
        return b"\x00" * n, f"whole {t.region} struct zeroed"
    if choice == 2:
        return b"\xff" * n, f"whole {t.region} struct all 0xff"
    return rng.randbytes(n), f"whole {t.region} struct random"


def _toggle(fd: int, offset: int, hostile: bytes, orig: bytes, seconds: float) -> int:
    """Alternate the hostile and the original bytes for ``seconds`` (a reader that validates a
    field and reads it again sees both); ends on the hostile value.  Returns the number of pairs."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        for _ in range(32):
            os.pwrite(fd, hostile, offset)
            os.pwrite(fd, orig, offset)
        n += 32
    os.pwrite(fd, hostile, offset)
    return n


def _run_case(cfg: Config, cid: str) -> dict[str, Any]:
    trunc = cid.startswith("t")
    k = int(cid[1:] if trunc else cid)
    rng = random.Random(f"hostless-fuzz:{cfg.seed}:{cid}")
    region = "truncate" if trunc else REGIONS[k % len(REGIONS)]
    if cfg.force is not None and not trunc:
        region = cfg.force.region
    name = f"{cfg.name}-{os.getpid()}-{cid}"
    path = os.path.join("/dev/shm", name)
    casedir = Path(tempfile.mkdtemp(prefix="hlfuzz-"))
    roles = ["creator"] + [f"joiner{i}" for i in range(1, cfg.innocents)]
    # a participant SIGKILLed right after the first write (so that the survivors recover it over the
    # corrupted tables); its own generator, so that the corruption plan does not depend on it
    with_victim = random.Random(f"hostless-fuzz:{cfg.seed}:{cid}:victim").random() < cfg.victims
    procs: list[_Proc] = []
    rec: dict[str, Any] = {"case": cid, "seed": cfg.seed, "region": region, "repro": _repro(cfg, cid)}
    rec["victim"] = with_victim
    # an innocent that joins right after the first write (like the CLI probes, with the full work)
    with_late = random.Random(f"hostless-fuzz:{cfg.seed}:{cid}:late").random() < cfg.late
    rec["late"] = with_late
    t0 = time.monotonic()
    try:
        for i, role in enumerate(roles):
            hook = cfg.hook if i == len(roles) - 1 else None
            procs.append(_spawn(role, name, casedir, f"{cfg.seed}:{cid}", hook))
        if with_victim:
            procs.append(_spawn("victim", name, casedir, f"{cfg.seed}:{cid}", None))
            procs[-1].victim = True
            roles.append("victim")
        ready: dict[str, dict[str, Any]] = {}
        limit = time.monotonic() + 60
        while len(ready) < len(roles):
            for p in procs:
                f = casedir / f"{p.role}.ready"
                if p.role not in ready and f.exists():
                    ready[p.role] = json.loads(f.read_text(encoding="utf-8"))
            dead = [p for p in procs if p.role not in ready and p.popen.poll() is not None]
            if dead or time.monotonic() > limit:
                for p in procs:
                    _stop(p)
                _reap(procs, time.monotonic() + 5)
                rec["outcome"] = "error"
                rec["why"] = "setup failed: " + (
                    f"{dead[0].role} exited with {dead[0].popen.returncode}"
                    if dead
                    else "no ready within 60 s"
                )
                # nothing was corrupted yet: whatever happened is not a finding about hostile memory
                # (but the run is not valid either: "error" fails it too)
                rec["innocents"] = [_classify(p, _san_reports(casedir, p.role)) for p in procs]
                return rec
            time.sleep(_POLL)
        snap = _snapshot(path, ready)
        if trunc:
            size, how, restore = _truncate_plan(rng, snap)
            rec.update(field="file size", target="file", offset=size, size=0, value=size, how=how)
        else:
            tg = _plan_target(rng, region, snap) if cfg.force is None else _forced_target(cfg.force, snap)
            if tg.ahead is None:
                with open(path, "rb") as fh:
                    fh.seek(tg.offset)
                    tg.orig = int.from_bytes(fh.read(tg.size), "little")
            value, how = _pick_value(rng, tg, snap)
            if cfg.force is not None:
                value, how = cfg.force.value, "given (--set)"
                if tg.field == "*":
                    if not isinstance(value, bytes):
                        raise ValueError("--set REGION.*=... takes hex:BYTES")
                    tg.offset, tg.size = tg.base, len(value)
                elif isinstance(value, int):
                    value &= (1 << (8 * tg.size)) - 1
                else:
                    value = value[: tg.size].ljust(tg.size, b"\x00")
            data = value if isinstance(value, bytes) else int(value).to_bytes(tg.size, "little")
            rec.update(field=tg.field, target=tg.target, offset=tg.offset, size=tg.size, how=how)
            if isinstance(value, bytes) or tg.size > 8:
                # a field wider than a word (a struct such as the name table) is recorded as its
                # bytes: as an int it can pass the 4300-digit limit of int -> str (and of JSON)
                rec["value"] = None
                rec["bytes"] = data.hex()
            else:
                rec["value"] = int(value)
                rec["value_hex"] = f"{int(value):#x}"
        pre = rng.uniform(0.02, 0.1)
        cli_cmd: list[str] | None = None
        if rng.random() < cfg.cli:
            cli_cmd = rng.choice([["info", name], ["info", name, "--json"], ["check", name]])
        mode = "write" if trunc or rng.random() < 0.7 else "toggle"
        # whole-struct cases: their own generator, so that the field plans do not depend on them
        wrng = random.Random(f"hostless-fuzz:{cfg.seed}:{cid}:whole")
        whole = not trunc and wrng.random() < cfg.whole and tg.span > 0
        if cfg.force is not None and not trunc:
            mode, whole = ("toggle" if cfg.force.toggle else "write"), False
        rec["mode"] = mode
        time.sleep(pre)
        fd = os.open(path, os.O_RDWR)
        try:
            if not trunc and tg.ahead is not None:
                # a slot about to be allocated: resolved now, from the live alloc_hint
                hf = abi_layout()["header"].fields["alloc_hint"]
                hint = int.from_bytes(os.pread(fd, hf.size, hf.offset), "little")
                idx = (hint + tg.ahead) % snap.header["fence_capacity"]
                tg.offset += snap.header["fences_offset"] + idx * abi_layout()["fence"].size
                tg.base += snap.header["fences_offset"] + idx * abi_layout()["fence"].size
                rec["offset"], rec["target"] = tg.offset, f"{tg.target} = slot {idx}"
            if whole:
                data, how = _whole_data(wrng, fd, tg)
                tg.offset, tg.size = tg.base, len(data)
                rec.update(field="*", offset=tg.offset, size=tg.size, how=how, value=None, bytes=data.hex())
                rec.pop("value_hex", None)
            orig = b"" if trunc else os.pread(fd, tg.size, tg.offset)
            for rep in range(2):
                if cfg.dry:
                    pass
                elif trunc:
                    if rep == 0:
                        os.ftruncate(fd, size)
                    elif restore:
                        os.ftruncate(fd, snap.total)
                elif mode == "toggle" and rep == 0:
                    rec["toggles"] = _toggle(fd, tg.offset, data, orig, cfg.window / 2)
                else:
                    os.pwrite(fd, data, tg.offset)
                if rep == 0:
                    for p in procs:
                        if p.victim:
                            p.popen.kill()
                if rep == 0 and with_late:
                    procs.append(_spawn("late", name, casedir, f"{cfg.seed}:{cid}", None))
                if rep == 0 and cli_cmd is not None:
                    procs.append(_spawn_cli(cli_cmd, "cli", casedir))
                    rec["cli"] = "hostless " + " ".join(cli_cmd)
                if mode == "write" or rep == 1:
                    time.sleep(cfg.window / 2)
        finally:
            os.close(fd)
        for p in procs:
            _stop(p)
        _reap(procs, time.monotonic() + cfg.deadline)
        rec["innocents"] = [_classify(p, _san_reports(casedir, p.role)) for p in procs]
        outs = {i["outcome"] for i in rec["innocents"]}
        rec["outcome"] = next(o for o in OUTCOMES if o in outs or o == "clean")
        errs: collections.Counter[str] = collections.Counter()
        for i in rec["innocents"]:
            errs.update(i.get("errors", {}))
        rec["errors_seen"] = dict(errs)
        if rec["outcome"] != "clean":
            rec["exact_repro"] = _exact_repro(cfg, rec)
    finally:
        for p in procs:
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait()
            _stop(p)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        shutil.rmtree(casedir, ignore_errors=True)
        rec["duration_s"] = round(time.monotonic() - t0, 2)
    return rec
