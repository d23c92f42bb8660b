"""Completion statuses of fences (Synx numbering)."""

from __future__ import annotations

import enum

from . import _core

__all__ = ["Status"]


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
    OWNER_DIED = 6

    @classmethod
    def _missing_(cls, value: object) -> Status | None:
        # hl_status_valid (hostless.h): the one definition of a valid status
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0 and _core.status_valid(value):
            member = int.__new__(cls, value)
            member._name_ = f"CUSTOM_{value}"
            member._value_ = value
            return member
        return None

    @property
    def failed(self) -> bool:
        """True for every final status other than SUCCESS."""
        return self not in (Status.ACTIVE, Status.SUCCESS)
