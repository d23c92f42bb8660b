"""The cpu and npu agents' command processor: the engine's loop in C, and its Python callbacks.

:func:`run_native` hands the agent's queue to ``Core.agent_run`` (the engine's
``hle_agent_run``, ``core/agent.c``), which serves it with the GIL released:
pop (an adaptive spin, then a bounded futex sleep), check, wait on the inputs,
run, signal, push the follow-ups, trace START / END, by the rule stated once
as the engine's contract (``core/hostless_engine.h``).  cpu and npu agents:

* KERNEL packets whose id maps to a built-in kernel (cpu: the ids of
  ``CPU_KERNELS``; npu: the CU indices of ``NPU_CUS``, a KERNEL packet's id
  read as a CU index) run in C (``core/kernels.c``: float32, copy of
  any dtype, int8_gemm, GEMM through a dlopen'ed OpenBLAS) with no Python;
* ERT packets are decoded and run in C (START_CU, START_NPU, CMD_CHAIN,
  states written back into the command's header word), each CU by its C kernel;
* anything else (user kernels, stage functions loaded through the spawner's
  private channel (:mod:`~hostless.agents.control`),
  dtypes or broadcasts the C kernels do not take, GEMM without a BLAS) runs in
  Python through :meth:`NativeCallbacks.kernel` / :meth:`NativeCallbacks.cu`,
  with the GIL held only for that call, on :class:`NativeCallbacks`' kernel
  table (so error records and ``load_function`` work).

GEMM's BLAS: the ``scipy-openblas32`` wheel (``pip install 'hostless[blas]'``)
when installed, loaded by path at agent start (the engine has no link-time
dependency on it); ``HOSTLESS_BLAS`` overrides the path (``none``: no BLAS).
Without one, GEMM runs in the Python kernel (NumPy), never in a hand loop;
:func:`capabilities` says which (the spawner gets it as ``Agent.capabilities``).

Guarantees: a bad packet fails alone with ERROR and the agent goes on; the
loop ends on STOP, on the spawner's death (checked while idle and between
input-wait slices) and on a signal handler that raises (SIGTERM: the worker's
``sys.exit``; its exception propagates out of :func:`run_native`).  The Python
callbacks hold no object between packets (the cache is emptied after each one).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .. import _core, kernels, records, stagefn
from .._abi import C
from ..kernels import CPU_KERNELS, FUNCTION_KERNEL_BASE, NPU_CUS, Kernel
from ..status import Status
from ..wire import BadPacket, Packet, PacketType
from .loop import ObjectCache, decode_kernel

__all__ = ["NativeCallbacks", "run_native", "c_kernel_mask", "kernel_table", "blas_path", "capabilities"]

MAX_CUS = int(C.AGENT_MAX_CUS)
_KIND = {"cpu": int(C.AGENT_CPU), "npu": int(C.AGENT_NPU)}
# the built-in Python kernels the engine has in C (hostless_engine.h HLE_K_*)
_C_KERNELS: dict[Any, int] = {
    kernels.k_copy: int(C.CK_COPY),
    kernels.k_add: int(C.CK_ADD),
    kernels.k_scale: int(C.CK_SCALE),
    kernels.k_relu: int(C.CK_RELU),
    kernels.k_gemm: int(C.CK_GEMM),
    kernels.k_sum: int(C.CK_SUM),
    kernels.k_softmax: int(C.CK_SOFTMAX),
    kernels.k_conv2d: int(C.CK_CONV2D),
    kernels.k_normalize: int(C.CK_NORMALIZE),
    kernels.k_int8_gemm: int(C.CK_INT8_GEMM),
}
BLAS_THREADS = 1
"""Threads of the agent's BLAS: an agent is one engine on one core (no BLAS threads spinning while idle)."""


def blas_path() -> str | None:
    """The CBLAS library the native agents load (``HOSTLESS_BLAS``, else the
    scipy-openblas32 wheel's), or None."""
    env = os.environ.get("HOSTLESS_BLAS")
    if env is not None:
        return None if env.lower() in ("", "none", "0") else env
    try:
        import scipy_openblas32  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    lib = f"lib{scipy_openblas32.get_library()}.so"
    path = os.path.join(scipy_openblas32.get_lib_dir(), lib)
    return path if os.path.exists(path) else None


def capabilities(kind: str, executable: bool = False) -> dict[str, Any]:
    """What a native agent of ``kind`` runs in C: the loop, ERT, and GEMM through a BLAS or not
    (``blas``: the library's sgemm and path; ``why``: why there is none, and what runs GEMM
    instead).  ``gemm``: "blas"; else "python" (the Python kernel, NumPy) in a Python worker, or
    "none" for the hostless-agent executable (``executable=True``), which has no Python: its
    GEMM packets fail, each with a record.  The probe loads the library the agent is given
    (:func:`blas_path`), with the engine's own loader."""
    loaded, cause = _core.blas_probe(blas_path(), BLAS_THREADS)
    if loaded:
        gemm, why = "blas", None
    elif executable:
        gemm, why = "none", f"{cause}: hostless-agent has no Python, so its GEMM packets fail"
    else:
        gemm, why = "python", f"{cause}: GEMM runs in the Python kernel (NumPy)"
    return {
        "native": "exe" if executable else True,
        "kind": kind,
        "ert": "C",
        "gemm": gemm,
        "blas": cause if loaded else None,
        "why": why,
    }


def kernel_table(cb: NativeCallbacks) -> tuple[int, bytes]:
    """(present, kernel_map) of ``cb``'s kernels for the engine: bit ``i`` of present set when
    id / CU ``i`` (< 32) exists; byte ``i`` of the map the C kernel that runs it (0: Python).
    A user kernel that replaced a built-in one runs in Python."""
    present, cmap = 0, bytearray(MAX_CUS)
    for kid, fn in cb.kernels.items():
        if 0 <= kid < MAX_CUS:
            present |= 1 << kid
            cmap[kid] = _C_KERNELS.get(fn, 0)
    return present, bytes(cmap)


def c_kernel_mask(cb: NativeCallbacks) -> int:
    """Bit ``i`` set: built-in kernel id ``i`` may run in C (not replaced by a user kernel)."""
    mask = 0
    for kid, fn in CPU_KERNELS.values():
        if cb.kernels.get(kid) is fn and kid < 32:
            mask |= 1 << kid
    return mask


class NativeCallbacks:
    """The Python side of a cpu or npu agent, what the C loop calls back (with the GIL held):
    the kernel table (``kind``'s built-in kernels, then ``user`` kernels by id, then the
    stage functions the spawner loads), the objects a Python kernel's packet names, and
    the failure records of the packets it fails."""

    def __init__(self, dom: Any, kind: str, user: dict[int, Kernel]) -> None:
        self.dom, self.kind = dom, kind
        table = NPU_CUS if kind == "npu" else CPU_KERNELS
        self.kernels: dict[int, Any] = {kid: fn for kid, fn in table.values()}
        self.kernels.update(user)
        self.cache = ObjectCache(dom)
        self.records = records.Recorder(dom)  # why packets failed (hostless.records)

    def load_function(self, req: dict[str, Any]) -> int:
        """Import the stage function a request of the spawner describes
        (:func:`hostless.stagefn.describe` plus ``id``) and register it under that id;
        returns the id.  Called only for requests that came through the spawner's
        private channel (:mod:`hostless.agents.control`), never for a queue's packet.
        Raises what the import raises, ValueError for a malformed request."""
        if self.kind != "cpu":
            raise ValueError(f"{self.kind} agents do not run Python stage functions")
        kid = req.get("id")
        if not isinstance(kid, int) or isinstance(kid, bool) or kid < FUNCTION_KERNEL_BASE:
            raise ValueError(f"stage function id {kid!r} is not an int >= {FUNCTION_KERNEL_BASE}")
        module, qualname = req.get("module"), req.get("qualname")
        if not isinstance(module, str) or not isinstance(qualname, str):
            raise ValueError("a load request names a module and a qualified name (strings)")
        scalars = req.get("scalars", [])
        if not isinstance(scalars, list):
            raise ValueError("a load request's scalars are a list")
        what = f"stage function {module}:{qualname}"
        self.kernels[kid] = stagefn.bind(stagefn.load(req), scalars, what)
        return kid

    def kernel(self, idx: int, raw: bytes) -> int:
        """Run packet ``idx``'s kernel (a KERNEL packet the C table does not run) in Python;
        returns its status.  Never raises: a failure is recorded for the packet's signal and
        returns ERROR.  A LOAD_KERNEL packet is refused here (nothing is imported)."""
        pkt = Packet.decode(raw)
        try:
            if pkt.type != PacketType.KERNEL:
                raise BadPacket(f"packet type {pkt.type} has no Python kernel")
            fn, bufs, scalars, _follow = decode_kernel(self.kernels, self.cache, pkt)
            view = self.cache.view
            fn([view(h) for h in bufs], scalars)
            status = Status.SUCCESS
        except Exception as e:  # a bad packet fails alone, with the why recorded for its signal
            self.records.write(pkt.signal, stagefn.format_error(e))
            status = Status.ERROR
        self.cache.clear()  # hold nothing between packets
        return int(status)

    def cu(self, cu: int, bufs: Sequence[int], scalars: Sequence[int], signal: int) -> int:
        """Run CU ``cu`` of an ERT command (one the C table does not run, or dtypes its
        C kernel does not take) in Python; returns its status.  Never raises: a failure
        is recorded for ``signal`` and returns ERROR."""
        try:
            fn = self.kernels.get(cu)
            if fn is None:
                raise BadPacket(f"no CU {cu} in the loaded xclbin")
            fn([self.cache.view(h) for h in bufs], list(scalars))
            status = Status.SUCCESS
        except Exception as e:
            self.records.write(signal, stagefn.format_error(e))
            status = Status.ERROR
        self.cache.clear()
        return int(status)

    def record(self, signal: int, why: str) -> None:
        """Keep the why of a packet the C loop failed (:mod:`hostless.records`)."""
        self.records.write(signal, why)


def run_native(
    cb: NativeCallbacks,
    queue: int,
    parent: int,
    spin: float = 50e-6,
    wait_timeout: float | None = 60.0,
    follow_timeout: float = 10.0,
    fixed_spin: bool = False,
    idle_poll: float = 0.0,
) -> dict[str, Any]:
    """Serve ``queue`` (a handle of ``cb.dom``) with the engine's loop and ``cb``'s kernels
    until STOP, the death of ``parent`` (the spawner's pid) or a signal handler that raises;
    returns the engine's counters (packets, failures: packets failed or follow-ups dropped,
    spins / parks of the doorbell, blas_loaded, blas_why).  ``spin``: the longest doorbell
    spin (seconds) before a park; ``wait_timeout`` (None: none) bounds a packet's input waits,
    ``follow_timeout`` its follow-up pushes; ``fixed_spin``: always spin ``spin`` (no
    adaptation); ``idle_poll`` (seconds, 0: the domain's poll interval): the longest doorbell
    sleep once the agent has been idle 100 ms (a host push wakes it at once; a device's
    plain-store doorbell is seen within it).  The engine binds the queue and fails what was
    queued for a dead consumer it replaced (OWNER_DIED)."""
    wto = -1 if wait_timeout is None else int(wait_timeout * 1e9)
    core = cb.dom._core
    present, cmap = kernel_table(cb)
    out: dict[str, Any] = core.agent_run(
        int(queue),
        int(max(0.0, spin) * 1e9),
        wto,
        int(max(0.0, follow_timeout) * 1e9),
        int(parent),
        cb.kernel,
        cb.record,
        c_kernel_mask(cb),
        _KIND.get(cb.kind, 0),
        present,
        cmap,
        cb.cu,
        blas_path(),
        BLAS_THREADS,
        int(fixed_spin),
        int(max(0.0, idle_poll) * 1e9),
        _keep_ns(),
    )
    return out


def _keep_ns() -> int:
    """How long the loop keeps its recent packets' objects imported (hle_agent_run's "kept
    imports"): the engine's default, or ``HOSTLESS_AGENT_KEEP_NS`` from the environment (0:
    release each after its packet, the loop before kept imports: a switch for measuring
    them, not a tuning knob)."""
    v = os.environ.get("HOSTLESS_AGENT_KEEP_NS")
    if v is None:
        return int(C.AGENT_KEEP_NS)
    try:
        return max(0, int(v))
    except ValueError:
        raise ValueError(f"HOSTLESS_AGENT_KEEP_NS must be an integer (nanoseconds), got {v!r}") from None
