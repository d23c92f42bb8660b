"""XRT ERT command buffers, bit-exact (the NPU's command-submission format).

Header word (u32): state[3:0] | custom[11:4] | count[22:12] (payload words)
| opcode[27:23] | type[31:28].  ``ert_start_kernel_cmd``: header, cu_mask,
then ``count - 1`` data words.  START_NPU payload: instruction buffer address
(u64), its size (u32), property count (u32), then kernel arguments.
CMD_CHAIN (``ert_cmd_chain_data``, as XRT and the amdxdna driver define it)
has no cu_mask: its payload follows the header at once: command count,
submit index, error index, three reserved words, then the u64 handles of the
chained commands.  The state is written back into the header word by the
command processor (NEW -> RUNNING -> COMPLETED / ERROR).

This module encodes.  The format and its one decoder live in the ABI header
``hostless_ert.h`` (``HL_ERT_*`` constants, ``hl_ert_check``,
``hl_ert_cu_args``, ``hl_ert_chain``, ...), which the native command
processor (``core/agent_ert.c``) and the GPU's (``agents/gpucp.cu``) use too;
every decoding function here (:meth:`ErtCommand.decode`, :func:`parse_header`,
:func:`parse_cu_args`, :func:`chain_handles`, :func:`set_state`) calls it
through the extension, so a command decodes the same everywhere.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._abi import C

__all__ = [
    "Opcode",
    "CmdType",
    "State",
    "ErtCommand",
    "header",
    "parse_header",
    "start_cu",
    "start_npu",
    "cmd_chain",
    "has_cu_mask",
    "u64_args",
    "cu_args",
    "parse_cu_args",
    "chain_handles",
    "set_state",
    "CHAIN_HEADER_WORDS",
    "CHAIN_SUBMIT_WORD",
    "CHAIN_ERROR_WORD",
    "NPU_FIXED_WORDS",
    "MAX_BYTES",
]


class Opcode(enum.IntEnum):
    START_CU = int(C.ERT_START_CU)
    CONFIGURE = int(C.ERT_CONFIGURE)
    EXIT = int(C.ERT_EXIT)
    ABORT = int(C.ERT_ABORT)
    EXEC_WRITE = int(C.ERT_EXEC_WRITE)
    CU_STAT = int(C.ERT_CU_STAT)
    START_COPYBO = int(C.ERT_START_COPYBO)
    START_DPU = int(C.ERT_START_DPU)
    CMD_CHAIN = int(C.ERT_CMD_CHAIN)
    START_NPU = int(C.ERT_START_NPU)
    START_NPU_PREEMPT = int(C.ERT_START_NPU_PREEMPT)


class CmdType(enum.IntEnum):
    DEFAULT = int(C.ERT_TYPE_DEFAULT)
    KDS_LOCAL = int(C.ERT_TYPE_KDS_LOCAL)
    CTRL = int(C.ERT_TYPE_CTRL)
    CU = int(C.ERT_TYPE_CU)
    SCU = int(C.ERT_TYPE_SCU)


class State(enum.IntEnum):
    INVALID = int(C.ERT_STATE_INVALID)
    NEW = int(C.ERT_STATE_NEW)
    QUEUED = int(C.ERT_STATE_QUEUED)
    RUNNING = int(C.ERT_STATE_RUNNING)
    COMPLETED = int(C.ERT_STATE_COMPLETED)
    ERROR = int(C.ERT_STATE_ERROR)
    ABORT = int(C.ERT_ABORT)
    SUBMITTED = int(C.ERT_STATE_SUBMITTED)
    TIMEOUT = int(C.ERT_STATE_TIMEOUT)
    NORESPONSE = int(C.ERT_STATE_NORESPONSE)
    SKERROR = int(C.ERT_STATE_SKERROR)
    SKCRASHED = int(C.ERT_STATE_SKCRASHED)


MAX_BYTES = int(C.ERT_MAX_BYTES)
"""The longest command: a header's count is 11 bits."""


_STATE_SHIFT, _STATE_MASK = int(C.ERT_STATE_SHIFT), int(C.ERT_STATE_MASK)
_CUSTOM_SHIFT, _CUSTOM_MASK = int(C.ERT_CUSTOM_SHIFT), int(C.ERT_CUSTOM_MASK)
_COUNT_SHIFT, _COUNT_MASK = int(C.ERT_COUNT_SHIFT), int(C.ERT_COUNT_MASK)
_OPCODE_SHIFT, _OPCODE_MASK = int(C.ERT_OPCODE_SHIFT), int(C.ERT_OPCODE_MASK)
_TYPE_SHIFT, _TYPE_MASK = int(C.ERT_TYPE_SHIFT), int(C.ERT_TYPE_MASK)


def header(state: int, count: int, opcode: int, type_: int = CmdType.CU, custom: int = 0) -> int:
    """Pack an ERT header word; ValueError when a field overflows."""
    if (
        not 0 <= state <= _STATE_MASK
        or not 0 <= custom <= _CUSTOM_MASK
        or not 0 <= count <= _COUNT_MASK
        or not 0 <= opcode <= _OPCODE_MASK
        or not 0 <= type_ <= _TYPE_MASK
    ):
        raise ValueError("ERT header field out of range")
    return (
        (state << _STATE_SHIFT)
        | (custom << _CUSTOM_SHIFT)
        | (count << _COUNT_SHIFT)
        | (opcode << _OPCODE_SHIFT)
        | (type_ << _TYPE_SHIFT)
    )


def parse_header(word: int) -> tuple[int, int, int, int, int]:
    """(state, custom, count, opcode, type) of a header word (hostless_ert.h)."""
    state, custom, count, opcode, type_ = C.ert_header(word & 0xFFFFFFFF)
    return int(state), int(custom), int(count), int(opcode), int(type_)


def has_cu_mask(opcode: int) -> bool:
    """Whether a command with ``opcode`` carries a cu_mask word after its header (all but CMD_CHAIN)."""
    return opcode != Opcode.CMD_CHAIN


@dataclass
class ErtCommand:
    """A decoded command: header fields, cu_mask (0 for CMD_CHAIN, which has none) and payload words."""

    state: int
    opcode: int
    type: int
    cu_mask: int
    payload: list[int] = field(default_factory=list)
    custom: int = 0

    def encode(self) -> bytes:
        words = ([self.cu_mask] if has_cu_mask(self.opcode) else []) + list(self.payload)
        hdr = header(self.state, len(words), self.opcode, self.type, self.custom)
        return struct.pack(f"<I{len(words)}I", hdr, *words)

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> ErtCommand:
        """Parse a command (hostless_ert.h's ``hl_ert_check``); ValueError when it is shorter
        than its header or ``count`` runs past the buffer."""
        state, custom, opcode, type_, cu_mask, payload = C.ert_decode(bytes(raw))
        return cls(int(state), int(opcode), int(type_), int(cu_mask), [int(w) for w in payload], int(custom))


def start_cu(cu_index: int, args: Sequence[int]) -> ErtCommand:
    """ERT_START_CU for CU ``cu_index`` with 32-bit argument words."""
    return ErtCommand(State.NEW, Opcode.START_CU, CmdType.CU, 1 << cu_index, [a & 0xFFFFFFFF for a in args])


def start_npu(
    cu_index: int, instr_addr: int, instr_size: int, args: Sequence[int], props: int = 0
) -> ErtCommand:
    """ERT_START_NPU: instruction buffer address (u64), size (u32), property count (u32), kernel args."""
    payload = [instr_addr & 0xFFFFFFFF, instr_addr >> 32, instr_size & 0xFFFFFFFF, props]
    payload += [a & 0xFFFFFFFF for a in args]
    return ErtCommand(State.NEW, Opcode.START_NPU, CmdType.CU, 1 << cu_index, payload)


CHAIN_HEADER_WORDS = int(C.ERT_CHAIN_HEADER_WORDS)
"""Words of ``ert_cmd_chain_data`` before its handles: count, submit index, error index, reserved[3]."""
CHAIN_SUBMIT_WORD = int(C.ERT_CHAIN_SUBMIT_WORD)
"""Word of a CMD_CHAIN command (header = word 0, count = word 1) the processor writes the submit index to."""
CHAIN_ERROR_WORD = int(C.ERT_CHAIN_ERROR_WORD)
"""Word of a CMD_CHAIN command the processor writes the index of the failed command to."""
NPU_FIXED_WORDS = int(C.ERT_NPU_FIXED_WORDS)
"""START_NPU payload words before the kernel arguments: instruction address (2), size, property count."""


def cmd_chain(handles: Sequence[int]) -> ErtCommand:
    """ERT_CMD_CHAIN: count, submit index, error index, 3 reserved words, u64 handles (no cu_mask)."""
    payload = [len(handles), 0, 0, 0, 0, 0]
    for h in handles:
        payload += [h & 0xFFFFFFFF, h >> 32]
    return ErtCommand(State.NEW, Opcode.CMD_CHAIN, CmdType.CU, 0, payload)


def u64_args(values: Sequence[int]) -> list[int]:
    """Split 64-bit values (handles) into the little-endian 32-bit words ERT payloads carry."""
    out: list[int] = []
    for v in values:
        out += [v & 0xFFFFFFFF, (v >> 32) & 0xFFFFFFFF]
    return out


def cu_args(buffers: Sequence[int], scalars: Sequence[int]) -> list[int]:
    """The argument words of a START_CU / START_NPU command as hostless kernels take them:
    the buffer count, the u64 buffer handles, then the u64 scalars (two words each)."""
    return [len(buffers)] + u64_args(buffers) + u64_args(scalars)


def parse_cu_args(cmd: ErtCommand) -> tuple[list[int], list[int]]:
    """(buffer handles, scalars) of a START_CU / START_NPU command (the inverse of
    :func:`cu_args`); ValueError when its words do not match their counts."""
    hs, scalars = C.ert_cu_args(int(cmd.opcode), cmd.payload)  # hl_ert_cu_args
    return [int(h) for h in hs], [int(s) for s in scalars]


def chain_handles(cmd: ErtCommand) -> list[int]:
    """The u64 handles of the commands a CMD_CHAIN names; ValueError when its payload is
    shorter than its fixed words or its command count."""
    return [int(h) for h in C.ert_chain(cmd.payload)]  # hl_ert_chain


def set_state(words: Any, state: int) -> None:
    """Write ``state`` into the header word ``words[0]`` of a command (as the command
    processor reports progress), keeping the header's other fields."""
    words[0] = C.ert_with_state(int(words[0]), int(state))  # hl_ert_with_state
