"""A reference ERT command processor in Python, for the tests of the C one.

The emulated NPU's command processor is the engine's (``core/agent_ert.c``); this
is the one the Python npu agent loop ran before that loop was removed, kept as
the tests' reference: the C processor must write back what it writes.  The
byte layout of a command is :mod:`hostless.ert`'s; this module is the
processor's side of the protocol: it reports progress in the command's
header word (NEW -> RUNNING -> COMPLETED, or ERROR), runs START_CU /
START_NPU on the compute unit its cu_mask names (exactly one), and runs a
CMD_CHAIN's commands in order, writing the submit index before each one and
the error index of the one that failed (a chained command cannot itself be
a CMD_CHAIN).  Any malformed command (count past its buffer, a cu_mask
naming no CU or several, argument words that do not match their counts)
raises, after its state was set to ERROR; nothing of it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hostless import ert
from hostless.wire import BadPacket

__all__ = ["ErtProcessor"]


class ErtProcessor:
    """Runs ERT commands found in heap buffers.

    ``command_bytes(h)`` is the buffer with handle ``h`` as a flat writable
    uint8 array, ``array(h)`` its NumPy view (for the kernels), and
    ``kernels`` maps a CU index to a kernel taking ``(buffers, scalars)``.
    """

    def __init__(
        self,
        command_bytes: Callable[[int], np.ndarray],
        array: Callable[[int], np.ndarray],
        kernels: dict[int, Any],
    ) -> None:
        self.command_bytes, self.array, self.kernels = command_bytes, array, kernels

    def run(self, raw: np.ndarray, chained: bool = False) -> None:
        """Run the command in ``raw`` (flat uint8), writing its state into its header word."""
        words = raw[: raw.size - raw.size % 4].view("<u4")
        try:
            cmd = ert.ErtCommand.decode(raw[: ert.MAX_BYTES].tobytes())
        except ValueError:
            if words.size:
                ert.set_state(words, ert.State.ERROR)
            raise
        ert.set_state(words, ert.State.RUNNING)
        try:
            if cmd.opcode == ert.Opcode.CMD_CHAIN:
                if chained:
                    raise BadPacket("a chained command cannot be a CMD_CHAIN")
                self.run_chain(cmd, words)
            elif cmd.opcode in (ert.Opcode.START_CU, ert.Opcode.START_NPU):
                self.run_cu(cmd)
            else:
                raise BadPacket(f"unsupported ERT opcode {cmd.opcode}")
        except Exception:
            ert.set_state(words, ert.State.ERROR)
            raise
        ert.set_state(words, ert.State.COMPLETED)

    def run_chain(self, cmd: ert.ErtCommand, words: np.ndarray) -> None:
        """Run the chained commands in order (``words``: the chain command's own words)."""
        for i, h in enumerate(ert.chain_handles(cmd)):
            words[ert.CHAIN_SUBMIT_WORD] = i
            try:
                self.run(self.command_bytes(h), chained=True)
            except Exception:
                words[ert.CHAIN_ERROR_WORD] = i
                raise

    def run_cu(self, cmd: ert.ErtCommand) -> None:
        """Run a START_CU / START_NPU command on the one CU its cu_mask names."""
        if cmd.cu_mask == 0 or cmd.cu_mask & (cmd.cu_mask - 1):
            raise BadPacket(f"cu_mask {cmd.cu_mask:#x} must name exactly one CU")
        cu = cmd.cu_mask.bit_length() - 1
        fn = self.kernels.get(cu)
        if fn is None:
            raise BadPacket(f"no CU {cu} in the loaded xclbin")
        hs, scalars = ert.parse_cu_args(cmd)
        fn([self.array(h) for h in hs], scalars)
