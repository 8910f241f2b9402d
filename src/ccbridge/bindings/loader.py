"""The loader pool (native/loader/loader.h) through ctypes: its structs, limits and functions, declared on
ccbridge._native, whose core holds the reason of a failed call (core.error()). ccbridge.load.engine drives it."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_double, c_int, c_int32, c_int64, c_longlong, c_size_t, c_uint64, c_void_p
from functools import lru_cache

from ccbridge.bindings import core, declare

HEADER = "loader/loader.h"

# pread into pinned or pageable buffers; or none: the file's page-cache
# mapping is the (pageable) source of the copy.
STAGING = {"pinned": 0, "pageable": 1, "mapped": 2}
MAX_WORKERS = 64
MAX_BUFS = 8
CONSTANTS = {"CCB_STAGE_PINNED": STAGING["pinned"], "CCB_STAGE_PAGEABLE": STAGING["pageable"],
             "CCB_STAGE_MAPPED": STAGING["mapped"], "CCB_MAX_WORKERS": MAX_WORKERS, "CCB_MAX_BUFS": MAX_BUFS}


class Item(ctypes.Structure):
    """One tensor's bytes: a range of one file and where it lands. A load's items are in file and
    offset order; the pool cuts them into chunks itself."""
    _fields_ = [("dst", c_uint64), ("offset", c_uint64), ("nbytes", c_uint64), ("file", c_int32), ("tensor", c_int32)]


class File(ctypes.Structure):
    """A file of a load: its descriptor, and under mapped staging the address of its mapping."""
    _fields_ = [("fd", c_int32), ("pad_", c_int32), ("map", c_uint64)]


class Stats(ctypes.Structure):
    _fields_ = [("prewarm_ns", c_double), ("read_ns", c_double), ("copy_ns", c_double),
                ("bytes", c_double), ("load_ns", c_double)]


STRUCTS = {"ccb_item": Item, "ccb_file": File, "ccb_load_stats": Stats}
_I32 = POINTER(c_int32)
FUNCTIONS = {
    "ccb_pool_new": (c_void_p, [c_int, c_int, c_int, c_int, c_size_t, c_int]),
    "ccb_pool_wait_ready": (c_int, [c_void_p, c_double]),
    "ccb_pool_submit": (c_int, [c_void_p, POINTER(File), c_int, POINTER(Item), c_size_t, c_size_t, _I32, _I32,
                                c_int]),
    "ccb_pool_publish": (None, [c_void_p, c_int, c_size_t]),
    "ccb_pool_next": (c_int, [c_void_p, _I32, c_int, c_double]),
    "ccb_pool_cancel": (None, [c_void_p]),
    "ccb_pool_close": (None, [c_void_p]),
    "ccb_pool_stats": (None, [c_void_p, POINTER(Stats)]),
    "ccb_pool_reset_stats": (None, [c_void_p]),
    "ccb_pool_free": (None, [c_void_p]),
    "ccb_pool_error": (c_char_p, [c_void_p]),
    "ccb_pool_error_item": (c_longlong, [c_void_p]),
    "ccb_plan_walk": (c_longlong, [POINTER(File), c_int, POINTER(Item), c_size_t, c_uint64, c_int,
                                   POINTER(c_int64), c_size_t]),
    "ccb_map_file": (c_void_p, [c_int, c_size_t]),
    "ccb_unmap_file": (None, [c_void_p, c_size_t]),
}


@lru_cache(maxsize=None)
def lib() -> ctypes.CDLL:
    """ccbridge._native with the loader pool declared; GpuError where it is not built."""
    return declare(core.lib(), FUNCTIONS)
