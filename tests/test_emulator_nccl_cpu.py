"""The multi-GPU side of the emulator on the CPU: NCCL hooks over a fake libnccl and the fake driver.

A fake libnccl (tests/fake_nccl.c, built here as libnccl.so.2) answers NCCL's public API on host buffers; the
interposer is reached the two ways programs reach NCCL: dlsym on a handle (vLLM's pynccl loads libnccl with
ctypes) and linking (torch): a small C program linked against the fake, run with the interposer preloaded.
The fake driver's streams are clocks, so the device-side charge shows as stream time a synchronize waits for,
while the call that issued the operation returns at once.
"""

import csv
import ctypes
import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ccbridge.emulate import launcher, trace
from test_emulator_cpu import DEVICE, busy, init, lib  # noqa: F401 - the fixture

HERE = Path(__file__).resolve().parent
c_p, c_sz, c_int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
INT32, FLOAT32, SUM = 2, 7, 0
TOLL_US = 30000  # 30 ms: far above the fake's few-us call costs and a loaded CI machine's jitter


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


SIGS = {
    "ncclAllReduce": [c_p, c_p, c_sz, c_int, c_int, c_p, c_p],
    "ncclReduceScatter": [c_p, c_p, c_sz, c_int, c_int, c_p, c_p],
    "ncclAllGather": [c_p, c_p, c_sz, c_int, c_p, c_p],
    "ncclBroadcast": [c_p, c_p, c_sz, c_int, c_int, c_p, c_p],
    "ncclReduce": [c_p, c_p, c_sz, c_int, c_int, c_int, c_p, c_p],
    "ncclBcast": [c_p, c_sz, c_int, c_int, c_p, c_p],
    "ncclAlltoAll": [c_p, c_p, c_sz, c_int, c_p, c_p],
    "ncclGather": [c_p, c_p, c_sz, c_int, c_int, c_p, c_p],
    "ncclScatter": [c_p, c_p, c_sz, c_int, c_int, c_p, c_p],
    "ncclSend": [c_p, c_sz, c_int, c_int, c_p, c_p],
    "ncclRecv": [c_p, c_sz, c_int, c_int, c_p, c_p],
    "ncclGroupStart": [],
    "ncclGroupEnd": [],
    "ncclGroupSimulateEnd": [c_p],
}
QUIET = 0.25 * TOLL_US / 1e6  # "no charge": a quarter of a toll leaves room for a loaded CI machine


def cc():
    return shutil.which("cc") or shutil.which("gcc")


@pytest.fixture(scope="module")
def fake_nccl(tmp_path_factory):
    if not cc():
        pytest.skip("no C compiler to build the fake libnccl")
    d = tmp_path_factory.mktemp("nccl")
    so = d / "libnccl.so.2"
    subprocess.run([cc(), "-shared", "-fPIC", "-O1", "-pthread", "-Wl,-soname,libnccl.so.2", "-o", str(so),
                    str(HERE / "fake_nccl.c")], check=True)
    (d / "libnccl.so").symlink_to(so.name)
    return d


@pytest.fixture(scope="module")
def nccl(lib, fake_nccl):  # noqa: F811
    """The hooked entry points, as a program that dlopens libnccl gets them (through the interposer's dlsym)."""
    F = ctypes.CDLL(str(fake_nccl / "libnccl.so.2"))
    hooks = {}
    for name, args in SIGS.items():
        addr = lib.dlsym(F._handle, name.encode())
        assert addr and addr == lib.ccbemu_lookup(name.encode()), f"{name}: dlsym did not hand out the hook"
        hooks[name] = ctypes.CFUNCTYPE(c_int, *args)(addr)
    F.fake_nccl_ops.restype = ctypes.c_longlong
    F.fake_nccl_groups.restype = ctypes.c_longlong
    lib.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(c_int), c_int, c_int]
    lib.cuMulticastCreate.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), c_p]
    lib.cuMulticastGetGranularity.argtypes = [ctypes.POINTER(c_sz), c_p, c_int]
    lib.cuCtxEnablePeerAccess.argtypes = [c_p, ctypes.c_uint]
    return F, hooks


def comm(F, nranks, rank=0):
    c = c_p()
    assert F.ncclCommInitRank(ctypes.byref(c), nranks, UniqueId(), rank) == 0
    return c


def ints(lib, values):  # noqa: F811
    """Fake device memory holding these int32s."""
    p = lib.ccbemu_fake_alloc(4 * len(values), DEVICE)
    ctypes.memmove(p, (ctypes.c_int32 * len(values))(*values), 4 * len(values))
    return p


def read_ints(p, n):
    return list((ctypes.c_int32 * n).from_address(p))


def rows(lib, prefix):  # noqa: F811
    lib.ccbemu_trace_flush()
    lines = Path(f"{prefix}.{os.getpid()}.csv").read_text().splitlines()
    return [r for r in csv.DictReader(lines[1:]) if r["kind"] == "collective"]


def sync_seconds(lib, s):  # noqa: F811
    t = time.perf_counter()
    assert lib.cuStreamSynchronize(s) == 0
    return time.perf_counter() - t


def test_every_operation_reaches_libnccl_once_and_results_are_exact(lib, nccl):  # noqa: F811
    F, h = nccl
    init(lib, nccl_toll_us=50, sync_toll_us=0, native_nvlink_gbps=100, nvlink_kept=0.5)
    rng = __import__("random").Random(3)
    n, ranks = 257, 4
    c = comm(F, ranks, rank=1)
    s = lib.ccbemu_fake_stream()
    x = [rng.randrange(-1000, 1000) for _ in range(n * ranks)]
    src, dst = ints(lib, x), lib.ccbemu_fake_alloc(4 * n * ranks, DEVICE)
    before = F.fake_nccl_ops()
    assert h["ncclAllReduce"](src, dst, n, INT32, SUM, c, s) == 0
    assert read_ints(dst, n) == [v * ranks for v in x[:n]]
    assert h["ncclReduceScatter"](src, dst, n, INT32, SUM, c, s) == 0
    assert read_ints(dst, n) == [v * ranks for v in x[n:2 * n]]  # rank 1's slice
    assert h["ncclAllGather"](src, dst, n, INT32, c, s) == 0
    assert read_ints(dst, n * ranks) == x[:n] * ranks
    assert h["ncclBroadcast"](src, dst, n, INT32, 0, c, s) == 0
    assert read_ints(dst, n) == x[:n]
    assert h["ncclReduce"](src, dst, n, INT32, SUM, 0, c, s) == 0
    assert read_ints(dst, n) == [v * ranks for v in x[:n]]
    assert h["ncclAlltoAll"](src, dst, n, INT32, c, s) == 0
    assert read_ints(dst, n * ranks) == x[n:2 * n] * ranks
    assert h["ncclGather"](src, dst, n, INT32, 0, c, s) == 0
    assert read_ints(dst, n * ranks) == x[:n] * ranks
    assert h["ncclScatter"](src, dst, n, INT32, 0, c, s) == 0
    assert read_ints(dst, n) == x[n:2 * n]
    assert h["ncclGroupStart"]() == 0
    assert h["ncclSend"](src, n, INT32, 2, c, s) == 0
    assert h["ncclRecv"](dst, n, INT32, 0, c, s) == 0
    assert h["ncclGroupEnd"]() == 0
    assert read_ints(dst, n) == x[:n]
    assert F.fake_nccl_ops() - before == 10
    assert lib.cuStreamSynchronize(s) == 0


def test_the_charge_is_device_time_on_the_stream_not_host_time(lib, nccl):  # noqa: F811
    F, h = nccl
    c = comm(F, 2)
    s = lib.ccbemu_fake_stream()
    buf = ints(lib, list(range(1024)))
    for emulate, want in ((1, TOLL_US / 1e6), (0, 0.0)):
        init(lib, emulate=emulate, nccl_toll_us=TOLL_US, sync_toll_us=0, launch_toll_us=0)
        t = time.perf_counter()
        assert h["ncclAllReduce"](buf, buf, 1024, INT32, SUM, c, s) == 0
        issued = time.perf_counter() - t
        waited = sync_seconds(lib, s)
        assert issued < 0.5 * TOLL_US / 1e6, "the host was held by the charge"
        if emulate:
            assert want * 0.9 <= waited <= want + 0.02, f"stream held {waited:.4f} s, toll {want} s"
        else:
            assert waited < QUIET, "passthrough charged a collective"


def test_bandwidth_term_is_wire_bytes_over_the_nvlink_rate_times_the_loss(lib, nccl):  # noqa: F811
    F, h = nccl
    ranks, count = 4, 1 << 20  # 4 MiB of int32: all_reduce puts 2(n-1)/n x 4 MiB = 6 MiB on the wire
    gbps, kept = 0.1, 0.5  # 6 MiB at 0.1 GB/s x (1/0.5 - 1) = 63 ms, far above the fake's own ~2 ms
    init(lib, nccl_toll_us=0, sync_toll_us=0, native_nvlink_gbps=gbps, nvlink_kept=kept)
    c = comm(F, ranks)
    s = lib.ccbemu_fake_stream()
    buf = lib.ccbemu_fake_alloc(4 * count, DEVICE)
    ctypes.memset(buf, 1, 4 * count)  # touched: no first-touch page faults inside the timed call
    t = time.perf_counter()
    assert h["ncclAllReduce"](buf, buf, count, INT32, SUM, c, s) == 0
    assert lib.cuStreamSynchronize(s) == 0
    waited = time.perf_counter() - t  # the device time runs from the issue: the call's own time is inside it
    want = 2 * (ranks - 1) / ranks * 4 * count / (gbps * 1e9) * (1 / kept - 1)
    assert want * 0.9 <= waited <= want + 0.03
    # no measured NVLink rate (a one-GPU machine): no bandwidth term, and the toll alone
    init(lib, nccl_toll_us=0, sync_toll_us=0, native_nvlink_gbps=0, nvlink_kept=kept)
    t = time.perf_counter()
    assert h["ncclAllReduce"](buf, buf, count, INT32, SUM, c, s) == 0
    assert lib.cuStreamSynchronize(s) == 0
    assert time.perf_counter() - t < want / 4



def test_projected_with_emulation_paused_the_link_is_dilated_but_keeps_all_its_bandwidth(lib, nccl):  # noqa: F811
    """A bench's native twin under --project (emulation paused): the wire bytes take r times this link's time,
    with none of the profile's bandwidth loss (nvlink_kept is CC's)."""
    F, h = nccl
    ranks, count, gbps, r = 4, 1 << 20, 0.1, 2.0
    init(lib, nccl_toll_us=50000, sync_toll_us=0, native_nvlink_gbps=gbps, nvlink_kept=0.5, dilation=r)
    c = comm(F, ranks)
    s = lib.ccbemu_fake_stream()
    buf = lib.ccbemu_fake_alloc(4 * count, DEVICE)
    ctypes.memset(buf, 1, 4 * count)
    assert lib.ccbemu_emulate_pause(1) == 1
    try:
        t = time.perf_counter()
        assert h["ncclAllReduce"](buf, buf, count, INT32, SUM, c, s) == 0
        assert lib.cuStreamSynchronize(s) == 0
        waited = time.perf_counter() - t
    finally:
        lib.ccbemu_emulate_pause(0)
    want = (r - 1) * 2 * (ranks - 1) / ranks * 4 * count / (gbps * 1e9)  # no toll, no loss: the dilation alone
    assert want * 0.9 <= waited <= want + 0.03, (waited, want)

@pytest.mark.parametrize("op,ranks,want", [
    ("ncclAllReduce", 8, 2 * 7 / 8 * 4096), ("ncclAllGather", 8, 7 * 4096), ("ncclReduceScatter", 8, 7 * 4096),
    ("ncclBroadcast", 8, 4096), ("ncclReduce", 8, 4096), ("ncclAlltoAll", 8, 7 * 4096), ("ncclGather", 8, 7 * 4096 // 8),
    ("ncclScatter", 8, 7 * 4096 // 8), ("ncclSend", 2, 4096), ("ncclRecv", 2, 0), ("ncclAllReduce", 1, 0)])
def test_trace_line_per_operation_with_ranks_wire_bytes_and_charge(lib, nccl, tmp_path, op, ranks, want):  # noqa: F811
    F, h = nccl
    prefix = tmp_path / "t"
    init(lib, trace=str(prefix), nccl_toll_us=40, sync_toll_us=0, native_nvlink_gbps=0)
    c = comm(F, ranks)
    s = lib.ccbemu_fake_stream()
    a, b = lib.ccbemu_fake_alloc(4096 * 8, DEVICE), lib.ccbemu_fake_alloc(4096 * 8, DEVICE)
    args = {"ncclAllReduce": (a, b, 1024, INT32, SUM, c, s), "ncclAllGather": (a, b, 1024, INT32, c, s),
            "ncclReduceScatter": (a, b, 1024, INT32, SUM, c, s), "ncclBroadcast": (a, b, 1024, INT32, 0, c, s),
            "ncclReduce": (a, b, 1024, INT32, SUM, 0, c, s), "ncclSend": (a, 1024, INT32, 1, c, s),
            "ncclAlltoAll": (a, b, 1024, INT32, c, s), "ncclGather": (a, b, 1024, INT32, 0, c, s),
            "ncclScatter": (a, b, 1024, INT32, 0, c, s),
            "ncclRecv": (b, 1024, INT32, 0, c, s)}[op]
    assert h[op](*args) == 0
    lib.cuStreamSynchronize(s)
    (r,) = rows(lib, prefix)
    assert (r["api"], r["bytes"], r["ranks"], r["wire_bytes"]) == (op, "4096", str(ranks), str(int(want)))
    # a one-rank communicator crosses no GPU: no charge (nccl_one_rank is off in every shipped profile)
    assert int(r["toll_ns"]) == (40000 if ranks > 1 else 0) and r["dir"] == r["mem"] == "" and r["rc"] == "0"
    assert r["graph"] == ""
    s_ = trace.summarize(str(prefix))
    assert s_.total("collective") == 1


def test_a_group_is_one_operation_one_toll_on_its_first_stream(lib, nccl, tmp_path):  # noqa: F811
    F, h = nccl
    prefix = tmp_path / "g"
    init(lib, trace=str(prefix), nccl_toll_us=TOLL_US, sync_toll_us=0)
    c = comm(F, 2)
    s1, s2 = lib.ccbemu_fake_stream(), lib.ccbemu_fake_stream()
    buf = ints(lib, list(range(64)))
    t = time.perf_counter()
    assert h["ncclGroupStart"]() == 0
    assert h["ncclGroupStart"]() == 0  # nested: only the outermost end charges
    for _ in range(3):
        assert h["ncclSend"](buf, 64, INT32, 1, c, s1) == 0
    assert h["ncclGroupEnd"]() == 0
    assert sync_seconds(lib, s1) < QUIET, "an inner group end charged"
    assert h["ncclRecv"](buf, 64, INT32, 1, c, s2) == 0
    assert h["ncclGroupEnd"]() == 0
    assert time.perf_counter() - t < 0.5 * TOLL_US / 1e6
    assert TOLL_US / 1e6 * 0.9 <= sync_seconds(lib, s1) <= TOLL_US / 1e6 + 0.02  # one toll, not four
    assert sync_seconds(lib, s2) < QUIET
    lines = rows(lib, prefix)
    assert [r["api"] for r in lines] == ["ncclSend"] * 3 + ["ncclRecv"]
    assert [int(r["toll_ns"]) for r in lines] == [TOLL_US * 1000, 0, 0, 0]


@pytest.mark.parametrize("one_rank", [0, 1])
def test_a_one_rank_communicator_pays_only_where_the_profile_asks(lib, nccl, tmp_path, one_rank):  # noqa: F811
    F, h = nccl
    prefix = tmp_path / "one"
    init(lib, trace=str(prefix), nccl_toll_us=TOLL_US, sync_toll_us=0, nccl_one_rank=one_rank)
    c, s = comm(F, 1), lib.ccbemu_fake_stream()
    buf = ints(lib, list(range(64)))
    assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) == 0
    assert h["ncclGroupStart"]() == 0  # grouped too
    assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) == 0
    assert h["ncclGroupEnd"]() == 0
    waited = sync_seconds(lib, s)
    assert [int(r["toll_ns"]) for r in rows(lib, prefix)] == [TOLL_US * 1000 * one_rank] * 2
    assert (waited >= 2 * TOLL_US / 1e6 * 0.9) if one_rank else (waited < QUIET)
    assert read_ints(buf, 4) == [0, 1, 2, 3]  # x1 each time: results untouched


def graph_of(lib, s):  # noqa: F811
    """The fake's last captured graph on s, instantiated."""
    exe = c_p()
    lib.cuGraphInstantiateWithFlags.argtypes = [ctypes.POINTER(c_p), c_p, ctypes.c_uint64]
    assert lib.cuGraphInstantiateWithFlags(ctypes.byref(exe), lib.ccbemu_fake_graph(s), 0) == 0
    lib.cuGraphLaunch.argtypes = [c_p, c_p]
    return exe


@pytest.mark.parametrize("emulate", [1, 0])
def test_each_graph_replay_writes_the_collectives_it_captured(lib, nccl, tmp_path, emulate):  # noqa: F811
    """A graph that captured N collectives and is launched R times: N capture lines (no GPU time) and N x R replay
    lines, each with the toll the GPU pays on that replay; record-only (emulate 0) the same lines with no toll."""
    F, h = nccl
    prefix = tmp_path / "g"
    init(lib, trace=str(prefix), emulate=emulate, nccl_toll_us=TOLL_US, sync_toll_us=0, launch_toll_us=0)
    c, s = comm(F, 4), lib.ccbemu_fake_stream()
    buf = ints(lib, list(range(64)))
    lib.ccbemu_fake_capture(s, 1)
    for op in ("ncclAllReduce", "ncclAllReduce", "ncclAllGather"):
        args = (buf, buf, 16, INT32, SUM, c, s) if op == "ncclAllReduce" else (buf, buf, 16, INT32, c, s)
        assert h[op](*args) == 0
    lib.ccbemu_fake_capture(s, 0)
    exe = graph_of(lib, s)
    replays = 5
    for _ in range(replays):
        assert lib.cuGraphLaunch(exe, s) == 0
    got = rows(lib, prefix)
    captured = [r for r in got if r["graph"] == "capture"]
    replayed = [r for r in got if r["graph"] == "replay"]
    assert [r["api"] for r in captured] == ["ncclAllReduce", "ncclAllReduce", "ncclAllGather"]
    assert len(replayed) == 3 * replays and len(got) == 3 + 3 * replays
    assert [r["api"] for r in replayed[:3]] == [r["api"] for r in captured]
    toll = TOLL_US * 1000 if emulate else 0
    assert {int(r["toll_ns"]) for r in replayed} == {toll} and {r["ranks"] for r in replayed} == {"4"}
    assert all(r["t_enter_ns"] == r["t_return_ns"] for r in replayed)  # no host time: the launch's line holds it
    s_ = trace.summarize(str(prefix))
    agg = s_.by_api[("ncclAllReduce", "-", "-")]
    assert (agg["count"], agg["captured"], agg["replays"]) == (2 * replays, 2, 2 * replays)
    assert agg["toll_ns"] == 2 * replays * toll  # the GPU time of every replay, none for the capture


def test_an_operation_being_captured_leaves_its_wait_in_the_graph_not_on_the_stream(lib, nccl, tmp_path):  # noqa: F811
    F, h = nccl
    prefix = tmp_path / "c"
    init(lib, trace=str(prefix), nccl_toll_us=TOLL_US, sync_toll_us=0, launch_toll_us=0)
    c = comm(F, 2)
    s = lib.ccbemu_fake_stream()
    buf = ints(lib, list(range(64)))
    lib.ccbemu_fake_capture(s, 1)
    assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) == 0
    lib.ccbemu_fake_capture(s, 0)
    assert sync_seconds(lib, s) < QUIET  # captured, not run (the fake's graph replays run nothing)
    (r,) = rows(lib, prefix)
    assert int(r["toll_ns"]) == TOLL_US * 1000 and r["graph"] == "capture"  # what every replay of the graph pays


def test_without_a_device_wait_kernel_the_host_pays_and_says_so(lib, nccl, capfd):  # noqa: F811
    F, h = nccl
    init(lib, nccl_toll_us=TOLL_US, sync_toll_us=0)
    lib.ccbemu_fake_modules_fail(1)
    try:
        c = comm(F, 2)
        s = lib.ccbemu_fake_ctx_new()
        lib.ccbemu_fake_set_ctx(s)  # a context with no wait kernel loaded yet
        st = lib.ccbemu_fake_stream()
        buf = ints(lib, list(range(64)))
        t = time.perf_counter()
        assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, st) == 0
        assert time.perf_counter() - t >= TOLL_US / 1e6 * 0.9
    finally:
        lib.ccbemu_fake_modules_fail(0)
        lib.ccbemu_fake_set_ctx(1)
    assert "collectives' device-side wait" in capfd.readouterr().err


def test_multicast_is_refused_without_reaching_the_driver_where_the_profile_has_no_nvls(lib, nccl):  # noqa: F811
    v, handle, gran = c_int(), ctypes.c_ulonglong(), c_sz()
    for emulate, nvls, refused in ((1, 0, True), (1, 1, False), (0, 0, False)):
        init(lib, emulate=emulate, nvls=nvls)
        calls = lib.ccbemu_fake_multicast_calls()
        assert lib.cuDeviceGetAttribute(ctypes.byref(v), 132, 0) == 0
        assert v.value == (0 if refused else 1)
        rc = lib.cuMulticastCreate(ctypes.byref(handle), None), lib.cuMulticastGetGranularity(ctypes.byref(gran), None, 0)
        assert rc == ((801, 801) if refused else (0, 0))
        assert lib.ccbemu_fake_multicast_calls() - calls == (0 if refused else 2)
    init(lib, emulate=1, nvls=0)
    assert lib.cuDeviceGetAttribute(ctypes.byref(v), 75, 0) == 0  # other attributes pass untouched


def launch_toll_s(lib):  # noqa: F811
    s = lib.ccbemu_fake_stream()
    t = time.perf_counter()
    assert lib.cuLaunchKernel(None, 1, 1, 1, 1, 1, 1, 0, s, None, None) == 0
    return time.perf_counter() - t


@pytest.mark.parametrize("how", ["communicator", "peer_access", "multi_gpu"])
def test_the_launch_toll_grows_once_the_process_is_multi_gpu(lib, nccl, how):  # noqa: F811
    F, h = nccl
    toll = 0.02
    init(lib, launch_toll_us=toll * 1e6, mgpu_launch_factor=2, sync_toll_us=0, nccl_toll_us=0,
         multi_gpu=int(how == "multi_gpu"))
    first = launch_toll_s(lib)
    if how == "multi_gpu":
        assert first >= 2 * toll * 0.95
        return
    assert toll * 0.95 <= first < 1.5 * toll
    one = comm(F, 1)
    buf = ints(lib, [1, 2])
    assert h["ncclAllReduce"](buf, buf, 2, INT32, SUM, one, None) == 0
    assert launch_toll_s(lib) < 1.5 * toll, "a one-rank communicator made the process multi-GPU"
    if how == "communicator":
        assert h["ncclAllReduce"](buf, buf, 2, INT32, SUM, comm(F, 8), None) == 0
    else:
        assert lib.cuCtxEnablePeerAccess(lib.ccbemu_fake_ctx_new(), 0) == 0
    assert launch_toll_s(lib) >= 2 * toll * 0.95


def test_passthrough_leaves_collectives_alone_but_records_them(lib, nccl, tmp_path):  # noqa: F811
    F, h = nccl
    prefix = tmp_path / "p"
    init(lib, emulate=0, trace=str(prefix), nccl_toll_us=TOLL_US, nvls=0)
    c = comm(F, 4)
    s = lib.ccbemu_fake_stream()
    buf = ints(lib, list(range(256)))
    assert h["ncclAllReduce"](buf, buf, 256, INT32, SUM, c, s) == 0
    assert read_ints(buf, 256) == [4 * v for v in range(256)]
    assert sync_seconds(lib, s) < QUIET
    (r,) = rows(lib, prefix)
    assert (r["toll_ns"], r["ranks"], r["wire_bytes"]) == ("0", "4", str(int(2 * 3 / 4 * 1024)))


def test_a_group_over_several_gpus_charges_each_gpu_once_in_parallel(lib, nccl, tmp_path):  # noqa: F811
    """One thread driving two GPUs (ncclCommInitAll, nccl-tests -g 2): each GPU's first stream pays one toll, at
    the same time, not both on the first GPU one after the other."""
    F, h = nccl
    prefix = tmp_path / "m"
    init(lib, trace=str(prefix), nccl_toll_us=TOLL_US, sync_toll_us=0)
    c = comm(F, 2)
    buf = ints(lib, list(range(64)))
    streams = []
    for _ in range(2):
        lib.ccbemu_fake_set_ctx(lib.ccbemu_fake_ctx_new())
        streams.append(lib.ccbemu_fake_stream())
    lib.ccbemu_fake_set_ctx(1)
    t = time.perf_counter()
    assert h["ncclGroupStart"]() == 0
    for st in streams:
        assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, st) == 0
    assert h["ncclGroupEnd"]() == 0
    for st in streams:
        assert lib.cuStreamSynchronize(st) == 0
    assert TOLL_US / 1e6 * 0.9 <= time.perf_counter() - t < 1.5 * TOLL_US / 1e6  # in parallel, not 2 tolls
    assert [int(r["toll_ns"]) for r in rows(lib, prefix)] == [TOLL_US * 1000] * 2


def test_a_simulated_group_runs_and_charges_nothing_and_leaves_no_group_open(lib, nccl, tmp_path):  # noqa: F811
    F, h = nccl
    prefix = tmp_path / "sim"
    init(lib, trace=str(prefix), nccl_toll_us=TOLL_US, sync_toll_us=0)
    c = comm(F, 2)
    s = lib.ccbemu_fake_stream()
    buf = ints(lib, list(range(64)))
    assert h["ncclGroupStart"]() == 0
    assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) == 0
    assert h["ncclGroupSimulateEnd"](None) == 0
    assert sync_seconds(lib, s) < QUIET
    assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) == 0  # ungrouped again: charged at once
    assert sync_seconds(lib, s) >= TOLL_US / 1e6 * 0.9
    assert [int(r["toll_ns"]) for r in rows(lib, prefix)] == [TOLL_US * 1000]


def test_a_destroyed_context_s_wait_kernel_is_loaded_anew(lib, nccl):  # noqa: F811
    F, h = nccl
    init(lib, nccl_toll_us=TOLL_US, sync_toll_us=0)
    lib.cuCtxDestroy_v2.argtypes = [c_p]
    ctx = lib.ccbemu_fake_ctx_new()
    lib.ccbemu_fake_set_ctx(ctx)
    try:
        c, s, buf = comm(F, 2), lib.ccbemu_fake_stream(), ints(lib, [1, 2, 3])
        assert h["ncclAllReduce"](buf, buf, 3, INT32, SUM, c, s) == 0  # loads this context's kernel
        assert sync_seconds(lib, s) >= TOLL_US / 1e6 * 0.9
        assert lib.cuCtxDestroy_v2(ctx) == 0
        lib.ccbemu_fake_modules_fail(1)  # a reload now fails: the host pays, which shows the reload was tried
        t = time.perf_counter()
        assert h["ncclAllReduce"](buf, buf, 3, INT32, SUM, c, s) == 0
        assert time.perf_counter() - t >= TOLL_US / 1e6 * 0.9
    finally:
        lib.ccbemu_fake_modules_fail(0)
        lib.ccbemu_fake_set_ctx(1)


PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
typedef struct { char internal[128]; } ncclUniqueId;
int ncclCommInitRank(void **, int, ncclUniqueId, int);
int ncclAllReduce(const void *, void *, size_t, int, int, void *, void *);
int ncclBcast(void *, size_t, int, int, void *, void *);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int job(int argc, char **argv) {
    int (*init)(const char *, char *, int) = dlsym(RTLD_DEFAULT, "ccbemu_test_init");
    void *(*alloc)(size_t, int) = dlsym(RTLD_DEFAULT, "ccbemu_fake_alloc");
    void *(*stream)(void) = dlsym(RTLD_DEFAULT, "ccbemu_fake_stream");
    int (*cuStreamSynchronize)(void *) = dlsym(RTLD_DEFAULT, "cuStreamSynchronize");
    char err[256];
    if (!init || init(argv[1], err, sizeof err)) { printf("{\"error\": \"no interposer or bad config\"}\n"); return 1; }
    void *comm; ncclUniqueId id; memset(&id, 0, sizeof id);
    ncclCommInitRank(&comm, 2, id, 0);
    int *buf = alloc(64 * sizeof(int), 2);
    for (int i = 0; i < 64; i++) buf[i] = i * 7 - 100;
    void *s = stream();
    double t0 = now();
    int rc = ncclAllReduce(buf, buf, 64, 2, 0, comm, s);
    double t1 = now();
    cuStreamSynchronize(s);
    double t2 = now();
    int exact = 1;
    for (int i = 0; i < 64; i++) exact &= buf[i] == 2 * (i * 7 - 100);
    /* ncclBcast calls ncclBroadcast inside libnccl: one operation, one charge */
    double t3 = now();
    rc |= ncclBcast(buf, 64, 2, 0, comm, s);
    cuStreamSynchronize(s);
    double t4 = now();
    printf("{\"rc\": %d, \"issue_s\": %f, \"sync_s\": %f, \"bcast_s\": %f, \"exact\": %d}\n", rc, t1 - t0,
           t2 - t1, t4 - t3, exact);
    return 0;
}
#ifndef AS_LIBRARY
int main(int argc, char **argv) { return job(argc, argv); }
#endif
"""
# PyTorch's shape: the code that calls NCCL is a library Python dlopens RTLD_LOCAL, with libnccl its dependency,
# so libnccl is not in the global scope where the interposer's RTLD_NEXT looks
LOADER = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("{\"error\": \"%s\"}\n", dlerror()); return 1; }
    int (*job)(int, char **) = (int (*)(int, char **))dlsym(h, "job");
    return job(argc - 1, argv + 1);
}
"""


@pytest.mark.parametrize("how", ["linked", "library_loaded_local"])
def test_a_program_linked_against_libnccl_is_charged_through_the_preloaded_exports(fake_nccl, tmp_path, how):
    src = tmp_path / "prog.c"
    src.write_text(PROGRAM)
    nccl = [f"-L{fake_nccl}", "-lnccl", "-ldl", f"-Wl,-rpath,{fake_nccl}"]
    if how == "linked":
        exe = tmp_path / "prog"
        subprocess.run([cc(), "-O1", "-o", str(exe), str(src), *nccl], check=True)
        cmd = [str(exe)]
    else:
        so, loader = tmp_path / "libjob.so", tmp_path / "loader.c"
        subprocess.run([cc(), "-O1", "-shared", "-fPIC", "-DAS_LIBRARY", "-o", str(so), str(src), *nccl], check=True)
        loader.write_text(LOADER)
        subprocess.run([cc(), "-O1", "-o", str(tmp_path / "loader"), str(loader), "-ldl"], check=True)
        cmd = [str(tmp_path / "loader"), str(so)]
    env = {**os.environ, "LD_PRELOAD": launcher.library()}
    for emulate in (1, 0):
        config = f"profile=test\nemulate={emulate}\nnccl_toll_us={TOLL_US}\nsync_toll_us=0\n"
        out = subprocess.run([*cmd, config], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "no loaded NCCL library" not in out.stderr
        got = json.loads(out.stdout)
        assert got["rc"] == 0 and got["exact"] == 1
        assert got["issue_s"] < 0.5 * TOLL_US / 1e6
        if emulate:
            assert TOLL_US / 1e6 * 0.9 <= got["sync_s"] <= TOLL_US / 1e6 + 0.05
            assert TOLL_US / 1e6 * 0.9 <= got["bcast_s"] < 1.5 * TOLL_US / 1e6, "ncclBcast's inner call was charged"
        else:
            assert got["sync_s"] < QUIET and got["bcast_s"] < QUIET


PROBE = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) { printf("%s\n", dlsym(RTLD_DEFAULT, "ncclAllReduce") ? "found" : "none"); return 0; }
"""


def test_a_program_without_nccl_does_not_find_it_because_the_interposer_is_preloaded(tmp_path):
    if not cc():
        pytest.skip("no C compiler")
    (tmp_path / "p.c").write_text(PROBE)
    subprocess.run([cc(), "-o", str(tmp_path / "p"), str(tmp_path / "p.c"), "-ldl"], check=True)
    out = subprocess.run([str(tmp_path / "p")], env={**os.environ, "LD_PRELOAD": launcher.library()},
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "none", out.stdout + out.stderr


@pytest.mark.parametrize("key,value", [("nccl_toll_us", "-1"), ("nvlink_kept", "1.5"), ("nvlink_kept", "nan"),
                                       ("mgpu_launch_factor", "0.5"), ("nvls", "2"), ("nccl_toll_max_bytes", "1.5")])
def test_bad_multi_gpu_values_are_refused_by_both_parsers(lib, key, value):  # noqa: F811
    from ccbridge.emulate import profiles

    with pytest.raises(ValueError, match=key):
        init(lib, **{key: value})
    with pytest.raises(profiles.ProfileError, match=key):
        profiles.override(profiles.load("b300"), [f"{key}={value}"])
    assert not math.isnan(profiles.load("b300").params["nvlink_kept"].value)


def test_a_profile_without_nvls_runs_the_program_with_multicast_off_in_every_library():
    from ccbridge.emulate import profiles

    user = {"NCCL_NVLS_ENABLE": "1", "PATH": os.environ.get("PATH", "")}
    env = launcher.environment(profiles.load("b300"), "/nonexistent.conf", base=user)
    assert {k: env[k] for k in launcher.NVLS_OFF} == launcher.NVLS_OFF
    assert launcher.environment(profiles.load("h200"), "/x", base=user)["NCCL_NVLS_ENABLE"] == "1"  # NVLS kept
    kept = profiles.override(profiles.load("b300"), ["nvls=1"])
    assert launcher.environment(kept, "/x", base=user)["NCCL_NVLS_ENABLE"] == "1"


def test_the_wait_is_shortened_by_its_own_dispatch_as_the_launcher_measured_it(lib, nccl):  # noqa: F811
    """On a GPU one more kernel costs its dispatch (native_kernel_ns, timed by the launcher): the wait kernel is
    asked for the charge less that, and a charge below it queues no kernel at all."""
    F, h = nccl
    init(lib, nccl_toll_us=12.5, sync_toll_us=0, native_kernel_ns=1500)
    c, s, buf = comm(F, 2), lib.ccbemu_fake_stream(), ints(lib, [5, 6])
    assert h["ncclAllReduce"](buf, buf, 2, INT32, SUM, c, s) == 0
    assert lib.ccbemu_fake_last_spin_ns() == 12500 - 1500
    init(lib, nccl_toll_us=1, sync_toll_us=0, native_kernel_ns=2000)
    assert h["ncclAllReduce"](buf, buf, 2, INT32, SUM, c, s) == 0
    assert lib.ccbemu_fake_last_spin_ns() == 12500 - 1500  # no kernel launched
    lib.cuStreamSynchronize(s)


# ---- where an operation's device-side wait is queued: right before the operation's own kernel launch ----
# The fake libnccl (tests/fake_nccl.c) launches its kernels through the interposer's hooked cuLaunchKernel, as NCCL
# does through the entry point cuGetProcAddress hands it, and notes the fake driver's last wait kernel when the
# operation began and around its first launch. A wait queued by that launch (inside the real call, on the launch's
# stream) is serial with the operation in a captured graph; one queued before the call ran beside NCCL's graph-mixing
# event-record node. What no launch on the calling thread takes is queued after the call on the operation's stream.

NO_KERNEL, KERNEL, KERNEL_ELSEWHERE = 0, 1, 2  # fake_nccl.c: none, on the calling thread, on another thread
OWN_NS = 1000  # native_kernel_ns: the wait kernel is asked for the charge less this
ENTRY, BEFORE, AFTER = 0, 1, 2  # fake_nccl_spin_seen: as the operation began, around its first launch


@pytest.fixture
def launching(lib, nccl):  # noqa: F811
    """mode(m, stream=None): how the fake's operations launch from now on (stream: NCCL's own launch stream)."""
    F, _ = nccl
    F.fake_nccl_launch_with.argtypes = [c_p, c_p, c_p, c_int]
    F.fake_nccl_spin_seen.restype = ctypes.c_ulonglong
    F.fake_nccl_spin_seen.argtypes = [c_int]
    lib.ccbemu_fake_last_spin_ns.restype = ctypes.c_ulonglong
    last_spin = ctypes.cast(lib.ccbemu_fake_last_spin_ns, c_p)

    def mode(m, stream=None):
        F.fake_nccl_launch_with(lib.ccbemu_lookup(b"cuLaunchKernel"), last_spin, stream, m)

    yield mode
    F.fake_nccl_launch_with(None, None, None, NO_KERNEL)
    F.fake_nccl_fail_next(0)


def emulate_with(lib, toll_us, **more):  # noqa: F811
    init(lib, nccl_toll_us=toll_us, sync_toll_us=0, launch_toll_us=0, native_kernel_ns=OWN_NS, **more)


def spin_ns(toll_us):
    return int(toll_us * 1000) - OWN_NS


def seen(F):
    return tuple(F.fake_nccl_spin_seen(w) for w in (ENTRY, BEFORE, AFTER))


def one_toll(seconds, tolls=1):
    return tolls * TOLL_US / 1e6 * 0.9 <= seconds <= tolls * TOLL_US / 1e6 + 0.02


def mark_last_spin(lib, h, c, s, buf):  # noqa: F811
    """A first operation of another toll (7 us): the fake driver's last wait then names it, not the next one."""
    emulate_with(lib, 7)
    assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) in (0, 7)
    assert lib.cuStreamSynchronize(s) == 0
    assert lib.ccbemu_fake_last_spin_ns() == spin_ns(7)


def test_the_wait_is_queued_by_the_operation_s_kernel_launch_on_its_stream_once(lib, nccl, launching):  # noqa: F811
    F, h = nccl
    c, s, ls = comm(F, 2), lib.ccbemu_fake_stream(), lib.ccbemu_fake_stream()
    buf = ints(lib, list(range(64)))
    launching(KERNEL, ls)  # NCCL launches on a stream other than the operation's: the wait goes with the launch
    mark_last_spin(lib, h, c, s, buf)
    assert sync_seconds(lib, ls) < QUIET
    emulate_with(lib, TOLL_US)
    assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) == 0
    # not queued before the call; queued by the first launch (of the two the fake makes), not by the second
    assert seen(F) == (spin_ns(7), spin_ns(7), spin_ns(TOLL_US))
    assert one_toll(sync_seconds(lib, ls)), "the launch's stream did not pay one toll"
    assert sync_seconds(lib, s) < QUIET, "the wait went on the operation's stream as well"


def test_a_captured_operation_with_a_kernel_leaves_its_wait_in_the_graph(lib, nccl, launching, tmp_path):  # noqa: F811
    F, h = nccl
    prefix = tmp_path / "c"
    emulate_with(lib, TOLL_US, trace=str(prefix))
    c, s, buf = comm(F, 2), lib.ccbemu_fake_stream(), ints(lib, list(range(64)))
    launching(KERNEL)
    lib.ccbemu_fake_capture(s, 1)
    assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) == 0
    lib.ccbemu_fake_capture(s, 0)
    assert sync_seconds(lib, s) < QUIET  # captured, not run (and not paid again after the call)
    (r,) = rows(lib, prefix)
    assert int(r["toll_ns"]) == TOLL_US * 1000 and r["graph"] == "capture"


@pytest.mark.parametrize("mode", [NO_KERNEL, KERNEL_ELSEWHERE])
def test_without_a_kernel_launched_on_this_thread_the_wait_follows_the_call(lib, nccl, launching, mode):  # noqa: F811
    """A one-rank or copy-engine operation (no kernel), a non-blocking communicator's (launched on NCCL's own
    thread, the call returning ncclInProgress): the wait is queued after the real call, on the operation's stream."""
    F, h = nccl
    c, s = comm(F, 2), lib.ccbemu_fake_stream()
    buf = ints(lib, list(range(64)))
    launching(mode)
    mark_last_spin(lib, h, c, s, buf)
    emulate_with(lib, TOLL_US)
    assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) == (0 if mode == NO_KERNEL else 7)
    entry, before, after = seen(F)
    assert entry == spin_ns(7), "queued before the call"
    if mode == KERNEL_ELSEWHERE:
        assert before == after == spin_ns(7), "another thread's launch took the calling thread's wait"
    assert lib.ccbemu_fake_last_spin_ns() == spin_ns(TOLL_US)  # queued after the call
    assert one_toll(sync_seconds(lib, s))


def test_a_group_pays_one_toll_per_gpu_at_its_first_launch_on_that_gpu(lib, nccl, launching, tmp_path):  # noqa: F811
    """Two operations on one GPU, then one on each of two GPUs: the fake launches a group's kernels last queued first,
    so each GPU's wait must follow its own first launch (its context), once."""
    F, h = nccl
    prefix = tmp_path / "g"
    c, buf = comm(F, 2), ints(lib, list(range(64)))
    launching(KERNEL)
    s1, s2 = lib.ccbemu_fake_stream(), lib.ccbemu_fake_stream()
    mark_last_spin(lib, h, c, s1, buf)
    emulate_with(lib, TOLL_US, trace=str(prefix))
    assert h["ncclGroupStart"]() == 0
    for st in (s1, s2):
        assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, st) == 0
    assert seen(F)[ENTRY] == spin_ns(7)
    assert h["ncclGroupEnd"]() == 0
    assert seen(F)[BEFORE:] == (spin_ns(7), spin_ns(TOLL_US))
    assert one_toll(sync_seconds(lib, s2)), "the group's first launch (on s2) did not take its toll"
    assert sync_seconds(lib, s1) < QUIET, "the group paid twice on one GPU"
    assert [int(r["toll_ns"]) for r in rows(lib, prefix)] == [TOLL_US * 1000, 0]  # the first operation's line
    gpus = []
    for _ in range(2):
        lib.ccbemu_fake_set_ctx(lib.ccbemu_fake_ctx_new())
        gpus.append(lib.ccbemu_fake_stream())
    lib.ccbemu_fake_set_ctx(1)
    # each GPU's charge its own: 64 and 128 int32s at 1 GB/s keeping half add 256 and 512 ns
    emulate_with(lib, TOLL_US, trace=str(prefix), native_nvlink_gbps=1, nvlink_kept=0.5)
    big = ints(lib, list(range(128)))
    assert h["ncclGroupStart"]() == 0
    for st, n in zip(gpus, (64, 128)):
        assert h["ncclAllReduce"](big, big, n, INT32, SUM, c, st) == 0
    t = time.perf_counter()
    assert h["ncclGroupEnd"]() == 0
    charge = [TOLL_US * 1000 + 256, TOLL_US * 1000 + 512]
    # the second GPU's kernel launched first took the second GPU's charge; the first GPU's launch its own
    assert seen(F)[AFTER] == charge[1] - OWN_NS and lib.ccbemu_fake_last_spin_ns() == charge[0] - OWN_NS
    for st in gpus:
        assert lib.cuStreamSynchronize(st) == 0
    assert one_toll(time.perf_counter() - t)  # in parallel, one toll each
    assert [int(r["toll_ns"]) for r in rows(lib, prefix)] == charge


def test_an_error_pays_after_the_call_and_leaves_nothing_pending(lib, nccl, launching, tmp_path):  # noqa: F811
    F, h = nccl
    prefix = tmp_path / "e"
    c, s, buf = comm(F, 2), lib.ccbemu_fake_stream(), ints(lib, list(range(64)))
    launching(KERNEL)
    emulate_with(lib, TOLL_US, trace=str(prefix))
    F.fake_nccl_fail_next(5)
    assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) == 5
    assert lib.ccbemu_fake_last_spin_ns() == spin_ns(TOLL_US)  # charged, as a refused launch's toll is
    assert one_toll(sync_seconds(lib, s))
    emulate_with(lib, 2 * TOLL_US, trace=str(prefix))
    assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) == 0
    assert seen(F) == (spin_ns(TOLL_US), spin_ns(TOLL_US), spin_ns(2 * TOLL_US))
    assert one_toll(sync_seconds(lib, s), tolls=2), "the failed operation's charge was queued again"
    (r,) = rows(lib, prefix)
    assert (r["rc"], int(r["toll_ns"])) == ("0", 2 * TOLL_US * 1000)


SEQUENCE_TOLL_US, BW_NS = 40, 4096  # 4 KiB on 2 ranks at 1 GB/s keeping half: 4096 ns beyond the link's own


def run_sequence(lib, F, h, prefix):  # noqa: F811
    """All-reduce, a send/recv group, a one-rank all-reduce, a failed all-reduce, a 4-rank all-reduce, a group with a
    failed operation: the charges each writes."""
    emulate_with(lib, SEQUENCE_TOLL_US, trace=str(prefix), native_nvlink_gbps=1, nvlink_kept=0.5)
    two, one, four = comm(F, 2), comm(F, 1), comm(F, 4)
    s, buf = lib.ccbemu_fake_stream(), lib.ccbemu_fake_alloc(4096 * 8, 2)
    assert h["ncclAllReduce"](buf, buf, 1024, INT32, SUM, two, s) in (0, 7)
    assert h["ncclGroupStart"]() == 0
    assert h["ncclSend"](buf, 1024, INT32, 1, two, s) == 0
    assert h["ncclRecv"](buf, 1024, INT32, 1, two, s) == 0
    assert h["ncclGroupEnd"]() in (0, 7)
    assert h["ncclAllReduce"](buf, buf, 1024, INT32, SUM, one, s) in (0, 7)
    F.fake_nccl_fail_next(5)
    assert h["ncclAllReduce"](buf, buf, 1024, INT32, SUM, two, s) == 5
    assert h["ncclAllReduce"](buf, buf, 1024, INT32, SUM, four, s) in (0, 7)
    assert h["ncclGroupStart"]() == 0
    F.fake_nccl_fail_next(5)
    assert h["ncclAllReduce"](buf, buf, 1024, INT32, SUM, two, s) == 5
    assert h["ncclAllReduce"](buf, buf, 1024, INT32, SUM, two, s) == 0
    assert h["ncclGroupEnd"]() in (0, 7)
    assert lib.cuStreamSynchronize(s) == 0
    got = [(r["api"], int(r["toll_ns"]), r["rc"]) for r in rows(lib, prefix)]
    return got, trace.summarize(str(prefix)).by_api[("ncclAllReduce", "-", "-")]["toll_ns"]


def test_the_charges_traced_are_the_same_wherever_the_wait_is_queued(lib, nccl, launching, tmp_path):  # noqa: F811
    F, h = nccl
    toll = SEQUENCE_TOLL_US * 1000
    ok = "0"
    want = [("ncclAllReduce", toll + BW_NS, ok), ("ncclSend", toll + BW_NS, ok), ("ncclRecv", 0, ok),
            ("ncclAllReduce", 0, ok), ("ncclAllReduce", toll + BW_NS, "5"),
            ("ncclAllReduce", toll + 6144, ok),  # 4 ranks: 2 x 3/4 of 4 KiB on the wire
            ("ncclAllReduce", 0, "5"), ("ncclAllReduce", toll + BW_NS, ok)]
    for mode in (NO_KERNEL, KERNEL, KERNEL_ELSEWHERE):
        launching(mode)
        got, total = run_sequence(lib, F, h, tmp_path / f"s{mode}")
        assert [(a, n) for a, n, _ in got] == [(a, n) for a, n, _ in want], mode
        # (ungrouped, a non-blocking communicator's operation is in progress when its call returns)
        assert [rc for *_, rc in got] == [rc if mode != KERNEL_ELSEWHERE or i in (1, 2, 6, 7) else rc.replace("0", "7")
                                          for i, (*_, rc) in enumerate(want)], mode
        assert total == sum(n for a, n, _ in want if a == "ncclAllReduce")


# ---- review (rev29): what moving the wait to NCCL's kernel launch changes beyond the captured graph ----

def test_an_eager_operation_on_an_idle_stream_pays_its_wait_after_the_launch_toll(
        lib, nccl, launching):  # noqa: F811
    """Eager, the GPU idle (a synchronize after each operation: a host-bound decode step without graphs): queued
    before the call, the wait ran while the host paid NCCL's work and its kernel's launch toll; queued at the launch,
    after that toll, it adds to it. Latency of one operation: old max(launch toll, wait), new their sum."""
    F, h = nccl
    c, s, buf = comm(F, 2), lib.ccbemu_fake_stream(), ints(lib, list(range(64)))
    launching(KERNEL)
    init(lib, nccl_toll_us=TOLL_US, sync_toll_us=0, launch_toll_us=TOLL_US // 2, native_kernel_ns=OWN_NS)
    assert lib.cuStreamSynchronize(s) == 0
    t = time.perf_counter()
    assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) == 0
    assert lib.cuStreamSynchronize(s) == 0
    took = time.perf_counter() - t
    # the fake launches 2 kernels, each paying half a toll on the host: the wait queued before the call ran beside
    # both (old: 1 toll in all); queued at the first launch, after its toll, it ends 1.5 tolls in
    assert took >= 1.4 * TOLL_US / 1e6, f"{took:.3f} s: the wait overlapped the launch tolls (queued before the call)"


def test_the_wait_s_host_time_is_not_counted_as_the_launch_s(lib, nccl, launching, tmp_path):  # noqa: F811
    """The hooked launch that queues the wait writes its trace line around it: in the host fallback (a driver that
    refuses the wait's PTX) the whole toll, and on a GPU the wait kernel's own driver launch (its module's PTX JIT on
    a context's first), lands in the launch's line as well as the collective's: trace.summarize's per-API time (and
    account's launch line, its 'CUDA graphs' advice) grows by each collective's toll."""
    F, h = nccl
    prefix = tmp_path / "f"
    launching(KERNEL)
    emulate_with(lib, TOLL_US, trace=str(prefix))
    lib.ccbemu_fake_modules_fail(1)
    try:
        lib.ccbemu_fake_set_ctx(lib.ccbemu_fake_ctx_new())  # no wait kernel loaded yet: the host pays
        c, s, buf = comm(F, 2), lib.ccbemu_fake_stream(), ints(lib, list(range(64)))
        assert h["ncclAllReduce"](buf, buf, 64, INT32, SUM, c, s) == 0
    finally:
        lib.ccbemu_fake_modules_fail(0)
        lib.ccbemu_fake_set_ctx(1)
    lib.ccbemu_trace_flush()
    by_api = trace.summarize(str(prefix)).by_api
    launch_ms = by_api[("cuLaunchKernel", "-", "-")]["blocked_ns"] / 1e6
    coll_ms = by_api[("ncclAllReduce", "-", "-")]["blocked_ns"] / 1e6
    assert coll_ms >= 0.9 * TOLL_US / 1e3
    assert launch_ms < 0.25 * TOLL_US / 1e3, f"launch lines hold {launch_ms:.1f} ms of the collective's toll"


def test_a_nested_call_ncclbcast_pays_once_at_its_launch(lib, nccl, launching):  # noqa: F811
    F, h = nccl
    c, s, buf = comm(F, 2), lib.ccbemu_fake_stream(), ints(lib, list(range(64)))
    launching(KERNEL)
    mark_last_spin(lib, h, c, s, buf)
    emulate_with(lib, TOLL_US)
    assert h["ncclBcast"](buf, 64, INT32, 0, c, s) == 0
    assert seen(F) == (spin_ns(7), spin_ns(7), spin_ns(TOLL_US))
    assert one_toll(sync_seconds(lib, s))
