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

Every constant here (field positions, opcodes, states, word offsets) is taken
from the ABI header (``HL_ERT_*`` in ``hostless_layout.h``, through the
extension's constant table), where the native command processor
(``core/agent.c``) reads them too: the layout lives in one place.
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
    """(state, custom, count, opcode, type) of a header word."""
    return (
        (word >> _STATE_SHIFT) & _STATE_MASK,
        (word >> _CUSTOM_SHIFT) & _CUSTOM_MASK,
        (word >> _COUNT_SHIFT) & _COUNT_MASK,
        (word >> _OPCODE_SHIFT) & _OPCODE_MASK,
        (word >> _TYPE_SHIFT) & _TYPE_MASK,
    )


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
        """Parse a command; ValueError when ``count`` runs past the buffer."""
        raw = bytes(raw)
        if len(raw) < 4:
            raise ValueError("ERT command shorter than its header")
        (word,) = struct.unpack_from("<I", raw)
        state, custom, count, opcode, type_ = parse_header(word)
        masks = 1 if has_cu_mask(opcode) else 0
        if count < masks or count > (len(raw) - 4) // 4:  # by subtraction: no overflow
            raise ValueError(f"ERT command count {count} does not fit a {len(raw)}-byte buffer")
        words = list(struct.unpack_from(f"<{count}I", raw, 4))
        cu_mask = words[0] if masks else 0
        return cls(state, opcode, type_, cu_mask, words[masks:], custom)


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
    if cmd.opcode == Opcode.START_NPU:
        if len(cmd.payload) < NPU_FIXED_WORDS:
            raise ValueError("START_NPU payload shorter than its fixed words")
        args = cmd.payload[NPU_FIXED_WORDS:]
    else:
        args = cmd.payload
    if not args:
        raise ValueError("ERT command without arguments")
    nbuf = args[0]
    if nbuf > (len(args) - 1) // 2 or (len(args) - 1 - 2 * nbuf) % 2:
        raise ValueError("ERT argument words do not match the buffer count")
    hs = [args[1 + 2 * i] | (args[2 + 2 * i] << 32) for i in range(nbuf)]
    rest = args[1 + 2 * nbuf :]
    return hs, [rest[2 * i] | (rest[2 * i + 1] << 32) for i in range(len(rest) // 2)]


def chain_handles(cmd: ErtCommand) -> list[int]:
    """The u64 handles of the commands a CMD_CHAIN names; ValueError when its payload is
    shorter than its fixed words or its command count."""
    base = CHAIN_HEADER_WORDS
    if len(cmd.payload) < base:
        raise ValueError("CMD_CHAIN payload shorter than its fixed words")
    n = cmd.payload[0]
    if n > (len(cmd.payload) - base) // 2:
        raise ValueError("CMD_CHAIN payload shorter than its command count")
    return [cmd.payload[base + 2 * i] | (cmd.payload[base + 1 + 2 * i] << 32) for i in range(n)]


def set_state(words: Any, state: int) -> None:
    """Write ``state`` into the header word ``words[0]`` of a command (as the command
    processor reports progress), keeping the header's other fields."""
    words[0] = (int(words[0]) & ~(_STATE_MASK << _STATE_SHIFT)) | (int(state) << _STATE_SHIFT)
