"""How much heap a compiled graph takes, and the refusal of one that cannot fit.

A compiled graph allocates, in the domain's heaps (:meth:`hostless.Domain.create`'s
``heap`` and ``device_heaps``):

* its tensors: the constants once; per frame in flight (``inflight`` slots), in
  shared mode every graph input and stage output where :func:`hostless.placement.place_tensors`
  puts it, in copy mode every stage's private inputs and output in host memory;
* per slot, in the host heap, its packets' argument blocks (and an NPU's ERT
  commands, the two bytes relay packets copy).

Each allocation takes a whole block (the rules of ``hle_block_new`` in
``core/heap.c``, constants from the ABI headers through :mod:`hostless._abi`): in
the host heap a 128-byte metadata head and the data rounded up to 64-byte granules,
or a page and whole pages from 64 KiB up; in a device heap the data rounded up to
256 bytes, and its metadata block in the host heap.  :func:`needs` adds these up
before anything is allocated, exactly as the graph's build allocates them (a test
compares it with the heap's used bytes), :func:`check_fits` refuses a graph whose
needs exceed a heap's free bytes with :class:`~hostless.graph.GraphTooLarge`, which
says the size to create the domain with.  A heap whose free bytes are scattered in
runs too small for a large tensor still fails the allocation itself: compile then
releases what it allocated and raises the same error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from . import ert
from ._abi import C
from .dag import Dag
from .graphparts import GraphTooLarge
from .wire import FOLLOW_SIZE, KERNARG_SIZE

if TYPE_CHECKING:
    from .domain import Domain

__all__ = [
    "HeapNeeds",
    "host_block_bytes",
    "device_block_bytes",
    "needs",
    "room",
    "check_fits",
    "too_large",
    "fmt_bytes",
]

_GRANULE, _PAGE, _LARGE = int(C.GRANULE), int(C.PAGE), int(C.LARGE_BUFFER)
_META, _DGRANULE = int(C.BUFFER_META_SIZE), int(C.DEVICE_GRANULE)
_MIB = 1 << 20


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


def host_block_bytes(nbytes: int) -> int:
    """The host heap bytes a buffer of ``nbytes`` takes (its block: head and data)."""
    if nbytes >= _LARGE:
        return _PAGE + _up(nbytes, _PAGE)
    return _META + _up(max(nbytes, 1), _GRANULE)


def device_block_bytes(nbytes: int) -> int:
    """The device heap bytes a device buffer of ``nbytes`` takes (its metadata block, in the
    host heap, is :data:`BUFFER_META_SIZE <hostless._abi.C>` more there)."""
    return _up(max(nbytes, 1), _DGRANULE)


def fmt_bytes(n: float) -> str:
    """``1.5 MiB``, ``12.0 KiB``, ``96 B``."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


@dataclass
class HeapNeeds:
    """What a compiled graph takes, per heap ("cpu": the shared host heap, "cuda:N").

    ``tensor_bytes``: each tensor's data bytes; ``tensors``: per heap, the blocks of
    every tensor allocation (constants once, the rest per slot; the host heap also
    holds device buffers' metadata); ``packets``: host heap bytes of the slots'
    packets."""

    inflight: int
    tensor_bytes: dict[str, int] = field(default_factory=dict)
    tensors: dict[str, int] = field(default_factory=dict)
    packets: int = 0

    @property
    def heaps(self) -> dict[str, int]:
        """Total bytes per heap."""
        out = dict(self.tensors)
        out["cpu"] = out.get("cpu", 0) + self.packets
        return out

    def describe(self, heap: str) -> str:
        """``131.2 MiB (tensors 131.1 MiB for 2 frames in flight, packets 12.0 KiB)``."""
        total = self.heaps.get(heap, 0)
        parts = f"tensors {fmt_bytes(self.tensors.get(heap, 0))} for {self.inflight} frame(s) in flight"
        if heap == "cpu":
            parts += f", packets {fmt_bytes(self.packets)}"
        return f"{fmt_bytes(total)} ({parts})"


def needs(
    stages: Sequence[Any],
    inputs: Mapping[str, tuple[tuple[int, ...], np.dtype]],
    constants: Mapping[str, np.ndarray],
    place: Mapping[str, str],
    dag: Dag,
    dispatch: str,
    data: str,
    inflight: int,
) -> HeapNeeds:
    """The heap bytes a graph compiled with these choices allocates (see the module).

    ``stages``: the graph's :class:`~hostless.graph.Stage` list (agent, kernel, inputs,
    output, shape, dtype, scalars); ``place``: each tensor's device ("cpu" or "cuda:N")."""
    out = HeapNeeds(inflight)
    shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = dict(inputs)
    shapes.update((n, (tuple(a.shape), a.dtype)) for n, a in constants.items())
    shapes.update((s.output, (tuple(s.shape), np.dtype(s.dtype))) for s in stages)
    out.tensor_bytes = {n: math.prod(shp) * np.dtype(dt).itemsize for n, (shp, dt) in shapes.items()}

    def add(name: str, where: str, times: int) -> None:
        nb = out.tensor_bytes[name]
        if where == "cpu":
            out.tensors["cpu"] = out.tensors.get("cpu", 0) + times * host_block_bytes(nb)
        else:
            out.tensors[where] = out.tensors.get(where, 0) + times * device_block_bytes(nb)
            out.tensors["cpu"] = out.tensors.get("cpu", 0) + times * _META

    for n in constants:
        add(n, place[n], 1)
    if data == "shared":
        for n in list(inputs) + [s.output for s in stages]:
            add(n, place[n], inflight)
    else:
        for s in stages:
            for i in s.inputs:
                add(i, "cpu", inflight)
            add(s.output, "cpu", inflight)
    out.packets = inflight * _slot_packets(stages, dag, dispatch, data)
    return out


def _packet(agent: Any, nbuf: int, nscalars: int, nfollow: int) -> int:
    """Host heap bytes of one packet on ``agent``: its argument block (and ERT command)."""
    if agent.spec.ert:  # the command names the buffers, the block names the command
        cmd = len(ert.start_cu(0, ert.cu_args([0] * nbuf, [0] * nscalars)).encode())
        return host_block_bytes(cmd) + host_block_bytes(KERNARG_SIZE + 8 + FOLLOW_SIZE * nfollow)
    return host_block_bytes(KERNARG_SIZE + 8 * (nbuf + nscalars) + FOLLOW_SIZE * nfollow)


def _slot_packets(stages: Sequence[Any], dag: Dag, dispatch: str, data: str) -> int:
    """One slot's packets, as ``CompiledGraph._build_packets`` makes them."""
    direct, total, relays = dispatch == "direct", 0, False
    for k, s in enumerate(stages):
        succs = dag.succs[k]
        pushed = [j for j in succs if dag.pusher(j) == k]
        nfollow = (1 if data == "copy" and succs else len(pushed)) if direct else 0
        nscalars = len(s.scalars) if isinstance(s.kernel, str) else 0
        total += _packet(s.agent, len(s.inputs) + 1, nscalars, nfollow)
        if direct and data == "copy":  # a copy packet per edge out of k, chained: the first
            edges = sum(1 for j in succs for i in stages[j].inputs if i == s.output)  # built, last run
            if edges:  # carries the pushed successors, each other one the copy before it
                total += _packet(s.agent, 2, 0, len(pushed)) + (edges - 1) * _packet(s.agent, 2, 0, 1)
        if direct and dag.preds[k]:  # relays on the pusher for the waits past the packet's own
            groups = dag.relay_groups(k)
            if groups:
                pusher = stages[dag.pusher(k) or 0].agent
                total += groups * _packet(pusher, 2, 0, 1)
                relays = True
    if relays:  # the slot's two one-byte buffers relays copy between
        total += 2 * host_block_bytes(1)
    return total


def room(dom: Domain, heap: str) -> tuple[int, int]:
    """(free, size) bytes of ``dom``'s heap ``heap`` for a graph's buffers: a domain created
    without ``heap`` has none in the host heap (its small heap, when it has device heaps,
    holds only the device buffers' metadata)."""
    if heap == "cpu" and not dom.capacity["heap"]:
        return 0, 0
    st = dom.heap_stats(heap)
    return int(st.get("free", 0)), int(st.get("size", 0))


def check_fits(dom: Domain, need: HeapNeeds, what: str) -> None:
    """Raise GraphTooLarge when a heap of ``dom`` has fewer free bytes than ``need`` says the
    graph takes there; ``what``: the compile's choices, for the message."""
    for heap, want in need.heaps.items():
        free, size = room(dom, heap)
        if want > free:
            raise too_large(heap, want, free, size, need, what)


def too_large(heap: str, want: int, free: int, size: int, need: HeapNeeds, what: str) -> GraphTooLarge:
    """The error for ``heap`` holding ``free`` of ``size`` bytes when the graph needs ``want``."""
    used = max(size - free, 0)
    if heap == "cpu":
        mib = _up(used + want, _MIB) // _MIB + 1  # what others use now, the graph, a block's slack
        how = f'Domain.create(name, heap="{mib}M")'
        where = "the shared heap"
    else:
        mib = _up(used + want, 2 * _MIB) // _MIB  # device heaps come in 2 MiB steps
        how = f'Domain.create(name, device_heaps={{"{heap}": "{mib}M"}})'
        where = f"the device heap {heap}"
    msg = (
        f"this graph ({what}) needs {need.describe(heap)} of {where}, which has {fmt_bytes(free)} free "
        f"of {fmt_bytes(size)}: create the domain with room for it, e.g. {how}"
    )
    if need.inflight > 1:
        msg += f", or compile with fewer frames in flight (inflight=1: ~1/{need.inflight} of the tensors)"
    if "data=copy" in what:
        msg += ', or with data="shared" (one buffer per tensor instead of a private copy per reader)'
    msg += "; cg.plan() of a compiled graph lists the bytes of each tensor"
    return GraphTooLarge(msg, heap=heap, needed=want, free=free, size=size)
