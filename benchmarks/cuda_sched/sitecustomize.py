"""For A/B runs only: ``CE_SCHED=spin|yield|blocking|auto PYTHONPATH=benchmarks/cuda_sched`` sets
the scheduling flag of the primary CUDA context in hostless's cuda agent processes (those
started as ``hostless.agents.worker ... cuda``) before CUDA starts there, so that a benchmark can
tell whether the agent's CPU is CUDA waiting (spinning) or its own loop, e.g.

    CE_SCHED=blocking PYTHONPATH=benchmarks/cuda_sched python benchmarks/cross_engine.py blocking 0.0005

Python imports ``sitecustomize`` at start-up from ``PYTHONPATH``, which the agents inherit.
Every other process is left alone."""

import os
import sys

_mode = os.environ.get("CE_SCHED")
_argv = getattr(sys, "orig_argv", [])
if _mode and "hostless.agents.worker" in _argv and "cuda" in _argv:
    from cuda.bindings import driver as _d

    _flags = {
        "spin": _d.CUctx_flags.CU_CTX_SCHED_SPIN,
        "yield": _d.CUctx_flags.CU_CTX_SCHED_YIELD,
        "blocking": _d.CUctx_flags.CU_CTX_SCHED_BLOCKING_SYNC,
        "auto": _d.CUctx_flags.CU_CTX_SCHED_AUTO,
    }[_mode]
    _d.cuInit(0)
    _dev = int(_argv[_argv.index("--device") + 1]) if "--device" in _argv else 0
    _err, _cudev = _d.cuDeviceGet(_dev)
    print(f"CE_SCHED {_mode}: {_d.cuDevicePrimaryCtxSetFlags(_cudev, _flags)}", file=sys.stderr)
