from glob import glob

from setuptools import Extension, setup

# The engine (src/hostless/core, plain C) and the thin CPython binding
# (src/hostless/binding) make one extension; `make lib` builds the engine
# alone into build/libhostless.a for C programs.
ENGINE = sorted(glob("src/hostless/core/*.c"))
BINDING = sorted(glob("src/hostless/binding/*.c"))
HEADERS = [*sorted(glob("src/hostless/hostless*.h")), *sorted(glob("src/hostless/core/*.h")), *sorted(glob("src/hostless/binding/*.h"))]

setup(
    ext_modules=[
        Extension(
            "hostless._core",
            sources=ENGINE + BINDING,
            depends=HEADERS,
            include_dirs=["src/hostless", "src/hostless/core"],
            libraries=["m"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
        )
    ]
)
