from ccbridge.bindings import core
from ccbridge.probe import concurrency, semantics, transfer
from ccbridge.ui import human_bytes


def test_semantics_verdict_thresholds():
    assert semantics.verdict(0.0) == "async"
    assert semantics.verdict(0.19) == "async"
    assert semantics.verdict(0.5) == "partial"
    assert semantics.verdict(0.81) == "blocks"
    assert semantics.verdict(1.01) == "blocks"


def test_semantics_cases_cover_the_matrix_plus_control():
    cases = list(semantics.cases())
    assert len(cases) == 2 * 2 * 3 + 1
    assert cases[-1] == ("d2d", "device", "same")


def test_transfer_sizes_and_names():
    assert transfer.SIZES_FULL[0] == 4096 and transfer.SIZES_FULL[-1] == 1 << 30
    assert human_bytes(4096) == "4 KiB" and human_bytes(1 << 30) == "1 GiB"
    assert human_bytes(32) == "32 B" and human_bytes(1536) == "1536 B"


def test_concurrency_splits_total_over_workers():
    assert concurrency._worker_iters(2 << 30, 1, 32 << 20) == 64
    assert concurrency._worker_iters(2 << 30, 16, 32 << 20) == 4
    assert concurrency._worker_iters(1 << 20, 16, 32 << 20) == 2


def test_aggregate_bandwidth_uses_the_union_window():
    a = core.CopyOut(0.0, 1e9, 0.0, 10e9)
    b = core.CopyOut(0.5e9, 2e9, 0.0, 10e9)
    assert core.aggregate_gbps([a, b]) == 10.0  # 20 GB over 2 s
