"""The GPU leg of a small stage by each way of starting its CUDA graph when the host asks
(``device_launch.cu``: host launch, stream waits with graphs queued ahead, device graph launch
by a scheduler graph, tail and fire-and-forget, and a resident block doing the work itself),
and whether a graph PyTorch captured (``CUDAGraph(keep_graph=True)``) can be instantiated for
device launch, which a command processor launching the user's stages would need.

    python benchmarks/device_launch.py [-o FILE] [--frames N]   (nvcc, a GPU; PyTorch optional)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

MODES = ("host_launch", "stream_wait", "device_tail", "device_ff", "resident")
here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
ap.add_argument("-o", "--out", default=None)
ap.add_argument("--frames", type=int, default=2000)
ap.add_argument("--arch", default="sm_90")
a = ap.parse_args()

res: dict = {
    "what": __doc__.split("\n")[0],
    "how": "python benchmarks/device_launch.py",
    "when": time.strftime("%Y-%m-%d %H:%M"),
}
with tempfile.TemporaryDirectory() as d:
    exe = os.path.join(d, "device_launch")
    cmd = [
        "nvcc",
        "-O2",
        f"-arch={a.arch}",
        "-rdc=true",
        os.path.join(here, "device_launch.cu"),
        "-lcudadevrt",
        "-lcuda",
        "-o",
        exe,
    ]
    b = subprocess.run(cmd, capture_output=True, text=True)
    if b.returncode:
        sys.exit(f"nvcc failed:\n{b.stderr}")
    runs = []
    for _ in range(3):
        r = subprocess.run([exe, str(a.frames)], capture_output=True, text=True, timeout=120)
        if r.returncode:
            res.setdefault("failed_runs", []).append({"rc": r.returncode, "out": r.stdout, "err": r.stderr})
            print(r.stdout, r.stderr, file=sys.stderr)
            continue
        runs.append(json.loads(r.stdout))
    res["runs"] = runs
    for k in MODES:
        p50s = sorted(x[k]["p50_us"] for x in runs)
        res[k] = {"p50_us_runs": p50s, "p50_us_median": p50s[len(p50s) // 2] if p50s else None}
    res["count_ok"] = all(abs(x["x0"] - x["requests"]) < 0.5 for x in runs)

try:
    import torch
    from cuda.bindings import runtime as rt

    res["gpu"] = torch.cuda.get_device_name(0)
    dev = torch.device("cuda:0")
    x = torch.randn(64, 64, device=dev)
    w = torch.randn(64, 64, device=dev)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.relu(x @ w)
    s.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        y = torch.relu(x @ w)
    raw = g.raw_cuda_graph()
    raw = raw if isinstance(raw, rt.cudaGraph_t) else rt.cudaGraph_t(init_value=int(raw))
    e, ex = rt.cudaGraphInstantiateWithFlags(
        raw, rt.cudaGraphInstantiateFlags.cudaGraphInstantiateFlagDeviceLaunch
    )
    res["torch_device_launch_instantiate"] = str(e)
    if e == rt.cudaError_t.cudaSuccess:
        e2 = rt.cudaGraphUpload(ex, s.cuda_stream)[0]
        e3 = rt.cudaGraphLaunch(ex, s.cuda_stream)[0]
        s.synchronize()
        res["torch_device_launch_host_run"] = [str(e2), str(e3)]
except Exception:
    res["torch_device_launch_error"] = traceback.format_exc(limit=3)

for k in MODES:
    runs_txt = ", ".join(f"{v:.2f}" for v in res[k]["p50_us_runs"])
    print(f"{k:12s} p50 {res[k]['p50_us_median']} us (runs {runs_txt})")
print(
    "count ok:",
    res["count_ok"],
    "| torch graph for device launch:",
    res.get("torch_device_launch_instantiate", res.get("torch_device_launch_error")),
)
if a.out:
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
