"""The GPU AES-GCM host side (native/gcm/gcm.h) through ctypes, declared on ccbridge._native, whose core
holds the reason of a failed call (core.error()); and where setup.py puts the kernels' fatbin.
ccbridge.secure.gcm drives it."""

from __future__ import annotations

import ctypes
from ctypes import c_char_p, c_int, c_size_t, c_uint, c_uint32, c_uint64, c_void_p
from functools import lru_cache
from pathlib import Path

from ccbridge.bindings import core, declare

HEADER = "gcm/gcm.h"
FATBIN = Path(__file__).parents[1] / "_gcm.fatbin"  # gcm/gcm.cu built by setup.py beside ccbridge._native

_U64 = c_uint64
FUNCTIONS = {
    "ccb_gcm_key_size": (c_size_t, []),
    "ccb_gcm_msg_size": (c_size_t, []),
    "ccb_gcm_key": (c_int, [c_char_p, c_void_p]),
    "ccb_gcm_msg": (c_int, [c_void_p, c_void_p, _U64, c_uint32, c_char_p, c_char_p]),
    "ccb_gcm_raw_msg": (c_int, [c_void_p, c_void_p, _U64, c_char_p, c_char_p, _U64]),
    "ccb_gcm_model": (c_int, [c_void_p, c_void_p, c_int, c_void_p, c_void_p, c_void_p]),
    "ccb_gcm_load": (c_int, [c_int, c_void_p]),
    "ccb_gcm_crypt": (c_int, [c_uint, c_void_p, _U64, c_void_p, c_int, _U64, _U64, _U64, _U64]),
    "ccb_gcm_reduce": (c_int, [c_uint, c_void_p, _U64, c_void_p, c_void_p, c_int] + [_U64] * 7),
}


@lru_cache(maxsize=None)
def lib() -> ctypes.CDLL:
    """ccbridge._native with the GCM host side declared; GpuError where it is not built."""
    return declare(core.lib(), FUNCTIONS)
