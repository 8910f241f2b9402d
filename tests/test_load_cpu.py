"""The loader on the CPU: how the pool cuts a load into chunks, and whole loads into host memory.

The host target runs the same pool, scheduler, completion tracking and error
path as a GPU load, minus the CUDA copies (those are in test_load_gpu.py).
"""

import threading

import pytest

import ckpt_util
from ccbridge.load import HeaderError, LoadStats, iter_safetensors, load_safetensors
from ccbridge.load.engine import File, Item, plan_walk


def _plan(spec, chunk, ntensors=None):
    """spec: (file, offset, nbytes) per item, in order; item i is tensor i, landing at 10**6 * i."""
    files = (File * 2)(File(3, 0, 0), File(4, 0, 0))
    items = (Item * len(spec))(*[Item(10**6 * i, off, n, f, i) for i, (f, off, n) in enumerate(spec)])
    return plan_walk(files, items, chunk, len(spec) if ntensors is None else ntensors)


def test_plan_cuts_items_on_the_chunk_grid():
    # file 0: three contiguous small items, a large one, then one after a gap of two chunks; file 1: one item
    spec = [(0, 100, 10), (0, 110, 20), (0, 130, 5), (0, 135, 70), (0, 300, 8), (1, 8, 16)]
    rows = _plan(spec, 32)
    # every byte of every item exactly once, in order
    for i, (f, off, n) in enumerate(spec):
        parts = [(o, ln) for g, it, o, ln in rows if it == i]
        assert parts[0][0] == off and sum(ln for _, ln in parts) == n
        assert all(a[0] + a[1] == b[0] for a, b in zip(parts, parts[1:]))
    # a chunk is one cell of one file's grid of 32-byte cells: page-aligned reads
    cells = {}
    for g, it, o, ln in rows:
        cells.setdefault(g, set()).add((spec[it][0], o // 32))
        assert o // 32 == (o + ln - 1) // 32
    assert all(len(c) == 1 for c in cells.values())
    assert len(cells) == len({c for cs in cells.values() for c in cs})  # no cell read twice
    # items 0, 1 and the head of 2 share [100, 128); the gap's cells hold nothing
    first = [r for r in rows if r[0] == min(cells)]
    assert [(it, o, ln) for _, it, o, ln in first] == [(0, 100, 10), (1, 110, 18)]
    assert sorted(c for cs in cells.values() for f, c in cs if f == 0) == [3, 4, 5, 6, 9]


def test_plan_refuses_malformed_items():
    for spec in ([(0, 100, 10), (0, 105, 10)],   # overlap
                 [(0, 100, 10), (0, 50, 10)],    # out of order
                 [(1, 0, 10), (0, 0, 10)],       # files out of order
                 [(0, 0, 0)],                    # empty
                 [(2, 0, 10)]):                  # no such file
        with pytest.raises(ValueError, match="item"):
            _plan(spec, 32)
    with pytest.raises(ValueError, match="item"):
        _plan([(0, 0, 10)], 32, ntensors=0)  # tensor index out of range
    assert _plan([], 1 << 20) == []


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
    # the threads themselves, not their count: an earlier test's pool may still be closing in the background
    # (load_safetensors without stats joins nothing) and end meanwhile, leaving fewer than before
    before = set(threading.enumerate())
    st = LoadStats()
    it = iter_safetensors(d, device="cpu", workers=3, chunk_bytes=4096, stats=st)
    next(it)
    it.close()  # the consumer walks away
    assert st.join_teardown() is not None
    assert set(threading.enumerate()) <= before


def test_file_truncated_during_load_raises(tmp_path):
    ckpt_util.assert_truncation_mid_load_raises(torch, tmp_path / "c", 1000, 300_000, "cpu", workers=2, chunk_bytes=4096)


def test_a_failed_or_cancelled_load_leaves_a_prewarmed_pool_usable(ckpt, tmp_path):
    """The next load through the same pool runs, and is byte-exact."""
    import os

    from ccbridge.load import LoadError, prewarm

    d, expected = ckpt
    with prewarm("cpu", workers=2, chunk_bytes=4096) as pool:
        pool.ready()
        bad = tmp_path / "bad"
        ckpt_util.write(torch, bad, seed=5, shards=1, big_elems=300_000)
        f = next(bad.glob("*.safetensors"))
        it = iter_safetensors(bad, device="cpu", pool=pool)
        next(it)  # headers accepted, the load under way
        os.truncate(f, f.stat().st_size - 1000)
        with pytest.raises(LoadError, match="file ended"):
            for _ in it:
                pass
        it = iter_safetensors(d, device="cpu", pool=pool)
        next(it)
        it.close()  # cancelled mid-load
        for _ in range(2):
            got = load_safetensors(d, device="cpu", pool=pool)
            assert got.keys() == expected.keys()
            assert not [k for k in expected if not ckpt_util.same_bytes(torch, expected[k], got[k])]


def test_bad_header_loads_nothing(tmp_path):
    good = tmp_path / "good"
    ckpt_util.write(torch, good, seed=1)
    bad = next(good.glob("*00002*.safetensors"))
    blob = bytearray(bad.read_bytes())
    blob[12] = 0xFF  # inside the JSON: not UTF-8
    bad.write_bytes(bytes(blob))
    with pytest.raises(HeaderError, match="not UTF-8"):
        load_safetensors(good, device="cpu")


def test_a_pipe_in_a_checkpoints_place_is_refused_not_waited_on(tmp_path):
    """A FIFO named like a shard blocked the loader's open() forever (no writer ever comes)."""
    import os

    os.mkfifo(tmp_path / "model.safetensors")
    with pytest.raises(HeaderError, match="not a regular file"):
        load_safetensors(tmp_path / "model.safetensors", device="cpu")


def test_f6_dtype_has_no_torch_dtype(tmp_path):
    import json
    import struct

    text = json.dumps({"x": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}).encode()
    p = tmp_path / "f6.safetensors"
    p.write_bytes(struct.pack("<Q", len(text)) + text + b"\x01\x02\x03")
    with pytest.raises(HeaderError, match="no torch dtype"):
        load_safetensors(p, device="cpu")


def test_zero_size_tensors_of_any_shape_torch_takes_load_and_others_are_a_header_error(tmp_path):
    """A tensor of no bytes is made as safetensors makes it (a reshape of nothing): [0, 2**40, 2**40] loads,
    though torch.empty of that shape overflows its strides; a shape no reshape takes (a dimension past 63 bits,
    strides past 63 bits) is a HeaderError naming the tensor, not a torch traceback."""
    import json
    import struct

    import torch

    def write(name, shape):
        text = json.dumps({"z": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]},
                           "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}).encode()
        (tmp_path / name).write_bytes(struct.pack("<Q", len(text)) + text + b"\x01\x02")
        return tmp_path / name

    got = load_safetensors(write("wide.safetensors", [0, 2**40, 2**40]), device="cpu")
    assert got["z"].shape == (0, 2**40, 2**40) and got["z"].dtype == torch.float32 and got["a"].tolist() == [1, 2]
    for shape in ([0, 2**63], [0, 2**62, 2]):
        with pytest.raises(HeaderError, match="tensor 'z'") as e:
            load_safetensors(write("bad.safetensors", shape), device="cpu")
        assert e.value.rule == "shape" and "\n" not in str(e.value)


def test_bad_arguments(ckpt):
    d, _ = ckpt
    with pytest.raises(ValueError, match="workers"):
        load_safetensors(d, device="cpu", workers=0)
    with pytest.raises(ValueError, match="device"):
        load_safetensors(d, device="meta")
    with pytest.raises(ValueError, match="no checkpoint"):
        load_safetensors([], device="cpu")


def test_a_device_index_or_torch_device_means_what_it_means_to_torch(monkeypatch):
    """device=0 (cuda:0 in torch) was refused as not cpu, cuda or cuda:N; here as on a host with two GPUs."""
    from ccbridge.errors import LoadError, UsageError
    from ccbridge.load.loader import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LoadError, match="torch sees no GPU for 'cuda:0'"):
        resolve_device(torch, 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device(torch, 1) == resolve_device(torch, torch.device("cuda", 1)) == (torch.device("cuda:1"), 1)
    assert resolve_device(torch, torch.device("cpu")) == (torch.device("cpu"), -1)
    for bad in (-1, True, 1.5, torch.device("meta")):
        with pytest.raises(UsageError, match="device must be cpu, cuda, cuda:N or an index N"):
            resolve_device(torch, bad)


def test_a_pool_for_another_device_is_a_usage_error_in_the_callers_words(ckpt):
    """It was a plain ValueError naming the pool's internal index: 'the pool serves device -1, not 0'."""
    from types import SimpleNamespace

    from ccbridge.errors import UsageError
    from ccbridge.load.engine import PoolConfig

    d, _ = ckpt
    gpu_pool = SimpleNamespace(config=PoolConfig(0, 2, 0, "pinned", 4096, 1))  # refused before the pool is used
    with pytest.raises(UsageError, match=r"the pool serves cuda:0, not cpu: prewarm\(\) one for this device"):
        load_safetensors(d, device="cpu", pool=gpu_pool)


def test_a_misspelt_keyword_is_a_type_error_naming_the_public_function(ckpt):
    """It named the private _run(), and iter_safetensors raised it only at the first next()."""
    from ccbridge.load import prewarm

    d, _ = ckpt
    calls = {"load_safetensors": lambda: load_safetensors(d, "cpu", wrokers=3),
             "iter_safetensors": lambda: iter_safetensors(d, "cpu", wrokers=3),  # at the call, not at next()
             "prewarm": lambda: prewarm("cpu", wrokers=3)}
    for name, call in calls.items():
        with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'wrokers'"):
            call()


def test_a_size_that_is_not_a_number_is_a_usage_error(ckpt):
    """chunk_bytes="16MiB" reached a comparison with an int: TypeError '<' not supported."""
    from ccbridge.errors import UsageError
    from ccbridge.load import prewarm
    from ccbridge.load.engine import PoolConfig

    d, _ = ckpt
    with pytest.raises(UsageError, match="chunk_bytes must be a whole number, got '16MiB'"):
        load_safetensors(d, device="cpu", chunk_bytes="16MiB")
    with pytest.raises(UsageError, match="workers must be a whole number, got 2.5"):
        prewarm("cpu", workers=2.5)
    with pytest.raises(ValueError, match="staging must be one of"):
        PoolConfig(-1, 2, 0, ["pinned"], 4096, 1).check()  # unhashable: a TypeError from the dict's lookup
    with pytest.raises(ValueError, match=r"contexts must be 0..workers \(2\), got 3"):
        PoolConfig(0, 2, 3, "pinned", 4096, 1).check()


@pytest.mark.parametrize("given", [dict(contexts=1), dict(staging="pinned")])
def test_gpu_only_choices_for_a_load_into_host_memory_are_refused(given):
    """prewarm("cpu", contexts=1) was accepted and recorded, and did nothing (a stranger's review, session 24)."""
    from ccbridge.errors import UsageError
    from ccbridge.load import prewarm

    with pytest.raises(UsageError, match="a load into host memory has neither"):
        prewarm("cpu", **given)
    prewarm("cpu", contexts=0, staging="pageable").close()  # what it is: accepted


def test_policy_follows_the_cc_state(monkeypatch):
    from ccbridge.load import policy

    off = policy.choose(0, ("off", {})).config
    assert off.contexts == 0 and off.staging == "pinned" and 2 <= off.workers <= 16
    for cores, readers in ((1, 2), (4, 2), (16, 14), (64, 16)):  # a core each for the copy issuer and the caller
        monkeypatch.setattr(policy, "_cpus", lambda: cores)
        assert policy.choose(0, ("off", {})).config.workers == readers
    b300 = {"emulate": 1, "h2d_pinned_gbps": 11.26, "h2d_pageable_gbps": 15.0, "h2d_system_gbps": 34.18,
            "h2d_pinned_ratio": 0.203, "h2d_pageable_ratio": 0.78}
    emu = policy.choose(0, ("emulated", b300)).config  # no host facts: the profile's rates as they stand
    assert (emu.contexts, emu.workers, emu.staging, emu.chunk_bytes) == (6, 12, "mapped", 64 << 20)  # 2 x ceil(34.18 / 15)
    pinned_faster = policy.choose(0, ("emulated", {**b300, "h2d_pageable_gbps": 5.0})).config
    assert (pinned_faster.staging, pinned_faster.contexts, pinned_faster.chunk_bytes) == ("pinned", 8, 4 << 20)
    # a host whose one pageable call moves 5.8 GB/s: the emulator paces pageable crossings at 0.78 x that
    slow_host = policy.choose(0, ("emulated", {**b300, "native_h2d_pageable_gbps": 5.8, "native_h2d_pinned_gbps": 55.0}))
    assert (slow_host.config.staging, slow_host.config.contexts) == ("pinned", 8) and "pageable 4.52" in slow_host.why
    assert policy.emulated_rates({**b300, "native_h2d_pageable_gbps": 30.0}) == (11.26, 15.0)  # a fast host: no cap
    # a profile that leaves pageable unpaced (0): the emulator's floor alone holds it, 0.78 x 5.0
    assert policy.emulated_rates({**b300, "h2d_pageable_gbps": 0, "native_h2d_pageable_gbps": 5.0}) == (11.26, pytest.approx(3.9))
    pinned, pageable = policy.emulated_rates({**b300, "native_h2d_pinned_gbps": 40.0})  # 0.203 x 40 < 11.26
    assert (pinned, pageable) == (pytest.approx(8.12), 15.0)
    # a pool made for one load: its contexts' making (0.65 s each under b300) counts against that load
    b300_host = {**b300, "ctx_create_s": 0.519, "native_h2d_pageable_gbps": 5.8, "native_h2d_pinned_gbps": 55.0}
    small = policy.choose(0, ("emulated", b300_host), nbytes=8 * 10**9)
    assert (small.config.contexts, small.config.workers) == (0, 2) and "the primary context" in small.why
    big = policy.choose(0, ("emulated", b300_host), nbytes=60 * 10**9)
    assert 2 <= big.config.contexts < 8 and big.config.workers == 2 * big.config.contexts
    assert policy.choose(0, ("emulated", b300_host)).config.contexts == 8  # prewarmed: making is off the load
    free = policy.choose(0, ("emulated", {**b300_host, "ctx_create_s": 0}), nbytes=10**12)
    assert free.config.contexts >= 6  # contexts that cost (almost) nothing to make: the throughput plan's
    assert policy.cold_contexts(8 * 10**9, 11.26, 34.18, 0.65, 8) == 0  # 0.71 s on the primary; 2: 2.01 s
    # the primary's channel at its whole rate, as measured (10.85-10.93 GB/s): 1.78 s, where 2 contexts take
    # 1.3 + 1.78 s and 3 take 1.95 + 1.18 s
    assert policy.cold_contexts(20 * 10**9, 11.26, 34.18, 0.65, 8) == 0
    assert policy.cold_contexts(60 * 10**9, 11.26, 34.18, 0.65, 8) == 4  # 4 x 0.65 + 60 / 22.5 = 5.27 s; 5.33
    on = policy.choose(0, ("on", {})).config
    assert (on.contexts, on.staging, on.chunk_bytes) == (policy.CC_ON_CONTEXTS, "mapped", 64 << 20)
    assert policy.choose(-1).config.device == -1
    forced = policy.override(policy.choose(0, ("off", {})), contexts=3)
    assert forced.config.contexts == 3 and "overridden" in forced.why


def test_a_cc_plans_chunk_follows_an_overridden_staging_and_no_rate_breaks_the_plan():
    """Under CC the chunk goes with the staging (pinned 4 MiB, the copy from the mapping 64 MiB): a caller who
    names only the staging gets that staging's chunk, not the other's; a chunk given is kept. Rates so small that
    the bridge over one context's is past any float (`--set h2d_pinned_gbps=1e-320`) plan the most contexts."""
    from ccbridge.load import policy

    b300 = {"emulate": 1, "h2d_pinned_gbps": 11.26, "h2d_pageable_gbps": 15.0, "h2d_system_gbps": 34.18}
    mapped = policy.choose(0, ("emulated", b300))
    assert mapped.config.staging == "mapped"
    as_pinned = policy.override(mapped, staging="pinned")
    assert (as_pinned.config.staging, as_pinned.config.chunk_bytes) == ("pinned", 4 << 20)
    assert "chunk_bytes=4194304" in as_pinned.why
    assert policy.override(as_pinned, staging="mapped").config.chunk_bytes == 64 << 20
    assert policy.override(mapped, staging="pinned", chunk_bytes=16 << 20).config.chunk_bytes == 16 << 20
    assert policy.override(policy.choose(0, ("on", {})), staging="pinned").config.chunk_bytes == 4 << 20
    off = policy.choose(0, ("off", {}))  # CC off: no contexts of the pool's own, the chunk is the caller's to set
    assert policy.override(off, staging="mapped").config.chunk_bytes == off.config.chunk_bytes
    tiny = policy.choose(0, ("emulated", {**b300, "h2d_pinned_gbps": 1e-320, "h2d_pageable_gbps": 1e-320}))
    assert tiny.config.contexts == 16


def test_a_pool_made_for_one_load_of_nothing_or_at_no_rate():
    """A checkpoint of only zero-size tensors is a load of 0 bytes: no context is worth making for it (the
    throughput plan's 8 under b300 cost 5.5 s for nothing). The least denormal rate, which the profile ranges
    accept (`--set h2d_pinned_gbps=5e-324 --set h2d_pageable_gbps=5e-324`), halves to 0: a plan, not a
    ZeroDivisionError in the loaded program."""
    from ccbridge.load import policy

    b300 = {"emulate": 1, "h2d_pinned_gbps": 11.26, "h2d_pageable_gbps": 15.0, "h2d_system_gbps": 34.18,
            "h2d_pinned_ratio": 0.203, "h2d_pageable_ratio": 0.78, "ctx_create_s": 0.519,
            "native_h2d_pageable_gbps": 5.8, "native_h2d_pinned_gbps": 55.0}
    empty = policy.choose(0, ("emulated", b300), nbytes=0)
    assert (empty.config.contexts, empty.config.workers) == (0, 2) and "the primary context" in empty.why
    least = {**b300, "h2d_pinned_gbps": 5e-324, "h2d_pageable_gbps": 5e-324}
    for nbytes in (0, 10**9):  # 0 bytes take no time at any rate; 1 GB none that any count of contexts reaches
        plan = policy.choose(0, ("emulated", least), nbytes=nbytes)
        plan.config.check()
        assert plan.config.contexts == 0


def test_overrides_of_a_pool_made_for_one_load(monkeypatch):
    """The primary-context plan of a cold load under CC is still a CC plan: a staging given alone takes that
    staging's chunk (b3f9b5d's rule, which keyed on contexts > 0), and contexts given take the workers the
    throughput plan gives them, not the cold plan's 2 (one worker a context, which under CC cannot read while
    its copy holds it)."""
    from ccbridge.load import policy

    b300 = {"emulate": 1, "h2d_pinned_gbps": 11.26, "h2d_pageable_gbps": 15.0, "h2d_system_gbps": 34.18,
            "h2d_pinned_ratio": 0.203, "h2d_pageable_ratio": 0.78, "ctx_create_s": 0.519,
            "native_h2d_pageable_gbps": 5.8, "native_h2d_pinned_gbps": 55.0}
    monkeypatch.setattr(policy, "cc_situation", lambda: ("emulated", b300))
    cold = policy.for_device(0, nbytes=4 * 10**9)
    assert (cold.config.contexts, cold.config.staging, cold.config.chunk_bytes) == (0, "pinned", 4 << 20)
    as_pageable = policy.for_device(0, nbytes=4 * 10**9, staging="pageable")
    assert (as_pageable.config.contexts, as_pageable.config.chunk_bytes) == (0, 64 << 20)
    warm = policy.for_device(0, contexts=8)
    for n in (8, 2, 0):
        given = policy.for_device(0, nbytes=4 * 10**9, contexts=n)
        assert given.config == policy.for_device(0, contexts=n).config and "the primary" not in given.why
    assert policy.for_device(0, nbytes=4 * 10**9, contexts=8).config.workers == warm.config.workers == 16
    one = policy.for_device(0, nbytes=4 * 10**9, workers=1)  # workers alone: the cold plan's contexts stand
    assert (one.config.contexts, one.config.workers) == (0, 1)
    off = policy.override(policy.choose(0, ("off", {})), staging="pageable")  # CC off: the chunk stays the caller's
    assert off.config.chunk_bytes == 4 << 20


def test_bench_report_names_the_pool_each_ccbridge_row_ran():
    """Under emulated CC the cold loads plan their own pool (the primary context) and the prewarmed one the
    throughput plan: the report names both, so that neither row is read as the other's pool."""
    from ccbridge.load import bench

    def report(cold_pool):
        row = {"gbps": 3.8, "seconds": [1.1], "error": None, "stages": {}}
        return {"files": 2, "bytes": 4_190_000_000, "gpu": "H200", "device": "cuda:0", "repeat": 1,
                "pool": {"workers": 16, "contexts": 8, "staging": "pinned", "chunk_bytes": 4 << 20, "buffers": 2,
                         "prewarm_s": 5.5, "teardown_s": 3.9},
                "why": "emulated CC: 8 contexts", "cold_pool": cold_pool, "verified": "bitwise equal",
                "loaders": {"ccbridge prewarmed": row, "ccbridge cold": row}}

    cold = {"workers": 2, "contexts": 0, "staging": "pinned", "chunk_bytes": 4 << 20, "buffers": 2,
            "why": "emulated CC: 8 contexts; ...: the primary context"}
    text = bench.render(report(cold))
    assert "prewarmed pool: 16 workers, 8 contexts, pinned staging, 4 MiB chunks" in text
    assert "cold pool (made inside each cold load): 2 workers, 0 contexts" in text and "the primary context" in text
    same = bench.render(report({**cold, "workers": 16, "contexts": 8}))  # one plan for both: one line, as before
    assert "\npool: 16 workers" in same and "cold pool" not in same
    assert "64 KiB chunks" in bench.render({**report(None), "pool": {**report(None)["pool"], "chunk_bytes": 65536}})


def test_the_bench_safetensors_rows_own_their_bytes_on_cpu(tmp_path):
    """On cpu safetensors hands back views of the file's mapping: `.to("cpu")` copied nothing, and its row read
    76 GB/s against ccbridge's 2 (which copies) on two cores. Both rows now copy: a write to the file after the
    load does not show in their tensors."""
    from safetensors.torch import save_file

    from ccbridge.load import bench

    f = tmp_path / "one.safetensors"
    save_file({"a": torch.zeros(1 << 16, dtype=torch.uint8)}, str(f))
    for fn in (bench._safetensors_load_file, bench._safetensors_safe_open):
        got = fn([str(f)], "cpu")
        with open(f, "r+b") as fh:
            fh.seek(-1, 2)
            fh.write(b"\x07")
        try:
            assert int(got["a"][-1]) == 0, f"{fn.__name__}: a view of the file"
        finally:
            with open(f, "r+b") as fh:
                fh.seek(-1, 2)
                fh.write(b"\x00")


def test_the_bench_table_marks_the_rows_that_copy_on_cpu():
    from ccbridge.load import bench

    row = {"gbps": 2.0, "seconds": [0.5], "error": None, "stages": {}}
    loaders = {"ccbridge prewarmed": row, "ccbridge cold": row, "safetensors load_file": row,
               "safetensors safe_open + .to": row}
    report = {"files": 1, "bytes": 10**9, "gpu": "cpu", "device": "cpu", "repeat": 1,
              "pool": {"workers": 2, "contexts": 0, "staging": "pageable", "chunk_bytes": 64 << 20, "buffers": 1,
                       "prewarm_s": 0.0, "teardown_s": 0.0},
              "why": "host memory: 2 reader threads", "cold_pool": None, "verified": "bitwise equal", "loaders": loaders}
    host = bench.render(report).splitlines()
    assert [ln[:30].rstrip() for ln in host if ln.endswith("0.500")] == [
        "ccbridge prewarmed", "ccbridge cold", "safetensors load_file*", "safetensors safe_open + .to*"]
    assert any(ln.startswith("* then copied (.clone(), .to(copy=True))") and len(ln) <= 120 for ln in host)
    gpu = bench.render({**report, "gpu": "H100", "device": "cuda:0"})
    assert "*" not in gpu and "then copied" not in gpu


def test_the_bench_without_safetensors_says_the_check_was_not_made(tmp_path, monkeypatch, capsys):
    """Without safetensors the check printed `None` and its rows a raw ModuleNotFoundError, where
    fastsafetensors' row said "not installed here": now all three say so, and the check says why it is absent."""
    import sys

    from ccbridge.cli import main
    from ccbridge.load import bench, benchresult, synth
    from ccbridge.results import load as load_result

    synth.make_checkpoint(tmp_path / "c", 2 << 20, 1 << 20, jobs=1)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if not installed: its import fails
    assert main(["load", str(tmp_path / "c"), "--bench", "--device", "cpu", "--repeat", "1",
                 "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "check: ccbridge vs safetensors: not checked: safetensors is not installed" in out
    rows = [ln for ln in out.splitlines() if ln.startswith(("safetensors", "fastsafetensors"))]
    assert len(rows) == 3 and all("not installed here" in ln for ln in rows), rows
    res = load_result(tmp_path / "r.json")  # skipped, not failed: the table reads back the same
    assert {e["test"] for e in res.skipped} >= {"load:safetensors_load_file", "load:safetensors_safe_open"}
    assert "not checked: safetensors is not installed" in bench.render(benchresult.report_of(res))


def test_make_checkpoint_refuses_a_folder_that_holds_a_checkpoint(tmp_path):
    """New shards beside an old layout's would load as one checkpoint of both (a duplicate tensor)."""
    from ccbridge.errors import UsageError
    from ccbridge.load import synth

    synth.make_checkpoint(tmp_path / "c", 4 << 20, 2 << 20, jobs=1)
    before = sorted(p.name for p in (tmp_path / "c").iterdir())
    with pytest.raises(UsageError, match="already holds model"):
        synth.make_checkpoint(tmp_path / "c", 6 << 20, 2 << 20, jobs=1)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == before  # nothing touched
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("a folder of other files is fine")
    assert synth.make_checkpoint(tmp_path / "d", 4 << 20, 2 << 20, jobs=1)


def test_make_checkpoint_index_total_size_counts_tensor_bytes_only(tmp_path):
    """Hugging Face's metadata.total_size is the tensors' bytes; it was the shards' sizes, headers included."""
    import json

    from ccbridge.load import read_header, synth

    files = synth.make_checkpoint(tmp_path / "c", 3 << 20, 1 << 20, jobs=1)
    index = json.loads((tmp_path / "c" / "model.safetensors.index.json").read_text())
    assert len(files) > 1
    assert index["metadata"]["total_size"] == sum(t.nbytes for f in files for t in read_header(f).tensors)


def test_a_load_copies_only_into_destinations_published(tmp_path):
    """The loader starts the pool before its tensors exist; workers wait per chunk for theirs."""
    pool, f, data = ckpt_util.publish_rig(tmp_path, -1)
    with pool:
        for _ in range(2):  # the pool serves the next load as well
            dests = [torch.zeros(64 << 10, dtype=torch.uint8) for _ in range(6)]
            ckpt_util.run_published_in_steps(torch, pool, f, data, dests, 64 << 10)


def test_cancel_wakes_workers_that_wait_for_destinations(tmp_path):
    import ctypes
    import os
    import time

    pool, f, data = ckpt_util.publish_rig(tmp_path, -1)
    with pool:
        pool.ready()
        dests = [torch.zeros(64 << 10, dtype=torch.uint8) for _ in range(6)]
        fd = os.open(f, os.O_RDONLY)
        try:
            items = (Item * 6)(*[Item(dests[i].data_ptr(), i * (64 << 10), 64 << 10, 0, i) for i in range(6)])
            remaining, doneq = (ctypes.c_int32 * 6)(), (ctypes.c_int32 * 6)()
            pool.submit((File * 1)(File(fd, 0, 0)), items, remaining, doneq, ready=1)
            time.sleep(0.1)
            t = time.perf_counter()
            pool.cancel()  # returns: no worker is left waiting
            assert time.perf_counter() - t < 2.0
            assert all(int(d.count_nonzero()) == 0 for d in dests[1:])
        finally:
            os.close(fd)
        dests = [torch.zeros(64 << 10, dtype=torch.uint8) for _ in range(6)]
        ckpt_util.run_published_in_steps(torch, pool, f, data, dests, 64 << 10)


def test_a_publish_for_a_load_that_ended_never_reaches_the_next(tmp_path):
    """Publication names its load: one meant for a cancelled (or failed) load does not publish the next one's
    items, whose destinations are not set yet (here 0: a copy there would fault)."""
    import ctypes
    import os

    pool, f, data = ckpt_util.publish_rig(tmp_path, -1)
    with pool:
        pool.ready()
        fd = os.open(f, os.O_RDONLY)
        try:
            files = (File * 1)(File(fd, 0, 0))
            dests = [torch.zeros(64 << 10, dtype=torch.uint8) for _ in range(6)]
            first = (Item * 6)(*[Item(dests[i].data_ptr(), i * (64 << 10), 64 << 10, 0, i) for i in range(6)])
            arrays = [(ctypes.c_int32 * 6)() for _ in range(3)]
            old = pool.submit(files, first, arrays[0], arrays[1], ready=0)
            pool.cancel()
            unset = (Item * 6)(*[Item(0, i * (64 << 10), 64 << 10, 0, i) for i in range(6)])
            new = pool.submit(files, unset, arrays[0], arrays[1], ready=0)
            assert new != old
            pool.publish(old, 6)  # the cancelled load's: ignored
            assert pool.next(arrays[2], 0.3) == 0 and pool.error() == ("", -1)
            for i in range(6):
                unset[i].dst = dests[i].data_ptr()
            pool.publish(new, 6)
            done = 0
            while (k := pool.next(arrays[2], 5.0)) != -2:
                assert k > 0, pool.error()
                done += k
            assert done == 6 and b"".join(d.numpy().tobytes() for d in dests) == data
        finally:
            os.close(fd)


def test_a_second_load_on_a_pool_in_use_is_refused_and_leaves_the_first_whole(ckpt):
    """Two loads on one pool: the second is refused before it touches the pool; its refusal does not cancel
    the first (it once did: the refused load's cleanup cancelled whatever ran on the pool)."""
    from ccbridge.load import LoadError, prewarm

    d, expected = ckpt
    with prewarm("cpu", workers=2, chunk_bytes=4096) as pool:
        pool.ready()
        first = iter_safetensors(d, device="cpu", pool=pool)
        got = dict([next(first)])  # under way, paused between tensors
        with pytest.raises(LoadError, match="serving another load"):
            load_safetensors(d, device="cpu", pool=pool)
        got.update(first)
        assert got.keys() == expected.keys()
        assert not [k for k in expected if not ckpt_util.same_bytes(torch, expected[k], got[k])]
        assert load_safetensors(d, device="cpu", pool=pool).keys() == expected.keys()  # free again
