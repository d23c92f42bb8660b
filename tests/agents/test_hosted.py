"""One GPU process per device, the parts that need no GPU (hostless.agents.hosted).

Which cuda agent a gpucp agent runs in (``spawn(..., process=)``): the default picks a live
cuda agent of the same domain and device that this process spawned; bad hosts are refused
with errors that say what to do; the time-slice warning for separate processes; the agent
side's request checks.  tests/gpu/test_gpu_hosted.py runs the processors themselves.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from typing import Any

import pytest

import hostless as hl
from hostless import agents
from hostless.agents import hosted
from hostless.agents.agent import Agent
from hostless.agents.kinds import SPECS, Settings
from hostless.errors import GpuTimeSliceWarning, HostlessError


@pytest.fixture
def dom(domain_name):
    d = hl.Domain.create(domain_name, fences=64, heap="1M")
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def fake(dom):
    """make(kind, device=0, alive=True): an Agent handle of ``kind`` over a stand-in process
    (no GPU needed); every stand-in is killed afterwards."""
    procs: list[subprocess.Popen[str]] = []

    def make(kind: str, device: int = 0, alive: bool = True, of: hl.Domain | None = None) -> Agent:
        cmd = [sys.executable, "-c", "import time; time.sleep(60)" if alive else "pass"]
        p = subprocess.Popen(cmd, text=True)
        procs.append(p)
        if not alive:
            p.wait()
        d = of or dom
        a = Agent(d, SPECS[kind], d.queue(4), p, 1000 + len(procs))
        a.device = f"cuda:{device}"
        return a

    yield make
    for p in procs:
        p.kill()
        p.wait()
    hosted._SPAWNED.clear()


def test_default_host_is_a_live_cuda_agent_of_the_same_domain_and_device(dom, fake):
    s = Settings(device=0)
    assert hosted.host_for(dom, s, None) is None  # none spawned
    other_dev = fake("cuda", device=1)
    dead = fake("cuda", alive=False)
    for a in (other_dev, dead):
        hosted.note_spawned(a)
    assert hosted.host_for(dom, s, None) is None
    live = fake("cuda")
    hosted.note_spawned(live)
    assert hosted.host_for(dom, s, None) is live
    assert hosted.host_for(dom, s, "own") is None
    assert hosted.host_for(dom, Settings(device=0, isolation="grid"), None) is None
    assert hosted.host_for(dom, Settings(device=1), None) is other_dev


def test_bad_hosts_are_refused_with_what_to_do(dom, fake, domain_name):
    s = Settings(device=0)
    with pytest.raises(TypeError, match="cuda agent, 'own' or None"):
        hosted.host_for(dom, s, "mine")
    with pytest.raises(ValueError, match="not a cpu agent"):
        hosted.host_for(dom, s, fake("cpu"))
    with pytest.raises(ValueError, match="spawn with device=1"):
        hosted.host_for(dom, s, fake("cuda", device=1))
    with pytest.raises(ValueError, match="process='own'"):
        hosted.host_for(dom, Settings(device=0, isolation="grid"), fake("cuda"))
    with pytest.raises(HostlessError, match="has exited"):
        hosted.host_for(dom, s, fake("cuda", alive=False))
    other = hl.Domain.create(domain_name + "-b", fences=16, heap="1M")
    try:
        with pytest.raises(ValueError, match="another domain"):
            hosted.host_for(dom, s, fake("cuda", of=other))
    finally:
        other.close()
        hl.Domain.unlink(domain_name + "-b")


def test_only_gpucp_agents_take_process(dom):
    with pytest.raises(TypeError, match="take no option process"):
        agents.spawn(dom, "cpu", process="own")


def test_separate_processes_of_one_gpu_are_warned_about(dom, fake):
    held = [fake("cuda")]  # (the registry holds agents weakly: a dropped handle is forgotten)
    hosted.note_spawned(held[-1])
    held.append(fake("gpucp"))
    with pytest.warns(GpuTimeSliceWarning, match="Spawn the cuda agent first"):
        hosted.note_spawned(held[-1])
    hosted._SPAWNED.clear()
    held += [fake("gpucp"), fake("cuda")]
    hosted.note_spawned(held[-2])
    with pytest.warns(GpuTimeSliceWarning):  # the other order too
        hosted.note_spawned(held[-1])
    hosted._SPAWNED.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpuTimeSliceWarning)
        held += [fake("cuda", device=1), fake("gpucp", device=0)]
        hosted.note_spawned(held[-2])
        hosted.note_spawned(held[-1])  # another GPU: no warning
        hosted._SPAWNED.clear()
        host = fake("cuda")
        h = hosted.HostedAgent(dom, SPECS["gpucp"], dom.queue(4), host)
        h.device = host.device
        hosted.note_spawned(h)
        hosted.note_spawned(host)  # beside the processor it hosts: no warning
        held.append(fake("cuda"))
        hosted.note_spawned(held[-1])  # beside a hosted one: no warning


class _Loop:
    def __init__(self, dom: hl.Domain) -> None:
        self.dom, self.parent = dom, 0
        self.started: list[Any] = []


@pytest.mark.parametrize(
    "req,match",
    [
        ({"op": "processor", "queue": "1", "sms": 8}, "queue handle"),
        ({"op": "processor", "queue": True, "sms": 8}, "queue handle"),
        ({"op": "processor", "queue": 0, "sms": 8}, "queue handle"),
        ({"op": "processor", "queue": 5, "sms": 0}, "sms"),
        ({"op": "processor", "queue": 5, "sms": 1 << 20}, "sms"),
        ({"op": "processor", "queue": 5, "sms": 8.0}, "sms"),
        ({"op": "processor_close", "queue": 5, "timeout": -1}, "timeout"),
        ({"op": "processor_close", "queue": 5, "timeout": float("nan")}, "timeout"),
        ({"op": "processor_close", "queue": 5, "timeout": "1"}, "timeout"),
    ],
)
def test_agent_side_requests_are_checked(dom, req, match):
    with pytest.raises(ValueError, match=match):
        hosted.Processors(_Loop(dom)).request(req)


def test_closing_a_processor_that_is_not_there_is_no_error(dom):
    assert hosted.Processors(_Loop(dom)).request({"op": "processor_close", "queue": 5}) == {}


def test_a_queue_handle_that_names_no_queue_starts_nothing(dom):
    p = hosted.Processors(_Loop(dom))
    with pytest.raises(HostlessError):
        p.request({"op": "processor", "queue": dom.fence().handle, "sms": 8})
    assert p.live == {}
