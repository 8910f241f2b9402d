"""Keys for encrypted collectives: where the secret comes from, how per-session
and per-peer keys are derived, and when they rotate.

A KeyProvider supplies one 32-byte *group secret* shared by the ranks of a
job. In production that secret is released to each rank only after remote
attestation: a key broker verifies the CPU TEE's report (TDX quote or
SEV-SNP report) and the GPU's attestation report (CC mode on, expected
driver and VBIOS measurements, via NVIDIA's attestation service), then
releases the secret over a channel bound to that report. ccbridge does not
attest; it consumes the released secret (`FileKey`, `EnvKey`, `StaticKey`).

Every key actually used is derived with HKDF-SHA256 (RFC 5869) from the
secret, a fresh random *session salt* drawn when the group is formed (so a
restarted job never reuses a key), and what the key is for:

    group key, epoch e:        info = "ccbridge/v1/group"  | le64(e)
    point-to-point src->dst:   info = "ccbridge/v1/p2p"    | le32(src) | le32(dst) | le64(e)

Nonces (the chunk format is in gcm.py) are prefix[8] || be32(chunk), with
prefix = be16(origin rank) | be32(sequence) | be16(step): a (key, nonce) pair
never repeats because the origin rank, the collective's sequence number within
the epoch, the encryption's step within the collective and the chunk index
together name exactly one encryption, and every rank derives them the same
way. Keys rotate (the epoch advances) before the sequence field would wrap
and before 2^40 bytes have been encrypted under one key by the whole group
(2^36 AES blocks: the usual bound keeping the distinguishing advantage near
2^-57, as TLS 1.3's limits do).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import struct
from abc import ABC, abstractmethod
from pathlib import Path

from ccbridge.errors import KeyMaterialError

KEY_BYTES = 32
SALT_BYTES = 32
MAX_SEQ = 1 << 32
MAX_RANKS = 1 << 16
MAX_STEPS = 1 << 16
BYTES_PER_KEY = 1 << 40
ENV_VAR = "CCBRIDGE_KEY"


def hkdf(ikm: bytes, salt: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 (RFC 5869)."""
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    out, block = b"", b""
    for i in range((length + 31) // 32):
        block = hmac.new(prk, block + info + bytes([i + 1]), hashlib.sha256).digest()
        out += block
    return out[:length]


def _parse(material: bytes, where: str) -> bytes:
    if len(material) == KEY_BYTES:
        return bytes(material)
    try:
        key = bytes.fromhex(material.strip().decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise KeyMaterialError(f"{where}: expected {KEY_BYTES} raw bytes or {2 * KEY_BYTES} hex digits") from None
    if len(key) != KEY_BYTES:
        raise KeyMaterialError(f"{where}: expected {KEY_BYTES} bytes ({2 * KEY_BYTES} hex digits), got {len(key)}")
    return key


class KeyProvider(ABC):
    """Supplies the group secret (32 bytes); the same on every rank of a job."""

    @abstractmethod
    def secret(self) -> bytes: ...

    def group_key(self, salt: bytes, epoch: int) -> bytes:
        return hkdf(self.secret(), salt, b"ccbridge/v1/group" + struct.pack("<Q", epoch))

    def p2p_key(self, salt: bytes, src: int, dst: int, epoch: int) -> bytes:
        return hkdf(self.secret(), salt, b"ccbridge/v1/p2p" + struct.pack("<IIQ", src, dst, epoch))


class StaticKey(KeyProvider):
    """Explicit key material (tests, or a secret already released to the caller)."""

    def __init__(self, material: bytes):
        self._key = _parse(material, "key material")

    def secret(self) -> bytes:
        return self._key


class FileKey(KeyProvider):
    """A secret in a file: 32 raw bytes or 64 hex digits; refused if others can read it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def secret(self) -> bytes:
        try:
            st = self.path.stat()
            data = self.path.read_bytes()
        except OSError as e:
            raise KeyMaterialError(f"key file {self.path}: {e.strerror}") from None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyMaterialError(f"key file {self.path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it")
        return _parse(data, f"key file {self.path}")


class EnvKey(KeyProvider):
    """A secret in an environment variable, as 64 hex digits."""

    def __init__(self, var: str = ENV_VAR):
        self.var = var

    def secret(self) -> bytes:
        v = os.environ.get(self.var)
        if not v:
            raise KeyMaterialError(f"environment variable {self.var} is not set (64 hex digits of key material)")
        return _parse(v.encode(), f"${self.var}")


def default_provider() -> KeyProvider:
    """$CCBRIDGE_KEY, else $CCBRIDGE_KEY_FILE, else a clear error."""
    if os.environ.get(ENV_VAR):
        return EnvKey()
    if os.environ.get("CCBRIDGE_KEY_FILE"):
        return FileKey(os.environ["CCBRIDGE_KEY_FILE"])
    raise KeyMaterialError(f"no key: set ${ENV_VAR} (64 hex digits) or $CCBRIDGE_KEY_FILE, or pass keys=KeyProvider")


def prefix(origin: int, seq: int, step: int) -> bytes:
    """The nonce prefix of one encryption (see the module docstring)."""
    if not (0 <= origin < MAX_RANKS and 0 <= seq < MAX_SEQ and 0 <= step < MAX_STEPS):
        raise ValueError(f"nonce fields out of range: origin {origin}, seq {seq}, step {step}")
    return struct.pack(">HIH", origin, seq, step)


def message_id(session: bytes, op: int, dtype: int, origin: int, step: int, seq: int, epoch: int) -> bytes:
    """The 32-byte identity bound into every chunk's AAD."""
    return b"ccb1" + session[:8] + struct.pack("<BBHIIQ", op, dtype, epoch & 0xFFFF, origin, step, seq)
