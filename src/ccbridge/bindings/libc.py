"""The C library through ctypes: memcmp, to compare received bytes without copying them into Python."""

from __future__ import annotations

import ctypes
from ctypes import c_int, c_size_t, c_void_p
from functools import lru_cache

from ccbridge.bindings import declare

FUNCTIONS = {"memcmp": (c_int, [c_void_p, c_void_p, c_size_t])}


@lru_cache(maxsize=None)
def lib() -> ctypes.CDLL:
    """The process's own C library (the symbols already loaded) with memcmp declared."""
    return declare(ctypes.CDLL(None), FUNCTIONS)
