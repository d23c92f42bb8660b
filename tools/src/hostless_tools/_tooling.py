"""What the two protocol tools, ``hostless chaos`` (:mod:`hostless_tools.chaos`) and ``hostless fuzz``
(:mod:`hostless_tools.fuzz`), share: their child processes' command lines and ``python -m`` entry points,
the machine line of their reports, writing a run's results, and the CLI's tail of a run.

Both start fresh interpreters (never forked from a process that has a domain open) by module
path, ``python -m hostless_tools.chaos worker ...`` and ``python -m hostless_tools.fuzz innocent
...``, so the module paths are written here once, next to the dispatcher that serves them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["child_command", "subcommand_main", "machine_line", "write_run", "print_run"]


def child_command(module: str, *args: str) -> list[str]:
    """The command line of a fresh interpreter running ``python -m <module> <args>`` (the same
    interpreter as this one)."""
    return [sys.executable, "-m", module, *args]


def subcommand_main(
    argv: Iterable[str], command: str, main: Callable[[Sequence[str]], int], usage: str
) -> int:
    """The ``python -m`` entry point of a tool module that serves one subcommand (its child
    processes): ``main(rest)`` when ``argv`` starts with ``command``, else print ``usage`` and
    return 2."""
    args = list(argv)
    if not args or args[0] != command:
        print(usage)
        return 2
    return main(args[1:])


def machine_line(m: dict[str, Any]) -> str:
    """The report line that says where a run ran (from :func:`hostless_tools.bench.machine_info`)."""
    return (
        f"- machine: {m.get('hostname')}, {m.get('cpu_model')}, {m.get('nproc')} CPUs, "
        f"Python {m.get('python')}, git {m.get('git')}, {m.get('date')}"
    )


def machine_info() -> dict[str, Any]:
    """:func:`hostless_tools.bench.machine_info` (imported when a run starts, not with the tool)."""
    from .bench import machine_info as info

    return info()


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """:func:`hostless_tools.bench.markdown_table`."""
    from .bench import markdown_table as table

    return table(header, rows)


def write_run(
    kind: str, result: dict[str, Any], markdown: str, out_dir: str | os.PathLike[str]
) -> tuple[Path, Path]:
    """Write ``<kind>-<host>-<date>.json`` and ``.md`` into ``out_dir``; returns both paths."""
    from . import bench

    js, md = bench.write_results(kind, result, markdown, out_dir)
    return Path(js), Path(md)


def print_run(
    summary: list[str], write: Callable[[], tuple[Path, Path]] | None, print_: Callable[[str], Any] = print
) -> None:
    """The CLI's tail of a run: its summary lines, then (unless ``write`` is None) the result files
    written and their paths."""
    for line in summary:
        print_(line)
    if write is not None:
        paths = write()
        print_("wrote " + " and ".join(str(x) for x in paths))
