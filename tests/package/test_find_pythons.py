"""tools/find_pythons.sh, the interpreters ``make wheel`` builds for by default: the first
that works per version, a missing version a warning, none at all a failure.

A fake pyenv root holds symlinks to the running interpreter under version folders: one of the
right version (found), one of a version it is not (an impostor: refused), a newer patch release
of the right version that does not run (skipped for the older one that does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "find_pythons.sh"
REAL = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
MINE = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _fake(root: Path, folder: str, name: str, target: str | None) -> Path:
    """root/versions/folder/bin/name: a symlink to target, or a script that fails."""
    b = root / "versions" / folder / "bin"
    b.mkdir(parents=True)
    p = b / name
    if target:
        p.symlink_to(target)
    else:
        p.write_text("#!/bin/sh\nexit 1\n")
        p.chmod(0o755)
    return p


def _run(tmp_path: Path, *versions: str) -> subprocess.CompletedProcess[str]:
    # PATH with the tools the script uses and no pythonX.Y
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    for tool in ("ls", "sort"):
        if not (bin_ / tool).exists():
            where = subprocess.check_output(["sh", "-c", f"command -v {tool}"], text=True).strip()
            (bin_ / tool).symlink_to(where)
    env = {"PATH": str(bin_), "PYENV_ROOT": str(tmp_path / "pyenv"), "HOME": str(tmp_path)}
    cmd = ["/bin/sh", str(SCRIPT), *versions]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_finds_the_working_interpreter_and_warns_for_the_missing(tmp_path: Path) -> None:
    root = tmp_path / "pyenv"
    good = _fake(root, f"{MINE}.0", f"python{MINE}", REAL)
    _fake(root, f"{MINE}.9", f"python{MINE}", None)  # newer, but does not run
    _fake(root, "3.99.0", "python3.99", REAL)  # says it is 3.99 but is MINE
    r = _run(tmp_path, MINE, "3.99", "3.98")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(good)], (r.stdout, r.stderr)
    assert f"CPython {MINE}: {good}" in r.stderr
    warning = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and "3.99 3.98" in warning[0], r.stderr


def test_none_found_is_a_failure(tmp_path: Path) -> None:
    _fake(tmp_path / "pyenv", "3.99.0", "python3.99", None)
    r = _run(tmp_path, "3.99")
    assert r.returncode == 1 and r.stdout.strip() == "", (r.stdout, r.stderr)
    assert "no working CPython for 3.99" in r.stderr
