"""GPU placement benchmark: ``python -m hostless_tools.bench.gpu -o DIR`` (on a machine with a GPU).

Measured in one run, one frame at a time (latency: host input in, host output
out, as a user's script does it):

* **anchors**: the same chain as a plain CuPy script in one process (upload,
  the ops, download), and the same ops captured once as a CUDA graph and
  replayed per frame (upload, replay, download);
* **hostless**: the chain as a :class:`~hostless.graph.Graph` of cuda stages
  on one cuda agent, in the four modes (dispatch host/direct x data
  copy/shared); in shared mode the graph places every tensor that only GPU
  stages touch in the GPU's memory (``CompiledGraph.plan()``, recorded);
  and, for the latency-bound chains, the same on the GPU command processor
  (``gpucp``: a resident kernel takes the packets, :mod:`hostless.agents.gpucp`).

Chains: ``small`` (6 stages at 64x64 f32: normalize, GEMM, relu, GEMM, relu,
softmax), ``gemm`` (three GEMMs and a relu at N x N f32, N = 4096 by
default), ``mixed`` (cuda GEMM -> npu relu -> cuda softmax at 256 x 256).

Goals (issue 13; one mode per goal, chosen before the run and named in the
goal, never the best of several modes against one anchor, issue 28):
``gpucp direct+shared`` faster than plain CuPy on the small chain;
``direct+shared`` within 1.2x of plain CuPy on the GEMM chain;
``direct+shared`` >= 2x ``host+copy`` on the GEMM chain.  Each is reported met
or not with the anchor's own p10-p90 spread beside it (a margin inside that
spread is no result) and the CUDA graph replay of the same run.  The plain
CuPy anchor uploads and downloads through pageable host memory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

import numpy as np

import hostless as hl
from hostless import agents
from hostless.graph import Graph
from hostless_tools.bench.harness import summarize

# a chain: list of (kernel, number of weight inputs, scalars)
Chain = list[tuple[str, int, tuple[float, ...]]]

SMALL: Chain = [
    ("normalize", 0, (0.5, 2.0)),
    ("gemm", 1, ()),
    ("relu", 0, ()),
    ("gemm", 1, ()),
    ("relu", 0, ()),
    ("softmax", 0, ()),
]
GEMM: Chain = [("gemm", 1, ()), ("gemm", 1, ()), ("gemm", 1, ()), ("relu", 0, ())]
MIXED: Chain = [("gemm", 1, ()), ("relu", 0, ()), ("softmax", 0, ())]


def _stats(ts: list[float]) -> dict[str, float]:
    st = summarize(np.array(ts) * 1e9)
    return {
        "p50_us": st["p50"] / 1e3,
        "p10_us": float(np.percentile(ts, 10) * 1e6),
        "p90_us": st["p90"] / 1e3,
        "min_us": st["min"] / 1e3,
        "n": len(ts),
    }


def _weights(chain: Chain, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [
        (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
        for kern, nw, _ in chain
        for _ in range(nw)
    ]


def _ops(chain: Chain, x: Any, ws: list[Any], relu: Any, softmax: Any) -> Any:
    """What a user writes: the chain's ops on arrays of CuPy or PyTorch (``relu``, ``softmax``:
    the library's functions; the rest is operators)."""
    wi = 0
    for kern, nw, sc in chain:
        if kern == "normalize":
            x = (x - sc[0]) / sc[1]
        elif kern == "gemm":
            x = x @ ws[wi]
        elif kern == "relu":
            x = relu(x)
        elif kern == "softmax":
            x = softmax(x)
        elif kern == "scale":
            x = x * sc[0]
        else:
            raise ValueError(kern)
        wi += nw
    return x


def _cupy_ops(cp: Any, chain: Chain, x: Any, ws: list[Any]) -> Any:
    def softmax(x: Any) -> Any:
        e = cp.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return _ops(chain, x, ws, lambda x: cp.maximum(x, 0), softmax)


def plain_cupy(chain: Chain, n: int, frames: int, seed: int = 0) -> tuple[dict[str, float], np.ndarray]:
    """Latency of the chain as a plain CuPy script: upload, ops, download, per frame."""
    import cupy as cp

    rng = np.random.default_rng(seed)
    ws = [cp.asarray(w) for w in _weights(chain, n, rng)]
    frame = rng.standard_normal((n, n)).astype(np.float32)
    out = cp.asnumpy(_cupy_ops(cp, chain, cp.asarray(frame), ws))  # warm-up: compiles kernels
    ts = []
    for _ in range(frames):
        t0 = time.perf_counter()
        out = cp.asnumpy(_cupy_ops(cp, chain, cp.asarray(frame), ws))
        ts.append(time.perf_counter() - t0)
    return _stats(ts), out


def _torch_ops(torch: Any, chain: Chain, x: Any, ws: list[Any]) -> Any:
    return _ops(chain, x, ws, torch.relu, lambda x: torch.softmax(x, dim=-1))


def cuda_graph(chain: Chain, n: int, frames: int, seed: int = 0) -> tuple[dict[str, float], np.ndarray]:
    """The same ops captured once as a CUDA graph, replayed per frame (upload, replay,
    download).  Captured with PyTorch: CuPy refuses cuBLAS calls inside a stream capture."""
    import torch

    rng = np.random.default_rng(seed)
    dev = torch.device("cuda:0")
    torch.backends.cuda.matmul.allow_tf32 = False  # the same FP32 math as CuPy's GEMM
    ws = [torch.from_numpy(w).to(dev) for w in _weights(chain, n, rng)]
    frame = rng.standard_normal((n, n)).astype(np.float32)
    hin = torch.from_numpy(frame).pin_memory()
    hout = torch.empty((n, n), dtype=torch.float32).pin_memory()
    x = torch.empty((n, n), dtype=torch.float32, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            _torch_ops(torch, chain, x, ws)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = _torch_ops(torch, chain, x, ws)
    ts = []
    for _ in range(frames + 1):
        t0 = time.perf_counter()
        hin.copy_(torch.from_numpy(frame))
        x.copy_(hin, non_blocking=True)
        g.replay()
        hout.copy_(y, non_blocking=True)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return _stats(ts[1:]), hout.numpy().copy()


def hostless_modes(
    dom: hl.Domain,
    chain: Chain,
    n: int,
    frames: int,
    gpu: Any,
    npu: Any = None,
    seed: int = 0,
    modes: tuple[tuple[str, str], ...] = (("host", "copy"), ("host", "shared"), ("direct", "copy"),
                                          ("direct", "shared")),
) -> dict[str, Any]:
    """The chain as a hostless Graph in the four modes (or ``modes``: (dispatch, data) pairs);
    npu: run relu stages there (mixed)."""
    rng = np.random.default_rng(seed)
    ws = _weights(chain, n, rng)
    frame = rng.standard_normal((n, n)).astype(np.float32)
    g = Graph(dom).input("x0", (n, n), "f4")
    for i, w in enumerate(ws):
        g.constant(f"W{i}", w)
    prev, wi = "x0", 0
    for k, (kern, nw, sc) in enumerate(chain):
        ag = npu if (npu is not None and kern == "relu") else gpu
        ins = [prev] + [f"W{wi + j}" for j in range(nw)]
        wi += nw
        g.stage(f"s{k}_{kern}", ag, kern, ins, (f"x{k + 1}", (n, n), "f4"), scalars=list(sc))
        prev = f"x{k + 1}"
    res: dict[str, Any] = {}
    for dispatch, data in modes:
        with g.compile(dispatch=dispatch, data=data) as cg:
            o = cg.run({"x0": frame}, timeout=300)[prev]  # warm-up (kernel compilation)
            ts = []
            for _ in range(frames):
                t0 = time.perf_counter()
                o = cg.run({"x0": frame}, timeout=300)[prev]
                ts.append(time.perf_counter() - t0)
            res[f"{dispatch}+{data}"] = {**_stats(ts), "plan": cg.plan(), "out": o}
    return res


def _check(out: np.ndarray, ref: np.ndarray) -> bool:
    return bool(np.allclose(out, ref, rtol=2e-3, atol=2e-3))


def run(
    n_small: int,
    n_gemm: int,
    frames_small: int,
    frames_gemm: int,
    only: tuple[str, ...] = (),
    agent_spin: float = 5e-3,
) -> dict[str, Any]:
    import cupy as cp

    big = n_gemm * n_gemm * 4
    dom = hl.Domain.create(
        f"hl-bench-gpu-{os.getpid()}",
        fences=4096,
        heap=40 * big + (64 << 20),
        device_heaps={"cuda:0": 16 * big + (256 << 20)},
    )
    out: dict[str, Any] = {
        "machine": platform.node(),
        "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "cupy": cp.__version__,
        "chains": {},
    }
    gpu = agents.spawn(dom, "cuda", device=0, spin=agent_spin)
    npu = agents.spawn(dom, "npu", spin=agent_spin)
    out["agent_spin_s"] = agent_spin
    dom.spin = agent_spin  # the host's waits for stage outputs poll as long before they park
    try:
        for name, chain, n, frames, use_npu in (
            ("small", SMALL, n_small, frames_small, False),
            ("gemm", GEMM, n_gemm, frames_gemm, False),
            ("mixed", MIXED, 256, frames_small, True),
        ):
            if only and name not in only:
                continue
            plain, ref = plain_cupy(chain, n, frames)
            graph, gout = cuda_graph(chain, n, frames)
            modes = hostless_modes(dom, chain, n, frames, gpu, npu if use_npu else None)
            if name != "gemm":  # the command processor is one block: latency-bound chains only
                # spawned only for its own runs: a resident kernel makes every other process's
                # CUDA work wait for a time slice (contexts of processes are time-sliced)
                gcp = agents.spawn(dom, "gpucp", device=0)
                try:
                    cpm = hostless_modes(dom, chain, n, frames, gcp, npu if use_npu else None)
                finally:
                    gcp.stop()
                modes.update({f"gpucp {m}": r for m, r in cpm.items()})
            entry: dict[str, Any] = {
                "n": n,
                "stages": [k for k, _, _ in chain],
                "plain_cupy": plain,
                "cuda_graph": {**graph, "matches_plain": _check(gout, ref)},
            }
            for r in modes.values():
                o = r.pop("out")
                r["matches_plain"] = _check(o, ref)
                r["vs_plain_cupy"] = plain["p50_us"] / r["p50_us"]
            base = modes["host+copy"]["p50_us"]
            for r in modes.values():
                r["speedup_vs_host_copy"] = base / r["p50_us"]
            entry["hostless"] = modes
            out["chains"][name] = entry
            print(
                f"{name}: plain {plain['p50_us']:.1f} us, graph {graph['p50_us']:.1f} us, "
                + ", ".join(f"{m} {r['p50_us']:.1f} us" for m, r in modes.items()),
                flush=True,
            )
    finally:
        for a in (gpu, npu):
            a.stop()
        dom.close()
    out["goals"] = goals(out)
    return out


GOAL_MODES: dict[str, str] = {"small": "gpucp direct+shared", "gemm": "direct+shared"}
"""The one hostless mode each chain's goals judge (fixed before the run)."""


def goals(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals of issue 13, each judging the one mode :data:`GOAL_MODES` names.

    ``met`` is None when that mode was not measured; the anchor's p10-p90 spread
    and the CUDA graph replay of the same run are given with every figure.
    """
    rows: list[dict[str, Any]] = []
    ch = res["chains"]

    def anchors(name: str) -> str:
        p, g = ch[name]["plain_cupy"], ch[name]["cuda_graph"]
        return (
            f"plain CuPy {p['p50_us']:.1f} us (p10-p90 {p['p10_us']:.1f}-{p['p90_us']:.1f}); "
            f"CUDA graph replay {g['p50_us']:.1f} us"
        )

    def mode_p50(name: str, mode: str) -> float | None:
        r = ch[name]["hostless"].get(mode)
        return None if r is None else float(r["p50_us"])

    if "small" in ch:
        mode = GOAL_MODES["small"]
        v = mode_p50("small", mode)
        p = ch["small"]["plain_cupy"]["p50_us"]
        rows.append(
            {
                "goal": f"small chain: {mode} faster than plain CuPy",
                "measured": "not measured"
                if v is None
                else f"{mode} {v:.1f} us ({p / v:.2f}x); {anchors('small')}",
                "met": None if v is None else v < p,
            }
        )
    if "gemm" in ch:
        mode = GOAL_MODES["gemm"]
        v = mode_p50("gemm", mode)
        p = ch["gemm"]["plain_cupy"]["p50_us"]
        rows.append(
            {
                "goal": f"GEMM chain: {mode} within 1.2x of plain CuPy",
                "measured": "not measured"
                if v is None
                else f"{mode} {v:.0f} us ({v / p:.2f}x plain CuPy); {anchors('gemm')}",
                "met": None if v is None else v <= 1.2 * p,
            }
        )
        hc = mode_p50("gemm", "host+copy")
        rows.append(
            {
                "goal": f"GEMM chain: {mode} (device-resident) >= 2x host+copy",
                "measured": "not measured"
                if v is None or hc is None
                else f"{mode} {v:.0f} us vs host+copy {hc:.0f} us ({hc / v:.2f}x)",
                "met": None if v is None or hc is None else hc / v >= 2.0,
            }
        )
    return rows


def report(res: dict[str, Any]) -> str:
    lines = [
        f"# GPU placement benchmark ({res['gpu']}, {res['machine']}, {res['date']})",
        "",
        "Latency per frame, one frame at a time (host input in, host output out); p50 [p10-p90] us; "
        f"agents poll their queue {res.get('agent_spin_s', 0) * 1e3:g} ms before they park.",
        "",
    ]
    for name, e in res["chains"].items():
        lines += [
            f"## {name}: {' -> '.join(e['stages'])} at {e['n']}x{e['n']} f32",
            "",
            "| path | p50 us | p10-p90 us | vs plain CuPy | vs host+copy | same result |",
            "|---|---|---|---|---|---|",
        ]
        p = e["plain_cupy"]
        lines.append(
            f"| plain CuPy | {p['p50_us']:.1f} | {p['p10_us']:.1f}-{p['p90_us']:.1f} | 1.00x | | ref |"
        )
        c = e["cuda_graph"]
        lines.append(
            f"| CUDA graph replay | {c['p50_us']:.1f} | {c['p10_us']:.1f}-{c['p90_us']:.1f} | "
            f"{p['p50_us'] / c['p50_us']:.2f}x | | {c['matches_plain']} |"
        )
        for m, r in e["hostless"].items():
            lines.append(
                f"| hostless {m} | {r['p50_us']:.1f} | {r['p10_us']:.1f}-{r['p90_us']:.1f} | "
                f"{r['vs_plain_cupy']:.2f}x | {r['speedup_vs_host_copy']:.2f}x | {r['matches_plain']} |"
            )
        lines += [
            "",
            "Placement (direct+shared):",
            "",
            "```",
            e["hostless"]["direct+shared"]["plan"],
            "```",
            "",
        ]
    return "\n".join(lines + goals_lines(res["goals"])) + "\n"


def goals_lines(goals: list[dict[str, Any]]) -> list[str]:
    """The report's goals table (rows of goal, measured, met)."""
    lines = ["## Goals", "", "| goal | measured | met |", "|---|---|---|"]
    for g in goals:
        met = "not measured" if g["met"] is None else ("yes" if g["met"] else "no")
        lines.append(f"| {g['goal']} | {g['measured']} | {met} |")
    return lines


def save(res: dict[str, Any], out: str, prefix: str, report_fn: Any) -> str:
    """Write ``res`` as ``OUT/PREFIX-<date>.json`` and its report as ``.md`` beside it, print the
    report, and return the path's stem."""
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, f"{prefix}-{time.strftime('%Y-%m-%d-%H%M')}")
    with open(stem + ".json", "w") as f:
        json.dump(res, f, indent=1, default=str)
    text = report_fn(res)
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {stem}.json and .md")
    return stem


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", default="benchmarks/results")
    ap.add_argument("--n-small", type=int, default=64)
    ap.add_argument("--n-gemm", type=int, default=4096)
    ap.add_argument("--frames-small", type=int, default=300)
    ap.add_argument("--frames-gemm", type=int, default=20)
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--only", default="", help="comma-separated chains (small,gemm,mixed); default all")
    ap.add_argument(
        "--agent-spin",
        type=float,
        default=5e-3,
        help="seconds an idle agent polls its queue before it parks (default 5 ms: polling agents)",
    )
    a = ap.parse_args(argv)
    from hostless.cuda import available

    why = available()
    if why:
        print(f"no GPU benchmark: {why}", file=sys.stderr)
        return 2
    only = tuple(x for x in a.only.split(",") if x)
    res = run(a.n_small, a.n_gemm, a.frames_small, a.frames_gemm, only, a.agent_spin)
    save(res, a.out, f"gpu-placement-{a.tag}", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
