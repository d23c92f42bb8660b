"""Code is loaded only on the word of an agent's spawner (issue 21, item 1).

A participant that may push into an agent's queue must not make the agent
import a file of its choice: a LOAD_KERNEL packet fails alone with ERROR and a
record saying that code is loaded only through the spawner's private channel,
and nothing is imported, for the default agent (the engine's C loop with its
Python callbacks) and the hostless-agent executable.  As root, an unprivileged second user (created by
the test) who can write a 0o666 domain gets nothing run as root.
``Agent.load_function`` goes through the private channel, with its timeout
enforced against an agent that never answers.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hostless as hl
from hostless import agents, records
from hostless.errors import WritableDomainWarning
from hostless.kernels import FUNCTION_KERNEL_BASE, LOAD_KERNEL, kernel_id

S = hl.Status
MODES: list[Any] = [None, "exe"]  # the default agent (the C loop in a Python worker), hostless-agent
REFUSED = "code is loaded only through the spawner's private channel"


def doubled(x: np.ndarray) -> np.ndarray:
    """A stage function the spawner loads (the agent imports this module by name)."""
    return x * 2


@pytest.fixture(scope="module")
def dom() -> Iterator[hl.Domain]:
    name = f"hltest-tx-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with hl.Domain.create(name, heap="16M", label="host", unlink_on_close=True) as d:
        yield d


def _agent(d: hl.Domain, native: Any, **kw: Any) -> agents.Agent:
    if native == "exe":
        try:
            agents.executable_path()
        except FileNotFoundError as e:
            pytest.skip(str(e))
    label = f"tx-{native or 'default'}"
    return agents.spawn(d, "cpu", native=native, label=label, wait_timeout=5.0, **kw)


def _hostile_module(where: Path) -> tuple[str, Path]:
    """A module that, once imported, writes a marker file with the importer's uid."""
    name = f"hl_pwn_{uuid.uuid4().hex[:8]}"
    marker = where / f"{name}.pwned"
    (where / f"{name}.py").write_text(
        f"import os\nopen({str(marker)!r}, 'w').write(str(os.getuid()))\ndef f(x):\n    return x\n"
    )
    return name, marker


def _push_load(d: hl.Domain, q: hl.Queue, request: dict[str, Any]) -> tuple[S, str | None]:
    """What a hostile participant does: a LOAD_KERNEL packet with ``request`` in its buffer."""
    raw = json.dumps(request).encode()
    buf = d.buffer((len(raw) + 4096,), "u1")
    buf.numpy()[:] = 0
    buf.numpy()[: len(raw)] = np.frombuffer(raw, np.uint8)
    ka = hl.Kernargs(buffers=[buf.handle]).to_buffer(d)
    f = d.fence()
    try:
        q.push(hl.Packet(kernel=LOAD_KERNEL, args=ka.handle, signal=f.handle), timeout=10)
        st = f.wait(20)
        return st, records.read(d, f.handle)
    finally:
        f.release()
        ka.release()
        buf.release()


def _run(d: hl.Domain, a: agents.Agent, kernel: int, x: np.ndarray) -> tuple[S, np.ndarray, str | None]:
    bx, bo = d.buffer(x.shape, x.dtype), d.buffer(x.shape, x.dtype)
    bx.numpy()[...] = x
    bo.numpy()[...] = 0
    ka = hl.Kernargs(buffers=[bx.handle, bo.handle]).to_buffer(d)
    f = d.fence(owner=a.id)
    try:
        a.queue.push(hl.Packet(kernel=kernel, args=ka.handle, signal=f.handle), timeout=10)
        st = f.wait(20)
        return st, bo.numpy().copy(), records.read(d, f.handle)
    finally:
        f.release()
        ka.release()
        bx.release()
        bo.release()


@pytest.mark.parametrize("native", MODES, ids=["default", "exe"])
@pytest.mark.parametrize("how", ["module", "main-file"])
def test_a_producer_cannot_make_an_agent_import_a_file(
    dom: hl.Domain, tmp_path: Path, native: Any, how: str
) -> None:
    name, marker = _hostile_module(tmp_path)
    kid = FUNCTION_KERNEL_BASE + 4242
    if how == "module":
        request = {"module": name, "qualname": "f", "path": [str(tmp_path)], "id": kid, "scalars": []}
    else:
        request = {"module": "__main__", "qualname": "f", "file": str(tmp_path / f"{name}.py"), "id": kid}
    a = _agent(dom, native)
    try:
        st, why = _push_load(dom, a.queue, request)
        assert st is S.ERROR
        assert not marker.exists(), "the agent imported a file a producer named"
        assert why is not None and "LOAD_KERNEL" in why and "refused" in why
        if native != "exe":
            assert REFUSED in why
        # nothing was registered under the requested id, and the agent goes on serving
        st, _out, why = _run(dom, a, kid, np.ones(4, np.float32))
        assert st is S.ERROR and not marker.exists()
        st, out, _why = _run(dom, a, kernel_id("copy"), np.arange(4.0, dtype=np.float32))
        assert st is S.SUCCESS and out.tolist() == [0.0, 1.0, 2.0, 3.0]
        if native != "exe":  # the spawner still loads code, through its own channel
            k = a.load_function(doubled)
            st, out, why = _run(dom, a, k, np.arange(4.0, dtype=np.float32))
            assert st is S.SUCCESS and out.tolist() == [0.0, 2.0, 4.0, 6.0], why
        assert a.alive
    finally:
        a.stop()


def test_load_function_times_out_against_an_agent_that_never_answers(dom: hl.Domain) -> None:
    """The reply is read with the caller's timeout (no blocking read past it); a late reply
    to the timed-out request is not taken for the answer to the next one."""
    a = _agent(dom, None)
    try:
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(TimeoutError, match="did not answer"):
                a.load_function(doubled, timeout=0.5)
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        k = a.load_function(doubled, [], timeout=30)
        st, out, why = _run(dom, a, k, np.arange(3.0, dtype=np.float32))
        assert st is S.SUCCESS and out.tolist() == [0.0, 2.0, 4.0], why
        with pytest.raises(TimeoutError, match="did not answer"):  # no time at all: nothing sent
            a.load_function(doubled, [1], timeout=0)
        assert a.load_function(doubled, [], timeout=30) == k
        # an agent that died under us: a clear error, not a hang
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait()
        with pytest.raises(hl.HostlessError, match="closed its load channel"):
            a.load_function(doubled, [2], timeout=30)
    finally:
        a.stop()


def test_the_channel_is_private_to_the_spawner(dom: hl.Domain) -> None:
    """The agent's end of the channel is not inherited by what the agent starts, and the
    spawner's end is not inherited by the spawner's other children."""
    a = _agent(dom, None)
    try:
        assert a._control is not None
        assert not os.get_inheritable(a._control.fileno())
        fd = int(a.proc.args[a.proc.args.index("--control") + 1])
        flags = Path(f"/proc/{a.proc.pid}/fdinfo/{fd}").read_text()
        assert "socket:" in os.readlink(f"/proc/{a.proc.pid}/fd/{fd}")
        o_cloexec = 0o2000000
        cloexec = int(flags.split("flags:")[1].split()[0], 8) & o_cloexec
        assert cloexec, "the agent's end of the channel would leak into what it starts"
    finally:
        a.stop()
    assert a._control is None


def test_spawning_a_code_loading_agent_on_a_writable_domain_warns() -> None:
    name = f"hltest-txw-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with hl.Domain.create(name, heap="8M", mode=0o666, unlink_on_close=True) as d:
        with pytest.warns(WritableDomainWarning, match="writable by other users"):
            a = agents.spawn(d, "cpu")
        a.stop()
        try:
            agents.executable_path()
        except FileNotFoundError:
            pass
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error", WritableDomainWarning)
                agents.spawn(d, "cpu", native="exe").stop()  # loads no code: no warning
    with hl.Domain.create(name, heap="8M", mode=0o600, unlink_on_close=True) as d:
        with warnings.catch_warnings():
            warnings.simplefilter("error", WritableDomainWarning)
            agents.spawn(d, "cpu").stop()


# ------------------------------------------------------------------- cross-user


@pytest.fixture
def other_user() -> Iterator[pwd.struct_passwd]:
    """An unprivileged user created for the test (``nobody`` when useradd fails)."""
    if os.geteuid() != 0:
        pytest.skip("the cross-user case needs root (to run a second, unprivileged user)")
    name = f"hltx{uuid.uuid4().hex[:8]}"
    made = False
    if shutil.which("useradd"):
        r = subprocess.run(
            ["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        made = r.returncode == 0
    try:
        try:
            pw = pwd.getpwnam(name if made else "nobody")
        except KeyError:
            pytest.skip("cannot create an unprivileged user (useradd failed) and there is no 'nobody'")
        if pw.pw_uid == 0:
            pytest.skip("the second user is root")
        yield pw
    finally:
        if made:
            subprocess.run(["userdel", name], capture_output=True, timeout=60)


def _attack(name: str, qh: int, where: str) -> dict[str, Any]:
    """What the second user does (in a child that dropped to that user): write a module into
    a directory of its own and push a LOAD_KERNEL packet naming it into the agent's queue."""
    os.makedirs(where)
    mod = "hl_pwn_" + os.path.basename(where).replace("-", "_")
    marker = os.path.join(where, "pwned")
    with open(os.path.join(where, mod + ".py"), "w") as fh:
        fh.write(f"import os\nopen({marker!r}, 'w').write(str(os.getuid()))\ndef f(x):\n    return x\n")
    request = {"module": mod, "qualname": "f", "path": [where], "id": FUNCTION_KERNEL_BASE + 7}
    with hl.Domain.open(name, label="attacker", allow_other_owner=True) as d:
        q = d.import_queue(qh)
        try:
            st, why = _push_load(d, q, request)
        finally:
            q.release()
    return {"uid": os.getuid(), "status": st.name, "why": why}


def _as_user(pw: pwd.struct_passwd, fn: Any, *args: Any) -> dict[str, Any]:
    """``fn(*args)`` in a forked child running as ``pw`` (no supplementary groups, none of
    this process's descriptors but its result pipe); its JSON result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.closerange(3, w)
            os.closerange(w + 1, 1 << 16)
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            out = fn(*args)
            code = 0
        except BaseException as e:
            out = {"error": f"{type(e).__name__}: {e}"}
        try:
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    with os.fdopen(r, "rb") as fh:
        chunks.append(fh.read())
    _, status = os.waitpid(pid, 0)
    out = json.loads(b"".join(chunks) or b"{}")
    assert os.waitstatus_to_exitcode(status) == 0, out
    return dict(out)


def test_another_user_cannot_make_a_root_agent_run_code(other_user: pwd.struct_passwd) -> None:
    name = f"hltest-txu-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    where = Path(tempfile.gettempdir()) / f"hltx-{uuid.uuid4().hex[:8]}"
    with hl.Domain.create(name, heap="8M", mode=0o666, unlink_on_close=True) as d:
        with pytest.warns(WritableDomainWarning):
            a = agents.spawn(d, "cpu", label="root-agent", wait_timeout=5.0)
        try:
            out = _as_user(other_user, _attack, str(d.name), a.queue.handle, str(where))
            assert out["uid"] == other_user.pw_uid
            pwned = where / "pwned"
            assert not pwned.exists(), f"the agent ran the other user's file as uid {pwned.read_text()}"
            assert out["status"] == "ERROR"
            assert REFUSED in (out["why"] or "")
            st, res, why = _run(d, a, kernel_id("copy"), np.arange(3.0, dtype=np.float32))
            assert st is S.SUCCESS and res.tolist() == [0.0, 1.0, 2.0], why
        finally:
            a.stop()
            shutil.rmtree(where, ignore_errors=True)
