"""The GPU command processor: a resident kernel that serves a hostless queue.

``agents.spawn(dom, "gpucp", device=0)`` starts an agent process that
registers the domain with the GPU, compiles ``gpucp.cu`` (with
``hostless.h``) through NVRTC and launches it once, as one block of 256
threads on its own stream.  From then on the GPU takes the queue's packets
itself: it waits for their inputs on the completion words, runs the kernel
(built-in float32 kernels, by the cpu kernels' ids: copy, add, scale, relu,
gemm, sum, softmax, normalize), signals, and pushes the follow-up packets into
their queues (the next GPU stage's, or a CPU agent's), with no host launch or
wake-up per packet.  The host process only watches: the spawner's death, a
STOP packet (the kernel leaves by itself) or SIGTERM (it sets the control
word the kernel polls, then waits for it to leave).  A host process killed
outright takes its CUDA context, and the kernel, with it; the domain's
recovery marks its fences OWNER_DIED like any participant's.

The control block is a small heap buffer (the GPU reads and writes it over the
host link): stop, state, packets taken, packets failed, the last failure
(packet index and reason), a heartbeat.  Statistics are readable from the
spawner with :func:`read_ctl`.

Isolation: the kernel runs as one block (a bounded grid) in the device's
primary context next to other CUDA work; green contexts (an SM partition of
its own) are not used yet.  Not supported yet: ERT packets, buffers of
another GPU's heap, dtypes other than float32 (copy takes any), conv2d.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from .. import devmem, lowlevel
from ..domain import Domain
from ..errors import HostlessError
from ..queue import Queue

__all__ = ["GpuCommandProcessor", "GPUCP_KERNEL_NAMES", "CTL_FIELDS", "read_ctl"]

GPUCP_KERNEL_NAMES = ("copy", "add", "scale", "relu", "gemm", "sum", "softmax", "normalize")
CTL_FIELDS = ("stop", "state", "packets", "failed", "last_error", "heartbeat")
REASONS = {0: "ok", 1: "an input failed", 2: "unknown kernel or packet type", 3: "bad argument block",
           4: "a buffer handle names no live buffer here", 5: "shapes do not fit", 6: "not float32"}
_STATE_RUNNING, _STATE_LEFT, _STATE_ATTACH_FAILED = 1, 2, 3


def read_ctl(words: np.ndarray) -> dict[str, int]:
    """The control block's fields by name (``words``: its 8 u64 words)."""
    return {k: int(words[i]) for i, k in enumerate(CTL_FIELDS)}


class GpuCommandProcessor:
    """The host half of a GPU command processor (see the module doc)."""

    def __init__(self, dom: Domain, queue: Queue, parent: int, device: int, ctl_handle: int = 0) -> None:
        from ..cuda import CudaPeer

        self.dom, self.queue, self.parent, self.device = dom, queue, parent, device
        self.peer = CudaPeer(dom, device)
        cp = self.cp = self.peer.cp
        from .. import abi_header_path

        inc = os.path.dirname(abi_header_path())
        src = open(os.path.join(os.path.dirname(__file__), "gpucp.cu")).read()
        self.module = cp.RawModule(code=src, options=(f"-I{inc}", "--std=c++14"))
        self.kernel = self.module.get_function("hl_cp_main")
        # the control block: a heap buffer the spawner may name (so it can read it)
        self.ctl_buf = dom.import_buffer(ctl_handle) if ctl_handle else dom.buffer((8,), np.uint64)
        self.ctl = self.ctl_buf.numpy().view(np.uint64)
        self.ctl[...] = 0
        va = np.zeros(8, dtype=np.uint64)
        for h in lowlevel.device_heaps(dom):
            if h.ordinal == device and h.heap_index < 8:
                va[h.heap_index] = devmem.backing(dom, h.name).va
        self.dh_va = cp.asarray(va)
        self.stream = cp.cuda.Stream(non_blocking=True)

    def start(self) -> None:
        """Launch the resident kernel; returns once it attached (or raises why not)."""
        layout = lowlevel.layout(self.dom)
        self.kernel(
            (1,),
            (256,),
            (
                np.uint64(self.peer.dbase),
                np.uint64(layout["size"]),
                np.uint64(self.queue.handle),
                self.dh_va,
                np.uint64(self.peer.dptr(self.ctl_buf.offset)),
            ),
            stream=self.stream,
        )
        deadline = time.monotonic() + 30
        while int(self.ctl[1]) == 0:
            if time.monotonic() > deadline or self.stream.done:
                raise HostlessError(f"the GPU command processor did not start (state {int(self.ctl[1])})")
            time.sleep(1e-4)
        if int(self.ctl[1]) == _STATE_ATTACH_FAILED:
            raise HostlessError("the GPU command processor could not attach to the domain or open its queue")

    def run(self, poll: float = 0.01) -> None:
        """Watch until the kernel leaves (STOP), the spawner dies, or an exception
        (SIGTERM's SystemExit) ends the wait; the kernel has left on return."""
        try:
            while not self.stream.done:
                if self.parent and os.getppid() != self.parent:
                    break  # the spawner died (we were reparented), as the agent loops check it
                time.sleep(poll)
        finally:
            self.stop()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the kernel to leave and wait for it (it checks between packets and in waits)."""
        self.ctl[0] = 1
        deadline = time.monotonic() + timeout
        while not self.stream.done and time.monotonic() < deadline:
            time.sleep(1e-3)
        if self.stream.done:
            self.stream.synchronize()

    def stats(self) -> dict[str, Any]:
        st: dict[str, Any] = dict(read_ctl(self.ctl))
        st["last_reason"] = REASONS.get(st["last_error"] & 0xFFFF, "?")
        return st

    def close(self) -> None:
        self.ctl_buf.release()
        self.peer.close()

