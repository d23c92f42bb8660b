"""The GPU command processor: a resident kernel that serves a hostless queue.

``agents.spawn(dom, "gpucp", device=0, sms=8)`` starts an agent process that
registers the domain with the GPU, compiles ``gpucp.cu`` (with
``hostless.h``) through NVRTC and launches it once.  From then on the GPU
takes the queue's packets itself: it waits for their inputs on the
completion words, runs the kernel (built-in float32 kernels, by the cpu
kernels' ids: copy, add, scale, relu, gemm, sum, softmax, normalize), signals,
and pushes the follow-up packets into their queues (the next GPU stage's, or a
CPU agent's), with no host launch or wake-up per packet.  A follow-up for its
own queue runs in place when that queue is empty.  The host process only
watches: the spawner's death, a STOP packet (the kernel leaves by itself) or
SIGTERM (it sets the control word the kernel polls, then waits for it to
leave).  A host process killed outright takes its CUDA context, and the
kernel, with it; the domain's recovery marks its fences OWNER_DIED like any
participant's.

Isolation.  The kernel is one block per SM of its ``sms``: a front-end block
(a warp that takes packets, with its other warps for small jobs) and
``sms - 1`` worker blocks for larger ones (one block per SM: the kernel uses
up to 255 registers a thread, so that the front end never spills).  Where the driver has green contexts
(``cuGreenCtxCreate``), it runs in one holding an SM partition of its own
(``sms`` rounded up to the driver's granularity, 8 on an H200), so that
ordinary CUDA work of the same process runs beside it on the other SMs;
otherwise it is a bounded grid of that many blocks in the primary context
(``isolation="grid"`` asks for that).  Which one was used, and the SM
counts, are in ``agent.capabilities``.  Work of *other processes* still
shares the GPU by time slices, as every CUDA context does without MPS.

The control block is a small heap buffer (the GPU writes it over the host
link): stop, state, packets run, packets failed, the last failure (packet
number and reason), a heartbeat, follow-ups run in place, the summed
device-timer nanoseconds of in-place hand-offs (a stage's end to the next's
start), argument blocks found decoded (hits) and decoded (misses), jobs run
by the front-end block itself (local), and the summed nanoseconds of jobs.
:func:`stats` reads it from the spawner.

Hostile packets: the CPU agents' rule (``hle_agent_run``'s contract in
``include/hostless/hostless_engine.h``), checked before anything
waits or runs (gpucp.cu's header comment says how): a bad signal, input or argument block fails
the packet alone with ERROR and the follow-ups' signals (nested ones too); follow-ups into a
full queue wait 1 s at most (never for the processor's own queue); chains through its own queue
are cut after ``HLE_AGENT_HOP_LIMIT`` (64) hops, the CPU agents' limit (:data:`LIMITS`).
Signals are 16-byte CASes over a slot's {word, ctl} on sm_90
(``HL_CP_CAS128=0`` in the environment compiles word-only CASes).

ERT packets run as on the emulated NPU: START_CU / START_NPU on the CU their
cu_mask names (the CU index is the kernel id), buffers and scalars in the
command, the state written back into its header word; CMD_CHAIN and the
other opcodes fail (ERROR) on the GPU.

Not supported yet: buffers of another GPU's heap, dtypes other than float32
(copy takes any), conv2d; argument blocks over 1 KiB and ERT commands over
256 bytes fail with "bad argument block".
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from .. import _core, devmem, lowlevel
from .._abi import C
from ..domain import Domain
from ..errors import HostlessError
from ..queue import Queue

__all__ = [
    "GpuCommandProcessor",
    "GPUCP_KERNEL_NAMES",
    "CTL_FIELDS",
    "CU_PARTS",
    "LIMITS",
    "read_ctl",
    "stats",
    "compile_cubin",
    "nvrtc_options",
    "source",
]

GPUCP_KERNEL_NAMES = ("copy", "add", "scale", "relu", "gemm", "sum", "softmax", "normalize")
CTL_FIELDS = (
    "stop", "state", "packets", "failed", "last_error", "heartbeat", "inplace", "handoff_ns",
    "hits", "misses", "local", "job_ns", "fence_ns", "round_ns", "tail_ns", "post_ns", "sm_khz",
)
# the layout of struct hl_cp_ctl, struct cp_share and struct cp_gent (hostless_gpucp.h, which
# gpucp.cu includes), from the extension's constant table: no word count written here
_CTL_WORDS = int(C.CP_CTL_SIZE) // 8
_CTL_INDEX = {k: int(getattr(C, f"CP_CTL_{k}")) // 8 for k in CTL_FIELDS}
_SHARE_WORDS = int(C.CP_SHARE_SIZE) // 8
_CACHE_WORDS = int(C.CP_CACHE) * int(C.CP_GENT_SIZE) // 8  # HL_CP_CACHE x struct cp_gent
REASONS = {int(C.CP_R_OK): "ok", int(C.CP_R_INPUT): "an input failed",
           int(C.CP_R_KERNEL): "unknown kernel or packet type", int(C.CP_R_ARGS): "bad argument block",
           int(C.CP_R_BUFFER): "a buffer handle names no live buffer here",
           int(C.CP_R_SHAPE): "shapes do not fit", int(C.CP_R_DTYPE): "not float32",
           int(C.CP_R_HANDLE):
           "a signal or input handle of the wrong kind, stale, or a timeline point past 2**62"}
_REASON_MASK = (1 << int(C.CP_LAST_ERROR_SHIFT)) - 1
_STATE_ATTACH_FAILED = int(C.CP_STATE_ATTACH_FAILED)
_STOP, _STATE = _CTL_INDEX["stop"], _CTL_INDEX["state"]
_THREADS = int(C.CP_THREADS)


def read_ctl(words: np.ndarray) -> dict[str, int]:
    """The control block's fields by name (``words``: its u64 words)."""
    return {k: int(words[i]) for k, i in _CTL_INDEX.items()}


def _described(words: np.ndarray) -> dict[str, Any]:
    """read_ctl with ``last_reason``: the last failure's reason spelled out."""
    st: dict[str, Any] = dict(read_ctl(words))
    st["last_reason"] = REASONS.get(st["last_error"] & _REASON_MASK, "?")
    return st


def stats(agent: Any) -> dict[str, Any]:
    """The control block of a running gpucp ``agent`` (from :func:`hostless.agents.spawn`), by name,
    with ``last_reason`` spelled out.  Reads host memory only.  The processor writes its
    counters out when its queue goes idle and every 64 packets (each store to host memory is a
    bus write its next system fence would wait for); ``failed`` and ``last_error`` at once."""
    h = int(agent.capabilities.get("ctl", 0)) if getattr(agent, "capabilities", None) else 0
    if not h:
        raise HostlessError("this agent has no GPU command processor control block")
    buf = agent.dom.import_buffer(h)
    try:
        return _described(buf.numpy().view(np.uint64))
    finally:
        buf.release()


def _ok(res: Any, what: str) -> Any:
    """cuda.bindings returns (err, *values): raise on an error, return the values."""
    err, *vals = res if isinstance(res, tuple) else (res,)
    if int(err) != 0:
        raise HostlessError(f"{what} failed: {err!r}")
    return vals[0] if len(vals) == 1 else tuple(vals)


CU_PARTS = ("gpucp.cu", "gpucp_decode.cu", "gpucp_sync.cu", "gpucp_front.cu")
"""The processor's CUDA source files (beside this module), in the order NVRTC reads them: one
program, the files concatenated (gpucp.cu: the header comment, constants and workers;
gpucp_decode.cu: reading slots, buffers and argument blocks; gpucp_sync.cu: waits, signals,
failure passing and queue pushes; gpucp_front.cu: the front end's loop and the kernel)."""


def source() -> bytes:
    """The CUDA source NVRTC compiles: the files of :data:`CU_PARTS`, concatenated."""
    here = os.path.dirname(__file__)
    parts = []
    for name in CU_PARTS:
        with open(os.path.join(here, name), "rb") as f:
            parts.append(f.read())
    return b"".join(parts)


LIMITS = {
    "HL_CP_HOP_LIMIT": int(C.AGENT_HOP_LIMIT),
    "HL_CP_FAIL_DEPTH": int(C.AGENT_FAIL_DEPTH),
    "HL_CP_FAIL_BUDGET": int(C.AGENT_FAIL_BUDGET),
}
"""The CPU agents' limits (hostless_engine.h's ``HLE_AGENT_HOP_LIMIT``, ``_FAIL_DEPTH``,
``_FAIL_BUDGET``, through the extension's constant table) under the names gpucp.cu uses: NVRTC
cannot include the engine header, so :func:`nvrtc_options` passes them as ``-D`` options (the
source stops with ``#error`` without them)."""


def nvrtc_options(arch: str) -> list[bytes]:
    """NVRTC's options for :func:`source` on a GPU of architecture ``arch`` (``"sm_90"``): the
    public headers' folder, C++14, the architecture, :data:`LIMITS` as ``-D`` options, and
    ``-DHL_CP_CAS128=0`` when ``HL_CP_CAS128=0`` is in the environment."""
    from .._abi import abi_header_path

    inc = os.path.dirname(abi_header_path())
    opts = [f"-I{inc}", "--std=c++14", f"--gpu-architecture={arch}"]
    opts += [f"-D{name}={value}" for name, value in LIMITS.items()]
    if os.environ.get("HL_CP_CAS128") == "0":  # a host without 128-bit PCIe atomics: word-only CASes
        opts.append("-DHL_CP_CAS128=0")
    return [o.encode() for o in opts]


def compile_cubin(device: int) -> bytes:
    """gpucp.cu compiled by NVRTC for the device's architecture (a cubin)."""
    from cuda.bindings import driver as cu
    from cuda.bindings import nvrtc

    dev = _ok(cu.cuDeviceGet(device), "cuDeviceGet")
    attr = cu.CUdevice_attribute
    major = _ok(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "attribute")
    minor = _ok(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "attribute")
    src = source()
    prog = _ok(nvrtc.nvrtcCreateProgram(src, b"gpucp.cu", 0, [], []), "nvrtcCreateProgram")
    opts = nvrtc_options(f"sm_{major}{minor}")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if int(err) != 0:
            n = _ok(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
            log = b" " * n
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise HostlessError(f"gpucp.cu does not compile:\n{log.decode(errors='replace')}")
        n = _ok(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
        cubin = b" " * n
        _ok(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


class GpuCommandProcessor:
    """The host half of a GPU command processor (see the module doc)."""

    def __init__(
        self, dom: Domain, queue: Queue, parent: int, device: int, sms: int = 8, isolation: str = "auto"
    ) -> None:
        from cuda.bindings import driver as cu

        from ..cuda import CudaPeer

        if sms < 1:
            raise ValueError("sms must be >= 1")
        if isolation not in ("auto", "green", "grid"):
            raise ValueError(f"isolation must be 'auto', 'green' or 'grid', not {isolation!r}")
        self.dom, self.queue, self.parent, self.device = dom, queue, parent, device
        self.cu = cu
        self.peer = CudaPeer(dom, device)
        cp = self.cp = self.peer.cp
        self.ctl_buf = dom.buffer((_CTL_WORDS,), np.uint64)
        self.ctl = self.ctl_buf.numpy().view(np.uint64)
        self.ctl[...] = 0
        va = np.zeros(8, dtype=np.uint64)
        for h in lowlevel.device_heaps(dom):
            if h.ordinal == device and h.heap_index < 8:
                va[h.heap_index] = devmem.backing(dom, h.name).va
        self.dh_va = cp.asarray(va)
        self.share = cp.zeros(_SHARE_WORDS, dtype=np.uint64)  # struct cp_share (go, done, the job)
        self.cache = cp.zeros(_CACHE_WORDS, dtype=np.uint64)  # decoded argument blocks
        self.cubin = compile_cubin(device)
        total = int(cp.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"])
        self.info: dict[str, Any] = {"sms_total": total, "ctl": self.ctl_buf.handle}
        # whether the GPU's atomics on host memory are atomic against the host's (the spawner
        # warns when not: errors.DeviceAtomicsWarning)
        attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED
        dev = _ok(cu.cuDeviceGet(device), "cuDeviceGet")
        native = _ok(cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute")
        self.info["host_native_atomics"] = bool(native)
        # who pushes the follow-ups: the GPU with its atomics where they are atomic against the
        # host's, else the host forwarder (core/cpfwd.c) through the outbox; HOSTLESS_GPUCP_PUSHES
        # = "host" or "device" overrides (tests, measurements)
        pushes = os.environ.get("HOSTLESS_GPUCP_PUSHES", "") or ("device" if native else "host")
        if pushes not in ("host", "device"):
            raise ValueError(f"HOSTLESS_GPUCP_PUSHES must be 'host' or 'device', not {pushes!r}")
        self.info["pushes"] = pushes
        self.outbox_ptr = self.outbox_dptr = 0
        self.outbox: Any = None
        self.forwarder: Any = None
        if pushes == "host":  # private pinned memory, mapped into every context (the green one too)
            import ctypes

            flags = 1 | 2  # CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP
            n = int(C.CP_OUTBOX_SIZE)
            self.outbox_ptr = int(_ok(cu.cuMemHostAlloc(n, flags), "cuMemHostAlloc"))
            self.outbox = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(self.outbox_ptr))
            dptr = _ok(cu.cuMemHostGetDevicePointer(self.outbox_ptr, 0), "cuMemHostGetDevicePointer")
            self.outbox_dptr = int(dptr)
        self.green: Any = None
        self.ctx: Any = None
        why_not = ""
        if isolation in ("auto", "green"):
            try:
                self._green_context(sms)
            except Exception as e:  # no green contexts on this driver / bindings
                if isolation == "green":
                    raise HostlessError(f"no green context for the GPU command processor: {e}") from e
                why_not = str(e)
        if self.green is None:
            self.ctx = _ok(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")  # CuPy's: the primary context
            self.stream_obj = cp.cuda.Stream(non_blocking=True)
            self.stream = cu.CUstream(self.stream_obj.ptr)
            n = max(2, min(sms, total))
            self.workers = n - 1
            self.info.update(isolation="grid", sms=n, workers=self.workers)
            if why_not:
                self.info["green_unavailable"] = why_not
        self._push()
        try:
            self.module = _ok(cu.cuModuleLoadData(self.cubin), "cuModuleLoadData")
            self.function = _ok(cu.cuModuleGetFunction(self.module, b"hl_cp_main"), "cuModuleGetFunction")
        finally:
            self._pop()

    def _green_context(self, sms: int) -> None:
        cu = self.cu
        dev = _ok(cu.cuDeviceGet(self.device), "cuDeviceGet")
        res = _ok(cu.cuDeviceGetDevResource(dev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
                  "cuDeviceGetDevResource")
        groups, _n, _rest = _ok(cu.cuDevSmResourceSplitByCount(1, res, 0, sms), "cuDevSmResourceSplitByCount")
        desc = _ok(cu.cuDevResourceGenerateDesc([groups[0]], 1), "cuDevResourceGenerateDesc")
        flags = cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
        self.green = _ok(cu.cuGreenCtxCreate(desc, dev, flags), "cuGreenCtxCreate")
        self.ctx = _ok(cu.cuCtxFromGreenCtx(self.green), "cuCtxFromGreenCtx")
        self.stream = _ok(
            cu.cuGreenCtxStreamCreate(self.green, cu.CUstream_flags.CU_STREAM_NON_BLOCKING, 0),
            "cuGreenCtxStreamCreate",
        )
        got = int(groups[0].sm.smCount)
        self.workers = max(1, got - 1)
        self.info.update(isolation="green context", sms=got, workers=self.workers)

    def _push(self) -> None:
        _ok(self.cu.cuCtxPushCurrent(self.ctx), "cuCtxPushCurrent")

    def _pop(self) -> None:
        _ok(self.cu.cuCtxPopCurrent(), "cuCtxPopCurrent")

    @property
    def done(self) -> bool:
        """The kernel has left (or never ran)."""
        self._push()
        try:
            (err,) = self.cu.cuStreamQuery(self.stream)
        finally:
            self._pop()
        return int(err) != int(self.cu.CUresult.CUDA_ERROR_NOT_READY)

    def start(self) -> None:
        """Launch the resident kernel; returns once it attached (or raises why not).  A cooperative
        launch, so that the driver guarantees every block is resident at once (the front end waits
        for the workers); a plain launch where cooperative launches are refused."""
        import ctypes

        cu = self.cu
        layout = lowlevel.layout(self.dom)
        vals = (
            self.peer.dbase,
            int(layout["size"]),
            int(self.queue.handle),
            self.dom.participant_id & 0xFF,  # its reservations are this participant's device's
            int(self.dh_va.data.ptr),
            self.peer.dptr(self.ctl_buf.offset),
            int(self.share.data.ptr),
            int(self.cache.data.ptr),
            self.outbox_dptr if self.outbox_ptr else 0,
        )
        c = ctypes
        types = (c.c_void_p, c.c_ulonglong, c.c_ulonglong, c.c_uint) + (c.c_void_p,) * 5
        if self.outbox_ptr:  # the forwarder first: the kernel may push at once
            self.forwarder = _core.cpfwd_start(self.dom._core, self.outbox, int(self.queue.handle))
        args = (vals, types)
        grid = 1 + self.workers
        self._push()
        try:
            fn, st = self.function, self.stream
            (err,) = cu.cuLaunchCooperativeKernel(fn, grid, 1, 1, _THREADS, 1, 1, 0, st, args)
            self.info["launch"] = "cooperative"
            if int(err) != 0:
                self.info["launch"] = f"plain (cooperative refused: {err!r})"
                _ok(cu.cuLaunchKernel(self.function, grid, 1, 1, _THREADS, 1, 1, 0, self.stream, args, 0),
                    "cuLaunchKernel")
        finally:
            self._pop()
        deadline = time.monotonic() + 30
        while int(self.ctl[_STATE]) == 0:
            if time.monotonic() > deadline or self.done:
                state = int(self.ctl[_STATE])
                raise HostlessError(f"the GPU command processor did not start (state {state})")
            time.sleep(1e-4)
        if int(self.ctl[_STATE]) == _STATE_ATTACH_FAILED:
            raise HostlessError("the GPU command processor could not attach to the domain or open its queue")

    def run(self, poll: float = 0.01) -> None:
        """Watch until the kernel leaves (STOP), the spawner dies, or an exception
        (SIGTERM's SystemExit) ends the wait; the kernel has left on return."""
        try:
            while not self.done:
                if self.parent and os.getppid() != self.parent:
                    break  # the spawner died (we were reparented), as the agent loops check it
                time.sleep(poll)
        finally:
            self.stop()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the kernel to leave and wait for it (it checks between packets and in waits)."""
        self.ctl[_STOP] = 1
        deadline = time.monotonic() + timeout
        while not self.done and time.monotonic() < deadline:
            time.sleep(1e-3)

    def stats(self) -> dict[str, Any]:
        """As :func:`stats`, from the processor's own process."""
        return _described(self.ctl)

    def close(self) -> None:
        """Stop the forwarder (after what the outbox holds), then release the outbox, the control
        block, the green context (if any) and the domain's registration."""
        if self.forwarder is not None:
            pushed, failed = _core.cpfwd_stop(self.forwarder)
            self.info["forwarded"], self.info["forward_failed"] = int(pushed), int(failed)
            self.forwarder = None
        if self.outbox_ptr and self.done:  # never free what a running kernel may still write
            self.outbox = None
            self.cu.cuMemFreeHost(self.outbox_ptr)
            self.outbox_ptr = 0
        self.ctl_buf.release()
        if self.green is not None:
            self.cu.cuStreamDestroy(self.stream)
            self.cu.cuGreenCtxDestroy(self.green)
            self.green = None
        self.peer.close()
