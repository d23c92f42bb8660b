"""The smaller trust and robustness fixes of issue 21, item 5, one regression test each."""

from __future__ import annotations

import hostless as hl
from conftest import run_child
from hostless import records


def test_failure_records_leave_the_name_table_to_the_user(dom: hl.Domain) -> None:
    """6 writers x 8 records (6 native agents failing 8 times each) once filled the 47-entry
    name table, and the user's publish got DomainFull; records now hold a bounded share."""
    d = hl.Domain.create(f"{dom.name}-r", heap="1M", fences=512)
    try:
        writers = [records.Recorder(d) for _ in range(6)]
        failed = []
        for _ in range(8):
            for w in writers:
                f = d.fence()
                f.signal(hl.Status.ERROR)
                assert w.write(f.handle, f"failure of {f.handle:x}")
                failed.append(f)
        user = [d.fence() for _ in range(30)]
        for i, f in enumerate(user):
            d.publish(f"user-{i}", f)  # DomainFull before the fix
        assert all(d.lookup(f"user-{i}").handle == f.handle for i, f in enumerate(user))
        # the newest failure's record is there; records take at most their share
        assert records.read(d, failed[-1].handle) == f"failure of {failed[-1].handle:x}"
        assert sum(n.startswith(records.PREFIX) for n in d.names()) <= 47 - 30
        for w in writers:
            w.close()
    finally:
        d.close()
        hl.Domain.unlink(f"{dom.name}-r")


def test_sigbus_guard_covers_every_open_domain(domain_name: str) -> None:
    """With more domains open than the guard's first table (256), a truncated file killed
    the process with SIGBUS: the guard grows and every mapping stays guarded."""
    out = run_child(
        """
        name = sys.argv[1]
        doms = []
        try:
            for i in range(300):
                doms.append(hl.Domain.create(f"{name}-{i}", fences=16, participants=2, heap=0, queues=0, trace=0))
                hl.Domain.unlink(f"{name}-{i}")  # the mapping stays; the name goes now
            last = doms[-1]
            f = last.fence()
            os.ftruncate(last.fileno(), 4096)
            try:
                f.signal()  # touches the truncated page: a zero page, no SIGBUS
            except hl.HostlessError:
                pass
            try:
                last.fence()
                print("no error")
            except hl.HostlessError as e:
                print("error:", type(e).__name__)
        finally:
            for d in doms:
                d.close()
        print("closed")
        """,
        domain_name,
        timeout=120,
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert "error: CorruptDomain" in out.stdout, out.stdout
    assert "closed" in out.stdout
