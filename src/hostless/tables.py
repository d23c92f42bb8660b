"""Tables for the ``hostless`` command and its plugins (hostless-tools' reports): a rich table
when rich is installed, aligned plain text otherwise (``plain=True`` or ``HOSTLESS_NO_RICH=1``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["text_table", "print_table"]


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

    ``plain=True`` or the environment variable ``HOSTLESS_NO_RICH`` forces plain text.  Cells
    are printed as written (rich markup in them is not interpreted).
    """
    if not plain and _use_rich():
        from rich.console import Console
        from rich.table import Table as RichTable
        from rich.text import Text

        # cells are text, never markup: a label or name read from a domain is untrusted, and
        # "hostless[bench]" must print as written
        t = RichTable(title=Text(title), title_justify="left")
        for h in headers:
            t.add_column(Text(h))
        for r in rows:
            t.add_row(*(Text(str(c)) for c in r))
        Console(width=None if sys.stdout.isatty() else 150).print(t)
        return
    print(title)
    print(text_table(headers, rows))
    print()
