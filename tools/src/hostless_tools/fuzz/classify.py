"""The outcome of an innocent (clean, crash, hang) from its exit status, its stderr (tracebacks,
sanitizer reports) and its last JSON line."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

from hostless.cli import EXIT_UNRECOVERED

from .policy import EXIT_UNEXPECTED, _accepted
from .procs import _Proc

_SAN_MARKERS = (
    "ERROR: AddressSanitizer",
    "runtime error:",
    "ERROR: LeakSanitizer",
    "SUMMARY: UndefinedBehavior",
)


def _tail(path: Path, n: int = 20) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return text.splitlines()[-n:]


def _exc_types(text: str) -> list[str]:
    """The exception type names of every traceback printed to ``text`` (uncaught, in a thread, in a
    callback the notifier caught, or "Exception ignored in" a destructor), in order."""
    out = []
    blocks = text.split("Traceback (most recent call last)")[1:]
    for block in blocks:
        for line in block.splitlines()[1:]:
            if line.startswith((" ", "\t")) or not line.strip():
                continue
            m = re.match(r"^([A-Za-z_][\w.]*)(?::|$)", line)
            if m:
                out.append(m.group(1))
            break
    return out


def _exc_type(text: str) -> str | None:
    """The type name of the last exception in a traceback printed to ``text``."""
    types = _exc_types(text)
    return types[-1] if types else None


def _type_accepted(qualname: str) -> bool:
    """True when the exception type named ``qualname`` (``hostless.errors.X``, ``ValueError``) is accepted."""
    import builtins
    import importlib

    mod, _, name = qualname.rpartition(".")
    obj: Any = None
    try:
        obj = getattr(importlib.import_module(mod), name, None) if mod else getattr(builtins, name, None)
    except ImportError:
        obj = None
    return isinstance(obj, type) and issubclass(obj, _accepted())


def _sig_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _classify(p: _Proc, san: list[str]) -> dict[str, Any]:
    rc = p.popen.returncode
    err_text = p.err.read_text(encoding="utf-8", errors="replace") if p.err.exists() else ""
    rec: dict[str, Any] = {"role": p.role, "pid": p.popen.pid, "rc": rc}
    done: dict[str, Any] = {}
    if p.out.exists():
        for line in reversed(p.out.read_text(encoding="utf-8", errors="replace").splitlines()):
            if line.startswith("{"):
                try:
                    done = json.loads(line)
                except ValueError:
                    pass
                break
    if done:
        rec["ops"] = done.get("ops")
        rec["errors"] = done.get("errors", {})
        rec["samples"] = done.get("samples", {})
    exc = _exc_type(err_text)
    outcome, why = "clean", ""
    if p.victim:
        why = "SIGKILLed on purpose after the first write (not classified)"
    elif p.hung:
        outcome, why = "hang", "still running after the deadline (SIGUSR1 stack dump, then SIGKILL)"
    elif san or any(m in err_text for m in _SAN_MARKERS):
        outcome, why = "crash", "sanitizer report"
    elif rc is not None and rc < 0:
        outcome, why = "crash", f"killed by {_sig_name(-rc)}"
    elif p.cli:
        if exc is not None and not _type_accepted(exc):
            outcome, why = "crash", f"unexpected exception {exc}"
        elif rc not in (0, 1, 2, EXIT_UNRECOVERED):  # a finding the command reports is no crash
            outcome, why = "crash", f"exit status {rc}"
    elif rc == EXIT_UNEXPECTED:
        m = re.search(r"^UNEXPECTED (\S+) in (\S+)", err_text, re.M)
        outcome, why = (
            "crash",
            f"unexpected exception {m.group(1)} in {m.group(2)}" if m else "unexpected exception",
        )
    elif rc != 0:
        if exc is not None and _type_accepted(exc):
            why = f"exited with accepted {exc}"
        else:
            outcome, why = "crash", f"exit status {rc}" + (f" ({exc})" if exc else "")
    else:
        swallowed = [t for t in _exc_types(err_text) if not _type_accepted(t)]
        if swallowed:
            outcome, why = (
                "crash",
                f"unexpected exception {swallowed[0]} printed (in a thread, callback or __del__)",
            )
    rec["outcome"], rec["why"] = outcome, why
    if (outcome != "clean" or rc != 0) and not p.victim:
        rec["stderr_tail"] = _tail(p.err, 40 if p.hung else 20)
    if san:
        rec["sanitizer"] = san[:60]
    return rec


def _san_reports(casedir: Path, role: str) -> list[str]:
    out: list[str] = []
    for f in sorted(casedir.glob(f"{role}.san.*")):
        out += f.read_text(encoding="utf-8", errors="replace").splitlines()
    return out
