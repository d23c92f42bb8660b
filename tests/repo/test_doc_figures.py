"""Every measured figure README.md, docs/*.md and benchmarks/README.md quote matches the committed
run it names.

A quoted figure carries a marker right after it (an HTML comment, invisible when rendered):

    a hop costs 11.3 us<!-- fig: benchmarks/results/X.json goals/0/value * 1e-3 -->

``FILE`` is a committed result file (a path from the repository root), or
``@NAME`` for a file the document names once with
``<!-- figfile: NAME = benchmarks/results/X.json -->``; the
value is a path of keys into its JSON, separated by ``/`` (list items by
index), optionally divided by a second path (``A // B``, for a ratio of two
figures of the same run) and scaled (``* 1e-3``: ns quoted in us).  The figure
is the last number before the marker; it matches when the file's value,
rounded to the figure's decimals, equals it.

Between ``<!-- figures -->`` and ``<!-- /figures -->`` every number with a unit
of measure (ns, us, ms, s, x, %, M/s, MHz) must carry a marker, so a figure
cannot be quoted there without its source; a number that is a setting, not a
measurement (a 1 ms bounded sleep), is followed by ``<!-- setting -->``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]

ALIAS = re.compile(r"<!--\s*figfile:\s*(?P<name>\w+)\s*=\s*(?P<file>\S+)\s*-->")
MARKER = re.compile(r"<!--\s*fig:\s*(?P<file>\S+)\s+(?P<spec>.*?)\s*-->")
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")
UNIT_FIGURE = re.compile(r"(?<![\w.^])(\d[\d,]*(?:\.\d+)?)\s?(?:ns|us|ms|s|x|%|M/s|MHz)(?![\w/])")
REGION = re.compile(r"<!-- figures -->(.*?)<!-- /figures -->", re.S)


@dataclass(frozen=True)
class Quote:
    doc: str
    line: int
    text: str  # the quoted number, as written
    file: str
    spec: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}:{self.text}"


def _name(doc: Path) -> str:
    """A document's path from the repository root (two documents are named README.md)."""
    return str(doc.relative_to(ROOT)) if doc.is_relative_to(ROOT) else doc.name


def _lineno(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def quotes(doc: Path, text: str | None = None) -> list[Quote]:
    """The marked figures of one document (``text`` overrides the file's content)."""
    text = doc.read_text(encoding="utf-8") if text is None else text
    aliases = {m["name"]: m["file"] for m in ALIAS.finditer(text)}
    name = _name(doc)
    out: list[Quote] = []
    prev_end = 0
    for m in MARKER.finditer(text):
        start = max(prev_end, text.rfind("\n", 0, m.start()) + 1)
        nums = NUMBER.findall(text[start : m.start()])
        if not nums:
            where = f"{name}:{_lineno(text, m.start())}"
            raise AssertionError(f"{where}: a fig marker with no number before it")
        file = m["file"]
        if file.startswith("@"):
            if file[1:] not in aliases:
                raise AssertionError(f"{name}:{_lineno(text, m.start())}: no figfile named {file[1:]!r}")
            file = aliases[file[1:]]
        out.append(Quote(name, _lineno(text, m.start()), nums[-1], file, m["spec"]))
        prev_end = m.end()
    return out


@cache
def _load(file: str) -> Any:
    return json.loads((ROOT / file).read_text(encoding="utf-8"))


def _lookup(data: Any, path: str) -> float:
    node = data
    for key in path.strip().split("/"):
        node = node[int(key)] if isinstance(node, list) else node[key]
    if not isinstance(node, (int, float)) or isinstance(node, bool):
        raise TypeError(f"{path!r} is {node!r}, not a number")
    return float(node)


def value(file: str, spec: str) -> float:
    """The figure a marker's file and spec name."""
    scale = 1.0
    if " * " in spec:
        spec, s = spec.rsplit(" * ", 1)
        scale = float(s)
    data = _load(file)
    if " // " in spec:
        a, b = spec.split(" // ", 1)
        return _lookup(data, a) / _lookup(data, b) * scale
    return _lookup(data, spec) * scale


def matches(quoted: str, v: float) -> bool:
    """``quoted`` (as written, e.g. "11.3" or "1,434") is ``v`` rounded to its decimals."""
    q = float(quoted.replace(",", ""))
    decimals = len(quoted.split(".", 1)[1]) if "." in quoted else 0
    return math.isclose(round(v, decimals), q, rel_tol=0, abs_tol=10.0 ** -(decimals + 6))


def unmarked(doc: Path, text: str | None = None) -> list[str]:
    """Numbers with a unit inside ``figures`` regions that carry no marker."""
    text = doc.read_text(encoding="utf-8") if text is None else text
    bad = []
    for region in REGION.finditer(text):
        body = MARKER.sub(lambda m: "\0" * len(m[0]), region[1])  # marker contents are no figures
        body = re.sub(r"<!-- setting -->", lambda m: "\1" * len(m[0]), body)
        for m in UNIT_FIGURE.finditer(body):
            after = body[m.end() :]
            nxt = NUMBER.search(after)
            window = after[: nxt.start() if nxt else len(after)]
            if "\0" not in window and "\1" not in window:
                pos = region.start(1) + m.start()
                bad.append(f"{_name(doc)}:{_lineno(text, pos)}: {m[0]!r}")
    return bad


ALL = [q for d in DOCS for q in quotes(d)]


def test_docs_quote_figures() -> None:
    # the convention is in use where the measured figures are
    quoting = {"README.md", "docs/gpu.md", "docs/packet-travel.md", "benchmarks/README.md"}
    assert {q.doc for q in ALL} >= quoting
    assert all((ROOT / q.file).is_file() for q in ALL), [q.file for q in ALL if not (ROOT / q.file).is_file()]
    assert all(q.file.startswith("benchmarks/results/") for q in ALL)


@pytest.mark.parametrize("q", ALL, ids=[q.id for q in ALL])
def test_quoted_figure_matches_its_result_file(q: Quote) -> None:
    v = value(q.file, q.spec)
    assert matches(q.text, v), f"{q.doc}:{q.line} quotes {q.text}, {q.file} {q.spec} is {v:.6g}"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_figure_in_a_figures_region_has_a_source(doc: Path) -> None:
    assert unmarked(doc) == []


def test_checker_catches_a_drifted_or_unsourced_figure() -> None:
    """The checks above fail when one number of a document changes (or loses its marker)."""
    doc = ROOT / "README.md"
    text = doc.read_text(encoding="utf-8")
    q = quotes(doc, text)[0]
    assert matches(q.text, value(q.file, q.spec))
    # change the first quoted number by one unit of its last digit
    m = next(MARKER.finditer(text))
    head = text[: m.start()]
    n = list(NUMBER.finditer(head))[-1]
    decimals = len(n[0].split(".", 1)[1]) if "." in n[0] else 0
    bumped = f"{float(n[0].replace(',', '')) + 10.0**-decimals:.{decimals}f}"
    drifted = head[: n.start()] + bumped + text[n.end() :]
    q2 = quotes(doc, drifted)[0]
    assert q2.text == bumped and not matches(q2.text, value(q2.file, q2.spec))
    # a figure with a unit but no marker inside a region is reported
    assert unmarked(doc, "<!-- figures -->\nit takes 12.5 us a hop\n<!-- /figures -->") != []
    assert unmarked(doc, "<!-- figures -->\nsleeps 1 ms<!-- setting --> at most\n<!-- /figures -->") == []
    assert matches("1,434", 1433.6) and matches("0.67", 0.6663) and not matches("0.66", 0.6663)
