"""The GPU timer's two backends on a GPU: CUDA events and %globaltimer stamps agree on the same work within
max(5%, twice the stamp's resolution), as TensorRT-LLM and FlashInfer test theirs with CC off; natively and under
the b300 emulator (where the stamp kernel goes to the driver past the emulator: an instrument pays no toll)."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs torch")

from ccbridge import gputimer  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU")]


def agree(work, reps=15):
    ev = sorted(gputimer.time_ms(torch, work, reps, backend="events"))[reps // 2]
    gt = sorted(gputimer.time_ms(torch, work, reps, backend="globaltimer"))[reps // 2]
    own = gputimer.stamp_cost_ns(torch, torch.cuda.current_device())
    return ev, gt, own


@pytest.mark.parametrize("what", ["sleep", "matmul", "copy"])
def test_events_and_globaltimer_agree_on_the_same_work(what):
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    big = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    other = torch.empty_like(big)
    work = {"sleep": lambda: torch.cuda._sleep(2_000_000), "matmul": lambda: a @ a,
            "copy": lambda: other.copy_(big)}[what]
    work()
    torch.cuda.synchronize()
    ev, gt, own = agree(work)
    assert 0 <= own < 50_000  # a stamp's own time: a few us at most
    assert abs(gt - ev) <= max(0.05 * ev, 2 * own / 1e6), (what, ev, gt, own)


def test_the_timers_agree_under_the_b300_emulator():
    code = ("import torch; from ccbridge import gputimer; w = lambda: torch.cuda._sleep(2_000_000); w(); "
            "torch.cuda.synchronize(); "
            "e = sorted(gputimer.time_ms(torch, w, 9, backend='events'))[4]; "
            "g = sorted(gputimer.time_ms(torch, w, 9, backend='globaltimer'))[4]; print(e, g)")
    p = subprocess.run([sys.executable, "-m", "ccbridge", "run", "--profile", "b300", "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    e, g = map(float, p.stdout.split()[-2:])
    assert abs(g - e) <= 0.05 * e, (e, g)


def test_stamps_from_many_contexts_made_and_destroyed_in_turn():
    """A stamp from each of 70 contexts, each destroyed before the next is made (the driver may hand the same handle
    out again): every stamp lands (no stale kernel of a destroyed context, no failure past the cache's 64)."""
    import ctypes

    from ccbridge.bindings import core

    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    dev, last = ctypes.c_int(), 0
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    for i in range(70):
        ctx, mem, out = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_uint64()
        assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
        try:
            assert cu.cuMemAlloc_v2(ctypes.byref(mem), 8) == 0
            core.stamp(0, mem.value)
            assert cu.cuCtxSynchronize() == 0
            assert cu.cuMemcpyDtoH_v2(ctypes.byref(out), mem, 8) == 0
            assert out.value > last, (i, out.value, last)  # %globaltimer ns: later than the previous context's
            last = out.value
        finally:
            cu.cuCtxDestroy_v2(ctx)
