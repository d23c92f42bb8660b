"""Device-heap chaos: participants SIGKILLed in the middle of device-buffer allocation,
import and release loops, some of them while holding a device heap's (or the host
heap's) lock.

As in test_heap_chaos, a "zygote" process (hostless imported once) forks the workers.
Each worker joins the domain and loops: allocate device buffers (on two device heaps,
random sizes and dtypes) and some host buffers, announce some of them (handle, device,
offset, shape, dtype) in a shared file, import announced ones and check that they come
back with exactly the announced placement and layout (a metadata block or an extent
reused while still referenced would show here), release.  Lock workers take one heap's
lock with ``heap_lock_forever(core, heap)`` and SIGKILL themselves, so the next
allocator must break the lock and rebuild that bitmap from the slots.

The run is made of rounds; in each the parent SIGKILLs workers at random times, and at
its end kills the rest, recovers them and requires ``check()`` to be clean (no overlap,
no leak, every bitmap equal to the slots) with only the parent's own buffers left in
the device heaps.  Its own buffers keep their placement throughout.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import hostless as hl
from conftest import needs_test_hooks, send_line, wait_until
from zygote import ZYGOTE_LOOP, Worker
from zygote import poll as poll_zygote
from zygote import start as start_zygote
from zygote import stop as stop_zygote

ROUNDS = 5
KILLS = 10  # per round, SIGKILLs sent by the parent to running workers
LOCK_DEATHS = 3  # per round, workers that die holding a heap lock
CONCURRENT = 4
DEVICES = {"cuda:0": "16M", "cuda:1": "8M"}
TIME_LIMIT = 25.0  # per round
G = 256

ZYGOTE_CODE = (
    r"""
import os, random, select, signal, sys, traceback
import numpy as np
import hostless as hl

OUT = sys.stdout.fileno()
DEVICES = ["cuda:0", "cuda:1"]
DTYPES = ["u1", "<i4", "<f8", "<u2"]

def say(msg):
    os.write(OUT, (msg + "\n").encode())

def size(rnd):
    r = rnd.random()
    if r < 0.6:
        return rnd.randrange(1, 4096)
    if r < 0.9:
        return rnd.randrange(4096, 65536)
    return rnd.randrange(65536, 1 << 20)

def desc(b):
    return f"{b.handle} {b.device} {b.device_offset} {'x'.join(map(str, b.shape))} {b.dtype.str}"

def worker(name, hfile, seed, mode):
    rnd = random.Random(seed)
    me = os.getpid()
    d = hl.Domain.open(name, label=f"dw{seed}", watchdog_interval=0.02 if rnd.random() < 0.5 else 0)
    say(f"ready {me}")
    out = os.open(hfile, os.O_WRONLY | os.O_APPEND)
    src = open(hfile)
    tail, pub, held = "", [], []
    lock_at = rnd.randrange(1, 300) if mode != "loop" else -1
    ops = 0
    while True:
        ops += 1
        if ops == lock_at:
            hl._core.testing.heap_lock_forever(d._core, int(mode[4:]))
            say(f"locked {me}")
            os.kill(me, signal.SIGKILL)
        if ops % 8 == 1:
            tail += src.read()
            *lines, tail = tail.split("\n")
            pub += [x.split() for x in lines if x]
            del pub[:-200]
        r = rnd.random()
        if r < 0.45 or not held:
            dt = np.dtype(rnd.choice(DTYPES))
            n = max(1, size(rnd) // dt.itemsize)
            shape = (n,) if n % 3 else (3, n // 3)
            dev = rnd.choice(DEVICES) if rnd.random() < 0.8 else "cpu"
            try:
                b = d.buffer(shape, dt, device=dev)
            except (hl.OutOfMemory, hl.DomainFull):
                continue
            if (b.device, b.shape, b.dtype) != (dev, shape, dt) or (dev != "cpu" and b.device_offset % 256):
                say(f"error {me} new buffer {desc(b)} is not {dev} {shape} {dt}")
                os._exit(3)
            held.append(b)
            if rnd.random() < 0.3:
                os.write(out, (desc(b) + "\n").encode())
        elif r < 0.85:
            held.pop(rnd.randrange(len(held))).release()
        elif pub:
            line = rnd.choice(pub)
            try:
                b = d.import_buffer(int(line[0]))
            except (hl.InvalidHandle, hl.DomainFull):
                continue  # released meanwhile
            if desc(b).split() != line:
                say(f"error {me} imported {desc(b)}, announced {' '.join(line)}")
                os._exit(3)
            held.append(b)
        if len(held) > 24:
            held.pop(0).release()

"""
    + ZYGOTE_LOOP
)


@needs_test_hooks
def test_device_heap_chaos(domain_name: str, tmp_path: Path) -> None:
    rnd = random.Random(int.from_bytes(os.urandom(4), "little"))
    seed0 = rnd.randrange(1 << 30)
    print(f"device heap chaos seed base {seed0}")
    hfile = tmp_path / "handles"
    hfile.write_text("")
    d = hl.Domain.create(
        domain_name,
        fences=2048,
        participants=24,
        heap="2M",
        device_heaps=dict(DEVICES),
        watchdog_interval=0.02,
    )
    zygote = start_zygote(ZYGOTE_CODE)
    pending: dict[int, Worker] = {}  # by seed until the pid is known
    by_pid: dict[int, Worker] = {}
    early: dict[int, list[str]] = {}
    failures: list[str] = []
    counts = {"kills": 0, "locks": 0, "spawned": 0}
    try:
        mine = [
            d.buffer((n,), "<f4", device=dev) for n, dev in ((10, "cuda:0"), (300_000, "cuda:1"), (5, "cpu"))
        ]
        placed = [(b.device, b.device_offset) for b in mine]
        with open(hfile, "a") as fh:
            for b in mine:
                fh.write(
                    f"{b.handle} {b.device} {b.device_offset} {'x'.join(map(str, b.shape))} {b.dtype.str}\n"
                )
        own_used = {dev: d.heap_stats(dev)["used"] for dev in DEVICES}

        def handle(line: str) -> None:
            word, *rest = line.split(maxsplit=2)
            if word in ("ready", "locked") and int(rest[0]) not in by_pid:
                early.setdefault(int(rest[0]), []).append(line)
                return
            if word == "spawned":
                w = pending.pop(int(rest[0]))
                w.pid = int(rest[1])
                by_pid[w.pid] = w
                for ln in early.pop(w.pid, []):
                    handle(ln)
            elif word == "ready":
                w = by_pid[int(rest[0])]
                if w.mode == "loop":
                    w.kill_at = time.monotonic() + rnd.uniform(0.005, 0.15)
            elif word == "locked":
                by_pid[int(rest[0])].locked = True
            elif word == "exit":
                w = by_pid.pop(int(rest[0]))
                code = int(rest[1])
                if code != -signal.SIGKILL:
                    failures.append(f"worker seed {w.seed} ({w.mode}) exited with {code}")
                elif w.locked:
                    counts["locks"] += 1
                elif w.killed:
                    counts["kills"] += 1
                else:
                    failures.append(f"worker seed {w.seed} ({w.mode}) died of SIGKILL nobody sent")
            else:
                failures.append(f"worker line {line!r}")

        def poll(timeout: float) -> None:
            poll_zygote(zygote, handle, failures, timeout)

        def kill_all() -> None:
            for w in list(by_pid.values()):
                if not w.killed and not w.locked:
                    os.kill(w.pid, signal.SIGKILL)
                    w.killed = True

        for rnd_no in range(ROUNDS):
            k0, l0 = counts["kills"], counts["locks"]
            started = time.monotonic()
            while (counts["kills"] - k0 < KILLS or counts["locks"] - l0 < LOCK_DEATHS) and not failures:
                if time.monotonic() - started > TIME_LIMIT:
                    failures.append(f"round {rnd_no}: only {counts} in {TIME_LIMIT} s")
                    break
                while len(by_pid) + len(pending) < CONCURRENT:
                    counts["spawned"] += 1
                    seed = seed0 + counts["spawned"]
                    mode = f"lock{rnd.choice([-1, 0, 1])}" if rnd.random() < 0.25 else "loop"
                    pending[seed] = Worker(seed, mode)
                    send_line(zygote, f"{domain_name} {hfile} {seed} {mode}")
                now = time.monotonic()
                for w in list(by_pid.values()):
                    if w.kill_at and not w.killed and now >= w.kill_at:
                        os.kill(w.pid, signal.SIGKILL)
                        w.killed = True
                poll(0.003)
            # end of the round: every worker dies, recovery brings the domain back
            deadline = time.monotonic() + 20
            while (by_pid or pending) and not failures and time.monotonic() < deadline:
                kill_all()
                poll(0.05)
            assert not failures, "\n".join(failures[:20])
            assert not by_pid and not pending, f"workers left: {by_pid} {pending}"
            d.reap()
            assert wait_until(lambda: len(d.participants) == 1 or bool(d.reap()), 10.0), d.participants
            assert d.check() == [], f"round {rnd_no}"
            for dev in DEVICES:
                assert d.heap_stats(dev)["used"] == own_used[dev], (rnd_no, dev, d.heap_stats(dev))
            assert [(b.device, b.device_offset) for b in mine] == placed
        zygote.stdin.close()  # type: ignore[union-attr]
        zygote.wait(10)
        repairs = sum(int(d.heap_stats(dev)["repairs"]) for dev in DEVICES) + int(d.heap_stats()["repairs"])
        print(f"{counts}, {repairs} repairs, devices {[d.heap_stats(x) for x in DEVICES]}")
        assert counts["kills"] >= ROUNDS * KILLS and counts["locks"] >= ROUNDS * LOCK_DEATHS
        assert repairs >= counts["locks"]
        for b in mine:
            again = d.import_buffer(b.handle)
            assert (again.device, again.device_offset, again.shape) == (b.device, b.device_offset, b.shape)
            again.release()
            b.release()
        for dev in DEVICES:
            st = d.heap_stats(dev)
            assert st["used"] == 0 and st["free_runs"] == 1, st
        assert d.heap_stats()["used"] == 0 and d.check() == []
    finally:
        stop_zygote(zygote, by_pid.values())
        d.close()
