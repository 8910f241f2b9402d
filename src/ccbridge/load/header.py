"""The safetensors header, validated before a single data byte is read.

Layout: 8 bytes little-endian N, then N bytes of UTF-8 JSON, then the data.
The rules are safetensors' own (header size limit, dtype sizes, offsets
contiguous from 0 in offset order, file length exact) with checked
arithmetic, plus what its parser lets pass and we do not: duplicate keys,
unknown entry fields, non-integer or boolean numbers, NaN/Infinity tokens,
strings that are not text (unpaired surrogate escapes), shapes of more than
MAX_RANK dimensions, nesting too deep for the JSON parser.
Every violation raises HeaderError naming the file and the rule.

The header is read through an open descriptor, and the file length is that
descriptor's: the loader keeps the same descriptor, so the file checked is
the file read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ccbridge.errors import CCBridgeError

MAX_HEADER_BYTES = 100_000_000  # safetensors' MAX_HEADER_SIZE
U64_MAX = 2**64 - 1  # safetensors does its size arithmetic in usize
# numpy's limit on dimensions (NPY_MAXDIMS); torch sets none, and no real tensor comes
# close, so a longer shape is a broken or hostile header, not a tensor.
MAX_RANK = 64

# safetensors dtype -> (bits per element, torch dtype attribute or None).
# F6 types have no torch dtype; safetensors cannot hand them to torch either.
DTYPES: dict[str, tuple[int, str | None]] = {
    "BOOL": (8, "bool"),
    "F4": (4, "float4_e2m1fn_x2"),
    "F6_E2M3": (6, None),
    "F6_E3M2": (6, None),
    "U8": (8, "uint8"),
    "I8": (8, "int8"),
    "F8_E5M2": (8, "float8_e5m2"),
    "F8_E4M3": (8, "float8_e4m3fn"),
    "F8_E8M0": (8, "float8_e8m0fnu"),
    "F8_E4M3FNUZ": (8, "float8_e4m3fnuz"),
    "F8_E5M2FNUZ": (8, "float8_e5m2fnuz"),
    "I16": (16, "int16"),
    "U16": (16, "uint16"),
    "F16": (16, "float16"),
    "BF16": (16, "bfloat16"),
    "I32": (32, "int32"),
    "U32": (32, "uint32"),
    "F32": (32, "float32"),
    "C64": (64, "complex64"),
    "F64": (64, "float64"),
    "I64": (64, "int64"),
    "U64": (64, "uint64"),
}
ENTRY_FIELDS = {"dtype", "shape", "data_offsets"}


class HeaderError(CCBridgeError, ValueError):
    """A safetensors file breaks a rule of the format; nothing was loaded from it."""

    def __init__(self, path: str, rule: str, detail: str):
        self.path, self.rule, self.detail = path, rule, detail
        super().__init__(f"{path}: {rule}: {detail}")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # data offsets, relative to the start of the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass
class Header:
    path: str
    header_bytes: int  # N
    file_bytes: int
    tensors: list[TensorInfo]  # in offset order
    metadata: dict[str, str] | None = None
    by_name: dict[str, TensorInfo] = field(default_factory=dict, repr=False)

    @property
    def data_start(self) -> int:
        return 8 + self.header_bytes

    @property
    def data_bytes(self) -> int:
        return self.file_bytes - self.data_start


def _reject_constant(token: str):
    raise ValueError(f"the JSON token {token} is not allowed")


def _unique_pairs(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


class _Duplicate(Exception):
    pass


def _is_text(s: str) -> bool:
    """JSON's \\uD800-style escapes can spell strings that no UTF-8 encodes."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _entry(path: str, name: str, raw) -> TensorInfo:
    def bad(rule: str, detail: str):
        raise HeaderError(path, rule, f"tensor {name!r}: {detail}")

    if not isinstance(raw, dict):
        bad("tensor entry", f"expected an object with {sorted(ENTRY_FIELDS)}, got {type(raw).__name__}")
    missing, unknown = ENTRY_FIELDS - raw.keys(), raw.keys() - ENTRY_FIELDS
    if missing:
        bad("tensor entry", f"missing {sorted(missing)}")
    if unknown:
        bad("tensor entry", f"unknown fields {sorted(unknown)}")
    dtype, shape, offsets = raw["dtype"], raw["shape"], raw["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        bad("dtype", f"unknown dtype {dtype!r}; safetensors knows {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        bad("shape", f"expected a list of non-negative integers, got {shape!r:.200}")
    if len(shape) > MAX_RANK:
        bad("shape", f"{len(shape)} dimensions; at most {MAX_RANK} are accepted")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) and 0 <= o <= U64_MAX for o in offsets)):
        bad("data_offsets", f"expected [begin, end] as non-negative 64-bit integers, got {offsets!r}")
    begin, end = offsets
    if end < begin:
        bad("data_offsets", f"end {end} is before begin {begin}")
    n = 1
    for d in shape:
        n *= d
        if n > U64_MAX:
            bad("shape overflow", f"element count of shape {shape} exceeds 64 bits")
    bits = n * DTYPES[dtype][0]
    if bits > U64_MAX:
        bad("shape overflow", f"size of shape {shape} x {dtype} exceeds 64 bits")
    if bits % 8:
        bad("sub-byte size", f"{n} elements of {dtype} do not end on a byte boundary")
    if end - begin != bits // 8:
        bad("size mismatch", f"shape {shape} x {dtype} is {bits // 8} bytes but data_offsets span {end - begin}")
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def parse(fd: int, path: str) -> Header:
    """Validate the header of the file open at fd (read with pread, offset-free)."""
    size = os.fstat(fd).st_size
    if size < 8:
        raise HeaderError(path, "truncated", f"the file has {size} bytes, fewer than the 8-byte header length "
                          "(not a safetensors file?)")
    n = int.from_bytes(os.pread(fd, 8, 0), "little")
    if n > MAX_HEADER_BYTES:
        raise HeaderError(path, "header too large", f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit "
                          "(not a safetensors file?)")
    if 8 + n > size:
        raise HeaderError(path, "truncated", f"header length {n} runs past the end of the {size}-byte file")
    raw = os.pread(fd, n, 8)
    if len(raw) != n:
        raise HeaderError(path, "truncated", f"read {len(raw)} of {n} header bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HeaderError(path, "not UTF-8", f"header byte {e.start}: {e.reason}") from None
    try:
        obj = json.loads(text, object_pairs_hook=_unique_pairs, parse_constant=_reject_constant)
    except _Duplicate as e:
        raise HeaderError(path, "duplicate key", f"{e.args[0]!r} appears more than once") from None
    except ValueError as e:
        raise HeaderError(path, "not JSON", str(e)) from None
    except RecursionError:
        raise HeaderError(path, "not JSON", "nested deeper than the JSON parser can follow") from None
    if not isinstance(obj, dict):
        raise HeaderError(path, "not JSON", f"the header must be a JSON object, got {type(obj).__name__}")
    metadata = obj.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise HeaderError(path, "metadata", "__metadata__ must be an object of string values")
    for text in [*obj, *(metadata or {}).keys(), *(metadata or {}).values()]:
        if not _is_text(text):
            raise HeaderError(path, "not UTF-8", f"{text!r:.80} holds an unpaired surrogate escape, not text")
    tensors = sorted((_entry(path, k, v) for k, v in obj.items()), key=lambda t: (t.begin, t.end))
    pos = 0
    for t in tensors:
        if t.begin < pos:
            raise HeaderError(path, "overlapping offsets", f"tensor {t.name!r} begins at {t.begin}, inside the previous tensor (ends at {pos})")
        if t.begin > pos:
            raise HeaderError(path, "gap in offsets", f"tensor {t.name!r} begins at {t.begin}, but the previous data ends at {pos}")
        pos = t.end
    data = size - 8 - n
    if pos > data:
        raise HeaderError(path, "truncated", f"the tensors need {pos} data bytes, the file holds {data}")
    if pos < data:
        raise HeaderError(path, "trailing bytes", f"{data - pos} bytes after the last tensor's data")
    h = Header(path, n, size, tensors, metadata)
    h.by_name = {t.name: t for t in tensors}
    return h


def read_header(path: str | os.PathLike) -> Header:
    """The validated header of one safetensors file; HeaderError if it breaks a rule."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise HeaderError(path, "unreadable", e.strerror or str(e)) from None
    try:
        return parse(fd, path)
    finally:
        os.close(fd)
