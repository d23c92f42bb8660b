"""The package's layers (pyproject.toml, ``[tool.importlinter]``) name every module of it.

``make test`` runs ``lint-imports``, which checks that every import points down the layers; a
module missing from the list would escape that check, so a new module must be given its layer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "hostless"


def layered_modules() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    assert contract["containers"] == ["hostless"]
    names: set[str] = set()
    for layer in contract["layers"]:
        names.update(n.strip(" ()") for n in re.split(r"[|:]", layer))
    return names


def package_modules() -> set[str]:
    out = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    out |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    out |= {p.name.split(".")[0] for p in PACKAGE.glob("*.pyi")}  # the extension (_core)
    return out


def test_every_module_has_a_layer() -> None:
    missing = package_modules() - layered_modules()
    assert not missing, f"give these modules a layer in pyproject.toml [tool.importlinter]: {sorted(missing)}"


def test_every_layer_is_a_module() -> None:
    assert layered_modules() - package_modules() == set()
