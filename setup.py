# The native core (probe loops, loader pool) is a plain C library loaded with
# ctypes (no Python API); setuptools builds it as an extension so
# `pip install .` is one step. It dlopens libcuda at run time, so it builds
# without CUDA installed.
from pathlib import Path

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ccbridge._native",
            sources=[f"src/ccbridge/native/{n}.c" for n in ("cudrv", "probe", "load")],
            depends=["src/ccbridge/native/cudrv.h"],
            libraries=["dl", "pthread"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall"],
        ),
        # The bridge emulator: an LD_PRELOAD library in front of the CUDA
        # driver, also plain C and built without CUDA (native/emu/emu.h).
        Extension(
            "ccbridge._emu_native",
            sources=sorted(str(p) for p in Path("src/ccbridge/native/emu").glob("*.c")),
            depends=["src/ccbridge/native/emu/emu.h"],
            libraries=["dl", "pthread"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-fvisibility=default"],
        ),
    ]
)
