"""The buffer benchmark: hand-off of a buffer from one process to another, and the allocator.

Everything is measured in ONE run on one machine, with the producer (this
process) and the consumer (a spawned process) pinned to two different CPUs
when the machine has at least two.  For every size from 4 KiB to 1 GiB (powers
of 4; ``--quick`` stops at 64 MiB) the modes run one after the other.

Every hand-off has two steps.  First the producer prepares the data (not
measured, the same work in every mode: it writes one byte in every 4 KiB page
of the buffer, so that every page is resident and dirty, as after a device
wrote it) while the consumer sleeps (a futex wait, or a blocking Pipe read);
then the producer wakes the consumer with an untimed "prepare" notice, the
consumer answers that it is ready and goes into a spinning wait, and
PREPARE_DELAY (20 us) later the timed hand-off starts.  So in every mode and
at every size the consumer is awake, spinning, and has been idle for the same
short time when the hand-off comes: what is measured is the hand-off, not how
long the consumer slept (a wake-up from a long sleep costs tens of
microseconds on a virtual machine, more on a loaded one, whatever the size).

* ``zero_copy``: the producer has allocated a heap buffer (``dom.buffer(n)``)
  and written it; it writes the handle and its start time into a mailbox (a
  small heap buffer) and signals a timeline; the consumer wakes, imports the
  handle, makes a NumPy view and reads its first byte.  Measured: from the
  producer's signal to the consumer's first byte (import + view + read).
* ``zero_copy_plain_wait`` (for information): the same without the prepare
  step: the consumer waits through the producer's work in the domain's
  default wait (spins 50 us, then sleeps on the futex).
* ``zero_copy_control`` (the control of the size goal): the producer writes
  a buffer of the row's size as in ``zero_copy`` (one byte per page) but hands
  off a separate 4 KiB buffer.  Writing one byte in each of the 262,144 pages
  of 1 GiB pulls 16 MiB of data lines and 2 MiB of page tables through the
  caches and the TLB, so code and data the hand-off needs may have been
  evicted; this figure has the same pollution with a 4 KiB hand-off, so
  ``zero_copy`` / ``zero_copy_control`` at one size is the effect of the
  handed-off buffer's size alone.
* ``zero_copy_full_fill`` (for information): the same as ``zero_copy`` but the
  producer wrote every byte: at hundreds of MiB that write evicts the
  consumer's code and data from every cache level, and the consumer's import
  path then runs from DRAM; this is the cost of the fill, not of the hand-off
  (which touches no data).
* ``copy``: the copy baseline done the careful way: the producer copies its
  written :class:`~hostless.PrivateBuffer` into a shared staging buffer
  (``copy_to``: one memcpy), signals, the consumer copies the staging buffer
  into its own PrivateBuffer (one memcpy) and reads its first byte.  Measured:
  from the start of the producer's copy to the consumer's first byte.
* ``shm_pipe``: ``multiprocessing.shared_memory``: the producer has created
  and written a segment and sends its name over a ``multiprocessing.Pipe``;
  the consumer attaches by name, makes an ndarray view and reads its first
  byte.  Measured: from the send to the first byte (the attach included).
* ``pickle_pipe``: the producer sends the written ndarray over a Pipe
  (pickled); measured from the send to the consumer's first byte of the
  unpickled array.

The consumers' spinning waits are the timeline wait with a long spin budget
and, for the Pipe modes, a loop on ``poll()``.  Both processes read
``time.monotonic_ns()`` (CLOCK_MONOTONIC, one clock for the whole machine):
the producer writes its start time next to the handle or into the message,
the consumer subtracts it from its own reading.

Allocator: ``dom.buffer(64)`` + ``release()`` per second from Python on one
core (and the same two calls on the C core directly, for information).
Fragmentation: the heap's figures after a fixed pseudo-random pattern of
allocations (64 B to 256 KiB, log-uniform) and frees on a 64 MiB heap.

:func:`run` returns a JSON-able dict, :func:`write_results` writes it with a
Markdown report (``buffers-<host>-<date>[-quick].json`` / ``.md``).  The
hand-offs themselves are in :mod:`hostless_tools.bench.buffers_handoff`, goals and
reports in :mod:`hostless_tools.bench.buffers_report`.
"""

from __future__ import annotations

import math
import random
import shutil
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .buffers_handoff import MODES, PREPARE_DELAY, Handoff
from .buffers_report import DEFAULT_OUT_DIR, evaluate_goals, print_report, report_markdown, write_results
from .harness import (
    Progress,
    Recorder,
    core,
    drop_domain,
    finish,
    new_domain,
    new_result,
    pin_cpus,
    pinned,
    rate_figures,
    summarize,
    temp_domain,
)
from .report import GIB, KIB, MIB, fmt_ns, fmt_size

__all__ = [
    "BufferBenchConfig",
    "MODES",
    "PREPARE_DELAY",
    "run",
    "evaluate_goals",
    "report_markdown",
    "write_results",
    "print_report",
    "fmt_size",
    "DEFAULT_OUT_DIR",
]


@dataclass
class BufferBenchConfig:
    """Parameters of one run of the buffer benchmark."""

    min_size: int = 4 * KIB
    max_size: int = GIB
    """Sizes are min_size * 4**k up to max_size."""
    reps_small: int = 200
    """Measured hand-offs per mode for sizes up to 1 MiB; larger sizes get
    ``reps_small * sqrt(1 MiB / size)`` (at least ``min_reps``)."""
    min_reps: int = 6
    min_reps_zero_copy: int = 30
    """The zero-copy modes cost little per hand-off at any size: at least this many."""
    alloc_ops: int = 200_000
    """alloc + free per allocator-throughput run."""
    alloc_runs: int = 7
    """Allocator runs (after one dropped warm-up run); the median is reported."""
    frag_ops: int = 20_000
    """Operations of the fragmentation pattern."""
    frag_heap: int = 64 * MIB
    pin: bool = True
    """Pin the two processes to two different CPUs when possible."""
    quick: bool = False

    @classmethod
    def quick_config(cls) -> BufferBenchConfig:
        """A small run (sizes up to 64 MiB, fewer repetitions): for demos and smoke tests."""
        return cls(
            max_size=64 * MIB,
            reps_small=50,
            min_reps=4,
            min_reps_zero_copy=10,
            alloc_ops=50_000,
            alloc_runs=5,
            frag_ops=5_000,
            quick=True,
        )

    def sizes(self) -> list[int]:
        out, n = [], self.min_size
        while n <= self.max_size:
            out.append(n)
            n *= 4
        return out

    def reps(self, size: int, mode: str = "copy") -> int:
        """Measured hand-offs of ``mode`` at ``size``."""
        n = (
            self.reps_small
            if size <= MIB
            else max(self.min_reps, int(self.reps_small * math.sqrt(MIB / size)))
        )
        if mode.startswith("zero_copy"):
            n = max(n, self.min_reps_zero_copy)
        return n


# --------------------------------------------------------------------------- allocator


def _allocator(cfg: BufferBenchConfig) -> dict[str, Any]:
    """dom.buffer(64) + release() per second, from Python, on one core."""
    from hostless.buffer import Buffer, pack_meta

    with temp_domain("alloc", fences=4096, participants=4, heap=16 * MIB) as dom:
        n = cfg.alloc_ops
        clock = time.perf_counter_ns

        def api_run() -> float:
            buffer = dom.buffer
            t0 = clock()
            for _ in range(n):
                b = buffer(64)
                b.release()
            return n / ((clock() - t0) / 1e9)

        meta = pack_meta((64,), np.dtype(np.uint8), 64)
        mapping = dom.raw()

        def core_run() -> float:
            new = core(dom).new_buffer
            t0 = clock()
            for _ in range(n):
                b = new(Buffer, dom, 64, meta, mapping)
                b.release()
            return n / ((clock() - t0) / 1e9)

        out = rate_figures({"api": api_run, "core": core_run}, cfg.alloc_runs, n)
        if dom.heap_stats()["used"] != 0 or dom.check():
            raise RuntimeError("allocator benchmark left the heap inconsistent")
        return out


def _fragmentation(cfg: BufferBenchConfig) -> dict[str, Any]:
    """Heap figures after a fixed pseudo-random pattern of allocations and frees."""
    import hostless as hl

    dom, name = new_domain("frag", fences=16384, participants=4, heap=cfg.frag_heap)
    rnd = random.Random(20261130)
    held: list[Any] = []
    requested = oom = 0
    lo, hi = math.log(64), math.log(256 * KIB)
    try:
        for _ in range(cfg.frag_ops):
            if held and (rnd.random() < 0.45 or len(held) >= 12000):
                b = held.pop(rnd.randrange(len(held)))
                requested -= b.nbytes
                b.release()
                continue
            n = int(math.exp(rnd.uniform(lo, hi)))
            try:
                b = dom.buffer(n)
            except hl.OutOfMemory:
                oom += 1
                continue
            held.append(b)
            requested += n
        st = dom.heap_stats()
        problems = dom.check()
        out = {
            "heap": cfg.frag_heap,
            "ops": cfg.frag_ops,
            "sizes": "64 B - 256 KiB, log-uniform; 55% allocations, 45% frees of a random live buffer",
            "live_buffers": len(held),
            "requested_bytes": requested,
            "used": int(st["used"]),
            "free": int(st["free"]),
            "largest_free": int(st["largest_free"]),
            "free_runs": int(st["free_runs"]),
            "fragmentation": float(st["fragmentation"]),
            "overhead": (int(st["used"]) / requested - 1.0) if requested else 0.0,
            "out_of_memory": oom,
            "check": problems,
        }
        for b in held:
            b.release()
        out["used_after_free_all"] = int(dom.heap_stats()["used"])
        return out
    finally:
        drop_domain(dom, name)


# --------------------------------------------------------------------------- the run


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _shm_free() -> int | None:
    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:
        return None


def _fits(size: int, heap_touched: int) -> str | None:
    """Why ``size`` cannot be measured here (None when it can).

    Peak needs: the pickle mode holds about 4 copies in private memory (the
    array, its pickle, the received bytes, the unpickled array); /dev/shm holds
    the heap's pages (touched once, kept) plus one shared_memory segment.
    """
    mem = _mem_available()
    if mem is not None and 5 * size + 256 * MIB > mem:
        return f"needs about {fmt_size(5 * size)} of free memory, {mem / GIB:.1f} GiB available"
    shm = _shm_free()
    need = size + max(0, 2 * size - heap_touched) + 64 * MIB
    if shm is not None and need > shm:
        return f"needs about {need / GIB:.1f} GiB free in /dev/shm, {shm / GIB:.1f} GiB free"
    return None


def run(cfg: BufferBenchConfig | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Run the whole buffer benchmark; returns a JSON-able dict (see module doc).

    ``progress`` receives one line per step (default: printed to stderr).
    """
    cfg = cfg or BufferBenchConfig()
    if cfg.min_size < 1 or cfg.max_size < cfg.min_size:
        raise ValueError("need 1 <= min_size <= max_size")
    if cfg.reps_small < 1 or cfg.min_reps < 1 or cfg.alloc_ops < 1 or cfg.alloc_runs < 1:
        raise ValueError("reps, alloc_ops and alloc_runs must be >= 1")

    cpus = pin_cpus() if cfg.pin else (None, None)
    started = time.monotonic()
    result = new_result(
        "buffers",
        cfg,
        pinned=cpus[0] is not None,
        cpus=list(cpus),
        modes=dict(MODES),
        sizes=[],
        handoff={},
        skipped={},
    )
    errors: dict[str, str] = result["errors"]
    rec = Recorder(errors, progress)
    say = rec.say
    sizes = cfg.sizes()
    plan = []
    for size in sizes:
        why = _fits(size, 0)
        if why is None:
            plan.append(size)
        else:
            result["skipped"][str(size)] = why
            say(f"{fmt_size(size)}: skipped ({why})")
    with pinned(cpus[0]):
        if plan:
            heap = max(plan) + 64 * MIB
            bench: Handoff | None = None
            try:
                bench = Handoff(heap, cpus)
                touched = 0
                for size in plan:
                    why = _fits(size, touched)
                    if why is not None:
                        result["skipped"][str(size)] = why
                        say(f"{fmt_size(size)}: skipped ({why})")
                        continue
                    say(
                        f"{fmt_size(size)}: {cfg.reps(size)} hand-offs per mode "
                        f"({cfg.reps(size, 'zero_copy')} zero-copy), 10% more as warm-up"
                    )
                    figs: dict[str, Any] = {}
                    for mode, label in MODES.items():
                        key = f"{mode}@{size}"
                        reps = cfg.reps(size, mode)
                        warm = max(2, reps // 10)
                        try:
                            fn = getattr(bench, mode)
                            fn(size, warm)
                            samples = fn(size, reps)
                        except Exception as e:
                            rec.failed(key, e, label)
                            if bench.consumer is None or not bench.consumer.proc.is_alive():
                                raise
                            continue
                        figs[mode] = {"label": label, **summarize(samples)}
                        say(f"  {label}: p50 {fmt_ns(figs[mode]['p50'])}, p90 {fmt_ns(figs[mode]['p90'])}")
                    touched = max(touched, size)
                    result["handoff"][str(size)] = figs
                    result["sizes"].append(size)
            except Exception as e:
                rec.failed("handoff", e, "hand-off benchmark")
            finally:
                if bench is not None:
                    bench.close()
        say(f"allocator: dom.buffer(64) + release(), {cfg.alloc_runs} runs x {cfg.alloc_ops}")
        al = rec.attempt("allocator", lambda: _allocator(cfg))
        if al is not None:
            result["allocator"] = al
            say(f"  {al['api']['ops_per_s_median']:,.0f} alloc+free/s through the API")
        say(f"fragmentation: {cfg.frag_ops} random operations on a {fmt_size(cfg.frag_heap)} heap")
        fr = rec.attempt("fragmentation", lambda: _fragmentation(cfg))
        if fr is not None:
            result["fragmentation"] = fr
            say(f"  fragmentation {fr['fragmentation']:.2%}, {fr['free_runs']} free runs")
    finish(result, evaluate_goals, started)
    return result
