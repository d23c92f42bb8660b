"""The zygote of the chaos tests: one process with hostless imported that forks workers on
request, so that hundreds of participants can be started and SIGKILLed in seconds.

A test's zygote code is its own ``worker(name, hfile, seed, mode)`` (and whatever it
needs) followed by :data:`ZYGOTE_LOOP`.  The loop reads ``name hfile seed mode`` lines on
stdin, forks a worker for each (an exception is reported as ``error <pid> <traceback>``),
says ``spawned <seed> <pid>`` and ``exit <pid> <code>``, and ends at EOF once every
child has exited.  Workers write their own lines (``say``) to the same stdout.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from conftest import _line_queue

ZYGOTE_LOOP = r"""
children = set()
buf = b""
eof = False
while not eof or children:
    if not eof:
        r, _, _ = select.select([0], [], [], 0.005)
        if r:
            data = os.read(0, 4096)
            if not data:
                eof = True
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                name, hfile, seed, mode = line.decode().split()
                pid = os.fork()
                if pid == 0:
                    rc = 4
                    try:
                        worker(name, hfile, int(seed), mode)
                    except BaseException:
                        say("error %d %s" % (os.getpid(), traceback.format_exc().replace("\n", " | ")))
                    finally:
                        os._exit(rc)
                children.add(pid)
                say(f"spawned {seed} {pid}")
    else:
        select.select([], [], [], 0.005)
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        children.discard(pid)
        say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")
"""


@dataclass
class Worker:
    """What the parent knows of one worker."""

    seed: int
    mode: str
    spawned: float = 0.0
    pid: int = 0
    ready: float = 0.0
    kill_at: float = 0.0
    killed: bool = False
    locked: bool = False


def start(code: str) -> subprocess.Popen[str]:
    """Start a zygote running ``code`` (which ends with ZYGOTE_LOOP), with line-buffered pipes."""
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def poll(
    zygote: subprocess.Popen[str], handle: Callable[[str], None], failures: list[str], timeout: float
) -> None:
    """Hand every line the zygote and its workers said to ``handle``, waiting up to ``timeout``
    seconds for the first; a zygote that exited is a failure."""
    lineq = _line_queue(zygote)
    try:
        item = lineq.get(timeout=timeout)
    except queue.Empty:
        return
    while True:
        if item is None:
            failures.append("zygote exited: " + (zygote.stderr.read() if zygote.stderr else ""))
            return
        handle(item.strip())
        try:
            item = lineq.get_nowait()
        except queue.Empty:
            return


def stop(zygote: subprocess.Popen[str], workers: Iterable[Worker]) -> None:
    """SIGKILL every worker still listed (by pid) and the zygote, and reap the zygote."""
    for w in workers:
        try:
            os.kill(w.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if zygote.poll() is None:
        zygote.kill()
    zygote.wait(10)
