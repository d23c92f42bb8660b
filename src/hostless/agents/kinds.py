"""Agent kinds as types: one :class:`AgentSpec` per kind of agent.

A spec says everything the library knows about a kind, in one place: the
kernels its stages may name and the ids its packets carry, how a stage's
packet is encoded (a KERNEL packet, or an ERT command naming a CU), where its
engine reads memory, what it runs (Python code or none), which
:func:`hostless.agents.spawn` options it takes, and the command line that
starts it.  :func:`~hostless.agents.spawn` and :mod:`hostless.graph` ask
``agent.spec`` instead of switching on kind strings.

The specs (:data:`SPECS`; :func:`spec_for` picks one from ``spawn``'s
``kind`` and ``native``):

* ``cpu``: the engine's C loop (``core/agent.c``) in a Python worker
  (``python -m hostless.agents.worker``): built-in kernels in C, Python
  kernels, user kernels and stage functions as its callbacks
  (:mod:`hostless.agents.native`);
* ``npu``: the same loop serving the emulated NPU (ERT command buffers naming
  the CUs of :data:`hostless.kernels.NPU_CUS`);
* ``cpu-exe`` / ``npu-exe``: the same loop in ``hostless-agent``, the C
  program with no Python interpreter (``spawn(..., native="exe")``): built-in
  kernels only;
* ``cuda``: a loop in Python feeding CUDA streams
  (:class:`hostless.agents.cuda_agent.CudaLoop`);
* ``gpucp``: the GPU command processor, a resident kernel that reads the queue
  itself (:mod:`hostless.agents.gpucp`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..kernels import CPU_KERNELS, CUDA_KERNEL_NAMES, NPU_CUS

__all__ = ["AgentSpec", "Settings", "SPECS", "spec_for", "KINDS", "FLAG_STAGE_COPY"]

KINDS = ("cpu", "npu", "cuda", "gpucp")
"""The kinds of queue an agent serves (``spawn``'s ``kind``; ``Agent.kind``)."""

FLAG_STAGE_COPY = 1
"""Packet flag of a cuda stage in copy mode: stage the inputs through device memory."""

_COMMON = frozenset({"spin", "wait_timeout", "follow_timeout"})
_C_LOOP = _COMMON | {"fixed_spin", "idle_poll"}


@dataclass
class Settings:
    """The validated options of one spawn (seconds; :func:`hostless.agents.spawn` says what each does)."""

    spin: float = 50e-6
    wait_timeout: float | None = 60.0
    follow_timeout: float = 10.0
    fixed_spin: bool = False
    idle_poll: float = 0.02
    device: int = 0
    sms: int = 8
    isolation: str = "auto"


def _seconds(name: str, v: Any, lo: float = 0.0, hi: float = float("inf")) -> float:
    x = float(v)
    if not lo <= x < hi:  # nan too
        raise ValueError(f"{name} must be finite seconds >= 0, got {v!r}")
    return x


@dataclass(frozen=True)
class AgentSpec:
    """What one kind of agent is and how it starts."""

    name: str
    """The spec's name: "cpu", "npu", "cpu-exe", "npu-exe", "cuda" or "gpucp"."""
    kind: str
    """The kind of queue it serves (what ``Agent.kind`` says): "cpu", "npu", "cuda" or "gpucp"."""
    kernel_names: Callable[[], tuple[str, ...]]
    """The names of the built-in kernels its stages may use (a function: the gpucp's table is
    read from its module only when asked)."""
    native: bool | str
    """How its loop runs (``Agent.native``): True, the engine's C loop in a Python worker;
    "exe", the same loop in ``hostless-agent``; False, a loop in Python (cuda) or on the GPU (gpucp)."""
    ert: bool = False
    """Stages are ERT command buffers naming a CU (``spec.kernels`` are CU indices)."""
    python: bool = True
    """It runs Python: kernels given as ``user_kernels``."""
    stage_functions: bool = False
    """It runs Python stage functions (``Agent.load_function``, through the private channel)."""
    gpu_functions: bool = False
    """It runs GPU stage functions taking PyTorch tensors or CuPy arrays, captured as CUDA graphs
    (``Agent.load_segment``, through the private channel; :mod:`hostless.agents.gpufn`)."""
    gpu: bool = False
    """Its engine is a GPU (``device=N``): it reads memory on "cuda:N"."""
    resident: bool = False
    """A resident GPU kernel reads and writes host memory itself: the tensors the host touches
    every frame stay in host memory (a host-side CUDA copy would wait for the kernel's time
    slice; :func:`hostless.graph.place_tensors`)."""
    stage_copy_flag: bool = False
    """Copy mode sets :data:`FLAG_STAGE_COPY` on its packets (it stages inputs through device memory)."""
    reports_capabilities: bool = False
    """It prints a JSON line of capabilities after its participant id (``Agent.capabilities``)."""
    options: frozenset[str] = _COMMON
    """The ``spawn`` options it takes (besides queue, capacity, label, user_kernels and timeout)."""

    # ------------------------------------------------------------------ kernels
    @property
    def kernels(self) -> Mapping[str, int]:
        """Built-in kernel names its stages may use -> the id (or CU index) their packets carry."""
        if self.ert:  # CU indices of the emulated NPU's xclbin
            return {n: NPU_CUS[n][0] for n in self.kernel_names()}
        return {n: CPU_KERNELS[n][0] for n in self.kernel_names()}

    def kernel(self, name: str, user_kernels: Mapping[str, int] | None = None) -> int:
        """The id (or CU index) a packet of kernel ``name`` carries: a user kernel's id first.
        KeyError, listing the known names, for a kernel this kind has not."""
        if user_kernels and name in user_kernels:
            return user_kernels[name]
        table = self.kernels
        if name not in table:
            raise KeyError(f"{self.kind} agent has no kernel {name!r}; known: {sorted(table)}")
        return table[name]

    def packet_flags(self, data: str) -> int:
        """The flags of a stage's packet in data mode ``data`` ("copy" or "shared")."""
        return FLAG_STAGE_COPY if (self.stage_copy_flag and data == "copy") else 0

    def device_of(self, device: int) -> str:
        """Where its engine reads memory when spawned with ``device``: "cpu" or "cuda:N"."""
        return f"cuda:{device}" if self.gpu else "cpu"

    # ------------------------------------------------------------------ starting
    def settings(self, opts: dict[str, Any]) -> Settings:
        """Validate and take its options out of ``opts`` (ValueError for a bad value,
        TypeError for an option this kind does not take or an unknown one)."""
        s = Settings()
        unknown = sorted(set(opts) - self.options)
        if unknown:
            known = {"fixed_spin", "idle_poll", "device", "sms", "isolation"}
            if set(unknown) <= known:
                raise TypeError(f"{self.name} agents take no option {', '.join(unknown)}")
            raise TypeError(f"unknown options {unknown}")
        if "spin" in opts:
            spin = float(opts["spin"])
            if not 0 <= spin <= 3600:  # nan and inf too (hostless.shm.check_spin's rule)
                raise ValueError(f"spin must be seconds in 0..3600, got {opts['spin']!r}")
            s.spin = spin
        if opts.get("wait_timeout", 0.0) is None:
            s.wait_timeout = None
        elif "wait_timeout" in opts:
            try:
                s.wait_timeout = _seconds("wait_timeout", opts["wait_timeout"])
            except ValueError:
                raise ValueError(
                    f"wait_timeout must be finite seconds >= 0 (None: none), got {opts['wait_timeout']!r}"
                ) from None
        if "follow_timeout" in opts:
            s.follow_timeout = _seconds("follow_timeout", opts["follow_timeout"])
        if "fixed_spin" in opts:
            s.fixed_spin = bool(opts["fixed_spin"])
        if "idle_poll" in opts:
            s.idle_poll = _seconds("idle_poll", opts["idle_poll"])
        if "device" in opts:
            s.device = int(opts["device"])
        if "sms" in opts:
            s.sms = int(opts["sms"])
            if s.sms < 1:
                raise ValueError("sms must be >= 1")
        if "isolation" in opts:
            s.isolation = str(opts["isolation"])
            if s.isolation not in ("auto", "green", "grid"):
                raise ValueError(f"isolation must be 'auto', 'green' or 'grid', not {s.isolation!r}")
        opts.clear()
        return s

    def check(self, user_kernels: Mapping[str, str] | None) -> None:
        """Refuse what this kind cannot do before anything starts (ValueError), and a GPU
        kind without CUDA (:class:`hostless.cuda.CudaUnavailable`)."""
        if user_kernels and not self.python:
            if self.native == "exe":
                raise ValueError("hostless-agent (native='exe') runs built-in kernels only: no user_kernels")
            raise ValueError(
                "the GPU command processor runs its built-in device kernels only: no user_kernels"
            )
        if self.gpu:
            from ..cuda import available

            why = available()
            if why is not None:
                from ..cuda import CudaUnavailable

                raise CudaUnavailable(f"cannot start a {self.kind} agent: {why}")

    def command(self, domain: str, queue: int, s: Settings, label: str | None) -> list[str]:
        """The command line of an agent of this kind serving ``queue`` of ``domain``."""
        if self.native == "exe":
            return _exe_command(domain, queue, self.kind, s, label)
        cmd = [
            sys.executable,
            "-m",
            "hostless.agents.worker",
            domain,
            hex(queue),
            self.kind,
            "--parent",
            str(os.getpid()),
        ]
        if label:
            cmd += ["--label", label]
        cmd += ["--spin", repr(s.spin)]
        cmd += ["--wait-timeout", repr(-1.0 if s.wait_timeout is None else s.wait_timeout)]
        cmd += ["--follow-timeout", repr(s.follow_timeout)]
        if self.native is True:
            if s.fixed_spin:
                cmd += ["--fixed-spin"]
            cmd += ["--idle-poll", repr(s.idle_poll)]
        if self.gpu:
            cmd += ["--device", str(s.device)]
        if self.resident:
            cmd += ["--sms", str(s.sms), "--isolation", s.isolation]
        return cmd


def _exe_command(name: str, q: int, kind: str, s: Settings, label: str | None) -> list[str]:
    """The command line of a hostless-agent serving ``q`` of domain ``name`` (times in ns)."""
    from . import executable_path
    from .native import blas_path

    blas = blas_path()
    return [
        executable_path(),
        "--domain",
        name,
        "--queue-handle",
        hex(q),
        "--kind",
        kind,
        "--parent",
        str(os.getpid()),
        "--label",
        (label or f"{kind}-agent-exe").encode()[:31].decode(errors="ignore"),
        "--spin-ns",
        str(int(s.spin * 1e9)),
        "--wait-timeout-ns",
        str(-1 if s.wait_timeout is None else int(s.wait_timeout * 1e9)),
        "--follow-timeout-ns",
        str(int(s.follow_timeout * 1e9)),
        "--idle-poll-ns",
        str(int(s.idle_poll * 1e9)),
        *(["--blas", blas] if blas else []),
    ]


def _cpu_names() -> tuple[str, ...]:
    return tuple(CPU_KERNELS)


def _npu_names() -> tuple[str, ...]:
    return tuple(NPU_CUS)


def _cuda_names() -> tuple[str, ...]:
    return CUDA_KERNEL_NAMES


def _gpucp_names() -> tuple[str, ...]:
    from .gpucp import GPUCP_KERNEL_NAMES

    return tuple(GPUCP_KERNEL_NAMES)


_EXE = _COMMON | {"idle_poll"}

SPECS: dict[str, AgentSpec] = {
    s.name: s
    for s in (
        AgentSpec(
            "cpu", "cpu", _cpu_names, True, stage_functions=True, reports_capabilities=True, options=_C_LOOP
        ),
        AgentSpec("npu", "npu", _npu_names, True, ert=True, reports_capabilities=True, options=_C_LOOP),
        AgentSpec("cpu-exe", "cpu", _cpu_names, "exe", python=False, options=_EXE),
        AgentSpec("npu-exe", "npu", _npu_names, "exe", ert=True, python=False, options=_EXE),
        AgentSpec(
            "cuda",
            "cuda",
            _cuda_names,
            False,
            gpu=True,
            gpu_functions=True,
            stage_copy_flag=True,
            options=_COMMON | {"device"},
        ),
        AgentSpec(
            "gpucp",
            "gpucp",
            _gpucp_names,
            False,
            python=False,
            gpu=True,
            resident=True,
            reports_capabilities=True,
            options=_COMMON | {"device", "sms", "isolation"},
        ),
    )
}
"""Every spec by name."""


def spec_for(kind: str, native: bool | str | None = None) -> AgentSpec:
    """The spec ``spawn(dom, kind, native=native)`` starts: ``native`` None or True is the
    kind's own agent (the C loop for cpu and npu); "exe" is ``hostless-agent`` (cpu and npu);
    False, the Python cpu/npu loop that once existed, is refused (ValueError)."""
    if kind not in KINDS:
        raise ValueError(f"unknown agent kind {kind!r} (cpu, npu, cuda, gpucp)")
    if native not in (None, True, False, "exe"):
        raise ValueError(f"native must be True or 'exe' (or left out), not {native!r}")
    if native is None:
        return SPECS[kind]
    if kind not in ("cpu", "npu"):
        raise ValueError(f"native agents serve cpu and npu queues (not {kind} ones)")
    if native is False:
        raise ValueError(
            "native=False: there is no Python cpu/npu agent loop any more; cpu and npu agents run "
            "the engine's C loop (core/agent.c), with Python kernels, user kernels and stage "
            "functions as its callbacks (leave native out)"
        )
    return SPECS[f"{kind}-exe"] if native == "exe" else SPECS[kind]
