"""MkDocs hooks of the documentation site (mkdocs.yml, `make docs`): pages whose text has a home
elsewhere are filled in at build time, so the site cannot drift from it.

- ``<!-- include: FILE -->``: a file of the repository's root (the README as the tutorial, the
  CHANGELOG), its links into docs/ made relative to the site;
- ``<!-- cli: hostless -->``: ``hostless --help`` and every subcommand's help, from
  :func:`hostless.cli.build_parser` (plugins of hostless-tools included when installed);
- ``<!-- cli: hostless-agent -->``: the executable's ``--help``.

The docstrings are written with Sphinx roles (``:class:`~hostless.Fence```); the API pages
show them as code (``Fence``), the role dropped, as Sphinx would.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = re.compile(r"<!-- include: ([\w./-]+) -->")
CLI = re.compile(r"<!-- cli: ([\w-]+) -->")
ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([^<]*)</code>")


def _include(name: str) -> str:
    text = (ROOT / name).read_text()
    text = re.sub(r"\]\(docs/", "](", text)  # the README's links into docs/ are siblings here
    text = text.replace("](CHANGELOG.md)", "](changelog.md)")  # the site's copy of it
    return re.sub(r"^# hostless\n", "", text, count=1)  # the README's title: the page has its own


def _block(title: str, text: str) -> str:
    return f"### `{title}`\n\n```text\n{text.rstrip()}\n```\n"


def _hostless_help() -> str:
    from hostless.cli import build_parser

    parser = build_parser()
    out = [_block("hostless --help", parser.format_help())]
    for action in parser._actions:  # the subcommands, in the order the parser adds them
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append(_block(f"hostless {name} --help", sub.format_help()))
    return "\n".join(out)


def _agent_help() -> str:
    from hostless.agents import executable_path

    r = subprocess.run([executable_path(), "--help"], capture_output=True, text=True, timeout=30)
    return _block("hostless-agent --help", r.stdout + r.stderr)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = INCLUDE.sub(lambda m: _include(m.group(1)), markdown)

    def cli(m: re.Match[str]) -> str:
        which = m.group(1)
        if which == "hostless":
            return _hostless_help()
        if which == "hostless-agent":
            return _agent_help()
        raise ValueError(f"{page.file.src_path}: no CLI named {which!r}")

    return CLI.sub(cli, markdown)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    def code(m: re.Match[str]) -> str:
        target = m.group(2)
        return f"<code>{target.rsplit('.', 1)[-1] if m.group(1) else target}</code>"

    return ROLE.sub(code, html)
