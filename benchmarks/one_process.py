"""One GPU process per device (issue 23 item 6): user GPU stages beside a GPU command processor
in the same process (hosted, the default) and in a process of its own.

    python benchmarks/one_process.py [-n FRAMES] [-o DIR] [--name NAME]   (a GPU, PyTorch, CuPy)

Three workloads, each timed as ``cg.run`` latency per frame (perf_counter_ns; p10/p50/p90 us) in
direct+shared mode, the host's waits at the domain's default spin:

* ``user``: one PyTorch stage (relu over 64x64 float32) on a cuda agent, host frames: the
  processor idle beside it (it only polls its queue) in each of three setups: ``alone`` (no
  processor), ``hosted`` (``spawn(dom, "gpucp")`` after the cuda agent: in its process, a green
  context of 8 SMs) and ``own`` (``process="own"``: a process of its own, a green context of
  8 SMs there too: the two processes' contexts share the GPU by time slices);
* ``cp_hop``: the processor's copy of 16 floats between two cpu-agent copies (cpu -> GPU -> cpu),
  hosted and own;
* ``mixed``: PyTorch affine (cuda agent) -> relu (the processor) -> PyTorch softmax (cuda
  agent) at 64x64, hosted and own.

Writes DIR/NAME.json and DIR/NAME.md (own/hosted ratios of the p50s).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
import uuid
import warnings
from typing import Any

import numpy as np

N = 64


def relu(x: Any) -> Any:
    import torch

    return torch.relu(x)


def affine(x: Any, w: Any) -> Any:
    return x @ w + 0.5


def softmax(x: Any) -> Any:
    import torch

    return torch.softmax(x, dim=-1)


def _lat(cg: Any, inputs: dict[str, Any], frames: int, budget_s: float = 60.0) -> dict[str, Any]:
    for _ in range(min(50, frames)):
        cg.run(inputs, timeout=60)
    ts = []
    end = time.monotonic() + budget_s
    for _ in range(frames):
        t0 = time.perf_counter_ns()
        cg.run(inputs, timeout=60)
        ts.append(time.perf_counter_ns() - t0)
        if time.monotonic() > end:
            break
    a = np.asarray(ts, dtype=np.float64) / 1e3
    return {
        "frames": len(ts),
        "p10_us": float(np.percentile(a, 10)),
        "p50_us": float(np.median(a)),
        "p90_us": float(np.percentile(a, 90)),
    }


def _user(dom: Any, gpu: Any, frames: int) -> dict[str, Any]:
    from hostless.graph import Graph

    g = Graph(dom).input("x", (N, N), "f4")
    g.stage("relu", gpu, relu, ["x"], ("y", (N, N), "f4"), arrays="torch")
    x = np.random.default_rng(1).standard_normal((N, N)).astype("f4")
    with g.compile(dispatch="direct", data="shared") as cg:
        assert np.allclose(cg.run({"x": x}, timeout=60)["y"], np.maximum(x, 0))
        return _lat(cg, {"x": x}, frames)


def _cp_hop(dom: Any, cpu: Any, gcp: Any, frames: int) -> dict[str, Any]:
    from hostless.graph import Graph

    g = Graph(dom).input("x0", (16,), "f4")
    for k, ag in enumerate([cpu, gcp, cpu]):
        g.stage(f"c{k}", ag, "copy", [f"x{k}"], (f"x{k + 1}", (16,), "f4"))
    x = np.arange(16, dtype="f4")
    with g.compile(dispatch="direct", data="shared") as cg:
        assert np.array_equal(cg.run({"x0": x}, timeout=60)["x3"], x)
        return _lat(cg, {"x0": x}, frames)


def _mixed(dom: Any, gpu: Any, gcp: Any, frames: int) -> dict[str, Any]:
    from hostless.graph import Graph

    rng = np.random.default_rng(2)
    w = (rng.standard_normal((N, N)) / np.sqrt(N)).astype("f4")
    g = Graph(dom).input("x", (N, N), "f4").constant("w", w)
    g.stage("affine", gpu, affine, ["x", "w"], ("a", (N, N), "f4"), arrays="torch")
    g.stage("relu", gcp, "relu", ["a"], ("r", (N, N), "f4"))
    g.stage("soft", gpu, softmax, ["r"], ("y", (N, N), "f4"), arrays="torch")
    x = rng.standard_normal((N, N)).astype("f4")
    with g.compile(dispatch="direct", data="shared") as cg:
        c = np.maximum(x @ w + 0.5, 0)
        e = np.exp(c - c.max(axis=-1, keepdims=True))
        assert np.allclose(cg.run({"x": x}, timeout=60)["y"], e / e.sum(axis=-1, keepdims=True), atol=1e-4)
        return _lat(cg, {"x": x}, frames)


def run(frames: int) -> dict[str, Any]:
    import torch

    import hostless as hl
    from hostless import agents
    from hostless.errors import GpuTimeSliceWarning

    torch.backends.cuda.matmul.allow_tf32 = False
    name = f"hl-oneproc-{uuid.uuid4().hex[:8]}"
    dom = hl.Domain.create(name, heap="256M", device_heaps={"cuda:0": 64 << 20})
    out: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "frames": frames,
        "user": {},
        "cp_hop": {},
        "mixed": {},
    }
    try:
        gpu = agents.spawn(dom, "cuda", device=0, timeout=120)
        cpu = agents.spawn(dom, "cpu")
        try:
            out["user"]["alone"] = _user(dom, gpu, frames)
            print("user alone", out["user"]["alone"], flush=True)
            for setup in ("hosted", "own"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", GpuTimeSliceWarning)
                    gcp = agents.spawn(dom, "gpucp", device=0, timeout=120,
                                       **({"process": "own"} if setup == "own" else {}))
                try:
                    out.setdefault("capabilities", {})[setup] = {
                        k: v for k, v in gcp.capabilities.items() if isinstance(v, (int, float, str, bool))
                    }
                    n = frames if setup == "hosted" else max(30, frames // 10)
                    for what in ("user", "cp_hop", "mixed"):
                        try:
                            if what == "user":
                                out[what][setup] = _user(dom, gpu, n)
                            elif what == "cp_hop":
                                out[what][setup] = _cp_hop(dom, cpu, gcp, frames)
                            else:
                                out[what][setup] = _mixed(dom, gpu, gcp, n)
                        except Exception as e:  # recorded, the rest goes on
                            out[what][setup] = {"error": repr(e)}
                        print(what, setup, out[what][setup], flush=True)
                finally:
                    gcp.stop()
        finally:
            cpu.stop()
            gpu.stop()
    finally:
        dom.close()
        hl.Domain.unlink(name)
    for what in ("user", "cp_hop", "mixed"):
        r = out[what]
        if "p50_us" in r.get("hosted", {}) and "p50_us" in r.get("own", {}):
            r["own_over_hosted"] = r["own"]["p50_us"] / r["hosted"]["p50_us"]
        if "p50_us" in r.get("alone", {}) and "p50_us" in r.get("hosted", {}):
            r["hosted_over_alone"] = r["hosted"]["p50_us"] / r["alone"]["p50_us"]
    return out


def report(res: dict[str, Any]) -> str:
    lines = [
        f"# One GPU process per device ({res['gpu']}, {res['date']})",
        "",
        f"`python benchmarks/one_process.py -n {res['frames']}`: `cg.run` latency per frame, direct+shared, "
        "us (p10 / p50 / p90); the processor idle beside the `user` stage.",
        "",
        "| workload | setup | frames | p10 | p50 | p90 |",
        "|---|---|---|---|---|---|",
    ]
    for what in ("user", "cp_hop", "mixed"):
        for setup in ("alone", "hosted", "own"):
            r = res[what].get(setup)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"| {what} | {setup} | - | {r['error']} | | |")
                continue
            pcts = " | ".join(f"{r[k]:.1f}" for k in ("p10_us", "p50_us", "p90_us"))
            lines.append(f"| {what} | {setup} | {r['frames']} | {pcts} |")
    lines.append("")
    for what in ("user", "cp_hop", "mixed"):
        for k in ("hosted_over_alone", "own_over_hosted"):
            if k in res[what]:
                lines.append(f"- {what}: {k.replace('_', ' ')} = {res[what][k]:.2f}x")
    caps = res.get("capabilities", {})
    for setup, c in caps.items():
        where = c.get("process", "a process of its own")
        lines.append(f"- {setup} processor: {c.get('isolation')}, {c.get('sms')} SMs, in {where}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--frames", type=int, default=1000)
    ap.add_argument("-o", "--out", default="benchmarks/results")
    ap.add_argument("--name", default=None)
    a = ap.parse_args()
    res = run(a.frames)
    name = a.name or f"one-process-{dt.datetime.now():%Y-%m-%d-%H%M}"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, name + ".json"), "w") as f:
        json.dump(res, f, indent=2)
    md = report(res)
    with open(os.path.join(a.out, name + ".md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
