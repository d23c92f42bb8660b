"""Native (C) vs Python cpu agent, measured side by side in one run (issue 11, first layer).

    .venv/bin/python benchmarks/native_agent.py [--n 3000]

For each agent kind (python, native), with both sides polling (agent spin 0.5 s,
host spin on its timeline):

* round trip: host pushes a 4 KiB relu packet, the agent runs it and signals a
  timeline the host spins on (p50 / p90, ns): one hop there and back;
* chain: host -> agent A -> (follow-up, direct dispatch) agent B -> host, minus
  the round trip: the cost of one agent-to-agent hop;
* agent CPU per packet: 50000 packets pushed into a parked agent's queue, the
  agent's on-CPU time (/proc/PID/schedstat) over the burst divided by the
  count: its per-packet cost, immune to the machine's load;
* per packet: N packets pushed at once into a queue of N cells, the time until
  the last one's signal, divided by N (the agent's per-packet cost, no wake-up).

``exe_vs_native`` (JSON key "exe_vs_native"; ``--exe`` runs it alone): the
round trip through ``hostless-agent`` (agents.spawn(native="exe"): the same C
loop with no Python interpreter) vs through the native loop in a Python worker
(native=True), in interleaved rounds, with the agent polling (spin 0.5 s) and
parked (spin 0: a futex wake-up per packet); median and spread (p10..p90 of
the samples, p50_lo..p50_hi over the rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any

import numpy as np

import hostless as hl
from hostless import agents
from hostless.bench.harness import summarize
from hostless.kernels import kernel_id


def _p(samples: np.ndarray) -> dict[str, float]:
    """The harness's latency summary (p50, p90, ...) of the samples after a 10 % warm-up."""
    return summarize(samples[len(samples) // 10 :])


def _oncpu(pid: int) -> int:
    """Nanoseconds process ``pid``'s main thread has run on a CPU (/proc/PID/schedstat)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def measure(dom: hl.Domain, native: bool, n: int) -> dict[str, Any]:
    a = agents.spawn(dom, "cpu", spin=0.5, native=native, capacity=4096)
    x, y, z = (dom.buffer((1024,), np.float32) for _ in range(3))
    tla = dom.timeline(owner=a.id)
    ka = hl.Kernargs(buffers=[x.handle, y.handle]).to_buffer(dom)
    kb = hl.Kernargs(buffers=[y.handle, z.handle]).to_buffer(dom)
    out: dict[str, Any] = {}
    b: agents.Agent | None = None
    extra: list[Any] = []
    clock = time.perf_counter_ns
    try:
        relu = kernel_id("relu")
        # round trip
        rt = np.empty(n, np.int64)
        p = hl.Packet(kernel=relu, args=ka.handle, signal=tla.handle)
        for i in range(n):
            p.signal_value = i + 1
            raw = p.encode()
            t0 = clock()
            a.queue.push(raw)
            tla.wait(i + 1, 10.0, spin=1.0)
            rt[i] = clock() - t0
        out["round_trip_ns"] = _p(rt)
        # per packet: a burst of n packets (one agent polling, the host spinning on the last signal)
        base = n
        m = min(n, 4000)
        raws = []
        for i in range(m):
            p.signal_value = base + i + 1
            raws.append(p.encode())
        t0 = clock()
        for r in raws:
            a.queue.push(r)
        tla.wait(base + m, 30.0, spin=1.0)
        out["per_packet_ns"] = (clock() - t0) / m
        # agent CPU per packet: a parked agent (spin 0) woken by a burst; its on-CPU time
        # (/proc/PID/schedstat, ns) over the burst, so machine load does not count
        c = agents.spawn(dom, "cpu", spin=0.0, native=native, capacity=1 << 16)
        tlc = dom.timeline(owner=c.id)
        extra.append(tlc)
        try:
            k = 50_000
            pc = hl.Packet(kernel=relu, args=ka.handle, signal=tlc.handle)
            burst = []
            for i in range(k):
                pc.signal_value = i + 1
                burst.append(pc.encode())
            time.sleep(0.2)
            cpu0 = _oncpu(c.proc.pid)
            for r in burst:
                c.queue.push(r)
            tlc.wait(k, 60.0)
            out["agent_cpu_per_packet_ns"] = (_oncpu(c.proc.pid) - cpu0) / k
        finally:
            c.stop()
        # chain (a second polling agent: three spinning processes, more than the 2-core machine has)
        b = agents.spawn(dom, "cpu", spin=0.5, native=native)
        tl = dom.timeline(owner=b.id)
        extra.append(tl)
        # chain: A runs relu, pushes B's packet (its argument block names the follow-up)
        base = n + m
        ch = np.empty(n, np.int64)
        for i in range(n):
            fb = hl.Packet(kernel=relu, args=kb.handle, signal=tl.handle, signal_value=i + 1)
            fo = [hl.Follow(b.queue.handle, fb)]
            kf = hl.Kernargs(buffers=[x.handle, y.handle], follow=fo).to_buffer(dom)
            pa = hl.Packet(kernel=relu, args=kf.handle, signal=tla.handle, signal_value=base + i + 1)
            raw = pa.encode()
            t0 = clock()
            a.queue.push(raw)
            tl.wait(i + 1, 10.0, spin=1.0)
            ch[i] = clock() - t0
            kf.release()
        out["chain_2_agents_ns"] = _p(ch)
        out["agent_hop_ns"] = out["chain_2_agents_ns"]["p50"] - out["round_trip_ns"]["p50"]
    finally:
        a.stop()
        if b is not None:
            b.stop()
        for o in (x, y, z, tla, ka, kb, *extra):
            o.release()
    return out


def _rss_kib(pid: int) -> int:
    """Resident set size of process ``pid`` (KiB, /proc/PID/status VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    return 0


def _round_trips(
    dom: hl.Domain, native: bool | str, n: int, spin: float
) -> tuple[np.ndarray, dict[str, float]]:
    """n relu round trips (4 KiB) through a fresh agent: host push -> agent -> timeline the host spins on;
    with the agent's start time (spawn until it serves) and resident size after the run."""
    t0 = time.perf_counter_ns()
    a = agents.spawn(dom, "cpu", spin=spin, native=native, capacity=4096)
    proc = {"start_ms": (time.perf_counter_ns() - t0) / 1e6}
    x, y = (dom.buffer((1024,), np.float32) for _ in range(2))
    tl = dom.timeline(owner=a.id)
    ka = hl.Kernargs(buffers=[x.handle, y.handle]).to_buffer(dom)
    rt = np.empty(n, np.int64)
    try:
        p = hl.Packet(kernel=kernel_id("relu"), args=ka.handle, signal=tl.handle)
        clock = time.perf_counter_ns
        for i in range(n):
            p.signal_value = i + 1
            raw = p.encode()
            t0 = clock()
            a.queue.push(raw)
            tl.wait(i + 1, 10.0, spin=1.0)
            rt[i] = clock() - t0
        proc["rss_kib"] = _rss_kib(a.proc.pid)
    finally:
        a.stop()
        for o in (x, y, tl, ka):
            o.release()
    return rt[len(rt) // 10 :], proc  # 10 % warm-up


def exe_vs_native(dom: hl.Domain, n: int, rounds: int = 3) -> dict[str, Any]:
    """Round trip through hostless-agent ("exe") vs the native loop in a Python worker
    ("native"), interleaved rounds, polling and parked agents; summaries in ns."""
    out: dict[str, Any] = {"n_per_round": n, "rounds": rounds}
    procs: dict[str, list[dict[str, float]]] = {"exe": [], "native": []}
    for mode, spin, count in (("polling", 0.5, n), ("parked", 0.0, max(200, n // 3))):
        got: dict[str, list[np.ndarray]] = {"exe": [], "native": []}
        for _ in range(rounds):
            for kind in ("exe", "native"):
                rt, pr = _round_trips(dom, "exe" if kind == "exe" else True, count, spin)
                got[kind].append(rt)
                procs[kind].append(pr)
        res: dict[str, Any] = {}
        for kind, groups in got.items():
            allv = np.concatenate(groups)
            summ = summarize(allv, groups=groups)
            summ["p10"], summ["p25"], summ["p75"] = (float(v) for v in np.percentile(allv, [10, 25, 75]))
            res[kind] = summ
        res["exe_over_native_p50"] = res["exe"]["p50"] / res["native"]["p50"]
        out[mode] = res
    for kind, prs in procs.items():  # medians over every agent started
        out[f"{kind}_start_ms"] = float(np.median([p["start_ms"] for p in prs]))
        out[f"{kind}_rss_kib"] = float(np.median([p["rss_kib"] for p in prs]))
    return out


def _exe_report(r: dict[str, Any]) -> str:
    lines = ["round trip, 4 KiB relu (ns): median [p10..p90], round medians p50_lo..p50_hi"]
    for mode in ("polling", "parked"):
        for kind in ("exe", "native"):
            s = r[mode][kind]
            lines.append(
                f"  {mode:8s} {kind:7s} {s['p50']:9.0f} [{s['p10']:.0f}..{s['p90']:.0f}]"
                f"  rounds {s['p50_lo']:.0f}..{s['p50_hi']:.0f}"
            )
        lines.append(f"  {mode:8s} exe/native median: {r[mode]['exe_over_native_p50']:.2f}")
    for kind in ("exe", "native"):
        start, rss = r[kind + "_start_ms"], r[kind + "_rss_kib"] / 1024
        lines.append(f"  {kind:7s} start {start:.1f} ms, resident {rss:.1f} MiB")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--exe", action="store_true", help="only the hostless-agent vs native round trip")
    a = ap.parse_args()
    name = f"hlbench-native-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    dom = hl.Domain.create(name, fences=8192, participants=16, heap="64M", label="host")
    try:
        res: dict[str, Any] = {"python": [], "native": []}
        for _round in range(0 if a.exe else 2):  # interleaved, so that a change of machine load hits both
            for kind in ("python", "native"):
                res[kind].append(measure(dom, kind == "native", a.n))
        res["exe_vs_native"] = exe_vs_native(dom, a.n)
        print(_exe_report(res["exe_vs_native"]), file=sys.stderr)
    finally:
        dom.close()
        hl.Domain.unlink(name)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
