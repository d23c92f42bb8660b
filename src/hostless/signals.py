"""Removing a creator's domain files when the process is stopped by a signal.

``Domain.create(..., unlink_on_close=True)`` removes the name in ``close()``
and at a normal exit.  A supervisor (``docker stop``, systemd, a shell's
``kill``) stops a process with SIGTERM, a closed terminal sends SIGHUP: their
default action ends the process without running Python's exit code, and the
file stayed in /dev/shm.  So while such a domain is open, this module handles
SIGTERM and SIGHUP: it removes the registered names (each only if it still
names the file that was created), then chains to what was there before:

* a handler the program set (before the domain was created): it is called,
  and decides what happens next (exit or not);
* the default action: it is restored and the signal raised again, so the
  process still ends "killed by SIGTERM" (exit status -15 / 143);
* SIG_IGN: the signal was ignored before, so nothing is installed for it (the
  process goes on; its name stays until close()).

A handler set by the program *after* the domain was created replaces this
one: call ``Domain.close()`` from it (or exit normally) to remove the name.
Signal handlers can only be set from the main thread: a domain created in
another thread while none is installed gets none (and ``close()`` still
removes the name).  SIGKILL cannot be caught: ``hostless gc`` and
``replace_stale=True`` are for that.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["SIGNALS", "register", "unregister", "installed"]

SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_lock = threading.Lock()
_names: dict[int, tuple[str, int, int]] = {}  # key -> (path, st_dev, st_ino)
_keys = iter(range(1, 1 << 62))
_previous: dict[int, Any] = {}  # signal -> the handler we replaced


def _unlink_all() -> None:
    with _lock:
        items = list(_names.values())
        _names.clear()
    for path, dev, ino in items:
        try:
            now = os.stat(path, follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (dev, ino):
                os.unlink(path)
        except OSError:
            pass


def _handler(signum: int, frame: FrameType | None) -> None:
    _unlink_all()
    prev = _previous.get(signum, signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)
        return
    if prev == signal.SIG_IGN:  # (never installed over SIG_IGN; kept for a handler swapped meanwhile)
        return
    # the default action: restore it and raise the signal again, so that the exit status says so
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for s in SIGNALS:
        cur = signal.getsignal(s)
        if cur is _handler or cur == signal.SIG_IGN or cur is None:
            continue  # ours already; ignored on purpose; set outside Python (left alone)
        _previous[s] = cur
        signal.signal(s, _handler)


def _uninstall() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for s, prev in list(_previous.items()):
        if signal.getsignal(s) is _handler:
            signal.signal(s, prev)
        del _previous[s]


def register(path: str, dev: int, ino: int) -> int:
    """Remove ``path`` (if it still is the file (dev, ino)) on SIGTERM / SIGHUP; returns a key
    for :func:`unregister`.  Installs the handlers (main thread only) on first use."""
    with _lock:
        key = next(_keys)
        _names[key] = (path, dev, ino)
    _install()
    return key


def unregister(key: int) -> None:
    """Forget a name (its domain was closed); the last one puts the previous handlers back."""
    with _lock:
        _names.pop(key, None)
        empty = not _names
    if empty:
        _uninstall()


def installed() -> dict[int, Callable[..., Any] | int | None]:
    """Signal -> the handler this module replaced, for the signals it handles now."""
    return dict(_previous)


def _after_fork_in_child() -> None:
    # a forked child does not own its parent's domains: its SIGTERM must not remove them
    with _lock:
        _names.clear()
    for s, prev in list(_previous.items()):
        if signal.getsignal(s) is _handler:
            signal.signal(s, prev)
        del _previous[s]


os.register_at_fork(after_in_child=_after_fork_in_child)
