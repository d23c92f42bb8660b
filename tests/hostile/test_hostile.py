"""Hostile or corrupted shared memory: an innocent process that has the domain
mapped gets errors, never a crash, a hang or a write outside the mapping.

Each case runs in a child interpreter that joins a domain, corrupts it with
pwrite() into its file (as a buggy or hostile participant could) and then
keeps using it, so a crash shows up as the child's signal, not as a dead test
run.  (More cases belong to the hostile-memory issue; this file starts it.)
"""

from __future__ import annotations

import os

import pytest

import hostless as hl
from conftest import needs_test_hooks, run_child

POKE = """
    import os
    def poke(name, offset, value, size=8):
        fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
        try:
            os.pwrite(fd, value.to_bytes(size, "little"), offset)
        finally:
            os.close(fd)
"""


def test_trace_capacity_rewritten_after_attach(domain_name: str) -> None:
    """The ring's capacity is validated at attach and used from a private copy:
    0 (was SIGFPE in every signal) or huge values (were writes anywhere)."""
    body = POKE + """
    name = sys.argv[1]
    with hl.Domain.create(name, trace="64K") as d:
        off = int(d.header()["trace_offset"])
        f = d.fence()
        poke(name, off + 8, 0)  # capacity
        f.signal()
        f.release()
        poke(name, off + 8, 1 << 60)
        poke(name, off + 16, 1 << 59)  # write index
        for _ in range(100):
            g = d.fence()
            g.signal()
            g.release()
        print("check", d.check())
    """
    r = run_child(body, domain_name)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "check []" in r.stdout


def _run_ok(body: str, *args: object) -> str:
    r = run_child(POKE + body, *args, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    return r.stdout


def test_heap_layout_rewritten_after_attach(domain_name: str) -> None:
    """The heap's data_offset / bitmap_offset / granules / data_size and the
    header's heap_offset / fences_offset are used from the private view taken
    at attach (they were re-read: SIGSEGV in buffer(), or a silent write
    outside the mapping)."""
    out = _run_ok(
        """
    from hostless._abi import C
    name = sys.argv[1]
    with hl.Domain.create(name, heap="1M", fences=64) as d:
        h = d.header()
        hoff = int(h["heap_offset"])
        b = d.buffer((64,), "u1")
        for field in ("HP_DATA_OFFSET", "HP_BITMAP_OFFSET", "HP_GRANULES", "HP_DATA_SIZE"):
            poke(name, hoff + int(getattr(C, field)), (1 << 63) + 4096)
        poke(name, int(C.H_HEAP_OFFSET), 1 << 62)
        poke(name, int(C.H_FENCES_OFFSET), 1 << 62)
        for _ in range(50):
            x = d.buffer((1000,), "u1")
            x.numpy()[:] = 7
            x.release()
        f = d.fence()
        f.signal()
        f.release()
        b.numpy()[:] = 1
        print("sum", int(b.numpy().sum()))
        b.release()
        d.check()  # may report the corrupt header; must not crash
        print("done")
    """,
        domain_name,
    )
    assert "sum 64" in out and "done" in out


def test_queue_offsets_overflow_and_cell_ahead(domain_name: str) -> None:
    """Queue cells_offset / packets_offset chosen so that a naive bounds check
    overflows 64-bit arithmetic, and a cell whose sequence is ahead of
    write_index: a clear CorruptDomain error (was SIGSEGV / an endless spin),
    also in a process that opens the domain afterwards."""
    out = _run_ok(
        """
    import subprocess
    from hostless._abi import C
    from hostless.queue import Packet
    name = sys.argv[1]
    with hl.Domain.create(name, heap="1M", fences=64) as d:
        q = d.queue(8)
        qaddr, cells, packets, cap = d._core.queue_view(q.handle)
        qoff = qaddr - d._core.address()
        pk = Packet(kernel=1).encode()
        q.push(pk)
        poke(name, qoff + int(C.Q_CELLS_OFFSET), (1 << 64) - 8)
        poke(name, qoff + int(C.Q_PACKETS_OFFSET), (1 << 64) - 64)
        for attempt in range(2):
            try:
                q.push(pk, timeout=0.1)
                print("pushed?!")
            except hl.CorruptDomain as e:
                print("corrupt:", e)
        poke(name, qoff + int(C.Q_CELLS_OFFSET), int(C.QUEUE_HEADER_SIZE))
        poke(name, qoff + int(C.Q_PACKETS_OFFSET), (1 << 63))
        try:
            q.push(pk, timeout=0.1)
        except hl.CorruptDomain as e:
            print("corrupt2:", e)
        # restore the layout, then put a cell ahead of write_index
        poke(name, qoff + int(C.Q_PACKETS_OFFSET), packets - qaddr)
        w = int(q.info()["write_index"])
        cell = cells - d._core.address() + 8 * (w % cap)
        poke(name, cell, ((w + 5 * cap) << 16) | 0)
        t0 = time.monotonic()
        try:
            q.push(pk, timeout=1.0)
            print("pushed?!")
        except hl.CorruptDomain as e:
            print("ahead:", e, round(time.monotonic() - t0, 1))
        # a process that opens the domain now gets errors too
        code = (
            "import sys, hostless as hl\\n"
            "from hostless.queue import Packet\\n"
            "d = hl.Domain.open(sys.argv[1])\\n"
            "q = d.import_queue(int(sys.argv[2]))\\n"
            "try:\\n"
            "    q.push(Packet(kernel=1).encode(), timeout=0.1)\\n"
            "except hl.HostlessError as e:\\n"
            "    print('child:', type(e).__name__)\\n"
            "d.close()\\n"
        )
        r = subprocess.run([sys.executable, "-c", code, name, str(q.handle)], capture_output=True, text=True)
        print("child rc", r.returncode, r.stdout.strip(), r.stderr[-300:])
    """,
        domain_name,
    )
    assert out.count("corrupt:") == 2 and "corrupt2:" in out, out
    assert "ahead:" in out and "pushed?!" not in out, out
    assert "child rc 0 child: CorruptDomain" in out, out


def test_heap_lock_held_by_a_live_participant(domain_name: str) -> None:
    """A heap lock word naming a live participant that never lets go (a
    hostile write, or an allocator stopped with SIGSTOP): buffer() raises a
    clear error after a bounded wait, without holding the GIL meanwhile (it
    froze every thread of the process); a release meanwhile defers its free,
    which happens once the lock is back."""
    out = _run_ok(
        """
    import threading
    from hostless._abi import C, owner_code
    name = sys.argv[1]
    d = hl.Domain.create(name, heap="1M", fences=64, watchdog_interval=0.02)
    with d, hl.Domain.open(name) as peer:
        hoff = int(d.header()["heap_offset"])
        b = d.buffer((100,), "u1")
        poke(name, hoff + int(C.HP_LOCK), owner_code(peer.participant_id))
        ticks = []
        stop = threading.Event()
        def tick():
            while not stop.is_set():
                ticks.append(1)
                time.sleep(0.001)
        th = threading.Thread(target=tick)
        th.start()
        t0 = time.monotonic()
        try:
            d.buffer((10,), "u1")
            print("allocated?!")
        except hl.HostlessError as e:
            print("error:", e)
        took = time.monotonic() - t0
        stop.set()
        th.join()
        print("took", round(took, 1), "ticks", len(ticks) > 100)
        b.release()  # its free is deferred: the lock is still held
        poke(name, hoff + int(C.HP_LOCK), 0)
        deadline = time.monotonic() + 5
        while d.check() and time.monotonic() < deadline:
            time.sleep(0.05)
        print("check", d.check())
        x = d.buffer((10,), "u1")
        x.release()
        print("done")
    """,
        domain_name,
    )
    assert "error: the shared heap is locked by participant" in out, out
    assert "ticks True" in out, out
    assert "check []" in out and "done" in out, out


def test_domain_file_truncated_while_mapped(domain_name: str) -> None:
    """Another process truncates the domain file: the innocent process's
    watchdog, waiters and calls get CorruptDomain, never SIGBUS."""
    out = _run_ok(
        """
    import os, threading
    name = sys.argv[1]
    d = hl.Domain.create(name, heap="1M", fences=4096, watchdog_interval=0.01)
    f = d.fence()
    t = d.timeline()
    b = d.buffer((1 << 16,), "u1")
    errors = []
    def waiter():
        try:
            f.wait(10)
        except hl.HostlessError as e:
            errors.append(type(e).__name__)
    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.05)
    os.truncate(f"/dev/shm/{name}", 4096)
    time.sleep(0.1)  # the watchdog sweeps the table: it must not die of SIGBUS
    try:
        t.signal(5)
        print("signaled")
    except hl.HostlessError as e:
        print("signal error:", type(e).__name__)
    try:
        b.numpy()[:] = 1  # a buffer view touches truncated pages: zero pages, no SIGBUS
        print("buffer written")
    except hl.HostlessError as e:
        print("buffer error:", type(e).__name__)
    try:
        d.fence()
    except hl.HostlessError as e:
        print("fence error:", type(e).__name__)
    th.join(15)
    print("waiter", errors)
    d.close()
    print("closed")
    """,
        domain_name,
    )
    assert "fence error: CorruptDomain" in out, out
    assert "waiter ['CorruptDomain']" in out, out
    assert "closed" in out, out


def test_open_refuses_symlinks_and_foreign_owners(domain_name: str) -> None:
    """Domain.open does not follow a symbolic link and refuses a domain owned
    by another user unless asked to (a planted domain is writable by its
    owner at will)."""
    with hl.Domain.create(domain_name) as d:
        link = f"{domain_name}-link"
        os.symlink(f"/dev/shm/{domain_name}", f"/dev/shm/{link}")
        try:
            with pytest.raises(OSError):
                hl.Domain.open(link)
        finally:
            os.unlink(f"/dev/shm/{link}")
        uid = os.stat(f"/dev/shm/{domain_name}").st_uid
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root; the symlink case ran")
        os.chown(f"/dev/shm/{domain_name}", uid + 4242, -1)
        try:
            with pytest.raises(PermissionError, match="allow_other_owner"):
                hl.Domain.open(domain_name)
            with hl.Domain.open(domain_name, allow_other_owner=True) as peer:
                f = d.fence()
                g = peer.import_fence(f.handle)
                g.signal()
                assert f.wait(1) is hl.Status.SUCCESS
                g.release()
                f.release()
        finally:
            os.chown(f"/dev/shm/{domain_name}", uid, -1)


@needs_test_hooks
def test_invalid_completion_words_are_errors(dom: hl.Domain) -> None:
    """A completion word no conforming participant writes (a fence word of 1
    or 5, a timeline word of 2^63 or a failure with status 5): waits and
    status reads raise CorruptDomain (was ValueError from the Status enum)."""
    f = dom.fence()
    t = dom.timeline()
    for word in (1, 5, 63, 1 << 40):
        hl._core.testing.device_store(dom._core, f.handle, word)
        with pytest.raises(hl.CorruptDomain):
            f.wait(0)
        with pytest.raises(hl.CorruptDomain):
            _ = f.status
    for word in (1 << 63, int(hl._abi.C.TIMELINE_FAILED) | 5, int(hl._abi.C.TIMELINE_FAILED) | 2):
        hl._core.testing.device_store(dom._core, t.handle, word)
        with pytest.raises(hl.CorruptDomain):
            t.wait(1, 0)
        with pytest.raises(hl.CorruptDomain):
            _ = t.failure
    f.release()
    t.release()


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize(
    "kw",
    [
        {"spin": -1},
        {"watchdog_interval": -1},
        {"mode": -1},
        {"mode": 0o7777},
        {"heap": 2**70},
        {"trace": 2**70},
        {"queues": "99999T"},
        {"poll_interval": 1e30},
        {"poll_interval": 0},
        {"label": 5},
        {"kind": ""},
    ],
)
def test_bad_create_arguments(domain_name: str, kw: dict[str, object]) -> None:
    """Bad arguments are refused before anything is created or joined: no
    file is left behind and no descriptor is closed twice (a failure after
    joining closed the fd twice, so the caller's next file got EBADF)."""
    import gc

    gc.collect()  # earlier tests' garbage closes its descriptors now, not inside the comparison
    before = _fds()
    with pytest.raises((ValueError, TypeError)):
        hl.Domain.create(domain_name, **kw)  # type: ignore[arg-type]
    gc.collect()
    assert _fds() == before
    assert not os.path.exists(f"/dev/shm/{domain_name}")
    r, w = os.pipe()  # descriptors opened now stay valid after any late close
    gc.collect()
    os.write(w, b"x")
    assert os.read(r, 1) == b"x"
    os.close(r)
    os.close(w)


def test_bad_names_sizes_packets_and_timeouts(dom: hl.Domain, domain_name: str) -> None:
    from hostless.queue import Packet

    for name in ("bad\n", "x/y", ".", "", "a" * 201):
        with pytest.raises(ValueError):
            hl.Domain.create(name)
    with pytest.raises(TypeError):
        hl.Domain.open(domain_name, label=5)  # type: ignore[arg-type]
    with pytest.raises((ValueError, hl.OutOfMemory)):
        dom.buffer(2**64)
    with pytest.raises(ValueError, match="kernel"):
        Packet(kernel=2**40 << 30).encode()
    with pytest.raises(ValueError, match="wait"):
        Packet(wait=(1, -1)).encode()


def test_queue_timeouts_must_not_be_negative(domain_name: str) -> None:
    from hostless.queue import Packet

    with hl.Domain.create(domain_name, heap="1M") as d:
        q = d.queue(4)
        with pytest.raises(ValueError, match="timeout"):
            q.push(Packet(), timeout=-1)
        q.bind()
        with pytest.raises(ValueError, match="timeout"):
            q.pop(timeout=-1)
        with pytest.raises(ValueError, match="spin"):
            q.pop(timeout=0, spin=-1)
        q.release()


def test_cli_errors_are_messages(tmp_path: object, domain_name: str) -> None:
    """`hostless check` on a directory and `hostless trace -o` into a missing
    directory print one line, not a traceback or a wrong reason."""
    import subprocess
    import sys

    os.mkdir(f"/dev/shm/{domain_name}")
    try:
        cmd = [sys.executable, "-m", "hostless.cli", "check", domain_name]
        r = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        os.rmdir(f"/dev/shm/{domain_name}")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "directory" in r.stderr.lower(), r.stderr
    with hl.Domain.create(domain_name, trace="64K"):
        r = subprocess.run(
            [sys.executable, "-m", "hostless.cli", "trace", domain_name, "-o", "/nonexistent/x.json"],
            capture_output=True,
            text=True,
        )
    assert r.returncode == 2 and "no domain named" not in r.stderr and "/nonexistent" in r.stderr, r.stderr


def test_overlapping_regions_are_refused_at_attach(domain_name: str) -> None:
    """A header whose fence table was enlarged over the heap (every region
    still inside the file) is refused by a process that attaches afterwards
    (its recovery and info walked the heap as slots and hung); the processes
    attached before keep their private view."""
    with hl.Domain.create(domain_name, heap="1M", fences=128) as d:
        fcap = int(d.header()["fence_capacity"])
        fd = os.open(f"/dev/shm/{domain_name}", os.O_RDWR)
        try:
            os.pwrite(fd, (fcap + 4096).to_bytes(4, "little"), int(hl._abi.C.H_FENCE_CAPACITY))
        finally:
            os.close(fd)
        with pytest.raises(hl.CorruptDomain):
            hl.Domain.open(domain_name)
        f = d.fence()
        f.signal()
        assert f.wait(0) is hl.Status.SUCCESS
        f.release()
