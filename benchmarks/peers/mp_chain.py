"""The multiprocessing peers of ``hostless bench pipeline``: chains of spawned processes.

    python benchmarks/peers/mp_chain.py '{"stages": [2, 4, 8], "sizes": [4096, 1048576],
                                          "frames": 400, "warmup": 40, "pin": true}'

``hostless bench pipeline`` runs this script in a child interpreter (it is not
part of the installed package).  A chain of N spawned processes, each applying
the same relu (``np.maximum``) as the hostless stages and passing the array on
(pickled) over ``multiprocessing.Pipe(duplex=False)`` or a
``multiprocessing.Queue``; this process sends into the first and receives from
the last, one clock read before the send and one after the receive.  The same
chain with N = 2 and no operation is the echo.  Progress lines go to stderr,
the result (``{"peers": {key: summary statistics}}``) to stdout as one JSON line.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from hostless_tools.bench.harness import affinity, pin, summarize
from hostless_tools.bench.report import fmt_ns, fmt_size


def _mp_worker(kind: str, idx: int, inbox: Any, nxt: Any, home: Any, cpus: list[int] | None) -> None:
    """One process of a multiprocessing chain: receive (hops left, op, array), apply op, pass it on."""
    pin(cpus)
    if kind == "pipe":
        recv, send_next, send_home = inbox.recv, (nxt.send if nxt is not None else None), home.send
    else:
        recv, send_next, send_home = inbox.get, (nxt.put if nxt is not None else None), home.put
    while True:
        msg = recv()
        if msg is None:
            if send_next is not None:
                send_next(None)
            return
        left, op, arr = msg
        if op == "relu":
            arr = np.maximum(arr, 0)
        if left <= 1:
            send_home(arr)
        else:
            assert send_next is not None
            send_next((left - 1, op, arr))


_PEER_TIMEOUT = 30.0


class MpChain:
    """``n`` spawned processes chained with Pipes or Queues; chains of any length <= n."""

    def __init__(self, kind: str, n: int, cpus: Sequence[int]) -> None:
        ctx = mp.get_context("spawn")
        self.kind, self.n = kind, n
        self.procs: list[mp.process.BaseProcess] = []
        self._keep: Any = None
        if kind == "pipe":
            boxes = [ctx.Pipe(duplex=False) for _ in range(n)]  # (reader, writer)
            home_r, home_w = ctx.Pipe(duplex=False)
            self.first = boxes[0][1].send

            def recv_pipe() -> Any:
                if not home_r.poll(_PEER_TIMEOUT):
                    raise RuntimeError(f"multiprocessing chain: nothing back within {_PEER_TIMEOUT} s")
                return home_r.recv()

            self.recv = recv_pipe
            ends: list[tuple[Any, Any]] = [
                (boxes[i][0], boxes[i + 1][1] if i + 1 < n else None) for i in range(n)
            ]
            home: Any = home_w
            self._close = [b for pair in boxes for b in pair] + [home_r, home_w]
        else:
            qs = [ctx.Queue() for _ in range(n)]
            hq = ctx.Queue()
            self.first = qs[0].put

            def recv_queue() -> Any:
                return hq.get(timeout=_PEER_TIMEOUT)

            self.recv = recv_queue
            self._keep = (
                qs,
                hq,
            )  # Process.start() drops its args: the queues must outlive the children's start
            ends = [(qs[i], qs[i + 1] if i + 1 < n else None) for i in range(n)]
            home = hq
            self._close = []
        for i in range(n):
            c = [cpus[i % len(cpus)]] if cpus else None
            p = ctx.Process(target=_mp_worker, args=(kind, i, ends[i][0], ends[i][1], home, c), daemon=True)
            p.start()
            self.procs.append(p)

    def round_trips(self, hops: int, op: str, arr: np.ndarray, count: int, warmup: int) -> np.ndarray:
        samples = np.empty(count, dtype=np.int64)
        clock = time.perf_counter_ns
        for i in range(warmup + count):
            t0 = clock()
            self.first((hops, op, arr))
            self.recv()
            if i >= warmup:
                samples[i - warmup] = clock() - t0
        return samples

    def close(self) -> None:
        try:
            self.first(None)
        except Exception:
            pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in self._close:
            c.close()


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Every chain of the pipeline benchmark's peer table: echo and relu chains over Pipe and Queue."""
    cpus = affinity()
    stages, sizes = spec["stages"], spec["sizes"]
    frames, warmup = int(spec["frames"]), int(spec["warmup"])
    nmax = max(stages)
    out: dict[str, Any] = {}
    for kind in ("pipe", "queue"):
        chain = MpChain(kind, nmax, cpus if spec["pin"] and len(cpus) >= 2 else [])
        try:
            warm = max(5, warmup // 2)
            x = np.zeros(1024, np.float32)
            s = chain.round_trips(2, "echo", x, frames, warm)
            out[f"{kind}_echo"] = {
                "label": f"multiprocessing.{kind.capitalize()} 2-process echo, 4 KiB",
                **summarize(s),
            }
            for nbytes in sizes:
                if kind == "queue" and nbytes > 4096:
                    continue  # the Queue peer is measured on the small tensors only
                x = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
                for n in stages:
                    count = frames if nbytes <= 65536 else max(20, frames // 4)
                    s = chain.round_trips(n, "relu", x, count, warm)
                    st = summarize(s)
                    st["per_hop_ns"] = st["p50"] / n
                    key = f"{kind}_chain_{nbytes}_{n}"
                    what = f"chain, {n} processes, {fmt_size(nbytes)}"
                    out[key] = {
                        "label": f"multiprocessing.{kind.capitalize()} {what}",
                        "stages": n,
                        "nbytes": nbytes,
                        **st,
                    }
                    print(f"  {out[key]['label']}: p50 {fmt_ns(st['p50'])}", file=sys.stderr, flush=True)
        finally:
            chain.close()
    return out


def main(argv: list[str]) -> int:
    """``mp_chain.py SPEC_JSON``: measure, print ``{"peers": {...}}`` as one JSON line."""
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps({"peers": measure(json.loads(argv[0]))}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
