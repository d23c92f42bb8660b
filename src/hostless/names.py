"""Names: independent processes find each other's objects by name.

A domain holds a name table (MAX_NAMES = 239 entries, in its header; see
``hostless_layout.h``).  One process publishes an object under a name, any
other looks it up, with no side channel (no file of handles, no mailbox)::

    # the camera process
    dom = hl.Domain.create("cam", heap="64M", unlink_on_close=True)
    frames = dom.timeline()
    dom.publish("camera/frames", frames)

    # the detector process, started on its own
    dom = hl.Domain.open("cam", wait_for=30)           # waits for the file
    frames = dom.lookup("camera/frames", timeout=10)   # waits for the name

The rules:

- A name is 1..47 bytes of UTF-8.  It names one object at a time; publishing
  a name held by another live object raises :class:`~hostless.NameTaken`
  unless ``replace=True``.
- An entry holds no reference: it lives while its object does.  When the
  object is freed (its last holder released it or died), lookups stop
  finding it at once and its entry is reused.  Keep a reference to what you
  publish.
- :meth:`~hostless.Domain.lookup` returns a new reference to the object (a
  Fence, Timeline, Buffer or Queue, as published), checked against the
  object's generation: a name never yields a different, newer object that
  happens to sit in the same slot.
- The table is shared memory: a participant that dies while publishing is
  replaced by the next writer, and garbage in the table is skipped, never
  trusted.
- ``hostless info NAME`` lists the names.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ._abi import C, handle_kind
from .errors import InvalidHandle

if TYPE_CHECKING:
    from .domain import Domain

__all__ = ["publish", "unpublish", "lookup", "peek", "entries", "changes", "MAX_NAMES", "NAME_MAX_BYTES"]

MAX_NAMES = int(C.MAX_NAMES)
NAME_MAX_BYTES = int(C.NAME_MAX) - 1

_IMPORT = {
    int(C.KIND_FENCE): "import_fence",
    int(C.KIND_TIMELINE): "import_timeline",
    int(C.KIND_BUFFER): "import_buffer",
    int(C.KIND_QUEUE): "import_queue",
}


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"a name is a str, got {type(name).__name__}")
    n = len(name.encode("utf-8"))
    if not 1 <= n <= NAME_MAX_BYTES or "\0" in name:
        raise ValueError(
            f"a name is 1..{NAME_MAX_BYTES} bytes of UTF-8 without NUL, got {name!r} ({n} bytes)"
        )
    return name


def _point_entry(dom: Domain, name: str) -> str | None:
    """The cell name of a point published as ``name`` (``name@value``), if any."""
    for key in entries(dom):
        head, sep, tail = key.rpartition("@")
        if sep and head == name and tail.isdigit():
            return key
    return None


def publish(dom: Domain, name: str, obj: Any, replace: bool = False) -> None:
    """Publish ``obj`` (a Fence, Timeline, Buffer, Queue or timeline Point this
    process holds) as ``name``.

    A point is published as its timeline in a cell named ``name@value`` (the
    cell carries one handle; the value rides in the name, so ``name`` plus
    ``@`` and the value's digits must fit the 47 bytes); ``lookup(name)``
    returns the point again."""
    from .timeline import Point

    if isinstance(obj, Point):
        _check_name(name)
        old = _point_entry(dom, name)
        if old is not None and not replace:
            from .errors import NameTaken

            raise NameTaken(f"{name!r} is published already (as {old!r}); replace=True rebinds it")
        if old is not None:
            dom._core.name_remove(old, None)
        dom._core.name_publish(_check_name(f"{name}@{obj.value}"), obj.timeline.handle, bool(replace))
        return
    handle = getattr(obj, "handle", None)
    if not isinstance(handle, int) or handle_kind(handle) not in _IMPORT:
        raise TypeError(
            f"only fences, timelines, buffers and queues can be published, got {type(obj).__name__}"
        )
    if getattr(obj, "dom", dom) is not dom:
        raise ValueError("the object belongs to another domain")
    dom._core.name_publish(_check_name(name), handle, bool(replace))


def unpublish(dom: Domain, name: str, handle: int | None = None) -> None:
    """Remove ``name`` from the table (KeyError when nothing has it).  With ``handle``: only
    while the entry holds that handle (KeyError otherwise), one step under the table's lock,
    so that of several processes removing one stale entry, the one that publishes next cannot
    lose its entry to the others."""
    dom._core.name_remove(_check_name(name), handle)


def peek(dom: Domain, name: str) -> int | None:
    """The handle published as ``name`` (a live object), or None; takes no reference."""
    h = dom._core.name_lookup(_check_name(name))
    return None if h is None else int(h)


def changes(dom: Domain) -> int:
    """A counter that changes whenever the table does (cheap: one load), to re-read
    :func:`entries` only when something was published or removed."""
    return int(dom._core.name_seq())


def entries(dom: Domain) -> dict[str, int]:
    """Every live entry: name -> handle (a snapshot)."""
    return dict(dom._core.name_list())


def lookup(dom: Domain, name: str, timeout: float | None = 0.0) -> Any:
    """A new reference to the object published as ``name``.

    Waits up to ``timeout`` seconds for it to be published (None: forever;
    0: only look).  KeyError when it is not there (``timeout`` 0), TimeoutError
    when it did not appear in time.  The wait sleeps between looks (1 to
    10 ms), so Ctrl-C ends it.
    """
    _check_name(name)
    core = dom._core
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    pause = 0.001
    while True:
        seq = core.name_seq()
        h = core.name_lookup(name)
        point_value = None
        if h is None and "@" not in name:
            key = _point_entry(dom, name)
            if key is not None:
                h, point_value = core.name_lookup(key), int(key.rpartition("@")[2])
        if h is not None:
            try:
                if point_value is not None:
                    return dom.import_timeline(h).point(point_value)
                return getattr(dom, _IMPORT[handle_kind(h)])(h)
            except (InvalidHandle, KeyError):
                pass  # freed between the look and the import: as if absent
        if deadline is not None and time.monotonic() >= deadline:
            known = sorted(entries(dom))
            where = f"domain {dom.name!r}" if dom.name else "the domain"
            msg = f"no live object named {name!r} in {where} (names: {known})"
            if timeout == 0:
                raise KeyError(msg)
            raise TimeoutError(msg + f" after {timeout} s")
        while core.name_seq() == seq and (deadline is None or time.monotonic() < deadline):
            time.sleep(pause)
            pause = min(0.01, pause * 2)
