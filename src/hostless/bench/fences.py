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
  * ``pipe``: ``multiprocessing.Pipe``, ``send_bytes`` / ``recv_bytes`` of one byte,
    both sides blocking in ``recv_bytes`` (in the kernel): the like-for-like peer of
    hostless's sleep mode;
  * ``pipe_poll``: the same Pipe, both sides spinning on ``poll()`` before each
    ``recv_bytes``: the like-for-like peer of hostless's spin mode;
  * ``numpy_spin``: two u64 slots in ``multiprocessing.shared_memory``, each
    process storing into its slot with NumPy and spinning in Python until the
    other's slot changes (no semantics at all: the floor for Python code);
  * peers that are not measured here (tachyon-ipc) are not compared with: a
    figure measured elsewhere judges nothing about this machine.

throughput: create + signal + release of a fence from Python on one core,
through the public API and through the bare C core, median of several runs.

Every round trip is timed with one clock read per round (the interval between
consecutive rounds), in the C program as in the Python loops; the first
``warmup`` rounds are dropped.  :func:`run` returns a JSON-able dict,
:func:`write_results` writes it with a Markdown report (goals and reports:
:mod:`hostless.bench.fences_report`).
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from .fences_report import (
    DEFAULT_OUT_DIR,
    LATENCY_FIGURES,
    evaluate_goals,
    print_report,
    report_markdown,
    write_results,
)
from .harness import (
    Child,
    Progress,
    Recorder,
    compile_c,
    core,
    core_fence_kind,
    drop_domain,
    finish,
    new_domain,
    new_result,
    pin_cpus,
    pinned,
    rate_figures,
    run_json,
    scratch_dir,
    summarize,
    temp_domain,
)
from .report import fmt_ns

__all__ = [
    "FenceBenchConfig",
    "run",
    "evaluate_goals",
    "report_markdown",
    "write_results",
    "print_report",
    "LATENCY_FIGURES",
    "DEFAULT_OUT_DIR",
]


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


def _peer_main(conn: Connection, kind: str, args: dict[str, Any]) -> None:
    """Process B of a round-trip figure (runs in a spawned :class:`~hostless.bench.harness.Child`)."""
    if kind in ("timeline", "fence"):
        _peer_hostless(kind, conn, args)
    elif kind == "numpy":
        _peer_numpy(conn, args)
    elif kind == "pipe":
        _peer_pipe(conn, args)
    elif kind == "pipe_poll":
        _peer_pipe_poll(conn, args)
    else:
        raise ValueError(f"unknown peer kind {kind!r}")


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


def _peer_pipe_poll(conn: Connection, args: dict[str, Any]) -> None:
    data: Connection = args["data"]
    total = int(args["total"])
    conn.send(("ready", None))
    poll, recv, send = data.poll, data.recv_bytes, data.send_bytes
    for _ in range(total):
        while not poll():
            pass
        send(recv())
    data.close()


# --------------------------------------------------------------------------- process A


def _peer(kind: str, cpu: int | None, args: dict[str, Any]) -> Child:
    return Child(_peer_main, (kind, args), cpu)


def _hostless_pair(
    kind: str, mode: str, cfg: FenceBenchConfig, cpus: tuple[int | None, int | None]
) -> np.ndarray[Any, Any]:
    """Round trips between two processes through hostless timelines or fences."""
    import hostless as hl

    total = cfg.round_trips + cfg.warmup
    spin = cfg.spin if mode == "spin" else 0.0
    n_fences = 2 * total + 64 if kind == "fence" else 64
    dom, name = new_domain(kind, fences=n_fences, participants=4, spin=cfg.spin)
    peer: Child | None = None
    try:
        peer = _peer(kind, cpus[1], {"name": name, "spin": spin, "total": total})
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
        drop_domain(dom, name)


def _numpy_pair(cfg: FenceBenchConfig, cpus: tuple[int | None, int | None]) -> np.ndarray[Any, Any]:
    """Plain NumPy spin loop on multiprocessing.shared_memory (two u64 slots)."""
    from multiprocessing import shared_memory

    total = cfg.round_trips + cfg.warmup
    shm = shared_memory.SharedMemory(create=True, size=64)
    peer: Child | None = None
    abort = threading.Event()
    try:
        slots = np.ndarray((2,), dtype=np.uint64, buffer=shm.buf)
        slots[:] = 0
        peer = _peer("numpy", cpus[1], {"shm": shm.name, "total": total})
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


def _pipe_pair(
    cfg: FenceBenchConfig, cpus: tuple[int | None, int | None], spin: bool = False
) -> np.ndarray[Any, Any]:
    """multiprocessing.Pipe round trip of one byte: both sides block in ``recv_bytes``,
    or with ``spin`` both spin on ``poll()`` first (no wait in the kernel)."""
    total = cfg.round_trips + cfg.warmup
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    peer: Child | None = None
    try:
        peer = _peer("pipe_poll" if spin else "pipe", cpus[1], {"data": theirs, "total": total})
        theirs.close()
        peer.expect("ready")
        samples = [0] * total
        clock = time.perf_counter_ns
        send, recv, poll = mine.send_bytes, mine.recv_bytes, mine.poll
        msg = b"x"
        t0 = clock()
        if spin:
            alive = peer.proc.is_alive
            for i in range(total):
                send(msg)
                spins = 0
                while not poll():
                    spins += 1
                    if spins & 0xFFFF == 0 and not alive():  # a dead peer ends the spin
                        raise RuntimeError("benchmark peer died (Pipe, polled)")
                recv()
                t = clock()
                samples[i] = t - t0
                t0 = t
        else:
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
    return run_json([exe, mode, str(cfg.round_trips), str(cfg.warmup), str(a), str(b)])


# --------------------------------------------------------------------------- throughput


def _throughput(cfg: FenceBenchConfig) -> dict[str, Any]:
    """create + signal + release per second, from Python, on one core."""
    import hostless as hl

    with temp_domain("tput", fences=4096, participants=4) as dom:
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

        kind, success = core_fence_kind(), int(hl.Status.SUCCESS)

        def core_run() -> float:
            c = core(dom)
            create, signal, release = c.create, c.signal, c.release
            t0 = clock()
            for _ in range(n):
                h = create(kind, 0)
                signal(h, success)
                release(h)
            return n / ((clock() - t0) / 1e9)

        return rate_figures({"api": api_run, "core": core_run}, cfg.throughput_runs, n)


# --------------------------------------------------------------------------- the run


def run(cfg: FenceBenchConfig | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Run the whole fence benchmark; returns a JSON-able dict (see module doc).

    ``progress`` receives one line per step (default: printed to stderr).
    """
    cfg = cfg or FenceBenchConfig()
    if cfg.round_trips < 1 or cfg.warmup < 0 or cfg.throughput_ops < 1 or cfg.throughput_runs < 1:
        raise ValueError("round_trips, throughput_ops and throughput_runs must be >= 1, warmup >= 0")
    if not 1 <= cfg.rounds <= cfg.round_trips:
        raise ValueError("rounds must be in 1..round_trips")

    cpus = pin_cpus() if cfg.pin else (None, None)
    started = time.monotonic()
    result = new_result("fences", cfg, pinned=cpus[0] is not None, cpus=list(cpus), latency={})
    lat: dict[str, Any] = result["latency"]
    errors: dict[str, str] = result["errors"]
    rec = Recorder(errors, progress)
    say = rec.say
    # one round's share of the round trips (the last round takes the rest)
    shares = [cfg.round_trips // cfg.rounds] * cfg.rounds
    shares[-1] += cfg.round_trips - sum(shares)

    with scratch_dir() as tmp, pinned(cpus[0]):
        exe, err = compile_c(Path(__file__).with_name("pingpong.c"), tmp, "pingpong")
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
        steps.append(("pipe_poll", lambda rc: _pipe_pair(rc, cpus, spin=True)))

        groups: dict[str, list[np.ndarray[Any, Any]]] = {key: [] for key, _ in steps}
        for r, share in enumerate(shares):
            rc = replace(cfg, round_trips=share)
            say(f"round {r + 1}/{cfg.rounds}: {share} round trips per figure")
            for key, step in steps:
                if key in errors:
                    continue
                g = rec.attempt(key, functools.partial(step, rc), LATENCY_FIGURES[key])
                if g is None:  # keep the other figures
                    continue
                groups[key].append(g)
                say(f"  {LATENCY_FIGURES[key]}: p50 {fmt_ns(float(np.median(g)))}")
        for key, _ in steps:
            if key in errors or not groups[key]:
                continue
            st = summarize(np.concatenate(groups[key]), groups=groups[key])
            lat[key] = {"label": LATENCY_FIGURES[key], **st}
            if key.startswith("c_"):
                lat[key]["pinned"] = c_pinned.get(key[2:], False)
        say(f"throughput: create+signal+release, {cfg.throughput_runs} runs x {cfg.throughput_ops}")
        tp = rec.attempt("throughput", lambda: _throughput(cfg))
        if tp is not None:
            result["throughput"] = tp
            say(f"  {tp['api']['ops_per_s_median']:,.0f} ops/s through the API")
    finish(result, evaluate_goals, started)
    return result
