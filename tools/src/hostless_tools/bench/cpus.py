"""What the CPUs a benchmark runs on really give, and what disturbed a figure.

A spinning process (a subscriber polling, a publisher pacing its frames) measures in
microseconds only while it has a CPU to itself.  ``os.sched_getaffinity`` lists the CPUs a
process may run on, not how much of them it gets: a cgroup CPU quota (``cpu.max``, or
``cpu.cfs_quota_us`` on cgroup v1), a hypervisor that runs the virtual CPUs on fewer physical
ones (its "steal" time), or another process on the same CPU each take some of it away, and a
figure that should be microseconds turns into milliseconds (a scheduler slice).  This module
reads those:

* :func:`cgroup_quota`: the quota in CPUs (None: no quota), and where it was read;
* :func:`usable_cpus`: a measurement: one spinner pinned to each CPU at once, each counting
  the time it did not run (gaps in its own clock over ``gap_us``); ``usable`` is the sum of
  the fractions of time they ran (16 CPUs all usable: 16.0);
* :class:`Disturbance`: a snapshot before and after a figure of the cgroup's throttling
  (``nr_throttled``, ``throttled_usec``), the steal time of the CPUs it ran on, and this
  process's involuntary context switches; :meth:`Disturbance.delta` gives the differences.

Everything is best effort: what cannot be read is None, never an error.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["cgroup_quota", "cgroup_stat", "steal_ms", "involuntary_switches", "usable_cpus", "Disturbance"]

_V2 = "/sys/fs/cgroup"
_V1 = "/sys/fs/cgroup/cpu"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _own_cgroup_dirs() -> list[str]:
    """The cgroup directories of this process (v2 first, then v1's cpu controller), most
    specific first; the root ones as a fallback (a container sees its own cgroup as the root)."""
    out: list[str] = []
    text = _read("/proc/self/cgroup") or ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, ctrls, path = parts
        if hier == "0" and ctrls == "":
            out.append(os.path.join(_V2, path.lstrip("/")))
        elif "cpu" in ctrls.split(","):
            out.append(os.path.join(_V1, path.lstrip("/")))
    out += [_V2, _V1]
    seen: list[str] = []
    for d in out:
        d = os.path.normpath(d)
        if d not in seen:
            seen.append(d)
    return seen


def cgroup_quota(dirs: Sequence[str] | None = None) -> dict[str, Any]:
    """``{"cpus": quota in CPUs or None (no quota), "source": the file read or None, "raw": its text}``,
    from the first of ``dirs`` (default: this process's cgroup directories) that has one."""
    for d in _own_cgroup_dirs() if dirs is None else dirs:
        raw = _read(os.path.join(d, "cpu.max"))
        if raw is not None:
            qs, _, ps = raw.strip().partition(" ")
            cpus = None if qs == "max" or not ps.isdigit() or not qs.isdigit() else int(qs) / int(ps)
            return {"cpus": cpus, "source": os.path.join(d, "cpu.max"), "raw": raw.strip()}
        q1 = _read(os.path.join(d, "cpu.cfs_quota_us"))
        p1 = _read(os.path.join(d, "cpu.cfs_period_us"))
        if q1 is not None and p1 is not None:
            q, p = int(q1), int(p1)
            return {
                "cpus": None if q <= 0 or p <= 0 else q / p,
                "source": os.path.join(d, "cpu.cfs_quota_us"),
                "raw": f"{q} {p}",
            }
    return {"cpus": None, "source": None, "raw": None}


def cgroup_stat(dirs: Sequence[str] | None = None) -> dict[str, int] | None:
    """The cgroup's ``cpu.stat`` throttling counters: ``nr_periods``, ``nr_throttled``,
    ``throttled_usec`` (v1's ``throttled_time`` in ns, converted); None when unreadable."""
    for d in _own_cgroup_dirs() if dirs is None else dirs:
        raw = _read(os.path.join(d, "cpu.stat"))
        if raw is None:
            continue
        vals: dict[str, int] = {}
        for line in raw.splitlines():
            k, _, v = line.partition(" ")
            if v.strip().lstrip("-").isdigit():
                vals[k] = int(v)
        if "throttled_time" in vals and "throttled_usec" not in vals:
            vals["throttled_usec"] = vals["throttled_time"] // 1000
        if "nr_throttled" in vals:
            return {k: vals[k] for k in ("nr_periods", "nr_throttled", "throttled_usec") if k in vals}
    return None


def steal_ms(cpus: Sequence[int] | None = None) -> dict[int, float]:
    """Steal time (ms: a hypervisor ran something else on the physical CPU) of each of ``cpus``
    (default: all) since boot, from /proc/stat; empty when unreadable."""
    text = _read("/proc/stat") or ""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, float] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        f = line.split()
        try:
            cpu = int(f[0][3:])
            st = int(f[8]) if len(f) > 8 else 0
        except ValueError:
            continue
        if cpus is None or cpu in cpus:
            out[cpu] = st * 1000.0 / tick
    return out


def involuntary_switches() -> int:
    """This process's involuntary context switches so far (preempted while it wanted to run)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw)


class Disturbance:
    """A snapshot of what can take CPU time away from a figure; :meth:`delta` after it."""

    def __init__(self, cpus: Sequence[int | None]) -> None:
        self.cpus = sorted({c for c in cpus if c is not None})
        self.t = time.monotonic()
        self.stat = cgroup_stat()
        self.steal = steal_ms(self.cpus or None)
        self.ivcsw = involuntary_switches()

    def delta(self) -> dict[str, Any]:
        """Differences since the snapshot: ``throttled`` (periods the cgroup was throttled) and
        ``throttled_ms``, ``steal_ms`` (summed over the CPUs), ``publisher_ivcsw`` (this process),
        ``seconds``."""
        now = Disturbance(self.cpus)
        out: dict[str, Any] = {"seconds": round(now.t - self.t, 3)}
        if self.stat is not None and now.stat is not None:
            out["throttled"] = now.stat.get("nr_throttled", 0) - self.stat.get("nr_throttled", 0)
            usec = now.stat.get("throttled_usec", 0) - self.stat.get("throttled_usec", 0)
            out["throttled_ms"] = usec / 1e3
        else:
            out["throttled"] = out["throttled_ms"] = None
        out["steal_ms"] = (
            round(sum(now.steal.get(c, 0.0) - v for c, v in self.steal.items()), 3) if self.steal else None
        )
        out["publisher_ivcsw"] = now.ivcsw - self.ivcsw
        return out


_SPINNER = r"""
import json, os, sys, time
cpu, seconds, start, gap = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    os.sched_setaffinity(0, {cpu})
    pinned = True
except OSError:
    pinned = False
now = time.monotonic_ns
while now() < start:
    pass
end = start + int(seconds * 1e9)
last = t = now()
lost = worst = gaps = 0
while t < end:
    t = now()
    d = t - last
    if d > gap:
        lost += d
        gaps += 1
        worst = max(worst, d)
    last = t
ru = __import__("resource").getrusage(0)
print(json.dumps({"cpu": cpu, "pinned": pinned, "ran": 1 - lost / (seconds * 1e9), "gaps": gaps,
                  "worst_gap_us": worst / 1e3, "ivcsw": ru.ru_nivcsw}))
"""


def usable_cpus(cpus: Sequence[int], seconds: float = 0.5, gap_us: float = 20.0) -> dict[str, Any]:
    """Spin one process pinned to each of ``cpus`` for ``seconds`` at the same time; each counts
    the time it did not run (gaps over ``gap_us`` between two reads of its clock).  Returns
    ``usable`` (the sum of the fractions of time they ran), ``per_cpu`` and the spinners' worst
    gap: what a benchmark that keeps ``len(cpus)`` processes busy can count on."""
    start = time.monotonic_ns() + int(0.5e9) + len(cpus) * int(30e6)  # (all started by then)
    procs = [
        subprocess.Popen(
            [sys.executable, "-S", "-c", _SPINNER, str(c), str(seconds), str(start), str(int(gap_us * 1e3))],
            stdout=subprocess.PIPE,
            text=True,
        )
        for c in cpus
    ]
    per: list[dict[str, Any]] = []
    for p in procs:
        out, _ = p.communicate(timeout=60 + seconds)
        if p.returncode == 0 and out.strip():
            per.append(json.loads(out.strip().splitlines()[-1]))
    return {
        "cpus": len(cpus),
        "usable": round(sum(max(0.0, r["ran"]) for r in per), 2),
        "seconds": seconds,
        "gap_us": gap_us,
        "worst_gap_us": max((r["worst_gap_us"] for r in per), default=None),
        "per_cpu": per,
    }
