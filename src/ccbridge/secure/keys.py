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
secret and the *session*: the hash of the group's handshake transcript
(secure/handshake.py), which holds fresh randomness from every rank and the
group's identity, so no two sessions (restarts included) share a key as long
as one rank draws fresh randomness:

    group key, epoch e:        info = "ccbridge/v2/group"  | le64(e)
    point-to-point src->dst:   info = "ccbridge/v2/p2p"    | le32(src) | le32(dst) | le64(e)

Nonces (the chunk format is in gcm.py) are prefix[8] || be32(chunk), with
prefix = be16(origin rank) | be32(sequence) | be16(step): a (key, nonce) pair
never repeats because the origin rank, the collective's sequence number within
the epoch, the encryption's step within the collective and the chunk index
together name exactly one encryption, and every rank derives them the same
way. Keys rotate (the epoch advances) before the sequence field would wrap
and before 2^40 bytes have been encrypted under one key by the whole group
(2^36 AES blocks: the usual bound keeping the distinguishing advantage near
2^-57, as TLS 1.3's limits do).

Key material comes in one unambiguous form per source: 64 hex digits (an
environment variable, a text key file, a str), or exactly 32 bytes where the
caller says they are raw (`FileKey(path, raw=True)`, `StaticKey(bytes)`).
Material that is plainly not random (one repeated byte, a counting pattern,
few distinct bytes, printable text) is refused. Errors never quote it.
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
MAX_SEQ = 1 << 32
MAX_RANKS = 1 << 16
MAX_STEPS = 1 << 16
BYTES_PER_KEY = 1 << 40
ENV_VAR, FILE_VAR = "CCBRIDGE_KEY", "CCBRIDGE_KEY_FILE"


def hkdf(ikm: bytes, salt: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 (RFC 5869)."""
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    out, block = b"", b""
    for i in range((length + 31) // 32):
        block = hmac.new(prk, block + info + bytes([i + 1]), hashlib.sha256).digest()
        out += block
    return out[:length]


def _weakness(key: bytes) -> str | None:
    """Why 32 bytes are plainly not random, or None. Each rule refuses a random
    key with probability below 1e-12 (stated per rule)."""
    diffs = [(key[i + 1] - key[i]) & 0xFF for i in range(KEY_BYTES - 1)]
    run = longest = 1
    for a, b in zip(diffs, diffs[1:]):
        run = run + 1 if a == b else 1
        longest = max(longest, run)
    text = sum(0x20 <= b < 0x7F or b in b"\t\n\r" for b in key)
    if len(set(key)) == 1:
        return "every byte is the same"
    if key[:16] == key[16:]:  # p = 2^-128
        return "its two halves are equal"
    if longest >= 8:  # 8 equal steps in a row: p < 2^-53
        return "it holds a counting run"
    if len(set(key)) < 16:  # 32 random bytes have ~30 distinct values: p < 1e-12
        return f"it has only {len(set(key))} distinct byte values"
    if text >= KEY_BYTES - 1:  # p < 33 * (98/256)^31 < 1e-11
        return "it is text (a password, or an encoded key read as raw bytes?)"
    try:
        decoded = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if all(c.isprintable() or c in "\t\n\r" for c in decoded):  # valid UTF-8 with no control character: p < 1e-12
        return "it is UTF-8 text (a passphrase?)"
    return None


def _refuse(where: str, why: str):
    raise KeyMaterialError(f"{where}: refused, {why}; use 32 random bytes, e.g. `openssl rand -hex 32`")


# The parsers delete their copies of the material before raising, so a
# traceback printed with its frames' locals (pytest --showlocals, error
# trackers) does not carry it; callers do the same with try/finally.

def _parse_hex(text: str, where: str) -> bytes:
    t = text.strip()
    if len(t) != 2 * KEY_BYTES or any(c not in "0123456789abcdefABCDEF" for c in t):
        n = len(t)
        del text, t
        raise KeyMaterialError(f"{where}: expected {2 * KEY_BYTES} hex digits (32 bytes), got {n} characters"
                               + ("" if n != 2 * KEY_BYTES else " that are not all hex digits"))
    key = bytes.fromhex(t)
    why = _weakness(key)
    if why:
        del text, t, key
        _refuse(where, why)
    return key


def _parse_raw(data: bytes, where: str) -> bytes:
    n = len(data)
    key = bytes(data)
    why = f"expected exactly {KEY_BYTES} raw bytes, got {n}" if n != KEY_BYTES else _weakness(key)
    if why:
        del data, key
        if n != KEY_BYTES:
            raise KeyMaterialError(f"{where}: {why}")
        _refuse(where, why)
    return key


class KeyProvider(ABC):
    """Supplies the group secret (32 bytes); the same on every rank of a job."""

    @abstractmethod
    def secret(self) -> bytes: ...

    def group_key(self, session: bytes, epoch: int) -> bytes:
        return hkdf(self.secret(), session, b"ccbridge/v2/group" + struct.pack("<Q", epoch))

    def p2p_key(self, session: bytes, src: int, dst: int, epoch: int) -> bytes:
        return hkdf(self.secret(), session, b"ccbridge/v2/p2p" + struct.pack("<IIQ", src, dst, epoch))

    def __repr__(self) -> str:  # never the material
        return f"{type(self).__name__}(<secret>)"


class StaticKey(KeyProvider):
    """Explicit key material: 32 raw bytes (bytes), or 64 hex digits (str)."""

    def __init__(self, material: bytes | str):
        try:
            if isinstance(material, str):
                self._key = _parse_hex(material, "key material")
            elif isinstance(material, (bytes, bytearray, memoryview)):
                self._key = _parse_raw(bytes(material), "key material")
            else:
                raise KeyMaterialError(f"key material must be bytes (32 raw) or str (64 hex digits), "
                                       f"not {type(material).__name__}")
        finally:
            del material

    def secret(self) -> bytes:
        return self._key


class FileKey(KeyProvider):
    """A secret in a file: 64 hex digits (text), or with raw=True exactly 32 raw
    bytes; refused if group or others can read it. Read once, on first use, so
    a key broker may remove the file once the job has started."""

    def __init__(self, path: str | os.PathLike, raw: bool = False):
        self.path, self.raw, self._key = Path(path), raw, None

    def secret(self) -> bytes:
        if self._key is None:
            self._key = self._read()
        return self._key

    def _read(self) -> bytes:
        try:
            st = self.path.stat()
            if not stat.S_ISREG(st.st_mode):
                raise KeyMaterialError(f"key file {self.path}: not a regular file")
            if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise KeyMaterialError(f"key file {self.path} is readable by group or others "
                                       f"(mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it")
            data = self.path.read_bytes()
        except OSError as e:
            raise KeyMaterialError(f"key file {self.path}: {e.strerror}") from None
        where = f"key file {self.path}"
        try:
            if self.raw:
                return _parse_raw(data, where)
            if not data.isascii():
                raise KeyMaterialError(f"{where}: not text; a text key file holds 64 hex digits "
                                       "(for a 32-byte binary key use FileKey(path, raw=True))")
            return _parse_hex(data.decode("ascii"), where)
        finally:
            del data


class EnvKey(KeyProvider):
    """A secret in an environment variable, as 64 hex digits; read once, on first use."""

    def __init__(self, var: str = ENV_VAR):
        self.var, self._key = var, None

    def secret(self) -> bytes:
        if self._key is None:
            if not os.environ.get(self.var):
                raise KeyMaterialError(f"environment variable {self.var} is not set (64 hex digits of key material)")
            self._key = _parse_hex(os.environ[self.var], f"${self.var}")
        return self._key


def configured() -> bool:
    """Whether this environment names a key ($CCBRIDGE_KEY or $CCBRIDGE_KEY_FILE; an empty variable is unset, as the
    net plugin reads them): where none is named a benchmark draws its own, where one is it must be the one used."""
    return bool(os.environ.get(ENV_VAR) or os.environ.get(FILE_VAR))


def default_provider() -> KeyProvider:
    """$CCBRIDGE_KEY, else $CCBRIDGE_KEY_FILE, else a clear error."""
    if os.environ.get(ENV_VAR):
        return EnvKey()
    if os.environ.get(FILE_VAR):
        return FileKey(os.environ[FILE_VAR])
    raise KeyMaterialError(f"no key: set ${ENV_VAR} (64 hex digits) or ${FILE_VAR}, or pass keys=KeyProvider")


def prefix(origin: int, seq: int, step: int) -> bytes:
    """The nonce prefix of one encryption (see the module docstring)."""
    if not (0 <= origin < MAX_RANKS and 0 <= seq < MAX_SEQ and 0 <= step < MAX_STEPS):
        raise ValueError(f"nonce fields out of range: origin {origin}, seq {seq}, step {step}")
    return struct.pack(">HIH", origin, seq, step)


def message_id(session: bytes, op: int, dtype: int, origin: int, step: int, seq: int, epoch: int) -> bytes:
    """The 32-byte identity bound into every chunk's AAD."""
    return b"ccb1" + session[:8] + struct.pack("<BBHIIQ", op, dtype, epoch & 0xFFFF, origin, step, seq)
