# The native core (probe loops, loader pool) is a plain C library loaded with
# ctypes (no Python API); setuptools builds it as an extension so
# `pip install .` is one step. It dlopens libcuda at run time, so it builds
# without CUDA installed.
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = Path("src/ccbridge/native")  # one folder per artifact
COMMON = NATIVE / "common"  # what several artifacts compile in: the driver table, OpenSSL, the spin kernel
GCM_SRC = NATIVE / "gcm"
# Real code for the GPUs we test on, PTX for the ones after them.
GCM_ARCHS = os.environ.get("CCBRIDGE_CUDA_ARCHS", "80;90;100")


def find_nvcc():
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and Path(home, "bin", "nvcc").exists():
            return str(Path(home, "bin", "nvcc"))
    return shutil.which("nvcc")


class BuildWithKernels(build_ext):
    """Also build the AES-GCM kernels (native/gcm/gcm.cu) into a fatbin next to
    the native core, when nvcc is here; without it the package still installs
    and the GPU cipher says it was not built."""

    def run(self):
        super().run()
        nvcc = find_nvcc()
        dest = Path(self.get_ext_fullpath("ccbridge._native")).parent / "_gcm.fatbin"
        if not nvcc:
            print("ccbridge: nvcc not found (CUDA_HOME, PATH): GPU AES-GCM kernels not built")
            return
        archs = [a for a in GCM_ARCHS.split(";") if a]
        cmd = [nvcc, "-fatbin", "-O3", "-std=c++17", "-o", str(dest), str(GCM_SRC / "gcm.cu")]
        for a in archs:
            cmd += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
        cmd += ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]
        print(" ".join(cmd))
        subprocess.run(cmd, check=True)


NET_SRC = NATIVE / "ncclnet"
OSSL = [str(COMMON / "ossl.c")]  # libcrypto bound at run time, for the emulator and the plugin
OSSL_H = [str(COMMON / "ossl.h")]


def files(folder: Path, ext: str) -> list[str]:
    return sorted(str(p) for p in folder.glob(f"*.{ext}"))


class BuildAll(BuildWithKernels):
    """Also build the NCCL net plugin. NCCL dlopens it by name
    (NCCL_NET_PLUGIN=ccbridge -> libnccl-net-ccbridge.so on LD_LIBRARY_PATH),
    so it is a plain shared object in ccbridge/lib/, not a Python extension;
    plain C, libcrypto loaded at run time, so it builds anywhere."""

    def run(self):
        super().run()
        dest = Path(self.get_ext_fullpath("ccbridge._native")).parent / "lib" / "libnccl-net-ccbridge.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        objects = self.compiler.compile(
            files(NET_SRC, "c") + OSSL, output_dir=self.build_temp, depends=files(NET_SRC, "h") + OSSL_H,
            # exports only ncclNetPlugin_v* (NET_API, ncclnet.h)
            extra_postargs=["-O2", "-std=gnu11", "-Wall", "-fvisibility=hidden", "-fPIC"])
        self.compiler.link_shared_object(objects, str(dest), libraries=["dl", "pthread"])
        # the plugin's uncoupled bound, a program `ccbridge bench net` runs beside its rows (native/netbound/bound.c)
        bound = self.compiler.compile(
            files(NATIVE / "netbound", "c") + [str(NET_SRC / "plan.c")] + OSSL,
            output_dir=str(Path(self.build_temp) / "netbound"),
            depends=OSSL_H + [str(COMMON / "sizes.h"), str(NET_SRC / "plan.h")],
            extra_postargs=["-O2", "-std=gnu11", "-Wall"])
        self.compiler.link_executable(bound, "ccbridge-net-bound", output_dir=str(dest.parent),
                                      libraries=["dl", "pthread"])


setup(
    cmdclass={"build_ext": BuildAll},
    ext_modules=[
        # The native core: the probe core, the loader pool and the GPU AES-GCM host side in one
        # shared object, sharing common/cudrv.c's driver table and its error slot (ccb_error).
        Extension(
            "ccbridge._native",
            sources=files(NATIVE / "core", "c") + files(NATIVE / "loader", "c")
            + [str(GCM_SRC / "gcm_host.c"), str(COMMON / "cudrv.c"), str(COMMON / "err.c")],
            depends=files(NATIVE / "core", "h") + files(NATIVE / "loader", "h") + files(GCM_SRC, "h")
            + [str(COMMON / "cudrv.h"), str(COMMON / "spin_ptx.h")],
            libraries=["dl", "pthread"],
            # exports only what is marked CCB_API in core/core.h, loader/loader.h and gcm/gcm.h: the ctypes API
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-fvisibility=hidden"],
        ),
        # The bridge emulator: an LD_PRELOAD library in front of the CUDA
        # driver, also plain C and built without CUDA (native/emu/emu.h).
        Extension(
            "ccbridge._emu_native",
            sources=files(NATIVE / "emu", "c") + OSSL,
            depends=files(NATIVE / "emu", "h") + [str(COMMON / "spin_ptx.h")] + OSSL_H,
            libraries=["dl", "pthread"],
            # exports only the hooked driver API, dlsym and the ccbemu_* API (EMU_API, emu.h):
            # nothing internal leaks into the programs it is preloaded into
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-fvisibility=hidden"],
        ),
    ]
)
