"""ccbridge.serve.kvcache on the CPU: block identity, restores equal to spills, the store
threshold, batched crossings, a full cache, and a threaded eviction/restore stress test."""

import os
import random
import subprocess
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch", reason="ccbridge.serve needs torch")

from ccbridge.errors import CCBridgeError, KVCacheError, UsageError  # noqa: E402
from ccbridge.serve import KVCache, block_hashes  # noqa: E402
from ccbridge.serve.kvcache import ON_HOST  # noqa: E402

BT = 4                       # tokens per block
SHAPE = (2, 2, 2, BT, 8)     # layers, k/v, heads, block tokens, head dim
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn]


def content(h: bytes, dtype, device="cpu") -> torch.Tensor:
    """The KV a block with hash h holds: random, derived from h (the shadow copy)."""
    g = torch.Generator().manual_seed(int.from_bytes(h[:8], "little") >> 1)
    return (torch.randn(SHAPE, generator=g) * 8).to(dtype).to(device)


def same_bits(a, b) -> bool:
    return a.dtype == b.dtype and torch.equal(a.cpu().contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8))


def prompt(seed: int, blocks: int) -> list[int]:
    return random.Random(seed).choices(range(50000), k=blocks * BT)


def request(cache: KVCache, tokens, keep=False):
    """One request: look up, restore the hits, compute (write) the misses, check every block's bytes."""
    lk = cache.lookup(tokens)
    table = cache.restore(lk.hits)
    new = cache.allocate(lk)
    for h, i in zip(lk.misses, new):
        cache.device_pool[i].copy_(content(h, cache.dtype, cache.device))
    cache.commit(lk)
    table += new
    for h, i in zip(lk.hashes, table):
        assert same_bits(cache.device_pool[i], content(h, cache.dtype)), "a block's bytes are not what was written"
    if not keep:
        cache.release(lk)
    return lk


def make(**kw) -> KVCache:
    args = dict(block_shape=SHAPE, dtype=torch.bfloat16, device_blocks=8, host_blocks=32, block_tokens=BT, device="cpu")
    args.update(kw)
    return KVCache(**args)


def test_block_hashes_chain_over_prefixes_and_agree_across_processes():
    a, b = prompt(1, 4), prompt(2, 4)
    ha, hb = block_hashes(a, BT), block_hashes(a[:2 * BT] + b[2 * BT:], BT)
    assert len(ha) == 4 and len(set(ha)) == 4 and all(len(h) == 16 for h in ha)
    assert ha[:2] == hb[:2] and ha[2] != hb[2] and ha[3] != hb[3]  # same prefix, then apart for good
    assert block_hashes(a + [7, 8], BT) == ha                      # a partial last block has no hash
    assert block_hashes(torch.tensor(a), BT) == ha
    assert block_hashes(a[BT:], BT)[0] != ha[1]                    # a block's hash depends on its prefix
    code = f"from ccbridge.serve.kvcache import block_hashes; print(block_hashes({a!r}, {BT})[-1].hex())"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True)
    assert out.stdout.strip() == ha[-1].hex()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_restored_kv_is_bitwise_what_was_spilled(dtype):
    with make(dtype=dtype, device_blocks=4, host_blocks=16) as cache:
        a = request(cache, prompt(10, 4))
        request(cache, prompt(11, 4))  # evicts all of a: one batched spill
        cache.flush()
        s = cache.stats()
        assert s["spilled_blocks"] == 4 and s["spill_crossings"] == 1 and s["spill_bytes"] == 4 * cache.block_bytes
        lk = cache.lookup(prompt(10, 4))
        assert lk.host == a.hashes and lk.device == [] and lk.misses == []
        ids = cache.restore(lk.hits)
        for h, i in zip(lk.hashes, ids):
            assert same_bits(cache.device_pool[i], content(h, dtype))
        s = cache.stats()
        assert s["restore_crossings"] == 1 and s["restore_bytes"] == 4 * cache.block_bytes
        cache.release(lk)


def test_prefix_reuse_across_requests_hits_the_shared_blocks():
    with make(device_blocks=16) as cache:
        base = prompt(20, 3)
        first = request(cache, base + prompt(21, 2))
        second = cache.lookup(base + prompt(22, 2))
        assert second.device == first.hashes[:3] and second.host == [] and len(second.misses) == 2
        cache.release(second)
        again = request(cache, base + prompt(21, 2))
        assert again.device == first.hashes and again.misses == []
        s = cache.stats()
        assert s["device_hits"] == 3 + 5 and s["misses"] == 5 + 2
        assert s["device_hit_rate"] == pytest.approx(8 / 15)


def test_threshold_two_drops_blocks_seen_once_and_spills_blocks_seen_twice():
    with make(device_blocks=2, threshold=2) as cache:
        once, twice = prompt(30, 1), prompt(31, 1)
        request(cache, once)
        request(cache, twice)
        request(cache, twice)  # looked up a second time: a device hit
        request(cache, prompt(32, 1))
        request(cache, prompt(33, 1))  # both evicted
        cache.flush()
        s = cache.stats()
        assert s["dropped_threshold"] == 1 and s["spilled_blocks"] == 1
        lk_once, lk_twice = cache.lookup(once), cache.lookup(twice)
        assert lk_once.misses == lk_once.hashes and lk_twice.host == lk_twice.hashes
        for lk in (lk_once, lk_twice):
            cache.release(lk)
        # a block dropped after one use is spilled once it is seen again: the count outlives the block
        request(cache, once)
        request(cache, prompt(34, 1))
        request(cache, prompt(35, 1))
        cache.flush()
        assert cache.stats()["spilled_blocks"] == 2


def churn(threshold: int) -> dict:
    """Most prefixes used once, three reused often; the device holds two prefixes' blocks."""
    rng = random.Random(40)
    with make(device_blocks=8, host_blocks=64, threshold=threshold) as cache:
        for n in range(300):
            seed = rng.choice([41, 42, 43]) if rng.random() < 0.1 else 1000 + n
            request(cache, prompt(seed, 4))
        cache.flush()
        return cache.stats()


def test_threshold_two_spills_far_less_than_one_on_a_churn_stream():
    one, two = churn(1), churn(2)
    assert one["spill_bytes"] >= 200 * 4 * make().block_bytes  # threshold 1 spills nearly every evicted block
    assert two["spill_bytes"] > 0 and one["spill_bytes"] >= 10 * two["spill_bytes"]
    assert two["host_hits"] > 0 and two["dropped_threshold"] > 200
    assert 0 < two["restore_crossings"] < two["restored_blocks"]  # a request's host hits cross together
    assert two["restore_bytes"] == two["restored_blocks"] * make().block_bytes


def test_restore_of_k_blocks_is_one_crossing_up_to_the_staging_size():
    for staging, crossings in ((8, 1), (4, 2), (1, 6)):
        with make(device_blocks=6, host_blocks=12, staging_blocks=staging) as cache:
            request(cache, prompt(50, 6))
            request(cache, prompt(51, 6))  # one eviction of six blocks
            cache.flush()
            s0 = cache.stats()
            assert s0["spill_crossings"] == crossings and s0["spilled_blocks"] == 6
            lk = request(cache, prompt(50, 6))
            s = cache.stats()
            assert len(lk.host) == 6 and s["restore_crossings"] == crossings and s["restored_blocks"] == 6


def test_a_cache_whose_blocks_are_all_pinned_raises_a_clear_error():
    with make(device_blocks=3) as cache:
        held = request(cache, prompt(60, 2), keep=True)
        lk = cache.lookup(prompt(61, 2))
        with pytest.raises(KVCacheError, match="KV cache full: 2 device blocks needed, 1 free and 0 evictable") as e:
            cache.allocate(lk)
        assert isinstance(e.value, CCBridgeError) and isinstance(e.value, RuntimeError)
        assert cache.stats()["device_free"] == 1  # a failed allocation takes nothing
        cache.release(held)
        assert len(cache.allocate(lk)) == 2  # the released blocks are evictable now
        cache.release(lk)


def test_usage_errors():
    with pytest.raises(UsageError, match="device_blocks"):
        make(device_blocks=0)
    with pytest.raises(UsageError, match="threshold"):
        make(threshold=0)
    with pytest.raises(UsageError, match="host_memory"):
        make(host_memory="huge")
    with pytest.raises(UsageError, match="block_shape"):
        make(block_shape=())
    with make() as cache:
        lk = request(cache, prompt(70, 1))
        with pytest.raises(UsageError, match="pinned"):
            cache.restore(lk.hashes)  # released: no longer the caller's to restore
        lk = cache.lookup(prompt(71, 1))
        cache.allocate(lk)
        with pytest.raises(UsageError, match="already"):
            cache.allocate(lk)
        cache.release(lk)  # never committed: its block is freed
        assert cache.stats()["device_free"] == 8 - 1


def check_invariants(cache: KVCache, dtype) -> None:
    """Under the cache's lock: no slot owned twice, every landed host copy is the shadow copy."""
    with cache._cond:
        blocks = list(cache._index.values())
        dev = [b.dev for b in blocks if b.dev is not None]
        host = [b.host for b in blocks if b.host is not None]
        assert len(set(dev)) == len(dev) and not set(dev) & set(cache._free_dev)
        assert len(set(host)) == len(host) and not set(host) & set(cache._free_host)
        for b in blocks:
            if b.state == ON_HOST:
                assert same_bits(cache.host_pool[b.host], content(b.hash, dtype)), "a torn or lost host block"


def stress(cache: KVCache, threads=4, ops=500, seed=0, busy=None) -> dict:
    """Random requests from several threads over shared prefixes on a small cache; every block is checked
    against its shadow copy while pinned (twice, with a pause between, so a pinned block that was evicted
    and overwritten shows)."""
    prompts = [prompt(80 + p % 5, 1 + p % 3) + prompt(100 + p, 1 + p % 2) for p in range(24)]
    errors, fulls = [], [0]

    def worker(k):
        rng = random.Random(seed * 100 + k)
        try:
            for n in range(ops):
                if busy is not None:
                    busy()
                lk = cache.lookup(rng.choice(prompts))
                try:
                    table = cache.restore(lk.hits)
                    new = cache.allocate(lk)
                except KVCacheError as e:
                    assert "full" in str(e)
                    fulls[0] += 1
                    cache.release(lk)
                    continue
                for h, i in zip(lk.misses, new):
                    cache.device_pool[i].copy_(content(h, cache.dtype, cache.device))
                cache.commit(lk)
                for rep in range(2):
                    for h, i in zip(lk.hashes, table + new):
                        assert same_bits(cache.device_pool[i], content(h, cache.dtype)), f"block {h.hex()} torn or lost"
                    if rep == 0:
                        time.sleep(0)
                cache.release(lk)
                if n % 97 == 0:
                    check_invariants(cache, cache.dtype)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    deadline = time.monotonic() + 120
    for t in ts:
        t.join(timeout=max(0.1, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in ts), "a stress thread hung (deadlock?)"
    if errors:
        raise errors[0]
    cache.flush()
    check_invariants(cache, cache.dtype)
    s = cache.stats()
    assert s["lookups"] == threads * ops and fulls[0] < threads * ops // 2
    assert s["spilled_blocks"] > 0 and s["host_hits"] > 0 and s["restored_blocks"] > 0
    return s


@pytest.mark.parametrize("threshold", [1, 2])
def test_threaded_eviction_and_restore_lose_and_tear_no_block(threshold):
    with make(device_blocks=16, host_blocks=16, staging_blocks=3, threshold=threshold) as cache:
        s = stress(cache, seed=threshold)
        assert s["device_free"] == 16 - sum(1 for b in cache._index.values() if b.dev is not None)
