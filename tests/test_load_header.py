"""Header validation: every malformed file raises HeaderError naming the file and the rule.

No torch needed. Where safetensors is installed, its own parser is the
reference for "at least as strict": any mutation of a valid file that
safetensors rejects, we reject too.
"""

import json
import random
import struct

import pytest

from ccbridge.load import checkpoint
from ccbridge.errors import UsageError
from ccbridge.load.header import MAX_HEADER_BYTES, MAX_RANK, HeaderError, read_header


def raw_file(header, data: bytes = b"", header_text: bytes | None = None) -> bytes:
    text = header_text if header_text is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def good_header():
    return {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
            "c": {"dtype": "I64", "shape": [], "data_offsets": [22, 30]},
            "__metadata__": {"format": "pt"}}


DATA = bytes(range(1, 31))


def write(tmp_path, blob: bytes, name="x.safetensors"):
    p = tmp_path / name
    p.write_bytes(blob)
    return p


def test_valid_file_parses(tmp_path):
    h = read_header(write(tmp_path, raw_file(good_header(), DATA)))
    assert [t.name for t in h.tensors] == ["a", "b", "c"]
    assert h.by_name["c"].shape == () and h.by_name["c"].nbytes == 8
    assert h.metadata == {"format": "pt"} and h.data_start == 8 + h.header_bytes


def test_empty_and_zero_size_tensors(tmp_path):
    hdr = {"e": {"dtype": "F16", "shape": [0, 3], "data_offsets": [0, 0]},
           "f": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}
    h = read_header(write(tmp_path, raw_file(hdr, b"\x01\x02")))
    assert [t.name for t in h.tensors] == ["e", "f"]


def mutate(h, key, field, value):
    h[key][field] = value
    return h


CASES = [
    ("truncated", lambda: b"\x01\x02\x03"),
    ("truncated", lambda: raw_file(good_header(), DATA[:-1])),
    ("truncated", lambda: struct.pack("<Q", 1000) + b"{}"),
    ("header too large", lambda: struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}"),
    ("trailing bytes", lambda: raw_file(good_header(), DATA + b"\x07")),
    ("not UTF-8", lambda: raw_file(None, DATA, header_text=b'{"a\xff":1}')),
    ("not JSON", lambda: raw_file(None, b"", header_text=b"{not json")),
    ("not JSON", lambda: raw_file(None, b"", header_text=b"[1, 2]")),
    ("not JSON", lambda: raw_file(None, b"", header_text=b'{"a": NaN}')),
    ("duplicate key", lambda: raw_file(None, DATA[:16], header_text=(
        b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},'
        b'"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'))),
    ("duplicate key", lambda: raw_file(None, DATA[:16], header_text=(
        b'{"a":{"dtype":"F32","dtype":"F32","shape":[4],"data_offsets":[0,16]}}'))),
    ("dtype", lambda: raw_file(mutate(good_header(), "a", "dtype", "F128"), DATA)),
    ("dtype", lambda: raw_file(mutate(good_header(), "a", "dtype", 7), DATA)),
    ("shape", lambda: raw_file(mutate(good_header(), "a", "shape", [2, -2]), DATA)),
    ("shape", lambda: raw_file(mutate(good_header(), "a", "shape", [2, 2.0]), DATA)),
    ("shape", lambda: raw_file(mutate(good_header(), "a", "shape", [True, 4]), DATA)),
    ("shape overflow", lambda: raw_file(mutate(good_header(), "a", "shape", [2**32, 2**32, 2]), DATA)),
    ("shape overflow", lambda: raw_file(mutate(good_header(), "a", "shape", [2**62]), DATA)),
    ("size mismatch", lambda: raw_file(mutate(good_header(), "a", "shape", [2, 3]), DATA)),
    ("sub-byte size", lambda: raw_file({"f": {"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}}, b"\x01")),
    ("data_offsets", lambda: raw_file(mutate(good_header(), "a", "data_offsets", [16, 0]), DATA)),
    ("data_offsets", lambda: raw_file(mutate(good_header(), "a", "data_offsets", [0]), DATA)),
    ("data_offsets", lambda: raw_file(mutate(good_header(), "a", "data_offsets", [0, 2**64]), DATA)),
    ("overlapping offsets", lambda: raw_file(mutate(good_header(), "b", "data_offsets", [14, 20]), DATA)),
    ("gap in offsets", lambda: raw_file(mutate(mutate(good_header(), "b", "data_offsets", [18, 24]), "c", "data_offsets", [24, 32]), DATA + b"\x01\x02")),
    ("gap in offsets", lambda: raw_file({"a": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}}, b"\x01" * 6)),
    ("tensor entry", lambda: raw_file({"a": [1, 2]}, b"")),
    ("tensor entry", lambda: raw_file({"a": {"dtype": "U8", "shape": [1]}}, b"\x01")),
    ("tensor entry", lambda: raw_file({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}}, b"\x01")),
    ("metadata", lambda: raw_file({"__metadata__": {"k": 1}}, b"")),
    ("not JSON", lambda: raw_file(None, b"", header_text=b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")),
    ("not UTF-8", lambda: raw_file(None, b"\x01", header_text=b'{"a\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}')),
    ("not UTF-8", lambda: raw_file(None, b"", header_text=b'{"__metadata__":{"k":"\\udfff"}}')),
    ("shape", lambda: raw_file({"a": {"dtype": "U8", "shape": [1] * (MAX_RANK + 1), "data_offsets": [0, 1]}}, b"\x01")),
    ("shape", lambda: raw_file({"a": {"dtype": "U8", "shape": [1] * 10**6, "data_offsets": [0, 1]}}, b"\x01")),
]


@pytest.mark.parametrize("rule,make", CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_malformed_raises_with_rule(tmp_path, rule, make):
    p = write(tmp_path, make())
    with pytest.raises(HeaderError) as e:
        read_header(p)
    assert e.value.rule == rule
    assert str(p) in str(e.value)


def test_max_rank_is_accepted(tmp_path):
    h = read_header(write(tmp_path, raw_file({"a": {"dtype": "U8", "shape": [1] * MAX_RANK, "data_offsets": [0, 1]}}, b"\x01")))
    assert len(h.by_name["a"].shape) == MAX_RANK


def test_paired_surrogate_escape_is_text(tmp_path):
    blob = raw_file(None, b"\x01", header_text=b'{"\\ud83d\\ude00":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}')
    assert [t.name for t in read_header(write(tmp_path, blob)).tensors] == ["\U0001F600"]


def test_resolve_refuses_missing_and_repeated_paths(tmp_path):
    one = write(tmp_path, raw_file({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\x01"))
    with pytest.raises(UsageError, match="no such file or directory"):
        checkpoint.resolve([one, tmp_path / "nope.safetensors"])
    with pytest.raises(UsageError, match="given twice"):
        checkpoint.resolve([one, tmp_path / "." / one.name])
    with pytest.raises(UsageError, match="no checkpoint given"):
        checkpoint.resolve([])


def test_missing_file(tmp_path):
    with pytest.raises(HeaderError) as e:
        read_header(tmp_path / "nope.safetensors")
    assert e.value.rule == "unreadable"


def test_at_least_as_strict_as_safetensors(tmp_path):
    """Random byte and JSON mutations: whatever safetensors rejects, we reject."""
    st = pytest.importorskip("safetensors")
    base = raw_file(good_header(), DATA)
    rng = random.Random(1234)
    checked = rejected_by_both = 0
    for i in range(400):
        blob = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            op = rng.random()
            pos = rng.randrange(len(blob))
            if op < 0.5:
                blob[pos] = rng.randrange(256)
            elif op < 0.75:
                del blob[pos]
            else:
                blob.insert(pos, rng.randrange(256))
        p = write(tmp_path, bytes(blob), f"m{i}.safetensors")
        try:
            with st.safe_open(str(p), framework="numpy"):
                pass
            theirs = True
        except Exception:
            theirs = False
        try:
            read_header(p)
            ours = True
        except HeaderError:
            ours = False
        checked += 1
        assert not (ours and not theirs), f"mutation {i} accepted by us, rejected by safetensors: {bytes(blob)[:120]!r}"
        rejected_by_both += not ours and not theirs
    assert rejected_by_both > 100  # the mutations do hit the rules


def test_index_checks(tmp_path):
    one = raw_file({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\x01")
    two = raw_file({"b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\x02")
    write(tmp_path, one, "s1.safetensors")
    write(tmp_path, two, "s2.safetensors")
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    files, wm, index = checkpoint.resolve(tmp_path)
    assert [f.rsplit("/", 1)[1] for f in files] == ["s1.safetensors", "s2.safetensors"] and index == str(idx)
    headers = [read_header(f) for f in files]
    checkpoint.check_names(headers, wm, index)
    with pytest.raises(HeaderError, match="index mismatch"):
        checkpoint.check_names(headers, {"a": "s2.safetensors", "b": "s2.safetensors"}, index)
    with pytest.raises(HeaderError, match="not in the index"):
        checkpoint.check_names(headers, {"a": "s1.safetensors"}, index)
    with pytest.raises(HeaderError, match="duplicate tensor"):
        checkpoint.check_names([headers[0], headers[0]], None, None)
    idx.write_text(json.dumps({"weight_map": {"a": "../s1.safetensors"}}))
    with pytest.raises(HeaderError, match="plain file name"):
        checkpoint.resolve(tmp_path)
    idx.write_text("{broken")
    with pytest.raises(HeaderError, match="index not JSON"):
        checkpoint.resolve(tmp_path)
    idx.unlink()
    files, wm, index = checkpoint.resolve(tmp_path)
    assert len(files) == 2 and wm is None
    with pytest.raises(HeaderError, match="empty checkpoint"):
        checkpoint.resolve(tmp_path / "sub") if (tmp_path / "sub").mkdir() is None else None
