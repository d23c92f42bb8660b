"""The cross-engine chain of ``hostless_tools.bench.gpu_stages`` alone (PyTorch GEMM -> npu relu
-> PyTorch softmax, 256x256, against the host-orchestrated anchor): latency and CPU per frame
by process (their process CPU clocks, in ns), with the host's waits spinning ``HOST_SPIN`` seconds
(0: they sleep at once), over ``FRAMES`` frames of each (3000 by default).

    python benchmarks/cross_engine.py LABEL HOST_SPIN [OUT_DIR [FRAMES]]   (a GPU, PyTorch, CuPy)

Run it with ``PYTHONPATH`` pointing at another build for an A/B; writes
``OUT_DIR/ce-LABEL-SPINUS.json``.  Also prints (and writes under ``threads``), for each timed
loop, the threads of this process and of both agents that ran or woke during it: CPU ns
(``schedstat``), voluntary and involuntary context switches per frame, the kernel function a
thread sleeps in at the end (``wchan``) and, for this process, its Python thread name: to find
what uses the agents' and the host's CPU.
"""

import contextlib
import glob
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import hostless as hl
from hostless import agents
from hostless_tools.bench.gpu_stages import cross_engine
from hostless_tools.bench.pipeline_workloads import ctx_switches, thread_cpu_ns


def threads_of(pid: int) -> dict[int, tuple[str, int, int, int]]:
    """Each live thread of ``pid``: (name, CPU ns, voluntary, involuntary switches), by tid."""
    out = {}
    for t in glob.glob(f"/proc/{pid}/task/*"):
        tid = int(t.rsplit("/", 1)[1])
        try:
            with open(t + "/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended
            continue
        sw = ctx_switches(pid, tid)
        if sw is not None:
            out[tid] = (name, thread_cpu_ns(pid, tid) or 0, *sw)
    return out


def _wchan(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/wchan") as f:
            w = f.read().strip()
    except OSError:
        return "?"
    return w if w not in ("", "0") else "running"


windows: dict[str, dict[str, list[dict[str, Any]]]] = {}


def probe_for(pids: dict[str, int]) -> Callable[[str], contextlib.AbstractContextManager[None]]:
    @contextlib.contextmanager
    def probe(window: str) -> Iterator[None]:
        before = {who: threads_of(p) for who, p in pids.items()}
        yield
        after = {who: threads_of(p) for who, p in pids.items()}
        py = {t.native_id: t.name for t in threading.enumerate()}
        rows: dict[str, list[dict[str, Any]]] = {}
        for who, p in pids.items():
            for tid, (name, ns, vol, invol) in after[who].items():
                _, ns0, vol0, invol0 = before[who].get(tid, (name, 0, 0, 0))
                d = {
                    "thread": f"{name}/{tid}",
                    "cpu_ms": (ns - ns0) / 1e6,
                    "vol_per_frame": (vol - vol0) / frames,
                    "invol_per_frame": (invol - invol0) / frames,
                    "wchan": _wchan(p, tid),
                }
                if p == os.getpid():
                    d["python"] = py.get(tid)
                if d["cpu_ms"] or vol != vol0 or invol != invol0:
                    rows.setdefault(who, []).append(d)
            rows.setdefault(who, []).sort(key=lambda r: -r["cpu_ms"])
        windows[window] = rows

    return probe


label, host_spin = sys.argv[1], float(sys.argv[2])
frames = int(sys.argv[4]) if len(sys.argv) > 4 else 3000
name = f"ceab-{os.getpid()}"
dom = hl.Domain.create(name, heap="1G", device_heaps={"cuda:0": 1 << 30}, spin=host_spin)
try:
    gpu = agents.spawn(dom, "cuda", device=0, timeout=120, spin=50e-6)
    npu = agents.spawn(dom, "npu", spin=50e-6)
    try:
        pids = {"host": os.getpid(), "cuda agent": gpu.proc.pid, "npu agent": npu.proc.pid}
        res = cross_engine(dom, gpu, npu, 256, frames, probe=probe_for(pids))
    finally:
        for a in (gpu, npu):
            a.stop()
finally:
    dom.close()
    hl.Domain.unlink(name)
for k, v in res.items():
    by = v.get("cpu_us_per_frame_by", {})
    print(
        f"{label} spin={host_spin * 1e6:.0f}us {k}: p50 {v['p50_us']:.1f} "
        f"[{v['p10_us']:.1f}-{v['p90_us']:.1f}] CPU {v['cpu_us_per_frame']:.1f} "
        + " ".join(f"{a}={b:.1f}" for a, b in by.items())
        + f" ({frames} frames)"
    )
for window, by in windows.items():
    for who, rows in by.items():
        top = "; ".join(
            f"{r['thread']}{'(' + str(r['python']) + ')' if r.get('python') else ''} {r['cpu_ms']:.1f} ms "
            f"vol {r['vol_per_frame']:.2f} invol {r['invol_per_frame']:.2f} /frame [{r['wchan']}]"
            for r in rows[:6]
        )
        print(f"{label} {window} {who} threads: {top}")
out = sys.argv[3] if len(sys.argv) > 3 else "."
with open(f"{out}/ce-{label}-{int(host_spin * 1e6)}.json", "w") as fh:
    figures = {k: {a: b for a, b in v.items() if a not in ("out", "plan")} for k, v in res.items()}
    json.dump({**figures, "threads": windows, "frames": frames}, fh, indent=1)
