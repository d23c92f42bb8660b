# Type stub of the C extension (core/*.c + binding/*.c).  Constants are the ABI's values.
from typing import Any, TypeVar

_T = TypeVar("_T")

def __getattr__(name: str) -> Any: ...
def layout(
    fences: int, participants: int, queues: int, trace: int, heap: int, device_heaps: Any = None
) -> dict[str, int]: ...
def handle_method(i: int) -> Any: ...
def agent_table(kind: int, c_kernels: int = 0, /) -> tuple[int, bytes]: ...
def blas_probe(path: str | None, threads: int = 0, /) -> tuple[bool, str]: ...
def set_status(cls: type, members: dict[int, Any]) -> None: ...
def status_valid(s: int) -> bool: ...
def dlpack_capsule(
    owner: Any, data: int, shape: tuple[int, ...], code: int, bits: int,
    device_type: int, device_id: int, versioned: bool, readonly: bool,
) -> Any: ...
# test hooks: device_store(core, h, word), queue_reserve_stuck(core, q, sig),
# heap_lock_forever(core[, device]), device_buffer_stuck(core, device, nbytes, stage)
testing: Any

class Core:
    def __init__(self) -> None: ...
    def __getattr__(self, name: str) -> Any: ...
    def agent_run(
        self, queue: int, spin_ns: int, wait_timeout_ns: int, follow_timeout_ns: int, parent: int,
        kernel: Any, record: Any, c_kernels: int, kind: int = 0, present: int = 0,
        kernel_map: bytes = b"", cu: Any = None, blas_path: str | None = None, blas_threads: int = 0,
        fixed_spin: int = 0, idle_nap_ns: int = 0, /
    ) -> dict[str, Any]: ...

class Handle:
    handle: int
    _held: bool
    _dom: Any
    _core: Any
    _window_len: int
    _window_off: int
    _device: int
    def __new__(cls, *args: Any, **kwargs: Any) -> Any: ...
    def release(self) -> None: ...
    def __enter__(self: _T) -> _T: ...
    def __exit__(self, *exc: object) -> None: ...
    def _set_window(
        self,
        map: Any,
        offset: int,
        length: int,
        readonly: bool,
        fmt: str = ...,
        itemsize: int = ...,
        shape: Any = ...,
    ) -> None: ...

FOP_STORE: int
FOP_PUSH: int
FOP_COPY: int
FOP_WAIT: int

class FrameProgram:
    """A frame program (binding/frame.c): validated at construction, run per frame."""

    nops: int
    def __init__(self, core: Core, ops: Any, watch: Any, slice_ns: int, /) -> None: ...
    def run(self, frame: int, timeout_ns: int, /) -> tuple[Any, ...] | None: ...
    def bind_io(self, inputs: Any, outputs: Any, idents: Any, ndarray: type, /) -> None: ...
    def frame(self, inputs: Any, frame: int, timeout: float | None, /) -> Any: ...
