"""The binding compiles against the limited C API of 3.11 (the abi3 wheel, ``make wheel
WHEEL_ABI3=1``): each ``src/hostless/binding/*.c``, with the flags ``setup.py`` gives it under
``HOSTLESS_LIMITED_API=1``, compiles without a warning.  A call outside the limited API (a
``PySequence_Fast_ITEMS``, a field read from a ``PyTypeObject``) fails here in seconds, long
before a wheel is built.  The test hooks are compiled in too, so their file is checked."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "src" / "hostless" / "binding").glob("*.c"))
FLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
         "-Wno-cast-function-type", "-DHOSTLESS_INTERNAL", "-DHOSTLESS_TEST_HOOKS"]  # fmt: skip

pytestmark = [
    pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc"),
    pytest.mark.skipif(sys.version_info < (3, 11), reason="the limited API of 3.11 needs its headers"),
]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_binding_compiles_against_the_limited_api(source: Path) -> None:
    include = sysconfig.get_paths()["include"]
    cmd = ["gcc", "-fsyntax-only", "-Werror", *FLAGS, "-DPy_LIMITED_API=0x030B0000",
           f"-I{ROOT / 'src' / 'hostless' / 'include'}", f"-I{include}", str(source)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{source.name} is not limited-API C:\n{r.stderr[-4000:]}"


def test_every_binding_file_is_checked() -> None:
    assert len(SOURCES) >= 10 and any(p.name == "handle_type.c" for p in SOURCES), SOURCES
