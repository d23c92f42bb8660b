"""Benchmarks of hostless, each compared in the same run with references measured on the same machine.

``hostless bench fences`` (module :mod:`hostless.bench.fences`) measures the
cross-process signal -> wake round trip of fences and timelines against C
ping-pong programs, ``multiprocessing.Pipe`` and a plain NumPy spin loop.

This package also holds the helpers every benchmark shares: summary
statistics (median with spread), machine information, number formatting and
table rendering (Markdown for reports, rich or plain text for terminals).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

__all__ = [
    "summarize",
    "machine_info",
    "fmt_ns",
    "fmt_ratio",
    "markdown_table",
    "text_table",
    "print_table",
    "safe_hostname",
    "pin_cpus",
]


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


def _gcc_version() -> str | None:
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    try:
        out = subprocess.run([gcc, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.splitlines()[0].strip() if out.stdout else None


def _git_revision() -> str | None:
    """``<short commit>[+dirty]`` of the repository the package was installed from, if run inside it."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        rev = subprocess.run(
            [git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            [git, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine_info() -> dict[str, Any]:
    """Where and when a benchmark ran: host, CPU, Python, versions, load."""
    import hostless

    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = list(range(os.cpu_count() or 1))
    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "nproc": os.cpu_count() or 1,
        "cpus_allowed": affinity,
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


def safe_hostname(name: str | None = None) -> str:
    """The hostname reduced to characters that are safe in a file name."""
    host = name if name is not None else socket.gethostname()
    return re.sub(r"[^A-Za-z0-9._-]+", "_", host.split(".")[0]) or "host"


def result_stem(kind: str, result: dict[str, Any]) -> str:
    """``<kind>-<host>-<YYYY-MM-DD-HHMM>[-quick]``: the file name of a run's results."""
    try:
        when = _dt.datetime.fromisoformat(result["machine"]["date"])
    except (KeyError, ValueError):
        when = _dt.datetime.now(_dt.timezone.utc)
    stem = f"{kind}-{safe_hostname(result['machine'].get('hostname'))}-{when.strftime('%Y-%m-%d-%H%M')}"
    if result.get("config", {}).get("quick"):
        stem += "-quick"
    return stem


def write_json_md(path_stem: Any, result: dict[str, Any], markdown: str) -> tuple[Any, Any]:
    """Write ``<stem>.json`` (every figure) and ``<stem>.md`` (the report); returns both paths."""
    import json

    js = path_stem.parent / (path_stem.name + ".json")
    md = path_stem.parent / (path_stem.name + ".md")
    js.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    md.write_text(markdown, encoding="utf-8")
    return js, md


def write_results(kind: str, result: dict[str, Any], markdown: str, out_dir: Any) -> tuple[Any, Any]:
    """Write ``<kind>-<host>-<date>.json`` and ``.md`` into ``out_dir`` (made if missing)."""
    from pathlib import Path

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    js, md = write_json_md(d / result_stem(kind, result), result, markdown)
    return Path(js), Path(md)


def pin(cpu: int | None) -> bool:
    """Pin this process to ``cpu`` (None: leave it); True when pinned."""
    if cpu is None:
        return False
    try:
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError):
        return False
    return True


@contextmanager
def pinned(cpu: int | None) -> Iterator[bool]:
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


def pin_cpus() -> tuple[int | None, int | None]:
    """Two distinct CPUs this process may run on, or (None, None) with fewer than two."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None, None
    if len(cpus) < 2:
        return None, None
    return cpus[0], cpus[1]


def fmt_ns(ns: float | None) -> str:
    """Format a duration in nanoseconds with a unit: ``237 ns``, ``1.24 us``, ``70.1 us``, ``3.2 ms``."""
    if ns is None or ns != ns:  # None or NaN
        return "n/a"
    if ns < 1_000:
        return f"{ns:.0f} ns"
    if ns < 10_000:
        return f"{ns / 1e3:.2f} us"
    if ns < 1_000_000:
        return f"{ns / 1e3:.1f} us"
    if ns < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def fmt_ratio(r: float | None) -> str:
    """``2.1x``; ``n/a`` when missing."""
    if r is None or r != r:
        return "n/a"
    if r >= 100:
        return f"{r:.0f}x"
    if r >= 10:
        return f"{r:.1f}x"
    return f"{r:.2f}x"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table."""

    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    out = ["| " + " | ".join(esc(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain aligned text table (used when rich is not installed)."""
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    line = "  ".join(h.ljust(widths[i]) for i, h in enumerate(headers))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)) for r in rows]
    return "\n".join([line, sep, *body])


def _use_rich() -> bool:
    if os.environ.get("HOSTLESS_NO_RICH"):
        return False
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def print_table(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], *, plain: bool = False
) -> None:
    """Print a table to stdout: a rich table when rich is importable, plain text otherwise.

    ``plain=True`` or the environment variable ``HOSTLESS_NO_RICH`` forces plain text.
    """
    if not plain and _use_rich():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title, title_justify="left")
        for h in headers:
            t.add_column(h)
        for r in rows:
            t.add_row(*r)
        Console(width=None if sys.stdout.isatty() else 150).print(t)
        return
    print(title)
    print(text_table(headers, rows))
    print()
