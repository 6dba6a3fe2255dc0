"""Build of the optional C extensions: the native OTLP decoder (collectors/otlp/_native.c), the
OTLP/JSON transcoder (collectors/otlp/_json_native.c) and the recorder's candidates JSON
formatter (collectors/router/_native.c).

Everything else is declared in pyproject.toml. All are optional: when one does not compile
(no compiler, no Python headers), ``pip install`` still succeeds and the pure-Python code is
used (``collectors.otlp._decode.decode``, ``collectors.otlp._decode.parse_json``,
``collectors.router._recorder._candidates_json``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "collectors.otlp._native",
            sources=["collectors/otlp/_native.c"],
            depends=["collectors/otlp/_utf8.h"],
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-unused-function"],
            optional=True,
        ),
        Extension(
            "collectors.otlp._json_native",
            sources=["collectors/otlp/_json_native.c"],
            depends=["collectors/otlp/_utf8.h"],
            extra_compile_args=["-O2", "-std=gnu99", "-Wall"],
            optional=True,
        ),
        Extension(
            "collectors.router._native",
            sources=["collectors/router/_native.c"],
            extra_compile_args=["-O2", "-std=gnu99", "-Wall"],
            optional=True,
        ),
    ],
)
