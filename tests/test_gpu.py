"""GPU tests (marked): run on a GPU machine through scripts/device-check."""

import os
import random

import pytest

from ccbridge.bindings import core
from ccbridge.errors import GpuError

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("need_gpu")]



@pytest.mark.parametrize("mem", ["pinned", "pageable"])
def test_round_trip_is_byte_exact_at_random_sizes(mem):
    rng = random.Random(1234)
    with core.Session(0, mem, 64 << 20, nstreams=2) as s:
        for n in [1, 7, 4096, 65537] + [rng.randrange(1, 64 << 20) for _ in range(6)]:
            s.verify(n)


def test_copy_accounts_bytes_and_samples():
    with core.Session(0, "pinned", 1 << 20, nstreams=4) as s:
        out, samples = s.copy("h2d", 1 << 20, 12, nstreams=4, sync_every=4)
        assert out.bytes == 12 * (1 << 20)
        assert len(samples) == 3 and all(x > 0 for x in samples)
        assert 0 < out.incall_ns <= out.end_ns - out.start_ns


def test_oversized_copy_is_refused_with_a_clear_error():
    with core.Session(0, "pinned", 4096) as s:
        with pytest.raises(GpuError, match="exceeds session buffers"):
            s.copy("h2d", 8192, 1)


def test_bad_device_is_a_clear_error():
    with pytest.raises(GpuError, match="cuDeviceGet"):
        core.Session(core.device_count() + 3, "pinned", 4096)


def test_device_copy_never_blocks_the_host():
    with core.Session(0, "pinned", 4 << 20, nstreams=2) as s:
        out = s.semantics("d2d", core.SAME_STREAM, 4 << 20, 20e6)
        assert out.call_ns < 0.2 * out.remaining_ns
        assert out.done_ns >= 0.5 * out.remaining_ns  # the copy really waited behind the kernel


def test_workers_threads_and_contexts():
    for own in (False, True):
        ss = [core.Session(0, "pinned", 8 << 20, own_context=own) for _ in range(3)]
        try:
            outs = core.run_workers(ss, "h2d", 8 << 20, 4)
            assert len(outs) == 3 and all(o.bytes == 4 * (8 << 20) for o in outs)
            assert core.aggregate_gbps(outs) > 0
        finally:
            for s in ss:
                s.close()


def test_workers_on_the_streams_of_one_session():
    """A thread on each stream of one session (the threads mode); a stream the session lacks is refused."""
    with core.Session(0, "pinned", 8 << 20, nstreams=3) as s:
        outs = core.run_workers([s] * 3, "d2h", 8 << 20, 4, streams=[0, 1, 2])
        assert len(outs) == 3 and all(o.bytes == 4 * (8 << 20) for o in outs)
        with pytest.raises(GpuError, match="streams 3..3 outside 0..2"):
            core.run_workers([s], "h2d", 8 << 20, 1, streams=[3])


def test_launch_modes_give_positive_costs():
    with core.Session(0, "pinned", 64) as s:
        for mode in (core.LAUNCH_PIPELINED, core.LAUNCH_WAIT, core.LAUNCH_GRAPH):
            assert s.launch(mode, 50) > 0


def test_context_lifecycle():
    create, destroy = core.context_lifecycle(0, 2)
    assert create > 0 and destroy > 0


def test_quick_probe_of_native_families_runs_clean(tmp_path):
    from ccbridge import env
    from ccbridge.probe import registry

    res = registry.run(registry.Settings(quick=True, tests="semantics,smallcopy,launch"), {"emulation": env.emulation_info()})
    assert not res.errors, res.errors
    verdicts = {(r.params["dir"], r.params["mem"], r.params["stream"]): r.extra["verdict"] for r in res.by_test("semantics.nonblocking")}
    assert verdicts[("d2d", "device", "same")] == "async"
    if not os.environ.get("CCBRIDGE_EMULATION_PROFILE"):
        # natively a pinned H2D on the busy stream is queued, not waited for
        assert verdicts[("h2d", "pinned", "same")] == "async"
