"""Smoke tests of ``hostless bench pipeline`` and ``hostless trace`` (the CLI).

The benchmark runs with a tiny configuration (a few frames of each workload)
so that its code paths, goal evaluation and reports stay working; the figures
themselves are not checked here.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pytest

import hostless as hl
from hostless import agents, cli
from hostless.bench import pipeline
from hostless.kernels import kernel_id


def test_pipeline_bench_tiny_run(tmp_path: Path) -> None:
    cfg = pipeline.PipelineBenchConfig(
        frames=4,
        warmup=1,
        rounds=2,
        chain_stages=(2, 4),
        chain_sizes=(4096, 65536),
        gemm_n=32,
        gemm_stages=2,
        vision_shape=(8, 32),
        vision_inflight=(2,),
        stream_frames=6,
        peer_frames=5,
        quick=True,
    )
    result = pipeline.run(cfg, progress=lambda _m: None)
    assert result["errors"] == {}, result["errors"]
    wl = result["workloads"]
    assert {"chain_4096_2", "chain_65536_4", "echo", "gemm", "vision", "vision_stream", "diamond"} <= set(wl)
    for key, w in wl.items():
        if "modes" in w:
            assert set(w["modes"]) == {"host+copy", "host+shared", "direct+copy", "direct+shared"}, key
            assert all(m["verified"] for m in w["modes"].values()), key
    assert set(wl["vision_stream"]["variants"]) == {
        "host+copy",
        "host+shared",
        "direct+copy inflight=2",
        "direct+shared inflight=2",
    }
    assert {"cpu", "npu"} == set(result["agent_floor"])
    assert "pipe_chain_4096_4" in result["peers"] and "queue_echo" in result["peers"]
    assert result["peers"]["ray"]["status"] in ("not installed", "measured") or result["peers"]["ray"][
        "status"
    ].startswith("failed")
    assert len(result["goals"]) == 6 and all(g["value"] is not None for g in result["goals"])
    paths = pipeline.write_results(result, tmp_path)
    js = json.loads(paths[0].read_text())
    assert js["benchmark"] == "pipeline"
    md = paths[1].read_text()
    assert "## Goals" in md and "direct+shared" in md
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"hostless-bench-pipeline-{os.getpid()}-")]


def test_cli_trace_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = f"hltest-trace-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(name, heap="16M", trace="1M", label="host")
    a = None
    try:
        a = agents.spawn(d, "cpu", label="traced")
        x, y = d.buffer((16,), np.float32), d.buffer((16,), np.float32)
        ka = hl.Kernargs(buffers=[x.handle, y.handle]).to_buffer(d)
        f = d.fence(owner=a.id)
        idx = a.queue.push(hl.Packet(kernel=kernel_id("relu"), args=ka.handle, signal=f.handle))
        assert f.wait(10) is hl.Status.SUCCESS
        out = tmp_path / "out.json"
        assert cli.main(["trace", name, "-o", str(out)]) == 0
        assert "wrote" in capsys.readouterr().out
        tev = json.loads(out.read_text())["traceEvents"]
        pid = f"{a.queue.handle:#x}:{idx}"
        assert {e["ph"] for e in tev if e.get("id") == pid} == {"b", "e", "s", "f"}
        assert any(e.get("ph") == "M" and "traced" in e.get("args", {}).get("name", "") for e in tev)
        for o in (f, ka, y, x):
            o.release()
    finally:
        if a is not None:
            a.stop()
        d.close()
        hl.Domain.unlink(name)
    # a domain without a trace ring, and no domain at all
    plain = f"hltest-trace-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    d = hl.Domain.create(plain)
    try:
        assert cli.main(["trace", plain, "-o", str(tmp_path / "x.json")]) == 1
    finally:
        d.close()
        hl.Domain.unlink(plain)
    assert cli.main(["trace", plain, "-o", str(tmp_path / "x.json")]) == 2
