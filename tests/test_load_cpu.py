"""The loader on the CPU: chunk planning, and whole loads into host memory.

The host target runs the same pool, scheduler, completion tracking and error
path as a GPU load, minus the CUDA copies (those are in test_load_gpu.py).
"""

import threading

import pytest

import ckpt_util
from ccbridge.load import HeaderError, LoadStats, iter_safetensors, load_safetensors
from ccbridge.load.loader import plan_chunks


def test_plan_chunks_coalesces_and_splits():
    # fd 3: three contiguous small items, then one large; fd 4: one item
    items = [(3, 100, 10, 1000, 0), (3, 110, 20, 2000, 1), (3, 130, 5, 3000, 2),
             (3, 135, 70, 4000, 3), (4, 8, 16, 5000, 4)]
    chunks, segs = plan_chunks(items, 32)
    # every byte once, in order, no chunk above the limit, never across files
    for fd, nseg, first, off, n in chunks:
        assert n <= 32 and sum(s[1] for s in segs[first:first + nseg]) == n
    flat = [(c[0], c[3]) for c in chunks]
    assert flat[0] == (3, 100) and flat[-1] == (4, 8)
    covered = {}
    for fd, nseg, first, off, n in chunks:
        pos = off
        for dst, ln, t in segs[first:first + nseg]:
            covered.setdefault(t, []).append((pos, dst, ln))
            pos += ln
    for fd, off, n, dst, t in items:
        parts = covered[t]
        assert sum(p[2] for p in parts) == n
        for (p, d, ln) in parts:  # file position and destination move together
            assert p - off == d - dst
    # chunks end on multiples of the chunk size (page-aligned reads), except at an item run's end
    ends = [(c[0], c[3] + c[4]) for c in chunks]
    assert all(e % 32 == 0 for fd, e in ends[:-2]) and ends[-2] == (3, 205) and ends[-1] == (4, 24)
    assert chunks[0][1] == 2 and chunks[0][3:] == (100, 28)  # items 0 and the head of 1 share [100, 128)


def test_plan_chunks_empty():
    assert plan_chunks([], 1 << 20) == ([], [])


torch = pytest.importorskip("torch", reason="the loader tests need torch (CI installs the CPU wheel)")
pytest.importorskip("safetensors", reason="safetensors is the reference")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    return d, ckpt_util.write(torch, d, seed=7)


@pytest.mark.parametrize("opts", [{}, {"workers": 1}, {"workers": 7, "chunk_bytes": 4096}],
                         ids=["default", "one-worker", "7-workers-4KiB-chunks"])
def test_load_matches_safetensors(ckpt, opts):
    d, expected = ckpt
    got = load_safetensors(d, device="cpu", **opts)
    assert list(got) == list(sorted(got, key=list(got).index))  # file and offset order
    assert got.keys() == expected.keys()
    bad = [k for k in expected if not ckpt_util.same_bytes(torch, expected[k], got[k])]
    assert not bad


def test_load_forms_agree(ckpt):
    d, expected = ckpt
    files = sorted(str(p) for p in d.glob("*.safetensors"))
    by_list = load_safetensors(files, device="cpu")
    by_index = load_safetensors(d / "model.safetensors.index.json", device="cpu")
    one = load_safetensors(files[0], device="cpu")
    assert by_list.keys() == by_index.keys() == expected.keys()
    assert set(one) < set(expected) and all(ckpt_util.same_bytes(torch, one[k], expected[k]) for k in one)


def test_iterator_yields_each_tensor_once_complete(ckpt):
    d, expected = ckpt
    seen = {}
    for name, t in iter_safetensors(d, device="cpu", workers=4, chunk_bytes=4096):
        assert name not in seen
        assert ckpt_util.same_bytes(torch, expected[name], t)  # complete when yielded
        seen[name] = t
    assert seen.keys() == expected.keys()


def test_stats_account_for_the_load(ckpt):
    d, expected = ckpt
    st = LoadStats()
    load_safetensors(d, device="cpu", stats=st)
    nbytes = sum(t.numel() * t.element_size() for t in expected.values())
    assert st.bytes == nbytes and st.files == 2 and st.tensors == len(expected)
    assert st.total_s >= st.load_s > 0 and st.read_s > 0
    assert st.join_teardown() is not None


def test_stopping_early_cancels_and_frees(ckpt):
    d, _ = ckpt
    before = threading.active_count()
    st = LoadStats()
    it = iter_safetensors(d, device="cpu", workers=3, chunk_bytes=4096, stats=st)
    next(it)
    it.close()  # the consumer walks away
    assert st.join_teardown() is not None
    assert threading.active_count() == before


def test_file_truncated_during_load_raises(tmp_path):
    ckpt_util.assert_truncation_mid_load_raises(torch, tmp_path / "c", 1000, 300_000, "cpu", workers=2, chunk_bytes=4096)


def test_bad_header_loads_nothing(tmp_path):
    good = tmp_path / "good"
    ckpt_util.write(torch, good, seed=1)
    bad = next(good.glob("*00002*.safetensors"))
    blob = bytearray(bad.read_bytes())
    blob[12] = 0xFF  # inside the JSON: not UTF-8
    bad.write_bytes(bytes(blob))
    with pytest.raises(HeaderError, match="not UTF-8"):
        load_safetensors(good, device="cpu")


def test_f6_dtype_has_no_torch_dtype(tmp_path):
    import json
    import struct

    text = json.dumps({"x": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}).encode()
    p = tmp_path / "f6.safetensors"
    p.write_bytes(struct.pack("<Q", len(text)) + text + b"\x01\x02\x03")
    with pytest.raises(HeaderError, match="no torch dtype"):
        load_safetensors(p, device="cpu")


def test_bad_arguments(ckpt):
    d, _ = ckpt
    with pytest.raises(ValueError, match="workers"):
        load_safetensors(d, device="cpu", workers=0)
    with pytest.raises(ValueError, match="device"):
        load_safetensors(d, device="meta")
    with pytest.raises(ValueError, match="no checkpoint"):
        load_safetensors([], device="cpu")


def test_policy_follows_the_cc_state():
    from ccbridge.load import policy

    off = policy.choose(0, ("off", {})).config
    assert off.contexts == 0 and off.staging == "pinned" and 2 <= off.workers <= 16
    b300 = {"emulate": 1, "h2d_pinned_gbps": 11.26, "h2d_pageable_gbps": 15.0, "h2d_system_gbps": 34.18}
    emu = policy.choose(0, ("emulated", b300)).config
    assert (emu.contexts, emu.workers, emu.staging) == (4, 8, "mapped")  # ceil(34.18 / 15) + 1 contexts
    pinned_faster = policy.choose(0, ("emulated", {**b300, "h2d_pageable_gbps": 5.0})).config
    assert pinned_faster.staging == "pinned" and pinned_faster.contexts == 5
    on = policy.choose(0, ("on", {})).config
    assert on.contexts == policy.CC_ON_CONTEXTS and on.staging == "mapped"
    assert policy.choose(-1).config.device == -1
    forced = policy.override(policy.choose(0, ("off", {})), contexts=3)
    assert forced.config.contexts == 3 and "overridden" in forced.why
