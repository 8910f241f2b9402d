"""ctypes bindings of the native libraries: one module per built artifact, each declaring that artifact's C
interface (restype, argtypes, Structures) from its one header under ccbridge/native/, and nothing else in
ccbridge declares any (tests/test_bindings_twin.py holds each module to its header, and keeps argtypes,
restype and ctypes.CDLL out of the rest of the package).

- core: the probe core (native/core/core.h), which opens ccbridge._native;
- loader: the loader pool (native/loader/loader.h), in ccbridge._native too;
- gcm: the GPU AES-GCM host side (native/gcm/gcm.h), in ccbridge._native too;
- emu: the emulator's ccbemu_* API (native/emu/emu.h), ccbridge._emu_native;
- ncclnet: the NCCL net plugin's v11 table (native/ncclnet/ncclnet.h), lib/libnccl-net-ccbridge.so;
- libcrypto: the system OpenSSL, as common/ossl.h binds it for the emulator and the plugin;
- libc: the C library's memcmp.
"""

from __future__ import annotations

import ctypes


def declare(so: ctypes.CDLL, functions: dict) -> ctypes.CDLL:
    """Set restype and argtypes of each name -> (restype, argtypes) on a loaded library; AttributeError where
    the library lacks one."""
    for name, (restype, argtypes) in functions.items():
        fn = getattr(so, name)
        fn.restype, fn.argtypes = restype, argtypes
    return so
