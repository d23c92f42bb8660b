"""The README's Python examples run as written.

Each ```python block of README.md runs in a fresh interpreter.  The only
change made to the text: every domain name a block creates ("cam0", "pipe",
...) gets a unique suffix, so that two test runs on one machine do not meet
in /dev/shm.  A block that needs a GPU says so in its first line
(``# needs: cuda``) and is skipped here when CuPy is missing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
CREATE = re.compile(r"""Domain\.(?:create|open)\(\s*(["'])([A-Za-z0-9._-]+)\1""")


def blocks() -> list[str]:
    return BLOCK.findall(README.read_text())


def uniquify(code: str, suffix: str) -> str:
    names = {m.group(2) for m in CREATE.finditer(code)}
    for n in sorted(names, key=len, reverse=True):
        code = re.sub(
            rf"""(["']){re.escape(n)}\1""", lambda m, n=n: f"{m.group(1)}{n}-{suffix}{m.group(1)}", code
        )
    return code


def test_the_readme_has_examples() -> None:
    assert len(blocks()) >= 3


@pytest.mark.parametrize("index", range(len(blocks())))
def test_readme_example_runs(index: int, tmp_path: Path) -> None:
    code = blocks()[index]
    if code.startswith("# needs: cuda") and importlib.util.find_spec("cupy") is None:
        pytest.skip("README example needs a GPU (CuPy is not installed)")
    suffix = f"readme-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    script = tmp_path / f"readme_{index}.py"
    script.write_text(uniquify(code, suffix))
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    left = [f for f in os.listdir("/dev/shm") if suffix in f]
    for f in left:
        os.unlink(os.path.join("/dev/shm", f))
    assert r.returncode == 0, f"README block {index} failed:\n{code}\n--- stderr ---\n{r.stderr[-4000:]}"
    assert not left, f"README block {index} left {left} in /dev/shm"
