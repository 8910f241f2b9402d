# The native probe core is a plain C library loaded with ctypes (no Python
# API); setuptools builds it as an extension so `pip install .` is one step.
# It dlopens libcuda at run time, so it builds without CUDA installed.
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ccbridge._probe_native",
            sources=["src/ccbridge/native/probe.c"],
            libraries=["dl", "pthread"],
            extra_compile_args=["-O2", "-std=gnu11"],
        )
    ]
)
