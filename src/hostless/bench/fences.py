"""The fence benchmark: cross-process signal -> wake round trips and fence throughput.

Everything is measured in ONE run on one machine, with two processes pinned to
two different CPUs when the machine has at least two:

hostless figures (process A signals, process B waits and answers, A waits):
  * ``timeline_spin``  two timelines ping-ponging (A: t1 = i, B: wait t1 >= i,
    t2 = i, A: wait t2 >= i), waits spinning (``spin`` = the domain's 50 us);
  * ``timeline_sleep`` the same with ``spin=0``: every wait sleeps on the futex;
  * ``fence_spin`` / ``fence_sleep`` one fresh fence per direction and round:
    N fence pairs are created ahead of time, their handles passed to B, and
    round i signals and waits on pair i.

references, measured in the same run:
  * ``c_spin`` / ``c_futex``: ``pingpong.c`` (compiled now with ``gcc -O2``),
    one 32-bit word on one cache line, busy-wait or FUTEX_WAIT/FUTEX_WAKE;
  * ``pipe``: ``multiprocessing.Pipe``, ``send_bytes`` / ``recv_bytes`` of one byte;
  * ``numpy_spin``: two u64 slots in ``multiprocessing.shared_memory``, each
    process storing into its slot with NumPy and spinning in Python until the
    other's slot changes (no semantics at all: the floor for Python code);
  * tachyon-ipc 0.5.1 is not re-measured: its p50 (3.4-5.7 us on the 2-core
    dev machine) comes from shared/measured.md.

throughput: create + signal + release of a fence from Python on one core,
through the public API and through the bare C core, median of several runs.

Every round trip is timed with one clock read per round (the interval between
consecutive rounds), in the C program as in the Python loops; the first
``warmup`` rounds are dropped.  :func:`run` returns a JSON-able dict,
:func:`write_results` writes it with a Markdown report.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import numpy as np

from . import (
    fmt_ns,
    fmt_ratio,
    machine_info,
    markdown_table,
    pin,
    pin_cpus,
    pinned,
    print_table,
    result_stem,
    summarize,
    write_json_md,
)

__all__ = [
    "FenceBenchConfig",
    "run",
    "evaluate_goals",
    "report_markdown",
    "write_results",
    "print_report",
    "TACHYON_P50_NS",
    "DEFAULT_OUT_DIR",
]

TACHYON_P50_NS = (3400.0, 5700.0)
"""tachyon-ipc 0.5.1 round trip p50 on the 2-core dev machine (shared/measured.md, 2026-11-30)."""

DEFAULT_OUT_DIR = "benchmarks/results"

_HANDSHAKE_TIMEOUT = 60.0
_Progress = Callable[[str], None]


@dataclass
class FenceBenchConfig:
    """Parameters of one run of the fence benchmark."""

    round_trips: int = 20_000
    """Measured round trips per latency figure (in total over the rounds)."""
    warmup: int = 1_000
    """Round trips run first and dropped, in every round."""
    rounds: int = 4
    """The figures are measured in this many interleaved rounds (figure 1, 2, ..., 1, 2, ...),
    so that a slow drift of the machine affects every figure alike."""
    throughput_ops: int = 200_000
    """create + signal + release per throughput run."""
    throughput_runs: int = 7
    """Throughput runs (after one dropped warm-up run); the median is reported."""
    spin: float = 50e-6
    """Spin budget (seconds) of a wait in spin mode; sleep mode uses 0."""
    pin: bool = True
    """Pin the two processes to two different CPUs when possible."""
    quick: bool = False

    @classmethod
    def quick_config(cls) -> FenceBenchConfig:
        """A small run (a few seconds): for demos and smoke tests."""
        return cls(
            round_trips=2_000, warmup=200, rounds=1, throughput_ops=20_000, throughput_runs=5, quick=True
        )


# --------------------------------------------------------------------------- peer process


def _peer_main(kind: str, conn: Connection, cpu: int | None, args: dict[str, Any]) -> None:
    """Process B of a round-trip figure (runs in a spawned process)."""
    try:
        pin(cpu)
        if kind in ("timeline", "fence"):
            _peer_hostless(kind, conn, args)
        elif kind == "numpy":
            _peer_numpy(conn, args)
        elif kind == "pipe":
            _peer_pipe(conn, args)
        else:
            raise ValueError(f"unknown peer kind {kind!r}")
        conn.send(("done", None))
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:
            pass
        raise
    finally:
        conn.close()


def _peer_hostless(kind: str, conn: Connection, args: dict[str, Any]) -> None:
    import hostless as hl

    dom = hl.Domain.open(args["name"], label="bench-peer")
    try:
        conn.send(("joined", dom.participant_id))
        msg, payload = conn.recv()
        if msg != "objects":
            raise RuntimeError(f"unexpected message {msg!r}")
        spin = float(args["spin"])
        total = int(args["total"])
        if kind == "timeline":
            h1, h2 = payload
            t1 = dom.import_timeline(h1)
            t2 = dom.import_timeline(h2)
            conn.send(("ready", None))
            wait, signal = t1.wait, t2.signal
            for i in range(1, total + 1):
                wait(i, None, spin=spin)
                signal(i)
            t1.release()
            t2.release()
        else:
            h1s, h2s = payload
            ins = [dom.import_fence(h) for h in h1s]
            outs = [dom.import_fence(h) for h in h2s]
            conn.send(("ready", None))
            for i in range(total):
                ins[i].wait(None, spin=spin)
                outs[i].signal()
            for f in ins + outs:
                f.release()
    finally:
        dom.close()


def _peer_numpy(conn: Connection, args: dict[str, Any]) -> None:
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(name=args["shm"])
    try:
        slots = np.ndarray((2,), dtype=np.uint64, buffer=shm.buf)
        total = int(args["total"])
        conn.send(("ready", None))
        for i in range(1, total + 1):
            while slots[0] < i:
                pass
            slots[1] = i
        del slots
    finally:
        shm.close()


def _peer_pipe(conn: Connection, args: dict[str, Any]) -> None:
    data: Connection = args["data"]
    total = int(args["total"])
    conn.send(("ready", None))
    recv, send = data.recv_bytes, data.send_bytes
    for _ in range(total):
        send(recv())
    data.close()


# --------------------------------------------------------------------------- process A


class _Peer:
    """A spawned process B with its control connection."""

    def __init__(self, kind: str, cpu: int | None, args: dict[str, Any]) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_peer_main, args=(kind, child_conn, cpu, args), daemon=True)
        self.proc.start()
        child_conn.close()

    def expect(self, what: str, timeout: float = _HANDSHAKE_TIMEOUT) -> Any:
        if not self.conn.poll(timeout):
            raise RuntimeError(f"benchmark peer sent nothing within {timeout} s (waiting for {what!r})")
        msg, payload = self.conn.recv()
        if msg == "error":
            raise RuntimeError(f"benchmark peer failed:\n{payload}")
        if msg != what:
            raise RuntimeError(f"benchmark peer sent {msg!r}, expected {what!r}")
        return payload

    def finish(self) -> None:
        self.expect("done")
        self.proc.join(10)

    def close(self) -> None:
        if self.proc.is_alive():
            self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


def _domain_name(tag: str) -> str:
    return f"hostless-bench-{tag}-{os.getpid()}-{secrets.token_hex(3)}"


def _hostless_pair(
    kind: str, mode: str, cfg: FenceBenchConfig, cpus: tuple[int | None, int | None]
) -> np.ndarray[Any, Any]:
    """Round trips between two processes through hostless timelines or fences."""
    import hostless as hl

    total = cfg.round_trips + cfg.warmup
    spin = cfg.spin if mode == "spin" else 0.0
    n_fences = 2 * total + 64 if kind == "fence" else 64
    name = _domain_name(kind)
    dom = hl.Domain.create(name, fences=n_fences, participants=4, spin=cfg.spin)
    peer: _Peer | None = None
    try:
        peer = _Peer(kind, cpus[1], {"name": name, "spin": spin, "total": total})
        peer_id = int(peer.expect("joined"))
        # B signals the objects of the B -> A direction: B owns them, so if B
        # dies, recovery fails them with OWNER_DIED and this loop cannot hang.
        samples = [0] * total
        clock = time.perf_counter_ns
        if kind == "timeline":
            t1 = dom.timeline(0)
            t2 = dom.timeline(0, owner=peer_id)
            peer.conn.send(("objects", (t1.handle, t2.handle)))
            peer.expect("ready")
            signal, wait = t1.signal, t2.wait
            t0 = clock()
            for i in range(1, total + 1):
                signal(i)
                wait(i, None, spin=spin)
                t = clock()
                samples[i - 1] = t - t0
                t0 = t
            # t2.failure is no test: B owns t2, and a timeline's owner leaving the
            # domain (B's close after its loop) fails it with OWNER_DIED by design.
            # A death mid-run fails it below `total`; value is the value it had.
            reached = t2.value
            peer.finish()
            t1.release()
            t2.release()
            if reached != total:
                raise RuntimeError(f"benchmark peer failed: timeline reached {reached} of {total}")
        else:
            outs = [dom.fence() for _ in range(total)]
            ins = [dom.fence(owner=peer_id) for _ in range(total)]
            peer.conn.send(("objects", ([f.handle for f in outs], [f.handle for f in ins])))
            peer.expect("ready")
            t0 = clock()
            for i in range(total):
                outs[i].signal()
                ins[i].wait(None, spin=spin)
                t = clock()
                samples[i] = t - t0
                t0 = t
            bad = sum(1 for f in ins if f.status is not hl.Status.SUCCESS)
            peer.finish()
            for f in outs + ins:
                f.release()
            if bad:
                raise RuntimeError(f"benchmark peer failed: {bad} fences not signaled SUCCESS")
        return np.asarray(samples[cfg.warmup :], dtype=np.int64)
    finally:
        if peer is not None:
            peer.close()
        dom.close()
        try:
            hl.Domain.unlink(name)
        except FileNotFoundError:
            pass


def _numpy_pair(cfg: FenceBenchConfig, cpus: tuple[int | None, int | None]) -> np.ndarray[Any, Any]:
    """Plain NumPy spin loop on multiprocessing.shared_memory (two u64 slots)."""
    from multiprocessing import shared_memory

    total = cfg.round_trips + cfg.warmup
    shm = shared_memory.SharedMemory(create=True, size=64)
    peer: _Peer | None = None
    abort = threading.Event()
    try:
        slots = np.ndarray((2,), dtype=np.uint64, buffer=shm.buf)
        slots[:] = 0
        peer = _Peer("numpy", cpus[1], {"shm": shm.name, "total": total})
        peer.expect("ready")

        def guard(view: np.ndarray[Any, Any], proc: mp.process.BaseProcess) -> None:
            # if B dies, release A's spin loop (it waits for slot 1 >= i)
            while not abort.wait(0.2):
                if not proc.is_alive():
                    view[1] = np.uint64(1 << 62)
                    return

        g = threading.Thread(target=guard, args=(slots, peer.proc), daemon=True)
        g.start()
        samples = [0] * total
        clock = time.perf_counter_ns
        t0 = clock()
        for i in range(1, total + 1):
            slots[0] = i
            while slots[1] < i:
                pass
            t = clock()
            samples[i - 1] = t - t0
            t0 = t
        abort.set()
        g.join()
        if int(slots[1]) != total:
            raise RuntimeError("numpy benchmark peer died")
        peer.finish()
        del slots
        return np.asarray(samples[cfg.warmup :], dtype=np.int64)
    finally:
        abort.set()
        if peer is not None:
            peer.close()
        shm.close()
        shm.unlink()


def _pipe_pair(cfg: FenceBenchConfig, cpus: tuple[int | None, int | None]) -> np.ndarray[Any, Any]:
    """multiprocessing.Pipe round trip of one byte."""
    total = cfg.round_trips + cfg.warmup
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    peer: _Peer | None = None
    try:
        peer = _Peer("pipe", cpus[1], {"data": theirs, "total": total})
        theirs.close()
        peer.expect("ready")
        samples = [0] * total
        clock = time.perf_counter_ns
        send, recv = mine.send_bytes, mine.recv_bytes
        msg = b"x"
        t0 = clock()
        for i in range(total):
            send(msg)
            recv()
            t = clock()
            samples[i] = t - t0
            t0 = t
        peer.finish()
        return np.asarray(samples[cfg.warmup :], dtype=np.int64)
    finally:
        if peer is not None:
            peer.close()
        mine.close()


def _c_pair(
    mode: str, cfg: FenceBenchConfig, cpus: tuple[int | None, int | None], exe: str
) -> dict[str, Any]:
    """Run the compiled pingpong reference; returns its JSON (samples_ns, pinned)."""
    a = -1 if cpus[0] is None else cpus[0]
    b = -1 if cpus[1] is None else cpus[1]
    cmd = [exe, mode, str(cfg.round_trips), str(cfg.warmup), str(a), str(b)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def _compile_pingpong(workdir: str) -> tuple[str | None, str | None]:
    """Compile the package's pingpong.c with gcc -O2; returns (executable, error)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        return None, "no C compiler (gcc) found"
    src = Path(__file__).with_name("pingpong.c")
    if not src.exists():
        return None, f"{src} is missing from the installed package"
    exe = os.path.join(workdir, "pingpong")
    out = subprocess.run([gcc, "-O2", "-o", exe, str(src)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return None, f"gcc failed: {out.stderr.strip()[:2000]}"
    return exe, None


# --------------------------------------------------------------------------- throughput


def _throughput(cfg: FenceBenchConfig) -> dict[str, Any]:
    """create + signal + release per second, from Python, on one core."""
    import hostless as hl
    from hostless._abi import C

    name = _domain_name("tput")
    dom = hl.Domain.create(name, fences=4096, participants=4)
    try:
        n = cfg.throughput_ops
        clock = time.perf_counter_ns

        def api_run() -> float:
            fence = dom.fence
            t0 = clock()
            for _ in range(n):
                f = fence()
                f.signal()
                f.release()
            return n / ((clock() - t0) / 1e9)

        core = cast(Any, dom)._core
        kind, success = int(C.KIND_FENCE), int(hl.Status.SUCCESS)

        def core_run() -> float:
            create, signal, release = core.create, core.signal, core.release
            t0 = clock()
            for _ in range(n):
                h = create(kind, 0)
                signal(h, success)
                release(h)
            return n / ((clock() - t0) / 1e9)

        out: dict[str, Any] = {}
        for label, fn in (("api", api_run), ("core", core_run)):
            try:
                fn()  # warm-up, dropped
            except Exception:
                if label == "api":
                    raise
                continue  # the internal _core API changed: the informational figure is left out
            runs = [fn() for _ in range(cfg.throughput_runs)]
            out[label] = {
                "ops_per_s_median": float(np.median(runs)),
                "ops_per_s_min": float(min(runs)),
                "ops_per_s_max": float(max(runs)),
                "runs": runs,
                "ops_per_run": n,
            }
        return out
    finally:
        dom.close()
        try:
            hl.Domain.unlink(name)
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- the run


LATENCY_FIGURES: dict[str, str] = {
    "timeline_spin": "hostless timelines, spin mode",
    "timeline_sleep": "hostless timelines, sleep mode (spin=0)",
    "fence_spin": "hostless fence per round, spin mode",
    "fence_sleep": "hostless fence per round, sleep mode (spin=0)",
    "c_spin": "C spin ping-pong, one cache line",
    "c_futex": "C futex ping-pong, one cache line",
    "numpy_spin": "NumPy spin loop on shared_memory",
    "pipe": "multiprocessing.Pipe (send_bytes/recv_bytes)",
}


def run(cfg: FenceBenchConfig | None = None, progress: _Progress | None = None) -> dict[str, Any]:
    """Run the whole fence benchmark; returns a JSON-able dict (see module doc).

    ``progress`` receives one line per step (default: printed to stderr).
    """
    cfg = cfg or FenceBenchConfig()
    if cfg.round_trips < 1 or cfg.warmup < 0 or cfg.throughput_ops < 1 or cfg.throughput_runs < 1:
        raise ValueError("round_trips, throughput_ops and throughput_runs must be >= 1, warmup >= 0")
    if not 1 <= cfg.rounds <= cfg.round_trips:
        raise ValueError("rounds must be in 1..round_trips")

    def say(msg: str) -> None:
        if progress is not None:
            progress(msg)
        else:
            print(msg, file=sys.stderr, flush=True)

    cpus = pin_cpus() if cfg.pin else (None, None)
    started = time.monotonic()
    result: dict[str, Any] = {
        "benchmark": "fences",
        "machine": machine_info(),
        "config": asdict(cfg),
        "pinned": cpus[0] is not None,
        "cpus": list(cpus),
        "latency": {},
        "errors": {},
    }
    lat: dict[str, Any] = result["latency"]
    errors: dict[str, str] = result["errors"]
    # one round's share of the round trips (the last round takes the rest)
    shares = [cfg.round_trips // cfg.rounds] * cfg.rounds
    shares[-1] += cfg.round_trips - sum(shares)

    with tempfile.TemporaryDirectory(prefix="hostless-bench-") as tmp, pinned(cpus[0]):
        exe, err = _compile_pingpong(tmp)
        if err:
            errors["c_spin"] = errors["c_futex"] = err
            say(f"C references skipped: {err}")
        steps: list[tuple[str, Callable[[FenceBenchConfig], np.ndarray[Any, Any]]]] = []
        c_pinned: dict[str, bool] = {}
        if exe is not None:
            cexe = exe
            for mode in ("spin", "futex"):

                def c_step(rc: FenceBenchConfig, mode: str = mode) -> np.ndarray[Any, Any]:
                    data = _c_pair(mode, rc, cpus, cexe)
                    c_pinned[mode] = bool(data.get("pinned"))
                    return np.asarray(data["samples_ns"], dtype=np.int64)

                steps.append((f"c_{mode}", c_step))
        for kind in ("timeline", "fence"):
            for mode in ("spin", "sleep"):

                def h_step(rc: FenceBenchConfig, kind: str = kind, mode: str = mode) -> np.ndarray[Any, Any]:
                    return _hostless_pair(kind, mode, rc, cpus)

                steps.append((f"{kind}_{mode}", h_step))
        steps.append(("numpy_spin", lambda rc: _numpy_pair(rc, cpus)))
        steps.append(("pipe", lambda rc: _pipe_pair(rc, cpus)))

        groups: dict[str, list[np.ndarray[Any, Any]]] = {key: [] for key, _ in steps}
        for r, share in enumerate(shares):
            rc = replace(cfg, round_trips=share)
            say(f"round {r + 1}/{cfg.rounds}: {share} round trips per figure")
            for key, step in steps:
                if key in errors:
                    continue
                try:
                    groups[key].append(step(rc))
                except Exception as e:  # keep the other figures
                    errors[key] = f"{type(e).__name__}: {e}"
                    say(f"  {LATENCY_FIGURES[key]}: FAILED: {errors[key]}")
                    continue
                g = groups[key][-1]
                say(f"  {LATENCY_FIGURES[key]}: p50 {fmt_ns(float(np.median(g)))}")
        for key, _ in steps:
            if key in errors or not groups[key]:
                continue
            st = summarize(np.concatenate(groups[key]), groups=groups[key])
            lat[key] = {"label": LATENCY_FIGURES[key], **st}
            if key.startswith("c_"):
                lat[key]["pinned"] = c_pinned.get(key[2:], False)
        say(f"throughput: create+signal+release, {cfg.throughput_runs} runs x {cfg.throughput_ops}")
        try:
            result["throughput"] = _throughput(cfg)
            tp = result["throughput"]
            say(f"  {tp['api']['ops_per_s_median']:,.0f} ops/s through the API")
        except Exception as e:
            errors["throughput"] = f"{type(e).__name__}: {e}"
            say(f"  FAILED: {errors['throughput']}")
    result["goals"] = evaluate_goals(result)
    result["duration_s"] = round(time.monotonic() - started, 2)
    return result


# --------------------------------------------------------------------------- goals and reports


def _p(result: dict[str, Any], key: str, q: str = "p50") -> float | None:
    fig = result["latency"].get(key)
    return None if fig is None else float(fig[q])


def evaluate_goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Compare the hostless figures with the references and the project's goals.

    Ratios are of medians (p50); the p99 ratio is given beside.  ``met`` is
    None when a figure or its reference is missing.
    """
    goals: list[dict[str, Any]] = []

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or b == 0 else a / b

    def latency_goal(key: str, ref: str, goal: str, limit: float, faster_by: bool = False) -> None:
        v50, v99 = _p(result, key), _p(result, key, "p99")
        r50, r99 = _p(result, ref), _p(result, ref, "p99")
        if faster_by:  # reference / hostless must be >= limit
            r, rp = ratio(r50, v50), ratio(r99, v99)
            met = None if r is None else r >= limit
            ref_text = f"{LATENCY_FIGURES[ref]} / this"
        else:  # hostless / reference must be <= limit
            r, rp = ratio(v50, r50), ratio(v99, r99)
            met = None if r is None else r <= limit
            ref_text = f"this / {LATENCY_FIGURES[ref]}"
        goals.append(
            {
                "figure": key,
                "label": LATENCY_FIGURES[key],
                "p50_ns": v50,
                "p99_ns": v99,
                "reference": ref,
                "ratio_of": ref_text,
                "ratio": r,
                "ratio_p99": rp,
                "goal": goal,
                "met": met,
            }
        )

    for key in ("timeline_spin", "fence_spin"):
        latency_goal(key, "c_spin", "<= 3x C spin", 3.0)
        latency_goal(key, "numpy_spin", "<= 1x NumPy spin loop", 1.0)
        latency_goal(key, "pipe", ">= 50x faster than Pipe", 50.0, faster_by=True)
        v50 = _p(result, key)
        goals.append(
            {
                "figure": key,
                "label": LATENCY_FIGURES[key],
                "p50_ns": v50,
                "p99_ns": _p(result, key, "p99"),
                "reference": "tachyon",
                "ratio_of": "this / tachyon-ipc p50 (3.4 us, low end, measured.md)",
                "ratio": None if v50 is None else v50 / TACHYON_P50_NS[0],
                "ratio_p99": None,
                "goal": "faster than tachyon-ipc (p50 < 3.4 us)",
                "met": None if v50 is None else v50 < TACHYON_P50_NS[0],
            }
        )
    for key in ("timeline_sleep", "fence_sleep"):
        latency_goal(key, "c_futex", "<= 1.3x C futex", 1.3)
    tp = result.get("throughput")
    if tp is not None:
        v = float(tp["api"]["ops_per_s_median"])
        goals.append(
            {
                "figure": "throughput",
                "label": "create+signal+release, Python API, one core",
                "ops_per_s": v,
                "ops_per_s_min": float(tp["api"]["ops_per_s_min"]),
                "ops_per_s_max": float(tp["api"]["ops_per_s_max"]),
                "reference": "goal",
                "ratio_of": "this / 1M ops/s",
                "ratio": v / 1e6,
                "ratio_p99": None,
                "goal": ">= 1M ops/s",
                "met": v >= 1e6,
            }
        )
    return goals


def _met(m: bool | None) -> str:
    return "n/a" if m is None else ("yes" if m else "NO")


def _ops(v: float) -> str:
    return f"{v / 1e6:.2f} M/s" if v >= 1e6 else f"{v / 1e3:.0f} k/s"


def goal_rows(result: dict[str, Any]) -> list[list[str]]:
    """Rows of the goals table: figure, p50, p99, ratio, goal, met?"""
    rows = []
    for g in result["goals"]:
        if g["figure"] == "throughput":
            rows.append(
                [
                    g["label"],
                    f"{_ops(g['ops_per_s'])} (median)",
                    f"{_ops(g['ops_per_s_min'])}-{_ops(g['ops_per_s_max'])}",
                    f"{fmt_ratio(g['ratio'])} of 1M/s",
                    g["goal"],
                    _met(g["met"]),
                ]
            )
            continue
        r = fmt_ratio(g["ratio"])
        if g["ratio_p99"] is not None:
            r += f" (p99 {fmt_ratio(g['ratio_p99'])})"
        ref = g["reference"]
        ref_name = {"c_spin": "C spin", "c_futex": "C futex", "numpy_spin": "NumPy spin", "pipe": "Pipe"}.get(
            ref, "tachyon"
        )
        r += f" vs {ref_name}" if ref != "pipe" else " faster than Pipe"
        rows.append([g["label"], fmt_ns(g["p50_ns"]), fmt_ns(g["p99_ns"]), r, g["goal"], _met(g["met"])])
    return rows


def latency_rows(result: dict[str, Any]) -> list[list[str]]:
    """Rows of the round-trip table: figure, n, min, p50 (block spread), p90, p99, mean."""
    rows = []
    for key, label in LATENCY_FIGURES.items():
        f = result["latency"].get(key)
        if f is None:
            err = result["errors"].get(key, "not measured")
            rows.append([label, "-", "-", "-", "-", "-", "-", f"not measured: {err}"])
            continue
        rows.append(
            [
                label,
                f"{int(f['n'])}",
                fmt_ns(f["min"]),
                fmt_ns(f["p50"]),
                fmt_ns(f["p90"]),
                fmt_ns(f["p99"]),
                fmt_ns(f["mean"]),
                f"{fmt_ns(f['p50_lo'])} - {fmt_ns(f['p50_hi'])}",
            ]
        )
    return rows


GOAL_HEADERS = ["figure", "p50", "p99", "ratio (of p50)", "goal", "met?"]
LATENCY_HEADERS = ["round trip", "n", "min", "p50", "p90", "p99", "mean", "p50 spread"]
THROUGHPUT_HEADERS = ["throughput", "median", "min", "max", "runs x ops"]


def throughput_rows(result: dict[str, Any]) -> list[list[str]]:
    tp = result.get("throughput")
    if not tp:
        return []
    labels = {"api": "create+signal+release, Python API", "core": "create+signal+release, bare _core calls"}
    return [
        [
            labels[k],
            _ops(v["ops_per_s_median"]),
            _ops(v["ops_per_s_min"]),
            _ops(v["ops_per_s_max"]),
            f"{len(v['runs'])} x {v['ops_per_run']}",
        ]
        for k, v in tp.items()
    ]


def report_markdown(result: dict[str, Any]) -> str:
    """The readable report of one run."""
    m = result["machine"]
    cfg = result["config"]
    pinned = (
        f"pinned to CPUs {result['cpus'][0]} and {result['cpus'][1]} (os.sched_setaffinity)"
        if result["pinned"]
        else "NOT pinned (fewer than two CPUs available, or pinning disabled)"
    )
    lines = [
        f"# hostless fence benchmark: {m['hostname']}, {m['date']}",
        "",
        f"- machine: {m['cpu_model']}, {m['nproc']} CPUs, Linux {m['kernel']} ({m['machine']}); "
        f"load average at start {m['loadavg_at_start']}",
        f"- software: Python {m['python']}, NumPy {m['numpy']}, hostless {m['hostless']}"
        f"{' (git ' + m['git'] + ')' if m.get('git') else ''}, {m['gcc'] or 'no gcc'}",
        f"- two processes {pinned}; the peer is a spawned process",
        f"- {cfg['round_trips']} round trips per figure in {cfg['rounds']} round(s), each after "
        f"{cfg['warmup']} dropped warm-up round trips"
        f"{' (--quick run)' if cfg['quick'] else ''}; spin mode waits with spin={cfg['spin'] * 1e6:g} us"
        f"{' (the domain default)' if cfg['spin'] == 50e-6 else ''}, sleep mode with spin=0",
        f"- run took {result.get('duration_s', '?')} s",
        "",
        "## Goals",
        "",
        "Ratios are of medians (p50), with the p99 ratio in brackets; all figures come from this one run "
        "except tachyon-ipc's, taken from shared/measured.md.",
        "",
        markdown_table(GOAL_HEADERS, goal_rows(result)),
        "",
        "## Round trips between two processes",
        "",
        "A signals, B wakes and signals back, A wakes: one clock read per round. "
        "The figures are measured in "
        + (
            f"{cfg['rounds']} interleaved rounds (every figure once per round, so that a drift of the "
            "machine affects all alike); the p50 spread is the lowest and highest median of the rounds."
            if cfg["rounds"] > 1
            else "one round; the p50 spread is the lowest and highest median of 5 consecutive blocks."
        ),
        "",
        markdown_table(LATENCY_HEADERS, latency_rows(result)),
        "",
    ]
    trows = throughput_rows(result)
    if trows:
        lines += [
            "## Throughput on one core",
            "",
            "A loop of `f = dom.fence(); f.signal(); f.release()` (and the same three calls on the C "
            "core directly); median of the runs, after one dropped warm-up run.",
            "",
            markdown_table(THROUGHPUT_HEADERS, trows),
            "",
        ]
    if result["errors"]:
        lines += ["## Errors", ""] + [f"- {k}: {v}" for k, v in result["errors"].items()] + [""]
    lines += [
        "## How each figure is measured",
        "",
        "- hostless timelines: A `t1.signal(i)`, B `t1.wait(i)` then `t2.signal(i)`, A `t2.wait(i)`. "
        "No object is created per round.",
        "- hostless fence per round: A creates N fence pairs ahead of time (B -> A fences owned by B) and "
        "sends the handles; B imports them; round i signals and waits on pair i.",
        "- C references: `src/hostless/bench/pingpong.c`, compiled at run time with `gcc -O2`; one "
        "32-bit word on one cache line; spin = busy-wait, futex = FUTEX_WAIT at once and FUTEX_WAKE "
        "after every store.",
        "- NumPy spin loop: two u64 slots in `multiprocessing.shared_memory`; each side stores with "
        "NumPy and spins in Python until the other's slot changes.",
        "- multiprocessing.Pipe: one byte with `send_bytes` / `recv_bytes` each way.",
        "",
        "Reproduce: `hostless bench fences` (see benchmarks/README.md).",
        "",
    ]
    return "\n".join(lines)


def write_results(
    result: dict[str, Any], out_dir: str | os.PathLike[str] = DEFAULT_OUT_DIR
) -> tuple[Path, Path]:
    """Write ``fences-<host>-<date>.json`` and ``.md`` into ``out_dir``; returns both paths."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    js, md = write_json_md(d / result_stem("fences", result), result, report_markdown(result))
    return Path(js), Path(md)


def print_report(result: dict[str, Any], *, plain: bool = False) -> None:
    """Print the goals, round-trip and throughput tables to the terminal."""
    print_table("hostless fence benchmark: goals", GOAL_HEADERS, goal_rows(result), plain=plain)
    print_table("round trips between two processes", LATENCY_HEADERS, latency_rows(result), plain=plain)
    trows = throughput_rows(result)
    if trows:
        print_table("throughput on one core", THROUGHPUT_HEADERS, trows, plain=plain)
    if result["errors"]:
        for k, v in result["errors"].items():
            print(f"error in {k}: {v}")
