"""ccbridge.serve.kvcache on real streams: restores equal to spills while the compute stream is busy,
one real H2D per batched restore and one D2H per batched spill (counted by the profiler, not by us),
neither holding the calling thread (also as the first copies of a fresh process), and the threaded
stress test on CUDA."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs torch")

import test_kvcache_cpu as kv  # noqa: E402 - the shadow copies and the stress driver

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU (runs through scripts/device-check)")]

BUSY = 1_000_000_000  # cycles of torch.cuda._sleep: about half a second on the compute stream


def memcpys(fn):
    """(HtoD, DtoH) memcpy activities the CUDA profiler saw while fn ran (and spills it waited for)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    if not names:
        pytest.skip("the CUDA profiler recorded no device activity (CUPTI unavailable)")
    return (sum("HtoD" in n for n in names), sum("DtoH" in n for n in names))


def busy_stream():
    torch.cuda._sleep(BUSY)
    done = torch.cuda.Event()
    done.record()
    return done


@pytest.mark.parametrize("host_memory", ["pinned", "pageable"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn], ids=str)
def test_restore_equals_spill_and_crosses_once_without_holding_the_thread(dtype, host_memory):
    with kv.make(device="cuda", dtype=dtype, device_blocks=4, host_blocks=16, threshold=2,
                 host_memory=host_memory) as cache:
        a, b = kv.prompt(1, 4), kv.prompt(2, 4)
        kv.request(cache, a)
        kv.request(cache, a)  # seen twice: spilled on eviction

        def spill():
            lk = cache.lookup(b)
            done = busy_stream()
            new = cache.allocate(lk)  # evicts a: gather queued behind the sleep, D2H on the drain
            assert not done.query(), "allocate waited for the busy compute stream"
            for h, i in zip(lk.misses, new):
                cache.device_pool[i].copy_(kv.content(h, dtype, "cuda"))
            cache.commit(lk)
            cache.release(lk)
            cache.flush()
        assert memcpys(spill)[1] == 1 and cache.stats()["spill_crossings"] == 1
        for h in kv.block_hashes(a, kv.BT):
            assert kv.same_bits(cache.host_pool[cache._index[h].host], kv.content(h, dtype))

        lk = cache.lookup(a)
        assert lk.host == lk.hashes
        got = {}

        def restore():
            done = busy_stream()
            got["ids"] = cache.restore(lk.hits)  # 4 blocks: one H2D on the prep stream
            assert not done.query(), "restore waited for the busy compute stream"
        h2d, d2h = memcpys(restore)
        assert (h2d, d2h) == (1, 0)  # b was seen once: dropped, not spilled
        assert cache.stats()["restore_crossings"] == 1
        for h, i in zip(lk.hashes, got["ids"]):
            assert kv.same_bits(cache.device_pool[i], kv.content(h, dtype))
        cache.release(lk)


def test_first_spill_and_restore_of_a_process_do_not_wait_for_the_compute_stream():
    """The test above in a fresh process, where no kernel is loaded yet: CUDA loads a kernel on its first
    launch and loading may synchronize the context, so a cache that did not load its gather and scatter
    kernels up front would hold the thread at its first spill or restore (it did on an H100, when the test
    above ran first in the session; later parametrizations passed, their kernels loaded)."""
    node = f"{Path(__file__).name}::test_restore_equals_spill_and_crosses_once_without_holding_the_thread"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                          f"{node}[torch.bfloat16-pinned]"], cwd=Path(__file__).parent,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_threaded_stress_on_cuda_with_a_busy_compute_stream():
    with kv.make(device="cuda", device_blocks=16, host_blocks=16, staging_blocks=3, threshold=2,
                 host_memory="pinned") as cache:
        t0 = time.monotonic()
        kv.stress(cache, threads=3, ops=300, seed=5, busy=lambda: torch.cuda._sleep(20_000))
        assert time.monotonic() - t0 < 120
