"""The system OpenSSL (libcrypto.so.3) through ctypes: the EVP AES-256-GCM calls that ccbridge.libcrypto makes.
The project has no header of its own for it: common/ossl.h is how the emulator and the net plugin bind the
same library in C, and tests/test_bindings_twin.py holds the functions both bind to it."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_int, c_void_p

from ccbridge.bindings import declare

HEADER = "common/ossl.h"
SONAME = "libcrypto.so.3"  # the name common/ossl.c dlopens
EVP_CTRL_GCM_SET_IVLEN = 0x9
EVP_CTRL_GCM_GET_TAG = 0x10
EVP_CTRL_GCM_SET_TAG = 0x11
CONSTANTS = {"OSSL_GCM_SET_IVLEN": EVP_CTRL_GCM_SET_IVLEN, "OSSL_GCM_GET_TAG": EVP_CTRL_GCM_GET_TAG,
             "OSSL_GCM_SET_TAG": EVP_CTRL_GCM_SET_TAG}

_INIT = (c_int, [c_void_p, c_void_p, c_void_p, c_char_p, c_char_p])
_UPDATE = (c_int, [c_void_p, c_void_p, POINTER(c_int), c_void_p, c_int])
_FINAL = (c_int, [c_void_p, c_void_p, POINTER(c_int)])
FUNCTIONS = {
    "OpenSSL_version": (c_char_p, [c_int]),
    "EVP_CIPHER_CTX_new": (c_void_p, []),
    "EVP_CIPHER_CTX_free": (None, [c_void_p]),
    "EVP_aes_256_gcm": (c_void_p, []),
    "EVP_EncryptInit_ex": _INIT,
    "EVP_DecryptInit_ex": _INIT,
    "EVP_EncryptUpdate": _UPDATE,
    "EVP_DecryptUpdate": _UPDATE,
    "EVP_EncryptFinal_ex": _FINAL,
    "EVP_DecryptFinal_ex": _FINAL,
    "EVP_CIPHER_CTX_ctrl": (c_int, [c_void_p, c_int, c_int, c_void_p]),
}


def load(name: str) -> ctypes.CDLL:
    """libcrypto by file name with the functions above declared; OSError where it cannot be loaded,
    AttributeError where it lacks one of them."""
    return declare(ctypes.CDLL(name), FUNCTIONS)
