from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "hostless._core",
            sources=["src/hostless/_core.c"],
            depends=["src/hostless/hostless.h"],
            include_dirs=["src/hostless"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
        )
    ]
)
