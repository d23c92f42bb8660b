"""Errors raised by hostless.  Every error is a :class:`HostlessError`."""

from __future__ import annotations

__all__ = [
    "HostlessError",
    "CorruptDomain",
    "DomainVersionMismatch",
    "DomainFull",
    "DomainExists",
    "InvalidHandle",
    "AlreadySignaled",
    "InvalidOperation",
    "OutOfMemory",
    "DeviceHeapFull",
    "DeviceBufferError",
    "DomainClosed",
    "QueueFull",
    "NameTaken",
    "HostlessWarning",
    "DeviceAtomicsWarning",
    "WritableDomainWarning",
    "DeviceHeapUnavailable",
    "CudaUnavailable",
    "UnsafeRuntimeDirectory",
    "UntrustedPeer",
    "ChannelError",
    "ChannelClosed",
    "ChannelFull",
    "CorruptChannel",
    "FrameOverwritten",
    "SlowSubscriber",
    "SubscriberNameTaken",
]


class HostlessError(Exception):
    """Base class of every hostless error."""


class CorruptDomain(HostlessError):
    """The file is not a domain of this ABI: bad magic, version, sizes or tables."""


class DomainVersionMismatch(CorruptDomain):
    """The domain was created by a hostless of another ABI version (older or newer) than this
    one (``hostless.ABI_VERSION``), so its layout cannot be trusted and it is not joined.  The
    message gives both versions and what to do: use the release that created it (CHANGELOG.md
    lists each release's ABI version), or remove the domain and create it again.  A subclass of
    :class:`CorruptDomain`, which earlier releases raised."""


class DomainFull(HostlessError):
    """A fixed-capacity table of the domain (fences, participants, queues) is exhausted."""


class DomainExists(HostlessError, FileExistsError):
    """``Domain.create``: the name is taken (a FileExistsError, as before).  The message says
    whether a live domain, a stale one or another file holds it, and what to do:
    ``replace_stale=True`` replaces a domain no live participant uses; ``hostless gc`` removes
    every such domain; ``hostless ls`` lists them."""


class InvalidHandle(HostlessError, ValueError):
    """A handle is stale (its object was released), forged, foreign or not held."""


class AlreadySignaled(HostlessError):
    """A fence was signaled twice, or a failed timeline was signaled or failed again."""


class InvalidOperation(HostlessError):
    """The operation does not apply to this object (for example signaling a merged fence)."""


class OutOfMemory(HostlessError, MemoryError):
    """The shared heap cannot satisfy an allocation."""


class DeviceHeapFull(OutOfMemory):
    """A device heap (``"cuda:N"``) cannot satisfy an allocation; the message names the device
    and its free space."""


class DeviceBufferError(HostlessError, BufferError):
    """Host access (NumPy, the buffer protocol, ``copy_to``) to a buffer whose data lives in
    GPU memory.  Copy it with ``to_host()``, or hand it to a GPU library through DLPack."""


class DomainClosed(InvalidOperation):
    """The domain (or the object's domain) was closed, or belongs to the parent of a fork."""


class QueueFull(HostlessError, TimeoutError):
    """A queue stayed full for the whole timeout (no packet was dropped or overwritten)."""


class NameTaken(HostlessError, KeyError):
    """A name of the domain's name table is published already, for another live object."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class HostlessWarning(UserWarning):
    """Base class of the warnings hostless gives (a risky but allowed choice)."""


class WritableDomainWarning(HostlessWarning):
    """An agent that runs the spawner's code (a Python cpu agent, or one given user
    kernels) was spawned on a domain that other users may write: they can push
    packets into its queue, so they can run the kernels it has loaded on buffers of
    their choice (never load new code: that goes only through the spawner's private
    channel).  Create the domain with ``mode=0o600`` (the default) to keep them out, or
    filter this warning if the sharing is intended."""


class DeviceAtomicsWarning(HostlessWarning):
    """A GPU command processor (``gpucp``) told to push its follow-ups itself
    (``HOSTLESS_GPUCP_PUSHES=device``) on a GPU without host-native atomics
    (``cudaDevAttrHostNativeAtomicSupported`` = 0: a PCIe-attached GPU here).  The GPU's atomics
    on host memory are not atomic against the host's there: a push into a queue that host
    producers also push into at the same moment can be lost, or make the queue's cells
    contradict its write index (``CorruptDomain``).  Leave the variable unset: on such a GPU
    the processor hands its follow-ups to a host thread of its process, which pushes them."""


class DeviceHeapUnavailable(HostlessError):
    """A device heap's allocation could be neither fetched from a trusted holder nor created
    within the timeout: a holder of this user accepted but never answered (stopped or hung:
    the message names its pid), or another process held the creation lock throughout.
    Resume or end the process named, then retry."""


class UnsafeRuntimeDirectory(HostlessError, PermissionError):
    """The private directory where a user's processes exchange device-heap descriptors is
    not private: a symbolic link, not a directory, owned by another user, or open to group
    or others.  Another user may have created it first; the message names it and its owner:
    remove it (as its owner or root) and retry."""


class UntrustedPeer(HostlessWarning):
    """A device-heap peer (a holder's socket, or a client of ours) whose process runs as
    another user: refused and skipped, the rest carries on.  The message names its pid and
    uid (``Broker.rejected`` keeps the record); if that process should share the heap, run
    it as the same user."""


class CudaUnavailable(HostlessError):
    """CUDA support cannot be used here (missing packages, no GPU, missing capability)."""


class ChannelError(HostlessError):
    """Base class of the errors of :mod:`hostless.channel` (one publisher, many subscribers)."""


class ChannelClosed(ChannelError):
    """The channel's publisher closed it or died: every frame it published has been received.
    Subscribe again once a new publisher has created the channel."""


class ChannelFull(ChannelError, DomainFull):
    """A channel has its maximum number of subscribers (``hostless.channel.MAX_SUBSCRIBERS``), or
    the domain's name table (one entry per subscriber) is full: close a subscriber, or unpublish
    names the domain no longer needs."""


class CorruptChannel(ChannelError, CorruptDomain):
    """What the name table holds under a channel's name is not a channel descriptor of this
    version (garbage written by a buggy or hostile participant, or another object): the message
    says which field is wrong."""


class FrameOverwritten(ChannelError):
    """A frame was overwritten by the publisher while a subscriber with the ``"skip"`` policy
    read it: what the ``with`` block computed from it may be torn, discard it (the frame is
    acknowledged; the next ``receive()`` skips to the newest frame)."""


class SlowSubscriber(ChannelError, TimeoutError):
    """``Channel.loan`` waited its whole timeout for subscribers with the ``"block"`` policy to
    release the slot it needs; the message names them.  Nothing was published; retry, raise the
    timeout, or give those subscribers the ``"skip"`` policy."""


class SubscriberNameTaken(ChannelError, NameTaken):
    """A live subscriber of the channel already has this subscriber name: pick another name, or
    close that subscriber first (a dead one is taken over: its replacement resumes after the
    last frame it acknowledged)."""
