"""Hostile or corrupted shared memory: an innocent process that has the domain
mapped gets errors, never a crash, a hang or a write outside the mapping.

Each case runs in a child interpreter that joins a domain, corrupts it with
pwrite() into its file (as a buggy or hostile participant could) and then
keeps using it, so a crash shows up as the child's signal, not as a dead test
run.  (More cases belong to the hostile-memory issue; this file starts it.)
"""

from __future__ import annotations

from conftest import run_child

POKE = """
    import os
    def poke(name, offset, value, size=8):
        fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
        try:
            os.pwrite(fd, value.to_bytes(size, "little"), offset)
        finally:
            os.close(fd)
"""


def test_trace_capacity_rewritten_after_attach(domain_name: str) -> None:
    """The ring's capacity is validated at attach and used from a private copy:
    0 (was SIGFPE in every signal) or huge values (were writes anywhere)."""
    body = POKE + """
    name = sys.argv[1]
    with hl.Domain.create(name, trace="64K") as d:
        off = int(d.header()["trace_offset"])
        f = d.fence()
        poke(name, off + 8, 0)  # capacity
        f.signal()
        f.release()
        poke(name, off + 8, 1 << 60)
        poke(name, off + 16, 1 << 59)  # write index
        for _ in range(100):
            g = d.fence()
            g.signal()
            g.release()
        print("check", d.check())
    """
    r = run_child(body, domain_name)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "check []" in r.stdout
