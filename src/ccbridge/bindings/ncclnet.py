"""The NCCL net plugin's v11 API (native/ncclnet/ncclnet.h) through ctypes, as NCCL's proxy thread drives it:
the ncclNetPlugin_v11 table of entry points and the structs they fill. For `ccbridge bench net` and the
tests (secure/netplugin.Net drives it); tests/test_bindings_twin.py holds these to ncclnet.h."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_float, c_size_t, c_uint64, c_ulong

HEADER = "ncclnet/ncclnet.h"
HANDLE_BYTES = 128  # the handle buffer NCCL gives listen and connect
CONSTANTS = {"NCCL_NET_HANDLE_MAXSIZE": HANDLE_BYTES}

_R, _P = ctypes.c_int, ctypes.c_void_p
_PP = POINTER(ctypes.c_void_p)
FN = {  # ncclNet_v11 in declaration order and the signatures used here (c_void_p: an entry point not called)
    "init": ctypes.CFUNCTYPE(_R, _PP, c_uint64, _P, _P, _P),
    "devices": ctypes.CFUNCTYPE(_R, POINTER(_R)),
    "getProperties": ctypes.CFUNCTYPE(_R, _R, _P),
    "listen": ctypes.CFUNCTYPE(_R, _P, _R, _P, _PP),
    "connect": ctypes.CFUNCTYPE(_R, _P, _R, _P, _PP, _P),
    "accept": ctypes.CFUNCTYPE(_R, _P, _PP, _P),
    "regMr": ctypes.CFUNCTYPE(_R, _P, _P, c_size_t, _R, _PP),
    "regMrDmaBuf": _P,
    "deregMr": ctypes.CFUNCTYPE(_R, _P, _P),
    "isend": ctypes.CFUNCTYPE(_R, _P, _P, c_size_t, _R, _P, _P, _PP),
    "irecv": ctypes.CFUNCTYPE(_R, _P, _R, _PP, POINTER(c_size_t), POINTER(_R), _PP, _PP, _PP),
    "iflush": ctypes.CFUNCTYPE(_R, _P, _R, _PP, POINTER(_R), _PP, _PP),
    "test": ctypes.CFUNCTYPE(_R, _P, POINTER(_R), POINTER(_R)),
    "closeSend": ctypes.CFUNCTYPE(_R, _P),
    "closeRecv": ctypes.CFUNCTYPE(_R, _P),
    "closeListen": ctypes.CFUNCTYPE(_R, _P),
    "getDeviceMr": _P,
    "irecvConsumed": _P,
    "makeVDevice": _P,
    "finalize": ctypes.CFUNCTYPE(_R, _P),
    "setNetAttr": _P,
}


class Net11(ctypes.Structure):  # ccbNet_v11
    _fields_ = [("name", c_char_p)] + [(k, v) for k, v in FN.items()]


class Props11(ctypes.Structure):  # ccbNetProperties_v11, its v10 prefix and vProps flattened
    _fields_ = [("name", c_char_p), ("pciPath", c_char_p), ("guid", c_uint64),
                ("ptrSupport", _R), ("regIsGlobal", _R), ("forceFlush", _R), ("speed", _R), ("port", _R),
                ("latency", c_float), ("maxComms", _R), ("maxRecvs", _R), ("netDeviceType", _R),
                ("netDeviceVersion", _R), ("vNdevs", _R), ("vDevs", _R * 4), ("maxP2pBytes", c_size_t),
                ("maxCollBytes", c_size_t), ("maxMultiRequestSize", _R)]


STRUCTS = {"ccbNet_v11": Net11, "ccbNetProperties_v11": Props11}
# ncclDebugLogger_t: NCCL's printf-like logger, here with the one argument the plugin's messages carry
LOGGER = ctypes.CFUNCTYPE(None, _R, c_ulong, c_char_p, _R, c_char_p, c_char_p)
FUNCTION_TYPES = {"ncclDebugLogger_t": LOGGER}


def load(path: str) -> tuple[ctypes.CDLL, Net11]:
    """The plugin at path and its ncclNetPlugin_v11 table; OSError where it cannot be loaded."""
    so = ctypes.CDLL(path)
    return so, Net11.in_dll(so, "ncclNetPlugin_v11")
