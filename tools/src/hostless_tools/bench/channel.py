"""The channel benchmark: one publisher and 1 or 4 subscriber processes, hostless channels vs
iceoryx2's Python publish-subscribe, in one run on one machine.

Payloads: 64 bytes and a 1080p RGB frame (1920 x 1080 x 3 bytes), as raw bytes.  The
publisher is this process; each subscriber a spawned process (pinned to its own CPU when the
machine has enough).  Both systems run the same loops:

* latency (paced: one frame every ``period_us``, so every subscriber is idle and waiting when
  it comes): the publisher reads ``time.monotonic_ns()``, loans a sample/slot, writes the time
  into its first 8 bytes, publishes; each subscriber, once ``receive`` returns, reads the 8
  bytes and its own clock.  One sample per frame and subscriber; p50 with the spread of the
  per-round medians, p90, p99.  Waiting: hostless ``spin`` (the wait spins all along: like for
  like with iceoryx2, whose ``receive`` is a poll that a subscriber calls in a loop) and
  hostless ``wait`` (the default wait: spins 50 us, then sleeps on a futex) for information.
* throughput (unpaced, every frame delivered: hostless "block" policy, iceoryx2 without safe
  overflow and with ``RetryUntilDelivered``): the publisher copies a prepared frame into each
  loan (one memcpy, as a camera's DMA would fill it) and each subscriber copies every frame it
  receives into private memory (one memcpy).  Frames/s, aggregate bytes/s (subscribers x frame
  size x frames/s) and CPU per frame (``time.process_time`` of the publisher, and of the mean
  subscriber, over the run, divided by the frames).
* memcpy: ``np.copyto`` of one 1080p frame into another in one process (both resident), the
  machine's copy bandwidth, to which the 4-subscriber 1080p aggregate is compared.

iceoryx2 is used as a skilled user would: the sample's memory is reached through its
``payload_ptr`` (a NumPy view over a ``ctypes`` array at that address: half the cost of
``payload().as_memory_view()``); ``poll`` subscribers call ``receive`` in a busy loop,
``wait`` subscribers sleep on an iceoryx2 event (``Listener.timed_wait``) that the
publisher's ``Notifier.notify`` wakes after each ``send`` (its blocking pattern, like for like
with hostless ``wait``).

Why a row is slow: every figure records where its processes ran (``cpus``; the publisher is
pinned for the row only, its affinity restored after) and what took CPU time from them while
it ran (``disturbance``: the cgroup's throttled periods, the hypervisor's steal time on those
CPUs, and the involuntary context switches of the publisher and of each subscriber).  The run
records the cgroup CPU quota and a measured count of usable CPUs (one spinner per CPU at once:
the sum of the fractions of time they ran), since a spinning subscriber that shares its CPU
waits a scheduler slice (milliseconds) instead of microseconds.

iceoryx2 (``pip install iceoryx2``) is optional: without it its figures are reported as not
measured, with the reason.  Reproduce: ``hostless bench channel`` (``--quick``: a smoke run).
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from . import report
from .cpus import Disturbance, cgroup_quota, involuntary_switches, usable_cpus
from .harness import Child, Progress, Recorder, affinity, finish, new_result, pinned, ratio, summarize

__all__ = ["ChannelBenchConfig", "run", "print_report", "write_results"]

PAYLOADS = {"64B": 64, "1080p": 1920 * 1080 * 3}
FPS_1080P = 1920 * 1080 * 3
_DEPTH = 4


@dataclass
class ChannelBenchConfig:
    quick: bool = False
    subscribers: tuple[int, ...] = (1, 4)
    payloads: tuple[str, ...] = ("64B", "1080p")
    latency_frames: int = 3000
    """Frames per latency figure (the 1080p rows use a tenth)."""
    throughput_frames: int = 20000
    """Frames per throughput figure at 64 B (the 1080p rows use 400)."""
    throughput_frames_1080p: int = 400
    rounds: int = 3
    period_us: float = 200.0
    """The latency loop's frame period."""
    pin: bool = True
    iceoryx2: bool = True
    probe_cpus: bool = True
    """Measure the usable CPUs (one spinner per CPU for half a second) before the figures."""

    @classmethod
    def quick_config(cls) -> ChannelBenchConfig:
        return cls(
            quick=True, latency_frames=300, throughput_frames=2000, throughput_frames_1080p=40, rounds=1
        )


def _ptr_view(array: Any, ptr: int) -> np.ndarray:
    """A writable NumPy view of the bytes at address ``ptr`` (an iceoryx2 sample's payload);
    ``array``: the ctypes array type of its size (``ctypes.c_uint8 * nbytes``)."""
    return np.frombuffer(memoryview(array.from_address(ptr)).cast("B"), np.uint8)


# --------------------------------------------------------------------------- the two systems


class _Hostless:
    name = "hostless"

    def __init__(self, nbytes: int, subs: int) -> None:
        import hostless as hl

        self.dname = f"hostless-bench-ch-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        self.dom = hl.Domain.create(self.dname, heap=max(1 << 20, nbytes * (_DEPTH + 1) + (1 << 20)))
        self.pub = hl.Channel(self.dom, "bench", nbytes, depth=_DEPTH, timeout=30, grace=30)
        self.stamps = [np.frombuffer(v, "<u8", 1) for v in self.pub._views]

    def send(self, src: np.ndarray | None) -> None:
        t0 = time.monotonic_ns()
        with self.pub.loan() as f:
            if src is not None:
                np.copyto(f.data, src)
            self.stamps[(f.seq - 1) % _DEPTH][0] = t0

    def where(self) -> str:
        return self.dname

    def close(self) -> None:
        import hostless as hl

        self.pub.close()
        self.dom.close()
        try:
            hl.Domain.unlink(self.dname)
        except FileNotFoundError:
            pass


class _Iceoryx2:
    name = "iceoryx2"

    def __init__(self, nbytes: int, subs: int, wake: bool = False) -> None:
        import iceoryx2 as iox2

        self.iox2, self.nbytes = iox2, nbytes
        self.array = ctypes.c_uint8 * nbytes
        self.sname = f"hostless-bench-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        self.node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
        self.service = (
            self.node.service_builder(iox2.ServiceName.new(self.sname))
            .publish_subscribe(iox2.Slice[ctypes.c_uint8])
            .enable_safe_overflow(False)
            .subscriber_max_buffer_size(_DEPTH)
            .max_subscribers(max(subs, 1))
            .create()
        )
        self.pub = (
            self.service.publisher_builder()
            .initial_max_slice_len(nbytes)
            .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered)
            .create()
        )
        self.notifier = None
        if wake:  # the blocking pattern: an event the subscribers sleep on, notified after each send
            ev = iox2.ServiceName.new(self.sname + "/ev")
            self.event = self.node.service_builder(ev).event().open_or_create()
            self.notifier = self.event.notifier_builder().create()

    def send(self, src: np.ndarray | None) -> None:
        t0 = time.monotonic_ns()
        s = self.pub.loan_slice_uninit(self.nbytes)
        ptr = s.payload_ptr
        if src is not None:
            np.copyto(_ptr_view(self.array, ptr), src)
        ctypes.c_uint64.from_address(ptr).value = t0
        s.assume_init().send()
        if self.notifier is not None:
            self.notifier.notify()

    def where(self) -> str:
        return self.sname

    def close(self) -> None:
        if self.notifier is not None:
            self.notifier.delete()
            self.notifier = self.event = None
        self.pub.delete()
        self.service = self.node = None  # (a node has no delete(): dropped with its last reference)


def _subscriber(conn: Connection, system: str, where: str, index: int, nbytes: int, spin: bool) -> None:
    """A subscriber process: joins, says "ready", then runs ("latency"|"throughput", frames);
    with each result its involuntary context switches over the loop (``ivcsw``)."""
    if system == "hostless":
        import hostless as hl

        dom = hl.Domain.open(where, spin=1.0 if spin else 50e-6)
        sub = hl.Subscriber(dom, "bench", f"s{index}", start="next", timeout=30)

        def take() -> tuple[Any, np.ndarray]:
            f = sub.receive(30)
            return f, f.data

        def give(f: Any) -> None:
            f.__exit__(None, None, None)

    else:
        import iceoryx2 as iox2

        node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
        service = (
            node.service_builder(iox2.ServiceName.new(where)).publish_subscribe(iox2.Slice[ctypes.c_uint8]).open()
        )
        isub = service.subscriber_builder().buffer_size(_DEPTH).create()
        array = ctypes.c_uint8 * nbytes
        listener = None
        if not spin:
            event = node.service_builder(iox2.ServiceName.new(where + "/ev")).event().open_or_create()
            listener = event.listener_builder().create()
            nap = iox2.Duration.from_millis(100)

        def take() -> tuple[Any, np.ndarray]:
            while True:
                s = isub.receive()
                if s is not None:
                    return s, _ptr_view(array, s.payload_ptr)
                if listener is not None:
                    listener.timed_wait(nap)

        def give(f: Any) -> None:
            f.delete()

    conn.send(("ready", None))
    mine = np.empty(nbytes, np.uint8)
    mine[:] = 1
    while True:
        cmd, n = conn.recv()
        if cmd == "quit":
            break
        sw = involuntary_switches()
        if cmd == "latency":
            lat = np.empty(n, np.int64)
            for i in range(n):
                s, a = take()
                t1 = time.monotonic_ns()
                lat[i] = t1 - int(a[:8].view("<u8")[0])
                give(s)
            conn.send(("latency", (lat, involuntary_switches() - sw)))
        else:
            c0 = time.process_time()
            for i in range(n):
                s, a = take()
                if i == 0:
                    t_first = time.monotonic_ns()
                np.copyto(mine, a)
                give(s)
            conn.send(("throughput", {"cpu_s": time.process_time() - c0, "t_last": time.monotonic_ns(),
                                      "t_first": t_first, "ivcsw": involuntary_switches() - sw}))
    if system == "hostless":
        sub.close()
        dom.close()
    else:
        if listener is not None:
            listener.delete()
        isub.delete()
        del service, node


def _cpus(subs: int, want: bool) -> tuple[int | None, list[int | None]]:
    """The publisher's CPU and each subscriber's (None: not pinned, too few CPUs or not wanted)."""
    cpus = affinity()
    if not want or len(cpus) < subs + 1:
        return None, [None] * subs
    return cpus[0], [cpus[1 + i] for i in range(subs)]


def _measure(system: str, payload: str, subs: int, cfg: ChannelBenchConfig, spin: bool) -> dict[str, Any]:
    """Latency samples (per round) and one throughput run of one system/payload/subscriber count,
    with where the processes ran and what disturbed them."""
    nbytes = PAYLOADS[payload]
    sysobj: _Hostless | _Iceoryx2
    sysobj = _Hostless(nbytes, subs) if system == "hostless" else _Iceoryx2(nbytes, subs, wake=not spin)
    me, theirs = _cpus(subs, cfg.pin)
    kids: list[Child] = []
    out: dict[str, Any] = {
        "pinned": me is not None,
        "cpus": {"publisher": me, "subscribers": theirs, "allowed": len(affinity())},
    }
    try:
        args = (system, sysobj.where())
        kids = [Child(_subscriber, (*args, i, nbytes, spin), theirs[i], "subscriber") for i in range(subs)]
        for k in kids:
            k.expect("ready")
        if isinstance(sysobj, _Hostless):
            deadline = time.monotonic() + 30
            while len(sysobj.pub.subscribers) < subs and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            sysobj.pub.update_connections()
        # pinned for the row only: the next row's subscribers are spawned from this process and
        # inherit its affinity (left pinned, every later row ran on one CPU)
        with pinned(me):
            out.update(_loops(sysobj, kids, payload, subs, cfg, spin, [me, *theirs]))
        for k in kids:
            k.conn.send(("quit", None))
            k.finish()
    finally:
        for k in kids:
            k.close()
        sysobj.close()
    return out


def _loops(
    sysobj: _Hostless | _Iceoryx2,
    kids: list[Child],
    payload: str,
    subs: int,
    cfg: ChannelBenchConfig,
    spin: bool,
    cpus: list[int | None],
) -> dict[str, Any]:
    nbytes = PAYLOADS[payload]
    big = nbytes > 4096
    out: dict[str, Any] = {}
    n = max(20, cfg.latency_frames // (10 if big else 1))
    period = cfg.period_us * 1e3 * (10 if big else 1)
    rounds = []
    ivcsw = [0] * len(kids)
    dist = Disturbance(cpus)
    for _r in range(cfg.rounds):
        for k in kids:
            k.conn.send(("latency", n))
        t = time.monotonic_ns()
        for _ in range(n):
            t += int(period)
            while time.monotonic_ns() < t:
                pass
            sysobj.send(None)
        got = [k.expect("latency") for k in kids]
        for i, (_lat, sw) in enumerate(got):
            ivcsw[i] += sw
        rounds.append(np.concatenate([lat for lat, _sw in got]))
    out["latency"] = summarize(np.concatenate(rounds), groups=rounds)
    out["disturbance"] = {"latency": {**dist.delta(), "subscriber_ivcsw": ivcsw}}
    if not spin or not isinstance(sysobj, _Hostless):
        frames = cfg.throughput_frames_1080p if big else cfg.throughput_frames
        src = np.full(nbytes, 7, np.uint8)
        dist = Disturbance(cpus)
        for k in kids:
            k.conn.send(("throughput", frames))
        c0, t0 = time.process_time(), time.monotonic_ns()
        for _ in range(frames):
            sysobj.send(src)
        pub_cpu = time.process_time() - c0
        res = [k.expect("throughput") for k in kids]
        wall = (max(r["t_last"] for r in res) - t0) / 1e9
        fps = frames / wall
        out["throughput"] = {
            "frames": frames,
            "frames_per_s": fps,
            "aggregate_bytes_per_s": fps * nbytes * subs,
            "publisher_cpu_us_per_frame": pub_cpu / frames * 1e6,
            "subscriber_cpu_us_per_frame": float(np.mean([r["cpu_s"] for r in res])) / frames * 1e6,
        }
        out["disturbance"]["throughput"] = {**dist.delta(), "subscriber_ivcsw": [r["ivcsw"] for r in res]}
    return out


def _memcpy() -> dict[str, float]:
    a, b = np.full(FPS_1080P, 3, np.uint8), np.zeros(FPS_1080P, np.uint8)
    ts = []
    for _ in range(60):
        t0 = time.perf_counter_ns()
        np.copyto(b, a)
        ts.append(time.perf_counter_ns() - t0)
    ts = ts[10:]
    med = float(np.median(ts))
    return {"bytes": FPS_1080P, "p50_ns": med, "bytes_per_s": FPS_1080P / (med / 1e9)}


def run(cfg: ChannelBenchConfig | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Run every figure; returns the result (JSON-serialisable)."""
    cfg = cfg or ChannelBenchConfig()
    started = time.monotonic()
    result = new_result("channel", cfg, figures={}, memcpy=None, iceoryx2=None)
    rec = Recorder(result["errors"], progress)
    if cfg.iceoryx2:
        try:
            import iceoryx2

            result["iceoryx2"] = getattr(iceoryx2, "__version__", None) or _dist_version("iceoryx2")
        except ImportError as e:
            result["iceoryx2_missing"] = f"iceoryx2 is not installed ({e}): pip install iceoryx2"
    else:
        result["iceoryx2_missing"] = "disabled (--no-iceoryx2)"
    result["cpu"] = {"quota": cgroup_quota(), "affinity": len(affinity())}
    if cfg.probe_cpus:
        result["cpu"]["usable"] = rec.attempt("usable_cpus", lambda: usable_cpus(affinity()), "usable CPUs")
    result["memcpy"] = rec.attempt("memcpy", _memcpy, "memcpy bandwidth")
    modes = [("hostless", "spin"), ("hostless", "wait")]
    if result["iceoryx2"] is not None:
        modes += [("iceoryx2", "poll"), ("iceoryx2", "wait")]
    for payload in cfg.payloads:
        for subs in cfg.subscribers:
            for system, mode in modes:
                key = f"{system}-{mode}/{payload}/{subs}"
                rec.say(f"  {key}")
                got = rec.attempt(key, _bind(system, payload, subs, cfg, mode in ("spin", "poll")))
                if got is not None:
                    result["figures"][key] = got
    finish(result, goals, started)
    return result


def _bind(system: str, payload: str, subs: int, cfg: ChannelBenchConfig, spin: bool) -> Any:
    return lambda: _measure(system, payload, subs, cfg, spin)


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


# --------------------------------------------------------------------------- goals and report


def goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    f = result["figures"]
    for subs in (1, 4):
        for payload in PAYLOADS:
            h = f.get(f"hostless-spin/{payload}/{subs}", {}).get("latency", {}).get("p50")
            i = f.get(f"iceoryx2-poll/{payload}/{subs}", {}).get("latency", {}).get("p50")
            r = ratio(i, h)
            out.append({"label": f"latency p50, {payload}, {subs} subscriber(s): iceoryx2 / hostless",
                        "value": r, "goal": ">= 10x", "met": None if r is None else r >= 10})
    tp = f.get("hostless-wait/1080p/4", {}).get("throughput", {}).get("aggregate_bytes_per_s")
    bw = (result.get("memcpy") or {}).get("bytes_per_s")
    r = ratio(tp, bw)
    out.append({"label": "1080p aggregate throughput, 4 subscribers / memcpy bandwidth", "value": r,
                "goal": ">= 0.8", "met": None if r is None else r >= 0.8})
    return out


HEADERS = ["system", "payload", "subs", "p50 (spread)", "p90", "p99", "frames/s", "aggregate",
           "pub CPU/frame", "sub CPU/frame"]


def rows(result: dict[str, Any]) -> list[list[str]]:
    out = []
    for key, v in result["figures"].items():
        system, payload, subs = key.split("/")
        lat, tp = v.get("latency"), v.get("throughput")
        out.append([
            system, payload, subs,
            f"{report.fmt_ns(lat['p50'])} ({report.fmt_ns(lat['p50_lo'])}-{report.fmt_ns(lat['p50_hi'])})"
            if lat else "-",
            report.fmt_ns(lat["p90"]) if lat else "-",
            report.fmt_ns(lat["p99"]) if lat else "-",
            f"{tp['frames_per_s']:,.0f}" if tp else "-",
            f"{tp['aggregate_bytes_per_s'] / 1e9:.2f} GB/s" if tp else "-",
            f"{tp['publisher_cpu_us_per_frame']:.1f} us" if tp else "-",
            f"{tp['subscriber_cpu_us_per_frame']:.1f} us" if tp else "-",
        ])
    return out


DIST_HEADERS = ["system", "payload", "subs", "CPUs (pub; subs)", "loop", "throttled", "steal",
                "pub invol. switches", "subs invol. switches"]


def _fmt_cpu(c: Any) -> str:
    return "-" if c is None else str(c)


def disturbance_rows(result: dict[str, Any]) -> list[list[str]]:
    """What took CPU time from each figure's processes (runs before this table existed: none)."""
    out = []
    for key, v in result["figures"].items():
        system, payload, subs = key.split("/")
        cpus = v.get("cpus") or {}
        subs_at = ",".join(_fmt_cpu(c) for c in cpus.get("subscribers", []))
        where = f"{_fmt_cpu(cpus.get('publisher'))}; {subs_at}"
        for loop, d in (v.get("disturbance") or {}).items():
            thr = "-" if d.get("throttled") is None else f"{d['throttled']} ({d['throttled_ms']:.1f} ms)"
            steal = "-" if d.get("steal_ms") is None else f"{d['steal_ms']:.0f} ms"
            out.append([system, payload, subs, where, loop, thr, steal, str(d.get("publisher_ivcsw", "-")),
                        ",".join(str(x) for x in d.get("subscriber_ivcsw", []))])
    return out


def _cpu_details(result: dict[str, Any]) -> list[str]:
    cpu = result.get("cpu")
    if not cpu:
        return []
    q = cpu.get("quota") or {}
    quota = "none" if q.get("cpus") is None else f"{q['cpus']:.2f} CPUs"
    line = (f"CPUs: {cpu.get('affinity')} in the affinity mask, cgroup quota {quota}"
            f" ({q.get('source') or 'not found'})")
    u = cpu.get("usable")
    if u:
        line += (f"; usable, measured: {u['usable']:.2f} of {u['cpus']} (a spinner per CPU for"
                 f" {u['seconds']} s; worst gap {report.fmt_ns((u.get('worst_gap_us') or 0) * 1e3)})")
    return [line]


def goal_rows(result: dict[str, Any]) -> list[list[str]]:
    return [
        [g["label"], "-" if g["value"] is None else f"{g['value']:.2f}", g["goal"], report.fmt_met(g["met"])]
        for g in result["goals"]
    ]


def report_markdown(result: dict[str, Any]) -> str:
    mc = result.get("memcpy") or {}
    ice = result.get("iceoryx2") or f"not measured: {result.get('iceoryx2_missing')}"
    figs = result["figures"].values()
    npinned = sum(1 for v in figs if v.get("pinned"))
    details = [
        f"iceoryx2: {ice}",
        f"memcpy of a 1080p frame: {mc.get('bytes_per_s', 0) / 1e9:.2f} GB/s (np.copyto, p50)",
        ("subscribers pinned to their own CPUs" if npinned == len(figs) else
         f"pinned in {npinned} of {len(figs)} figures (the others: too few CPUs, or --no-pin)"),
        *_cpu_details(result),
    ]
    lines = report.header("channel", result, details)
    lines += report.section("Goals", None, ["goal", "value", "target", "met"], goal_rows(result))
    lines += report.section(
        "Latency (publish -> subscriber holds the view) and throughput",
        "\n\n".join((__doc__ or "").split("\n\n")[1:4]),
        HEADERS, rows(result))
    drows = disturbance_rows(result)
    if drows:
        intro = "\n\n".join((__doc__ or "").split("\n\n")[4:5])
        lines += report.section("What disturbed each figure", intro, DIST_HEADERS, drows)
    lines += report.errors_section(result)
    lines += ["Reproduce: `hostless bench channel` (see benchmarks/README.md).", ""]
    return "\n".join(lines)


def write_results(result: dict[str, Any], out_dir: str | os.PathLike[str] = "benchmarks/results") -> Any:
    return report.write_results("channel", result, report_markdown(result), out_dir)


def print_report(result: dict[str, Any], *, plain: bool = False) -> None:
    report.print_tables(
        [("hostless channel benchmark: goals", ["goal", "value", "target", "met"], goal_rows(result)),
         ("channels vs iceoryx2 (latency p50/p90/p99; throughput; CPU per frame)", HEADERS, rows(result))],
        result, plain=plain)
