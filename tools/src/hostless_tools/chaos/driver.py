"""The chaos driver: one small domain, worker processes started, killed and replaced, then the
survivors stopped and the domain checked (:func:`run`)."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hostless._abi import FENCE_DTYPE
from hostless.domain import Domain

from .. import _tooling
from .model import WorkerConfig
from .record import _SLOT_FREE
from .waiters import _Waiters
from .worker import WORKER_MODULE


@dataclass
class _Proc:
    n: int
    proc: subprocess.Popen[bytes]
    log: Path
    err: Path
    started: float
    ready_at: float | None = None
    kill_at: float | None = None
    ended_at: float | None = None
    killed: bool = False
    stopping: bool = False
    pos: int = 0
    tail: bytes = b""
    stats: dict[str, Any] = field(default_factory=dict)
    lines: collections.Counter[str] = field(default_factory=collections.Counter)
    done: bool = False


def _fence_table(dom: Domain) -> Any:
    h = dom.header()
    return np.frombuffer(
        bytes(dom.raw()), dtype=FENCE_DTYPE, count=int(h["fence_capacity"]), offset=int(h["fences_offset"])
    ).copy()


def leaked_slots(dom: Domain, limit: int = 50) -> list[dict[str, int]]:
    """Fence-table slots that are not FREE or keep reference bits (call when nothing should be held)."""
    t = _fence_table(dom)
    ctl = t["ctl"].astype(np.uint64)
    state = (ctl & np.uint64(0xFF)).astype(np.int64)
    busy = np.nonzero((state != _SLOT_FREE) | (t["refs"] != 0))[0]
    return [
        {
            "slot": int(i),
            "state": int(state[i]),
            "kind": int((int(ctl[i]) >> 24) & 0xFF),
            "refs": int(t["refs"][i]),
            "word": int(t["word"][i]),
            "owner": int(t["owner"][i]),
        }
        for i in busy[:limit]
    ]


def run(
    *,
    workers: int = 3,
    seconds: float = 10.0,
    kills: int = 0,
    fences: int = 512,
    seed: int | None = None,
    mode: str = "mix",
    iterations: int = 0,
    nested: bool = True,
    buffers: bool = True,
    shared: bool = True,
    kill_delay: tuple[float, float] = (0.05, 0.4),
    hung_after: float = 5.0,
    waiters: int = 3,
    log_dir: str | os.PathLike[str] | None = None,
    tamper: Callable[[Domain], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the stress and return its result (see :func:`report_markdown` for the fields).

    ``workers`` run at once.  ``kills`` > 0: SIGKILL a worker
    ``kill_delay`` seconds (uniform) after it is ready and start another,
    until ``kills`` kills are done or ``seconds`` have passed; ``kills`` = 0:
    let them run ``seconds`` (mode ``"mix"``) or ``iterations`` loops each
    (mode ``"repro"``; ``seconds`` is then a time limit).  Then the survivors
    stop gracefully and the domain is checked.  ``result["ok"]`` is True when
    no anomaly, hung waiter, leak or check() finding was seen.

    ``tamper(dom)``, called about every 10 ms while workers run, is for tests of
    the harness itself (they write into the domain to make sure it notices).
    """
    if mode not in ("mix", "repro"):
        raise ValueError(f"mode must be 'mix' or 'repro', got {mode!r}")
    if workers < 1:
        raise ValueError("workers must be >= 1")
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    rnd = random.Random(seed)
    machine = _tooling.machine_info()
    config = {
        "workers": workers,
        "seconds": seconds,
        "kills": kills,
        "fences": fences,
        "seed": seed,
        "mode": mode,
        "iterations": iterations,
        "nested": nested,
        "buffers": buffers,
        "shared": shared,
        "kill_delay": list(kill_delay),
        "hung_after": hung_after,
    }
    say = progress or (lambda s: None)
    name = f"hlchaos-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    tmp = tempfile.TemporaryDirectory(prefix="hlchaos-") if log_dir is None else None
    logs = Path(tmp.name if tmp is not None else str(log_dir))
    logs.mkdir(parents=True, exist_ok=True)

    procs: list[_Proc] = []
    active: list[_Proc] = []
    anomalies: list[dict[str, Any]] = []
    counts: collections.Counter[str] = collections.Counter()
    kills_done = 0
    graceful = 0
    t0 = time.monotonic()

    def driver_anomaly(kind: str, detail: str, worker: int | None = None) -> None:
        counts[kind] += 1
        if len(anomalies) < 200:
            anomalies.append({"kind": kind, "detail": detail, "worker": worker})

    dom = Domain.create(
        name,
        fences=fences,
        participants=min(64, max(16, 2 * workers + 8)),
        heap="4M" if buffers else 0,
        watchdog_interval=0.02,
        label="chaos-driver",
    )
    ended_at: dict[int, float | None] = {}
    pool = _Waiters(dom, waiters, hung_after, lambda n: ended_at.get(n), seed) if shared else None
    try:

        def spawn() -> _Proc:
            n = len(procs) + 1
            cfg = WorkerConfig(
                seed=seed * 1000 + n,
                mode=mode,
                iterations=iterations,
                max_seconds=seconds + 120.0,
                nested=nested,
                buffers=buffers,
                shared=shared and rnd.random() < 0.5,
                watchdog=0.02 if rnd.random() < 0.5 else 0.0,
            )
            log, err = logs / f"w{n}.jsonl", logs / f"w{n}.err"
            log.write_bytes(b"")
            with open(err, "wb") as fe:
                proc = subprocess.Popen(
                    _tooling.child_command(
                        WORKER_MODULE, "worker", name, str(log), "--config", json.dumps(asdict(cfg))
                    ),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=fe,
                )
            p = _Proc(n, proc, log, err, time.monotonic())
            ended_at[n] = None
            procs.append(p)
            active.append(p)
            return p

        def read_log(p: _Proc) -> None:
            with open(p.log, "rb") as fh:
                fh.seek(p.pos)
                data = fh.read()
            p.pos += len(data)
            *lines, p.tail = (p.tail + data).split(b"\n")
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    driver_anomaly("worker_crash", f"unreadable log line {line[:200]!r}", p.n)
                    continue
                t = rec.get("t")
                if t == "ready":
                    p.ready_at = time.monotonic()
                elif t == "anomaly":
                    p.lines[rec["kind"]] += 1
                    if len(anomalies) < 200:
                        anomalies.append({"kind": rec["kind"], "detail": rec["detail"], "worker": p.n})
                elif t == "stats":
                    p.stats = rec
                elif t == "pub" and pool is not None:
                    pool.add(p.n, rec["kind"], int(rec["handle"]), int(rec["plan"]))
                elif t == "done":
                    p.done = True

        def reap_exited(p: _Proc) -> None:
            nonlocal kills_done, graceful
            rc = p.proc.wait()
            ended_at[p.n] = time.monotonic()
            active.remove(p)
            read_log(p)
            if p.killed and rc == -signal.SIGKILL:
                if p.ready_at is not None:
                    kills_done += 1
                return
            err = p.err.read_text(errors="replace")
            if rc == 0 and p.done and "Traceback" not in err:
                graceful += 1
            else:
                driver_anomaly("worker_crash", f"worker {p.n} exited with {rc}: {err[-1500:]}", p.n)

        def stuck(p: _Proc, why: str) -> None:
            driver_anomaly("worker_stuck", f"worker {p.n} {why}", p.n)
            p.killed = True
            p.proc.kill()  # SIGKILL, by pid: a process this driver started
            reap_exited(p)

        def poll() -> None:
            for p in list(active):
                read_log(p)
                if p.proc.poll() is not None:
                    reap_exited(p)

        say(f"chaos: seed {seed}, {workers} workers, {kills} kills, {fences} fence slots, mode {mode}")
        if kills > 0:
            deadline = t0 + seconds
            while kills_done < kills and time.monotonic() < deadline:
                while len(active) < workers:
                    spawn()
                poll()
                now = time.monotonic()
                for p in list(active):
                    if kills_done >= kills:
                        break  # exactly the kills asked for, even when two are due in one pass
                    if p.ready_at is not None and p.kill_at is None:
                        p.kill_at = p.ready_at + rnd.uniform(*kill_delay)
                    if p.kill_at is not None and now >= p.kill_at and not p.killed:
                        p.killed = True
                        p.proc.kill()  # SIGKILL, by pid: a process this driver started
                        reap_exited(p)
                if tamper is not None:
                    tamper(dom)
                time.sleep(0.01)
        else:
            for _ in range(workers):
                spawn()
            deadline = t0 + seconds
            while active and time.monotonic() < deadline:
                poll()
                if tamper is not None:
                    tamper(dom)
                time.sleep(0.01)
        run_s = time.monotonic() - t0

        # stop the survivors: SIGTERM once they are ready, SIGKILL (and an anomaly) if they do not leave
        stop_t = time.monotonic()
        while active and time.monotonic() - stop_t < 40:
            poll()
            for p in list(active):
                if p.ready_at is not None and not p.stopping:
                    p.stopping = True
                    p.proc.send_signal(signal.SIGTERM)
                elif p.ready_at is None and time.monotonic() - p.started > 20:
                    stuck(p, "never became ready")
            time.sleep(0.01)
        for p in list(active):
            stuck(p, "did not leave within 40 s of SIGTERM")

        # every worker is gone: the waiters' objects must all complete
        hung: list[str] = []
        shared_res: dict[str, Any] = {}
        if pool is not None:
            limit = time.monotonic() + hung_after + 5
            while time.monotonic() < limit:
                with pool.lock:
                    busy = bool(pool.items)
                if not busy:
                    break
                time.sleep(0.05)
            pool.close(hung_after + 5)
            if any(t.is_alive() for t in pool.threads):
                hung.append("a waiter thread did not return")
            hung += pool.hung
            for b in pool.bad:
                driver_anomaly("shared_status", b)
            shared_res = {
                "published": pool.published,
                "waits": sum(pool.statuses.values()),
                "statuses": dict(pool.statuses),
                "gone_before_import": pool.gone,
                "held_and_dropped": pool.held,
                "abandoned_owner_alive": pool.abandoned,
            }

        # recovery, then the domain must be consistent and empty
        dom.reap()
        t_end = time.monotonic() + 5
        while time.monotonic() < t_end and [p.id for p in dom.participants] != [dom.participant_id]:
            dom.reap()
            time.sleep(0.02)
        left = [
            f"{p.id} pid {p.pid} {p.label} {p.state}" for p in dom.participants if p.id != dom.participant_id
        ]
        findings = dom.check()
        for _ in range(10):
            if not findings:
                break
            time.sleep(0.1)
            dom.reap()
            findings = dom.check()
        leaks = leaked_slots(dom)
        heap_used = int(dom.heap_stats().get("used", 0)) if buffers else 0

        ops: collections.Counter[str] = collections.Counter()
        for p in procs:
            ops.update(p.stats.get("ops", {}))
            # the stats line counts every anomaly, the anomaly lines may be newer than it
            st = p.stats.get("anomalies", {})
            for k in set(st) | set(p.lines):
                counts[k] += max(int(st.get(k, 0)), p.lines[k])
        started = len(procs)
    finally:
        for p in list(active):
            if p.proc.poll() is None:
                p.proc.kill()
            p.proc.wait()
        if pool is not None:
            pool.stop.set()
        dom.close()
        try:
            Domain.unlink(name)
        except FileNotFoundError:
            pass
        if tmp is not None:
            tmp.cleanup()

    total = sum(counts.values())
    ok = total == 0 and not hung and not leaks and not findings and not left and heap_used == 0
    return {
        "kind": "chaos",
        "ok": ok,
        "config": config,
        "seed": seed,
        "machine": machine,
        "duration_s": round(time.monotonic() - t0, 2),
        "run_s": round(run_s, 2),
        "kills": kills_done,
        "workers_started": started,
        "workers_graceful": graceful,
        "ops": dict(sorted(ops.items())),
        "ops_total": sum(v for k, v in ops.items() if k != "full"),
        "anomalies_total": total,
        "anomaly_counts": dict(sorted(counts.items())),
        "anomalies": anomalies,
        "hung_waiters": len(hung),
        "hung": hung[:50],
        "shared": shared_res,
        "leaked_slots": leaks,
        "heap_used": heap_used,
        "participants_left": left,
        "check": findings[:100],
        "logs": None if tmp is not None else str(logs),
    }
