"""The loader on a GPU (marked): bitwise equal to safetensors in every pool shape, natively and emulated."""

import json
import subprocess
import sys

import pytest

import ckpt_util

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("need_gpu")]
torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from ccbridge.load import LoadError, LoadStats, iter_safetensors, load_safetensors  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu-ckpt")
    return d, ckpt_util.write(torch, d, seed=11, big_elems=3_000_000)


def reference(d):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(str(f), device="cuda:0"))
    return out


SHAPES = [{}, {"contexts": 0, "staging": "pinned"}, {"contexts": 0, "staging": "pageable"},
          {"contexts": 2, "workers": 4, "staging": "pageable"}, {"contexts": 3, "workers": 3, "staging": "pinned"},
          {"contexts": 2, "workers": 5, "chunk_bytes": 4096, "buffers": 3},
          {"contexts": 2, "workers": 4, "staging": "mapped", "chunk_bytes": 1 << 20},
          {"contexts": 0, "workers": 3, "staging": "mapped", "chunk_bytes": 65536}]


@pytest.mark.parametrize("opts", SHAPES, ids=["policy", "primary-pinned", "primary-pageable", "2ctx-pageable",
                                              "3ctx-pinned", "2ctx-4KiB-chunks", "2ctx-mapped",
                                              "primary-mapped"])
def test_matches_safetensors_on_gpu(ckpt, opts):
    d, expected = ckpt
    ref = reference(d)
    got = load_safetensors(d, device="cuda:0", **opts)
    assert got.keys() == ref.keys() == expected.keys()
    for k in expected:
        assert got[k].device.type == "cuda"
        assert ckpt_util.same_bytes(torch, ref[k], got[k]), k
        assert ckpt_util.same_bytes(torch, expected[k], got[k].cpu()), k


def test_iterator_tensors_are_complete_when_yielded(ckpt):
    d, expected = ckpt
    n = 0
    for name, t in iter_safetensors(d, device="cuda:0", contexts=2, workers=4, chunk_bytes=65536):
        assert ckpt_util.same_bytes(torch, expected[name], t.cpu()), name
        n += 1
    assert n == len(expected)


def test_prewarmed_pool_serves_several_loads(ckpt):
    from ccbridge.load import prewarm

    d, expected = ckpt
    pool = prewarm("cuda:0", contexts=2, workers=4)
    try:
        for _ in range(2):
            st = LoadStats()
            got = load_safetensors(d, device="cuda:0", pool=pool, stats=st)
            assert all(ckpt_util.same_bytes(torch, expected[k], got[k].cpu()) for k in expected)
            assert st.owned_pool is None  # the caller's pool stays up
    finally:
        pool.close()


@pytest.mark.parametrize("shape", [{"staging": "pinned"}, {"staging": "mapped"}, {"staging": "pageable"},
                                   {"contexts": 2, "staging": "pinned"}, {"contexts": 2, "staging": "mapped"}],
                         ids=["primary-pinned-submitter", "primary-mapped", "primary-pageable", "2ctx-pinned",
                              "2ctx-mapped"])
def test_copies_wait_for_their_destinations_to_be_published(tmp_path, shape):
    """Each way a chunk reaches its tensor (the submitter's queue, a worker's own copy, a crossing into a
    context's staging and a peer copy) copies nothing before its destination is published."""
    import os

    from ccbridge.load import engine

    pool, f, data = ckpt_util.publish_rig(tmp_path, 0, **shape)
    with pool:
        for _ in range(2):
            dests = [torch.zeros(64 << 10, dtype=torch.uint8, device="cuda:0") for _ in range(6)]
            mapped = 0
            if shape["staging"] == "mapped":  # the mapping outlives its descriptor
                fd = os.open(f, os.O_RDONLY)
                mapped = engine.map_file(fd, len(data))
                os.close(fd)
            try:
                ckpt_util.run_published_in_steps(torch, pool, f, data, dests, 64 << 10, mapped=mapped)
            finally:
                if mapped:
                    engine.unmap_file(mapped, len(data))


def test_mapped_staging_sees_a_cut_inside_the_files_last_page(tmp_path):
    """A file cut after its header was accepted, its new end inside its last page: that page still maps (no
    SIGBUS, no populate failure), so the loader checks the file's size too; it once loaded zeros there."""
    import os

    ckpt_util.write(torch, tmp_path, seed=5, shards=1, big_elems=2_000_000)
    f = next(tmp_path.glob("*.safetensors"))
    size = f.stat().st_size
    cut = max(1, (size % 4096 or 4096) // 2)
    it = iter_safetensors(tmp_path, device="cuda:0", staging="mapped", contexts=0, workers=2, chunk_bytes=65536)
    next(it)  # the empty tensors come first, before any read: the headers were valid
    os.truncate(f, size - cut)
    with pytest.raises(LoadError, match="file ended"):
        for _ in it:
            pass


def test_truncated_during_load_raises_and_frees(tmp_path):
    ckpt_util.assert_truncation_mid_load_raises(torch, tmp_path / "c", 4_000_000, 2_000_000, "cuda:0",
                                                contexts=2, workers=2, chunk_bytes=65536)


def test_bad_device_index(ckpt):
    d, _ = ckpt
    with pytest.raises(LoadError, match="no CUDA device"):
        load_safetensors(d, device=f"cuda:{torch.cuda.device_count()}")


EMULATED = """
import json, sys, torch
from safetensors.torch import load_file
from ccbridge.load import LoadStats, load_safetensors, prewarm
sys.path.insert(0, {tests!r})
import ckpt_util
from pathlib import Path
d = Path({d!r})
ref = {{}}
for f in sorted(d.glob("*.safetensors")):
    ref.update(load_file(str(f), device="cuda:0"))
def equal(got):
    return got.keys() == ref.keys() and all(ckpt_util.same_bytes(torch, ref[k], got[k]) for k in ref)
st = LoadStats()
cold = equal(load_safetensors(d, device="cuda:0", stats=st))  # a pool made for this load alone
with prewarm("cuda:0") as pool:  # the throughput plan, its contexts made before the load
    warm = LoadStats()
    prewarmed = equal(load_safetensors(d, device="cuda:0", pool=pool, stats=warm))
print(json.dumps({{"equal": cold and prewarmed, "why": st.why, "pool": st.pool, "warm_pool": warm.pool}}))
"""


def test_under_emulated_b300_bridge(ckpt):
    d, _ = ckpt
    tests = str(__import__("pathlib").Path(__file__).parent)
    out = subprocess.run([sys.executable, "-m", "ccbridge", "run", "--profile", "b300", "--", sys.executable, "-c",
                          EMULATED.format(tests=tests, d=str(d))], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["equal"]
    assert res["why"].startswith("emulated CC")
    # a small checkpoint loaded cold: making contexts (0.65 s each under b300) costs more than they save
    assert res["pool"]["contexts"] == 0 and "the primary context" in res["why"]
    assert res["warm_pool"]["contexts"] >= 2  # prewarmed: several contexts, the bytes still exact
