"""The chaos driver's waiter threads: they import the objects that workers publish and wait on
them (or hold them a moment and drop them); a wait that outlives its owner is a hung waiter."""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable

from hostless.domain import Domain
from hostless.errors import InvalidHandle
from hostless.fence import Fence
from hostless.timeline import Timeline

from .record import OWNER_DIED, OWNER_LEFT, _sname


class _Waiters:
    """The driver's threads that wait on objects the workers publish (see the module docstring)."""

    def __init__(
        self, dom: Domain, threads: int, hung_after: float, ended: Callable[[int], float | None], seed: int
    ) -> None:
        self.dom = dom
        self.hung_after = hung_after
        self.ended = ended
        self.lock = threading.Lock()
        self.items: collections.deque[tuple[int, str, int, int]] = collections.deque(maxlen=64)
        self.stop = threading.Event()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.hung: list[str] = []
        self.bad: list[str] = []
        self.gone = 0
        self.held = 0
        self.abandoned = 0
        self.published = 0
        self.threads = [
            threading.Thread(target=self._loop, args=(random.Random(seed + k),), daemon=True)
            for k in range(threads)
        ]
        for t in self.threads:
            t.start()

    def add(self, worker: int, kind: str, handle: int, plan: int) -> None:
        with self.lock:
            self.published += 1
            self.items.append((worker, kind, handle, plan))

    def _loop(self, rnd: random.Random) -> None:
        while not self.stop.is_set():
            with self.lock:
                item = self.items.pop() if self.items else None
            if item is None:
                time.sleep(0.01)
                continue
            worker, kind, handle, plan = item
            try:
                o: Fence | Timeline = (
                    self.dom.import_timeline(handle) if kind == "T" else self.dom.import_fence(handle)
                )
            except InvalidHandle:
                with self.lock:
                    self.gone += 1
                continue
            try:
                if rnd.random() < 0.4:
                    # a holder: keeps its reference a moment and drops it whatever the object's
                    # state (its owner may have dropped its own: this release may free it, maybe
                    # while the owner is being recovered)
                    self.stop.wait(rnd.uniform(0.0, 0.03))
                    with self.lock:
                        self.held += 1
                else:
                    self._wait(o, worker, kind, plan)
            finally:
                o.release()

    def _wait(self, o: Fence | Timeline, worker: int, kind: str, plan: int) -> None:
        t0 = time.monotonic()
        while True:
            try:
                st = int(o.wait(1 << 61, 0.2) if isinstance(o, Timeline) else o.wait(0.2))
                break
            except TimeoutError:
                end = self.ended(worker)
                if end is None and time.monotonic() - t0 > 2.0:
                    with self.lock:  # its owner lives on and may never signal it: wait on another
                        self.abandoned += 1
                    return
                if end is not None and time.monotonic() - end > self.hung_after:
                    with self.lock:
                        self.hung.append(
                            f"{kind} {o.handle:#x} of worker {worker}: not completed {self.hung_after:g} s "
                            "after its owner ended"
                        )
                    return
        ok = {OWNER_DIED, OWNER_LEFT} if kind == "T" else {plan, OWNER_DIED, OWNER_LEFT}
        with self.lock:
            self.statuses[_sname(st)] += 1
            if st not in ok:
                self.bad.append(
                    f"{kind} {o.handle:#x} of worker {worker}: completed {_sname(st)}, "
                    f"expected {' or '.join(sorted(_sname(s) for s in ok))}"
                )

    def close(self, timeout: float) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout)
