"""Wake-up latency of an event loop waiting on hostless objects:
``python -m hostless_tools.bench.wakeup -o DIR``.

A peer process signals a timeline point; this process waits for it and wakes.  The
latency is the time from the peer's stamp (``time.monotonic_ns()`` written into a heap
buffer just before its signal; CLOCK_MONOTONIC is one clock for every process) to the
moment the waiter's code runs again.  Measured in one run, the paths interleaved round
by round (one round of every path, then the next), so that a disturbance of the machine
hits them alike:

* **asyncio wait_async** (the path of today): ``await timeline.wait_async(k)`` in a
  running loop: the domain's notifier thread wakes on the word and completes the future
  through ``loop.call_soon_threadsafe`` (the loop's self-pipe);
* **Poller + asyncio add_reader** (issue 26, item 5): ``poller.watch(point)``, the
  eventfd registered with ``loop.add_reader``: the same notifier thread writes the
  eventfd;
* **Poller + selectors**: the same eventfd in a bare ``selectors`` loop (what a
  non-asyncio loop, trio or GLib does);
* **reference, blocking wait**: ``timeline.wait(k)`` in the waiting thread itself (a
  futex wake, no second thread): the floor of a host wake-up.

Before each round the waiter registers its wait, then signals an "armed" timeline; the
peer waits for it, sleeps ``--gap`` (so that the waiter is asleep in the kernel, not
spinning), stamps and signals.  Report: median, p90 and p99 per path, and the ratio of
each path's median to the asyncio path's.  Nothing is pinned (the notifier thread is
part of what is measured and runs where the scheduler puts it); the machine's load is
in the report.  Figures from a shared or noisy machine are not figures.
"""

from __future__ import annotations

import argparse
import asyncio
import selectors
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from hostless_tools.bench.harness import Child, finish, new_result, summarize, temp_domain
from hostless_tools.bench.report import errors_section, fmt_ns, header, markdown_table, write_results

PATHS = (
    "asyncio wait_async",
    "Poller + asyncio add_reader",
    "Poller + selectors",
    "blocking wait (reference)",
)


@dataclass
class Config:
    rounds: int = 2000
    gap_us: int = 200
    quick: bool = False


def _peer(conn: Connection, name: str, rounds: int, gap_us: int) -> None:
    """The signalling process: for k = 1.., wait for "armed" k, sleep, stamp, signal "go" k."""
    import hostless as hl

    dom = hl.Domain.open(name, label="wakeup-peer")
    armed = dom.lookup("wakeup/armed", timeout=10)
    go = dom.lookup("wakeup/go", timeout=10)
    stamp = dom.lookup("wakeup/stamp", timeout=10).numpy().view(np.int64)
    conn.send(("ready", None))
    for k in range(1, rounds + 1):
        if armed.wait(k, timeout=60) is not hl.Status.SUCCESS:
            raise RuntimeError(f"armed {k} failed")
        end = time.monotonic_ns() + gap_us * 1000
        while time.monotonic_ns() < end:
            time.sleep(gap_us / 4e6)
        stamp[0] = time.monotonic_ns()
        go.signal(k)
    conn.send(("done", None))
    dom.close()


class _Waiter:
    def __init__(self, dom: Any) -> None:
        import hostless as hl

        self.hl = hl
        self.armed = dom.timeline()
        self.go = dom.timeline()
        buf = dom.buffer((1,), "i8")
        self.stamp = buf.numpy()
        dom.publish("wakeup/armed", self.armed)
        dom.publish("wakeup/go", self.go)
        dom.publish("wakeup/stamp", buf)
        self._buf = buf
        self.k = 0
        self.poller = hl.Poller()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.poller.fileno(), selectors.EVENT_READ)

    def _arm(self) -> int:
        self.k += 1
        self.armed.signal(self.k)
        return self.k

    def blocking(self) -> int:
        k = self._arm()
        self.go.wait(k, timeout=60)
        return time.monotonic_ns() - int(self.stamp[0])

    def bare_selector(self) -> int:
        tok = self.poller.watch(self.go.point(self.k + 1))
        self._arm()
        while True:
            self.sel.select(timeout=60)
            if any(r.token == tok for r in self.poller.ready()):
                return time.monotonic_ns() - int(self.stamp[0])

    async def asyncio_today(self) -> int:
        task = asyncio.ensure_future(self.go.wait_async(self.k + 1, timeout=60))
        await asyncio.sleep(0)  # registered with the notifier before the peer is armed
        self._arm()
        await task
        return time.monotonic_ns() - int(self.stamp[0])

    async def asyncio_reader(self) -> int:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tok = self.poller.watch(self.go.point(self.k + 1), lambda r: fut.set_result(None))
        self._arm()
        await asyncio.wait_for(fut, 60)
        del tok
        return time.monotonic_ns() - int(self.stamp[0])

    def close(self) -> None:
        self.sel.close()
        self.poller.close()


async def _rounds(w: _Waiter, cfg: Config, samples: dict[str, list[int]]) -> None:
    loop = asyncio.get_running_loop()
    loop.add_reader(w.poller.fileno(), w.poller.ready)  # the reader calls ready(): callbacks run
    try:
        for _ in range(cfg.rounds):
            samples[PATHS[0]].append(await w.asyncio_today())
            samples[PATHS[1]].append(await w.asyncio_reader())
            loop.remove_reader(w.poller.fileno())  # the bare selector reads the eventfd itself
            samples[PATHS[2]].append(w.bare_selector())
            samples[PATHS[3]].append(w.blocking())
            loop.add_reader(w.poller.fileno(), w.poller.ready)
    finally:
        loop.remove_reader(w.poller.fileno())


def run(cfg: Config) -> dict[str, Any]:
    started = time.monotonic()
    result = new_result("wakeup", cfg, figures={})
    samples: dict[str, list[int]] = {p: [] for p in PATHS}
    with temp_domain("wakeup", heap="1M") as dom:
        w = _Waiter(dom)
        peer = Child(_peer, (dom.name, cfg.rounds * len(PATHS), cfg.gap_us), cpu=None)
        try:
            peer.expect("ready")
            asyncio.run(_rounds(w, cfg, samples))
            peer.finish()
        except Exception as e:
            result["errors"]["run"] = f"{type(e).__name__}: {e}"
        finally:
            peer.close()
            w.close()
    for p, s in samples.items():
        if s:
            result["figures"][p] = summarize(np.asarray(s))
    base = result["figures"].get(PATHS[0], {}).get("p50")
    for f in result["figures"].values():
        f["vs_asyncio"] = f["p50"] / base if base else None
    finish(result, lambda r: [], started)
    return result


def report(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = header(
        "wake-up",
        result,
        [
            f"{cfg['rounds']} rounds per path, interleaved; the peer sleeps {cfg['gap_us']} us before "
            "each signal (the waiter is asleep)",
            "latency: the peer's monotonic stamp just before its signal -> the waiter's code runs",
            "not pinned: the notifier thread is part of what is measured",
        ],
    )
    rows = [
        [
            p,
            fmt_ns(f["p50"]),
            f"{fmt_ns(f['p50_lo'])} .. {fmt_ns(f['p50_hi'])}",
            fmt_ns(f["p90"]),
            fmt_ns(f["p99"]),
            f"{f['vs_asyncio']:.2f}x" if f.get("vs_asyncio") else "-",
        ]
        for p, f in result["figures"].items()
    ]
    lines += [
        "## Wake-up latency",
        "",
        markdown_table(["path", "median", "median spread", "p90", "p99", "median vs asyncio"], rows),
        "",
        *errors_section(result),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("-o", "--out", default="benchmarks/results")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--gap-us", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="20 rounds per path (a smoke run)")
    a = ap.parse_args(argv)
    cfg = Config(rounds=20, gap_us=a.gap_us, quick=True) if a.quick else Config(a.rounds, a.gap_us)
    result = run(cfg)
    md = report(result)
    js, mdp = write_results("wakeup", result, md, a.out)
    print(md)
    print(f"wrote {js} and {mdp}", file=sys.stderr)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
