"""How processes share a device heap's allocation (hostless.devmem.Broker), without a GPU.

The broker passes any file descriptor; here a memfd stands for the CUDA
allocation, and its first 16 bytes hold the generation its creator chose, so a
process that reads them back proves it holds the very same file.  Checked: a
second process fetches the first's allocation; it outlives its creator while
another holder lives; with no holder left the next process creates a fresh one;
processes starting at once create exactly one; a holder that answers garbage is
skipped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from hostless.devmem import Allocation, Broker

CHILD = r"""
import os, sys
from hostless.devmem import Allocation, Broker

key, start = sys.argv[1], float(sys.argv[2])
b = Broker(key, 0)

def create():
    fd = os.memfd_create("hostless-test-heap")
    os.ftruncate(fd, 1 << 16)
    gen = os.urandom(16)
    os.pwrite(fd, gen, 0)
    return fd, Allocation(1 << 16, 4096, 0, gen)

import time
while time.time() < start:  # processes started together race for the creation lock
    pass
fd, info, created = b.acquire(create, timeout=20)
if not created:
    b.serve(fd, info)  # a holder serves it too
print(int(created), info.generation.hex(), os.pread(fd, 16, 0).hex(), flush=True)
sys.stdin.readline()  # hold it until told
"""


class Holder:
    def __init__(self, key: str, start: float = 0.0) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-c", CHILD, key, repr(start)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def result(self) -> tuple[bool, str, str]:
        assert self.p.stdout is not None
        line = self.p.stdout.readline().split()
        assert len(line) == 3, f"child said {line!r} (exit {self.p.poll()})"
        return line[0] == "1", line[1], line[2]

    def leave(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write("\n")
        self.p.stdin.flush()
        assert self.p.wait(30) == 0


@pytest.fixture
def key() -> str:
    return f"test{uuid.uuid4().hex[:12]}"


def test_a_second_process_gets_the_same_allocation_and_it_outlives_its_creator(key):
    a = Holder(key)
    created_a, gen_a, content_a = a.result()
    assert created_a and content_a == gen_a
    b = Holder(key)
    created_b, gen_b, content_b = b.result()
    assert not created_b and gen_b == gen_a and content_b == gen_a  # the same file
    a.leave()  # the creator goes; b still holds and serves it
    c = Holder(key)
    created_c, gen_c, content_c = c.result()
    assert not created_c and gen_c == gen_a and content_c == gen_a
    b.leave()
    c.leave()
    d = Holder(key)  # no holder left: a fresh allocation
    created_d, gen_d, content_d = d.result()
    assert created_d and gen_d != gen_a and content_d == gen_d
    d.leave()


def test_processes_starting_together_create_exactly_one(key):
    start = time.time() + 1.5
    hs = [Holder(key, start) for _ in range(6)]
    res = [h.result() for h in hs]
    assert sum(1 for created, _, _ in res if created) == 1
    assert len({gen for _, gen, _ in res}) == 1
    assert all(content == gen for _, gen, content in res)
    for h in hs:
        h.leave()


def test_a_holder_answering_garbage_is_skipped(key):
    bogus = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bogus.bind(f"\0hostless/{key}/dh0/p999999")
    bogus.listen(4)

    def serve_junk() -> None:
        while True:
            try:
                conn, _ = bogus.accept()
            except OSError:
                return
            conn.sendall(b"not a hello")  # and no descriptor
            conn.close()

    threading.Thread(target=serve_junk, daemon=True).start()
    try:
        br = Broker(key, 0)
        made = []

        def create() -> tuple[int, Allocation]:
            fd = os.memfd_create("hostless-test-heap")
            os.ftruncate(fd, 4096)
            made.append(fd)
            return fd, Allocation(4096, 4096, 0, b"g" * 16)

        fd, info, created = br.acquire(create, timeout=5)
        assert created and fd == made[0] and info.generation == b"g" * 16
        h = Holder(key)  # another process skips the junk server and fetches ours
        created_h, gen_h, _ = h.result()
        assert not created_h and gen_h == (b"g" * 16).hex()
        h.leave()
        br.close()
        os.close(fd)
    finally:
        bogus.close()
