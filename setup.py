import os
import shlex
import sys
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The engine (src/hostless/core, plain C) and the thin CPython binding
# (src/hostless/binding) make one extension; `make lib` builds the engine
# alone into build/libhostless.a for C programs.  The standalone native agent
# (src/hostless/agentexe/main.c + the engine, no Python) is built next to the
# extension as hostless/_bin/hostless-agent (hostless.agents.executable_path()).
ENGINE = sorted(glob("src/hostless/core/*.c"))
BINDING = sorted(glob("src/hostless/binding/*.c"))
# Public headers (ABI and engine API) in src/hostless/include/hostless (installed with the
# package; hostless.get_include()); internal ones (core/engine.h, binding/binding.h) refuse to
# compile without HOSTLESS_INTERNAL.
HEADERS = [*sorted(glob("src/hostless/include/hostless/*.h")), *sorted(glob("src/hostless/core/*.h")),
           *sorted(glob("src/hostless/binding/*.h"))]  # fmt: skip
INCLUDE = ["src/hostless/include"]
CFLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
          "-Wno-cast-function-type", "-DHOSTLESS_INTERNAL"]  # fmt: skip
# HOSTLESS_TEST_HOOKS=1 in the environment builds hostless._core.testing (hooks that make a
# test's failure happen: heap_lock_forever, device_store, ...) into the extension; `make venv` /
# `make test` set it.  A plain `pip install` leaves them out of the production build.
TEST_HOOKS = os.environ.get("HOSTLESS_TEST_HOOKS", "") not in ("", "0")
EXT_CFLAGS = CFLAGS + (["-DHOSTLESS_TEST_HOOKS"] if TEST_HOOKS else [])
# HOSTLESS_LIMITED_API=1 builds the extension against the limited C API of 3.11
# (binding/limited.h): one abi3 wheel, tagged cp311-abi3, for every CPython from 3.11 on.
# 3.10 has no buffer protocol in the limited API: there it builds as usual.
LIMITED_API = os.environ.get("HOSTLESS_LIMITED_API", "") not in ("", "0") and sys.version_info >= (3, 11)
AGENT_MAIN = "src/hostless/agentexe/main.c"


class BuildWithAgent(build_ext):
    """build_ext, then hostless-agent: the engine's sources and main.c compiled with the
    extension's compiler and flags (CFLAGS / LDFLAGS from the environment included) and
    linked as an executable into the package's _bin folder."""

    def run(self) -> None:
        super().run()
        ext_path = self.get_ext_fullpath("hostless._core")
        out_dir = os.path.join(os.path.dirname(ext_path), "_bin")
        os.makedirs(out_dir, exist_ok=True)
        objs = self.compiler.compile(
            [*ENGINE, AGENT_MAIN],
            output_dir=os.path.join(self.build_temp, "agentexe"),
            include_dirs=INCLUDE,
            extra_postargs=CFLAGS,
            depends=HEADERS,
        )
        self.compiler.link_executable(
            objs,
            "hostless-agent",
            output_dir=out_dir,
            libraries=["pthread", "m"],
            extra_postargs=shlex.split(os.environ.get("LDFLAGS", "")),
        )


setup(
    cmdclass={"build_ext": BuildWithAgent},
    ext_modules=[
        Extension(
            "hostless._core",
            sources=ENGINE + BINDING,
            depends=HEADERS,
            include_dirs=INCLUDE,
            libraries=["m"],
            extra_compile_args=EXT_CFLAGS,
            define_macros=[("Py_LIMITED_API", "0x030B0000")] if LIMITED_API else [],
            py_limited_api=LIMITED_API,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if LIMITED_API else {},
)
