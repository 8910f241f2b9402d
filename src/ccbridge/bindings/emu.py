"""The emulator's exported API (EMU_API in native/emu/emu.h) through ctypes: the interposer's switches, the
per-thread call-site slot, its summary and coverage, and the fake driver the CPU tests run it on.

Standard library only, and no import of ccbridge: the call-site hook (emulate/siteboot/ccbridge_sites.py)
loads this file by its path inside every Python process of a traced program, whose interpreter need not
have ccbridge (so bindings.declare is not used here).
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_double, c_int, c_longlong, c_size_t, c_uint64, c_ulonglong, c_void_p

HEADER = "emu/emu.h"
LIB_ENV = "CCBRIDGE_EMU_LIB"  # set by `ccbridge run` in the program's environment: the interposer's path

FUNCTIONS = {
    "dlsym": (c_void_p, [c_void_p, c_char_p]),
    "ccbemu_test_init": (c_int, [c_char_p, c_char_p, c_int]),
    "ccbemu_trace_flush": (None, []),
    "ccbemu_trace_pause": (c_int, [c_int]),
    "ccbemu_emulate_pause": (c_int, [c_int]),
    "ccbemu_site_slot": (POINTER(c_int), []),
    "ccbemu_mark": (c_int, [c_char_p]),
    "ccbemu_waited": (c_int, [c_char_p, c_uint64]),
    "ccbemu_summary": (c_int, [c_char_p, c_int]),
    "ccbemu_coverage": (c_int, [c_char_p, c_int]),
    "ccbemu_hook_name": (c_char_p, [c_int]),
    "ccbemu_lookup": (c_void_p, [c_char_p]),
    "ccbemu_real": (c_void_p, [c_char_p]),
    "ccbemu_seal": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_void_p, c_void_p]),
    "ccbemu_fake_alloc": (c_void_p, [c_size_t, c_int]),
    "ccbemu_fake_stream": (c_void_p, []),
    "ccbemu_fake_ctx_new": (c_void_p, []),
    "ccbemu_fake_set_ctx": (None, [c_void_p]),
    "ccbemu_fake_capture": (None, [c_void_p, c_int]),
    "ccbemu_fake_graph": (c_void_p, [c_void_p]),
    "ccbemu_fake_fail": (None, [c_char_p, c_int]),
    "ccbemu_fake_unwaited": (c_longlong, []),
    "ccbemu_fake_host_waits": (c_longlong, []),
    "ccbemu_fake_copy_gbps": (None, [c_double]),
    "ccbemu_fake_query_ns": (None, [c_uint64]),
    "ccbemu_fake_multicast_calls": (c_longlong, []),
    "ccbemu_fake_modules_fail": (None, [c_int]),
    "ccbemu_fake_last_spin_ns": (c_ulonglong, []),
}


def _declare(so: ctypes.CDLL, name: str):
    fn = getattr(so, name)
    fn.restype, fn.argtypes = FUNCTIONS[name]
    return fn


def function(path: str, name: str):
    """One function of the API, declared, from the emulator library at path (ccbridge._emu_native); OSError
    where the library cannot be loaded, AttributeError where it lacks the function."""
    return _declare(ctypes.CDLL(path), name)


def load(path: str) -> ctypes.CDLL:
    """The emulator library at path with its whole API declared (the tests drive its fake driver)."""
    so = ctypes.CDLL(path)
    for name in FUNCTIONS:
        _declare(so, name)
    return so
