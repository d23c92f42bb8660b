"""GPU stages from user functions against what a GPU user writes without hostless (issue 23).

``python -m hostless_tools.bench.gpu_stages -o DIR`` on a machine with a GPU, PyTorch and CuPy
(``--only data,cross_engine`` runs some sections of :data:`SECTIONS`, with their anchors).
One run, one frame at a time (latency: a host frame in, its output back as a NumPy array,
as :meth:`hostless.graph.CompiledGraph.run` returns it):

* **anchors**, in the same run: PyTorch eager and a whole-chain CUDA graph replay with pinned
  host I/O (and device-resident), plain CuPy with pinned I/O (and pageable, labelled as
  such), two resident blocks ping-ponging a flag in device memory, and a host process
  orchestrating the cross-engine chain with the best host code (CUDA graph replays, the
  npu leg pushed and waited on through a hostless graph).
  Each anchor copies the frame into its pinned input and the result out of its pinned
  output, as ``run()`` does (``run()`` returns a copy); the graph replay without that last
  copy is recorded too (``cuda_graph_nocopy``).
* **hostless**: the same functions (``hostless_tools.bench.gpu_stage_ops``) as stages of a
  :class:`~hostless.graph.Graph` on one cuda agent, fused into one segment and captured
  as a CUDA graph (``plan()`` recorded).

Goals are the issue's, each in one mode chosen before the run (direct+shared), reported met
or not with the anchor's p10-p90 spread.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import hostless as hl
from hostless import agents
from hostless.graph import Graph
from hostless_tools.bench import gpu_stage_ops as ops
from hostless_tools.bench.gpu import save
from hostless_tools.bench.gpu_stage_anchors import (
    DATA_CUPY,
    GEMM,
    SMALL,
    Chain,
    chain_weights,
    cupy_anchor,
    flag_pingpong,
    time_frames,
    torch_anchor,
    torch_device_anchor,
)
from hostless_tools.bench.pipeline_workloads import proc_cpu_ns


def _graph(dom: hl.Domain, gpu: Any, chain: Chain, shape: tuple[int, ...], n: int, arrays: str) -> Graph:
    g = Graph(dom).input("x0", shape, "f4")
    for i, w in enumerate(chain_weights(chain, n)):
        g.constant(f"W{i}", w)
    prev, wi = "x0", 0
    for k, (f, nw, sc) in enumerate(chain):
        ins = [prev] + [f"W{wi + j}" for j in range(nw)]
        wi += nw
        g.stage(
            f"s{k}_{f.__name__}", gpu, f, ins, (f"x{k + 1}", shape, "f4"), scalars=list(sc), arrays=arrays
        )
        prev = f"x{k + 1}"
    return g


def hostless_rows(
    g: Graph, feed: dict[str, np.ndarray], out: str, frames: int, modes: tuple[tuple[str, str], ...]
) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for dispatch, data in modes:
        with g.compile(dispatch=dispatch, data=data) as cg:

            def step(cg: Any = cg) -> Any:
                return cg.run(feed, timeout=300)[out]

            st, o = time_frames(step, frames)
            res[f"{dispatch}+{data}"] = {**st, "plan": cg.plan(), "out": o}
    return res


def _chain_rows(
    dom: hl.Domain,
    gpu: Any,
    chain: Chain,
    n: int,
    arrays: str,
    frames: int,
    modes: tuple[tuple[str, str], ...],
) -> dict[str, Any]:
    """:func:`hostless_rows` of ``chain`` over n x n float32 frames on ``gpu``, the host frame
    random (seed 1), as the anchors' frames are."""
    frame = np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)
    g = _graph(dom, gpu, chain, (n, n), n, arrays)
    return hostless_rows(g, {"x0": frame}, f"x{len(chain)}", frames, modes)


def chain16(dom: hl.Domain, cpu: Any, gpu: Any, kinds: str, frames: int) -> dict[str, Any]:
    """A chain of 16 float32 through ``kinds`` ("c": a cpu ``copy`` stage, "g": a PyTorch
    ``add1`` stage on ``gpu``), timed direct+shared: :func:`hostless_rows`' row."""
    g = Graph(dom).input("x0", (16,), "f4")
    for j, kd in enumerate(kinds):
        out = (f"x{j + 1}", (16,), "f4")
        if kd == "c":
            g.stage(f"s{j}", cpu, "copy", [f"x{j}"], out)
        else:
            g.stage(f"s{j}", gpu, ops.add1, [f"x{j}"], out, arrays="torch")
    x16 = np.arange(16, dtype=np.float32)
    row: dict[str, Any] = hostless_rows(g, {"x0": x16}, f"x{len(kinds)}", frames, (("direct", "shared"),))[
        "direct+shared"
    ]
    return row


def _cpu_by(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system, in ns steps) used so far by this process (``host``) and
    each of ``pids`` (their process CPU clocks: ``proc_cpu_ns``)."""
    out = {"host": time.process_time()}
    for name, p in pids.items():
        out[name] = proc_cpu_ns(p) / 1e9
    return out


def _cpu_row(c0: dict[str, float], c1: dict[str, float], frames: int) -> dict[str, Any]:
    """CPU per frame in all (``cpu_us_per_frame``) and by process (``cpu_us_per_frame_by``)."""
    by = {k: (c1[k] - c0[k]) / frames * 1e6 for k in c0}
    return {"cpu_us_per_frame": sum(by.values()), "cpu_us_per_frame_by": by}


def cross_engine(
    dom: hl.Domain,
    gpu: Any,
    npu: Any,
    n: int,
    frames: int,
    probe: Callable[[str], contextlib.AbstractContextManager[Any]] | None = None,
) -> dict[str, Any]:
    """PyTorch GEMM -> npu relu -> PyTorch softmax: hostless direct+shared, against a host
    process orchestrating it (CUDA graph replays, a synchronize for the GPU's completion, the
    npu leg through a hostless graph run: push and wait); latency and CPU per frame of every
    process involved.  ``probe(name)``, when given, is entered around each timed loop
    (``"hostless"``, ``"host_orchestrated"``): a diagnostic's window."""
    window = probe or (lambda _name: contextlib.nullcontext())
    import torch

    w = chain_weights([(ops.gemm, 1, ())], n)[0]
    frame = np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)
    g = Graph(dom).input("x", (n, n), "f4").constant("w", w)
    g.stage("gemm", gpu, ops.gemm, ["x", "w"], ("a", (n, n), "f4"), arrays="torch")
    g.stage("relu", npu, "relu", ["a"], ("r", (n, n), "f4"))
    g.stage("softmax", gpu, ops.softmax, ["r"], ("y", (n, n), "f4"), arrays="torch")
    res: dict[str, Any] = {}
    with g.compile(dispatch="direct", data="shared") as cg:
        cg.run({"x": frame})
        pids = {"cuda agent": gpu.proc.pid, "npu agent": npu.proc.pid}
        with window("hostless"):
            c0 = _cpu_by(pids)
            st, o = time_frames(lambda: cg.run({"x": frame}, timeout=60)["y"], frames, warm=0)
            c1 = _cpu_by(pids)
        res["hostless"] = {**st, **_cpu_row(c0, c1, frames), "plan": cg.plan(), "out": o}
    # the host-orchestrated anchor
    dev = torch.device("cuda:0")
    wt = torch.from_numpy(w).to(dev)
    x = torch.empty((n, n), device=dev)
    r = torch.empty((n, n), device=dev)
    hin = torch.empty((n, n)).pin_memory()
    ha = torch.empty((n, n)).pin_memory()
    hr = torch.empty((n, n)).pin_memory()
    hy = torch.empty((n, n)).pin_memory()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        ops.gemm(x, wt)
        ops.softmax(r)
    s.synchronize()
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        a = ops.gemm(x, wt)
    with torch.cuda.graph(g2):
        y = ops.softmax(r)
    ng = Graph(dom).input("a", (n, n), "f4")
    ng.stage("relu", npu, "relu", ["a"], ("r", (n, n), "f4"))
    cur = torch.cuda.current_stream()
    with ng.compile(dispatch="direct", data="shared") as ncg:

        def step() -> Any:
            hin.numpy()[...] = frame
            x.copy_(hin, non_blocking=True)
            g1.replay()
            ha.copy_(a, non_blocking=True)
            cur.synchronize()
            hr.numpy()[...] = ncg.run({"a": ha.numpy()}, timeout=60)["r"]
            r.copy_(hr, non_blocking=True)
            g2.replay()
            hy.copy_(y, non_blocking=True)
            cur.synchronize()
            return hy.numpy().copy()

        step()
        with window("host_orchestrated"):
            c0 = _cpu_by({"npu agent": npu.proc.pid})
            st, o2 = time_frames(step, frames, warm=0)
            c1 = _cpu_by({"npu agent": npu.proc.pid})
        res["host_orchestrated"] = {**st, **_cpu_row(c0, c1, frames), "out": o2}
    return res


# ---------------------------------------------------------------- the run
SECTIONS = frozenset({"gemm", "gemm_device", "small", "data", "handoff", "cpu_gpu_cpu", "cross_engine"})
"""The matrix's sections (``--only`` picks some: a shorter run where device time is short)."""


def run(
    frames: int,
    n_gemm: int,
    n_small: int,
    n_data: int,
    quick: bool = False,
    agent_spin: float = 50e-6,
    host_spin: float = 500e-6,
    only: frozenset[str] = SECTIONS,
) -> dict[str, Any]:
    """The matrix: the sections in ``only`` (all of :data:`SECTIONS` by default), anchors and
    hostless rows in one run, and the goals of those sections."""
    if not only or not only <= SECTIONS:
        raise ValueError(f"sections are some of {sorted(SECTIONS)}, got {sorted(only)}")
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    direct = (("direct", "shared"),)
    modes = (
        direct if quick else (("host", "copy"), ("host", "shared"), ("direct", "copy"), ("direct", "shared"))
    )
    res: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.node(),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "frames": frames,
        "agent_spin_s": agent_spin,
        "host_spin_s": host_spin,
    }
    fg = max(10, frames // 10)  # the 4096 GEMM chain: ~10 ms a frame
    print("anchors ...", flush=True)
    shp = (n_gemm, n_gemm)
    if "gemm" in only:
        res["gemm"] = {
            "n": n_gemm,
            "torch_eager": torch_anchor(GEMM, shp, n_gemm, fg, graph=False)[0],
            "cuda_graph": torch_anchor(GEMM, shp, n_gemm, fg, graph=True)[0],
            "cuda_graph_nocopy": torch_anchor(GEMM, shp, n_gemm, fg, graph=True, copy_out=False)[0],
            "cupy_pinned": cupy_anchor(
                [(ops.gemm, 1, ()), (ops.gemm, 1, ()), (ops.gemm, 1, ()), (ops.c_relu, 0, ())],
                n_gemm,
                fg,
                pinned=True,
            )[0],
        }
    if "gemm_device" in only:
        res["gemm_device"] = {"n": n_gemm, "cuda_graph": torch_device_anchor(n_gemm, fg)[0]}
    if "small" in only:
        res["small"] = {
            "n": n_small,
            "cuda_graph": torch_anchor(SMALL, (n_small, n_small), n_small, frames, True)[0],
        }
        res["small"]["torch_eager"] = torch_anchor(SMALL, (n_small, n_small), n_small, frames, False)[0]
    if "data" in only:
        res["data"] = {
            "n": n_data,
            "cupy_pinned": cupy_anchor(DATA_CUPY, n_data, frames, pinned=True)[0],
            "cupy_pageable": cupy_anchor(DATA_CUPY, n_data, frames, pinned=False)[0],
        }
    if "handoff" in only:
        res["flag_pingpong"] = flag_pingpong()
    name = f"hlgs-bench-{os.getpid()}"
    dom = hl.Domain.create(name, heap="1G", device_heaps={"cuda:0": 1 << 30}, spin=host_spin)
    try:
        gpu = agents.spawn(dom, "cuda", device=0, timeout=120, spin=agent_spin)
        npu = agents.spawn(dom, "npu", spin=agent_spin)
        cpu = agents.spawn(dom, "cpu", spin=agent_spin)
        try:
            print("hostless ...", flush=True)
            if "gemm" in only:
                res["gemm"]["hostless"] = _chain_rows(dom, gpu, GEMM, n_gemm, "torch", fg, modes)
            if "gemm_device" in only:
                gd = Graph(dom).input("seed", (1,), "f4")
                for i, w in enumerate(chain_weights(GEMM, n_gemm)):
                    gd.constant(f"W{i}", w)
                gd.stage(
                    "camera",
                    gpu,
                    ops.frame_from_seed,
                    ["seed"],
                    ("f", shp, "f4"),
                    scalars=[n_gemm],
                    arrays="torch",
                )
                prev = "f"
                for k in range(3):
                    gd.stage(f"gemm{k}", gpu, ops.gemm, [prev, f"W{k}"], (f"g{k}", shp, "f4"), arrays="torch")
                    prev = f"g{k}"
                gd.stage("relu", gpu, ops.relu, [prev], ("r", shp, "f4"), arrays="torch")
                gd.stage("sums", gpu, ops.row_sums, ["r"], ("y", (n_gemm,), "f4"), arrays="torch")
                res["gemm_device"]["hostless"] = hostless_rows(
                    gd, {"seed": np.full(1, 0.25, np.float32)}, "y", fg, direct
                )
            if "small" in only:
                res["small"]["hostless"] = _chain_rows(dom, gpu, SMALL, n_small, "torch", frames, modes)
            if "data" in only:
                res["data"]["hostless"] = _chain_rows(dom, gpu, DATA_CUPY, n_data, "cupy", frames, direct)
            if "handoff" in only:
                # hand-offs: the slope between a chain of 2 and of 34 tiny stages (one segment)
                ho: dict[str, Any] = {}
                x16 = np.arange(16, dtype=np.float32)
                for k in (2, 34):
                    gk = Graph(dom).input("x0", (16,), "f4")
                    for j in range(k):
                        out = (f"x{j + 1}", (16,), "f4")
                        gk.stage(f"a{j}", gpu, ops.add1, [f"x{j}"], out, arrays="torch")
                    ho[f"chain{k}"] = hostless_rows(gk, {"x0": x16}, f"x{k}", frames, direct)["direct+shared"]
                    assert np.array_equal(ho[f"chain{k}"]["out"], x16 + k)
                ho["per_stage_us"] = (ho["chain34"]["p50_us"] - ho["chain2"]["p50_us"]) / 32
                # between two segments (PyTorch -> CuPy: two packets on the agent, a device-memory edge)
                g2 = Graph(dom).input("x0", (16,), "f4")
                g2.stage("t", gpu, ops.add1, ["x0"], ("x1", (16,), "f4"), arrays="torch")
                g2.stage("c", gpu, ops.c_scale, ["x1"], ("x2", (16,), "f4"), scalars=[1.0], arrays="cupy")
                ho["two_segments"] = hostless_rows(g2, {"x0": x16}, "x2", frames, direct)["direct+shared"]
                g1 = Graph(dom).input("x0", (16,), "f4")
                g1.stage("t", gpu, ops.add1, ["x0"], ("x1", (16,), "f4"), arrays="torch")
                ho["one_segment"] = hostless_rows(g1, {"x0": x16}, "x1", frames, direct)["direct+shared"]
                ho["between_segments_us"] = ho["two_segments"]["p50_us"] - ho["one_segment"]["p50_us"]
                res["handoff"] = ho
            if "cpu_gpu_cpu" in only:
                # cpu agent -> GPU stage -> cpu agent, against cpu -> cpu
                legs = (("cpu-gpu-cpu", "cgc"), ("cpu-cpu", "cc"))
                cg_: dict[str, Any] = {nm: chain16(dom, cpu, gpu, kinds, frames) for nm, kinds in legs}
                cg_["gpu_leg_us"] = cg_["cpu-gpu-cpu"]["p50_us"] - cg_["cpu-cpu"]["p50_us"]
                res["cpu_gpu_cpu"] = cg_
            if "cross_engine" in only:
                print("cross-engine ...", flush=True)
                res["cross_engine"] = cross_engine(dom, gpu, npu, 256, frames)
        finally:
            for a in (gpu, npu, cpu):
                a.stop()
    finally:
        dom.close()
        hl.Domain.unlink(name)
    res["goals"] = goals(res)
    return res


def _ratio(res: dict[str, Any], chain: str, anchor: str, mode: str = "direct+shared") -> tuple[float, str]:
    a, h = res[chain][anchor], res[chain]["hostless"][mode]
    return h["p50_us"] / a["p50_us"], (
        f"{h['p50_us']:.1f} us vs {a['p50_us']:.1f} us ({anchor} p10-p90 {a['p10_us']:.1f}-{a['p90_us']:.1f})"
    )


def goals(res: dict[str, Any]) -> list[dict[str, Any]]:
    out = []

    def goal(name: str, value: float, limit: float, detail: str, below: bool = True) -> None:
        out.append(
            {
                "goal": name,
                "value": value,
                "limit": limit,
                # a difference of two frame times below zero is inside their noise: not resolved
                "met": None if (below and value < 0) else (value <= limit if below else value >= limit),
                "detail": detail,
            }
        )

    for chain, anchor, limit, name in (
        (
            "gemm",
            "cuda_graph",
            1.1,
            "GEMM chain, host frames: direct+shared <= 1.1x whole-chain graph replay (pinned I/O)",
        ),
        ("gemm_device", "cuda_graph", 1.05, "device-resident GEMM chain <= 1.05x graph replay"),
        ("small", "cuda_graph", 1.2, "small 6-stage chain <= 1.2x graph replay (same host I/O)"),
        (
            "data",
            "cupy_pinned",
            1.0,
            "data-bound chain at least as fast as plain CuPy with pinned I/O (ratio <= 1)",
        ),
    ):
        if chain in res:
            r, d = _ratio(res, chain, anchor)
            goal(name, r, limit, d)
    if "handoff" in res:
        _handoff_goals(res, goal)
    if "cpu_gpu_cpu" in res:
        goal(
            "cpu agent -> GPU stage -> cpu agent <= 5 us",
            res["cpu_gpu_cpu"]["gpu_leg_us"],
            5.0,
            "p50 of cpu-gpu-cpu minus cpu-cpu",
        )
    if "cross_engine" in res:
        _cross_engine_goals(res["cross_engine"], goal)
    return out


def _handoff_goals(res: dict[str, Any], goal: Callable[..., None]) -> None:
    ho = res["handoff"]
    goal(
        "GPU-to-GPU hand-off inside a segment <= 1 us",
        ho["per_stage_us"],
        1.0,
        f"slope of 34 vs 2 stages; flag ping-pong anchor {res['flag_pingpong']['p50_us']:.2f} us",
    )
    goal(
        "GPU-to-GPU hand-off between two segments <= 1 us",
        ho["between_segments_us"],
        1.0,
        "PyTorch -> CuPy segment, a device-memory edge, two packets on the agent",
    )


def _cross_engine_goals(ce: dict[str, Any], goal: Callable[..., None]) -> None:
    lat = ce["host_orchestrated"]["p50_us"] / ce["hostless"]["p50_us"]
    cpu = ce["host_orchestrated"]["cpu_us_per_frame"] / max(ce["hostless"]["cpu_us_per_frame"], 1e-9)
    goal(
        "cross-engine chain: >= 2x lower latency than host-orchestrated",
        lat,
        2.0,
        f"{ce['hostless']['p50_us']:.1f} us vs {ce['host_orchestrated']['p50_us']:.1f} us",
        below=False,
    )
    goal(
        "cross-engine chain: >= 10x less host CPU per frame",
        cpu,
        10.0,
        f"{ce['hostless']['cpu_us_per_frame']:.1f} us vs "
        f"{ce['host_orchestrated']['cpu_us_per_frame']:.1f} us CPU/frame",
        below=False,
    )


def report(res: dict[str, Any]) -> str:
    lines = [f"# GPU stages from user functions ({res['gpu']}, torch {res['torch']}, {res['when']})", ""]
    lines.append(
        f"Agents poll {res['agent_spin_s'] * 1e6:.0f} us before they park; the host's waits poll "
        f"{res.get('host_spin_s', 0) * 1e6:.0f} us before they sleep (a CUDA synchronize spins)."
    )
    lines.append("p50 latency per frame, host frame in and out (us; p10-p90 in brackets).")
    lines.append("")
    for chain in ("gemm", "gemm_device", "small", "data"):
        if chain not in res:
            continue
        lines.append(f"## {chain} (n={res[chain]['n']})")
        for k, v in res[chain].items():
            if k == "hostless":
                for m, r in v.items():
                    lines.append(f"- hostless {m}: {r['p50_us']:.1f} [{r['p10_us']:.1f}-{r['p90_us']:.1f}]")
            elif isinstance(v, dict):
                lines.append(f"- {k}: {v['p50_us']:.1f} [{v['p10_us']:.1f}-{v['p90_us']:.1f}]")
        lines.append("")
    if "handoff" in res:
        ho = res["handoff"]
        lines += [
            "## hand-offs",
            f"- flag ping-pong in device memory (anchor): {res['flag_pingpong']['p50_us']:.3f} us",
            f"- per stage inside one segment (slope 2 -> 34 stages): {ho['per_stage_us']:.3f} us",
            f"- between two segments (PyTorch -> CuPy): {ho['between_segments_us']:.1f} us",
            "",
        ]
    if "cpu_gpu_cpu" in res:
        lines += [f"- cpu -> GPU -> cpu, the GPU leg: {res['cpu_gpu_cpu']['gpu_leg_us']:.1f} us", ""]
    if "cross_engine" in res:
        lines.append("## cross-engine (PyTorch GEMM -> npu relu -> PyTorch softmax, 256x256)")
    for k, v in res.get("cross_engine", {}).items():
        lines.append(
            f"- {k}: {v['p50_us']:.1f} us [{v['p10_us']:.1f}-{v['p90_us']:.1f}], "
            f"{v['cpu_us_per_frame']:.1f} us CPU per frame ("
            + ", ".join(f"{n} {u:.1f}" for n, u in v.get("cpu_us_per_frame_by", {}).items())
            + ")"
        )
    lines += ["", "## goals"]
    for g in res["goals"]:
        verdict = "UNRESOLVED (inside the noise)" if g["met"] is None else "MET" if g["met"] else "NOT MET"
        lines.append(f"- {verdict}: {g['goal']}: {g['value']:.3f} (limit {g['limit']}); {g['detail']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("-o", "--out", default="benchmarks/results")
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--n-gemm", type=int, default=4096)
    ap.add_argument("--n-small", type=int, default=64)
    ap.add_argument("--n-data", type=int, default=2048)
    ap.add_argument("--quick", action="store_true", help="direct+shared only")
    ap.add_argument("--tag", default="h200")
    ap.add_argument(
        "--agent-spin",
        type=float,
        default=50e-6,
        help="seconds an idle agent polls before it parks (default 50 us)",
    )
    ap.add_argument(
        "--host-spin",
        type=float,
        default=500e-6,
        help="seconds the host's waits poll before they sleep (default 500 us: as a CUDA synchronize spins)",
    )
    ap.add_argument(
        "--only",
        default=",".join(sorted(SECTIONS)),
        help=f"comma-separated sections to run (default all: {','.join(sorted(SECTIONS))})",
    )
    a = ap.parse_args(argv)
    only = frozenset(x.strip() for x in a.only.split(",") if x.strip())
    if not only or not only <= SECTIONS:
        ap.error(f"--only takes some of {','.join(sorted(SECTIONS))}, got {a.only!r}")
    res = run(a.frames, a.n_gemm, a.n_small, a.n_data, a.quick, a.agent_spin, a.host_spin, only)
    for c in ("gemm", "gemm_device", "small", "data"):
        for r in res.get(c, {}).get("hostless", {}).values():
            r.pop("out", None)
    for key in ("cross_engine", "handoff", "cpu_gpu_cpu"):
        for r in res.get(key, {}).values():
            if isinstance(r, dict):
                r.pop("out", None)
    path = save(res, a.out, f"gpu-stages-{a.tag}", report)
    print(report(res))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
