"""Projection to a faster GPU (ccbridge run --project): dilated time in the interposer, on the CPU over the fake
driver. Host work between hooked calls is stretched by r, every emulated cost scales by r, a ratio below 1 is
refused."""

import ctypes
import time

import pytest

from test_emulator_cpu import DEVICE, PINNED, init, lib  # noqa: F401 - the fixture


def spin_cpu(seconds):
    """Host work: this thread busy for `seconds` of its own CPU time."""
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


def stretched(L, r, work_s=0.02):
    """(wall time of work + one hooked call) less the work's own wall time, and the work's CPU time."""
    init(L, emulate=0, dilation=r)
    s = L.ccbemu_fake_stream()
    assert L.cuStreamSynchronize(s) == 0  # the thread's first hooked call: host work is timed from its return
    t0, c0 = time.perf_counter(), time.thread_time()
    spin_cpu(work_s)
    cpu, t1 = time.thread_time() - c0, time.perf_counter()
    assert L.cuStreamSynchronize(s) == 0
    return time.perf_counter() - t1, cpu, t1 - t0


@pytest.mark.parametrize("r", [2.0, 3.5])
def test_host_work_between_hooked_calls_is_stretched_by_r(lib, r):  # noqa: F811
    # the wait spins on the clock, so it is never short; a loaded machine can only make it long: the best of 5
    ratios = [extra / (cpu * (r - 1)) for extra, cpu, _ in (stretched(lib, r) for _ in range(5))]
    assert min(ratios) > 0.95 and abs(min(ratios) - 1) < 0.05, ratios


def test_without_projection_nothing_is_stretched(lib):  # noqa: F811
    extra, cpu, _ = stretched(lib, 1.0)
    assert extra < 0.2 * cpu


def test_emulated_costs_scale_by_r(lib):  # noqa: F811
    toll_ms = 20
    s = None
    for r in (1.0, 2.5):
        init(lib, launch_toll_us=toll_ms * 1000, dilation=r)
        s = lib.ccbemu_fake_stream()
        t = time.perf_counter()
        assert lib.cuLaunchKernel(None, 1, 1, 1, 1, 1, 1, 0, s, None, None) == 0
        took = time.perf_counter() - t
        assert toll_ms * r / 1e3 <= took < toll_ms * r / 1e3 * 1.5 + 0.01, (r, took)


def test_a_crossing_paced_by_the_channel_takes_r_times_as_long(lib):  # noqa: F811
    n = 4 << 20
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    times = {}
    for r in (1.0, 2.0):
        init(lib, h2d_pinned_gbps=0.5, h2d_toll_us=0, sync_toll_us=0, dilation=r)
        src = lib.ccbemu_fake_alloc(n, PINNED)
        s = lib.ccbemu_fake_stream()
        t = time.perf_counter()
        assert lib.cuMemcpyHtoD_v2(dev, src, n) == 0
        times[r] = time.perf_counter() - t
    for r, took in times.items():  # paced at 0.5 / r GB/s: the bytes' time, plus the fake's own copy and seal
        assert r * n / 0.5e9 * 0.98 <= took < r * n / 0.5e9 + 0.02, times



@pytest.mark.parametrize("cc", ["off", "paused"])
def test_a_cc_off_readback_takes_r_times_its_native_time(lib, cc):  # noqa: F811
    """Projected with CC off (passthrough --project), or with emulation paused (a bench's native twin), a copy
    moves at this machine's native rate and waits (r - 1) x that more: the target's PCIe is no faster. Paused,
    it pays nothing of the profile's (its toll or rate)."""
    n, native_gbps, r = 4 << 20, 0.5, 2.0
    init(lib, emulate=int(cc == "paused"), dilation=r, native_d2h_pinned_gbps=native_gbps, d2h_pinned_gbps=0.05,
         d2h_toll_us=200000, sync_toll_us=0)
    dev, dst = lib.ccbemu_fake_alloc(n, DEVICE), lib.ccbemu_fake_alloc(n, PINNED)
    if cc == "paused":
        assert lib.ccbemu_emulate_pause(1) == 1  # it was emulating
    try:
        t = time.perf_counter()
        assert lib.cuMemcpyDtoH_v2(dst, dev, n) == 0
        took = time.perf_counter() - t
    finally:
        if cc == "paused":
            lib.ccbemu_emulate_pause(0)
    want = (r - 1) * n / (native_gbps * 1e9)
    assert want * 0.98 <= took < want + 0.02, (took, want)

@pytest.mark.parametrize("bad", ["0.5", "0", "-2", "nan", "1e9"])
def test_a_ratio_below_one_or_out_of_range_is_refused(lib, bad):  # noqa: F811
    with pytest.raises(ValueError, match="dilation"):
        init(lib, dilation=bad)


# ---- the targets and the ratio (emulate/targets.py) ----

def test_the_local_gpu_is_found_by_its_nvml_name_and_r_compares_datasheets():
    from ccbridge.emulate import targets

    assert targets.identify("NVIDIA H100 80GB HBM3").key == "h100"
    assert targets.identify("NVIDIA H100 PCIe").key == "h100-pcie"
    assert targets.identify("NVIDIA H100 NVL").key == "h100-nvl"
    assert targets.identify("NVIDIA H200").key == "h200"
    assert targets.identify("Tesla T4") is None
    p = targets.project("b300", "NVIDIA H100 80GB HBM3")
    assert p.by == "hbm" and p.r == pytest.approx(8.0 / 3.35)
    assert p.ratio("flops") == pytest.approx(2250 / 989.5)
    assert "PROJECTED to B300" in p.describe() and "x2.39" in p.describe()
    assert targets.project("h200", "NVIDIA H100 80GB HBM3", "flops").r == pytest.approx(1.0)
    assert p.link_gbps(360.0) == pytest.approx(720.0)  # NVLink 5 over NVLink 4: x2 of this machine's measured rate
    assert targets.project("b300", "Tesla T4", 2.5).r == 2.5  # a ratio given by hand needs no table entry


def test_a_mixed_ratio_scales_the_hbm_share_by_bandwidth_and_the_rest_by_compute():
    """hbm:F (Amdahl): r = 1 / (F / r_hbm + (1 - F) / r_flops). An H100 to an H200 (same compute, 1.43x HBM):
    F = 1 is the HBM ratio, F -> 0 no speed-up; session 9's llama-8b step (F ~0.5 at batch 1, ~0.17 at 128 on the
    H100) gets 1.18 and 1.05 where the H200 ran it 1.22x and 1.09x faster, not the 1.43 the HBM ratio says."""
    from ccbridge.emulate import targets

    h100 = "NVIDIA H100 80GB HBM3"
    assert targets.project("h200", h100, "hbm:1").r == pytest.approx(4.8 / 3.35)
    assert targets.project("h200", h100, "hbm:0.5").r == pytest.approx(1 / (0.5 / (4.8 / 3.35) + 0.5))
    p = targets.project("b300", h100, targets.parse_by("hbm:0.25"))
    want = 1 / (0.25 / (8 / 3.35) + 0.75 / (2250 / 989.5))
    assert p.by == "hbm:0.25" and p.r == pytest.approx(want)
    assert p.as_dict()["by"] == "hbm:0.25" and "= 1 / (0.25 / 2.39 HBM + 0.75 / 2.27 BF16)" in p.describe()
    assert targets.project("h200", h100, "hbm:0.5").r < targets.project("h200", h100, "hbm").r
    from ccbridge.emulate import launcher, profiles
    for line in launcher.banner(profiles.load("b300"), p).splitlines():
        assert len(line) <= 120, line


@pytest.mark.parametrize("text,msg", [("hbm:0", "above 0 and at most 1"), ("hbm:1.5", "above 0 and at most 1"),
                                      ("hbm:x", "above 0 and at most 1"), ("hbm:", "above 0 and at most 1"),
                                      ("hbm:nan", "above 0 and at most 1"), ("hbmx", "expected hbm, flops, hbm:F")])
def test_a_mixed_ratio_refuses_a_share_outside_0_to_1(text, msg):
    from ccbridge.emulate import targets
    from ccbridge.errors import UsageError

    with pytest.raises(UsageError, match=msg):
        targets.parse_by(text)


def test_a_mixed_ratio_needs_the_targets_compute_figure():
    from ccbridge.emulate import targets
    from ccbridge.errors import UsageError

    with pytest.raises(UsageError, match="no dense BF16 figure"):
        targets.project("rtxpro6000", "NVIDIA H100 PCIe", "hbm:0.5")


@pytest.mark.parametrize("args,msg", [
    (("h100", "NVIDIA H200"), "a slower GPU"),             # r < 1
    (("rtxpro6000", "NVIDIA H100 80GB HBM3"), "a slower GPU"),
    (("b300", "NVIDIA H100 80GB HBM3", 0.5), "the ratio is 0.5"),
    (("b300", "Tesla T4"), "no datasheet for this GPU"),
    (("nosuch", "NVIDIA H100 80GB HBM3"), "unknown GPU 'nosuch'"),
    (("rtxpro6000", "NVIDIA H100 PCIe", "flops"), "no dense BF16 figure"),
    (("b300", "x" * 300), "no datasheet for this GPU"),
])
def test_projection_refuses_what_it_cannot_do_in_one_line(args, msg):
    from ccbridge.emulate import targets
    from ccbridge.errors import UsageError

    with pytest.raises(UsageError, match=msg) as e:
        targets.project(*args)
    assert "\n" not in str(e.value) and len(f"ccbridge run: {e.value}") <= 120, str(e.value)


def test_every_target_names_its_source():
    from ccbridge.emulate import targets

    for g in targets.GPUS.values():
        assert "datasheet" in g.source and g.hbm_tbps > 0


# ---- the command line ----

def _cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "ccbridge.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,msg", [
    (["run", "--project", "b300", "--project-by", "0.5", "--", "true"], "the ratio is 0.5 (< 1)"),
    (["run", "--project", "nosuch", "--", "true"], "unknown GPU 'nosuch'"),
    (["run", "--project", "b300", "--project-by", "fast", "--", "true"], "expected hbm, flops, hbm:F or a number"),
    (["run", "--project", "h200", "--project-by", "hbm:2", "--", "true"], "at most 1, got '2'"),
    (["run", "--profile", "b300", "--project-by", "flops", "--", "true"], "--project-by goes with --project"),
    (["account", "--project", "b300", "a", "b"], "--project goes with --profile"),
])
def test_projection_is_refused_in_one_line(args, msg, tmp_path):
    p = _cli(*args)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and msg in err[0] and len(err[0]) <= 120, p.stderr


def test_a_projected_run_reads_projected_in_its_stamp(tmp_path, monkeypatch, driver_here):
    import json

    from ccbridge import env
    from ccbridge.emulate import targets

    p = targets.project("b300", "NVIDIA H100 80GB HBM3")
    monkeypatch.setenv(env.EMULATION_VAR, "passthrough")
    conf = tmp_path / "c.conf"
    conf.write_text("profile=passthrough\nemulate=0\n")
    monkeypatch.setenv("CCBRIDGE_EMU_CONFIG", str(conf))
    monkeypatch.setenv(targets.ENV_VAR, json.dumps(p.as_dict()))
    info = env.emulation_info()
    assert info["projection"]["target"] == "b300" and info["projection"]["r"] == pytest.approx(8 / 3.35)
    banner = env.emulated_banner(info)
    assert banner.startswith("CC-off run; PROJECTED to b300, time x2.39") and "a model" in banner
    assert "dilation=" in p.config_lines({"native_nvlink_gbps": 300.0})
    assert "target_nvlink_gbps=600" in p.config_lines({"native_nvlink_gbps": 300.0})
    # the bench's own table says so too: a projected CC-off run is not read as this GPU's figures
    from ccbridge.results import Result
    from ccbridge.serve import decode
    res = Result(kind="decode", env={"emulation": info}, rows=[], settings={"decode": {
        "model": "tiny", "dtype": "bfloat16", "device": "cuda", "prompt": 8, "output": 4, "graphs": True, "iters": 1}})
    assert f"# {banner}" in decode.render(res).splitlines()
