"""The smaller trust and robustness fixes of issue 21, item 5, one regression test each."""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import subprocess
import textwrap

import pytest

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


PROBE_TRUNCATED = """
os.ftruncate(d.fileno(), 4096)
try:
    f.signal()  # its slot is past the new end: the fault (the guard maps a zero page there)
except hl.HostlessError:
    pass
try:
    d.fence()
    print("no error")
except hl.HostlessError as e:
    print("error:", type(e).__name__)
d.close()
"""


def survives_truncation(setup: str, after: str, *args: object) -> None:
    """A child runs ``setup`` (which leaves a domain ``d`` and a fence ``f`` of it), truncates
    the domain's file under it and uses it, then ``after``: it must live on and see
    CorruptDomain (killed by SIGBUS: exit -7)."""
    code = textwrap.dedent(setup) + PROBE_TRUNCATED + textwrap.dedent(after) + '\nprint("closed")\n'
    out = run_child(code, *args, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert "error: CorruptDomain" in out.stdout and "closed" in out.stdout, out.stdout


def test_sigbus_guard_outlives_another_librarys_handler(domain_name: str) -> None:
    """A library that installs its own SIGBUS handler after hostless did (Ray does; here
    faulthandler) took the guard's place, and a truncated domain then killed the process (a
    merged test run saw it): opening a domain puts the guard back in front."""
    survives_truncation(
        """
        import faulthandler
        name = sys.argv[1]
        first = hl.Domain.create(f"{name}-a", fences=16, participants=2)
        faulthandler.enable()  # SIGBUS is now faulthandler's
        d = hl.Domain.create(f"{name}-b", fences=16, participants=2)
        for n in ("a", "b"):
            hl.Domain.unlink(f"{name}-{n}")
        f = d.fence()
        """,
        "first.close()",
        domain_name,
    )


@pytest.mark.parametrize("how", ["watchdog", "guard_front"])
def test_sigbus_guard_comes_back_in_front_without_another_open(domain_name: str, how: str) -> None:
    """The same with no domain opened after the other handler: ``ray.init()`` in a driver that
    already had its domain open (hostless.cluster's Cluster) left Ray's handler in front, and
    a truncation of that domain killed the process (SIGBUS, exit 135).  The watchdog puts the
    guard back on its next tick; ``_core.guard_front()`` (what Cluster calls after
    ``ray.init``) does it at once."""
    survives_truncation(
        """
        import faulthandler
        name, how = sys.argv[1], sys.argv[2]
        wd = 0.02 if how == "watchdog" else 0
        d = hl.Domain.create(name, fences=16, participants=2, watchdog_interval=wd)
        hl.Domain.unlink(name)
        f = d.fence()
        faulthandler.enable()  # SIGBUS is now faulthandler's, as ray.init makes it Ray's
        if how == "watchdog":
            time.sleep(0.2)  # a few ticks
        else:
            hl._core.guard_front()
        """,
        "",
        domain_name,
        how,
    )


def test_sigbus_guard_covers_every_open_domain(domain_name: str) -> None:
    """With more domains open than the guard's first table (256), a truncated file killed
    the process with SIGBUS: the guard grows and every mapping stays guarded."""
    survives_truncation(
        """
        name = sys.argv[1]
        doms = []
        for i in range(300):
            doms.append(hl.Domain.create(f"{name}-{i}", fences=16, participants=2))
            hl.Domain.unlink(f"{name}-{i}")  # the mapping stays; the name goes now
        d = doms[-1]  # the last one: past the first table
        f = d.fence()
        """,
        """
        for other in doms[:-1]:
            other.close()
        """,
        domain_name,
    )


def test_info_escapes_control_characters(dom: hl.Domain, capsys) -> None:  # type: ignore[no-untyped-def]
    """Labels, names and records are written by any participant: ``hostless info`` once
    printed their terminal escape sequences raw (recolouring, retitling, hiding lines)."""
    from hostless import cli

    evil = "\x1b]0;owned\x07\x1b[2J\u202e"
    assert dom.name is not None
    d = hl.Domain.create(f"{dom.name}-i", heap="1M", fences=64)
    try:
        with hl.Domain.open(d.name, label="x\x1b[31mred") as peer:
            f = peer.fence()
            d.publish("n" + evil, f)
            g = d.fence()
            g.signal(hl.Status.ERROR)
            rec = records.Recorder(d)
            assert rec.write(g.handle, "line one" + evil + "\nline two")
            assert cli.main(["info", str(d.name)]) == 0
            out = capsys.readouterr().out
            rec.close()
    finally:
        d.close()
        hl.Domain.unlink(f"{dom.name}-i")
    assert not any(ch in out for ch in "\x1b\x07\u202e"), out
    assert "x\\x1b[31mred" in out and "n\\x1b]0;owned\\x07\\x1b[2J\\u202e" in out
    assert "line one\\x1b]0;owned" in out and "\n  line two" in out


@pytest.mark.parametrize("pid", ["4294967295", "2147483648", "-1", "0", "0x100000000"])
def test_agent_exe_rejects_a_parent_pid_out_of_range(pid: str) -> None:
    """``--parent 4294967295`` became ``kill(-1, 0)`` (always "alive"): the agent never
    noticed its parent's death.  Pids are 1..INT_MAX; anything else is a usage error."""
    from hostless import agents

    r = subprocess.run(
        [agents.executable_path(), "--domain", "x", "--queue", "q", "--parent", pid],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert r.returncode == 2, r
    assert "--parent: not a pid" in r.stderr


def test_export_buffer_is_read_only_unless_asked(dom: hl.Domain) -> None:
    """``export_buffer`` handed out read-write access to the whole domain by default;
    now the fd is read-only unless ``writable=True``, and imports map it read-only."""
    assert dom.name is not None
    d = hl.Domain.create(f"{dom.name}-x", heap="1M", fences=64)
    try:
        b = d.buffer((4096,), "u1")
        b.numpy()[:] = 7
        fd, offset, n = hl.export_buffer(b)
        try:
            assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
            with pytest.raises(PermissionError):
                mmap.mmap(fd, offset + n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            view = hl.ExternalBuffer.from_fd(fd, (n,), "u1", offset=offset)  # the documented import
            assert not view.numpy().flags.writeable and (view.numpy() == 7).all()
            view.close()
        finally:
            os.close(fd)
        fd, offset, n = hl.export_buffer(b, writable=True)
        try:
            assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR
            view = hl.ExternalBuffer.from_fd(fd, (n,), "u1", offset=offset)
            view.numpy()[:] = 9
            view.close()
            assert (b.numpy() == 9).all()
        finally:
            os.close(fd)
        b.release()
    finally:
        d.close()
        hl.Domain.unlink(f"{dom.name}-x")


def test_replace_stale_over_a_symlink_raises_the_documented_error(domain_name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``replace_stale=True`` over a symbolic link raised a bare OSError (ELOOP); the
    documented answer is FileExistsError saying why, and the link and its target stay."""
    target = tmp_path / "target"
    target.write_bytes(b"not yours")
    link = f"/dev/shm/{domain_name}"
    os.symlink(target, link)
    try:
        with pytest.raises(FileExistsError, match="symbolic link"):
            hl.Domain.create(domain_name, replace_stale=True)
        assert os.path.islink(link) and target.read_bytes() == b"not yours"
    finally:
        os.unlink(link)


@pytest.mark.parametrize("cap", [2**63, 2**64, -(2**63) - 1, 2**21, 3, 0])
def test_queue_capacity_out_of_range_is_a_value_error(dom: hl.Domain, cap: int) -> None:
    """``dom.queue(2**63)`` raised OverflowError from the C conversion."""
    with pytest.raises(ValueError, match=r"power of two in 2\.\.2\^20"):
        dom.queue(cap)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, -1.0, 1e300])
def test_spin_is_checked_before_it_is_stored(dom: hl.Domain, bad: float) -> None:
    """``dom.spin = inf`` (or nan) stored the value and then raised OverflowError /
    ValueError from the conversion; now a ValueError comes first and nothing changes."""
    before = dom.spin
    with pytest.raises(ValueError, match="spin"):
        dom.spin = bad
    assert dom.spin == before
    f = dom.fence()
    with pytest.raises(ValueError, match="spin"):
        f.wait(0, spin=bad)
    f.release()


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_float_options_refuse_nan_and_inf(bad: float) -> None:
    """Queue.pop and spawn options take no nan or inf (the agent loops would convert
    them to nanoseconds: OverflowError, or undefined behaviour in C)."""
    from hostless import agents

    d = hl.Domain.create(f"hlfloat-{os.getpid()}", heap="1M", fences=64)
    try:
        q = d.queue(4)
        with pytest.raises(ValueError, match="spin"):
            q.pop(0, spin=bad)
        for opt in ("spin", "wait_timeout", "follow_timeout", "idle_poll"):
            with pytest.raises(ValueError, match=opt):
                agents.spawn(d, queue=q, **{opt: bad})  # refused before anything starts
        assert d.participants and len(d.participants) == 1
    finally:
        d.close()
        hl.Domain.unlink(f"hlfloat-{os.getpid()}")


def test_table_cells_are_text_not_markup(capsys: pytest.CaptureFixture[str]) -> None:
    """A label such as ``[red]x`` or ``hostless[bench]`` (text read from a domain, or an install
    hint) prints as written: rich markup in a cell is never interpreted."""
    pytest.importorskip("rich")
    from hostless.tables import print_table

    print_table("[bold]t", ["[h]"], [["pip install 'hostless[bench]'"], ["[red]label[/red]"]])
    out = capsys.readouterr().out
    assert "[bold]t" in out and "[h]" in out
    assert "hostless[bench]" in out and "[red]label[/red]" in out
