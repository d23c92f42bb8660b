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
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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
    START_CU = 0
    CONFIGURE = 2
    EXIT = 3
    ABORT = 4
    EXEC_WRITE = 5
    CU_STAT = 6
    START_COPYBO = 7
    START_DPU = 18
    CMD_CHAIN = 19
    START_NPU = 20
    START_NPU_PREEMPT = 21


class CmdType(enum.IntEnum):
    DEFAULT = 0
    KDS_LOCAL = 1
    CTRL = 2
    CU = 3
    SCU = 4


class State(enum.IntEnum):
    INVALID = 0
    NEW = 1
    QUEUED = 2
    RUNNING = 3
    COMPLETED = 4
    ERROR = 5
    ABORT = 6
    SUBMITTED = 7
    TIMEOUT = 8
    NORESPONSE = 9
    SKERROR = 10
    SKCRASHED = 11


MAX_BYTES = 4 + 4 * 0x7FF
"""The longest command: a header's count is 11 bits."""


def header(state: int, count: int, opcode: int, type_: int = CmdType.CU, custom: int = 0) -> int:
    """Pack an ERT header word; ValueError when a field overflows."""
    if (
        not 0 <= state < 16
        or not 0 <= custom < 256
        or not 0 <= count < 2048
        or not 0 <= opcode < 32
        or not 0 <= type_ < 16
    ):
        raise ValueError("ERT header field out of range")
    return (state & 0xF) | (custom << 4) | (count << 12) | (opcode << 23) | (type_ << 28)


def parse_header(word: int) -> tuple[int, int, int, int, int]:
    """(state, custom, count, opcode, type) of a header word."""
    return word & 0xF, (word >> 4) & 0xFF, (word >> 12) & 0x7FF, (word >> 23) & 0x1F, (word >> 28) & 0xF


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


CHAIN_HEADER_WORDS = 6
"""Words of ``ert_cmd_chain_data`` before its handles: count, submit index, error index, reserved[3]."""
CHAIN_SUBMIT_WORD = 2
"""Word of a CMD_CHAIN command (header = word 0, count = word 1) the processor writes the submit index to."""
CHAIN_ERROR_WORD = 3
"""Word of a CMD_CHAIN command the processor writes the index of the failed command to."""
NPU_FIXED_WORDS = 4
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
    words[0] = (int(words[0]) & ~0xF) | int(state)
