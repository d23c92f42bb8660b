"""Shared fixtures and helpers of the hostless test suite.

The suite is in folders by kind (the README's "Where things are" says which):
unit (the handle types and the domain), agents (agents and graphs), model (the
protocol models and their replays against the engine), c (C programs taking part),
hostile (hostile peers and memory, trust), stress (SIGKILL soaks and chaos), gpu
(skipped without a GPU), tools (hostless-tools) and repo (the README, the docs'
figures, the import layers).  Test modules import helpers by module name, this
file's (``from conftest import ...``) and other test files' (``import
test_agents_hostile``) alike: every folder of the suite is put on ``sys.path`` here,
so a folder runs alone (``pytest tests/gpu``) as it runs with the rest; module names
are unique across the folders (pytest's default import mode needs that anyway).

Every test that creates a domain uses a unique name (``domain_name``) and the
name is unlinked when the test ends, whatever happened.  Child participants
run as separate interpreters (``subprocess`` + ``sys.executable -c``): a
child is a real, independent participant with its own liveness lock, and
killing it is what a crash looks like.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

import hostless as hl
from hostless._abi import FENCE_DTYPE, C

TESTS = os.path.dirname(os.path.abspath(__file__))
for _folder in sorted(os.listdir(TESTS)):
    _path = os.path.join(TESTS, _folder)
    if os.path.isdir(_path) and not _folder.startswith((".", "_")) and _path not in sys.path:
        sys.path.append(_path)


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's hook: absent without it)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test``'s ``--dist loadfile`` with pytest-xdist's worker-crash hang mended.

    When a worker dies (a test killed it: SIGKILL, ``os._exit``), xdist 3.8 reports the test
    it was running as failed ("worker 'gwN' crashed while running ...") and puts the rest of
    that worker's files back on the queue, but its ``loadfile`` scheduler then hangs for good
    (pytest-xdist issues 784, 1323, 1327): it requeues finished files (a replacement worker
    is sent an empty list and never reports), it starts the crashed test again, and a
    replacement that gets a single test waits for a second one that never comes.  CI then
    sat until its time limit with no summary, so nobody learned which test crashed.  Here a
    crashed test is not run again, only files with tests left go back on the queue, and a
    worker is topped up to more than one test (or told to finish) after every change, a
    replacement only once it has collected; the run ends and its summary names the crashed
    test.  Only for ``--dist loadfile``."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler.loadfile import LoadFileScheduling

    class CrashSafeLoadFile(LoadFileScheduling):  # type: ignore[misc]
        def remove_node(self, node: Any) -> str | None:
            workload = self.assigned_work.pop(node)
            pending = [(u, n) for u, unit in workload.items() for n, done in unit.items() if not done]
            if not pending:
                return None
            crashed = pending[0][1]  # a worker runs its tests in order: the first pending one
            workload[pending[0][0]][crashed] = True  # reported failed by xdist; never again
            for unit, tests in workload.items():
                if not all(tests.values()):
                    self.workqueue[unit] = tests
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

        def _reschedule(self, node: Any) -> None:
            if node.shutting_down or node not in self.registered_collections:
                return  # (a replacement still collecting: schedule() serves it when it is done)
            try:
                while self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
                    self._assign_work_unit(node)
                if not self.workqueue:
                    node.shutdown()  # the worker runs what it holds, then ends
            except OSError:
                # its worker died before this (a test it ran next killed it) and xdist has not
                # seen it go down yet: what it was given stays in its assigned work, which
                # remove_node puts back on the queue when the node-down event comes
                return

        def schedule(self) -> None:
            if self.collection is not None:  # a replacement worker joined after a crash
                for node in self.nodes:
                    self._reschedule(node)
                return
            super().schedule()

    return CrashSafeLoadFile(config, log)


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's hook: absent without it)
def pytest_testnodedown(node: Any, error: object) -> None:
    """After a worker crash, say how its process ended (a signal's name or an exit code):
    the crash's failure report names the test, this the cause."""
    if not error:
        return
    import signal as _signal

    try:
        code = node.gateway._io.popen.wait(timeout=10)
    except Exception as e:  # noqa: BLE001 - a diagnostic only
        code = f"unknown ({type(e).__name__}: {e})"
    if isinstance(code, int) and code < 0:
        code = f"{code} ({_signal.Signals(-code).name})"
    tr = node.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"[{node.gateway.id}] the worker process ended with status {code}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of ``tests/stress/`` (SIGKILL soaks, chaos) is ``slow``: ``-m "not slow"``
    leaves the folder out of a quick loop."""
    stress = os.path.join(TESTS, "stress") + os.sep
    for item in items:
        if str(item.path).startswith(stress):
            item.add_marker(pytest.mark.slow)


# Prepended to every child's code.
CHILD_PRELUDE = "import os, sys, time\nimport hostless as hl\n"


def unique_name(prefix: str = "hltest") -> str:
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def unlink_quietly(name: str) -> None:
    try:
        hl.Domain.unlink(name)
    except FileNotFoundError:
        pass


@pytest.fixture
def domain_name() -> Iterator[str]:
    """A fresh domain name; the name is unlinked after the test."""
    name = unique_name()
    try:
        yield name
    finally:
        unlink_quietly(name)


@pytest.fixture
def make_name() -> Iterator[Callable[[], str]]:
    """Factory of fresh domain names (all unlinked after the test)."""
    names: list[str] = []

    def make() -> str:
        names.append(unique_name())
        return names[-1]

    try:
        yield make
    finally:
        for n in names:
            unlink_quietly(n)


def domain_of_another_tag(mine: hl.Domain, make: Callable[[], str], **kw: Any) -> hl.Domain:
    """A new domain (named by ``make``) whose random tag differs from ``mine``'s.

    Tags are drawn from 1..255 (docs/abi.md), so two domains share one 1 time in 255
    and then a handle of one is not told apart from the other's by its tag; a test of
    foreign handles needs two that differ."""
    for _ in range(20):
        other = hl.Domain.create(make(), **kw)
        if int(other.header()["tag"]) != int(mine.header()["tag"]):
            return other
        other.close()
    raise AssertionError("20 new domains in a row drew the same tag")


@pytest.fixture
def dom(domain_name: str) -> Iterator[hl.Domain]:
    """A small domain joined by this process; closed and unlinked afterwards."""
    d = hl.Domain.create(domain_name, fences=256, participants=16)
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def peer(dom: hl.Domain) -> Iterator[hl.Domain]:
    """A second participant of ``dom`` in this process (its own Domain object)."""
    assert dom.name is not None
    d = hl.Domain.open(dom.name, label="peer")
    try:
        yield d
    finally:
        d.close()


def child_code(body: str) -> str:
    return CHILD_PRELUDE + textwrap.dedent(body)


def run_child(body: str, *args: object, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a fresh interpreter (argv[1:] = args) and wait for it."""
    return subprocess.run(
        [sys.executable, "-c", child_code(body), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spawn_child(body: str, *args: object, stderr: Any = subprocess.PIPE) -> subprocess.Popen[str]:
    """Start ``body`` in a fresh interpreter with line-buffered text pipes on stdin/stdout."""
    return subprocess.Popen(
        [sys.executable, "-c", child_code(body), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        bufsize=1,
    )


def _line_queue(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """Lines of ``proc``'s stdout, read by a daemon thread (None at EOF)."""
    q: queue.Queue[str | None] | None = getattr(proc, "_hl_lines", None)
    if q is None:
        q = queue.Queue()
        stream = proc.stdout
        assert stream is not None

        def pump() -> None:
            try:
                for line in stream:
                    q.put(line)
            except (OSError, ValueError):
                pass
            q.put(None)

        threading.Thread(target=pump, daemon=True).start()
        proc._hl_lines = q  # type: ignore[attr-defined]
    return q


def read_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """Next stdout line of ``proc`` (fails the test if the child dies or stays silent)."""
    try:
        line = _line_queue(proc).get(timeout=timeout)
    except queue.Empty:
        proc.kill()
        pytest.fail(f"child {proc.pid} said nothing within {timeout} s")
    if line is None:
        proc.wait(timeout=10)
        err = proc.stderr.read() if proc.stderr else ""
        pytest.fail(f"child {proc.pid} exited (rc={proc.returncode}) before answering:\n{err}")
    return line.strip()


def send_line(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def finish_child(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """Wait for ``proc`` to exit 0; returns what it printed that was not read yet."""
    if proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"child {proc.pid} did not exit within {timeout} s")
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 0, f"child failed (rc={proc.returncode}):\n{err}"
    out = []
    q = _line_queue(proc)
    while True:
        line = q.get(timeout=10)
        if line is None:
            return "".join(out)
        out.append(line)


def kill_child(proc: subprocess.Popen[str]) -> None:
    """SIGKILL one child we started (by its pid) and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    if proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
    # stdout/stderr are left to the garbage collector: closing a pipe that the
    # line pump thread is reading would block until every writer (including a
    # grandchild the child forked) has gone.


def fence_table(d: hl.Domain) -> np.ndarray:
    """A copy of the fence table, as FENCE_DTYPE records."""
    h = d.header()
    return np.frombuffer(
        bytes(d.raw()), dtype=FENCE_DTYPE, count=int(h["fence_capacity"]), offset=int(h["fences_offset"])
    ).copy()


def slot_states(d: hl.Domain) -> np.ndarray:
    return (fence_table(d)["ctl"] & np.uint64(0xFF)).astype(np.int64)


def live_slots(d: hl.Domain) -> int:
    """Number of fence slots that are not FREE."""
    return int(np.count_nonzero(slot_states(d) != int(C.SLOT_FREE)))


def assert_all_free(d: hl.Domain) -> None:
    """Every fence slot FREE with no reference bit left: nothing leaked."""
    t = fence_table(d)
    states = (t["ctl"] & np.uint64(0xFF)).astype(np.int64)
    busy = np.nonzero(states != int(C.SLOT_FREE))[0]
    assert busy.size == 0, f"slots not freed: {busy.tolist()[:20]} states {states[busy][:20].tolist()}"
    refs = np.nonzero(t["refs"] != 0)[0]
    assert refs.size == 0, f"free slots with reference bits: {refs.tolist()[:20]}"


def slot_index(handle: int) -> int:
    return (handle & 0xFFFFFF) - 1


def new_at(make: Callable[[], Any], index: int) -> Any:
    """A new object from ``make()`` in slot ``index``: freed slots are reused
    round-robin, so allocate and release until the allocation comes round."""
    o = make()
    for _ in range(1 << 16):
        if slot_index(o.handle) == index:
            return o
        o.release()
        o = make()
    raise AssertionError(f"slot {index} never came round")


def wait_until(pred: Callable[[], bool], timeout: float = 5.0, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


TEST_HOOKS = hasattr(hl._core, "testing")
needs_test_hooks = pytest.mark.skipif(
    not TEST_HOOKS,
    reason="needs the test hooks (hostless._core.testing), compiled only into the test build: "
    "reinstall with HOSTLESS_TEST_HOOKS=1 (make venv and make test do)",
)
"""Mark a test that drives a failure through hostless._core.testing (heap_lock_forever, ...)."""

FULL = os.environ.get("HOSTLESS_TEST_FULL", "") not in ("", "0")
"""``HOSTLESS_TEST_FULL=1``: the soaks and model-based tests run at their full size (more kills,
more examples, longer sequences) instead of the smaller default that keeps ``make test`` within
its time on a 2-core machine.  The defaults are the same tests with smaller counts: every
check still runs, each adversarial step (a SIGKILL at a random point, a random operation
sequence) still happens many times."""


def full_or(default: int, full: int) -> int:
    """``full`` under ``HOSTLESS_TEST_FULL=1``, else ``default`` (a soak's or a model's size)."""
    return full if FULL else default


SLACK = 2.0
"""Seconds a unit test adds to any time it bounds (``expected + SLACK``): the machine
that runs the suite may be a loaded 2-core VM shared with other test runs, where a
thread can wait for a core for a good fraction of a second.  A bound tighter than
this is a speed figure, and speed figures belong to benchmarks/."""


def waiter_count(d: hl.Domain, obj: Any) -> int:
    """The waiter-count word of a fence, merged fence or timeline (``obj`` or its handle):
    ``struct hl_fence.waiters``, the host threads that are in (or about to enter, or just
    leaving) a FUTEX_WAIT on it.  Read in place (one 32-bit word, no copy of the table)."""
    from hostless import lowlevel

    off = lowlevel.completion_word_offset(d, obj) - int(C.F_WORD) + int(C.F_WAITERS)
    return int(np.frombuffer(d.raw(), dtype="<u4", count=1, offset=off)[0])


def thread_in_futex(pid: int, tid: int) -> bool:
    """Whether thread ``tid`` of process ``pid`` is asleep in a futex wait: state S in
    ``/proc/<pid>/task/<tid>/stat`` and, where the kernel shows it, a ``futex_*`` wait
    channel (``wchan``; "0" or unreadable when hidden, then the state alone counts)."""
    base = f"/proc/{pid}/task/{tid}"
    try:
        with open(f"{base}/stat") as f:
            raw = f.read()
    except OSError:
        return False
    if raw[raw.rindex(")") + 2 :].split()[0] != "S":
        return False
    try:
        with open(f"{base}/wchan") as f:
            chan = f.read().strip()
    except OSError:
        return True
    return chan in ("", "0") or chan.startswith("futex")


def wait_asleep(
    d: hl.Domain, obj: Any, n: int = 1, threads: Sequence[tuple[int, int]] = (), timeout: float = 20.0
) -> None:
    """Return once ``n`` host threads are asleep on ``obj`` (a fence, merged fence or
    timeline, or its handle), so that what the caller does next (a signal, a store, a
    kill) meets sleeping waiters and tests the wake-from-sleep path, however loaded the
    machine.  Asleep: the waiter-count word (:func:`waiter_count`, which a waiter raises
    right before FUTEX_WAIT and lowers after it) reads at least ``n`` and, in the same
    look, every thread of ``threads`` (``(pid, tid)`` of the waiters, where known) is in
    a futex wait (:func:`thread_in_futex`).  Fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        count = waiter_count(d, obj)
        if count >= n and all(thread_in_futex(p, t) for p, t in threads):
            return
        if time.monotonic() > deadline:
            states = {t: thread_in_futex(p, t) for p, t in threads}
            raise AssertionError(f"waiters never all asleep: count {count} (want {n}), in futex {states}")
        time.sleep(0.001)


def ident(th: threading.Thread) -> tuple[int, int]:
    """``(pid, tid)`` of a started thread of this process (for :func:`wait_asleep`)."""
    assert th.native_id is not None, "start the thread first"
    return os.getpid(), th.native_id


def notifier_ident(d: hl.Domain) -> tuple[int, int]:
    """``(pid, tid)`` of the domain's notifier thread (it runs awaits and done-callbacks)."""
    return ident(d.notifier()._thread)


def notifier_asleep(d: hl.Domain, objs: Sequence[Any], timeout: float = 20.0) -> None:
    """:func:`wait_asleep` for the domain's notifier thread: returns once it is in a
    futex wait with at least one of ``objs`` counting a waiter (it sleeps on up to 127
    words at once, rotating through more)."""
    th = notifier_ident(d)
    deadline = time.monotonic() + timeout
    while not (any(waiter_count(d, o) for o in objs) and thread_in_futex(*th)):
        assert time.monotonic() < deadline, "the notifier never slept on these objects"
        time.sleep(0.001)


async def notifier_asleep_async(d: hl.Domain, objs: Sequence[Any], timeout: float = 20.0) -> None:
    """:func:`notifier_asleep` from a coroutine (polls without blocking the event loop)."""
    import asyncio

    th = notifier_ident(d)
    deadline = time.monotonic() + timeout
    while not (any(waiter_count(d, o) for o in objs) and thread_in_futex(*th)):
        assert time.monotonic() < deadline, "the notifier never slept on these objects"
        await asyncio.sleep(0.001)
