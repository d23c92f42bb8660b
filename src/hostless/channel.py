"""Channels: one publisher, up to :data:`MAX_SUBSCRIBERS` subscribers in any processes, a ring
of zero-copy slots (docs/channels.md has the full rules)::

    pub = hl.Channel(dom, "camera", (1080, 1920, 3), "u1", depth=4)   # the camera
    with pub.loan() as frame:          # a writable view of the next slot ...
        frame.data[...] = capture()
                                       # ... published when the block exits
    sub = hl.Subscriber(dom, "camera", "detector")                    # any process
    with sub.receive(timeout=1) as frame:   # a read-only view, acknowledged when the block exits
        detect(frame.data, frame.seq)

Frames are numbered 1, 2, ...; frame ``n`` lives in slot ``(n - 1) % depth``.  Shared state:
the descriptor (a heap buffer published as ``ch:<channel>``: the slots' and timelines'
handles), two timelines owned by the publisher (``published``: the last frame published;
``claimed``: the last frame whose slot the publisher has started to write) and, per subscriber,
a record (a 64-byte buffer published as ``ch:<channel>/<subscriber>``) naming its
acknowledgement timeline, owned by the subscriber (the last frame it released).

* Policy ``"block"`` (default): the publisher does not start frame ``n`` until every such
  subscriber acknowledged frame ``n - depth``; it waits up to its timeout, then raises
  :class:`~hostless.SlowSubscriber` (nothing published).  Such a subscriber receives every frame.
* Policy ``"skip"``: the publisher never waits for it.  A frame is intact while ``claimed < n +
  depth``; ``receive`` checks that before handing frame ``n`` out (else it skips to the newest
  frame, counting ``lost``), and the block's exit checks it again: a frame overwritten while the
  block read it raises :class:`~hostless.FrameOverwritten` (a seqlock: the publisher's
  ``claimed`` advance is a sequentially consistent read-modify-write made before it writes the
  slot; on x86-64, whose stores and loads are each kept in order, a reader that saw any byte of
  the new frame also sees the advance).
* A subscriber that dies (its acknowledgement timeline OWNER_DIED, by recovery) is kept for
  ``grace`` seconds (a ``"block"`` one still holds its unacknowledged slots); a subscriber
  started under the same name within the grace takes its place (as ``<name>+`` until the
  publisher promotes it) and resumes after the last frame the dead one acknowledged (or a
  successor of it that died before the publisher promoted it: it keeps its progress in the
  dead one's record, word ``_REC_AFTER``).  After the grace it is dropped.
  ``Subscriber.close()`` leaves at once (its timeline CANCEL).
* Everything read from shared memory (descriptor, records, timelines' words) is validated:
  sizes, magic, counts by subtraction, handles by importing them.
"""

from __future__ import annotations

import asyncio
import os
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _core, names
from ._abi import C
from .buffer import Buffer, ShapeLike, normalize_layout
from .channel_descriptor import (
    _DESC_MAGIC,
    _HDR,
    _VERSION,
    MAX_DEPTH,
    _dead_channel,
    _words,
)
from .errors import (
    HostlessError,
    InvalidOperation,
    NameTaken,
    SlowSubscriber,
)
from .status import Status
from .timeline import Timeline
from .waits import wait_any, wait_any_async

if TYPE_CHECKING:
    from .domain import Domain

__all__ = ["Channel", "Frame", "MAX_SUBSCRIBERS", "MAX_DEPTH", "NAME_MAX_BYTES"]

MAX_SUBSCRIBERS = 16
"""The most subscribers (live, or dead within their grace) a channel serves; each also takes one
entry of the domain's name table."""
NAME_MAX_BYTES = 20
"""Channel and subscriber names are 1..20 bytes of UTF-8 without ``/`` or NUL."""

BLOCK, SKIP = 0, 1
_POLICIES = {"block": BLOCK, "skip": SKIP}
_STARTS = ("newest", "oldest", "next")
_REC_MAGIC = int.from_bytes(b"HLCHSUB1", "little")
_REC_WORDS = 8
_REC_SEEN = 5  # the record's word the publisher sets when it adopts it
_REC_AFTER = 6  # the last frame a successor not taken in yet acknowledged (in its predecessor's record)
_SEEN = int.from_bytes(b"HLCHSEEN", "little")
_FAILED = int(C.TIMELINE_FAILED)
_POLL = 0.005  # seconds between looks while a dead subscriber's grace runs (a replacement may come)


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"a {what} name is a str, got {type(name).__name__}")
    n = len(name.encode("utf-8"))
    if not 1 <= n <= NAME_MAX_BYTES or "/" in name or "\0" in name:
        raise ValueError(
            f"a {what} name is 1..{NAME_MAX_BYTES} bytes of UTF-8 without '/' or NUL, got {name!r}"
        )
    return name


class Frame(_core.ChannelFrame):
    """A loaned slot: ``seq`` (frame number), ``data`` (a NumPy view of the slot, read-only for a
    subscriber; the slot's :class:`~hostless.Buffer` for a device channel, for DLPack), ``buffer``
    (the slot's Buffer), ``lost`` (frames a subscriber skipped just before this one).  Use it as a
    ``with`` block; the views are valid only inside it.  Device data must be complete (stream
    synchronized) when the block exits."""

    # The fields, ``__enter__`` and ``__exit__`` are C (binding/channel.c: the exit publishes or
    # acknowledges in C, and calls the owner's _finish for anything unusual).
    __slots__ = ()

    if TYPE_CHECKING:
        seq: int
        data: Any
        buffer: Buffer
        lost: int
        _owner: _Ring
        _open: bool

        def __init__(self, owner: _Ring, seq: int, data: Any, buffer: Buffer, lost: int) -> None: ...

        def __enter__(self) -> Frame: ...

        def __exit__(
            self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
        ) -> None: ...

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        a = np.asarray(self.data, dtype=dtype)
        return a.copy() if copy else a

    @property
    def intact(self) -> bool:
        """Whether the slot still holds this frame (False once the publisher started to overwrite it)."""
        return self._owner._intact(self.seq)

    def __repr__(self) -> str:
        return f"<hostless.channel.Frame {self.seq}{'' if self._open else ' released'}>"


_core.channel_frame_type(Frame)  # the class the C fast paths make frames of


class _Sub:
    """The publisher's view of one subscriber: its record and acknowledgement timeline (references)."""

    __slots__ = ("name", "rec", "ack", "ack_h", "policy", "dead_since")

    def __init__(self, name: str, rec: Buffer, ack: Timeline, policy: int) -> None:
        self.name, self.rec, self.ack, self.ack_h, self.policy = name, rec, ack, int(ack.handle), policy
        self.dead_since: float | None = None

    def release(self) -> None:
        for o in (self.ack, self.rec):
            try:
                o.release()
            except HostlessError:
                pass


class _Ring(_core.ChannelRing):
    """What both sides hold: the domain, the timelines and the slots.  The hot state (``_frame``,
    ``_closed``, ``_next``, ``_claimed``, ``_seen``, ``_fast``) lives in the C base
    (binding/channel.c), whose ``loan`` / ``receive`` take the common case without a Python
    frame and call ``_loan`` / ``_receive`` (the general paths) for the rest."""

    _dom: Domain
    name: str
    depth: int
    _pub: Timeline
    _claim: Timeline
    _slots: list[Buffer]
    _views: list[Any]
    _frame: Frame | None
    _closed: bool

    def _init_ring(
        self, dom: Domain, name: str, pub: Timeline, claim: Timeline, slots: list[Buffer], ro: bool
    ) -> None:
        self._dom, self._core, self.name, self.depth = dom, dom._core, name, len(slots)
        self._pub, self._claim, self._slots = pub, claim, slots
        self._pub_h, self._claim_h = int(pub.handle), int(claim.handle)
        self._views = [b if b.device != "cpu" else b.numpy(readonly=ro) for b in slots]
        self._frame, self._closed = None, False
        self._word = self._core.word  # (bound once: the hot paths read words with it)
        self._bind(self._core, pub, claim, tuple(self._views), tuple(slots), ro)

    def _value(self, h: int) -> int:
        w = int(self._core.word(h))
        return int(self._core.aux(h)) if w & _FAILED else w

    def _intact(self, seq: int) -> bool:
        return self._value(self._claim_h) < seq + self.depth

    def _check_use(self) -> None:
        if self._closed:
            raise InvalidOperation(f"{type(self).__name__} {self.name!r} is closed")
        if self._frame is not None:
            raise InvalidOperation(f"frame {self._frame.seq} is still loaned: leave its with block first")

    @property
    def shape(self) -> tuple[int, ...]:
        return self._slots[0].shape

    @property
    def dtype(self) -> np.dtype:
        return self._slots[0].dtype

    @property
    def device(self) -> str:
        return self._slots[0].device

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - both sides define it
        raise NotImplementedError

    def _finish(self, f: Frame, ok: bool) -> None:  # pragma: no cover - both sides define it
        raise NotImplementedError


class Channel(_Ring):
    """The publisher of channel ``name`` in ``dom``: ``depth`` slots of ``shape``/``dtype``
    (``Channel(dom, name, nbytes)`` for raw bytes) in the domain heap, or in the device heap of
    ``device="cuda:N"``.

    ``timeout``: seconds :meth:`loan` waits for ``"block"`` subscribers by default (None: no
    limit).  ``grace``: seconds a dead subscriber is kept for a replacement.  Raises ValueError /
    TypeError on bad arguments, OutOfMemory when the heap cannot hold the ring, NameTaken when a
    live publisher has the channel (a dead one's channel is replaced: its subscribers get
    ChannelClosed).  Not thread-safe: one thread publishes."""

    def __init__(
        self,
        dom: Domain,
        name: str,
        shape: ShapeLike,
        dtype: Any = None,
        *,
        depth: int = 4,
        device: str = "cpu",
        timeout: float | None = 1.0,
        grace: float = 1.0,
    ) -> None:
        _check_name(name, "channel")
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            raise ValueError(f"depth must be an int in 1..{MAX_DEPTH}, got {depth!r}")
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
        if not grace >= 0:
            raise ValueError(f"grace must be >= 0, got {grace!r}")
        normalize_layout(shape, dtype)  # errors before anything is allocated
        self.timeout, self.grace = timeout, float(grace)
        made: list[Any] = []
        try:
            slots = [dom.buffer(shape, dtype, device=device) for _ in range(depth)]
            made += slots
            pub, claim = dom.timeline(), dom.timeline()
            made += [pub, claim]
            desc = dom.buffer(_HDR + depth, "<u8")
            made.append(desc)
            w = desc.numpy()
            w[:] = 0
            w[0], w[1] = _DESC_MAGIC, _VERSION | depth << 32
            w[2], w[3], w[4] = pub.handle, claim.handle, os.getpid()
            w[_HDR:] = [b.handle for b in slots]
            key = "ch:" + name
            try:
                dom.publish(key, desc)
            except NameTaken:
                if not _dead_channel(dom, key):
                    raise NameTaken(f"channel {name!r} has a live publisher in this domain") from None
                dom.publish(key, desc, replace=True)
        except BaseException:
            for o in made:
                o.release()
            raise
        self._desc = desc
        self._init_ring(dom, name, pub, claim, slots, False)
        self._next = 1
        self._claimed = 0
        self._seen = -1
        self._subs: dict[str, _Sub] = {}
        self._fast: tuple[tuple[int, bool], ...] = ()  # (ack handle, blocks) of each subscriber
        self._bad: set[int] = set()
        self.rejected = 0
        """Records under this channel's names that were refused: garbage, forged handles, or
        records of an earlier publisher of the channel."""

    # ------------------------------------------------------------ subscribers
    def _refresh(self) -> None:
        """Adopt the records published since the last look (one load when nothing changed), and
        promote a successor (``<name>+``, a subscriber taking a dead one's name over) to the
        name once its predecessor is dead: until then the predecessor's record, which this
        publisher holds, keeps the name and the frame to resume from."""
        seq = self._core.name_seq()  # (names.changes, inlined: once per loan)
        if seq == self._seen:
            return
        self._seen = seq
        prefix = f"ch:{self.name}/"
        main: dict[str, int] = {}
        succ: dict[str, int] = {}
        for key, h in names.entries(self._dom).items():
            if key.startswith(prefix) and h not in self._bad:
                sub = key[len(prefix) :]
                if sub.endswith("+"):
                    succ[sub[:-1]] = h
                else:
                    main[sub] = h
        for sub, h in main.items():
            old = self._subs.get(sub)
            if old is None or int(old.rec.handle) != h:
                self._take(sub, h, old, None)
        for sub, h in succ.items():
            old = self._subs.get(sub)
            if old is None or int(self._core.word(old.ack_h)) & _FAILED:
                self._take(sub, h, old, prefix + sub)

    def _take(self, sub: str, h: int, old: _Sub | None, promote: str | None) -> None:
        if old is None and len(self._subs) >= MAX_SUBSCRIBERS:
            return  # it withdraws itself (ChannelFull)
        try:
            new = self._adopt(sub, h)
        except (HostlessError, ValueError, KeyError):
            new = None
        if new is None:
            self.rejected += 1
            if len(self._bad) < 4096:
                self._bad.add(h)
            return
        if promote is not None:  # the successor takes the name (the publisher holds it now)
            try:
                self._dom.publish(promote, new.rec, replace=True)
                names.unpublish(self._dom, promote + "+", h)
            except (HostlessError, KeyError):
                pass  # it closed meanwhile, or the table is full: it stays under its own name
        if old is not None:
            old.release()
        self._subs[sub] = new
        self._reindex()

    def _reindex(self) -> None:
        """The fast path's copy of the subscribers: (acknowledgement handle, policy is block)."""
        self._fast = tuple((s.ack_h, s.policy == BLOCK) for s in self._subs.values())

    def _adopt(self, sub: str, h: int) -> _Sub | None:
        """Validate the record ``h`` and take references to it and its timeline (None: not ours);
        marks the record seen (``Subscriber.seen``)."""
        rec = self._dom.import_buffer(h)
        try:
            if rec.device != "cpu" or rec.nbytes != _REC_WORDS * 8:
                return _drop(rec)
            w = _words(rec, _REC_WORDS)
            if w[0] != _REC_MAGIC or w[3] != self._pub_h or w[2] not in (BLOCK, SKIP):
                return _drop(rec)
            ack = self._dom.import_timeline(w[1])
        except BaseException:
            rec.release()
            raise
        if int(ack.handle) in (self._pub_h, self._claim_h):
            ack.release()
            return _drop(rec)
        rec.numpy()[_REC_SEEN] = _SEEN
        return _Sub(sub, rec, ack, w[2])

    def _blockers(self, need: int) -> list[_Sub]:
        """The subscribers frame ``need + depth`` has to wait for; drops the dead past their grace."""
        out = []
        now = -1.0
        for s in list(self._subs.values()):
            w = int(self._core.word(s.ack_h))
            if w & _FAILED:
                if w & 0xFFFFFFFF == Status.CANCEL:
                    self._drop(s)
                    continue
                now = time.monotonic() if now < 0 else now
                if s.dead_since is None:
                    s.dead_since = now
                if now - s.dead_since >= self.grace:
                    self._drop(s)
                    continue
                w = int(self._core.aux(s.ack_h))
            if s.policy == BLOCK and w < need:
                out.append(s)
        return out

    def _drop(self, s: _Sub) -> None:
        if self._subs.get(s.name) is s:
            del self._subs[s.name]
            self._reindex()
        if len(self._bad) < 4096:  # never adopted again (a holder may keep its entry alive)
            self._bad.add(int(s.rec.handle))
        s.release()

    @property
    def subscribers(self) -> dict[str, dict[str, Any]]:
        """The subscribers this publisher serves: name -> policy, acknowledged frame, alive."""
        self._refresh()
        out = {}
        for s in self._subs.values():
            out[s.name] = {
                "policy": "skip" if s.policy == SKIP else "block",
                "acknowledged": self._value(s.ack_h),
                "alive": not int(self._core.word(s.ack_h)) & _FAILED,
            }
        return out

    # ----------------------------------------------------------------- loans
    def _step(self, deadline: float | None) -> tuple[list[Any], float | None] | None:
        """None when the next slot is free; else (points to wait on, seconds to wait at most)."""
        self._refresh()
        need = self._next - self.depth
        blockers = self._blockers(need) if self._subs else []
        if not blockers:
            return None
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            who = ", ".join(
                f"{s.name} (acknowledged {self._value(s.ack_h)}"
                f"{', dead: in its grace' if s.dead_since is not None else ''})"
                for s in blockers
            )
            raise SlowSubscriber(
                f"channel {self.name!r}: frame {self._next} needs frame {need} released by: {who}; "
                f"waited {self.timeout} s (raise the timeout, or use the 'skip' policy for them)"
            )
        left = None if deadline is None else deadline - now
        live = [s.ack.point(need) for s in blockers if s.dead_since is None]
        if len(live) < len(blockers) or not live:
            left = _POLL if left is None else min(left, _POLL)
        return live, left

    def _start(self) -> Frame:
        n = self._next
        if self._claimed < n:  # (equal: a loan whose block raised; its slot is ours)
            try:
                self._claim.signal(n)
            except ValueError:  # moved ahead by another participant: frames look overwritten
                if self._value(self._claim_h) < n:
                    raise
            self._claimed = n
        i = (n - 1) % self.depth
        f = self._frame = Frame(self, n, self._views[i], self._slots[i], 0)
        return f

    if TYPE_CHECKING:

        def loan(self, timeout: float | None = -1.0) -> Frame:
            """The next slot as a writable :class:`Frame`, published when its ``with`` block exits
            (not when it raises: the next loan reuses the slot and the frame number).  Waits up to
            ``timeout`` seconds (default: the channel's) for ``"block"`` subscribers to release it:
            :class:`~hostless.SlowSubscriber` then.  Ctrl-C ends the wait."""

    else:
        # C (binding/channel.c), named and documented loan: the fast path (no new record, and
        # every subscriber alive and, if it blocks, past frame next - depth: the claim signaled
        # and the frame made in C), else _loan
        loan = _core.channel_method(0)

    def _loan(self, timeout: float | None = -1.0) -> Frame:
        """:meth:`loan`'s general path: _step looks at the subscribers one by one (adoption,
        the dead, the wait)."""
        self._check_use()
        t = self.timeout if timeout is not None and timeout < 0 else timeout
        deadline = None if t is None else time.monotonic() + t
        while (w := self._step(deadline)) is not None:
            points, left = w
            if points:
                try:
                    wait_any(points, left)
                except TimeoutError:
                    pass
            else:
                time.sleep(left if left is not None else _POLL)
        return self._start()

    async def loan_async(self, timeout: float | None = -1.0) -> Frame:
        """:meth:`loan` without blocking the event loop."""
        self._check_use()
        t = self.timeout if timeout is not None and timeout < 0 else timeout
        deadline = None if t is None else time.monotonic() + t
        while (w := self._step(deadline)) is not None:
            points, left = w
            if points:
                try:
                    await wait_any_async(points, left)
                except TimeoutError:
                    pass
            else:
                await asyncio.sleep(left if left is not None else _POLL)
        return self._start()

    def publish(self, data: Any, timeout: float | None = -1.0) -> int:
        """Copy ``data`` into the next slot and publish it (a loan in one call); returns its number."""
        with self.loan(timeout) as f:
            if isinstance(f.data, Buffer):
                f.data.from_host(data)
            else:
                f.data[...] = data
        return f.seq

    def _finish(self, f: Frame, ok: bool) -> None:
        self._frame = None
        if ok and not self._closed:
            self._pub.signal(f.seq)
            self._next = f.seq + 1

    @property
    def published(self) -> int:
        """The number of the last frame published (0: none yet)."""
        return self._next - 1

    def close(self) -> None:
        """Close the channel: subscribers receive the frames published so far, then ChannelClosed.
        Releases this process's references (the ring's memory lives while subscribers hold it).
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._dom.closed:
            return
        try:
            if self._pub.failure is None:
                self._pub.fail(Status.CANCEL)
            names.unpublish(self._dom, "ch:" + self.name, int(self._desc.handle))
        except (HostlessError, KeyError):
            pass
        for s in self._subs.values():
            s.release()
        self._subs.clear()
        for o in (*self._slots, self._pub, self._claim, self._desc):
            try:
                o.release()
            except HostlessError:
                pass

    def __repr__(self) -> str:
        return f"<hostless.Channel {self.name!r} depth={self.depth} published={self.published}>"


def _drop(b: Buffer) -> _Sub | None:
    """Release ``b``; the None that :meth:`Channel._adopt` returns for a record that is not ours."""
    b.release()
    return None
