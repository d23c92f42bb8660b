"""The GPU as a peer of a domain (NVIDIA, through CuPy and cuda.bindings).

:class:`CudaPeer` registers the whole domain mapping with the GPU
(``cudaHostRegister``, mapped: with unified addressing the device pointer is
the host pointer), after which:

* heap buffers are CuPy arrays with no copy (:meth:`CudaPeer.array`);
* a stream waits for a fence or timeline point on the GPU itself
  (``cuStreamWaitValue64`` GEQ on its completion word) and signals one
  (a one-thread kernel doing ``atomicCAS_system``, so that a fence is still
  signaled once even against recovery's OWNER_DIED), with no host thread in
  between;
* host waiters asleep on a word the GPU stored are woken by
  ``cuLaunchHostFunc`` with a C function of the core that makes one
  ``FUTEX_WAKE`` (no Python, one syscall in CUDA's callback thread); without
  it they still see the store within the domain's poll interval;
* a prepared packet is pushed into any queue when the stream's work before
  it is done, by a C function of the core that CUDA's callback thread runs
  (``cuLaunchHostFunc``: no Python, the header's ``hl_queue_push`` with the
  host's atomics), which rings the queue's doorbell: the next engine's work
  is dispatched when the stage completes, with no thread of this process
  involved.  Not a device-side push: on a GPU without host-native atomics
  (``cudaDevAttrHostNativeAtomicSupported`` = 0, every PCIe-attached one
  measured here) the GPU's atomics on host memory are not atomic against the
  host's (``hostless_tools.bench.gpu_atomics``: 46% of updates lost), and
  queues are shared with host producers.

A failed input must not produce output: the stage computes into device
scratch memory, a gate kernel reads its inputs' words, and a commit kernel
copies the scratch into the output and signals SUCCESS only when every input
succeeded; otherwise the output is untouched and the failure is signaled.

Install with ``pip install hostless[cuda]``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import numpy as np

from . import devmem, lowlevel
from ._abi import C, abi_header_path, handle_kind
from .buffer import Buffer
from .devmem import available as available
from .devmem import cuda_modules as _imports
from .domain import Domain
from .errors import CudaUnavailable as CudaUnavailable
from .errors import HostlessError

__all__ = ["CudaPeer", "CudaUnavailable", "available"]

_KIND_TIMELINE = int(C.KIND_TIMELINE)
_FAILED = int(C.TIMELINE_FAILED)


ARMED_CTL = ("frame", "step", "cancel", "signal", "n")
"""The fields of an armed slot's control block (u64s in device memory, the timeline words
waited on after them): the kernels' ``HL_ARMED_*`` indices are made from this tuple."""
ARMED_WAITS = 16
"""Timelines an armed frame waits on, at most."""

_KERNELS = (
    "".join(f"#define HL_ARMED_{k.upper()} {i}\n" for i, k in enumerate(ARMED_CTL))
    + f"#define HL_ARMED_WORDS {len(ARMED_CTL)}\n#define HL_ARMED_MAXW {ARMED_WAITS}\n"
    + r"""
#include "hostless.h"

/* The status n completed inputs give a stage: 0 when every one succeeded, else the first
 * failure.  kinds[i]: 1 binary fence (the word is its status), 2 timeline (every input when
 * kinds is 0), waited to values[i] (or to `value` when values is 0): the header's rule, a point
 * reached before a failure succeeded (ABI 6, hl_point_status). */
__device__ static int hl_inputs_status(const unsigned long long *const *words, const int *kinds,
                                       const unsigned long long *values, unsigned long long value, int n) {
    for (int i = 0; i < n; i++) {
        unsigned long long w = *(volatile const unsigned long long *)words[i];
        if (!kinds || kinds[i] == 2) {
            unsigned int ps = hl_point_status((struct hl_fence *)words[i], w, values ? values[i] : value);
            if (ps != HL_STATUS_SUCCESS) return (int)ps;
        } else if (w != HL_STATUS_SUCCESS) {
            return (int)w;
        }
    }
    return 0;
}

/* gate[0] = hl_inputs_status of a packet's inputs, after the stream's waits on them. */
extern "C" __global__ void hl_gate(const unsigned long long *const *words, const int *kinds,
                                   const unsigned long long *values, int n, int *gate) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    *gate = hl_inputs_status(words, kinds, values, 0, n);
}

/* Signal a fence (CAS 0 -> status) or advance a timeline (CAS loop up to value, or fail it)
 * with the status g (0: success): the header's operations, as on the host (a failure keeps
 * the last value in aux). */
__device__ static void hl_signal_word(unsigned long long *word, int kind, unsigned long long value, int g) {
    __threadfence_system();
    if (kind == 2) {
        struct hl_fence *f = (struct hl_fence *)word; /* the word is at offset 0 of its slot */
        if (g)
            hl_timeline_fail(f, (hl_u32)g, 0);
        else
            hl_timeline_advance(f, value, 0);
    } else {
        atomicCAS_system(word, 0ull, g ? (unsigned long long)g : (unsigned long long)HL_STATUS_SUCCESS);
    }
    __threadfence_system();
}

/* Signal a fence or a timeline from a stream, with the gate's failure taking precedence. */
extern "C" __global__ void hl_signal(unsigned long long *word, int kind, unsigned long long value,
                                     const int *gate) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int g = gate ? *(volatile const int *)gate : 0;
    if (g < 0) return; /* a cancelled frame: not signalled */
    hl_signal_word(word, kind, value, g);
}

/* An armed segment's frame, captured in its graph around the user's work
 * (hostless.agents.cuda_armed): ctl is the slot's control block in device memory, its fields
 * at the HL_ARMED_* indices (cuda.ARMED_CTL), written by the host only while no frame of the
 * slot is queued.  hl_armed_wait runs first: once the stream's wait on the host word let the
 * frame in (so each point is reached, or failed, in bounded time) it spins, one thread
 * sleeping between looks, until every timeline word in ctl reached the frame (ctl[FRAME]) or
 * the cancel flag is set; then gate = -1 when cancelled or not armed (no cancel flag: a run at
 * capture time), else the inputs' status (a point reached before a failure succeeded). */
extern "C" __global__ void hl_armed_wait(const unsigned long long *ctl, int *gate) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const volatile int *cancel = (const volatile int *)ctl[HL_ARMED_CANCEL];
    unsigned long long n = ctl[HL_ARMED_N], value = ctl[HL_ARMED_FRAME];
    if (!cancel || n > HL_ARMED_MAXW) { *gate = -1; return; }
    const unsigned long long *const *words = (const unsigned long long *const *)(ctl + HL_ARMED_WORDS);
    for (unsigned long long i = 0; i < n; i++) {
        const volatile unsigned long long *w = (const volatile unsigned long long *)words[i];
        while (*w < value) {
            if (*cancel) { *gate = -1; return; }
            __nanosleep(200);
        }
    }
    if (*cancel) { *gate = -1; return; }
    __threadfence_system();
    *gate = hl_inputs_status(words, 0, 0, value, (int)n); /* (n <= HL_ARMED_MAXW: checked above) */
}

/* The last node of an armed frame's graph: the slot's timeline (ctl[SIGNAL]) advanced to the
 * frame, or failed with the gate's status, nothing when the gate is closed (-1); then the
 * frame counter steps to the slot's next frame (ctl[STEP]: the graph's frame slots), in every
 * case, so that it stays the frame of the next queued replay. */
extern "C" __global__ void hl_armed_signal(unsigned long long *ctl, const int *gate) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int g = *(volatile const int *)gate;
    unsigned long long *word = (unsigned long long *)ctl[HL_ARMED_SIGNAL];
    if (g >= 0 && word) hl_signal_word(word, 2, ctl[HL_ARMED_FRAME], g);
    ctl[HL_ARMED_FRAME] += ctl[HL_ARMED_STEP];
}

/* out[i] = src[i] when the gate is open (every input succeeded): 16-byte stores when both
 * are 16-byte aligned (the writes may cross the bus to host memory: wide stores, many in
 * flight), else 8-byte ones. */
extern "C" __global__ void hl_commit(unsigned char *out, const unsigned char *src, unsigned long long n,
                                     const int *gate) {
    if (gate && *(volatile const int *)gate != 0) return;
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long done = 0;
    if ((((unsigned long long)out | (unsigned long long)src) & 15) == 0) {
        const uint4 *s16 = (const uint4 *)src;
        uint4 *o16 = (uint4 *)out;
        unsigned long long n16 = n / 16;
        for (unsigned long long k = i; k < n16; k += step) o16[k] = s16[k];
        done = n16 * 16;
    }
    const unsigned long long *s8 = (const unsigned long long *)(src + done);
    unsigned long long *o8 = (unsigned long long *)(out + done);
    unsigned long long n8 = (n - done) / 8;
    for (unsigned long long k = i; k < n8; k += step) o8[k] = s8[k];
    for (unsigned long long k = done + n8 * 8 + i; k < n; k += step) out[k] = src[k];
}
"""
)


def _copy_blocks(n: int) -> int:
    """Blocks of 256 threads for ``hl_commit`` over ``n`` bytes: one 16-byte store per thread,
    at most 2048 blocks (they loop past that)."""
    return max(1, min(2048, (n // 16 + 255) // 256))


class _DeviceView:
    """A host buffer of a registered domain seen as GPU memory (DLPack kDLCUDA)."""

    __slots__ = ("buf", "ptr", "ordinal")

    def __init__(self, buf: Buffer, ptr: int, ordinal: int) -> None:
        self.buf, self.ptr, self.ordinal = buf, ptr, ordinal

    def __dlpack_device__(self) -> tuple[int, int]:
        return (devmem.KDL_CUDA, self.ordinal)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        return devmem.export(
            self.buf,
            self.ptr,
            self.__dlpack_device__(),
            stream=stream,
            max_version=max_version,
            dl_device=dl_device,
            copy=copy,
        )


class HostPush:
    """One follow-up push a stream makes on the host (:meth:`CudaPeer.enqueue`): its record
    lives in pinned memory until :meth:`release`, which the owner calls once the stream
    passed the push (an event recorded after it has completed)."""

    __slots__ = ("mem", "rec", "ptr")

    SIZE = 128

    def __init__(self, cp: Any) -> None:
        self.mem = cp.cuda.alloc_pinned_memory(self.SIZE)
        self.rec = np.frombuffer(self.mem, np.uint8, self.SIZE)
        self.ptr = int(self.mem.ptr)

    def state(self) -> tuple[bool, int]:
        """(ran, result): result 0 pushed, 1 not pushed (an input failed), else the push's
        error code (``HL_E_FULL``: the queue stayed full for the whole timeout)."""
        done, result = lowlevel.host_push_state(self.rec)
        return bool(done), int(result)

    def release(self) -> None:
        """Nothing to do: the pinned record goes back to CuPy's pool with the last reference."""


class CudaPeer:
    """The GPU ``device`` as a peer of ``dom``, in this process (for users who own a CUDA context)."""

    def __init__(self, dom: Domain, device: int = 0) -> None:
        cp, cu = _imports()
        self.cp, self.cu, self.dom, self.device = cp, cu, dom, device
        if not 0 <= device < cp.cuda.runtime.getDeviceCount():
            raise CudaUnavailable(f"no CUDA device {device}")
        self._dev = cp.cuda.Device(device)
        self._dev.use()
        (err, dev) = cu.cuDeviceGet(device)
        self._check(err, "cuDeviceGet")
        attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
        err, ok = cu.cuDeviceGetAttribute(attr, dev)
        self._check(err, "cuDeviceGetAttribute")
        if not ok:
            raise CudaUnavailable(
                f"GPU {device} cannot use 64-bit stream memory operations "
                "(CAN_USE_64_BIT_STREAM_MEM_OPS = 0): device-side waits on completion words need them "
                "(recent drivers enable them on Volta and later)"
            )
        self.base = lowlevel.base_address(dom)
        self.size = lowlevel.layout(dom)["size"]
        try:
            cp.cuda.runtime.hostRegister(self.base, self.size, 1 | 2)  # portable | mapped
        except cp.cuda.runtime.CUDARuntimeError as e:
            if "already registered" not in str(e).lower():
                raise CudaUnavailable(f"cannot register the domain with the GPU: {e}") from None
        err, dptr = cu.cuMemHostGetDevicePointer(self.base, 0)
        self._check(err, "cuMemHostGetDevicePointer")
        self.dbase = int(dptr)
        self.stream = cp.cuda.Stream(non_blocking=True)
        inc = os.path.dirname(abi_header_path())
        self.module = cp.RawModule(code=_KERNELS, options=(f"-I{inc}", "--std=c++14"))
        self._k_gate = self.module.get_function("hl_gate")
        self._k_signal = self.module.get_function("hl_signal")
        self._k_commit = self.module.get_function("hl_commit")
        self._k_armed_wait = self.module.get_function("hl_armed_wait")
        self._k_armed_signal = self.module.get_function("hl_armed_signal")
        self._wake_fn = cu.CUhostFn(lowlevel.host_wake_fn())
        self._push_fn = cu.CUhostFn(lowlevel.host_push_fn())
        self._closed = False
        # device arrays of the completion-word addresses of input sets seen recently (graphs
        # reuse the same sets every frame): no host-to-device copy per packet
        self._gates: OrderedDict[Any, tuple[Any, Any, Any]] = OrderedDict()

    # ------------------------------------------------------------ helpers
    @staticmethod
    def _check(err: Any, what: str) -> None:
        if int(err) != 0:
            raise HostlessError(f"{what} failed with CUDA error {int(err)} ({err})")

    def dptr(self, host_offset: int) -> int:
        """Device address of a byte of the domain mapping."""
        if not 0 <= host_offset < self.size:
            raise ValueError("offset outside the domain")
        return self.dbase + host_offset

    def buffer_dptr(self, buf: Buffer) -> int:
        """Device address of a buffer's data: in its GPU's memory for a device-resident
        buffer, the registered host mapping otherwise."""
        if getattr(buf, "device", "cpu") != "cpu":
            return devmem.device_pointer(buf)
        return self.dptr(buf.offset)

    def word_addr(self, obj: Any) -> int:
        """Device address of the completion word of a fence or timeline."""
        return self.dptr(lowlevel.completion_word_offset(self.dom, obj))

    def _cu_stream(self, stream: Any) -> Any:
        return self.cu.CUstream(int((stream or self.stream).ptr))

    # ------------------------------------------------------------- arrays
    def array(self, buf: Buffer) -> Any:
        """A CuPy array over a heap buffer, no copy: a device-resident buffer in its GPU's
        memory (:mod:`hostless.devmem`), a host buffer read over the host link."""
        if getattr(buf, "device", "cpu") != "cpu":
            return devmem.cupy_array(buf)
        cp = self.cp
        mem = cp.cuda.UnownedMemory(self.dptr(buf.offset), buf.nbytes, buf, self.device)
        return cp.ndarray(buf.shape, buf.dtype, cp.cuda.MemoryPointer(mem, 0))

    def dlpack(self, buf: Buffer) -> Any:
        """An object CUDA consumers import with no copy: ``cupy.from_dlpack(peer.dlpack(b))``,
        ``torch.from_dlpack(...)``.  A device-resident buffer is its own exporter (kDLCUDA);
        a host buffer is exported as kDLCUDA over its registered device address (CuPy and
        PyTorch refuse kDLCUDAHost), keeping ``buf`` alive while a consumer holds it."""
        if getattr(buf, "device", "cpu") != "cpu":
            return buf
        return _DeviceView(buf, self.dptr(buf.offset), self.device)

    # ------------------------------------------------------ waits/signals
    def wait(self, obj: Any, value: int = 1, stream: Any = None) -> None:
        """Make ``stream`` wait (on the GPU) until the word of ``obj`` is >= value.

        For a fence use value 1 (released by every outcome, failures too).
        """
        flag = self.cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
        self._word_op("cuStreamWaitValue64", obj, value, flag, stream)

    def wait_word(self, dptr: int, value: int, stream: Any = None) -> None:
        """Make ``stream`` wait until the u64 at device address ``dptr`` is >= value (a word of
        a heap buffer: :meth:`buffer_dptr`)."""
        cu = self.cu
        flag = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
        err = cu.cuStreamWaitValue64(
            self._cu_stream(stream), cu.CUdeviceptr(dptr), cu.cuuint64_t(value), flag
        )
        self._check(err[0] if isinstance(err, tuple) else err, "cuStreamWaitValue64")

    def write_value(self, obj: Any, value: int, stream: Any = None) -> None:
        """``cuStreamWriteValue64`` of ``value`` into the word of ``obj`` (a plain device store)."""
        flag = self.cu.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
        self._word_op("cuStreamWriteValue64", obj, value, flag, stream)

    def _word_op(self, fn: str, obj: Any, value: int, flag: Any, stream: Any) -> None:
        """Enqueue the 64-bit stream memory operation ``fn`` on the completion word of ``obj``."""
        cu = self.cu
        err = getattr(cu, fn)(
            self._cu_stream(stream), cu.CUdeviceptr(self.word_addr(obj)), cu.cuuint64_t(value), flag
        )
        self._check(err[0] if isinstance(err, tuple) else err, fn)

    def signal(
        self, obj: Any, value: int = 0, gate: Any = None, stream: Any = None, wake: bool = True
    ) -> None:
        """Signal ``obj`` from the GPU after the work queued on ``stream``: a fence SUCCESS
        (or the gate's failure), a timeline ``value`` (or failed with the gate's status)."""
        h = obj.handle if hasattr(obj, "handle") else int(obj)
        kind = 2 if handle_kind(h) == _KIND_TIMELINE else 1
        st = stream or self.stream
        gp = 0 if gate is None else int(gate.data.ptr)
        self._k_signal(
            (1,),
            (1,),
            (np.uint64(self.word_addr(h)), np.int32(kind), np.uint64(value), np.uint64(gp)),
            stream=st,
        )
        if wake:
            self.host_wake(self.word_addr(h) - self.dbase + self.base, st)

    def host_wake(self, host_addr: int, stream: Any = None) -> None:
        """After the work on ``stream``: FUTEX_WAKE the host sleepers of the word at ``host_addr``."""
        err = self.cu.cuLaunchHostFunc(self._cu_stream(stream), self._wake_fn, host_addr)
        self._check(err[0] if isinstance(err, tuple) else err, "cuLaunchHostFunc")

    def gate(self, inputs: list[Any], values: list[int] | None = None, stream: Any = None) -> Any:
        """A device int: 0 when every input succeeded, else the first failure status, computed
        on ``stream`` after its waits on the inputs.  ``values[i]``: the point a timeline input
        was waited to (a point reached before the timeline failed succeeded); default 1."""
        cp = self.cp
        st = stream or self.stream
        if not inputs:
            with st:
                return cp.zeros(1, dtype=cp.int32)
        vals = tuple(int(v) for v in values) if values is not None else (1,) * len(inputs)
        if len(vals) != len(inputs):
            raise ValueError(f"{len(vals)} values for {len(inputs)} inputs")
        addrs = tuple(self.word_addr(o) for o in inputs)
        kinds = tuple(
            2 if handle_kind(o.handle if hasattr(o, "handle") else o) == _KIND_TIMELINE else 1 for o in inputs
        )
        key = (addrs, kinds, vals, int(st.ptr))
        ent = self._gates.get(key)
        with st:  # every allocation and copy on the stream: the pool reuses memory in stream order
            if ent is None:
                ent = (
                    cp.asarray(np.array(addrs, dtype=np.uint64)),
                    cp.asarray(np.array(kinds, dtype=np.int32)),
                    cp.asarray(np.array(vals, dtype=np.uint64)),
                )
                self._gates[key] = ent
                if len(self._gates) > 512:
                    self._gates.popitem(last=False)
            else:
                self._gates.move_to_end(key)
            g = cp.empty(1, dtype=cp.int32)  # the gate kernel writes it
        self._k_gate((1,), (1,), (ent[0], ent[1], ent[2], np.int32(len(inputs)), g), stream=st)
        return g

    def commit(self, out: Buffer, scratch: Any, gate: Any, stream: Any = None) -> None:
        """Copy device ``scratch`` into heap buffer ``out`` when the gate is open."""
        n = out.nbytes
        if scratch.nbytes != n:
            raise ValueError("scratch and output sizes differ")
        self._k_commit(
            (_copy_blocks(n),),
            (256,),
            (np.uint64(self.buffer_dptr(out)), scratch, np.uint64(n), gate),
            stream=stream or self.stream,
        )

    def copy_kernel(self, dst: int, src: int, n: int, stream: int) -> None:
        """Enqueue (or capture) a copy of ``n`` bytes from device address ``src`` to ``dst`` by a
        kernel (``hl_commit`` ungated) on the stream at ``stream``: for small copies from
        registered host memory, where a kernel starts sooner than a DMA."""
        st = self.cp.cuda.ExternalStream(stream)
        args = (np.uint64(dst), np.uint64(src), np.uint64(n), np.uint64(0))
        self._k_commit((_copy_blocks(n),), (256,), args, stream=st)

    def armed_ctl(self) -> Any:
        """A fresh control block of an armed slot (device memory, zeros: not armed, a frame
        run over it passes with its gate closed); :meth:`armed_set` fills it."""
        return self.cp.zeros(len(ARMED_CTL) + ARMED_WAITS, dtype=np.uint64)

    def armed_set(
        self, ctl: Any, frame: int, step: int = 0, cancel: int = 0, signal: Any = None, waits: Any = ()
    ) -> None:
        """Write an armed slot's control block (synchronously: no frame of the slot may be
        queued): the frame its next replay runs, its step, the device address of its cancel
        flag (mapped pinned memory), the timeline it signals and those it waits on.  With
        ``step`` 0 only the frame is written (after its queued frames passed)."""
        cp = self.cp
        st = cp.cuda.Stream(non_blocking=True)
        if not step:
            i = ARMED_CTL.index("frame")
            ctl[i : i + 1].set(np.array([frame], dtype=np.uint64), stream=st)
        else:
            if len(waits) > ARMED_WAITS:
                raise ValueError(f"an armed frame waits on at most {ARMED_WAITS} timelines")
            sig = self.word_addr(signal)
            fields = {"frame": frame, "step": step, "cancel": cancel, "signal": sig, "n": len(waits)}
            vals = [fields[k] for k in ARMED_CTL] + [self.word_addr(t) for t in waits]
            vals += [0] * (ARMED_WAITS - len(waits))
            ctl.set(np.array(vals, dtype=np.uint64), stream=st)
        st.synchronize()

    def armed_wait(self, ctl: Any, gate: Any, stream: Any) -> None:
        """Enqueue (or capture) an armed frame's wait on its predecessors (``hl_armed_wait``)."""
        self._k_armed_wait((1,), (1,), (ctl, gate), stream=stream)

    def armed_signal(self, ctl: Any, gate: Any, stream: Any) -> None:
        """Enqueue (or capture) an armed frame's gated signal and frame step (``hl_armed_signal``)."""
        self._k_armed_signal((1,), (1,), (ctl, gate), stream=stream)

    def enqueue(
        self,
        queue: Any,
        packet_buf: Buffer,
        gate: Any = None,
        stream: Any = None,
        offset: int = 0,
        timeout: float = 10.0,
    ) -> HostPush:
        """After the work on ``stream``, push the packet that lies at byte ``offset`` of the
        heap buffer ``packet_buf`` (a packet buffer, or the follow-up record of an argument
        block) into ``queue`` and ring its doorbell, unless the device int ``gate`` (from
        :meth:`gate`) says an input failed.  The push is made on the host, by CUDA's callback
        thread, with the host's atomics (see the module's docstring); a full queue is waited
        for up to ``timeout`` seconds.  The packet is read when the push runs: the buffer must
        stay allocated and unchanged until then.  Returns the push's :class:`HostPush`
        (its result once the stream passed it).  ValueError when the packet does not lie
        8-byte aligned inside a host buffer."""
        cp = self.cp
        if getattr(packet_buf, "device", "cpu") != "cpu":
            raise ValueError("a packet to push must lie in a host buffer")
        if offset < 0 or offset % 8 or offset + int(C.PACKET_SIZE) > packet_buf.nbytes:
            raise ValueError(f"no packet at offset {offset} of a {packet_buf.nbytes}-byte buffer")
        if not timeout >= 0 or timeout > 3600:
            raise ValueError(f"timeout must be in [0, 3600] seconds, not {timeout!r}")
        st = stream or self.stream
        qaddr, cells, packets, cap = lowlevel.queue_view(self.dom, queue)  # validated on the host
        push = HostPush(cp)
        gate_at = lowlevel.host_push_fill(
            push.rec,
            qaddr,
            cells,
            packets,
            cap,
            self.base + packet_buf.offset + offset,
            lowlevel.doorbell_address(self.dom, queue),
            int(C.PRODUCER_DEVICE_BASE) + (self.dom.participant_id & 0xFF),
            int(timeout * 1e9),
        )
        if gate is not None:  # the stream copies the gate in before the push runs
            cp.cuda.runtime.memcpyAsync(push.ptr + gate_at, int(gate.data.ptr), 4, 2, int(st.ptr))
        err = self.cu.cuLaunchHostFunc(self._cu_stream(st), self._push_fn, push.ptr)
        self._check(err[0] if isinstance(err, tuple) else err, "cuLaunchHostFunc")
        return push

    def close(self) -> None:
        """Unregister the domain (after synchronizing the stream)."""
        if self._closed:
            return
        self._closed = True
        self.stream.synchronize()
        try:
            self.cp.cuda.runtime.hostUnregister(self.base)
        except Exception:
            pass

    def __enter__(self) -> CudaPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
