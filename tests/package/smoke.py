"""The installed wheel's smoke program (tests/package/test_wheel.py runs it in a fresh venv
where no C compiler is reachable): a domain, a fence each way across two processes, a 3-stage
Graph on the default agents with its last stage on the hostless-agent executable, and the
C headers.  Prints one line per check; exits non-zero at the first that fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import numpy as np

import hostless as hl
from hostless import agents
from hostless.graph import Graph

CHILD = """
import sys, hostless as hl
name, theirs, mine = sys.argv[1], int(sys.argv[2], 16), int(sys.argv[3], 16)
with hl.Domain.open(name, label="smoke-child") as d:
    d.import_fence(theirs).signal()                        # the parent waits on this one
    assert d.import_fence(mine).wait(timeout=30) == hl.Status.SUCCESS  # the parent signals this one
print("child ok")
"""


def main() -> None:
    for cc in ("gcc", "cc", "clang", "c99"):
        assert shutil.which(cc) is None, f"a C compiler is reachable: {shutil.which(cc)}"
    assert not hasattr(hl._core, "testing"), "the wheel's extension has the test hooks"
    assert hl.__file__ and "site-packages" in hl.__file__, hl.__file__
    print("hostless", hl.__version__, "ABI", hl.ABI_VERSION, "from", os.path.dirname(hl.__file__))
    assert os.path.isfile(os.path.join(hl.get_include(), "hostless", "hostless.h"))
    assert os.path.isfile(os.path.join(hl.get_include(), "hostless", "hostless_engine.h"))
    exe = agents.executable_path()
    assert os.access(exe, os.X_OK), exe
    print("headers and hostless-agent present:", hl.get_include(), exe)

    name = f"hlsmoke-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with hl.Domain.create(name, heap="32M", unlink_on_close=True) as dom:
        theirs, mine = dom.fence(), dom.fence()
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, name, hex(theirs.handle), hex(mine.handle)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert theirs.wait(timeout=30) == hl.Status.SUCCESS
        mine.signal()
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0 and "child ok" in out, (child.returncode, out)
        print("fence across two processes: ok")

        cpu, npu = agents.spawn(dom, "cpu"), agents.spawn(dom, "npu")
        exe_agent = agents.spawn(dom, "cpu", native="exe")
        try:
            caps = npu.capabilities  # GEMM's BLAS is the [blas] extra: the agent says which it runs
            assert caps["gemm"] == "blas" or "hostless[blas]" in caps["why"], caps
            print("npu gemm:", caps["gemm"], "-", caps["blas"] or caps["why"])
            rng = np.random.default_rng(0)
            x = rng.standard_normal((16, 32)).astype(np.float32)
            w = rng.standard_normal((32, 8)).astype(np.float32)
            g = (
                Graph(dom)
                .input("x", (16, 32), "f4")
                .constant("W", w)
                .stage("scale", cpu, "scale", ["x"], ("x2", (16, 32), "f4"), scalars=[2.0])
                .stage("infer", npu, "gemm", ["x2", "W"], ("y", (16, 8), "f4"))
                .stage("post", exe_agent, "relu", ["y"], ("z", (16, 8), "f4"))
            )
            want = np.maximum((2.0 * x) @ w, 0)
            for dispatch, data in (("direct", "shared"), ("host", "copy")):
                with g.compile(dispatch=dispatch, data=data) as cg:
                    for _ in range(3):
                        z = cg.run({"x": x})["z"]
                        assert np.allclose(z, want, rtol=1e-4, atol=1e-4), (dispatch, data)
                print(f"3-stage graph, {dispatch}+{data} (cpu, npu, hostless-agent): ok")
        finally:
            for a in (exe_agent, npu, cpu):
                a.stop()
    print("smoke ok")


if __name__ == "__main__":
    main()
