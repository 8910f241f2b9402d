"""The emulator's channel, tolls, pacing, cipher and hook table on the CPU.

The interposer is loaded with ctypes (RTLD_LOCAL: it interposes nothing in
this process) and switched to its fake driver (native/emu/fake.c), so the
same hook and channel code runs as on a GPU. Fake kernels keep a stream busy
for grid.x microseconds; fake device memory is host memory.
"""

import csv
import ctypes
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ccbridge.bindings import emu
from ccbridge.emulate import launcher, profiles, trace

DEVICE, PINNED = 2, 1
c_p, c_sz, c_u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64


@pytest.fixture(scope="module")
def lib():
    try:
        L = emu.load(launcher.library())
    except launcher.EmulatorError as e:
        pytest.skip(str(e))
    L.dlsym.restype = c_p
    L.dlsym.argtypes = [c_p, ctypes.c_char_p]
    for name in ("cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz"):
        getattr(L, name).argtypes = [c_u64, c_p, c_sz, c_p]
    L.cuMemcpyDtoHAsync_v2.argtypes = [c_p, c_u64, c_sz, c_p]
    L.cuMemcpyHtoD_v2.argtypes = [c_u64, c_p, c_sz]
    L.cuMemcpyDtoH_v2.argtypes = [c_p, c_u64, c_sz]
    L.cuMemcpy.argtypes = [c_u64, c_u64, c_sz]
    L.cuMemcpyAsync.argtypes = [c_u64, c_u64, c_sz, c_p]
    L.cuLaunchKernel.argtypes = [c_p] + [ctypes.c_uint] * 7 + [c_p, c_p, c_p]
    L.cuStreamSynchronize.argtypes = [c_p]
    L.cuMemHostRegister_v2.argtypes = [c_p, c_sz, ctypes.c_uint]
    L.cuGetProcAddress_v2.argtypes = [ctypes.c_char_p, ctypes.POINTER(c_p), ctypes.c_int, c_u64, c_p]
    return L


BASE = {"emulate": 1, "lanes": 3, "chunk_bytes": 65536}


def init(L, **params):
    text = "profile=test\n" + "".join(f"{k}={v}\n" for k, v in {**BASE, **params}.items())
    err = ctypes.create_string_buffer(256)
    rc = L.ccbemu_test_init(text.encode(), err, 256)
    if rc != 0:
        raise ValueError(err.value.decode())


def summary(L) -> dict:
    buf = ctypes.create_string_buffer(1 << 16)
    assert L.ccbemu_summary(buf, len(buf)) == 0
    return json.loads(buf.value)


def host(L, n, pinned, data=None):
    """A host buffer: pinned (known to the fake driver) or pageable."""
    if pinned:
        p = L.ccbemu_fake_alloc(n, PINNED)
        if data is not None:
            ctypes.memmove(p, data, n)
        return p, None
    buf = ctypes.create_string_buffer(data if data is not None else b"\0" * n, n)
    return ctypes.addressof(buf), buf


def timed(fn, *args):
    t = time.perf_counter()
    rc = fn(*args)
    assert rc == 0, f"{fn.__name__} returned {rc}"
    return time.perf_counter() - t


def test_bad_configuration_is_refused_with_the_reason(lib):
    with pytest.raises(ValueError, match="unknown parameter 'nope'"):
        init(lib, nope=1)
    with pytest.raises(ValueError, match="h2d_toll_us needs a number, got 'fast'"):
        init(lib, h2d_toll_us="fast")
    with pytest.raises(ValueError, match="lanes must be"):
        init(lib, lanes=0)


@pytest.mark.parametrize("lanes,chunk", [(1, 4096), (3, 65536), (6, 1 << 22)])
def test_every_copy_api_is_byte_exact_over_random_sizes_and_kinds(lib, lanes, chunk):
    init(lib, lanes=lanes, chunk_bytes=chunk, h2d_pinned_gbps=0, d2h_pinned_gbps=0)
    rng = __import__("random").Random(7)
    s = lib.ccbemu_fake_stream()
    moved = 0
    for n in [1, 3, 4095, 4096, 65537, 300001] + [rng.randrange(1, 1 << 20) for _ in range(12)]:
        off = rng.randrange(64)
        data = os.urandom(n)
        dev = lib.ccbemu_fake_alloc(n + 64, DEVICE) + off
        src, _keep1 = host(lib, n, rng.random() < 0.5, data)
        dst, _keep2 = host(lib, n, rng.random() < 0.5)
        up = rng.choice(["sync", "async", "ptsz", "generic", "generic_async"])
        {"sync": lambda: lib.cuMemcpyHtoD_v2(dev, src, n),
         "async": lambda: lib.cuMemcpyHtoDAsync_v2(dev, src, n, s),
         "ptsz": lambda: lib.cuMemcpyHtoDAsync_v2_ptsz(dev, src, n, None),
         "generic": lambda: lib.cuMemcpy(dev, src, n),
         "generic_async": lambda: lib.cuMemcpyAsync(dev, src, n, s)}[up]()
        down = rng.choice(["sync", "async", "generic"])
        {"sync": lambda: lib.cuMemcpyDtoH_v2(dst, dev, n),
         "async": lambda: lib.cuMemcpyDtoHAsync_v2(dst, dev, n, s),
         "generic": lambda: lib.cuMemcpy(dst, dev, n)}[down]()
        assert ctypes.string_at(dst, n) == data, (n, up, down)
        moved += n
    sm = summary(lib)["crossings"]
    assert sum(v["bytes"] for k, v in sm.items() if k.startswith("h2d")) == moved
    assert sum(v["bytes"] for k, v in sm.items() if k.startswith("d2h")) == moved
    for v in sm.values():  # real AES-GCM went over every crossing byte
        assert v["cipher_bytes"] == v["bytes"]


def test_device_to_device_generic_copy_is_untouched(lib):
    init(lib, h2d_toll_us=100000)
    a, b = lib.ccbemu_fake_alloc(64, DEVICE), lib.ccbemu_fake_alloc(64, DEVICE)
    assert timed(lib.cuMemcpy, b, a, 64) < 0.05  # no 100 ms toll: not a crossing
    assert all(v["count"] == 0 for v in summary(lib)["crossings"].values())


def test_bandwidth_and_toll_set_the_floor(lib):
    init(lib, h2d_pinned_gbps=1, h2d_toll_us=3000)
    n = 4 << 20
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    src, _ = host(lib, n, True, os.urandom(n))
    t = timed(lib.cuMemcpyHtoDAsync_v2, dev, src, n, None)
    assert t >= n / 1e9 + 3e-3  # 4.19 ms of channel + 3 ms toll
    tiny = timed(lib.cuMemcpyHtoDAsync_v2, dev, src, 32, None)
    assert 3e-3 <= tiny < 3e-3 + 3e-3  # the toll dominates a small crossing


def test_passthrough_adds_no_cost(lib):
    init(lib, emulate=0, h2d_pinned_gbps=0.001, h2d_toll_us=100000)
    dev = lib.ccbemu_fake_alloc(1 << 20, DEVICE)
    src, _ = host(lib, 1 << 20, True, os.urandom(1 << 20))
    assert timed(lib.cuMemcpyHtoDAsync_v2, dev, src, 1 << 20, None) < 0.05
    assert summary(lib)["calls"]["cuMemcpyHtoDAsync_v2"] == 1


def busy(lib, stream, us):
    assert lib.cuLaunchKernel(None, us, 1, 1, 1, 1, 1, 0, stream, None, None) == 0


def test_asynchrony_is_revoked_as_the_law_says(lib):
    init(lib)
    n = 1 << 16
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    buf, _ = host(lib, n, True, os.urandom(n))
    s_busy, s_idle = lib.ccbemu_fake_stream(), lib.ccbemu_fake_stream()
    for direction, call in (("h2d", lambda s: lib.cuMemcpyHtoDAsync_v2(dev, buf, n, s)),
                            ("d2h", lambda s: lib.cuMemcpyDtoHAsync_v2(buf, dev, n, s))):
        busy(lib, s_busy, 30000)  # 30 ms of queued work
        t = time.perf_counter()
        assert call(s_idle) == 0
        idle = time.perf_counter() - t
        t = time.perf_counter()
        assert call(s_busy) == 0
        behind = time.perf_counter() - t
        assert idle < 0.01, f"{direction} on an idle stream paid for another stream's work"
        assert behind > 0.02, f"{direction} behind queued work returned before it drained"


def concurrent_h2d(lib, ctxs, n) -> float:
    """One thread per context in ctxs (repeats allowed), each one n-byte H2D; wall seconds."""
    bufs = [(lib.ccbemu_fake_alloc(n, DEVICE), host(lib, n, True, os.urandom(n))[0]) for _ in ctxs]

    def work(ctx, dev, src):
        lib.ccbemu_fake_set_ctx(ctx)
        assert lib.cuMemcpyHtoDAsync_v2(dev, src, n, None) == 0

    th = [threading.Thread(target=work, args=(c, d, s)) for c, (d, s) in zip(ctxs, bufs)]
    t = time.perf_counter()
    for x in th:
        x.start()
    for x in th:
        x.join()
    return time.perf_counter() - t


def test_one_context_serializes_and_two_contexts_do_not(lib):
    # 0.1 GB/s: 42 ms of pacing per crossing against ~1 ms of cipher work, so a loaded
    # 2-core machine (CI) cannot blur side by side into one after the other
    init(lib, h2d_pinned_gbps=0.1)
    n = 4 << 20
    ctx_a, ctx_b = lib.ccbemu_fake_ctx_new(), lib.ccbemu_fake_ctx_new()
    concurrent_h2d(lib, [ctx_a, ctx_b], 4096)  # warm: channels and lanes exist before timing
    one = n / 0.1e9
    assert concurrent_h2d(lib, [ctx_a, ctx_a], n) >= 1.9 * one  # two threads, one context: one after the other
    assert concurrent_h2d(lib, [ctx_a, ctx_b], n) < 1.6 * one   # two contexts: side by side


def test_machine_wide_bridge_caps_contexts_together(lib):
    init(lib, h2d_pinned_gbps=1, h2d_system_gbps=1)
    n = 2 << 20
    ctxs = [lib.ccbemu_fake_ctx_new() for _ in range(3)]
    assert concurrent_h2d(lib, ctxs, n) >= 3 * n / 1e9 * 0.95  # 3 channels, but one 1 GB/s bridge


def test_capture_passes_copies_through_unpaced(lib):
    init(lib, h2d_pinned_gbps=0.01)
    n = 1 << 20
    s = lib.ccbemu_fake_stream()
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    src, _ = host(lib, n, True, os.urandom(n))
    lib.ccbemu_fake_capture(s, 1)
    assert timed(lib.cuMemcpyHtoDAsync_v2, dev, src, n, s) < 0.05  # recorded into a graph, not a crossing
    lib.ccbemu_fake_capture(s, 0)


def test_launch_toll_is_added_and_a_synchronize_pays_one_round_trip(lib):
    init(lib, launch_toll_us=300, sync_toll_us=2000)
    s = lib.ccbemu_fake_stream()
    k = 50
    t = time.perf_counter()
    for _ in range(k):
        busy(lib, s, 0)
    per_launch = (time.perf_counter() - t) / k
    assert 300e-6 <= per_launch < 300e-6 + 1e-3  # the fake's own launch is ~2 us: added, not multiplied
    assert timed(lib.cuStreamSynchronize, s) >= 2e-3  # work was submitted: one round trip
    assert timed(lib.cuStreamSynchronize, s) < 1e-3  # nothing new to wait for: none


def test_a_launch_pays_its_toll_before_the_gpu_sees_the_kernel(lib):
    """Under CC the work reaches the GPU only after its submission crossed the bridge: a 5 ms toll and a 4 ms
    kernel make a launch + wait 9 ms, not 5 (the kernel running during a toll paid after the launch)."""
    init(lib, launch_toll_us=5000, sync_toll_us=0)
    s = lib.ccbemu_fake_stream()
    took = []
    for _ in range(3):
        t = time.perf_counter()
        busy(lib, s, 4000)
        assert lib.cuStreamSynchronize(s) == 0
        took.append(time.perf_counter() - t)
    # every try pays both (a floor scheduling cannot lower); the fastest try bounds the rest, since a loaded
    # machine only ever adds time (a toll paid twice would make even the fastest 14 ms)
    assert min(took) >= 0.009 and min(took) < 0.0115, took


def test_a_paused_trace_records_nothing_and_resumes(lib, tmp_path, monkeypatch):
    """trace.paused() (a region left out of a --record run): no lines for the launches inside but the one under
    trace.resumed(), lines again after, the launch toll charged throughout (emulation goes on); outside
    `ccbridge run` it is a clear error."""
    prefix = tmp_path / "p"
    init(lib, trace=str(prefix), launch_toll_us=1000, sync_toll_us=0)
    s = lib.ccbemu_fake_stream()
    monkeypatch.setenv(trace.LIB_ENV, lib._name)
    busy(lib, s, 0)
    with trace.paused() as was:
        t = time.perf_counter()
        for _ in range(3):
            busy(lib, s, 0)
        assert time.perf_counter() - t >= 3e-3
        with trace.resumed(was):  # one recorded launch inside the paused region
            busy(lib, s, 0)
        busy(lib, s, 0)
    busy(lib, s, 0)
    lib.ccbemu_trace_flush()
    rows = [l for l in Path(f"{prefix}.{os.getpid()}.csv").read_text().splitlines()
            if not l.startswith("#") and ",launch," in l]
    assert was is True and len(rows) == 3, rows
    monkeypatch.delenv(trace.LIB_ENV)
    with pytest.raises(trace.EmulatorError, match="works inside `ccbridge run`"):
        with trace.paused():
            pass


def test_a_d2h_crossing_is_a_round_trip(lib):
    """The published 32-byte D2H (17 -> 40 us on B300) is a round trip, with or without a synchronize after it."""
    init(lib, sync_toll_us=2000, d2h_toll_us=0, h2d_toll_us=0)
    s = lib.ccbemu_fake_stream()
    dev = lib.ccbemu_fake_alloc(64, DEVICE)
    dst, _ = host(lib, 64, True)
    for _ in range(3):
        assert timed(lib.cuMemcpyDtoHAsync_v2, dst, dev, 32, s) >= 2e-3
        assert timed(lib.cuStreamSynchronize, s) < 1e-3  # the copy was the round trip
    src, _ = host(lib, 64, True, os.urandom(64))
    assert timed(lib.cuMemcpyHtoDAsync_v2, dev, src, 32, s) < 1e-3  # an H2D is not a round trip...
    assert timed(lib.cuStreamSynchronize, s) >= 2e-3  # ...but it is work a synchronize waits for


def test_a_channel_never_beats_native_times_the_published_ratio(lib):
    n = 1 << 20
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    src, _ = host(lib, n, True, os.urandom(n))
    floor_s = n / (0.02e9 * 0.5)  # a slow host: 0.02 GB/s natively, x 0.5 published: 105 ms (far above load noise)
    init(lib, h2d_pinned_gbps=10, h2d_pinned_ratio=0.5, h2d_toll_us=0)  # native unknown: the profile's 10 GB/s
    assert timed(lib.cuMemcpyHtoDAsync_v2, dev, src, n, None) < floor_s / 2
    init(lib, h2d_pinned_gbps=10, h2d_pinned_ratio=0.5, native_h2d_pinned_gbps=0.02, h2d_toll_us=0)
    assert timed(lib.cuMemcpyHtoDAsync_v2, dev, src, n, None) >= floor_s


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_a_pageable_crossing_lasts_its_own_native_copy_over_the_ratio_as_the_host_drifts(lib, direction):
    """A sustained pageable crossing (16 MiB and more) goes through the driver's own pageable path and lasts at
    least that copy's time over the published ratio, timed crossing by crossing: when the host's native path slows
    (here the fake's copies go from 8 to 16 ms), the crossing slows with it (16 -> 32 ms at ratio 0.5), whatever
    the profile's own bandwidth (unpaced here). A launcher's snapshot of the native rate could not follow
    (bench/RESULTS.md, runs K and L: 15-30% between minutes on an H100 host). A small copy is floored by that
    rate for its bytes, not by its own time over the ratio: its fixed latency (here 4 ms) is not scaled."""
    n, small = 16 << 20, 4096
    init(lib, lanes=2, h2d_pageable_ratio=0.5, d2h_pageable_ratio=0.5, h2d_pageable_gbps=0, d2h_pageable_gbps=0,
         h2d_toll_us=0, d2h_toll_us=0, sync_toll_us=0)
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    data = os.urandom(n)
    buf, _keep = host(lib, n, False, data)
    s = lib.ccbemu_fake_stream()

    def copy(nbytes):
        rc = (lib.cuMemcpyHtoDAsync_v2(dev, buf, nbytes, s) if direction == "h2d" else
              lib.cuMemcpyDtoHAsync_v2(buf, dev, nbytes, s))
        assert rc == 0
        return 0

    ctypes.memmove(dev, data, n)
    copy(small)  # the channel and its native D2H call exist before the timing
    took = {}
    try:
        for native_ms in (8, 16):
            lib.ccbemu_fake_copy_gbps(n / (native_ms * 1e6))
            took[native_ms] = min(timed(copy, n) for _ in range(2))
        lib.ccbemu_fake_copy_gbps(small / 4e6)  # a 4 KiB copy holds its stream 4 ms: latency, not bandwidth
        took_small = min(timed(copy, small) for _ in range(2))
    finally:
        lib.ccbemu_fake_copy_gbps(0)
    # above the floor only the seal of the 16 MiB after the copy: as long as this machine's one-thread seal at
    # most (the crossing's lanes share it), and a few ms of scheduling on a loaded 2-core CI machine
    key, iv, tag = os.urandom(32), os.urandom(12), ctypes.create_string_buffer(16)
    out = ctypes.create_string_buffer(n)
    seal_s = min(timed(lib.ccbemu_seal, key, iv, data, n, out, tag) for _ in range(2))
    for native_ms, t in took.items():
        assert 2 * native_ms / 1e3 <= t < 2 * native_ms / 1e3 + seal_s + 0.004, (took, seal_s)
    assert 0.004 <= took_small < 0.004 + 0.003, took_small  # not 8 ms: 4 KiB at the 16 MiB copy's rate is ~0
    assert ctypes.string_at(buf if direction == "d2h" else dev, n) == data
    init(lib, h2d_pageable_ratio=1, d2h_pageable_ratio=1, h2d_pageable_gbps=0, d2h_pageable_gbps=0,
         h2d_toll_us=0, d2h_toll_us=0, sync_toll_us=0)
    copy(small)
    lib.ccbemu_fake_copy_gbps(n / 16e6)
    try:  # ratio 1: the native copy's own 16 ms and the seal of 16 MiB after it (seal_s at most), not 32 ms
        took_1 = min(timed(copy, n) for _ in range(2))
        assert 0.016 <= took_1 < 0.016 + seal_s + 0.004, (took_1, seal_s)
    finally:
        lib.ccbemu_fake_copy_gbps(0)


def test_the_channels_sustained_size_is_the_probes():
    """A pageable crossing sets its channel's native rate from this size on, where calibrate compares bandwidths."""
    import re

    from ccbridge.probe import transfer

    src = (Path(launcher.__file__).parents[1] / "native" / "emu" / "channel.c").read_text()
    base, shift = re.search(r"#define SUSTAINED_BYTES \((\d+)u << (\d+)\)", src).groups()
    assert int(base) << int(shift) == transfer.SUSTAINED_BYTES


def test_host_register_is_refused_under_cc_and_allowed_in_passthrough(lib):
    buf = ctypes.create_string_buffer(4096)
    init(lib, refuse_host_register=1)
    assert lib.cuMemHostRegister_v2(buf, 4096, 0) == 801  # CUDA_ERROR_NOT_SUPPORTED
    init(lib, emulate=0, refuse_host_register=1)
    assert lib.cuMemHostRegister_v2(buf, 4096, 0) == 0


def test_get_proc_address_hands_out_the_hook_of_the_exact_variant(lib):
    init(lib)
    pfn = c_p()
    assert lib.cuGetProcAddress_v2(b"cuMemcpyHtoDAsync", ctypes.byref(pfn), 12000, 0, None) == 0
    assert pfn.value == lib.ccbemu_lookup(b"cuMemcpyHtoDAsync_v2")
    assert lib.cuGetProcAddress_v2(b"cuMemcpyHtoDAsync", ctypes.byref(pfn), 12000, 2, None) == 0
    assert pfn.value == lib.ccbemu_lookup(b"cuMemcpyHtoDAsync_v2_ptsz")  # per-thread stream kept
    assert lib.cuGetProcAddress_v2(b"cuEventQuery", ctypes.byref(pfn), 12000, 0, None) == 0
    assert pfn.value and pfn.value != lib.ccbemu_lookup(b"cuEventQuery")  # not hooked: the driver's own


def test_dlsym_returns_hooks_for_table_names_only(lib):
    init(lib)
    assert lib.dlsym(lib._handle, b"cuLaunchKernel") == lib.ccbemu_lookup(b"cuLaunchKernel")
    assert lib.dlsym(lib._handle, b"ccbemu_summary") == ctypes.cast(lib.ccbemu_summary, c_p).value


def test_cipher_is_aes_256_gcm(lib):
    # The GCM specification's test case 16 (AES-256, 60-byte plaintext, no AAD tag differs; here no AAD).
    key = bytes.fromhex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308")
    iv = bytes.fromhex("cafebabefacedbaddecaf888")
    pt = bytes.fromhex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525"
                       "b16aedf5aa0de657ba637b39")
    out, tag = ctypes.create_string_buffer(len(pt)), ctypes.create_string_buffer(16)
    assert lib.ccbemu_seal(key, iv, pt, len(pt), out, tag) == 0
    assert out.raw.hex().startswith("522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3d")
    aead = pytest.importorskip("cryptography.hazmat.primitives.ciphers.aead")
    for n in (1, 17, 4096, 100003):
        data, key, iv = os.urandom(n), os.urandom(32), os.urandom(12)
        out = ctypes.create_string_buffer(n)
        assert lib.ccbemu_seal(key, iv, data, n, out, tag) == 0
        assert out.raw + tag.raw == aead.AESGCM(key).encrypt(iv, data, None)


def test_trace_records_every_crossing(lib, tmp_path):
    prefix = tmp_path / "t"
    init(lib, trace=str(prefix))
    n = 100000
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    src, _k = host(lib, n, False, os.urandom(n))
    s = lib.ccbemu_fake_stream()
    busy(lib, s, 50000)  # long beside any descheduling of this thread on a loaded machine (5 ms was not)
    for _ in range(3):
        assert lib.cuMemcpyHtoDAsync_v2(dev, src, n, s) == 0
    assert lib.cuMemcpyDtoHAsync_v2(src, dev, n, s) == 0
    lib.ccbemu_trace_flush()
    t = trace.summarize(str(prefix))
    assert t.processes == 1 and t.total_crossings() == 4
    assert t.by_api[("cuMemcpyHtoDAsync_v2", "h2d", "pageable")]["count"] == 3
    assert t.by_api[("cuMemcpyHtoDAsync_v2", "h2d", "pageable")]["stream_wait_ns"] > 3e6  # waited for the busy stream
    assert "cuMemcpyDtoHAsync_v2" in trace.render(t)


def test_contexts_and_pinned_allocations_are_trace_lines_with_their_tolls(lib, tmp_path):
    """An account can only name a cost the trace holds: a context's CC setup and a pinned allocation's toll
    are lines of kind context and alloc, their toll in toll_ns."""
    prefix = tmp_path / "c"
    init(lib, trace=str(prefix), ctx_create_s=0.02, host_alloc_toll_us=5000)
    lib.cuCtxCreate_v2.argtypes = [ctypes.POINTER(c_p), ctypes.c_uint, ctypes.c_int]
    lib.cuMemHostAlloc.argtypes = [ctypes.POINTER(c_p), c_sz, ctypes.c_uint]
    ctx, buf = c_p(), c_p()
    assert lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
    assert lib.cuMemHostAlloc(ctypes.byref(buf), 1 << 20, 0) == 0
    lib.ccbemu_trace_flush()
    t = trace.summarize(str(prefix))
    made = t.by_api[("cuCtxCreate_v2", "-", "-")]
    pinned = t.by_api[("cuMemHostAlloc", "-", "-")]
    assert made["kind"] == "context" and made["count"] == 1 and made["toll_ns"] >= 20e6 and made["blocked_ns"] >= 20e6
    assert pinned["kind"] == "alloc" and pinned["bytes"] == 1 << 20 and pinned["toll_ns"] >= 5e6
    assert "1 context and 1 pinned-allocation calls" in trace.render(t)


def test_a_refused_host_registration_is_a_trace_line(lib, tmp_path):
    """Under CC pinning ordinary memory is refused (801): the trace says where a program tried it."""
    prefix = tmp_path / "r"
    init(lib, trace=str(prefix), refuse_host_register=1)
    buf = ctypes.create_string_buffer(8192)
    assert lib.cuMemHostRegister_v2(buf, 8192, 0) == 801
    lib.ccbemu_trace_flush()
    rows = [r for r in csv.DictReader(l for l in Path(f"{prefix}.{os.getpid()}.csv").read_text().splitlines()
                                      if not l.startswith("#")) if r["api"] == "cuMemHostRegister_v2"]
    assert len(rows) == 1 and rows[0]["kind"] == "alloc" and rows[0]["rc"] == "801" and rows[0]["bytes"] == "8192"


@pytest.mark.parametrize("name", profiles.names())
def test_shipped_profiles_parse_and_the_interposer_accepts_them(lib, name):
    p = profiles.load(name)
    assert all(param.source.strip() for param in p.params.values())
    init(lib)  # reset, then the profile's own text
    err = ctypes.create_string_buffer(256)
    assert lib.ccbemu_test_init(p.config_text().encode(), err, 256) == 0, err.value
    with_host = p.config_text(None, {"native_h2d_pinned_gbps": 55.0}, {"native_h2d_pageable_gbps": 5.8})
    assert "#host native_h2d_pageable_gbps=5.8" in with_host  # a line the interposer skips
    assert lib.ccbemu_test_init(with_host.encode(), err, 256) == 0, err.value


@pytest.mark.parametrize("name", ["b300", "passthrough"])
def test_the_launcher_writes_host_facts_for_an_emulating_profile_only(monkeypatch, tmp_path, name):
    """The launcher's pageable snapshot reaches the program's configuration as a `#host` line, which the interposer
    preloaded into it skips (the program runs); a passthrough run adds no cost and times nothing for it."""
    import sys

    asked = []

    def measure(host=None, **kw):  # as native_floor.measure: host facts into `host`, timed in the same context
        if host is not None:
            asked.append(1)
            host.update({"native_h2d_pageable_gbps": 5.8})
        return {}

    monkeypatch.setattr(launcher.native_floor, "measure", measure)
    out = tmp_path / "seen.conf"
    code = f"import os, shutil; shutil.copy(os.environ['CCBRIDGE_EMU_CONFIG'], {str(out)!r})"
    assert launcher.run(profiles.load(name), [sys.executable, "-c", code]) == 0
    emulates = name != "passthrough"
    assert ("#host native_h2d_pageable_gbps=5.8" in out.read_text().splitlines()) == emulates
    assert asked == [1] * emulates


def test_host_facts_are_empty_without_a_usable_gpu(monkeypatch):
    from ccbridge.emulate import native_floor
    from ccbridge.errors import GpuError

    def no_gpu(*a, **kw):
        raise GpuError("no CUDA driver")

    monkeypatch.setattr(native_floor.core, "Session", no_gpu)
    assert native_floor.host_facts() == {}


HOST_MEM, DEVICE_MEM = 1, 2


class Memcpy2D(ctypes.Structure):
    """CUDA_MEMCPY2D as laid out in cuda.h."""
    _fields_ = [("srcXInBytes", c_sz), ("srcY", c_sz), ("srcMemoryType", ctypes.c_int), ("srcHost", c_p),
                ("srcDevice", c_u64), ("srcArray", c_p), ("srcPitch", c_sz),
                ("dstXInBytes", c_sz), ("dstY", c_sz), ("dstMemoryType", ctypes.c_int), ("dstHost", c_p),
                ("dstDevice", c_u64), ("dstArray", c_p), ("dstPitch", c_sz), ("WidthInBytes", c_sz), ("Height", c_sz)]


class Memcpy3D(ctypes.Structure):
    """CUDA_MEMCPY3D as laid out in cuda.h."""
    _fields_ = [("srcXInBytes", c_sz), ("srcY", c_sz), ("srcZ", c_sz), ("srcLOD", c_sz), ("srcMemoryType", ctypes.c_int),
                ("srcHost", c_p), ("srcDevice", c_u64), ("srcArray", c_p), ("reserved0", c_p), ("srcPitch", c_sz),
                ("srcHeight", c_sz), ("dstXInBytes", c_sz), ("dstY", c_sz), ("dstZ", c_sz), ("dstLOD", c_sz),
                ("dstMemoryType", ctypes.c_int), ("dstHost", c_p), ("dstDevice", c_u64), ("dstArray", c_p),
                ("reserved1", c_p), ("dstPitch", c_sz), ("dstHeight", c_sz), ("WidthInBytes", c_sz), ("Height", c_sz),
                ("Depth", c_sz)]


def h2d_desc(T, src, dev, width, height, depth=None, pitch=None):
    d = T(srcMemoryType=HOST_MEM, srcHost=src, srcPitch=pitch or width, dstMemoryType=DEVICE_MEM, dstDevice=dev,
          dstPitch=width, WidthInBytes=width, Height=height)
    if depth is not None:
        d.Depth, d.srcHeight, d.dstHeight = depth, height, height
    return d


def crossings(L) -> int:
    return sum(v["count"] for v in summary(L)["crossings"].values())


def test_2d_and_3d_copies_cross_byte_exact(lib):
    init(lib, h2d_pinned_gbps=0, h2d_pageable_gbps=0)
    w, h, d, pitch = 37, 5, 3, 64
    data = os.urandom(pitch * h * d)
    src, _keep = host(lib, len(data), False, data)
    rows = [data[(z * h + y) * pitch:(z * h + y) * pitch + w] for z in range(d) for y in range(h)]
    dev2 = lib.ccbemu_fake_alloc(w * h, DEVICE)
    desc2 = h2d_desc(Memcpy2D, src, dev2, w, h, pitch=pitch)
    assert lib.cuMemcpy2D_v2(ctypes.byref(desc2)) == 0
    assert ctypes.string_at(dev2, w * h) == b"".join(rows[:h])
    dev3 = lib.ccbemu_fake_alloc(w * h * d, DEVICE)
    desc3 = h2d_desc(Memcpy3D, src, dev3, w, h, depth=d, pitch=pitch)
    assert lib.cuMemcpy3D_v2(ctypes.byref(desc3)) == 0
    assert ctypes.string_at(dev3, w * h * d) == b"".join(rows)
    assert summary(lib)["crossings"]["h2d_pageable"]["bytes"] == w * h + w * h * d


HUGE = 1 << 62


@pytest.mark.parametrize("shape", [
    dict(kind="2d", width=4, height=HUGE),                # width * height wraps
    dict(kind="2d", width=1, height=3, pitch=1 << 63),    # the last row's offset wraps
    dict(kind="3d", width=1, height=HUGE, depth=8),       # height * depth wraps
    dict(kind="3d", width=2, height=1 << 31, depth=1 << 31),  # width * height * depth wraps
    dict(kind="3d", width=1, height=2, depth=2, pitch=1 << 63),  # rows fit, their offsets do not
])
def test_descriptor_sizes_that_overflow_are_invalid_not_truncated(lib, shape):
    """A descriptor whose sizes do not fit in size_t is CUDA_ERROR_INVALID_VALUE, before any byte moves."""
    init(lib)
    src, _keep = host(lib, 64, False, os.urandom(64))
    dev = lib.ccbemu_fake_alloc(64, DEVICE)
    T, call = (Memcpy2D, lib.cuMemcpy2D_v2) if shape["kind"] == "2d" else (Memcpy3D, lib.cuMemcpy3D_v2)
    desc = h2d_desc(T, src, dev, shape["width"], shape["height"], shape.get("depth"), shape.get("pitch"))
    assert call(ctypes.byref(desc)) == 1  # CUDA_ERROR_INVALID_VALUE
    assert crossings(lib) == 0


def test_batch_whose_sizes_overflow_is_invalid(lib):
    init(lib)
    src, _keep = host(lib, 64, False, os.urandom(64))
    dev = lib.ccbemu_fake_alloc(64, DEVICE)
    lib.cuMemcpyBatchAsync_v2.argtypes = [c_p, c_p, c_p, c_sz, c_p, c_p, c_sz, c_p]
    dsts, srcs = (c_u64 * 2)(dev, dev), (c_u64 * 2)(src, src)
    # a valid batch first: it crosses only if the emulator is on, so a passthrough (which would hand
    # the bad batches below to the fake driver) fails here instead of reading past the arrays
    sizes = (c_sz * 2)(16, 48)
    assert lib.cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 2, None, None, 0, None) == 0
    assert crossings(lib) == 1
    sizes = (c_sz * 2)(1 << 63, 1 << 63)  # each fits; their sum does not
    assert lib.cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 2, None, None, 0, None) == 1
    assert lib.cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 1 << 60, None, None, 0, None) == 1  # the span table itself
    assert crossings(lib) == 1


NUMERIC = [k for k in profiles.PARAMS]


@pytest.mark.parametrize("key", NUMERIC)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300", "-1e300", "-1"])
def test_values_that_are_not_finite_or_in_range_are_refused_naming_key_and_value(lib, key, value):
    with pytest.raises(ValueError, match=rf"{key} must be .* got '{value}'"):
        init(lib, **{key: value})


WHOLE = ("emulate", "refuse_host_register", "lanes", "chunk_bytes")


def test_whole_number_parameters_refuse_fractions(lib):
    for key, value in (("lanes", 2.5), ("chunk_bytes", 65536.5), ("emulate", 0.5), ("refuse_host_register", 0.1)):
        with pytest.raises(ValueError, match=f"{key} must be a whole number"):
            init(lib, **{key: value})


@pytest.mark.parametrize("key", NUMERIC)
def test_c_parser_ranges_agree_with_the_python_table(lib, key):
    """The C parser accepts each bound of profiles.RANGES, refuses the next value outside it, and
    takes a fraction exactly where profiles.WHOLE does not list the key."""
    ranges = getattr(profiles, "RANGES", None)
    if ranges is None:
        pytest.skip("pending: emulate/profiles.py has no RANGES table next to PARAMS yet")
    whole = getattr(profiles, "WHOLE", WHOLE)
    assert set(ranges) == set(profiles.PARAMS)
    lo, hi = (float(x) for x in ranges[key])
    step = 1.0 if key in whole else max(abs(lo), abs(hi), 1.0) * 1e-6  # the next value the parser could accept
    for inside in (lo, hi) if key in whole else (lo, hi, lo + 0.5):  # every range here is wider than 0.5
        init(lib, **{key: repr(inside)})  # accepted: no ValueError
    for outside in (lo - step, hi + step):
        with pytest.raises(ValueError, match=key):
            init(lib, **{key: repr(outside)})
    if key in whole:
        with pytest.raises(ValueError, match=f"{key} must be a whole number"):
            init(lib, **{key: repr(lo + 0.5)})


def test_emulator_refuses_to_start_on_a_bad_profile_value(tmp_path):
    """Preloaded with a configuration holding NaN, the first hooked call ends the program with the reason."""
    import subprocess
    import sys

    cfg = tmp_path / "emu.conf"
    cfg.write_text("profile=bad\nemulate=1\nh2d_toll_us=nan\n")
    code = f"import ctypes; ctypes.CDLL({launcher.library()!r}).cuCtxSynchronize()"
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CCBRIDGE_EMU_CONFIG": str(cfg)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 70
    assert "bad configuration" in r.stderr and "h2d_toll_us" in r.stderr and "'nan'" in r.stderr


@pytest.mark.parametrize("case", [
    # pinned D2H: the one wait for the stream and chunk 0 fails with chunks 0, 1 queued behind 20 ms of the stream's work
    dict(dir="d2h", pinned=True, fail="cuEventSynchronize", nth=1, busy_us=20000),
    # pinned D2H: the 3rd event wait (chunk 2's) fails with chunks 2, 3 issued
    dict(dir="d2h", pinned=True, fail="cuEventSynchronize", nth=3),
    # pageable D2H: the channel stream cannot wait for the copy's place: nothing issued
    dict(dir="d2h", pinned=False, fail="cuStreamWaitEvent", nth=1, busy_us=20000),
    # pageable H2D: the driver's copy is refused
    dict(dir="h2d", pinned=False, fail="cuMemcpyHtoDAsync_v2", nth=1),
    # pageable D2H: the driver's copy is refused, queued behind 20 ms of the stream's work
    dict(dir="d2h", pinned=False, fail="cuMemcpyDtoHAsync_v2", nth=1, busy_us=20000),
    # pageable D2H: the wait for its landing fails
    dict(dir="d2h", pinned=False, fail="cuEventSynchronize", nth=1, busy_us=20000),
])
def test_a_failed_crossing_returns_only_once_its_copies_are_done(lib, case):
    """An error mid-crossing must not hand the caller's buffers back with copies still in flight."""
    init(lib, chunk_bytes=4096, lanes=2)
    n = 5 * 4096
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    buf, _keep = host(lib, n, case["pinned"], os.urandom(n))
    s = lib.ccbemu_fake_stream()
    assert lib.cuMemcpyHtoDAsync_v2(dev, buf, 64, s) == 0  # the channel exists before the count starts
    before = lib.ccbemu_fake_unwaited()  # earlier tests' passthrough copies on their own streams
    busy(lib, s, case.get("busy_us", 0))
    lib.ccbemu_fake_fail(case["fail"].encode(), case["nth"])
    rc = (lib.cuMemcpyHtoDAsync_v2(dev, buf, n, s) if case["dir"] == "h2d" else lib.cuMemcpyDtoHAsync_v2(buf, dev, n, s))
    lib.ccbemu_fake_fail(b"", 0)
    assert rc == 999  # the injected CUDA_ERROR_UNKNOWN
    assert lib.ccbemu_fake_unwaited() == before


def test_trace_write_failures_are_reported_not_lost(lib, tmp_path, capfd):
    """A trace on a full disk (/dev/full) or in a missing directory says so on stderr."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    prefix = tmp_path / "t"
    csv, summary_path = (f"{prefix}.{os.getpid()}.{ext}" for ext in ("csv", "summary.json"))
    os.symlink("/dev/full", csv)
    os.symlink("/dev/full", summary_path)
    init(lib, trace=str(prefix))
    n = 4096
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    src, _k = host(lib, n, True, os.urandom(n))
    assert lib.cuMemcpyHtoDAsync_v2(dev, src, n, None) == 0
    lib.ccbemu_trace_flush()
    err = capfd.readouterr().err
    assert f"ccbridge emulator: cannot write trace summary {summary_path}: {os.strerror(28)}" in err  # ENOSPC
    assert f"ccbridge emulator: cannot write trace {csv}: {os.strerror(28)}" in err
    missing = tmp_path / "no" / "such" / "t"
    init(lib, trace=str(missing))
    lib.ccbemu_trace_flush()
    err = capfd.readouterr().err
    assert f"cannot write trace summary {missing}.{os.getpid()}.summary.json: {os.strerror(2)}" in err  # ENOENT


def coverage_of(L) -> dict:
    buf = ctypes.create_string_buffer(1 << 18)
    assert L.ccbemu_coverage(buf, len(buf)) == 0
    return json.loads(buf.value)["symbols"]


def test_cu_ctx_synchronize_v2_is_hooked_and_pays_a_round_trip(lib):
    """cudart 13 resolves cuCtxSynchronize at version 13000: the driver hands out cuCtxSynchronize_v2."""
    init(lib, sync_toll_us=2000)
    pfn = c_p()
    assert lib.cuGetProcAddress_v2(b"cuCtxSynchronize", ctypes.byref(pfn), 13000, 0, None) == 0
    assert pfn.value == lib.ccbemu_lookup(b"cuCtxSynchronize_v2")
    sync = ctypes.CFUNCTYPE(ctypes.c_int, c_p)(pfn.value)
    busy(lib, None, 0)
    t = time.perf_counter()
    assert sync(None) == 0
    assert time.perf_counter() - t >= 2e-3  # work was submitted: one round trip
    assert summary(lib)["calls"]["cuCtxSynchronize_v2"] == 1


def test_coverage_classifies_every_resolved_symbol(lib):
    """cuGetProcAddress_v2 and dlsym resolutions are listed once each, classified, hooks with their calls."""
    init(lib, sync_toll_us=0)
    pfn = c_p()
    for name, version in ((b"cuCtxSynchronize", 13000), (b"cuMemcpyHtoDAsync", 12000), (b"cuEventQuery", 12000),
                          (b"cuGetExportTable", 12000), (b"cuMemcpyHtoD", 3000)):
        assert lib.cuGetProcAddress_v2(name, ctypes.byref(pfn), version, 0, None) == 0, name
    assert lib.dlsym(lib._handle, b"cuLaunchKernel") == lib.ccbemu_lookup(b"cuLaunchKernel")
    busy(lib, None, 0)
    busy(lib, None, 0)
    cov = coverage_of(lib)
    assert cov["cuCtxSynchronize_v2"] == {"class": "hooked", "calls": 0, "via": ["cuGetProcAddress"]}
    assert cov["cuMemcpyHtoDAsync_v2"]["class"] == "hooked"
    assert cov["cuLaunchKernel"] == {"class": "hooked", "calls": 2, "via": ["dlsym", "called"]}
    assert cov["cuEventQuery"] == {"class": "harmless", "calls": None, "via": ["cuGetProcAddress"]}
    assert cov["cuGetExportTable"]["class"] == "unclassified"
    # CUDA 2's cuMemcpyHtoD (32-bit size) has no hook: a copy that would escape emulation
    assert cov["cuMemcpyHtoD"] == {"class": "MISSING", "calls": None, "via": ["cuGetProcAddress"]}


def test_coverage_report_merges_processes_and_renders(tmp_path):
    from ccbridge.emulate import coverage

    for pid, calls in ((11, 2), (12, 3)):
        (tmp_path / f"c.{pid}.coverage.json").write_text(json.dumps({"schema": 1, "pid": pid, "profile": "b300", "symbols": {
            "cuLaunchKernel": {"class": "hooked", "calls": calls, "via": ["called"]},
            "cuMemcpyHtoD": {"class": "MISSING", "calls": None, "via": ["cuGetProcAddress"]}}}))
    rep = coverage.merge(str(tmp_path / "c"))
    assert rep["processes"] == 2 and rep["symbols"]["cuLaunchKernel"]["calls"] == 5
    assert coverage.missing(rep) == ["cuMemcpyHtoD"]
    text = coverage.render(rep)
    assert text.index("cuMemcpyHtoD") < text.index("cuLaunchKernel")  # MISSING first
    (tmp_path / "c.13.coverage.json").write_text('{"schema": 99, "symbols": {}}')
    with pytest.raises(coverage.ResultFileError, match="coverage schema 99"):
        coverage.merge(str(tmp_path / "c"))


def test_array_copies_cross_the_channel_byte_exact(lib):
    init(lib, h2d_toll_us=3000, d2h_toll_us=0, h2d_pinned_gbps=0, h2d_pageable_gbps=0)
    n = 70000
    data = os.urandom(n)
    arr = lib.ccbemu_fake_alloc(n + 16, DEVICE)
    src, _k1 = host(lib, n, False, data)
    dst, _k2 = host(lib, n, True)
    for name in ("cuMemcpyHtoA_v2", "cuMemcpyAtoH_v2"):
        getattr(lib, name).argtypes = [c_p, c_p, c_sz, c_sz] if "AtoH" in name else [c_p, c_sz, c_p, c_sz]
    lib.cuMemcpyHtoAAsync_v2.argtypes = [c_p, c_sz, c_p, c_sz, c_p]
    assert timed(lib.cuMemcpyHtoA_v2, arr, 16, src, n) >= 3e-3  # the H2D toll: a crossing
    assert lib.cuMemcpyAtoH_v2(dst, arr, 16, n) == 0
    assert ctypes.string_at(dst, n) == data
    assert lib.cuMemcpyHtoAAsync_v2(arr, 0, src, 8, lib.ccbemu_fake_stream()) == 0
    sm = summary(lib)["crossings"]
    assert sm["h2d_pageable"]["count"] == 2 and sm["h2d_pageable"]["bytes"] == n + 8
    assert sm["d2h_pinned"]["count"] == 1 and sm["d2h_pinned"]["cipher_bytes"] == n


def test_a_host_function_is_a_launch_and_holds_its_stream_one_round_trip(lib):
    init(lib, launch_toll_us=1000, sync_toll_us=5000)
    HOSTFN = ctypes.CFUNCTYPE(None, c_p)
    ran = []
    fn = HOSTFN(lambda user: ran.append(time.perf_counter()))
    lib.cuLaunchHostFunc.argtypes = [c_p, HOSTFN, c_p]
    s = lib.ccbemu_fake_stream()
    t = time.perf_counter()
    assert lib.cuLaunchHostFunc(s, fn, None) == 0
    took = time.perf_counter() - t
    assert ran, "the function ran"
    # the fake runs it inline: the call took the function, then one round trip, then the launch toll
    assert took >= 5e-3 + 1e-3
    lib.ccbemu_fake_capture(s, 1)
    t = time.perf_counter()
    assert lib.cuLaunchHostFunc(s, fn, None) == 0  # captured: passed through, not run, no toll
    assert time.perf_counter() - t < 1e-3 and len(ran) == 1
    lib.ccbemu_fake_capture(s, 0)


def capture_graph(L, s, copies):
    """Capture copies (callables of the stream) on s, instantiate; the executable graph."""
    L.ccbemu_fake_capture(s, 1)
    for copy in copies:
        t = time.perf_counter()
        assert copy(s) == 0
        assert time.perf_counter() - t < 0.05  # recorded into the graph: not paid now
    L.ccbemu_fake_capture(s, 0)
    exe = c_p()
    L.cuGraphInstantiateWithFlags.argtypes = [ctypes.POINTER(c_p), c_p, c_u64]
    assert L.cuGraphInstantiateWithFlags(ctypes.byref(exe), L.ccbemu_fake_graph(s), 0) == 0
    return exe


def test_copies_captured_into_a_graph_are_paid_at_every_launch(lib):
    init(lib, h2d_pinned_gbps=1, d2h_pinned_gbps=1, h2d_toll_us=2000, d2h_toll_us=2000, sync_toll_us=0)
    n = 4 << 20
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    src, _ = host(lib, n, True, os.urandom(n))
    dst, _ = host(lib, n, True)
    s = lib.ccbemu_fake_stream()
    exe = capture_graph(lib, s, [lambda st: lib.cuMemcpyHtoDAsync_v2(dev, src, n, st),
                                 lambda st: lib.cuMemcpyDtoHAsync_v2(dst, dev, n, st)])
    assert crossings(lib) == 0
    lib.cuGraphLaunch.argtypes = [c_p, c_p]
    one = n / 1e9 + 2e-3
    for _ in range(2):
        assert 2 * one <= timed(lib.cuGraphLaunch, exe, s) < 2 * one + 0.05  # both crossings, each launch
    sm = summary(lib)["crossings"]
    assert sm["h2d_pinned"]["count"] == 2 and sm["d2h_pinned"]["count"] == 2 and sm["d2h_pinned"]["bytes"] == 2 * n
    lib.cuGraphExecDestroy.argtypes = [c_p]
    assert lib.cuGraphExecDestroy(exe) == 0


def test_a_graph_captured_while_emulation_is_paused_still_pays_its_copies_when_launched_emulating(lib, monkeypatch):
    """What a graph holds does not depend on the pause: only its launches do (paused: free; emulating: charged)."""
    from ccbridge.emulate import interposer

    init(lib, h2d_pinned_gbps=0, d2h_pinned_gbps=0, h2d_toll_us=0, d2h_toll_us=3000, sync_toll_us=0)
    monkeypatch.setenv(interposer.LIB_ENV, lib._name)
    dev = lib.ccbemu_fake_alloc(64, DEVICE)
    dst, _ = host(lib, 64, True)
    s = lib.ccbemu_fake_stream()
    lib.cuGraphLaunch.argtypes = [c_p, c_p]
    with interposer.emulation_paused():
        exe = capture_graph(lib, s, [lambda st: lib.cuMemcpyDtoHAsync_v2(dst, dev, 32, st)])
        assert timed(lib.cuGraphLaunch, exe, s) < 0.002
    assert timed(lib.cuGraphLaunch, exe, s) >= 0.003
    assert summary(lib)["crossings"]["d2h_pinned"]["count"] == 1


def test_a_refused_launch_that_paid_its_toll_keeps_its_trace_line(lib, tmp_path):
    prefix = tmp_path / "r"
    init(lib, trace=str(prefix), launch_toll_us=2000, sync_toll_us=0)
    s = lib.ccbemu_fake_stream()
    lib.ccbemu_fake_fail(b"cuLaunchKernel", 1)
    try:
        t = time.perf_counter()
        assert lib.cuLaunchKernel(None, 0, 1, 1, 1, 1, 1, 0, s, None, None) == 999
        assert time.perf_counter() - t >= 0.002  # the submission crossed before the driver refused it
    finally:
        lib.ccbemu_fake_fail(b"", 0)
    lib.ccbemu_trace_flush()
    rows = list(csv.DictReader(l for l in Path(f"{prefix}.{os.getpid()}.csv").read_text().splitlines()
                               if not l.startswith("#")))
    launches = [r for r in rows if r["kind"] == "launch"]
    assert len(launches) == 1 and launches[0]["rc"] == "999" and int(launches[0]["toll_ns"]) >= 2_000_000


def test_a_graph_handle_captured_again_does_not_inherit_the_old_copies(lib):
    """A capture that was never instantiated (it failed, or was abandoned) leaves its copies noted
    under its graph's handle; a new capture at that handle must not pay them at its launches."""
    init(lib, h2d_pinned_gbps=0.25, h2d_toll_us=0, d2h_toll_us=0, sync_toll_us=0)
    n = 8 << 20
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    src, _ = host(lib, n, True, os.urandom(n))
    s = lib.ccbemu_fake_stream()
    lib.ccbemu_fake_capture(s, 1)
    assert lib.cuMemcpyHtoDAsync_v2(dev, src, n, s) == 0  # noted, never instantiated
    lib.ccbemu_fake_capture(s, 0)
    lib.ccbemu_fake_capture(s, 2)  # the same handle again, a new capture
    assert lib.cuMemcpyHtoDAsync_v2(dev, src, 4096, s) == 0
    lib.ccbemu_fake_capture(s, 0)
    exe = c_p()
    lib.cuGraphInstantiateWithFlags.argtypes = [ctypes.POINTER(c_p), c_p, c_u64]
    assert lib.cuGraphInstantiateWithFlags(ctypes.byref(exe), lib.ccbemu_fake_graph(s), 0) == 0
    lib.cuGraphLaunch.argtypes = [c_p, c_p]
    assert timed(lib.cuGraphLaunch, exe, s) < n / 0.25e9 / 2  # 4 KiB paid, not the old 8 MiB (34 ms)
    assert summary(lib)["crossings"]["h2d_pinned"]["bytes"] == 4096


def test_a_graph_readback_waits_for_its_stream_and_a_graph_upload_does_not(lib):
    init(lib, h2d_toll_us=0, d2h_toll_us=0, sync_toll_us=0, h2d_pinned_gbps=0, d2h_pinned_gbps=0)
    n = 4096
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    buf, _ = host(lib, n, True, os.urandom(n))
    s = lib.ccbemu_fake_stream()
    up = capture_graph(lib, s, [lambda st: lib.cuMemcpyHtoDAsync_v2(dev, buf, n, st)])
    down = capture_graph(lib, s, [lambda st: lib.cuMemcpyDtoHAsync_v2(buf, dev, n, st)])
    none = capture_graph(lib, s, [])
    lib.cuGraphLaunch.argtypes = [c_p, c_p]
    busy(lib, s, 30000)
    assert timed(lib.cuGraphLaunch, up, s) < 0.01  # staged at submission: no wait for the queued work
    assert timed(lib.cuGraphLaunch, none, s) < 0.01
    assert timed(lib.cuGraphLaunch, down, s) > 0.02  # returns once the stream has reached the readback
    assert crossings(lib) == 2


def in_thread(fn, *args):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("v", fn(*args)))
    t.start(); t.join()
    return out["v"]


def test_another_threads_readback_takes_this_threads_round_trip(lib):
    """Main thread launches, a drain thread reads back 32 bytes from its own stream: the main
    thread's synchronize still pays its round trip (a per-process flag let the drain take it)."""
    init(lib, launch_toll_us=0, sync_toll_us=5000, d2h_toll_us=0, h2d_toll_us=0)
    s_main, s_drain = lib.ccbemu_fake_stream(), lib.ccbemu_fake_stream()
    dev = lib.ccbemu_fake_alloc(64, DEVICE)
    dst, _ = host(lib, 64, True)
    busy(lib, s_main, 0)
    assert in_thread(timed, lib.cuMemcpyDtoHAsync_v2, dst, dev, 32, s_drain) >= 5e-3  # its own round trip
    assert timed(lib.cuStreamSynchronize, s_main) >= 5e-3, "the main thread's synchronize paid no round trip"


def test_a_graph_upload_is_not_counted_twice_in_the_trace(lib, tmp_path):
    """The H2D charge of a graph launch is a crossing row; the launch row starts after it."""
    init(lib, trace=str(tmp_path / "g"), h2d_pinned_gbps=1, h2d_toll_us=0, d2h_toll_us=0, sync_toll_us=0)
    n = 4 << 20
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    src, _ = host(lib, n, True, os.urandom(n))
    s = lib.ccbemu_fake_stream()
    exe = capture_graph(lib, s, [lambda st: lib.cuMemcpyHtoDAsync_v2(dev, src, n, st)])
    lib.cuGraphLaunch.argtypes = [c_p, c_p]
    wall = timed(lib.cuGraphLaunch, exe, s)
    lib.ccbemu_trace_flush()
    rows = [r for r in csv.DictReader(l for l in Path(f"{tmp_path}/g.{os.getpid()}.csv").read_text().splitlines()
                                      if not l.startswith("#")) if r["api"] == "cuGraphLaunch"]
    in_call = sum(int(r["t_return_ns"]) - int(r["t_enter_ns"]) for r in rows) / 1e9
    assert in_call < 1.2 * wall, f"rows sum to {in_call:.4f}s of in-call time for a {wall:.4f}s call"


def test_the_framework_loops_pay_each_toll_once_per_iteration(lib):
    """The hooked calls one iteration of each calibrated framework loop makes through torch and cudart 13
    (a kernel launch for x.add_(1); cuCtxSynchronize_v2 for torch.cuda.synchronize(); a 32-byte copy from
    a side stream into the caching host allocator's pinned block for .to("cpu", non_blocking=True); the
    allocator's event record and query are not hooked) pay the profile's ledger once: pipelined launch =
    launch toll; launch + synchronize = launch toll + one round trip; 32-byte D2H + synchronize = D2H
    toll + one round trip (the copy's), the synchronize nothing. Tolls of distinct sizes, so that any
    toll paid twice, or at the wrong call, shows (bench/framework_ledger.py checks the same on a GPU)."""
    init(lib, launch_toll_us=1000, sync_toll_us=4000, d2h_toll_us=2000, h2d_toll_us=0)
    lib.cuCtxSynchronize_v2.argtypes = [c_p]
    side = lib.ccbemu_fake_stream()
    dev = lib.ccbemu_fake_alloc(64, DEVICE)
    out, _ = host(lib, 64, True)  # torch's pinned output tensor (the caching host allocator's block)
    # Any toll paid twice or at the wrong call adds >= 1 ms; the fastest of k iterations is the one
    # a loaded CI machine disturbed least (its mean once overshot a 0.8 ms slack by 0.02 ms).
    k, slack = 10, 0.9e-3

    def per_iteration(body):
        times = []
        for _ in range(k):
            t = time.perf_counter()
            body()
            times.append(time.perf_counter() - t)
        return min(times)

    sync = lambda: lib.cuCtxSynchronize_v2(None) == 0 or pytest.fail("cuCtxSynchronize_v2")
    busy(lib, None, 0)
    sync()  # start clean: nothing submitted since the last round trip
    assert 1e-3 <= per_iteration(lambda: busy(lib, None, 0)) < 1e-3 + slack  # pipelined: the launch toll alone
    assert timed(lib.cuCtxSynchronize_v2, None) >= 4e-3  # the loop's closing synchronize: one round trip
    assert 5e-3 <= per_iteration(lambda: (busy(lib, None, 0), sync())) < 5e-3 + slack

    def readback():
        assert lib.cuMemcpyAsync(out, dev, 32, side) == 0
        sync()

    assert 6e-3 <= per_iteration(readback) < 6e-3 + slack
    assert lib.cuMemcpyAsync(out, dev, 32, side) == 0
    assert timed(lib.cuCtxSynchronize_v2, None) < 4e-3 - slack  # the copy was the round trip
    calls = summary(lib)["calls"]
    assert calls["cuMemcpyAsync"] == k + 1 and calls["cuLaunchKernel"] == 2 * k + 1


@pytest.mark.parametrize("pinned", [True, False])
def test_a_d2h_crossing_makes_the_host_wait_once_for_its_stream_and_its_first_bytes(lib, pinned):
    """The channel's copies wait on the GPU for the copy's place in its stream, so the host waits once per
    chunk: the first wait covers the queued work too. (A host wait for the place, then one for the copies
    issued after it, cost a second wake-up and submission: +11 us per 32-byte D2H on an H200.) A pageable D2H
    is the driver's blocking copy, which waits for the stream, then an event wait on a copy already landed."""
    init(lib, chunk_bytes=4096, lanes=2, d2h_toll_us=0, sync_toll_us=0, d2h_pinned_gbps=0, d2h_pageable_gbps=0)
    lib.cuMemcpy2DAsync_v2.argtypes = [c_p, c_p]
    s = lib.ccbemu_fake_stream()
    n = 3 * 4096 + 5
    data = os.urandom(n)
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    ctypes.memmove(dev, data, n)
    dst, _keep = host(lib, n, pinned)
    w, h = 37, 5
    desc = Memcpy2D(srcMemoryType=DEVICE_MEM, srcDevice=dev, srcPitch=w, dstMemoryType=HOST_MEM, dstHost=dst,
                    dstPitch=w, WidthInBytes=w, Height=h)
    assert lib.cuMemcpyDtoHAsync_v2(dst, dev, 32, s) == 0  # the channel and its native floor exist before the counts
    for name, stream, call, nbytes, waits in (
        ("32 bytes", s, lambda: lib.cuMemcpyDtoHAsync_v2(dst, dev, 32, s), 32, 1 if pinned else 2),
        # pinned: one wait per chunk as it lands; pageable: the driver's blocking copy, then its event's
        ("4 chunks", s, lambda: lib.cuMemcpyDtoHAsync_v2(dst, dev, n, s), n, 4 if pinned else 2),
        ("blocking API", None, lambda: lib.cuMemcpyDtoH_v2(dst, dev, n), n, 4 if pinned else 2),
        ("generic", s, lambda: lib.cuMemcpyAsync(dst, dev, 32, s), 32, 1 if pinned else 2),
        ("2D", s, lambda: lib.cuMemcpy2DAsync_v2(ctypes.byref(desc), s), w * h, 1),
    ):
        ctypes.memset(dst, 0, n)
        t0 = time.perf_counter()  # before the launch: the stream is busy 20 ms from it, not from the call
        busy(lib, stream, 20000)
        before = lib.ccbemu_fake_host_waits()
        timed(call)  # (its return code checked)
        assert lib.ccbemu_fake_host_waits() - before == waits, name
        assert time.perf_counter() - t0 >= 0.02, f"{name}: returned before the stream reached it"
        assert ctypes.string_at(dst, nbytes) == data[:nbytes], name


def test_a_d2h_on_an_idle_stream_waits_for_nothing_on_the_gpu(lib):
    """An idle non-blocking stream is at the copy's place already: the channel issues no GPU-side wait (a failure
    injected into cuStreamWaitEvent is never met); behind queued work it still waits on the GPU (and meets it),
    and so it does on the legacy default stream, idle or not (a copy there also waits for other streams)."""
    init(lib, chunk_bytes=4096, d2h_toll_us=0, sync_toll_us=0)
    dev = lib.ccbemu_fake_alloc(64, DEVICE)
    dst, _keep = host(lib, 64, True)
    s = lib.ccbemu_fake_stream()
    try:
        lib.ccbemu_fake_fail(b"cuStreamWaitEvent", 1)
        assert lib.cuMemcpyDtoHAsync_v2(dst, dev, 32, s) == 0
        busy(lib, s, 5000)
        assert lib.cuMemcpyDtoHAsync_v2(dst, dev, 32, s) == 999  # the injected error: it waited on the GPU
        lib.ccbemu_fake_fail(b"cuStreamWaitEvent", 1)
        assert lib.cuMemcpyDtoHAsync_v2(dst, dev, 32, None) == 999  # the legacy stream, idle: still the GPU wait
    finally:
        lib.ccbemu_fake_fail(b"", 0)


def test_d2h_tolls_start_where_a_native_copy_would_have_ended(lib):
    """The channel's own work (here a fake copy holding the channel stream 4 ms where the paced bytes take 1 ms)
    is inside the tolls, not on top: 1 ms paced + 5 ms toll = 6 ms (tolls after the channel's work: 9 ms).
    Never less than the paced bytes plus the toll."""
    init(lib, chunk_bytes=8192, d2h_pinned_gbps=0.004096, d2h_toll_us=5000, sync_toll_us=0)
    n = 4096
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    dst, _keep = host(lib, n, True)
    s = lib.ccbemu_fake_stream()
    assert lib.cuMemcpyDtoHAsync_v2(dst, dev, 32, s) == 0  # the channel's native floor, measured at full speed
    lib.ccbemu_fake_copy_gbps(0.001024)  # 4096 bytes hold the channel stream 4 ms
    try:
        took = min(timed(lib.cuMemcpyDtoHAsync_v2, dst, dev, n, s) for _ in range(3))
    finally:
        lib.ccbemu_fake_copy_gbps(0)
    assert 0.006 <= took < 0.0085, took


def test_d2h_tolls_start_at_the_native_calls_return_and_its_completion_lies_inside_them(lib):
    """The channel's floor is a native small D2H's call, not its completion: natively the copy completes while
    its caller goes on (through torch, inside the Python before its synchronize); under CC the call blocks for
    the round trip, the completion within it. Here every copy holds its stream 2 ms, the floor measurement's
    too: a 5 ms toll ends the crossing 5 ms after its call (starting it after copy + host wait: 7 ms)."""
    init(lib, d2h_toll_us=5000, sync_toll_us=0, d2h_pinned_gbps=0)
    dev = lib.ccbemu_fake_alloc(64, DEVICE)
    data = os.urandom(32)
    ctypes.memmove(dev, data, 32)
    dst, _keep = host(lib, 64, True)
    s = lib.ccbemu_fake_stream()
    lib.ccbemu_fake_copy_gbps(32 / 2e6)  # 32 bytes hold the stream 2 ms
    try:
        first = timed(lib.cuMemcpyDtoHAsync_v2, dst, dev, 32, s)  # + the floor's 12 copies: >= 24 ms
        took = min(timed(lib.cuMemcpyDtoHAsync_v2, dst, dev, 32, s) for _ in range(3))
    finally:
        lib.ccbemu_fake_copy_gbps(0)
    assert first >= 0.024 and 0.005 <= took < 0.0065, (first, took)
    assert ctypes.string_at(dst, 32) == data


def test_paused_emulation_passes_calls_through_and_resumes(lib, monkeypatch):
    """interposer.emulation_paused() (calibrate's paired framework rows): inside, no launch toll, no D2H round
    trip, bytes still exact; after, the tolls again; it answers whether it was emulating, and under the
    passthrough profile (emulate 0) it changes nothing. Outside `ccbridge run` it is a clear error."""
    from ccbridge.emulate import interposer

    init(lib, launch_toll_us=3000, sync_toll_us=4000, d2h_toll_us=0, d2h_pinned_gbps=0)
    monkeypatch.setenv(interposer.LIB_ENV, lib._name)
    s = lib.ccbemu_fake_stream()
    dev = lib.ccbemu_fake_alloc(64, DEVICE)
    dst, _keep = host(lib, 64, True)

    def round_trip():
        data = os.urandom(32)
        ctypes.memmove(dev, data, 32)
        t = time.perf_counter()
        busy(lib, s, 0)
        assert lib.cuMemcpyDtoHAsync_v2(dst, dev, 32, s) == 0
        took = time.perf_counter() - t
        assert ctypes.string_at(dst, 32) == data
        return took

    assert round_trip() >= 0.007  # launch toll 3 ms + the D2H's round trip 4 ms
    assert interposer.emulating() is True
    with interposer.emulation_paused() as was:
        assert was is True and round_trip() < 0.003
        assert interposer.emulating() is False
        with interposer.emulation_paused() as again:  # nested: already paused, and stays so after
            assert again is False
        assert round_trip() < 0.003
    assert round_trip() >= 0.007
    assert interposer.emulating() is True  # (asking does not pause it)
    init(lib, emulate=0)
    with interposer.emulation_paused() as was:
        assert was is False
    assert interposer.emulating() is False
    monkeypatch.delenv(interposer.LIB_ENV)
    assert interposer.emulating() is False
    with pytest.raises(interposer.EmulatorError, match="works inside `ccbridge run --profile P`"):
        with interposer.emulation_paused():
            pass
    with interposer.emulation_paused(required=False) as was:
        assert was is False


def test_the_framework_loops_pair_emulated_and_paused_samples_in_one_process(lib, monkeypatch):
    """framework.paired_us: under an emulating interposer each sample has a twin taken with emulation paused,
    which goes first alternating; the twins pay no toll. Outside `ccbridge run`: one loop, no twins."""
    from ccbridge.emulate import interposer
    from ccbridge.probe import framework

    init(lib, launch_toll_us=2000, sync_toll_us=0)
    s = lib.ccbemu_fake_stream()
    order = []

    def body():
        busy(lib, s, 0)

    def finish():
        knob = interposer.switch("ccbemu_emulate_pause", True, "")
        order.append(knob(1))  # was it emulating? (a pause held and released: as it was, after)
        knob(0)

    monkeypatch.setenv(interposer.LIB_ENV, lib._name)
    on, off = framework.paired_us(body, finish, 4, 4)
    assert len(on) == len(off) == 4
    assert min(on) >= 2000 and max(off) < 1000, (on, off)  # us per iteration
    timed_states = order[1::2]  # each sample follows its untimed warm-up, one finish each
    assert timed_states == [1, 0, 0, 1, 1, 0, 0, 1], order
    monkeypatch.delenv(interposer.LIB_ENV)
    on, off = framework.paired_us(body, lambda: None, 4, 2)
    assert off is None and len(on) == 2


def test_an_idle_stream_d2h_pays_its_toll_from_its_call_not_after_the_emulators_own_work(lib):
    """On an idle stream the copy's place is reached when it is called: the emulator's own work before the
    transfer (here a stream query made to take 3 ms) lies inside the 5 ms toll, not on top (8 ms); a crossing
    that finds the channel held still starts its toll only once the channel is free (two threads: >= 10 ms)."""
    init(lib, d2h_toll_us=5000, sync_toll_us=0, d2h_pinned_gbps=0)
    dev = lib.ccbemu_fake_alloc(64, DEVICE)
    dst, _keep = host(lib, 64, True)
    s = lib.ccbemu_fake_stream()
    assert lib.cuMemcpyDtoHAsync_v2(dst, dev, 32, s) == 0  # the channel and its native floor
    lib.ccbemu_fake_query_ns(3_000_000)
    try:
        took = min(timed(lib.cuMemcpyDtoHAsync_v2, dst, dev, 32, s) for _ in range(3))
    finally:
        lib.ccbemu_fake_query_ns(0)
    assert 0.005 <= took < 0.0075, took
    s2 = lib.ccbemu_fake_stream()
    with ThreadPoolExecutor(2) as pool:
        t = time.perf_counter()
        rcs = list(pool.map(lambda st: lib.cuMemcpyDtoHAsync_v2(dst, dev, 32, st), (s, s2)))
        both = time.perf_counter() - t
    assert rcs == [0, 0] and both >= 0.010, both


def test_a_d2h_behind_a_busy_stream_reports_its_stream_wait_and_paces_from_it(lib, tmp_path):
    """The host no longer wakes when the stream reaches the copy; the channel's timing events say when it did.
    The trace's stream wait is the queued work, not the copy's own GPU time after it, and the pacing starts
    there: 30 ms queued + 42 ms of bytes at the channel's 0.2 GB/s, the fake's 21 ms copy inside the pacing
    (pacing from the host's wake-up would be 93 ms)."""
    prefix = tmp_path / "t"
    init(lib, trace=str(prefix), d2h_pinned_gbps=0.2, d2h_toll_us=0, sync_toll_us=0, chunk_bytes=8 << 20)
    n = 8 << 20
    data = os.urandom(n)
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    ctypes.memmove(dev, data, n)
    dst, _ = host(lib, n, True)
    s = lib.ccbemu_fake_stream()
    lib.ccbemu_fake_copy_gbps(0.4)  # the channel's copy holds its stream 21 ms
    try:
        t0 = time.monotonic_ns()  # the trace's clock
        busy(lib, s, 30000)
        t1 = time.monotonic_ns()
        assert lib.cuMemcpyDtoHAsync_v2(dst, dev, n, s) == 0
    finally:
        lib.ccbemu_fake_copy_gbps(0)
    assert ctypes.string_at(dst, n) == data
    lib.ccbemu_trace_flush()
    rows = [r for r in csv.DictReader(l for l in Path(f"{prefix}.{os.getpid()}.csv").read_text().splitlines()
                                      if not l.startswith("#")) if r["api"] == "cuMemcpyDtoHAsync_v2"]
    assert len(rows) == 1
    r = {k: int(rows[0][k]) for k in ("t_enter_ns", "t_return_ns", "blocked_channel_ns", "blocked_stream_ns")}
    reached = r["t_enter_ns"] + r["blocked_channel_ns"] + r["blocked_stream_ns"]  # the stream reached the copy
    # the slack (15 ms, 18 ms) is what a loaded machine may add, short of the 21 ms a wrong reading adds
    assert t0 + 30e6 <= reached < t1 + 30e6 + 15e6, r  # from the host's wake-up: + 21 ms
    paced = n / 0.2e9 * 1e9
    assert reached + paced <= r["t_return_ns"] < reached + paced + 18e6, r


def test_a_d2h_whose_stream_wait_cannot_be_timed_still_crosses_and_says_so(lib, capfd):
    """cuEventElapsedTime failing is not the caller's error (the bytes are in): the crossing succeeds, its
    stream wait taken to end when its bytes landed (pacing later, never earlier), with one line on stderr."""
    init(lib, d2h_toll_us=0, sync_toll_us=0)
    n = 4096
    data = os.urandom(n)
    dev = lib.ccbemu_fake_alloc(n, DEVICE)
    ctypes.memmove(dev, data, n)
    dst, _ = host(lib, n, True)
    s = lib.ccbemu_fake_stream()
    busy(lib, s, 10000)
    lib.ccbemu_fake_fail(b"cuEventElapsedTime", 1)
    assert timed(lib.cuMemcpyDtoHAsync_v2, dst, dev, n, s) >= 0.01
    lib.ccbemu_fake_fail(b"", 0)
    assert ctypes.string_at(dst, n) == data
    assert "cuEventElapsedTime failed (999)" in capfd.readouterr().err


def test_the_driver_entry_behind_a_hook_launches_without_toll_or_count(lib):
    """ccbemu_real hands ccbridge's own instruments (the %globaltimer stamp) the driver's entry point: a launch
    through it pays no emulated launch toll and is not counted as the program's call; the hook still does both."""
    init(lib, launch_toll_us=30000)
    real = lib.ccbemu_real(b"cuLaunchKernel")
    assert real and real != lib.ccbemu_lookup(b"cuLaunchKernel")
    assert lib.ccbemu_real(b"cuNoSuchCall") is None and lib.ccbemu_real(b"printf") is None
    launch = ctypes.CFUNCTYPE(ctypes.c_int, c_p, *[ctypes.c_uint] * 7, c_p, c_p, c_p)(real)
    s = lib.ccbemu_fake_stream()
    t0 = time.perf_counter()
    assert launch(None, 0, 1, 1, 1, 1, 1, 0, s, None, None) == 0
    assert time.perf_counter() - t0 < 0.015
    assert "cuLaunchKernel" not in summary(lib)["calls"]
    t0 = time.perf_counter()
    assert lib.cuLaunchKernel(None, 0, 1, 1, 1, 1, 1, 0, s, None, None) == 0
    assert time.perf_counter() - t0 >= 0.027
    assert summary(lib)["calls"]["cuLaunchKernel"] == 1


def test_the_interposer_is_preloaded_from_a_folder_with_a_space(tmp_path):
    """ld.so splits LD_PRELOAD at spaces: from such a folder the interposer is named by file and found through
    LD_LIBRARY_PATH, and a child process really loads it (not 'cannot be preloaded ... ignored', a native run
    labelled EMULATED)."""
    import subprocess
    import sys

    real = launcher.library()
    d = tmp_path / "odd dir"
    d.mkdir()
    link = d / os.path.basename(real)
    link.symlink_to(real)
    env = {"LD_PRELOAD": f"/x/a.so b.so:{link}", "LD_LIBRARY_PATH": "/y"}
    assert launcher._preload(str(link), env) == f"{link.name}:/x/a.so:b.so" and env["LD_LIBRARY_PATH"] == f"{d}:/y"
    env = {**os.environ, "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}
    env.pop("LD_PRELOAD", None)
    env["LD_PRELOAD"] = launcher._preload(str(link), env)
    r = subprocess.run([sys.executable, "-c", "print(open('/proc/self/maps').read())"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "preloaded" not in r.stderr and os.path.realpath(real) in r.stdout, r.stderr
    # a plain folder keeps the full path (a child that resets LD_LIBRARY_PATH still loads it), once; a user's entry
    # that only starts with it stays whole, and LD_LIBRARY_PATH's empty entries (the current folder) stay
    assert launcher._preload(real, {"LD_PRELOAD": f"{real} other.so:{real}.bak"}) == f"{real}:other.so:{real}.bak"
    env = {"LD_LIBRARY_PATH": "/y::/z"}
    launcher._preload(str(link), env)
    assert env["LD_LIBRARY_PATH"] == f"{d}:/y::/z"
    with pytest.raises(Exception, match="holds a ':'"):
        launcher._preload("/opt/a:b/" + os.path.basename(real), {})


def test_the_driver_account_looks_for_is_the_one_the_native_code_loads():
    """core.driver_missing() (account's refusal, run's note) asks for the library cudrv.c dlopens: one name."""
    from ccbridge.bindings import core

    src = (Path(launcher.__file__).parents[1] / "native" / "common" / "cudrv.c").read_text()
    assert f'dlopen("{core.DRIVER_SONAME}"' in src
