"""An innocent: an ordinary participant (``python -m hostless_tools.fuzz innocent ROLE NAME ...``) that
attached before the corruption and keeps working; any exception of a type that is not accepted
ends it with EXIT_UNEXPECTED."""

from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .policy import EXIT_UNEXPECTED, _accepted

_POLL = 0.005


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj), encoding="utf-8")
    os.replace(tmp, path)


class _Innocent:
    """An ordinary participant: every operation has a timeout; accepted errors are counted,
    any other exception ends the process with EXIT_UNEXPECTED after printing its traceback."""

    def __init__(self, role: str, name: str, casedir: Path, seed: str, hook: str | None) -> None:
        self.role, self.name, self.casedir, self.hook = role, name, casedir, hook
        self.rng = random.Random(f"innocent:{seed}:{role}")
        self.ops: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.samples: dict[str, str] = {}
        self.accepted = _accepted()
        self.stop = threading.Event()
        self.held: list[Any] = []
        self.signaled: set[int] = set()
        self.tl_value = 0
        self.callbacks = 0
        self.dom: Any = None
        self.handles: dict[str, Any] = {}
        self.shared: dict[str, Any] = {}
        self.tmpfile = str(casedir / f"{role}.trace.json")

    # -- error policy
    def guard(self, what: str, fn: Callable[[], object]) -> None:
        self.ops[what] += 1
        try:
            fn()
        except self.accepted as e:
            self.errors[type(e).__name__] += 1
            if type(e).__name__ not in self.samples and len(self.samples) < 8:
                self.samples[type(e).__name__] = f"{what}: {str(e)[:200]}"
        except BaseException as e:  # noqa: B036 - every other type is the finding
            sys.stdout.flush()
            print(
                f"UNEXPECTED {type(e).__module__}.{type(e).__qualname__} in {what} ({self.role})",
                file=sys.stderr,
            )
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(EXIT_UNEXPECTED)

    def release(self, obj: Any) -> None:
        if obj is not None and getattr(obj, "_held", False):
            self.guard("release", obj.release)

    # -- setup (before the corruption: any failure here is a harness error)
    def setup(self) -> None:
        import numpy as np

        import hostless as hl

        if self.role == "creator":
            d = hl.Domain.create(
                self.name, fences=128, participants=8, heap="1M", trace="64K", label=self.role
            )
            self.dom = d
            fs = [d.fence() for _ in range(4)]
            m = d.merge(fs[:2])
            t = d.timeline()
            small = d.buffer((64,), np.float32)
            large = d.buffer((40000,), np.float32)  # >= LARGE_BUFFER: page-aligned data
            small.numpy()[:] = np.arange(64, dtype=np.float32)
            large.numpy()[:] = 1.0
            q = d.queue(8)
            q.bind()
            done = d.fence()
            done.signal()
            self.shared = {"fences": fs, "merged": m, "timeline": t, "buffers": [small, large], "queue": q}
            self.held = [*fs, m, t, small, large, q, done]
            self.handles = {
                "fences": [f.handle for f in fs],
                "merged": m.handle,
                "timeline": t.handle,
                "buffers": [small.handle, large.handle],
                "queue": q.handle,
                "signaled": done.handle,
            }
        else:
            path = self.casedir / "creator.ready"
            deadline = time.monotonic() + 60
            while not path.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("the creator never became ready")
                time.sleep(0.002)
            self.handles = json.loads(path.read_text(encoding="utf-8"))["handles"]
            d = hl.Domain.open(self.name, label=self.role)
            self.dom = d
            h = self.handles
            fs = [d.import_fence(x) for x in h["fences"]]
            m = d.import_fence(h["merged"])
            t = d.import_timeline(h["timeline"])
            bufs = [d.import_buffer(x) for x in h["buffers"]]
            q = d.import_queue(h["queue"])
            self.shared = {"fences": fs, "merged": m, "timeline": t, "buffers": bufs, "queue": q}
            self.held = [*fs, m, t, *bufs, q]
        me = self.dom.participant_id & 0xFF
        _write_json_atomic(
            self.casedir / f"{self.role}.ready",
            {"role": self.role, "pid": os.getpid(), "index": me, "handles": self.handles},
        )

    # -- operations
    def op_fence_cycle(self) -> None:
        d = self.dom
        f = d.fence()
        try:
            f.signal(self.rng.choice([2, 3, 4, 6, 64, 0xFFFFFFFF]))
            f.wait(0.01)
            _ = f.status
        finally:
            self.release(f)

    def op_merge_cycle(self) -> None:
        d = self.dom
        a = d.fence()
        b: Any = None
        m: Any = None
        try:
            b = d.fence()
            m = d.merge([a, b])
            a.signal()
            b.signal(self.rng.choice([2, 3]))
            m.wait(0.01)
            _ = m.status
        finally:
            self.release(m)
            self.release(b)
            self.release(a)

    def op_timeline_cycle(self) -> None:
        t = self.dom.timeline(self.rng.randrange(4))
        try:
            t.signal(t.value + 5)
            t.wait(t.value - 1, 0.01)
            if self.rng.random() < 0.3:
                t.fail()
                _ = t.failure
        finally:
            self.release(t)

    def op_buffer_cycle(self) -> None:
        import numpy as np

        n = self.rng.choice([1, 16, 100, 1024, 20000])
        b = self.dom.buffer((n,), self.rng.choice([np.uint8, np.float32, np.int64]))
        try:
            a = b.numpy()
            a[:] = 3
            int(a[-1])
        finally:
            self.release(b)

    def op_queue_cycle(self) -> None:
        from hostless.queue import Packet, PacketType

        q = self.dom.queue(4)
        try:
            q.bind()
            q.push(Packet(type=PacketType.BARRIER), timeout=0.005)
            q.pop(timeout=0.005)
            q.info()
        finally:
            self.release(q)

    def op_shared_fence(self) -> None:
        f = self.rng.choice([*self.shared["fences"], self.shared["merged"]])
        _ = f.status
        f.wait(0.002)

    def op_shared_signal(self) -> None:
        fs = self.shared["fences"]
        f = fs[0] if self.role == "creator" else fs[2]
        if f.handle not in self.signaled:
            self.signaled.add(f.handle)
            f.signal()

    def op_shared_timeline(self) -> None:
        t = self.shared["timeline"]
        if self.role == "creator":
            self.tl_value += 1
            t.signal(self.tl_value)
        else:
            v = t.value
            t.wait(v + 1, 0.003)

    def op_shared_buffer(self) -> None:
        b = self.rng.choice(self.shared["buffers"])
        a = b.numpy()
        float(a.sum())
        a.reshape(-1)[:1] = 1

    def op_import(self) -> None:
        d, h = self.dom, self.handles
        kind = self.rng.choice(["fence", "merged", "timeline", "buffer", "queue", "signaled"])
        obj: Any = None
        try:
            if kind == "fence":
                obj = d.import_fence(self.rng.choice(h["fences"]))
                _ = obj.status
            elif kind == "merged":
                obj = d.import_fence(h["merged"])
                obj.wait(0.001)
            elif kind == "signaled":
                obj = d.import_fence(h["signaled"])
                obj.wait(0.01)
            elif kind == "timeline":
                obj = d.import_timeline(h["timeline"])
                _ = obj.value
            elif kind == "buffer":
                obj = d.import_buffer(self.rng.choice(h["buffers"]))
                float(obj.numpy().sum())
            else:
                obj = d.import_queue(h["queue"])
                obj.info()
        finally:
            self.release(obj)

    def op_push(self) -> None:
        from hostless.queue import Packet, PacketType

        self.shared["queue"].push(Packet(type=PacketType.BARRIER, kernel=7), timeout=0.005)

    def op_pop(self) -> None:
        q = self.shared["queue"]
        for _ in range(4):
            if q.pop(timeout=0.002) is None:
                break
            q.completed()

    def op_queue_info(self) -> None:
        self.shared["queue"].info()

    def op_check(self) -> None:
        self.dom.check(settle=0.05)

    def op_info(self) -> None:
        from hostless.info import domain_info

        d = self.dom
        json.dumps(domain_info(d))
        _ = d.participants
        d.heap_stats()
        _ = d.capacity

    def op_trace(self) -> None:
        from hostless import trace

        if self.dom.trace_enabled():
            trace.export(self.dom, self.tmpfile)

    def op_reap(self) -> None:
        self.dom.reap()

    def op_async(self) -> None:
        import asyncio

        if self.rng.random() < 0.5:
            f = self.rng.choice([*self.shared["fences"], self.shared["merged"]])
            asyncio.run(f.wait_async(timeout=0.003))
        else:
            t = self.shared["timeline"]
            asyncio.run(t.wait_async(t.value + 1, timeout=0.003))

    def op_callback(self) -> None:
        # callbacks run in the notifier thread (futex_waitv on the shared words); a few per process
        if self.callbacks >= 16:
            return
        self.callbacks += 1
        if self.rng.random() < 0.5:
            f = self.rng.choice([*self.shared["fences"], self.shared["merged"]])
            f.add_done_callback(lambda _f: None)
        else:
            t = self.shared["timeline"]
            t.add_callback(t.value + self.rng.randrange(1, 4), lambda _t, _s: None)

    def ops_table(self) -> list[tuple[str, Callable[[], None], int]]:
        t: list[tuple[str, Callable[[], None], int]] = [
            ("fence_cycle", self.op_fence_cycle, 6),
            ("merge_cycle", self.op_merge_cycle, 4),
            ("timeline_cycle", self.op_timeline_cycle, 4),
            ("buffer_cycle", self.op_buffer_cycle, 4),
            ("queue_cycle", self.op_queue_cycle, 2),
            ("shared_fence", self.op_shared_fence, 4),
            ("shared_signal", self.op_shared_signal, 1),
            ("shared_timeline", self.op_shared_timeline, 3),
            ("shared_buffer", self.op_shared_buffer, 3),
            ("import", self.op_import, 4),
            ("push", self.op_push, 4),
            ("queue_info", self.op_queue_info, 1),
            ("check", self.op_check, 1),
            ("info", self.op_info, 1),
            ("trace", self.op_trace, 1),
            ("reap", self.op_reap, 1),
            ("async", self.op_async, 1),
            ("callback", self.op_callback, 1),
        ]
        if self.role == "creator":
            t.append(("pop", self.op_pop, 5))
        return t

    def run_hook(self) -> None:
        if self.hook == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif self.hook == "raise":
            self.guard("hook", lambda: [][1])  # IndexError: not an accepted type
        elif self.hook == "hang":
            while True:
                time.sleep(1)

    def loop(self) -> None:
        if self.dom is None or not self.shared:
            return
        table = self.ops_table()
        names = [n for n, _, _ in table]
        fns = {n: f for n, f, _ in table}
        weights = [w for _, _, w in table]
        hooked = False
        while not self.stop.is_set():
            if self.hook and not hooked:
                hooked = True
                self.run_hook()
            name = self.rng.choices(names, weights)[0]
            self.guard(name, fns[name])
            time.sleep(0.0005)

    def finish(self) -> None:
        if self.dom is None:
            return
        for name, fn in (("check", self.op_check), ("info", self.op_info), ("trace", self.op_trace)):
            self.guard("final_" + name, fn)
        for obj in reversed(self.held):
            self.release(obj)
        if self.dom is not None:
            self.guard("close", self.dom.close)


INNOCENT_MODULE = "hostless_tools.fuzz"
"""The module whose ``python -m`` entry point (``__main__.py``) runs :func:`_innocent_main`."""
USAGE = "usage: python -m hostless_tools.fuzz innocent ROLE NAME --dir DIR --seed S (run `hostless fuzz`)"


def _innocent_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m hostless_tools.fuzz innocent")
    p.add_argument("role")
    p.add_argument("name")
    p.add_argument("--dir", required=True)
    p.add_argument("--seed", required=True)
    p.add_argument("--hook", default=None, choices=["segv", "raise", "hang"])
    a = p.parse_args(argv)
    # Python stacks on a fatal signal (not under ASan: its own report has the C stack) and on SIGUSR1
    # (what the fuzzer sends a hung innocent before killing it)
    if "asan" not in os.environ.get("LD_PRELOAD", ""):
        faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    inn = _Innocent(a.role, a.name, Path(a.dir), a.seed, a.hook)

    def watch_stdin() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        inn.stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    if a.role == "late":
        # joins a domain that is already corrupted: refusing to join is a clear error, not a finding
        joined = False

        def join() -> None:
            nonlocal joined
            inn.setup()
            joined = True

        inn.guard("join", join)
        if not joined:
            inn.stop.set()
    else:
        inn.setup()
    inn.loop()
    inn.finish()
    print(
        json.dumps(
            {"done": True, "ops": sum(inn.ops.values()), "errors": dict(inn.errors), "samples": inn.samples}
        ),
        flush=True,
    )
    # no interpreter teardown: the domain is closed, nothing else needs it
    os._exit(0)
