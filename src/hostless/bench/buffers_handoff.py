"""The hand-offs of the buffer benchmark: the consumer process and the producer's modes.

See :mod:`hostless.bench.buffers` for what each mode measures.  The producer
(:class:`Handoff`, this process) and the consumer (a spawned
:class:`~hostless.bench.harness.Child`) share a domain with a mailbox (a small
heap buffer) and two timelines: ``go`` (producer -> consumer: point ``2r - 1``
prepare, ``2r`` hand-off ``r``) and ``ack`` (consumer -> producer, owned by
the consumer so that its death fails it instead of hanging the producer).
The Pipe modes use the consumer's control connection for their messages.

Like for like (as in :mod:`hostless.bench.fences`): in every timed mode the
consumer spins, in its timeline wait (a spin budget longer than the wait) or
on ``Connection.poll()``; only ``zero_copy_plain_wait`` (for information) uses
the domain's default wait, which sleeps after 50 us.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from .harness import Child, drop_domain, is_held, new_domain, spin_for

__all__ = ["MODES", "PREPARE_DELAY", "Handoff"]

MODES: dict[str, str] = {
    "zero_copy": "hostless zero-copy (handle + timeline; consumer spinning)",
    "zero_copy_plain_wait": "hostless zero-copy, default wait, no prepare step",
    "zero_copy_full_fill": "hostless zero-copy, producer wrote every byte",
    "zero_copy_control": "control: 4 KiB zero-copy hand-off after the producer wrote this size",
    "copy": "hostless copy mode (copy_to staging, copy_to out)",
    "shm_pipe": "multiprocessing.shared_memory + Pipe message (consumer spinning on poll())",
    "pickle_pipe": "ndarray pickled over a Pipe (consumer spinning on poll())",
}

_WAIT_TIMEOUT = 600.0
_SPIN = 30.0  # seconds a consumer's timeline wait spins: the whole wait, in practice
PREPARE_DELAY = 20e-6
"""Seconds between the (untimed) prepare signal and the timed hand-off."""


def _produce(a: np.ndarray[Any, Any], r: int, full: bool = False) -> None:
    """The producer's work on buffer ``a`` (uint8) before hand-off ``r``, not measured:
    one byte written in every 4 KiB page (so every page is resident and dirty, as
    after a device wrote it), or every byte with ``full``."""
    v = _fill_value(r)
    if full:
        a.fill(v)
    else:
        a[::4096] = v
        a[-1] = v


def _fill_value(i: int) -> int:
    return i % 251 + 1  # never 0: a page nobody wrote reads as 0


# --------------------------------------------------------------------------- consumer process


def _consumer_main(conn: Connection, name: str) -> None:
    """The consumer (runs in a spawned :class:`~hostless.bench.harness.Child`): joins the
    domain, then runs commands until "quit"."""
    import hostless as hl

    dom = hl.Domain.open(name, label="bench-consumer")
    try:
        conn.send(("joined", dom.participant_id))
        msg, (mb_h, go_h, ack_h) = conn.recv()
        if msg != "objects":
            raise RuntimeError(f"unexpected message {msg!r}")
        mailbox = dom.import_buffer(mb_h)
        go = dom.import_timeline(go_h)
        ack = dom.import_timeline(ack_h)
        conn.send(("ready", None))
        while True:
            cmd, args = conn.recv()
            if cmd == "quit":
                break
            if cmd in ("zero_copy", "zero_copy_full_fill", "zero_copy_control"):
                out = _consume_zero_copy(dom, mailbox, go, ack, **args)
            elif cmd == "zero_copy_plain_wait":
                out = _consume_zero_copy(dom, mailbox, go, ack, prepare=False, **args)
            elif cmd == "copy":
                out = _consume_copy(dom, mailbox, go, ack, **args)
            elif cmd == "shm_pipe":
                out = _consume_shm(conn, **args)
            elif cmd == "pickle_pipe":
                out = _consume_pickle(conn, **args)
            else:
                raise ValueError(f"unknown command {cmd!r}")
            conn.send(("samples", out))
        for o in (mailbox, go, ack):
            o.release()
    finally:
        dom.close()


def _check_first(r: int, x: Any) -> None:
    if int(x) != _fill_value(r):
        raise RuntimeError(f"hand-off {r}: first byte {int(x)}, expected {_fill_value(r)}")


def _wait_point(tl: Any, value: int, spin: float | None = _SPIN) -> None:
    st = tl.wait(value, _WAIT_TIMEOUT, spin=spin)
    if st.name != "SUCCESS":
        raise RuntimeError(f"producer timeline failed: {st.name}")


def _consume_zero_copy(
    dom: Any, mailbox: Any, go: Any, ack: Any, first: int, count: int, prepare: bool = True
) -> list[int]:
    mb = mailbox.numpy()
    signal, imp, clock = ack.signal, dom.import_buffer, time.monotonic_ns
    samples = [0] * count
    for k in range(count):
        r = first + k
        if prepare:
            _wait_point(go, 2 * r - 1, 0.0)  # sleeps through the producer's fill
            signal(2 * r - 1)  # back in a (spinning) wait in a moment
            _wait_point(go, 2 * r)
        else:
            _wait_point(go, 2 * r, None)  # the domain's default wait: spins 50 us, then sleeps
        b = imp(int(mb[0]))
        a = b.numpy()
        x = a[0]
        t1 = clock()
        samples[k] = t1 - int(mb[1])
        _check_first(r, x)
        del a
        b.release()
        signal(2 * r)
    return samples


def _consume_copy(
    dom: Any, mailbox: Any, go: Any, ack: Any, first: int, count: int, staging: int, size: int
) -> list[int]:
    import hostless as hl

    mb = mailbox.numpy()
    s = dom.import_buffer(staging)
    q = hl.PrivateBuffer(size)
    qa = q.numpy()
    signal, clock = ack.signal, time.monotonic_ns
    samples = [0] * count
    for k in range(count):
        r = first + k
        _wait_point(go, 2 * r - 1, 0.0)
        signal(2 * r - 1)
        _wait_point(go, 2 * r)
        s.copy_to(q)
        x = qa[0]
        t1 = clock()
        samples[k] = t1 - int(mb[1])
        _check_first(r, x)
        signal(2 * r)
    del qa
    s.release()
    return samples


def _spin_recv(conn: Connection) -> Any:
    poll = conn.poll
    deadline = time.monotonic() + _WAIT_TIMEOUT
    while not poll():
        if time.monotonic() > deadline:
            raise TimeoutError("producer sent nothing")
    return conn.recv()


def _expect_prepare(conn: Connection, r: int) -> None:
    """Block (sleep) until the producer's prepare notice, then say we are ready."""
    if not conn.poll(_WAIT_TIMEOUT):
        raise TimeoutError("producer sent nothing")
    msg = conn.recv()
    if msg != ("prepare", r):
        raise RuntimeError(f"expected ('prepare', {r}), got {msg!r}")
    conn.send(("ready", r))


def _consume_shm(conn: Connection, first: int, count: int, size: int) -> list[int]:
    from multiprocessing import shared_memory

    clock = time.monotonic_ns
    samples = [0] * count
    for k in range(count):
        r = first + k
        _expect_prepare(conn, r)
        shm_name, t0 = _spin_recv(conn)
        shm = shared_memory.SharedMemory(name=shm_name)
        a: np.ndarray[Any, Any] = np.ndarray((size,), dtype=np.uint8, buffer=shm.buf)
        x = a[0]
        t1 = clock()
        samples[k] = t1 - t0
        _check_first(r, x)
        del a
        shm.close()
        conn.send(("ack", r))
    return samples


def _consume_pickle(conn: Connection, first: int, count: int) -> list[int]:
    clock = time.monotonic_ns
    samples = [0] * count
    for k in range(count):
        r = first + k
        _expect_prepare(conn, r)
        t0, a = _spin_recv(conn)
        x = a[0]
        t1 = clock()
        samples[k] = t1 - t0
        _check_first(r, x)
        del a
        conn.send(("ack", r))
    return samples


# --------------------------------------------------------------------------- producer (this process)


class Handoff:
    """The producer side (this process): the domain, the mailbox, the two timelines, the consumer.

    Each mode is a method ``mode(size, count)`` that runs ``count`` hand-offs and
    returns the consumer's samples (ns)."""

    def __init__(self, heap: int, cpus: tuple[int | None, int | None]) -> None:
        import hostless as hl

        self.hl = hl
        self.mb: np.ndarray[Any, Any] | None = None
        self.mailbox: Any = None
        self.go: Any = None
        self.ack: Any = None
        self.dom, self.name = new_domain("buffers", fences=256, participants=4, heap=heap)
        self.consumer: Child | None = None
        try:
            self.consumer = Child(_consumer_main, (self.name,), cpus[1], role="consumer")
            peer = int(self.consumer.expect("joined"))
            self.mailbox = self.dom.buffer((8,), np.uint64)
            self.mb = self.mailbox.numpy()
            self.mb[:] = 0
            self.go = self.dom.timeline(0)
            # owned by the consumer: if it dies, recovery fails it and the producer cannot hang
            self.ack = self.dom.timeline(0, owner=peer)
            self.consumer.conn.send(("objects", (self.mailbox.handle, self.go.handle, self.ack.handle)))
            self.consumer.expect("ready")
        except BaseException:
            self.close()
            raise
        self.r = 0  # number of the last hand-off (timeline points 2r-1: prepare, 2r: hand-off)

    def close(self) -> None:
        """Stop the consumer, release the objects, close and unlink the domain."""
        if self.consumer is not None:
            self.consumer.close(quit=True)
        for attr in ("mailbox", "go", "ack"):
            o = getattr(self, attr, None)
            if o is not None and is_held(o):
                o.release()
        self.mb = None
        drop_domain(self.dom, self.name)

    def _ack(self, v: int, spin: float | None = None) -> None:
        st = self.ack.wait(v, _WAIT_TIMEOUT, spin=spin)
        if st is not self.hl.Status.SUCCESS:
            assert self.consumer is not None
            self.consumer.expect("samples", 1)  # raises with the consumer's traceback
            raise RuntimeError(f"consumer timeline failed: {st.name}")

    def _start(self, cmd: str, count: int, **kw: Any) -> int:
        """Send the consumer its command; returns the number of the first hand-off."""
        assert self.consumer is not None
        first = self.r + 1
        self.r += count
        self.consumer.conn.send((cmd, {"first": first, "count": count, **kw}))
        return first

    def _samples(self) -> np.ndarray[Any, Any]:
        assert self.consumer is not None
        return np.asarray(self.consumer.expect("samples", _WAIT_TIMEOUT), dtype=np.int64)

    def _prepare(self, r: int) -> None:
        """Wake the consumer (untimed), wait for it to say it is ready, then PREPARE_DELAY
        more, so that it is spinning in its wait, idle for the same short time at every size."""
        self.go.signal(2 * r - 1)
        self._ack(2 * r - 1, _SPIN)
        spin_for(PREPARE_DELAY)

    def zero_copy(self, size: int, count: int) -> np.ndarray[Any, Any]:
        return self._zero_copy(size, count, True)

    def zero_copy_plain_wait(self, size: int, count: int) -> np.ndarray[Any, Any]:
        return self._zero_copy(size, count, False)

    def zero_copy_full_fill(self, size: int, count: int) -> np.ndarray[Any, Any]:
        return self._zero_copy(size, count, True, full=True)

    def zero_copy_control(self, size: int, count: int) -> np.ndarray[Any, Any]:
        return self._zero_copy(size, count, True, control=True)

    def _zero_copy(
        self, size: int, count: int, prepare: bool, full: bool = False, control: bool = False
    ) -> np.ndarray[Any, Any]:
        cmd = "zero_copy_full_fill" if full else ("zero_copy" if prepare else "zero_copy_plain_wait")
        if control:
            cmd = "zero_copy_control"
        first = self._start(cmd, count)
        mb, buffer, signal, clock = self.mb, self.dom.buffer, self.go.signal, time.monotonic_ns
        assert mb is not None
        # control: the producer writes a buffer of `size` (not handed off), then hands off 4 KiB
        big = buffer(size) if control else None
        for k in range(count):
            r = first + k
            if big is not None:
                _produce(big.numpy(), r)
                b = buffer(4096)
            else:
                b = buffer(size)
            _produce(b.numpy(), r, full)  # the producer's work: not measured
            if prepare:
                self._prepare(r)
            mb[0] = b.handle
            t0 = clock()
            mb[1] = t0
            signal(2 * r)
            self._ack(2 * r)
            b.release()
        if big is not None:
            big.release()
        return self._samples()

    def copy(self, size: int, count: int) -> np.ndarray[Any, Any]:
        staging = self.dom.buffer(size)
        p = self.hl.PrivateBuffer(size)
        pa = p.numpy()
        try:
            first = self._start("copy", count, staging=staging.handle, size=size)
            mb, signal, clock = self.mb, self.go.signal, time.monotonic_ns
            assert mb is not None
            for k in range(count):
                r = first + k
                _produce(pa, r)  # the producer's work: not measured
                self._prepare(r)
                t0 = clock()
                p.copy_to(staging)
                mb[1] = t0
                signal(2 * r)
                self._ack(2 * r)
            return self._samples()
        finally:
            del pa
            staging.release()

    def shm_pipe(self, size: int, count: int) -> np.ndarray[Any, Any]:
        from multiprocessing import shared_memory

        assert self.consumer is not None
        conn = self.consumer.conn
        first = self._start("shm_pipe", count, size=size)
        clock = time.monotonic_ns
        for k in range(count):
            r = first + k
            shm = shared_memory.SharedMemory(create=True, size=size)
            try:
                a: np.ndarray[Any, Any] = np.ndarray((size,), dtype=np.uint8, buffer=shm.buf)
                _produce(a, r)  # the producer's work: not measured
                self._pipe_prepare(r)
                conn.send((shm.name, clock()))
                self._pipe_ack(r)
                del a
            finally:
                shm.close()
                shm.unlink()
        return self._samples()

    def pickle_pipe(self, size: int, count: int) -> np.ndarray[Any, Any]:
        assert self.consumer is not None
        conn = self.consumer.conn
        first = self._start("pickle_pipe", count)
        a = np.empty(size, dtype=np.uint8)
        clock = time.monotonic_ns
        for k in range(count):
            r = first + k
            _produce(a, r)  # the producer's work: not measured
            self._pipe_prepare(r)
            conn.send((clock(), a))
            self._pipe_ack(r)
        del a
        return self._samples()

    def _pipe_prepare(self, r: int) -> None:
        assert self.consumer is not None
        self.consumer.conn.send(("prepare", r))
        self._pipe_ack(r, "ready")
        spin_for(PREPARE_DELAY)

    def _pipe_ack(self, r: int, what: str = "ack") -> None:
        assert self.consumer is not None
        conn = self.consumer.conn
        while not conn.poll():  # spin: the consumer answers within microseconds
            pass
        msg, payload = conn.recv()
        if msg == "error":
            raise RuntimeError(f"benchmark consumer failed:\n{payload}")
        if (msg, payload) != (what, r):
            raise RuntimeError(f"benchmark consumer sent {msg!r} {payload!r}, expected {what} {r}")
