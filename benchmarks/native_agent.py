"""Native (C) vs Python agents, measured side by side in one run (issue 11).

The Python agent loop is gone (issue 22: cpu and npu agents run the C loop by
default), so the script now measures the native column only (``KINDS``); the
committed results of issue 11 hold both columns.

    .venv/bin/python benchmarks/native_agent.py [--n 3000] [--idle 5] [--out results/native_agent]

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

The doorbell (native: adaptive spin, bounded by ``spin``; python: fixed spin):

* idle CPU: an agent spawned with the default spin (50 us) left idle, its
  on-CPU time (every thread's /proc/PID/task/*/schedstat) over ``--idle``
  seconds as a fraction of one core (goal: < 1 %); native adaptive, native
  fixed spin, python;
* parked wake: one packet every 5 ms (and every 0.2 ms: the adaptive spin then
  catches it) into an agent with the default spin (so
  it has parked: packets come rarer than its spin), the host spinning on the
  signal: push -> the agent wakes, runs relu, signals (p50 / p90); and the
  same with the host asleep too (``parked_round_trip``: two futex wake-ups),
  next to the C futex ping-pong (hostless_tools.bench's pingpong.c) of this run
  (goal: parked round trip <= 1.3x the C futex round trip);
* back-to-back round trips with the default spin: adaptive vs fixed spin.

The npu (ERT): the same round trip / agent CPU per packet with a START_CU
relu command (native: decoded and run in C; python: ErtProcessor).

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
from pathlib import Path
from typing import Any

import numpy as np

import hostless as hl
from hostless import agents, ert
from hostless.kernels import cu_index, kernel_id
from hostless_tools import bench
from hostless_tools.bench.harness import compile_c, run_json, scratch_dir, summarize

KINDS = ("native",)
"""The agent loops measured (the Python loop, "python", is gone)."""


def _p(samples: np.ndarray) -> dict[str, float]:
    """The harness's latency summary (p50, p90, ...) of the samples after a 10 % warm-up."""
    return summarize(samples[len(samples) // 10 :])


def _oncpu(pid: int) -> int:
    """Nanoseconds process ``pid``'s main thread has run on a CPU (/proc/PID/schedstat)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def _oncpu_all(pid: int) -> int:
    """On-CPU nanoseconds of every thread of process ``pid``."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def idle_cpu(dom: hl.Domain, native: bool, secs: float, **opts: Any) -> float:
    """Fraction of one core an idle agent (default spin) uses over ``secs`` seconds."""
    opts["native"] = native
    a = agents.spawn(dom, "cpu", **opts)
    try:
        time.sleep(0.5)
        c0, t0 = _oncpu_all(a.proc.pid), time.monotonic()
        time.sleep(secs)
        return (_oncpu_all(a.proc.pid) - c0) / ((time.monotonic() - t0) * 1e9)
    finally:
        a.stop()


def parked_wake(dom: hl.Domain, native: bool, n: int, gap: float = 0.005, n_idle: int = 10) -> dict[str, Any]:
    """A packet every ``gap`` seconds into an agent with the default spin: the wake-up of a
    parked agent (host spinning on the signal), and the round trip with the host asleep too;
    then ``n_idle`` packets 0.3 s apart (an agent idle past 100 ms, in its long idle sleep)."""
    a = agents.spawn(dom, "cpu", native=native)
    x, y = (dom.buffer((1024,), np.float32) for _ in range(2))
    tl = dom.timeline(owner=a.id)
    ka = hl.Kernargs(buffers=[x.handle, y.handle]).to_buffer(dom)
    clock = time.perf_counter_ns
    out: dict[str, Any] = {}
    try:
        p = hl.Packet(kernel=kernel_id("relu"), args=ka.handle, signal=tl.handle)
        v = 0
        for key, host_spin in (("wake_ns", 1.0), ("parked_round_trip_ns", 0.0)):
            s = np.empty(n, np.int64)
            for i in range(n):
                v += 1
                p.signal_value = v
                raw = p.encode()
                time.sleep(gap)
                t0 = clock()
                a.queue.push(raw)
                tl.wait(v, 10.0, spin=host_spin)
                s[i] = clock() - t0
            out[key] = _p(s)
        # back-to-back round trips with the default spin (the host spinning)
        s = np.empty(n, np.int64)
        for i in range(n):
            v += 1
            p.signal_value = v
            raw = p.encode()
            t0 = clock()
            a.queue.push(raw)
            tl.wait(v, 10.0, spin=1.0)
            s[i] = clock() - t0
        out["back_to_back_default_spin_ns"] = _p(s)
        # wake-ups of an agent idle for 0.3 s (native: in its idle_poll sleep)
        s = np.empty(n_idle, np.int64)
        for i in range(n_idle):
            v += 1
            p.signal_value = v
            raw = p.encode()
            time.sleep(0.3)
            t0 = clock()
            a.queue.push(raw)
            tl.wait(v, 10.0, spin=1.0)
            s[i] = clock() - t0
        if n_idle:
            out["wake_after_idle_ns"] = summarize(s)
        out["gap_s"] = gap
    finally:
        a.stop()
        for o in (x, y, tl, ka):
            o.release()
    return out


def npu_measure(dom: hl.Domain, native: bool, n: int) -> dict[str, Any]:
    """Round trip (both polling) and agent CPU per packet of a START_CU relu ERT command."""
    a = agents.spawn(dom, "npu", spin=0.5, native=native, capacity=4096)
    x, y = (dom.buffer((1024,), np.float32) for _ in range(2))
    raw = ert.start_cu(cu_index("relu"), [2] + ert.u64_args([x.handle, y.handle])).encode()
    cb = dom.buffer(len(raw))
    cb.numpy()[:] = np.frombuffer(raw, np.uint8)
    ka = hl.Kernargs(buffers=[cb.handle]).to_buffer(dom)
    tl = dom.timeline(owner=a.id)
    clock = time.perf_counter_ns
    out: dict[str, Any] = {"capabilities": a.capabilities}
    try:
        p = hl.Packet(type=hl.PacketType.ERT, args=ka.handle, signal=tl.handle)
        rt = np.empty(n, np.int64)
        for i in range(n):
            p.signal_value = i + 1
            r = p.encode()
            t0 = clock()
            a.queue.push(r)
            tl.wait(i + 1, 10.0, spin=1.0)
            rt[i] = clock() - t0
        out["ert_round_trip_ns"] = _p(rt)
        m = min(n, 4000)
        burst = []
        for i in range(m):
            p.signal_value = n + i + 1
            burst.append(p.encode())
        c0 = _oncpu(a.proc.pid)
        for r in burst:
            a.queue.push(r)
        tl.wait(n + m, 60.0)
        out["ert_agent_cpu_per_packet_ns"] = (_oncpu(a.proc.pid) - c0) / m
    finally:
        a.stop()
        for o in (x, y, cb, ka, tl):
            o.release()
    return out


def c_futex_round_trip(n: int) -> dict[str, Any] | str:
    """The C futex ping-pong of this run (p50 / p90 ...), or why there is none."""
    with scratch_dir() as tmp:
        exe, err = compile_c(Path(bench.__file__).parent / "pingpong.c", tmp, "pingpong")
        if exe is None:
            return f"no C reference: {err}"
        data = run_json([exe, "futex", str(n), str(n // 10), "-1", "-1"])
    return _p(np.asarray(data["samples_ns"], dtype=np.int64))


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


def report(res: dict[str, Any]) -> str:
    """A readable summary of the run (markdown)."""
    lines = ["# native agents vs python agents (benchmarks/native_agent.py)", ""]
    lines += ["| figure | python | native |", "|---|---|---|"]

    def row(name: str, get: Any) -> None:
        vals = []
        for kind in ("python", "native"):
            try:
                vals.append(get(kind))
            except (KeyError, IndexError, TypeError):
                vals.append("-")
        lines.append(f"| {name} | {vals[0]} | {vals[1]} |")

    us = lambda v: f"{v / 1e3:.1f} us"  # noqa: E731
    row("cpu round trip p50 (polling)", lambda k: us(res["cpu"][k][-1]["round_trip_ns"]["p50"]))
    row("cpu agent CPU / packet", lambda k: us(res["cpu"][k][-1]["agent_cpu_per_packet_ns"]))
    row("agent hop (chain - round trip)", lambda k: us(res["cpu"][k][-1]["agent_hop_ns"]))
    row("npu ERT round trip p50 (polling)", lambda k: us(res["npu"][k]["ert_round_trip_ns"]["p50"]))
    row("npu agent CPU / ERT packet", lambda k: us(res["npu"][k]["ert_agent_cpu_per_packet_ns"]))
    row("parked agent wake p50 (host spinning)", lambda k: us(res["wake"][k]["wake_ns"]["p50"]))
    row(
        "parked round trip p50 (host asleep too)", lambda k: us(res["wake"][k]["parked_round_trip_ns"]["p50"])
    )
    row("round trip p50, a packet every 0.2 ms", lambda k: us(res["wake_short"][k]["wake_ns"]["p50"]))
    row("wake after 0.3 s idle p50", lambda k: us(res["wake"][k]["wake_after_idle_ns"]["p50"]))
    row(
        "back-to-back round trip p50, default spin",
        lambda k: us(res["wake"][k]["back_to_back_default_spin_ns"]["p50"]),
    )
    row("idle agent, % of a core", lambda k: f"{100 * res['idle'][k]:.2f} %")
    lines.append("")
    idle = res["idle"].get("native")
    fx = res["idle"].get("native_fixed_spin")
    dp = res["idle"].get("native_domain_poll")
    cf = res.get("c_futex_round_trip_ns")
    if isinstance(idle, float):
        lines.append(
            f"- idle native agent: {100 * idle:.2f} % of a core "
            f"(goal < 1 %: {'met' if idle < 0.01 else 'NOT met'})"
            + (f"; with a fixed 50 us spin {100 * fx:.2f} %" if isinstance(fx, float) else "")
            + (
                f"; sleeping the domain's 1 ms poll interval (idle_poll=0) {100 * dp:.2f} %"
                if isinstance(dp, float)
                else ""
            )
        )
    if isinstance(cf, dict):
        pr = res["wake"]["native"]["parked_round_trip_ns"]["p50"]
        ratio = pr / cf["p50"]
        lines.append(
            f"- C futex round trip p50 {us(cf['p50'])}; parked native round trip {us(pr)} = {ratio:.2f}x "
            f"(goal <= 1.3x: {'met' if ratio <= 1.3 else 'NOT met'}; the agent's round trip also runs "
            f"a kernel, a queue pop and a timeline signal)"
        )
    else:
        lines.append(f"- C futex reference: {cf}")
    caps = res["npu"].get("native", {}).get("capabilities")
    if caps:
        lines.append(f"- native npu: GEMM via {caps.get('gemm')} ({caps.get('blas') or caps.get('why')})")
    return "\n".join(lines) + "\n"


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
    ap.add_argument("--idle", type=float, default=5.0, help="seconds an idle agent is watched")
    ap.add_argument("--wake-n", type=int, default=300, help="packets of the parked-wake figures")
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    ap.add_argument("--exe", action="store_true", help="only the hostless-agent vs native round trip")
    a = ap.parse_args()
    name = f"hlbench-native-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    dom = hl.Domain.create(name, fences=8192, participants=16, heap="64M", label="host")
    res: dict[str, Any] = {
        "cpu": {k: [] for k in KINDS},
        "npu": {},
        "wake": {},
        "wake_short": {},
        "idle": {},
    }
    try:
        for _round in range(0 if a.exe else 2):  # interleaved, so that a change of machine load hits both
            for kind in KINDS:
                res["cpu"][kind].append(measure(dom, kind == "native", a.n))
        for kind in KINDS if not a.exe else ():
            res["npu"][kind] = npu_measure(dom, kind == "native", a.n)
            res["wake"][kind] = parked_wake(dom, kind == "native", a.wake_n)
            res["wake_short"][kind] = parked_wake(dom, kind == "native", a.wake_n, gap=0.0002, n_idle=0)
        if not a.exe:
            res["idle"]["native"] = idle_cpu(dom, True, a.idle)
            res["idle"]["native_fixed_spin"] = idle_cpu(dom, True, a.idle, fixed_spin=True)
            res["idle"]["native_domain_poll"] = idle_cpu(dom, True, a.idle, idle_poll=0.0)
        res["exe_vs_native"] = exe_vs_native(dom, a.n)
        print(_exe_report(res["exe_vs_native"]), file=sys.stderr)
    finally:
        dom.close()
        hl.Domain.unlink(name)
    try:
        res["c_futex_round_trip_ns"] = c_futex_round_trip(max(a.wake_n, 1000))
    except (RuntimeError, OSError, ValueError) as e:
        res["c_futex_round_trip_ns"] = f"no C reference: {e}"
    print(json.dumps(res, indent=1))
    text = report(res)
    print(text)
    if a.out:
        Path(a.out + ".json").write_text(json.dumps(res, indent=1))
        Path(a.out + ".md").write_text(text)


if __name__ == "__main__":
    main()
