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
"""

from __future__ import annotations

import argparse
import json
import os
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    a = ap.parse_args()
    name = f"hlbench-native-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    dom = hl.Domain.create(name, fences=8192, participants=16, heap="64M", label="host")
    try:
        res: dict[str, list[dict[str, Any]]] = {"python": [], "native": []}
        for _round in range(2):  # interleaved, so that a change of machine load hits both
            for kind in ("python", "native"):
                res[kind].append(measure(dom, kind == "native", a.n))
    finally:
        dom.close()
        hl.Domain.unlink(name)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
