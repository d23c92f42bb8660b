"""No source file of the library, the tools, the benchmarks or the examples is over 600 lines
(issue 22's goal: a file that grows past it is split by what it holds, as
``binding/frame.c`` and ``binding/frame_io.c`` were)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 600
SOURCES = ("src", "tools/src", "benchmarks", "examples")
SUFFIXES = {".py", ".pyi", ".c", ".h", ".cu"}


def test_no_source_file_is_over_600_lines() -> None:
    long = {}
    for top in SOURCES:
        for p in (ROOT / top).rglob("*"):
            if p.suffix in SUFFIXES and p.is_file() and "build" not in p.relative_to(ROOT).parts:
                n = len(p.read_text(errors="replace").splitlines())
                if n > LIMIT:
                    long[str(p.relative_to(ROOT))] = n
    assert not long, f"split these by what they hold (at most {LIMIT} lines a file): {long}"
