"""Versions that tell: the package's version has one home (pyproject.toml's [project] version,
which ``hostless.__version__`` reads from the installed distribution), and CHANGELOG.md's first
release heading names that version and the ABI version of the headers."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import hostless as hl

ROOT = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    m = re.search(r'^version\s*=\s*"([^"]+)"', project, re.M)
    assert m, "pyproject.toml has no [project] version"
    return m.group(1)


def test_version_has_one_home() -> None:
    assert hl.__version__ == _pyproject_version() == metadata.version("hostless")
    for path in (ROOT / "src" / "hostless").rglob("*.py"):  # no second copy of the number
        assert not re.search(r"__version__\s*=\s*['\"]\d+\.\d", path.read_text()), path


def test_changelog_names_this_version_and_its_abi() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    heads = re.findall(r"^## (\S+) \(ABI version (\d+)\)", text, re.M)
    assert heads, "CHANGELOG.md has no '## VERSION (ABI version N)' heading"
    assert heads[0] == (hl.__version__, str(hl.ABI_VERSION))
    table = dict(re.findall(r"^\| (\d+) \| (.+) \|$", text, re.M))
    assert str(hl.ABI_VERSION) in table, "the ABI versions table lacks this version"
