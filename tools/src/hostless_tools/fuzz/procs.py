"""The fuzzer's child processes: innocents and CLI probes started by module path (each with its
own sanitizer log), told to stop, and reaped (a late one is dumped with SIGUSR1, then killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import _tooling
from .innocent import INNOCENT_MODULE


@dataclass
class _Proc:
    role: str
    popen: subprocess.Popen[bytes]
    out: Path
    err: Path
    cli: bool = False
    hung: bool = False
    victim: bool = False


def _san_env(env: dict[str, str], logbase: Path) -> dict[str, str]:
    """Point the sanitizers' reports of one innocent at its own log files."""
    for key in ("ASAN_OPTIONS", "UBSAN_OPTIONS"):
        if key in env:
            env[key] = env[key] + f":log_path={logbase}.{key[:5].lower()}"
    return env


def _popen(tag: str, cmd: list[str], casedir: Path, stdin: int) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Start ``cmd`` with its stdout and stderr in ``casedir/<tag>.out`` and ``.err`` and the
    sanitizers' reports in ``casedir/<tag>.san.*``."""
    out, err = casedir / f"{tag}.out", casedir / f"{tag}.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        pop = subprocess.Popen(
            cmd, stdin=stdin, stdout=fo, stderr=fe, env=_san_env(dict(os.environ), casedir / f"{tag}.san")
        )
    return pop, out, err


def _spawn(role: str, name: str, casedir: Path, seed: str, hook: str | None) -> _Proc:
    """An innocent (``python -m hostless_tools.fuzz innocent``); closing its stdin tells it to stop."""
    args = ["innocent", role, name, "--dir", str(casedir), "--seed", seed]
    if hook:
        args += ["--hook", hook]
    pop, out, err = _popen(role, _tooling.child_command(INNOCENT_MODULE, *args), casedir, subprocess.PIPE)
    return _Proc(role, pop, out, err)


def _spawn_cli(args: list[str], tag: str, casedir: Path) -> _Proc:
    """A CLI probe (``python -m hostless.cli --plain ARGS``) that attaches after the corruption."""
    cmd = _tooling.child_command("hostless.cli", "--plain", *args)
    pop, out, err = _popen(tag, cmd, casedir, subprocess.DEVNULL)
    return _Proc(tag, pop, out, err, cli=True)


def _stop(p: _Proc) -> None:
    if p.popen.stdin is not None:
        try:
            p.popen.stdin.close()
        except OSError:
            pass


def _reap(procs: Sequence[_Proc], deadline: float) -> None:
    """Wait for every process until ``deadline`` (monotonic); the late ones are dumped, then killed."""
    for p in procs:
        left = deadline - time.monotonic()
        try:
            p.popen.wait(timeout=max(0.01, left))
        except subprocess.TimeoutExpired:
            p.hung = True
            try:
                p.popen.send_signal(signal.SIGUSR1)
            except OSError:
                pass
            time.sleep(0.5)
            p.popen.kill()
            p.popen.wait()
