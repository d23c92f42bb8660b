"""The Ray peers of ``hostless bench pipeline``: the identical pipelines on Ray actors.

    python benchmarks/peers/ray_pipelines.py SPEC_JSON

Run by ``hostless bench pipeline`` in a child interpreter when ``ray`` is
importable (``pip install 'hostless[bench]'``).  Two actors play the two
engines ("cpu" and "npu"), each stage is an actor method applying the same
NumPy kernel as the hostless stage, and every pipeline runs two ways:

* ``cg``: a Ray Compiled Graph (``dag.experimental_compile()``), the host
  calls ``execute`` and ``ray.get`` per frame;
* ``actors``: classic Ray actors, each stage a ``.remote()`` call taking the
  previous call's ObjectRef, the host ``ray.get``s the last one.

Pipelines (the SPEC gives the sizes): ``identity`` (2 copy stages, cpu then
npu, on ``identity_floats`` float32), ``vision_small`` / ``vision_large``
(normalize on cpu -> fc1, relu, fc2 on npu -> softmax on cpu, frames
``small_shape`` / ``large_shape`` uint8, layers ``hidden`` wide) and
``diamond`` (normalize on cpu -> a GEMM on npu and a scale on cpu -> add on
cpu, frame ``small_shape``).  Each is timed frame by frame (``frames`` after
``warmup`` dropped; ``large_frames`` for vision_large), and vision_large is
also streamed with ``inflight`` frames in flight (``stream_frames``).

Prints one JSON line: ``{"version": ..., "cg": {pipeline: {"samples_ns": [...],
"fps": ...} or {"error": ...}}, "actors": {...}}``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from typing import Any

import numpy as np

MEAN, STD = 127.5, 64.0


def _engine_class(ray: Any) -> Any:
    @ray.remote(num_cpus=0)  # never wait for the CPUs of actors being killed
    class Engine:
        """One engine: the stage kernels, with the pipeline's weights."""

        def __init__(self, weights: dict[str, Any]) -> None:
            self.w = weights

        def copy(self, x: Any) -> Any:
            return np.array(x, copy=True)

        def normalize(self, f: Any) -> Any:
            return ((f.astype(np.float32) - MEAN) / STD).astype(np.float32)

        def gemm(self, x: Any, name: str) -> Any:
            return (x @ self.w[name]).astype(np.float32)

        def fc1(self, x: Any) -> Any:
            return self.gemm(x, "w1")

        def fc2(self, x: Any) -> Any:
            return self.gemm(x, "w2")

        def proj(self, x: Any) -> Any:
            return self.gemm(x, "w")

        def relu(self, x: Any) -> Any:
            return np.maximum(x, 0)

        def softmax(self, y: Any) -> Any:
            e = np.exp(y - y.max(axis=-1, keepdims=True))
            return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)

        def scale(self, x: Any) -> Any:
            return (x * np.float32(0.5)).astype(np.float32)

        def add(self, a: Any, b: Any) -> Any:
            return (a + b).astype(np.float32)

    return Engine


def _weights(feat: int, hidden: int, rng: np.random.Generator) -> dict[str, Any]:
    out = max(8, hidden // 4)
    return {
        "w1": (rng.standard_normal((feat, hidden)) / np.sqrt(feat)).astype(np.float32),
        "w2": (rng.standard_normal((hidden, out)) / np.sqrt(hidden)).astype(np.float32),
        "w": (rng.standard_normal((feat, feat)) / np.sqrt(feat)).astype(np.float32),
    }


def _graph(kind: str, cpu: Any, npu: Any, inp: Any) -> Any:
    """The pipeline as a Ray DAG (``.bind``) or as remote calls (``.remote``): ``kind`` picks."""

    def call(actor: Any, method: str, *args: Any) -> Any:
        m = getattr(actor, method)
        return m.bind(*args) if kind == "cg" else m.remote(*args)

    return call


def _build(pipeline: str, call: Any, cpu: Any, npu: Any, x: Any) -> Any:
    if pipeline == "identity":
        return call(npu, "copy", call(cpu, "copy", x))
    if pipeline.startswith("vision"):
        h = call(npu, "fc1", call(cpu, "normalize", x))
        return call(cpu, "softmax", call(npu, "fc2", call(npu, "relu", h)))
    if pipeline == "diamond":
        n = call(cpu, "normalize", x)
        return call(cpu, "add", call(npu, "proj", n), call(cpu, "scale", n))
    raise ValueError(pipeline)


def _time(run: Any, x: Any, frames: int, warmup: int) -> list[int]:
    for _ in range(warmup):
        run(x)
    out = []
    clock = time.perf_counter_ns
    for _ in range(frames):
        t0 = clock()
        run(x)
        out.append(clock() - t0)
    return out


def _stream(submit: Any, get: Any, x: Any, frames: int, inflight: int) -> float:
    """Frames per second with ``inflight`` frames in flight."""
    pending: deque[Any] = deque()
    t0 = time.perf_counter()
    for _ in range(frames):
        pending.append(submit(x))
        if len(pending) >= inflight:
            get(pending.popleft())
    while pending:
        get(pending.popleft())
    return frames / (time.perf_counter() - t0)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import ray
    from ray.dag import InputNode

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    rng = np.random.default_rng(2026)
    small, large = tuple(spec["small_shape"]), tuple(spec["large_shape"])
    inputs = {
        "identity": np.ones(int(spec["identity_floats"]), np.float32),
        "vision_small": rng.integers(0, 256, small, dtype=np.uint8),
        "vision_large": rng.integers(0, 256, large, dtype=np.uint8),
        "diamond": rng.integers(0, 256, small, dtype=np.uint8),
    }
    wanted = spec.get("pipelines") or list(inputs)
    engine = _engine_class(ray)
    res: dict[str, Any] = {"version": ray.__version__, "cg": {}, "actors": {}}
    for pipeline in wanted:
        shape = large if pipeline == "vision_large" else small
        w = _weights(shape[1], int(spec["hidden"]), rng)
        frames = int(spec["large_frames"] if pipeline == "vision_large" else spec["frames"])
        warm = max(2, int(spec["warmup"]) // (4 if pipeline == "vision_large" else 1))
        x = inputs[pipeline]
        for kind in ("actors", "cg"):
            cpu, npu = engine.remote(w), engine.remote(w)
            cdag = None
            try:
                if kind == "cg":
                    with InputNode() as inp:
                        dag = _build(pipeline, _graph("cg", cpu, npu, inp), cpu, npu, inp)
                    cdag = dag.experimental_compile()

                    def submit(v: Any, c: Any = cdag) -> Any:
                        return c.execute(v)

                else:
                    call = _graph("actors", cpu, npu, None)

                    def submit(v: Any, c: Any = call, pl: str = pipeline, a: Any = cpu, b: Any = npu) -> Any:
                        return _build(pl, c, a, b, v)

                def run(v: Any) -> Any:
                    return ray.get(submit(v), timeout=60)

                def get(ref: Any) -> Any:
                    return ray.get(ref, timeout=60)

                entry: dict[str, Any] = {"samples_ns": _time(run, x, frames, warm)}
                if pipeline == "vision_large":
                    entry["fps"] = {
                        str(k): _stream(submit, get, x, int(spec["stream_frames"]), k)
                        for k in [1, *spec["inflight"]]
                    }
                res[kind][pipeline] = entry
                med = sorted(entry["samples_ns"])[len(entry["samples_ns"]) // 2]
                print(f"  ray {kind} {pipeline}: p50 {med / 1e3:.1f} us", file=sys.stderr, flush=True)
            except Exception as e:  # one pipeline fails, the others stand
                res[kind][pipeline] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"  ray {kind} {pipeline}: {res[kind][pipeline]['error']}", file=sys.stderr, flush=True)
            finally:
                if cdag is not None:
                    _bounded(cdag.teardown, 20.0)
                for a in (cpu, npu):
                    ray.kill(a)
    return res


def _bounded(fn: Any, seconds: float) -> bool:
    """Run ``fn()`` in a daemon thread for at most ``seconds`` (a Compiled Graph's teardown can
    hang on a busy machine); True when it returned."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive()


def main(argv: list[str]) -> int:
    """``ray_pipelines.py SPEC_JSON``: measure, print the result as one JSON line."""
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(measure(json.loads(argv[0]))), flush=True)
    import ray

    _bounded(ray.shutdown, 30.0)
    sys.stderr.flush()
    os._exit(0)  # no atexit teardown of a graph that did not tear down (it would wait 30 s each)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
