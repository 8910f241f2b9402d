"""`ccbridge bench kv` on a GPU: bf16 KV blocks restored from the host tier give the first token of a full
prefill (near ties aside), sync and async move the same bytes, and the store threshold cuts spills."""

import pytest

torch = pytest.importorskip("torch", reason="the kv bench needs torch")
pytest.importorskip("transformers", reason="the kv bench builds a Hugging Face transformers model")

from ccbridge.serve import decode, kvbench  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU")]


@pytest.fixture(scope="module")
def tiny():
    return decode.build("tiny", "cuda", seed=0)


def _rows(res):
    return {(r.params["threshold"], r.params["mode"], r.metric): r for r in res.rows}


def test_restored_bf16_blocks_give_the_full_prefill_token(tiny):
    res = kvbench.bench("tiny", prefixes=6, prefix_len=128, suffix_len=24, requests=24, device="cuda",
                        check_every=1, thresholds=[1], modes=["sync", "async"], _model=tiny)
    assert not res.errors, res.errors
    rows = _rows(res)
    for mode in ("sync", "async"):
        e = rows[(1, mode, "ttft_ms")].extra
        assert e["host_hits"] > 0 and e["restored_blocks"] > 0  # the host tier was used, not only the pool
    assert rows[(1, "sync", "restore_bytes")].median == rows[(1, "async", "restore_bytes")].median


def test_threshold_2_spills_less_on_cuda(tiny):
    res = kvbench.bench("tiny", prefixes=16, prefix_len=64, suffix_len=32, requests=24, zipf=1.2, warmup=0,
                        thresholds=[1, 2], modes=["async"], device="cuda", check_every=4, _model=tiny)
    assert not res.errors, res.errors
    rows = _rows(res)
    s1, s2 = rows[(1, "async", "spill_bytes")].median, rows[(2, "async", "spill_bytes")].median
    assert s1 > 0 and s2 * 4 < s1, (s1, s2)
