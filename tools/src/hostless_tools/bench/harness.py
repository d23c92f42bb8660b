"""The measuring half of every benchmark: processes, pinning, domains, timing, statistics, goals.

What a benchmark needs before anything is reported, written once:

* :func:`machine_info`: where and when it ran;
* :func:`pin`, :func:`pinned`, :func:`pin_cpus`, :func:`affinity`: CPU placement;
* :class:`Child`: a spawned process with a control pipe and the handshake
  every benchmark uses (the child sends named messages, ``("error", traceback)``
  when it fails, ``("done", None)`` when it is through);
* :func:`temp_domain` / :func:`new_domain` / :func:`drop_domain`: a domain with a
  unique ``hostless-bench-<tag>-<pid>-<hex>`` name that is unlinked afterwards;
* :func:`summarize` (median with its spread), :func:`rate_figures` (ops/s over
  several runs), :func:`spin_for`, :func:`run_json` (a reference program that
  prints JSON);
* :class:`Recorder`: progress lines and the ``errors`` of a run, so that one
  failed figure leaves the others standing;
* goal checks: :func:`ratio`, :func:`met`, :func:`rate_goal`.

The few places where a benchmark reaches below the public API (the bare C
core calls) are here too, and only here: :func:`core`, :func:`core_fence_kind`,
:func:`is_held`.
"""

from __future__ import annotations

import datetime as _dt
import json
import multiprocessing as mp
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np

Progress = Callable[[str], None]
"""Receives one line per step of a run."""

HANDSHAKE_TIMEOUT = 60.0
"""Seconds a benchmark waits for a child's handshake message."""

_T = TypeVar("_T")


# --------------------------------------------------------------------------- statistics


def summarize(
    samples_ns: Sequence[int] | np.ndarray[Any, Any],
    blocks: int = 5,
    groups: Sequence[np.ndarray[Any, Any]] | None = None,
) -> dict[str, float]:
    """Summary statistics of latency samples in nanoseconds.

    Returns ``n``, ``min``, ``p50``, ``p90``, ``p99``, ``max``, ``mean`` and the
    spread of the median: ``p50_lo`` / ``p50_hi`` are the smallest and largest
    median of the ``groups`` (for example the interleaved rounds of a run) or,
    without groups, of ``blocks`` consecutive blocks of the samples (a
    drifting or disturbed run shows up there).
    """
    a = np.asarray(samples_ns, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no samples")
    p50, p90, p99 = (float(x) for x in np.percentile(a, [50, 90, 99]))
    out = {
        "n": float(a.size),
        "min": float(a.min()),
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "max": float(a.max()),
        "mean": float(a.mean()),
    }
    if groups is not None and len(groups) > 1:
        meds = [float(np.median(g)) for g in groups if len(g)]
    else:
        k = max(1, min(blocks, a.size // 100 or 1))
        meds = [float(np.median(b)) for b in np.array_split(a, k)]
    out["p50_lo"] = min(meds)
    out["p50_hi"] = max(meds)
    return out


def rate_figures(
    loops: Mapping[str, Callable[[], float]], runs: int, ops: int, required: str = "api"
) -> dict[str, Any]:
    """Operations per second of each loop (a function returning its own ops/s): one dropped
    warm-up run, then ``runs`` runs; median, min, max and every run.

    A loop other than ``required`` that fails its warm-up is left out (it is
    informational, for example one on internal calls that changed).
    """
    out: dict[str, Any] = {}
    for label, fn in loops.items():
        try:
            fn()  # warm-up, dropped
        except Exception:
            if label == required:
                raise
            continue
        values = [fn() for _ in range(runs)]
        out[label] = {
            "ops_per_s_median": float(np.median(values)),
            "ops_per_s_min": float(min(values)),
            "ops_per_s_max": float(max(values)),
            "runs": values,
            "ops_per_run": ops,
        }
    return out


def spin_for(seconds: float) -> None:
    """Busy-wait ``seconds`` (no sleep: the caller stays on its CPU)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# --------------------------------------------------------------------------- goals


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``; None when either is missing or ``b`` is 0."""
    return None if a is None or b is None or b == 0 else a / b


def met(value: float | None, limit: float, at_most: bool) -> bool | None:
    """Whether ``value`` meets ``limit`` (``<=`` with ``at_most``, else ``>=``); None when missing."""
    if value is None:
        return None
    return value <= limit if at_most else value >= limit


def rate_goal(
    figure: str, label: str, stats: Mapping[str, Any], goal: str, extra: Mapping[str, Any]
) -> dict[str, Any]:
    """The goal row of an ops/s figure (``stats`` from :func:`rate_figures`): >= 1M ops/s.

    ``extra`` holds the benchmark's own keys (``reference``, ``ratio_p99``...),
    placed where that benchmark's JSON has always had them.
    """
    v = float(stats["ops_per_s_median"])
    row: dict[str, Any] = {
        "figure": figure,
        "label": label,
        "ops_per_s": v,
        "ops_per_s_min": float(stats["ops_per_s_min"]),
        "ops_per_s_max": float(stats["ops_per_s_max"]),
    }
    row.update({k: x for k, x in extra.items() if not k.startswith("ratio_p")})
    row.update({"ratio_of": "this / 1M ops/s", "ratio": v / 1e6})
    row.update({k: x for k, x in extra.items() if k.startswith("ratio_p")})
    row.update({"goal": goal, "met": met(v, 1e6, at_most=False)})
    return row


# --------------------------------------------------------------------------- the run


class Recorder:
    """Progress lines and failed figures of one run (``errors`` is the result's dict)."""

    def __init__(self, errors: dict[str, str], progress: Progress | None = None) -> None:
        self.errors = errors
        self.progress = progress

    def say(self, msg: str) -> None:
        """One progress line: to ``progress``, or to stderr by default."""
        if self.progress is not None:
            self.progress(msg)
        else:
            print(msg, file=sys.stderr, flush=True)

    def failed(self, key: str, e: BaseException, label: str | None = None) -> None:
        """Record ``key`` as failed with ``e`` and say so (``  label: FAILED: ...``)."""
        self.errors[key] = f"{type(e).__name__}: {e}"
        self.say(f"  {label + ': ' if label else ''}FAILED: {self.errors[key]}")
        if os.environ.get("HOSTLESS_BENCH_DEBUG"):
            traceback.print_exc()

    def attempt(self, key: str, fn: Callable[[], _T], label: str | None = None) -> _T | None:
        """``fn()``, or None with ``key`` recorded as failed: one figure fails, the others stand."""
        try:
            return fn()
        except Exception as e:
            self.failed(key, e, label)
            return None


def new_result(benchmark: str, cfg: Any, **fields: Any) -> dict[str, Any]:
    """The skeleton of a result: benchmark, machine, config, the benchmark's fields, errors."""
    return {
        "benchmark": benchmark,
        "machine": machine_info(),
        "config": asdict(cfg),
        **fields,
        "errors": {},
    }


def finish(
    result: dict[str, Any], goals: Callable[[dict[str, Any]], list[dict[str, Any]]], started: float
) -> None:
    """Evaluate the goals and stamp the duration (seconds since ``started``, time.monotonic)."""
    result["goals"] = goals(result)
    result["duration_s"] = round(time.monotonic() - started, 2)


# --------------------------------------------------------------------------- placement


def affinity() -> list[int]:
    """The CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def set_affinity(pid: int, cpus: int | Sequence[int] | None) -> bool:
    """Pin process ``pid`` (0: this one) to ``cpus`` (None or empty: leave it); True when pinned."""
    if cpus is None:
        return False
    want = {cpus} if isinstance(cpus, int) else set(cpus)
    if not want:
        return False
    try:
        os.sched_setaffinity(pid, want)
    except (AttributeError, OSError):
        return False
    return True


def pin(cpu: int | Sequence[int] | None) -> bool:
    """Pin this process to ``cpu`` (None: leave it); True when pinned."""
    return set_affinity(0, cpu)


@contextmanager
def pinned(cpu: int | Sequence[int] | None) -> Iterator[bool]:
    """Pin this process to ``cpu`` for the ``with`` block, then restore its affinity."""
    try:
        old: set[int] | None = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        old = None
    ok = pin(cpu)
    try:
        yield ok
    finally:
        if ok and old is not None:
            os.sched_setaffinity(0, old)


def pin_cpus(allowed: Sequence[int] | None = None) -> tuple[int | None, int | None]:
    """Two distinct CPUs of ``allowed`` (default: those this process may run on now), or
    (None, None) with fewer than two.  Pass the set taken before a ``pinned`` block: inside
    it this process may run on one CPU only."""
    try:
        cpus = sorted(allowed) if allowed is not None else sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None, None
    if len(cpus) < 2:
        return None, None
    return cpus[0], cpus[1]


# --------------------------------------------------------------------------- child processes


def _child_main(
    target: Callable[..., None], conn: Connection, cpu: int | None, args: tuple[Any, ...]
) -> None:
    """A :class:`Child`'s process: pinned, runs ``target(conn, *args)``, then says done (or the error)."""
    try:
        pin(cpu)
        target(conn, *args)
        conn.send(("done", None))
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:
            pass
        raise
    finally:
        conn.close()


class Child:
    """A spawned process B with its control connection.

    ``target(conn, *args)`` (a module-level function) runs in the child, pinned
    to ``cpu``; it sends named messages, which :meth:`expect` takes one at a
    time.  A failure in the child arrives as its traceback.  ``role`` names the
    child in error messages ("peer", "consumer").
    """

    def __init__(
        self, target: Callable[..., None], args: tuple[Any, ...], cpu: int | None, role: str = "peer"
    ) -> None:
        ctx = mp.get_context("spawn")
        self.role = role
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(target, child_conn, cpu, args), daemon=True)
        self.proc.start()
        child_conn.close()

    def expect(self, what: str, timeout: float = HANDSHAKE_TIMEOUT) -> Any:
        """The payload of the child's next message, which must be ``what``."""
        if not self.conn.poll(timeout):
            raise RuntimeError(
                f"benchmark {self.role} sent nothing within {timeout} s (waiting for {what!r})"
            )
        msg, payload = self.conn.recv()
        if msg == "error":
            raise RuntimeError(f"benchmark {self.role} failed:\n{payload}")
        if msg != what:
            raise RuntimeError(f"benchmark {self.role} sent {msg!r}, expected {what!r}")
        return payload

    def finish(self) -> None:
        """Wait for the child's "done" and its exit."""
        self.expect("done")
        self.proc.join(10)

    def close(self, quit: bool = False) -> None:
        """End the child: with ``quit``, send ("quit", None) and wait for its "done"; kill it if
        it lingers."""
        if quit:
            try:
                if self.proc.is_alive():
                    self.conn.send(("quit", None))
                    self.expect("done", 10)
            except Exception:
                pass
        if self.proc.is_alive():
            self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


def run_json(
    cmd: Sequence[str], timeout: float = 600.0, progress: Progress | None = None, cwd: str | None = None
) -> dict[str, Any]:
    """Run a reference program that prints one JSON object as its last line of stdout.

    Lines it writes to stderr go to ``progress`` (when given) once it is
    through; a non-zero exit raises RuntimeError with the end of stderr.
    """
    out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd)
    if progress is not None:
        for line in out.stderr.splitlines():
            if line.startswith("  "):
                progress(line)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    lines = out.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{' '.join(cmd)} printed nothing")
    data: dict[str, Any] = json.loads(lines[-1])
    return data


def compile_c(src: Path, workdir: str, name: str) -> tuple[str | None, str | None]:
    """Compile ``src`` with gcc -O2 into ``workdir/name``; returns (executable, error)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        return None, "no C compiler (gcc) found"
    if not src.exists():
        return None, f"{src} is missing from the installed package"
    exe = os.path.join(workdir, name)
    out = subprocess.run([gcc, "-O2", "-o", exe, str(src)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return None, f"gcc failed: {out.stderr.strip()[:2000]}"
    return exe, None


@contextmanager
def scratch_dir() -> Iterator[str]:
    """A temporary directory for compiled references, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="hostless-bench-") as tmp:
        yield tmp


# --------------------------------------------------------------------------- domains


def domain_name(tag: str) -> str:
    """``hostless-bench-<tag>-<pid>-<hex>``: a unique domain name (tests look for this prefix)."""
    return f"hostless-bench-{tag}-{os.getpid()}-{secrets.token_hex(3)}"


def new_domain(tag: str, **kw: Any) -> tuple[Any, str]:
    """A fresh domain (``hostless.Domain.create(name, **kw)``) and its name."""
    import hostless as hl

    name = domain_name(tag)
    return hl.Domain.create(name, **kw), name


def drop_domain(dom: Any, name: str) -> None:
    """Close ``dom`` and unlink its name."""
    import hostless as hl

    dom.close()
    try:
        hl.Domain.unlink(name)
    except FileNotFoundError:
        pass


@contextmanager
def temp_domain(tag: str, **kw: Any) -> Iterator[Any]:
    """A fresh domain for the ``with`` block, closed and unlinked afterwards."""
    dom, name = new_domain(tag, **kw)
    try:
        yield dom
    finally:
        drop_domain(dom, name)


# --------------------------------------------------------------------------- below the public API


def core(dom: Any) -> Any:
    """The domain's C core object, for the informational "bare core calls" figures.

    The one place the benchmarks reach into ``Domain``'s private ``_core``.
    """
    return cast(Any, dom)._core


def core_fence_kind() -> int:
    """The C core's object kind of a fence (the first argument of ``core(dom).create``)."""
    from hostless._abi import C

    return int(C.KIND_FENCE)


def is_held(obj: Any) -> bool:
    """Whether a fence, timeline or buffer object still holds its reference."""
    from hostless import lowlevel

    return lowlevel.is_held(obj)


# --------------------------------------------------------------------------- where it ran


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, val = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model", "Hardware"):
                    return val.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _first_line(cmd: Sequence[str]) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None


def _gcc_version() -> str | None:
    gcc = shutil.which("gcc")
    out = None if gcc is None else _first_line([gcc, "--version"])
    if out is None:
        return None
    return out.stdout.splitlines()[0].strip() if out.stdout else None


def _git_revision() -> str | None:
    """``<short commit>[+dirty]`` of the repository the package was installed from, if run inside it."""
    git = shutil.which("git")
    if git is None:
        return None
    rev = _first_line([git, "rev-parse", "--short", "HEAD"])
    if rev is None or rev.returncode != 0:
        return None
    dirty = _first_line([git, "status", "--porcelain", "--untracked-files=no"])
    if dirty is None:
        return None
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine_info() -> dict[str, Any]:
    """Where and when a benchmark ran: host, CPU, Python, versions, load."""
    import hostless

    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "nproc": os.cpu_count() or 1,
        "cpus_allowed": affinity(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "numpy": np.__version__,
        "hostless": hostless.__version__,
        "gcc": _gcc_version(),
        "git": _git_revision(),
        "loadavg_at_start": load,
        "date": now.isoformat(timespec="seconds"),
    }
