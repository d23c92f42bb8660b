"""Benchmarks of hostless, each compared in the same run with references measured on the same machine.

``hostless bench fences`` / ``buffers`` / ``pipeline`` run the modules of the
same names; each is a measuring module (``fences``, ``buffers`` with
``buffers_handoff``, ``pipeline`` with ``pipeline_workloads``) and a reporting
module (``*_report``: goals, tables, the Markdown report, the result files).

What they share lives in two modules, measurement and reporting apart:

* :mod:`hostless_tools.bench.harness`: child processes and their handshake, CPU
  pinning, throw-away domains, summary statistics (median with spread),
  ops/s runs, goal checks, machine information;
* :mod:`hostless_tools.bench.report`: number formats, Markdown / rich / plain
  tables, the report's header and sections, and :func:`write_results`.

Plotting, the comparison peers (multiprocessing chains, Ray Compiled Graphs),
the GPU benchmark and the A/B runner are scripts under ``benchmarks/`` in the
repository, not part of the installed package.  The names below are the ones
other modules and the examples import from ``hostless_tools.bench``.
"""

from __future__ import annotations

from .harness import machine_info, pin, pin_cpus, pinned, summarize
from .report import (
    fmt_ns,
    fmt_ratio,
    markdown_table,
    print_table,
    result_stem,
    safe_hostname,
    text_table,
    write_json_md,
    write_results,
)

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
    "pin",
    "pinned",
    "result_stem",
    "write_json_md",
    "write_results",
]
