"""The README's "Where things are" table matches the repository's folders, and every path
that the README and docs/ name under tests/ exists (so a move of a test updates its readers).

Only docs/ and the README count: benchmarks/results/ holds past runs' records, which name
the paths of their day.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TEST_PATH = re.compile(r"\btests/[A-Za-z0-9_./-]*[A-Za-z0-9_]")


def _table() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## Where things are")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_table_names_every_folder_of_the_tests() -> None:
    folders = sorted(p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    assert len(folders) >= 5, folders
    table = _table()
    missing = [f for f in folders if f"`tests/{f}/`" not in table]
    assert not missing, f"tests folders missing from the README's 'Where things are': {missing}"


def test_the_tests_are_in_folders() -> None:
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"test files outside a kind's folder: {loose} (tests/<kind>/, see tests/conftest.py)"


def test_every_tests_path_the_docs_name_exists() -> None:
    missing = []
    for doc in DOCS:
        for m in TEST_PATH.finditer(doc.read_text(encoding="utf-8")):
            path = m.group(0)
            if not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
    assert not missing, "paths under tests/ named in the docs that do not exist:\n" + "\n".join(missing)
