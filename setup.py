"""Build of the optional native OTLP decoder (collectors/otlp/_native.c).

Everything else is declared in pyproject.toml. The extension is optional: when it does not
compile (no compiler, no Python headers), ``pip install`` still succeeds and the collector uses
the pure-Python decoder (``collectors.otlp._decode.decode``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "collectors.otlp._native",
            sources=["collectors/otlp/_native.c"],
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-unused-function"],
            optional=True,
        )
    ],
)
