"""The peer family's NCCL rows (the ones calibrate reads): on one GPU the one-rank all_reduce, on 2+ GPUs
all_reduce and the send/recv ring; the multi-GPU tests say why they are skipped on one GPU. The rank
launcher's error path and the row arithmetic run anywhere."""

import subprocess
import sys

import pytest

from ccbridge import results
from ccbridge.bindings import core
from ccbridge.emulate import calibrate, profiles
from ccbridge.errors import GpuError
from ccbridge.probe import peer, registry

MiB = 1 << 20

@pytest.fixture(scope="module")
def two_gpus(need_gpu):
    n = core.device_count()
    if n < 2:
        pytest.skip(f"needs 2+ GPUs (found {n})")
    return n


def ctx(quick: bool = True):
    settings = registry.Settings(device=0, quick=quick)
    return registry.ProbeContext(settings, registry.Machine.detect(0))


def ccbridge(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "ccbridge", *args], capture_output=True, text=True, timeout=timeout)


def test_bus_bandwidth_is_nccl_tests_and_rows_say_mode_size_and_ranks():
    payload = {"small": {"eager": {4096: [0.02, 0.03, 0.025]}, "graph": {4096: [0.01, 0.01, 0.012]}},
               "large": {256 << 20: [2.0, 2.5, 3.0]}}
    rows = {(r.metric, r.params.get("mode")): r for r in peer.rows(peer.ALLREDUCE, "all_reduce", payload, 4, 20)}
    assert rows[("time_per_op", "graph")].median == pytest.approx(10.0)  # ms per op -> us
    assert rows[("time_per_op", "eager")].params == {"bytes": 4096, "mode": "eager", "ranks": 4}
    bus = rows[("busbw", None)]
    assert bus.median == pytest.approx((256 << 20) / 2.5e-3 / 1e9 * 2 * 3 / 4) and bus.unit == "GB/s"
    assert bus.extra["time_us"] == pytest.approx(2500)
    ring = peer.rows(peer.SENDRECV, "sendrecv", payload, 4, 20)
    assert [r.median for r in ring if r.metric == "busbw"] == pytest.approx([(256 << 20) / 2.5e-3 / 1e9])


def test_findings_give_each_nccl_tests_smallest_op_both_ways_and_its_largest_bus_bandwidth():
    from ccbridge.findings import findings

    payload = {"small": {"eager": {4096: [0.0215], MiB: [0.04]}, "graph": {4096: [0.0095], MiB: [0.03]}},
               "large": {256 << 20: [2.0], 1 << 30: [6.0]}}
    res = results.Result(kind="probe", env={}, settings={},
                         rows=peer.rows(peer.ALLREDUCE, "all_reduce", payload, 2, 20)
                         + peer.rows(peer.ONE_RANK, "all_reduce", {**payload, "large": {}}, 1, 20))
    texts = {f.id: f.text for f in findings(res)}
    assert texts[peer.ALLREDUCE] == ("NCCL all_reduce, 2 GPU(s), 4 KiB: 9.5 us per op in a CUDA graph, 21.5 eager; "
                                     f"bus bandwidth {(1 << 30) / 6e-3 / 1e9:.0f} GB/s at 1 GiB.")
    assert texts[peer.ONE_RANK].startswith("NCCL one-rank all_reduce, 1 GPU(s), 4 KiB: 9.5 us") and \
        texts[peer.ONE_RANK].endswith("21.5 eager.")
    assert all(len(t) <= 120 for t in texts.values())


def test_a_rank_that_fails_is_named():
    """A device no machine has: the rank's own error comes back as a GpuError naming the rank, within the limit."""
    plan = peer.Plan("all_reduce", (4096,), (), ops=2, reps=1)
    with pytest.raises(GpuError, match=r"^all_reduce rank 0 of 1: GPU 4096 is not visible \(\d+ GPUs\)$"):
        peer.run_ranks([4096], plan, timeout_s=120)


@pytest.mark.parametrize("op", ["all_reduce", "sendrecv"])
@pytest.mark.gpu
def test_a_missing_contribution_fails_the_exact_check(need_gpu, op):
    """An op that moves nothing (a fake torch.distributed) leaves this rank's own input, or zeros, where the
    sum over 2 ranks or the previous rank's data belongs: the check refuses it."""
    import torch

    class Nothing:
        P2POp = staticmethod(lambda fn, t, peer: None)
        isend = irecv = None

        @staticmethod
        def all_reduce(t):
            pass

        @staticmethod
        def batch_isend_irecv(ops):
            return []

    torch.cuda.set_device(0)
    case = peer._Case(torch, Nothing, op, 4096, 3, rank=0, world=2)
    assert not (case.expect == 0).any() and not torch.equal(case.expect, case.input)
    with pytest.raises(GpuError, match=rf"{op} of 4096 B on rank 0 of 2: \d+ of 3072 values differ"):
        case.sample_ms(case.run_all)


@pytest.mark.gpu
def test_one_rank_all_reduce_gives_eager_and_graph_rows_at_4_kib(need_gpu):
    rows = peer.allreduce_1rank(ctx())
    assert sorted((r.test, r.metric, r.params["mode"], r.params["bytes"], r.params["ranks"]) for r in rows) == [
        (peer.ONE_RANK, "time_per_op", "eager", 4096, 1), (peer.ONE_RANK, "time_per_op", "graph", 4096, 1)]
    assert all(r.n == 10 and r.min >= 0 and r.extra["ops_per_sample"] == 20 for r in rows)


@pytest.mark.gpu
def test_probe_runs_the_one_rank_row_on_one_gpu_and_skips_the_rest_with_the_reason(need_gpu, tmp_path):
    p = ccbridge("probe", "--tests", "peer", "--quick", "--out", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    res = results.load(tmp_path / "result.json")
    assert not res.errors, res.errors
    assert {r.test for r in res.rows} >= {peer.ONE_RANK}
    if core.device_count() < 2:
        assert {s["test"]: s["reason"] for s in res.skipped} == {
            t: "needs 2+ GPUs, 1 visible" for t in ("peer.p2p", peer.ALLREDUCE, peer.SENDRECV)}


@pytest.mark.gpu
@pytest.mark.parametrize("profile", ["b300", "h200"])
def test_one_rank_graph_delta_under_a_profile_is_its_nccl_toll(need_gpu, tmp_path, profile):
    """With nccl_one_rank=1, as calibrate's own emulated probe sets it, a one-rank operation pays the toll:
    calibrate's one-rank check holds (the graph-replayed delta within 15% of the profile's nccl_toll_us) and the rows
    are labelled EMULATED."""
    for kind in ("native", "emulated"):
        args = ["--profile", profile, "--set", "nccl_one_rank=1"] if kind == "emulated" else []
        p = ccbridge("probe", *args, "--tests", peer.ONE_RANK, "--quick", "--out", str(tmp_path / kind))
        assert p.returncode == 0, p.stdout + p.stderr
    nat, emu = (results.load(tmp_path / k / "result.json") for k in ("native", "emulated"))
    assert emu.emulated and not emu.errors and not nat.errors
    check = calibrate.one_rank_toll(profiles.load(profile), nat, emu)
    assert check.ok is True, check


@pytest.mark.gpu
def test_allreduce_on_every_gpu_is_exact_and_gives_latency_and_bus_bandwidth_rows(two_gpus):
    rows = peer.allreduce(ctx())
    latency = {(r.params["bytes"], r.params["mode"]) for r in rows if r.metric == "time_per_op"}
    assert latency == {(b, m) for b in peer.SMALL_BYTES for m in peer.MODES}
    bus = [r for r in rows if r.metric == "busbw"]
    assert [r.params["bytes"] for r in bus] == [256 << 20] and bus[0].median > 0
    assert all(r.params["ranks"] == two_gpus for r in rows)


@pytest.mark.gpu
def test_sendrecv_ring_on_every_gpu_is_exact_and_gives_latency_and_bandwidth_rows(two_gpus):
    rows = peer.sendrecv(ctx())
    assert {(r.params["bytes"], r.params["mode"]) for r in rows if r.metric == "time_per_op"} == {
        (b, m) for b in peer.SMALL_BYTES for m in peer.MODES}
    assert [r.params["bytes"] for r in rows if r.metric == "busbw"] == [256 << 20]


@pytest.mark.gpu
def test_nvls_stays_off_in_the_ranks_whatever_the_caller_chose(need_gpu, monkeypatch, tmp_path):
    """On shared machines NVLink multicast must stay off: the ranks run with NCCL_NVLS_ENABLE=0 even where the
    caller's environment turns it on (ccbridge.ranks), and NCCL's own log says so (a one-rank communicator reads it
    too)."""
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(tmp_path / "nccl.%h.%p.log"))
    peer.run_ranks([0], peer.Plan("all_reduce", (4096,), (), ops=2, reps=1))
    logs = "".join(f.read_text(errors="replace") for f in tmp_path.glob("nccl.*.log"))
    assert logs and "NCCL_NVLS_ENABLE set by environment to 0" in logs
