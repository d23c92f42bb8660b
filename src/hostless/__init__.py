"""hostless: peer-to-peer fences, timelines, buffers and queues for heterogeneous machines.

The host sets a pipeline up once; CPU processes, GPUs, an NPU and firmware-like
programs then synchronize through one shared-memory domain::

    import hostless as hl

    with hl.Domain.create("demo", unlink_on_close=True) as dom:
        f = dom.fence()
        ...            # hand f.handle to another process: dom.import_fence(handle)
        f.signal()
"""

from __future__ import annotations

# The package's modules import in one direction (the layers of pyproject.toml's import-linter
# contract, checked by `make test`); this facade sits on top.  devmem is imported for its
# registration: it installs what device buffers' DLPack export and copies run.
from importlib import metadata as _metadata

from . import devmem as devmem
from . import trace as trace  # hl.trace.span / hl.trace.instant
from ._abi import C as _C
from ._abi import abi_header_path, get_include
from .buffer import Buffer, PrivateBuffer
from .channel import Channel, Frame
from .domain import Domain, Participant, parse_size
from .errors import (
    AlreadySignaled,
    ChannelClosed,
    ChannelError,
    ChannelFull,
    CorruptChannel,
    CorruptDomain,
    DeviceBufferError,
    DeviceHeapFull,
    DomainClosed,
    DomainExists,
    DomainFull,
    DomainVersionMismatch,
    FrameOverwritten,
    HostlessError,
    InvalidHandle,
    InvalidOperation,
    NameTaken,
    OutOfMemory,
    QueueFull,
    SlowSubscriber,
    SubscriberNameTaken,
)
from .fence import Fence
from .interop import ExternalBuffer, dma_heap_buffer, export_buffer, memfd_buffer, recv_fds, send_fds
from .poller import Poller, Ready
from .queue import Follow, Kernargs, Packet, PacketType, Queue
from .status import Status
from .subscriber import Subscriber
from .timeline import Point, Timeline
from .waits import Completed, WaitSet, packet_waits, wait_all, wait_all_async, wait_any, wait_any_async

try:  # one home: pyproject.toml's [project] version, as the installed distribution records it
    __version__: str = _metadata.version("hostless")
except _metadata.PackageNotFoundError:  # sources on sys.path without an install
    __version__ = "0+unknown"
#: The shared layout's version (HL_ABI_VERSION of hostless_layout.h): a process joins only
#: domains of this version (others raise DomainVersionMismatch); CHANGELOG.md lists it per release.
ABI_VERSION: int = int(_C.ABI_VERSION)

__all__ = [
    "Domain",
    "Participant",
    "Fence",
    "Timeline",
    "Point",
    "Completed",
    "wait_any",
    "wait_all",
    "wait_any_async",
    "WaitSet",
    "wait_all_async",
    "packet_waits",
    "Poller",
    "Ready",
    "Buffer",
    "Channel",
    "Subscriber",
    "Frame",
    "ChannelError",
    "ChannelClosed",
    "ChannelFull",
    "CorruptChannel",
    "FrameOverwritten",
    "SlowSubscriber",
    "SubscriberNameTaken",
    "Queue",
    "Packet",
    "PacketType",
    "Kernargs",
    "Follow",
    "QueueFull",
    "PrivateBuffer",
    "ExternalBuffer",
    "memfd_buffer",
    "dma_heap_buffer",
    "export_buffer",
    "send_fds",
    "recv_fds",
    "Status",
    "HostlessError",
    "CorruptDomain",
    "DomainFull",
    "DomainExists",
    "DomainClosed",
    "InvalidHandle",
    "AlreadySignaled",
    "InvalidOperation",
    "OutOfMemory",
    "DeviceBufferError",
    "DeviceHeapFull",
    "NameTaken",
    "parse_size",
    "abi_header_path",
    "get_include",
    "ABI_VERSION",
    "DomainVersionMismatch",
    "trace",
]

