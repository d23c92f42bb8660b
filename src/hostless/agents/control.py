"""The private load channel between an agent and the process that spawned it.

Code reaches an agent only on its spawner's word.  :func:`hostless.agents.spawn`
makes a Unix socket pair for each Python cpu agent, keeps one end (never
inherited by its other children: close-on-exec) and passes the other to the
agent alone (``pass_fds``; the agent marks it close-on-exec at once, so what the
agent itself starts does not get it).  No name in the file system or in the
abstract namespace leads to it: only these two processes hold it.

:meth:`hostless.agents.Agent.load_function` sends a request (module, qualified
name, the spawner's ``sys.path`` entries, the script file of a ``__main__``
function, scalars, the kernel id) and reads the agent's reply (the id, or the
agent's error with its traceback) with its timeout enforced.  The agent serves
the channel in a thread (:func:`serve`); the function becomes a kernel id its
loop dispatches (:class:`hostless.agents.native.NativeCallbacks`).  A LOAD_KERNEL
packet pushed into the agent's queue, by anyone, is refused
(:data:`LOAD_REFUSED`): nothing is imported.

Frames: a little-endian u32 length, then that many bytes of UTF-8 JSON (at most
:data:`MAX_FRAME`).  Each request carries a sequence number that its reply
repeats, so a late reply to a request that timed out is never taken for the
answer to a later one.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from typing import Any, Protocol

__all__ = ["MAX_FRAME", "LOAD_REFUSED", "Reader", "send", "serve", "adopt", "peer_credentials"]

MAX_FRAME = 1 << 20
"""Longest frame (bytes of JSON) either end sends or accepts."""

LOAD_REFUSED = (
    "LOAD_KERNEL refused: code is loaded only through the spawner's private channel "
    "(Agent.load_function), never from the agent's queue; nothing was imported"
)
"""The failure record of a LOAD_KERNEL packet (whoever pushed it)."""

_HEAD = struct.Struct("<I")


class _Loader(Protocol):
    def load_function(self, req: dict[str, Any]) -> int | dict[str, Any]: ...


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no time left")
    return left


def send(sock: socket.socket, obj: dict[str, Any], deadline: float | None = None) -> None:
    """Send ``obj`` as one frame before ``deadline`` (``time.monotonic()``; None: block).
    TimeoutError when it passes (part of the frame may have been sent: the channel is
    then out of step and must not be used again); ValueError for a frame over MAX_FRAME."""
    data = json.dumps(obj).encode()
    if len(data) > MAX_FRAME:
        raise ValueError(f"a load request of {len(data)} bytes is over the channel's {MAX_FRAME}")
    # a deadline already past still gets a moment: a small frame into an idle socket is sent at once
    sock.settimeout(None if deadline is None else max(1e-3, deadline - time.monotonic()))
    sock.sendall(_HEAD.pack(len(data)) + data)


class Reader:
    """Reads frames from one socket; keeps a partial frame across timeouts, so a
    read that timed out leaves the stream in step."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def _frame(self) -> dict[str, Any] | None:
        if len(self.buf) < _HEAD.size:
            return None
        (n,) = _HEAD.unpack_from(self.buf)
        if n > MAX_FRAME:
            raise ValueError(f"a frame of {n} bytes is over the channel's {MAX_FRAME}")
        if len(self.buf) < _HEAD.size + n:
            return None
        data = bytes(self.buf[_HEAD.size : _HEAD.size + n])
        del self.buf[: _HEAD.size + n]
        obj = json.loads(data)
        if not isinstance(obj, dict):
            raise ValueError("a frame that is not a JSON object")
        return obj

    def read(self, sock: socket.socket, deadline: float | None = None) -> dict[str, Any] | None:
        """The next frame, None at the end of the stream; TimeoutError when ``deadline``
        passes first (nothing lost); ValueError for a malformed frame."""
        while True:
            obj = self._frame()
            if obj is not None:
                return obj
            sock.settimeout(_left(deadline))
            chunk = sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end (SO_PEERCRED; for a socket pair,
    the process that made it)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def serve(sock: socket.socket, loop: _Loader) -> None:
    """Serve load requests on ``sock`` (in the agent, a thread) until the spawner closes
    it: each request is ``loop.load_function(request)``; the reply is ``{"seq", "ok": true,
    "id"}`` or ``{"seq", "ok": false, "error"}`` (the exception's type, message and
    traceback).  Returns on the end of the stream or a malformed frame."""
    from ..stagefn import format_error

    reader = Reader()
    while True:
        try:
            req = reader.read(sock)
        except (OSError, ValueError):
            return
        if req is None:
            return
        seq = req.get("seq")
        reply: dict[str, Any]
        try:
            r = loop.load_function(req)
            reply = {"seq": seq, "ok": True, "id": r}
            if isinstance(r, dict):
                reply = {**r, "seq": seq, "ok": True}
        except (Exception, SystemExit) as e:  # the import's own errors travel to the spawner
            reply = {"seq": seq, "ok": False, "error": format_error(e)}
        try:
            send(sock, reply)
        except (OSError, ValueError):
            return


def adopt(fd: int, parent: int) -> socket.socket:
    """The agent's end of the channel from descriptor ``fd``: made close-on-exec, and
    checked to come from ``parent`` (the spawner) with this process's uid.  ValueError
    when it does not."""
    os.set_inheritable(fd, False)
    sock = socket.socket(fileno=fd)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise ValueError(f"descriptor {fd} is not a Unix stream socket")
    pid, uid, _gid = peer_credentials(sock)
    if pid != parent or uid != os.getuid():
        sock.close()
        raise ValueError(
            f"the load channel comes from pid {pid} uid {uid}, "
            f"not from the spawner (pid {parent}, uid {os.getuid()})"
        )
    sock.settimeout(None)
    return sock
