"""A device's queue reservation is recovered with the participant that drove it.

A GPU command processor (or a CUDA peer's enqueue kernel) reserves cells as
HL_PRODUCER_DEVICE_OF(its host participant).  When that host process dies
between the reserve and the publish, its CUDA context (and the kernel) die
with it and the cell would stay RESERVED forever: the consumer waits on it and
every packet behind it.  Recovery of the host participant must SKIP such a
cell as it does the participant's own, and move write_index past it
(hl_queue_skip_reserved).  Here a C program plays the device: it reserves a
cell with the dead-to-be participant's device producer and exits without
publishing; then that participant is SIGKILLed and reaped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hostless as hl
from hostless._abi import C
from hostless.wire import Packet, PacketType

GCC = shutil.which("gcc")
HEADER_DIR = os.path.dirname(hl.abi_header_path())

PROGRAM = r"""
#define _POSIX_C_SOURCE 200809L
#include "hostless.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    hl_u64 qh = strtoull(argv[2], NULL, 0);
    hl_u32 producer = (hl_u32)strtoul(argv[3], NULL, 0);
    int fd = open(argv[1], O_RDWR);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) return 3;
    void *base = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return 4;
    struct hl_dom d;
    struct hl_qview v;
    if (hl_attach(&d, base, (hl_u64)sb.st_size) != HL_OK || hl_queue_open(&d, qh, &v) != HL_OK) return 5;
    hl_u64 w = 0;
    int r = hl_queue_reserve(&v, producer, HL_QUEUE_NO_HINT, &w);
    printf("%d %llu\n", r, (unsigned long long)w); /* reserved, never published: the device died */
    return 0;
}
"""

HOST = (
    "import sys, time, hostless as hl; d = hl.Domain.open(sys.argv[1]); "
    "print(d.participant_id & 255, flush=True); time.sleep(600)"
)


@pytest.mark.skipif(GCC is None, reason="gcc is not installed: cannot build the device stand-in")
@pytest.mark.parametrize("own", [False, True], ids=["device-of-host", "host-itself"])
def test_reservation_of_a_dead_host_is_skipped(domain_name: str, tmp_path: Path, own: bool) -> None:
    src = tmp_path / "device.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "device"
    b = subprocess.run([GCC, "-std=c11", "-Wall", "-Werror", f"-I{HEADER_DIR}", str(src), "-o", str(exe)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert b.returncode == 0, b.stderr
    with hl.Domain.create(domain_name, poll_interval=0.005, heap="1M") as d:
        q = d.queue(4)
        q.bind()
        host = subprocess.Popen([sys.executable, "-c", HOST, domain_name], stdout=subprocess.PIPE, text=True)
        try:
            assert host.stdout is not None
            idx = int(host.stdout.readline())
            producer = idx if own else int(C.PRODUCER_DEVICE_BASE) + idx
            r = subprocess.run([str(exe), f"/dev/shm/{domain_name}", hex(q.handle), str(producer)],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
            assert r.returncode == 0 and r.stdout.split() == ["0", "0"], r
            a = Packet(type=PacketType.BARRIER, kernel=7)
            assert q.push(a, timeout=5) == 1  # behind the reserved cell
            assert q.pop(timeout=0.2) is None  # the consumer waits on cell 0
        finally:
            host.kill()
            host.wait()
        got = None
        deadline = time.monotonic() + 20
        while got is None and time.monotonic() < deadline:
            d.reap()
            got = q.pop(timeout=0.05)
        assert got is not None, "the dead host's reservation still holds the queue"
        assert got[1].kernel == 7
        # the queue is whole: pushes and pops go on (write_index was not left behind)
        for k in range(6):
            q.push(Packet(type=PacketType.BARRIER, kernel=100 + k), timeout=5)
            assert q.pop(timeout=5)[1].kernel == 100 + k  # type: ignore[index]
