"""The framework family (torch-level launches, synchronizes, readbacks, copies): its loop logic on the
CPU, its rows on a GPU (the names calibrate reads)."""

import time
from types import SimpleNamespace

import pytest

from ccbridge.probe import framework, registry


def test_the_family_is_registered_and_needs_a_gpu_and_torch():
    tests = registry.select("framework")
    assert [t.name for t in tests] == [framework.LAUNCH, framework.D2H32, framework.COPY]
    assert all(t.needs == ("gpu", "torch") for t in tests)


def test_per_iteration_is_the_loop_and_its_closing_call_over_n():
    calls = {"body": 0, "finish": 0}

    def body():
        calls["body"] += 1

    def finish():
        calls["finish"] += 1
        time.sleep(0.01)  # the closing synchronize is part of each sample, spread over n

    samples = framework.per_iteration_us(body, finish, 10, 3)
    assert calls == {"body": 30, "finish": 3} and len(samples) == 3
    assert all(1000 <= s < 5000 for s in samples)  # 10 ms / 10 iterations, in us


def test_each_launch_mode_launches_then_waits_its_own_way():
    torch = pytest.importorskip("torch")
    log = []
    fake = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: log.append("device")))
    stream = SimpleNamespace(synchronize=lambda: log.append("stream"))
    x = torch.zeros(1)
    bodies = framework.launch_bodies(fake, x, stream)
    assert tuple(bodies) == framework.LAUNCH_MODES
    waits = {}
    for mode, body in bodies.items():
        log.clear()
        before = x.item()
        got = body()
        assert x.item() == before + 1  # one x.add_(1) per iteration
        waits[mode] = (list(log), got)
    assert waits == {"pipelined": ([], None), "launch+synchronize": (["device"], None),
                     "launch+stream_synchronize": (["stream"], None), "launch+item": ([], 4.0)}


@pytest.mark.gpu
@pytest.mark.usefixtures("need_gpu")
def test_quick_framework_rows_are_the_ones_calibrate_reads():
    pytest.importorskip("torch")
    from ccbridge import env

    res = registry.run(registry.Settings(quick=True, tests="framework"), {"emulation": env.emulation_info()})
    assert not res.errors and not res.skipped, (res.errors, res.skipped)
    keys = {r.key() for r in res.rows}
    assert keys == ({f"framework.launch:time_per_op[mode={m}]" for m in framework.LAUNCH_MODES}
                    | {f"framework.d2h32:per_copy_time[streams={k},sync={y}]" for k, y in framework.D2H32_CASES}
                    | {f"framework.copy:bandwidth[bytes={b},dir={d},mem={m}]" for b in framework.COPY_BYTES
                       for d in ("h2d", "d2h") for m in ("pinned", "pageable")})
    assert all(r.median > 0 for r in res.rows)
    assert res.duration_s < 30  # quick: calibrate runs it twice
