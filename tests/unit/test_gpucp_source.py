"""The GPU command processor's source as NVRTC gets it, checked without a GPU.

gpucp.cu's program is four files concatenated (``gpucp.CU_PARTS``), and the CPU agents'
limits it shares (hostless_engine.h's ``HLE_AGENT_HOP_LIMIT``, ``_FAIL_DEPTH``,
``_FAIL_BUDGET``) have one home, the engine header: gpucp.py passes them as ``-D`` options
from the extension's constant table, since NVRTC cannot include that header.  Here the
source is run through the host's C preprocessor with the options NVRTC gets: the limits
arrive with the engine's values, and without them the source stops with its ``#error``.
(Compiling and running it needs a GPU: tests/gpu/test_gpu_cp.py.)
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hostless._abi import C
from hostless.agents import gpucp

CPP = shutil.which("cpp")
needs_cpp = pytest.mark.skipif(CPP is None, reason="no C preprocessor (cpp) on this machine")
LIMITS = {
    "HL_CP_HOP_LIMIT": int(C.AGENT_HOP_LIMIT),
    "HL_CP_FAIL_DEPTH": int(C.AGENT_FAIL_DEPTH),
    "HL_CP_FAIL_BUDGET": int(C.AGENT_FAIL_BUDGET),
}


def test_the_source_is_its_parts_in_order() -> None:
    here = Path(gpucp.__file__).parent
    parts = [(here / name).read_bytes() for name in gpucp.CU_PARTS]
    assert gpucp.CU_PARTS[0] == "gpucp.cu" and len(set(gpucp.CU_PARTS)) == len(gpucp.CU_PARTS)
    assert gpucp.source() == b"".join(parts)
    # the kernel's entry point is in the program once, after everything it calls
    src = gpucp.source().decode()
    assert src.count('extern "C" __global__') == 1
    assert src.index("static void front_end(") < src.index('extern "C" __global__')


def test_the_limits_are_the_engine_headers_not_the_sources() -> None:
    src = gpucp.source().decode()
    for name in LIMITS:
        defined = re.search(rf"^\s*#\s*define\s+{name}\b", src, re.M)
        assert not defined, f"{name} is defined in the CUDA source"
    assert gpucp.LIMITS == LIMITS
    opts = [o.decode() for o in gpucp.nvrtc_options("sm_90")]
    for name, value in LIMITS.items():
        assert f"-D{name}={value}" in opts
    assert "--gpu-architecture=sm_90" in opts


def _preprocess(opts: list[str]) -> subprocess.CompletedProcess[str]:
    assert CPP is not None
    return subprocess.run(
        [CPP, "-x", "c++", "-P", "-D__CUDACC_RTC__", *opts, "-"],
        input=gpucp.source().decode(),
        capture_output=True,
        text=True,
        timeout=60,
    )


@needs_cpp
def test_the_preprocessed_source_has_the_engines_limits() -> None:
    opts = [o.decode() for o in gpucp.nvrtc_options("sm_90")]
    keep = [o for o in opts if o.startswith(("-I", "-D"))]
    out = _preprocess(keep)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    hop, depth, budget = (LIMITS[k] for k in ("HL_CP_HOP_LIMIT", "HL_CP_FAIL_DEPTH", "HL_CP_FAIL_BUDGET"))
    assert f"hops < {hop}" in text and f"hops >= {hop}" in text  # own-queue chains cut after it
    assert f"*fw[{depth}]" in text  # nested follow-ups failed this deep
    assert f"budget = {budget}" in text  # and this many signals a packet
    assert not re.search(r"HL_CP_(HOP_LIMIT|FAIL_DEPTH|FAIL_BUDGET)", text)


@needs_cpp
def test_without_the_limits_the_source_says_how_to_compile_it() -> None:
    opts = [o.decode() for o in gpucp.nvrtc_options("sm_90")]
    out = _preprocess([o for o in opts if o.startswith("-I")])
    assert out.returncode != 0
    assert "compile through hostless.agents.gpucp.compile_cubin" in out.stderr
