"""The wheel installs and runs where there is no C compiler.

``make wheel`` (a no-op for a wheel newer than the sdist) builds the sdist and the manylinux
wheel of each interpreter; each wheel is installed, binary-only, into a fresh venv of its own
Python whose PATH reaches no compiler (CC and CXX are /bin/false), and ``smoke.py`` runs there:
a domain, a fence each way across two processes, a 3-stage Graph on the default agents whose
last stage runs on the hostless-agent executable, and the C headers.

The interpreters: the running one (``make test``), or those HOSTLESS_WHEEL_PYTHONS names
(space-separated paths; ``make wheel-check`` sets it to every CPython 3.10-3.13 found).
3.11 and later take the one abi3 wheel (``hostless-*-cp311-abi3-*``, the extension built against
the limited C API), as ``make wheel`` builds by default; HOSTLESS_WHEEL_ABI3=0 (``make
wheel-check WHEEL_ABI3=0``) takes the per-interpreter wheels instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "dist"
PYTHONS = os.environ.get("HOSTLESS_WHEEL_PYTHONS", "").split() or [sys.executable]
ABI3 = os.environ.get("HOSTLESS_WHEEL_ABI3", "1") not in ("", "0")

pytestmark = pytest.mark.slow  # builds a wheel (about 1-2 minutes on 2 cores, per Python)


def _tag(python: str) -> str:
    r = subprocess.run(
        [python, "-c", "import sys; print('cp%d%d' % sys.version_info[:2])"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, f"{python} does not run: {r.stderr}"
    return r.stdout.strip()


@pytest.fixture(scope="module")
def wheels() -> dict[str, Path]:
    """make wheel for PYTHONS; {python: its manylinux wheel}."""
    pythons = "WHEEL_PYTHONS=" + " ".join(PYTHONS)
    make = ["make", "--no-print-directory", "wheel", pythons, f"WHEEL_ABI3={int(ABI3)}"]
    r = subprocess.run(
        make, cwd=ROOT, capture_output=True, text=True, timeout=1200 * len(PYTHONS),
    )  # fmt: skip
    assert r.returncode == 0, f"make wheel failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    out = {}
    for py in PYTHONS:
        tag = _tag(py)
        pattern = "cp311-abi3" if ABI3 and tag != "cp310" else f"{tag}-{tag}"
        found = sorted(DIST.glob(f"hostless-*-{pattern}-*manylinux*.whl"))
        assert found, f"make wheel built no manylinux wheel for {tag} in {DIST}: {sorted(DIST.iterdir())}"
        out[py] = found[-1]
    return out


@pytest.fixture(params=PYTHONS, ids=lambda p: os.path.basename(p) if len(PYTHONS) > 1 else "running")
def python(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def wheel(wheels: dict[str, Path], python: str) -> Path:
    return wheels[python]


def test_wheel_carries_extension_executable_and_headers(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    infos = {i.filename: i for i in zipfile.ZipFile(wheel).infolist()}
    core = [n for n in names if re.fullmatch(r"hostless/_core\..*\.so", n)]
    assert len(core) == 1, names
    assert (core[0] == "hostless/_core.abi3.so") == ("-abi3-" in wheel.name), (core, wheel.name)
    exe = infos["hostless/_bin/hostless-agent"]
    assert (exe.external_attr >> 16) & 0o111, "hostless-agent is not executable in the wheel"
    for h in ("hostless.h", "hostless_engine.h", "hostless_layout.h", "hostless_errors.h"):
        assert f"hostless/include/hostless/{h}" in names
    sdists = sorted(DIST.glob("hostless-*.tar.gz"))
    assert sdists, "make wheel built no sdist"
    members = tarfile.open(sdists[-1]).getnames()
    assert any(m.endswith("src/hostless/core/agent.c") for m in members)


def test_wheel_runs_without_a_compiler(wheel: Path, python: str, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=str(venv / "bin"), CC="/bin/false", CXX="/bin/false", LDSHARED="/bin/false")
    py = str(venv / "bin" / "python")
    r = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--only-binary=:all:", str(wheel)],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, f"pip install of the wheel failed:\n{r.stdout}\n{r.stderr}"
    r = subprocess.run(
        [py, str(ROOT / "tests" / "package" / "smoke.py")],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0 and "smoke ok" in r.stdout, f"smoke failed:\n{r.stdout}\n{r.stderr}"
    r = subprocess.run(
        [py, "-c", "import sys, hostless; print('%d.%d' % sys.version_info[:2], hostless.__file__)"],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    version, where = r.stdout.split()
    assert f"cp{version.replace('.', '')}" == _tag(python) and where.startswith(str(venv)), r.stdout
