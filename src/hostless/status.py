"""Completion statuses of fences (Synx numbering)."""

from __future__ import annotations

import enum

from . import _core
from .errors import CorruptDomain

__all__ = ["Status", "fence_status", "timeline_failure"]


class Status(enum.IntEnum):
    """Status of a fence or of a timeline failure.

    ``ACTIVE`` means not signaled yet.  Every other value is final.  Custom
    statuses are integers from 64 to 2**32 - 1; ``Status(100)`` gives a
    pseudo-member named ``CUSTOM_100`` so that every status prints well.
    """

    ACTIVE = 1
    SUCCESS = 2
    ERROR = 3
    CANCEL = 4
    OWNER_DIED = 6  # the owner died (killed, crashed): recovery completed it
    OWNER_LEFT = 7  # the owner left cleanly (Domain.close) without signalling it (ABI 6)

    @classmethod
    def _missing_(cls, value: object) -> Status | None:
        # hl_status_valid (hostless.h): the one definition of a valid status
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            if not _core.status_valid(value):
                return None
            member = int.__new__(cls, value)
            member._name_ = f"CUSTOM_{value}"
            member._value_ = value
            return member
        return None

    @property
    def failed(self) -> bool:
        """True for every final status other than SUCCESS."""
        return self not in (Status.ACTIVE, Status.SUCCESS)


def fence_status(word: int) -> Status:
    """The status held in a fence's completion word (0 = ACTIVE).

    Raises CorruptDomain for a word no conforming participant writes (1, 5,
    63, >= 2**32: a buggy or hostile participant stored it)."""
    if word == 0:
        return Status.ACTIVE
    if not _core.status_valid(word):
        raise CorruptDomain(
            f"a fence holds an invalid completion word {word:#x} (written by a buggy or hostile participant)"
        )
    return Status(word)


def timeline_failure(word: int) -> Status | None:
    """The failure held in a timeline's word, or None when it has not failed.

    Raises CorruptDomain for a word no conforming participant writes (a value
    of 2**63 or more, a failure with an invalid status)."""
    failed = int(_core.TIMELINE_FAILED)
    if not word & failed:
        if word >= failed:
                raise CorruptDomain(f"a timeline holds an invalid word {word:#x}")
        return None
    low = word & ~failed
    if low > 0xFFFFFFFF or not _core.status_valid(low) or low == int(Status.SUCCESS):
        raise CorruptDomain(f"a timeline failed with an invalid word {word:#x}")
    return Status(low)


# the extension hands back Status members (fence waits, timeline failures, records)
_core.set_status(Status, {int(m): m for m in Status})
