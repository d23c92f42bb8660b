"""The pipeline benchmark's peers: Ray Compiled Graphs and classic actors on the same
pipelines, run by ``benchmarks/peers/ray_pipelines.py`` in a child interpreter (Ray is an
optional extra), and the cleanup of what Ray's dead processes leave in /dev/shm."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .harness import Progress, run_json, summarize

__all__ = ["PEERS_ENV", "RAY_SCRIPT", "find_peers", "ray_available", "ray_peers"]

PEERS_ENV = "HOSTLESS_BENCH_PEERS"
"""Environment variable naming the directory of the peer scripts."""

RAY_SCRIPT = "ray_pipelines.py"


def find_peers(peers_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The directory of the peer scripts (``ray_pipelines.py``): ``peers_dir``, else
    ``$HOSTLESS_BENCH_PEERS``, else ``benchmarks/peers`` under the current directory (the
    repository root, where the results go too); None when there is none."""
    for d in (peers_dir,) if peers_dir is not None else (os.environ.get(PEERS_ENV), "benchmarks/peers"):
        if d and (Path(d) / RAY_SCRIPT).is_file():
            return Path(d)
    return None


def ray_available() -> bool:
    """Whether ``ray`` is importable (the optional ``bench`` extra)."""
    return importlib.util.find_spec("ray") is not None


_SEM_NAME = re.compile(r"^sem\.(?:hdr|obj)(\d+)-")


def _shm_semaphores() -> set[str]:
    """Names of the POSIX semaphores in /dev/shm that Ray's channels make (sem.hdrPID-*, sem.objPID-*)."""
    try:
        return {n for n in os.listdir("/dev/shm") if _SEM_NAME.match(n)}
    except OSError:
        return set()


def _remove_dead_semaphores(before: set[str]) -> int:
    """Remove the Ray channel semaphores that appeared since ``before`` and whose creating
    process is gone (the peer script ends with os._exit when a graph does not tear down, so
    Ray's own cleanup does not run); returns how many went."""
    n = 0
    for name in sorted(_shm_semaphores() - before):
        m = _SEM_NAME.match(name)
        if m is None or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        try:
            os.unlink(os.path.join("/dev/shm", name))
            n += 1
        except OSError:
            pass
    return n


def ray_peers(cfg: Any, peers: Path | None, say: Progress) -> dict[str, Any]:
    """Ray Compiled Graphs and classic actors on the identical pipelines (a child interpreter);
    ``cfg``: the pipeline benchmark's config (its sizes and frame counts)."""
    if not cfg.ray:
        return {"status": "not run (disabled)", "version": None}
    if not ray_available():
        return {"status": "not installed", "version": None}
    if peers is None:
        why = f"peer scripts not found (run from the repository root, or set {PEERS_ENV} to benchmarks/peers)"
        return {"status": f"failed: {why}", "version": None}
    spec = {
        "identity_floats": cfg.identity_floats,
        "small_shape": list(cfg.small_shape),
        "large_shape": list(cfg.large_shape),
        "hidden": cfg.hidden,
        "frames": cfg.frames,
        "warmup": cfg.warmup,
        "large_frames": cfg.large_frames,
        "stream_frames": cfg.stream_frames,
        "inflight": list(cfg.inflight),
    }
    before = _shm_semaphores()
    try:
        data = run_json([sys.executable, str(peers / RAY_SCRIPT), json.dumps(spec)], timeout=900)
    except Exception as e:  # keep the rest of the run
        return {"status": f"failed: {type(e).__name__}: {str(e)[-500:]}", "version": None}
    finally:
        removed = _remove_dead_semaphores(before)
        if removed:
            say(f"  ray: removed {removed} semaphore file(s) its dead processes left in /dev/shm")
    out: dict[str, Any] = {"status": "measured", "version": data["version"]}
    for kind in ("cg", "actors"):
        out[kind] = {}
        for pl, entry in data.get(kind, {}).items():
            if "error" in entry:
                out[kind][pl] = {"error": entry["error"]}
                continue
            a = np.asarray(entry["samples_ns"], dtype=np.int64)
            st: dict[str, Any] = summarize(a)
            st["p10"] = float(np.percentile(a, 10))
            if "fps" in entry:
                st["fps"] = entry["fps"]
            out[kind][pl] = st
    return out
