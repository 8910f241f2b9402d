"""The chunked AES-256-GCM format (native/gcm/gcm.h) on the GPU, in the host
model of the kernels, and through OpenSSL (the CPU reference and CPU ranks).

A message of n bytes travels as one *wire* buffer:

    ciphertext (n bytes) | zero pad to 16 | one 16-byte tag per chunk

Chunk c is an ordinary AES-256-GCM message with
    nonce = prefix[8] || be32(c)
    aad   = id[32] || le64(n) || le32(c) || le32(chunk_bytes)
so any GCM implementation can check any chunk.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ccbridge import libcrypto
from ccbridge.bindings import core, gcm as gcm_host
from ccbridge.errors import GpuError
from ccbridge.libcrypto import IntegrityError

TAG = 16
PREFIX_BYTES, ID_BYTES = 8, 32
THREADS = 256
# Chunks: about 512 per message so a large GPU is full, 4 KiB .. 256 KiB each
# (a tag per chunk costs 16 bytes; the CTA's per-chunk tag work wants chunks long).
MIN_CHUNK, MAX_CHUNK, TARGET_CHUNKS = 4 << 10, 256 << 10, 512

# dtype codes of gcm.cu's reduction
DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int32": 4, "int64": 5, "uint8": 6, "int8": 6}


@dataclass(frozen=True)
class Ident:
    """What makes one message unique: the nonce prefix and the 32-byte identity bound in the AAD."""

    prefix: bytes
    id: bytes

    def __post_init__(self):
        if len(self.prefix) != PREFIX_BYTES or len(self.id) != ID_BYTES:
            raise ValueError(f"Ident needs an {PREFIX_BYTES}-byte prefix and a {ID_BYTES}-byte id")


def chunk_for(nbytes: int) -> int:
    """The chunk size of an n-byte message (a function of n only: both ends agree)."""
    c = MIN_CHUNK
    while c < MAX_CHUNK and c * TARGET_CHUNKS < nbytes:
        c *= 2
    return c


def nchunks(nbytes: int, chunk: int) -> int:
    return max(1, -(-nbytes // chunk))


def tags_offset(nbytes: int) -> int:
    return (nbytes + 15) & ~15


def wire_len(nbytes: int, chunk: int | None = None) -> int:
    chunk = chunk or chunk_for(nbytes)
    return tags_offset(nbytes) + TAG * nchunks(nbytes, chunk)


def chunk_nonce(ident: Ident, c: int) -> bytes:
    return ident.prefix + struct.pack(">I", c)


def chunk_aad(ident: Ident, nbytes: int, c: int, chunk: int) -> bytes:
    return ident.id + struct.pack("<QII", nbytes, c, chunk)


def _check_len(length: int, nbytes: int, chunk: int) -> None:
    want = wire_len(nbytes, chunk)
    if length != want:
        raise IntegrityError(f"message length {length} bytes, expected {want} for {nbytes} bytes of data: truncated or padded")


# ---- OpenSSL: the reference, and the path of CPU ranks ----

def cpu_encrypt(key: bytes, ident: Ident, plain, chunk: int | None = None, out=None):
    """Encrypt a bytes-like message into out (a writable buffer of wire_len
    bytes) or a new bytearray, which is returned."""
    mv = memoryview(plain).cast("B")
    n = mv.nbytes
    chunk = chunk or chunk_for(n)
    wire = bytearray(wire_len(n, chunk)) if out is None else out
    dst, toff = memoryview(wire).cast("B"), tags_offset(n)
    if dst.nbytes < wire_len(n, chunk):
        raise ValueError("wire buffer too small")
    for c in range(nchunks(n, chunk)):
        a, b = c * chunk, min(n, (c + 1) * chunk)
        tag = libcrypto.encrypt_into(key, chunk_nonce(ident, c), mv[a:b], dst[a:b], chunk_aad(ident, n, c, chunk))
        dst[toff + TAG * c: toff + TAG * (c + 1)] = tag
    return wire


def cpu_decrypt_chunks(key: bytes, ident: Ident, wire, out, chunk: int | None = None) -> list[int]:
    """Verify and decrypt every chunk of a wire buffer into out (n bytes);
    returns the failed chunks' indices (their output zeroed)."""
    dst = memoryview(out).cast("B")
    n = dst.nbytes
    chunk = chunk or chunk_for(n)
    src = memoryview(wire).cast("B")
    _check_len(src.nbytes, n, chunk)
    toff, bad = tags_offset(n), []
    for c in range(nchunks(n, chunk)):
        a, b = c * chunk, min(n, (c + 1) * chunk)
        try:
            libcrypto.decrypt_into(key, chunk_nonce(ident, c), src[a:b], bytes(src[toff + TAG * c: toff + TAG * (c + 1)]),
                                   dst[a:b], chunk_aad(ident, n, c, chunk))
        except IntegrityError:
            bad.append(c)
    return bad


def cpu_decrypt_into(key: bytes, ident: Ident, wire, out, chunk: int | None = None) -> None:
    """As cpu_decrypt_chunks, raising IntegrityError if any chunk failed."""
    bad = cpu_decrypt_chunks(key, ident, wire, out, chunk)
    if bad:
        raise IntegrityError(f"{len(bad)} chunks failed authentication (first: chunk {bad[0]})")


# ---- the kernels' arithmetic, on the host ----

def key_schedule(key: bytes) -> ctypes.Array:
    """The gcm_key struct (round keys, T-table, powers of H) of a 32-byte key."""
    if len(key) != 32:
        raise ValueError(f"AES-256-GCM needs a 32-byte key, got {len(key)}")
    ks = ctypes.create_string_buffer(gcm_host.lib().ccb_gcm_key_size())
    gcm_host.lib().ccb_gcm_key(key, ks)
    return ks


def msg_params(schedule, ident: Ident, nbytes: int, chunk: int) -> ctypes.Array:
    m = ctypes.create_string_buffer(gcm_host.lib().ccb_gcm_msg_size())
    if gcm_host.lib().ccb_gcm_msg(schedule, m, nbytes, chunk, ident.prefix, ident.id) != 0:
        raise ValueError(core.error())
    return m


def raw_params(schedule, iv: bytes, aad: bytes, nbytes: int) -> ctypes.Array:
    """Launch parameters of one plain AES-GCM message (96-bit nonce, any AAD)."""
    if len(iv) != 12:
        raise ValueError(f"the kernels take 96-bit nonces, got {8 * len(iv)} bits")
    m = ctypes.create_string_buffer(gcm_host.lib().ccb_gcm_msg_size())
    if gcm_host.lib().ccb_gcm_raw_msg(schedule, m, nbytes, iv, aad, len(aad)) != 0:
        raise ValueError(core.error())
    return m


def model_raw(key: bytes, iv: bytes, aad: bytes, data: bytes, tag: bytes | None = None) -> tuple[bytes, bytes]:
    """Plain AES-GCM through the kernels' arithmetic: encrypt (tag None) -> (ct, tag),
    or verify+decrypt -> (pt, tag); IntegrityError on a bad tag."""
    ks = key_schedule(key)
    m = raw_params(ks, iv, aad, len(data))
    src = ctypes.create_string_buffer(bytes(data), max(len(data), 1))
    out = ctypes.create_string_buffer(max(len(data), 1))
    t = ctypes.create_string_buffer(tag or bytes(TAG), TAG)
    bad = gcm_host.lib().ccb_gcm_model(ks, m, int(tag is not None), ctypes.addressof(src), ctypes.addressof(out),
                                       ctypes.addressof(t))
    if bad:
        raise IntegrityError("AES-GCM authentication failed")
    return out.raw[:len(data)], t.raw


def model_encrypt(key: bytes, ident: Ident, plain: bytes, chunk: int | None = None) -> bytes:
    """The GPU kernels' computation run on the CPU (for tests against OpenSSL)."""
    n = len(plain)
    chunk = chunk or chunk_for(n)
    ks = key_schedule(key)
    m = msg_params(ks, ident, n, chunk)
    wire = ctypes.create_string_buffer(wire_len(n, chunk))
    src = ctypes.create_string_buffer(plain, n)
    base = ctypes.addressof(wire)
    gcm_host.lib().ccb_gcm_model(ks, m, 0, ctypes.addressof(src), base, base + tags_offset(n))
    return wire.raw


def model_decrypt(key: bytes, ident: Ident, wire: bytes, nbytes: int, chunk: int | None = None) -> bytes:
    chunk = chunk or chunk_for(nbytes)
    _check_len(len(wire), nbytes, chunk)
    ks = key_schedule(key)
    m = msg_params(ks, ident, nbytes, chunk)
    w = ctypes.create_string_buffer(bytes(wire), len(wire))
    out = ctypes.create_string_buffer(max(nbytes, 1))
    bad = gcm_host.lib().ccb_gcm_model(ks, m, 1, ctypes.addressof(w), ctypes.addressof(out),
                                       ctypes.addressof(w) + tags_offset(nbytes))
    if bad:
        raise IntegrityError(f"{bad} chunks failed authentication")
    return out.raw[:nbytes]


# ---- the GPU ----

def fatbin_path() -> Path:
    return gcm_host.FATBIN


@lru_cache(maxsize=None)
def _image() -> bytes:
    p = fatbin_path()
    if not p.exists():
        raise GpuError(f"the GPU AES-GCM kernels were not built ({p} missing): reinstall ccbridge "
                       "where CUDA's nvcc is on PATH or CUDA_HOME is set")
    return p.read_bytes()


def _ptr(t) -> int:
    return 0 if t is None else t.data_ptr()


class GpuCipher:
    """One key on one CUDA device: the key schedule in device memory and
    launches of the kernels on the current stream. Tensors are uint8, contiguous."""

    def __init__(self, key: bytes, device):
        import torch  # deferred: torch, which the wire format and the key schedule do not need

        self.torch = torch
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"GpuCipher needs a CUDA device, got {self.device}")
        self.schedule = key_schedule(key)
        with torch.cuda.device(self.device):
            if gcm_host.lib().ccb_gcm_load(self.device.index or 0, _image()) != 0:
                raise GpuError(core.error())
            host = torch.frombuffer(bytearray(self.schedule.raw), dtype=torch.uint8)
            # uploaded on a stream of its own: the caller's stream may be stalled behind a peer that stopped,
            # and a copy from pageable memory would hold this thread until that stream reached it
            upload = torch.cuda.Stream(self.device)
            with torch.cuda.stream(upload):
                self.dkey = host.to(self.device)
            upload.synchronize()
        self.grid_cap = torch.cuda.get_device_properties(self.device).multi_processor_count * 4

    def _grid(self, m_nchunks: int) -> int:
        return max(1, min(m_nchunks, self.grid_cap))

    def _stream(self) -> int:
        return self.torch.cuda.current_stream(self.device).cuda_stream

    def _msg(self, ident: Ident, nbytes: int, chunk: int):
        return msg_params(self.schedule, ident, nbytes, chunk)

    def _run(self, rc: int) -> None:
        if rc != 0:
            raise GpuError(core.error())

    def _crypt(self, m, nch: int, decrypt: int, src: int, dst: int, tags: int, fail: int) -> None:
        with self.torch.cuda.device(self.device):
            self._run(gcm_host.lib().ccb_gcm_crypt(self._grid(nch), self._stream(), self.dkey.data_ptr(), m, decrypt,
                                                   src, dst, tags, fail))

    def encrypt(self, ident: Ident, plain, wire, chunk: int | None = None) -> None:
        """plain (n bytes) -> wire (wire_len(n) bytes)."""
        n = plain.numel()
        chunk = chunk or chunk_for(n)
        if wire.numel() < wire_len(n, chunk):
            raise ValueError("wire buffer too small")
        w = wire.data_ptr()
        self._crypt(self._msg(ident, n, chunk), nchunks(n, chunk), 0, plain.data_ptr(), w, w + tags_offset(n), 0)

    def decrypt(self, ident: Ident, wire, out, fail, chunk: int | None = None) -> None:
        """wire -> out (n bytes); chunks that fail are zeroed and counted into
        fail (an int32 device tensor), checked by the caller without a sync."""
        n = out.numel()
        chunk = chunk or chunk_for(n)
        _check_len(wire.numel(), n, chunk)
        w = wire.data_ptr()
        self._crypt(self._msg(ident, n, chunk), nchunks(n, chunk), 1, w, out.data_ptr(), w + tags_offset(n),
                    fail.data_ptr())

    def raw(self, iv: bytes, aad: bytes, src, dst, tag, fail=None) -> None:
        """Plain AES-GCM of one message (one CTA; for test vectors): encrypt
        src into dst and tag (16 bytes), or with fail given, verify tag and decrypt."""
        m = raw_params(self.schedule, iv, aad, src.numel())
        self._crypt(m, 1, int(fail is not None), src.data_ptr(), dst.data_ptr(), tag.data_ptr(), _ptr(fail))

    def reduce(self, dtype: str, ident_in: Ident, wire_in, local, fail, plain=None, ident_out: Ident | None = None,
               wire_out=None, chunk: int | None = None) -> None:
        """One reduce-scatter hop in one pass: verify+decrypt wire_in, add local,
        write the sum to plain and/or encrypt it as ident_out into wire_out."""
        n = local.numel()
        chunk = chunk or chunk_for(n)
        if dtype not in DTYPES:
            raise NotImplementedError(f"encrypted reduction of {dtype} is not implemented (supported: {', '.join(DTYPES)})")
        _check_len(wire_in.numel(), n, chunk)
        if (wire_out is None) != (ident_out is None):
            raise ValueError("wire_out and ident_out go together")
        mi = self._msg(ident_in, n, chunk)
        mo = self._msg(ident_out, n, chunk) if ident_out else mi
        wo = _ptr(wire_out)
        with self.torch.cuda.device(self.device):
            self._run(gcm_host.lib().ccb_gcm_reduce(self._grid(nchunks(n, chunk)), self._stream(), self.dkey.data_ptr(),
                                                    mi, mo, DTYPES[dtype], wire_in.data_ptr(),
                                                    wire_in.data_ptr() + tags_offset(n), local.data_ptr(), _ptr(plain),
                                                    wo, wo + tags_offset(n) if wo else 0, fail.data_ptr()))


class CpuCipher:
    """The same operations as GpuCipher on CPU tensors, through OpenSSL (the
    path of CPU-only ranks, e.g. Gloo across nodes without GPUs)."""

    def __init__(self, key: bytes):
        import torch  # deferred: torch, which the wire format and the key schedule do not need

        self.torch = torch
        self.key = key

    def encrypt(self, ident: Ident, plain, wire, chunk: int | None = None) -> None:
        cpu_encrypt(self.key, ident, plain.numpy(), chunk, out=wire.numpy())

    def decrypt(self, ident: Ident, wire, out, fail, chunk: int | None = None) -> list[int]:
        bad = cpu_decrypt_chunks(self.key, ident, wire.numpy(), out.numpy(), chunk)
        fail += len(bad)
        return bad

    def reduce(self, dtype: str, ident_in: Ident, wire_in, local, fail, plain=None, ident_out: Ident | None = None,
               wire_out=None, chunk: int | None = None) -> None:
        torch = self.torch
        n = local.numel()
        chunk = chunk or chunk_for(n)
        if dtype not in DTYPES:
            raise NotImplementedError(f"encrypted reduction of {dtype} is not implemented (supported: {', '.join(DTYPES)})")
        tmp = torch.empty(n, dtype=torch.uint8)
        bad = self.decrypt(ident_in, wire_in, tmp, fail, chunk)
        td = getattr(torch, dtype)
        y = (tmp.view(td) + local.view(td)).view(torch.uint8)
        for c in bad:  # as the kernel: nothing of a failed chunk goes on
            y[c * chunk:(c + 1) * chunk] = 0
        if plain is not None:
            plain.copy_(y)
        if wire_out is not None:
            self.encrypt(ident_out, y, wire_out, chunk)
            toff = tags_offset(n)
            for c in bad:  # poison: the next receiver must fail too
                wire_out[toff + TAG * c] ^= 0xFF
