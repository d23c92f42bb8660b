"""Hot path of the GPU command processor: the small chain direct+shared p50 and the copy-chain slope.

``python benchmarks/gpucp_hotpath.py TAG [FRAMES]`` prints one ``HOT {json}`` line: the 6-stage
64x64 chain's p50 in direct+shared and host+shared (twice), the per-stage slope between a
2-stage and a 34-stage chain of 64-byte copies, and the device-timer split of a hand-off.  To
compare two builds of ``agents/gpucp.cu``, run it once per installed build in the same session
(benchmarks/results/gpucp-hotpath-h200-2026-12-01.txt holds such runs).
"""
import json
import os
import sys
import time

import hostless as hl
from hostless import agents
from hostless_tools.bench import gpu as gb  # the helpers the matrix uses
from hostless_tools.bench import gpucp as gbm

tag = sys.argv[1]
frames = int(sys.argv[2]) if len(sys.argv) > 2 else 300
name = f"hl-hot-{os.getpid()}"
dom = hl.Domain.create(name, fences=4096, heap=256 << 20, device_heaps={"cuda:0": 128 << 20})
dom.spin = 5e-3
res = {"tag": tag}
try:
    gcp = agents.spawn(dom, "gpucp", device=0, sms=8)
    try:
        for rep in range(2):
            modes = (("direct", "shared"), ("host", "shared"))
            m = gb.hostless_modes(dom, gb.SMALL, 64, frames, gcp, modes=modes)
            res[f"small{rep}"] = {k: round(v["p50_us"], 2) for k, v in m.items()}
        h = gbm.handoff(dom, gcp, frames)
        res["per_stage_us"] = round(h["per_stage_us"], 3)
        res["device_handoff_us"] = round(h["device_handoff_us"], 3)
        res["chain34_p50_us"] = round(h["chain34"]["p50_us"], 2)
        res["split_ns"] = {k: round(v) for k, v in h["chain34"]["device_split_ns"].items()}
        time.sleep(0.05)
        st = gbm.gpucp_mod.stats(gcp)
        res["failed"] = st["failed"]
    finally:
        gcp.stop()
finally:
    dom.close()
    hl.Domain.unlink(name)
print("HOT", json.dumps(res), flush=True)
