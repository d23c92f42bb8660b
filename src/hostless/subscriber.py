"""The subscriber side of a channel (:mod:`hostless.channel`; docs/channels.md).

A subscriber finds the channel by name (waiting for it), validates its descriptor, and
registers under its own name: a 64-byte record buffer published as ``ch:<channel>/<name>``
naming its acknowledgement timeline (owned by it, so that its death fails the timeline with
OWNER_DIED).  A name held by a dead subscriber of the same channel is taken over: the new
subscriber publishes its record as ``ch:<channel>/<name>+`` (the dead one's record keeps the
name, held by the publisher, until the publisher promotes the successor) and starts after the
last frame the dead one acknowledged.  Of several processes taking one name over at once,
exactly one publishes its record (the name table's publish fails when the name is taken); the
others find it live and get :class:`~hostless.SubscriberNameTaken`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from . import _core, names
from .buffer import Buffer, normalize_layout
from .channel import (
    _FAILED,
    _POLICIES,
    _REC_AFTER,
    _REC_MAGIC,
    _REC_SEEN,
    _REC_WORDS,
    _SEEN,
    _STARTS,
    MAX_SUBSCRIBERS,
    SKIP,
    Frame,
    _check_name,
    _Ring,
)
from .channel_descriptor import _open_descriptor, _words
from .errors import (
    AlreadySignaled,
    ChannelClosed,
    ChannelError,
    ChannelFull,
    DomainFull,
    FrameOverwritten,
    HostlessError,
    InvalidHandle,
    NameTaken,
    SubscriberNameTaken,
)
from .status import Status

_SUCCESS = Status.SUCCESS

if TYPE_CHECKING:
    from .domain import Domain
    from .timeline import Timeline

__all__ = ["Subscriber"]


class Subscriber(_Ring):
    """Subscriber ``name`` of channel ``channel`` in ``dom`` (any process of the domain).

    ``policy``: ``"block"`` (the publisher waits for it: every frame is received) or ``"skip"``
    (the publisher never waits: when it falls ``depth`` frames behind it skips to the newest,
    ``Frame.lost`` says how many it missed).  ``start``: the first frame of a new subscriber,
    ``"newest"`` (the newest published, if any), ``"oldest"`` (the oldest still in the ring) or
    ``"next"`` (the next one published); a subscriber taking over a dead one's name starts after
    the frame it acknowledged last, whatever ``start`` says (``resumed`` is then True).
    ``timeout``: seconds to wait for the channel to be created and for a dead subscriber of the
    same name to be recovered (None: no limit).  ``shape``/``dtype``: the payload expected
    (ChannelError when the channel's differs).

    Raises TimeoutError when the channel does not appear, CorruptChannel when its descriptor is
    not valid, SubscriberNameTaken when a live subscriber has the name, ChannelFull past
    :data:`~hostless.channel.MAX_SUBSCRIBERS` or when the name table is full.  One thread uses a
    subscriber; one frame at a time."""

    def __init__(
        self,
        dom: Domain,
        channel: str,
        name: str,
        *,
        policy: str = "block",
        start: str = "newest",
        timeout: float | None = 5.0,
        shape: Any = None,
        dtype: Any = None,
    ) -> None:
        _check_name(channel, "channel")
        _check_name(name, "subscriber")
        if name.endswith("+"):
            raise ValueError(f"a subscriber name does not end with '+' (a successor's name), got {name!r}")
        if policy not in _POLICIES:
            raise ValueError(f"policy is 'block' or 'skip', got {policy!r}")
        if start not in _STARTS:
            raise ValueError(f"start is one of {', '.join(_STARTS)}, got {start!r}")
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        pub, claim, slots, desc = _open_descriptor(dom, "ch:" + channel, timeout)
        desc.release()
        self._init_ring(dom, channel, pub, claim, slots, True)
        self.sub_name, self.policy = name, policy
        self._skip = _POLICIES[policy] == SKIP
        self.lost = 0
        """Frames skipped so far (overwritten before this subscriber received them)."""
        self.resumed = False
        """True when this subscriber took over a dead one's name and resumed after its last frame."""
        try:
            if shape is not None:
                shp, dt, _n = normalize_layout(shape, dtype)
                if (shp, dt) != (self.shape, self.dtype):
                    raise ChannelError(
                        f"channel {channel!r} carries {self.shape} {self.dtype}, expected {shp} {dt}"
                    )
            self._key = f"ch:{channel}/{name}"
            self._pred = 0
            self._pred_rec: Buffer | None = None  # a successor's hold on its predecessor's record
            self._register(start, deadline)
        except BaseException:
            self._closed = True
            for o in (pub, claim, *slots):
                o.release()
            raise

    # ----------------------------------------------------------- registration
    def _judge(self, key: str, h: int) -> tuple[str, int]:
        """What the record ``h`` published as ``key`` is: "gone" (freed meanwhile), "live",
        "dead" (with the last frame it acknowledged), or "stale" (left, another channel's, or
        garbage)."""
        try:
            rec = self._dom.import_buffer(h)
        except InvalidHandle:  # freed meanwhile, or not a buffer at all
            return ("stale", 0) if names.peek(self._dom, key) == h else ("gone", 0)
        try:
            if rec.device != "cpu" or rec.nbytes != _REC_WORDS * 8:
                return "stale", 0
            w = _words(rec, _REC_WORDS)
            if w[0] != _REC_MAGIC or w[3] != self._pub_h or w[2] not in _POLICIES.values():
                return "stale", 0
            try:
                ack = self._dom.import_timeline(w[1])
            except HostlessError:
                return "stale", 0
            try:
                failure, last = ack.failure, ack.value
            except HostlessError:
                return "stale", 0
            finally:
                ack.release()
            # what a successor of it acknowledged before the publisher took it in (and died: it
            # writes there while it lives); never past the frames published
            after = min(int(w[_REC_AFTER]), self._value(self._pub_h))
        finally:
            rec.release()
        if failure is None:
            return "live", last
        return ("stale", 0) if failure == Status.CANCEL else ("dead", max(last, after))

    def _first(self, start: str) -> int:
        p, c = self._value(self._pub_h), self._value(self._claim_h)
        if start == "next":
            return p + 1
        if start == "newest":
            return p if p >= 1 and c < p + self.depth else p + 1
        return min(p + 1, max(1, c - self.depth + 1))

    def _register(self, start: str, deadline: float | None) -> None:
        """Publish our record as ``ch:<channel>/<name>`` (a new name), or as ``<that>+`` when a
        dead subscriber holds the name (we resume after its last acknowledged frame; the
        publisher promotes us to the name).  Both publishes fail when the name is taken, so of
        several processes only one gets either."""
        dom, key = self._dom, self._key
        reaped = False
        after = 0  # the last frame a dead successor acknowledged (its record, while it is still named)
        while True:
            if deadline is not None and time.monotonic() > deadline + 1.0:  # (a live holder: below)
                raise ChannelError(f"subscriber {self.sub_name!r}: its name kept changing; try again")
            h = names.peek(dom, key)
            if h is None:
                if self._publish(key, self._first(start), False):
                    return
                continue
            verdict, last = self._judge(key, h)
            if verdict == "stale":
                _unpublish(dom, key, h)
            if verdict in ("stale", "gone"):
                continue
            if verdict == "dead":  # take it over, as its successor
                hs = names.peek(dom, key + "+")
                if hs is None:
                    if self._publish(key + "+", max(last, after) + 1, True):
                        self._pred = h
                        try:  # held while we are not taken in: our acknowledgements go there too
                            self._pred_rec = dom.import_buffer(h)
                        except HostlessError:  # (freed meanwhile: nothing to keep our progress in)
                            self._pred_rec = None
                            self._bind_ack(self._ack)
                        return
                    continue
                verdict, last_s = self._judge(key + "+", hs)
                if verdict in ("stale", "dead"):  # (a successor that died before the publisher saw it)
                    _unpublish(dom, key + "+", hs)
                if verdict == "dead":  # it received frames past its predecessor's: resume after them
                    after = max(after, last_s)
                if verdict != "live":
                    continue
            if not reaped:  # a live holder: maybe one killed a moment ago; recover it now
                dom.reap()
                reaped = True
                continue
            if deadline is not None and time.monotonic() >= deadline:
                raise SubscriberNameTaken(
                    f"channel {self.name!r} has a live subscriber named {self.sub_name!r}: pick "
                    "another name, or close that subscriber first"
                )
            time.sleep(0.01)

    def _publish(self, key: str, first: int, resumed: bool) -> bool:
        """Publish a record (a new acknowledgement timeline at ``first - 1``) as ``key``;
        False when another process has the name."""
        dom = self._dom
        ack = dom.timeline(initial=first - 1)
        rec: Buffer | None = None
        try:
            rec = dom.buffer(_REC_WORDS, "<u8")
            w = rec.numpy()
            w[:] = 0
            w[0], w[1], w[2], w[3] = _REC_MAGIC, ack.handle, _POLICIES[self.policy], self._pub_h
            dom.publish(key, rec)
        except NameTaken:
            _release(ack, rec)
            return False
        except DomainFull as e:
            _release(ack, rec)
            raise ChannelFull(f"cannot register subscriber {self.sub_name!r}: {e}") from None
        except BaseException:
            _release(ack, rec)
            raise
        prefix = f"ch:{self.name}/"
        if sum(1 for k in names.entries(dom) if k.startswith(prefix)) > MAX_SUBSCRIBERS:
            _unpublish(dom, key, int(rec.handle))
            _release(ack, rec)
            raise ChannelFull(f"channel {self.name!r} has {MAX_SUBSCRIBERS} subscribers already")
        self._ack, self._rec, self._ack_h = ack, rec, int(ack.handle)
        if not resumed:  # (a successor acknowledges through _finish until the publisher takes it in)
            self._bind_ack(ack)
        self._next, self.resumed = first, resumed
        return True

    @property
    def seen(self) -> bool:
        """Whether the publisher has taken this subscriber in (at its first loan after the
        subscription): from then on it holds the slots of a "block" subscriber, and keeps the
        record for a replacement if this subscriber dies."""
        return _words(self._rec, _REC_WORDS)[_REC_SEEN] == _SEEN

    # ---------------------------------------------------------------- receive
    def _ready(self, n: int) -> tuple[int, int] | None:
        """(frame, frames skipped) to hand out now, or None when frame ``n`` is not published yet."""
        lost = 0
        core, depth = self._core, self.depth
        while True:
            w = int(core.word(self._pub_h))
            if w < n:  # (a failed word is larger than any frame number)
                if lost:
                    self._skip_to(n, lost)
                return None
            p = int(core.aux(self._pub_h)) if w & _FAILED else w
            if p < n:
                st = Status(w & 0xFFFFFFFF) if w & _FAILED else Status.ACTIVE
                how = "closed it" if st == Status.CANCEL else f"ended it ({st.name})"
                raise ChannelClosed(f"channel {self.name!r}: the publisher {how} after frame {p}")
            if self._value(self._claim_h) < n + depth:
                return n, lost
            c = self._value(self._claim_h)
            m = max(n + 1, p if self._skip else c - depth + 1)
            lost += m - n
            n = m

    def _skip_to(self, n: int, lost: int) -> None:
        self.lost += lost  # frames overwritten: counted once, the wait goes on for frame n
        self._next = n

    def _hand_out(self, n: int, lost: int) -> Frame:
        self.lost += lost
        i = (n - 1) % self.depth
        f = self._frame = Frame(self, n, self._views[i], self._slots[i], lost)
        return f

    if TYPE_CHECKING:

        def receive(self, timeout: float | None = None) -> Frame:
            """The next frame as a read-only :class:`Frame`, acknowledged when its ``with`` block exits
            (also when the block raises).  Waits up to ``timeout`` seconds (None: no limit; Ctrl-C ends
            the wait): TimeoutError then.  ChannelClosed once the publisher closed or died and every
            frame it published was received.  With the ``"skip"`` policy the block's exit raises
            FrameOverwritten when the publisher overwrote the frame meanwhile."""

    else:
        # C (binding/channel.c), named and documented receive: the fast path (the engine's wait
        # for frame next, as Timeline.wait's; the frame made in C when it is published and its
        # slot not claimed again), else _receive
        receive = _core.channel_method(1)

    def _receive(self, timeout: float | None = None) -> Frame:
        """:meth:`receive`'s general path (skipping, the channel closed, unusual timeouts)."""
        if self._frame is not None or self._closed:
            self._check_use()
        n, word = self._next, self._word
        deadline = None if timeout is None else time.monotonic() + timeout
        # wait for it (at once when it is published; SUCCESS: frame n was published, also when
        # the publisher ended the channel after it)
        if timeout is None:
            st = self._pub.wait(n)
        else:
            try:
                st = self._pub.wait(n, timeout)
            except TimeoutError:
                raise self._timeout(timeout) from None
        # published and its slot not claimed for a later frame (a failed claimed word is larger
        # than any frame number): hand it out; anything else, _ready's full look (skipping, the
        # channel closed)
        if st is _SUCCESS and word(self._claim_h) < n + self.depth:
            i = (n - 1) % self.depth
            f = self._frame = Frame(self, n, self._views[i], self._slots[i], 0)
            return f
        while (r := self._ready(self._next)) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise self._timeout(timeout)
            try:
                self._pub.wait(self._next, left)
            except TimeoutError:
                raise self._timeout(timeout) from None
        return self._hand_out(*r)

    async def receive_async(self, timeout: float | None = None) -> Frame:
        """:meth:`receive` without blocking the event loop: ``with await sub.receive_async() as f``."""
        self._check_use()
        deadline = None if timeout is None else time.monotonic() + timeout
        while (r := self._ready(self._next)) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise self._timeout(timeout)
            try:
                await self._pub.wait_async(self._next, left)
            except TimeoutError:
                raise self._timeout(timeout) from None
        return self._hand_out(*r)

    def _timeout(self, timeout: float | None) -> TimeoutError:
        return TimeoutError(f"channel {self.name!r}: no frame {self._next} within {timeout} s")

    def _finish(self, f: Frame, ok: bool) -> None:
        self._frame = None
        n = f.seq
        # intact: read before the acknowledgement (after it the slot may be reused); a claimed
        # word below n + depth is not failed (a failed word is larger than any frame number)
        intact = self._word(self._claim_h) < n + self.depth or self._intact(n)
        if not self._closed:
            pred = self._pred_rec
            if pred is not None:  # a successor not taken in yet: its progress where a successor finds it
                try:
                    pred.numpy()[_REC_AFTER] = n
                except HostlessError:
                    pass
            try:
                self._ack.signal(n)  # (n is above every value this subscriber gave it)
            except (AlreadySignaled, ValueError) as e:
                if isinstance(e, AlreadySignaled) or self._value(self._ack_h) < n:
                    raise ChannelError(
                        f"subscriber {self.sub_name!r}: its acknowledgement timeline was failed or moved by "
                        f"another participant ({e}); close it and subscribe again"
                    ) from None
            self._next = n + 1
            if pred is not None and self.seen:  # taken in: the publisher holds our record now
                self._pred_rec = None
                _release(pred)
                self._bind_ack(self._ack)
        if not intact and ok:
            raise FrameOverwritten(
                f"channel {self.name!r}: frame {n} was overwritten while subscriber {self.sub_name!r} "
                "read it: discard what the block computed from it"
            )

    # ----------------------------------------------------------------- state
    @property
    def acknowledged(self) -> int:
        """The last frame this subscriber released (0: none)."""
        return self._value(self._ack_h)

    @property
    def published(self) -> int:
        """The number of the newest frame published on the channel."""
        return self._value(self._pub_h)

    def close(self) -> None:
        """Leave the channel at once (the publisher stops waiting for this subscriber; a later
        subscriber of this name starts anew).  Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._frame is not None:
            self._frame._open = False
            self._frame = None
        if self._dom.closed:
            return
        try:
            if self._ack.failure is None:
                self._ack.fail(Status.CANCEL)
        except HostlessError:
            pass
        for key in (self._key, self._key + "+"):  # (promoted by the publisher, or not yet)
            _unpublish(self._dom, key, int(self._rec.handle))
        if self._pred:  # never promoted: the dead predecessor's record must not outlive us by name
            _unpublish(self._dom, self._key, self._pred)
        _release(self._ack, self._rec, self._pred_rec, self._pub, self._claim, *self._slots)
        self._pred_rec = None

    def __repr__(self) -> str:
        return (
            f"<hostless.Subscriber {self.sub_name!r} of {self.name!r} policy={self.policy} next={self._next}>"
        )


def _release(*objs: Timeline | Buffer | None) -> None:
    for o in objs:
        if o is not None:
            try:
                o.release()
            except HostlessError:
                pass


def _unpublish(dom: Domain, key: str, h: int) -> None:
    """Remove ``key`` if it still holds ``h`` (another process may have removed it first)."""
    try:
        names.unpublish(dom, key, h)
    except (KeyError, HostlessError):
        pass
