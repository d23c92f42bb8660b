"""The notifier: one thread per domain object that sleeps on many completion
words at once (futex_waitv) and completes asyncio futures and callbacks.

It is also what makes :class:`hostless.Poller`'s descriptor readable: a poller's
watches are callables run here, which queue the completion and write the
poller's eventfd (a peer in another process cannot write our eventfd; this
thread, of our process, turns completions in shared memory into eventfd
writes).  A callable target with a ``fail(exc)`` method is told about a wait
that ended in an error (its handle released, the domain closed); other
callables are not called then."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from typing import Any

from .errors import DomainClosed, HostlessError

__all__ = ["Notifier"]

_BATCH = 127  # futex_waitv takes 128 words; one is the kick word


class Notifier:
    def __init__(self, core: Any) -> None:
        self._core = core
        self._mu = threading.Lock()
        self._entries: dict[int, tuple[int, int, Any, asyncio.AbstractEventLoop | None]] = {}
        self._ids = itertools.count()
        self._stop = False
        self._start = 0
        self._thread = threading.Thread(target=self._run, name="hostless-notifier", daemon=True)
        self._thread.start()

    def watch(
        self,
        handle: int,
        threshold: int,
        target: asyncio.Future[int] | Callable[[int], object],
        loop: asyncio.AbstractEventLoop | None,
    ) -> int:
        """Complete ``target`` (a future, or a callable taking the word) once word >= threshold.
        Returns a key for :meth:`unwatch`."""
        key = next(self._ids)
        with self._mu:
            self._entries[key] = (handle, threshold, target, loop)
        self._core.kick()
        return key

    def unwatch(self, key: int) -> bool:
        """Forget the watch ``key`` (True when it was still pending).  Its target may still
        be running (or be about to run) in the notifier thread when this returns."""
        with self._mu:
            found = self._entries.pop(key, None) is not None
        if found:
            self._core.kick()
        return found

    def stop(self) -> None:
        """Stop the thread; pending waits fail with DomainClosed."""
        self._stop = True
        self._core.kick()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        with self._mu:
            items = list(self._entries.values())
            self._entries.clear()
        for _h, _thr, target, loop in items:
            self._fire(target, loop, DomainClosed("the domain was closed while waiting"))

    @staticmethod
    def _fire(target: Any, loop: asyncio.AbstractEventLoop | None, word: int | BaseException) -> None:
        if isinstance(target, asyncio.Future):

            def done() -> None:
                if target.done():
                    return
                if isinstance(word, BaseException):
                    target.set_exception(word)
                else:
                    target.set_result(word)

            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(done)
            return
        if isinstance(word, BaseException):
            fail = getattr(target, "fail", None)
            if fail is not None:
                fail(word)
            return
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(target, word)
        else:
            try:
                target(word)
            except Exception:  # a callback's error must not kill the notifier
                import traceback

                traceback.print_exc()

    def _run(self) -> None:
        while not self._stop:
            kick = self._core.kick_value()
            with self._mu:
                items = list(self._entries.items())
            # drop futures nobody waits for any more (cancelled, timed out)
            live = []
            for key, (h, thr, target, loop) in items:
                if isinstance(target, asyncio.Future) and target.done():
                    with self._mu:
                        self._entries.pop(key, None)
                else:
                    live.append((key, h, thr, target, loop))
            # more entries than one futex_waitv takes: rotate through them,
            # sleeping at most 1 ms on each batch, so that none is starved
            if len(live) > _BATCH:
                self._start = (self._start + _BATCH) % len(live)
                live = live[self._start :] + live[: self._start]
            batch = live[:_BATCH]
            timeout = -1 if len(live) <= _BATCH else 1_000_000
            if not batch:
                timeout = -1
            try:
                ready = self._core.wait_any([(h, thr) for _, h, thr, _, _ in batch], timeout, kick)
            except HostlessError as e:
                # a handle was released under us: fail those entries one by one
                for key, h, thr, target, loop in batch:
                    try:
                        self._core.wait_any([(h, thr)], 0, kick)
                    except HostlessError:
                        with self._mu:
                            self._entries.pop(key, None)
                        self._fire(target, loop, e)
                continue
            except Exception:
                if self._stop:
                    return
                raise
            for i in ready:
                key, h, _thr, target, loop = batch[i]
                with self._mu:
                    self._entries.pop(key, None)
                try:
                    word = self._core.word(h)
                except HostlessError as e:
                    self._fire(target, loop, e)
                    continue
                self._fire(target, loop, word)
