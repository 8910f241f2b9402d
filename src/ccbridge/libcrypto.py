"""AES-256-GCM through the system OpenSSL (libcrypto.so.3), loaded with ctypes.

The system library, not a bundled one, because the point is to measure the
cipher that the guest's own stack would run (and OPENSSL_ia32cap, read once
when the library initialises, masks its code paths the same way).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from ctypes import c_char_p, c_int, c_void_p
from functools import lru_cache

from ccbridge.bindings import libcrypto as binding
from ccbridge.bindings.libcrypto import EVP_CTRL_GCM_GET_TAG, EVP_CTRL_GCM_SET_IVLEN, EVP_CTRL_GCM_SET_TAG
from ccbridge.errors import CryptoUnavailable, IntegrityError  # noqa: F401 - part of this module's API

TAG_BYTES = 16
_CHUNK = 1 << 30  # EVP_*Update takes an int length


@lru_cache(maxsize=None)
def lib() -> ctypes.CDLL:
    names = [binding.SONAME, ctypes.util.find_library("crypto")]
    errors = []
    for name in filter(None, names):
        try:
            return binding.load(name)
        except OSError as e:
            errors.append(str(e))
        except AttributeError as e:
            raise CryptoUnavailable(f"libcrypto lacks a needed function: {e}") from None
    raise CryptoUnavailable("system OpenSSL libcrypto (libcrypto.so.3) not found: " + "; ".join(errors or ["no candidate"]))


def openssl_version() -> str:
    return lib().OpenSSL_version(0).decode()


def _as_buffer(buf):
    """A buffer whose address stays valid while the caller holds the result."""
    mv = memoryview(buf).cast("B")
    return bytes(mv) if mv.readonly and not isinstance(buf, bytes) else buf


def _addr(buf) -> int:
    """Address of a bytes object or writable buffer, without copying."""
    mv = memoryview(buf).cast("B")
    if not len(mv):
        return 0
    if mv.readonly:
        return ctypes.cast(c_char_p(buf), c_void_p).value
    return ctypes.addressof(ctypes.c_char.from_buffer(mv))


class _Ctx:
    def __init__(self):
        self.p = lib().EVP_CIPHER_CTX_new()
        if not self.p:
            raise CryptoUnavailable("EVP_CIPHER_CTX_new failed")

    def __enter__(self):
        return self.p

    def __exit__(self, *exc):
        lib().EVP_CIPHER_CTX_free(self.p)


def _check_params(key: bytes, iv: bytes) -> None:
    if len(key) != 32:
        raise ValueError(f"AES-256-GCM needs a 32-byte key, got {len(key)}")
    if not 1 <= len(iv) <= 1024:
        raise ValueError(f"GCM nonce must be 1..1024 bytes, got {len(iv)}")


def _run(update, ctx, out_addr: int, in_addr: int, n: int) -> None:
    outl = c_int()
    done = 0
    while done < n:
        step = min(_CHUNK, n - done)
        if update(ctx, out_addr + done, ctypes.byref(outl), in_addr + done, step) != 1:
            raise RuntimeError("EVP update failed")
        done += step


def _begin(init, update, ctx, key: bytes, iv: bytes, aad: bytes) -> None:
    """Select AES-256-GCM, set the nonce length, key and nonce, then feed the AAD."""
    so = lib()
    outl = c_int()
    ok = (init(ctx, so.EVP_aes_256_gcm(), None, None, None) == 1
          and so.EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, len(iv), None) == 1
          and init(ctx, None, None, key, iv) == 1)
    if not ok:
        raise RuntimeError("EVP cipher initialisation failed")
    if aad and update(ctx, None, ctypes.byref(outl), c_char_p(aad), len(aad)) != 1:
        raise RuntimeError("EVP update with the associated data failed")


def encrypt_into(key: bytes, iv: bytes, plaintext, out: bytearray | memoryview, aad: bytes = b"") -> bytes:
    """Encrypt plaintext into out (same length); returns the 16-byte tag."""
    _check_params(key, iv)
    plaintext = _as_buffer(plaintext)
    n = memoryview(plaintext).nbytes
    if memoryview(out).nbytes != n:
        raise ValueError("output buffer length must equal the plaintext length")
    so = lib()
    tag = ctypes.create_string_buffer(TAG_BYTES)
    outl = c_int()
    with _Ctx() as ctx:
        _begin(so.EVP_EncryptInit_ex, so.EVP_EncryptUpdate, ctx, key, iv, aad)
        _run(so.EVP_EncryptUpdate, ctx, _addr(out), _addr(plaintext), n)
        if so.EVP_EncryptFinal_ex(ctx, None, ctypes.byref(outl)) != 1:
            raise RuntimeError("EVP_EncryptFinal_ex failed")
        if so.EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG_BYTES, tag) != 1:
            raise RuntimeError("reading the GCM tag failed")
    return tag.raw


def decrypt_into(key: bytes, iv: bytes, ciphertext, tag: bytes, out: bytearray | memoryview, aad: bytes = b"") -> None:
    """Verify and decrypt into out; raises IntegrityError (and zeroes out) on a bad tag."""
    _check_params(key, iv)
    if len(tag) != TAG_BYTES:
        raise IntegrityError(f"GCM tag must be {TAG_BYTES} bytes, got {len(tag)}")
    ciphertext = _as_buffer(ciphertext)
    n = memoryview(ciphertext).nbytes
    if memoryview(out).nbytes != n:
        raise ValueError("output buffer length must equal the ciphertext length")
    so = lib()
    outl = c_int()
    with _Ctx() as ctx:
        _begin(so.EVP_DecryptInit_ex, so.EVP_DecryptUpdate, ctx, key, iv, aad)
        _run(so.EVP_DecryptUpdate, ctx, _addr(out), _addr(ciphertext), n)
        tagbuf = ctypes.create_string_buffer(tag, TAG_BYTES)
        if so.EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG_BYTES, tagbuf) != 1:
            raise RuntimeError("setting the GCM tag failed")
        if so.EVP_DecryptFinal_ex(ctx, None, ctypes.byref(outl)) != 1:
            memoryview(out).cast("B")[:] = bytes(n)  # release no plaintext of a failed message
            raise IntegrityError("AES-GCM authentication failed")


def encrypt(key: bytes, iv: bytes, plaintext: bytes, aad: bytes = b"") -> tuple[bytes, bytes]:
    out = bytearray(len(plaintext))
    tag = encrypt_into(key, iv, plaintext, out, aad)
    return bytes(out), tag


def decrypt(key: bytes, iv: bytes, ciphertext: bytes, tag: bytes, aad: bytes = b"") -> bytes:
    out = bytearray(len(ciphertext))
    decrypt_into(key, iv, ciphertext, tag, out, aad)
    return bytes(out)
