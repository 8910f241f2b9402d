from conftest import synthetic

from ccbridge.findings import findings
from ccbridge.results import Row


def by_id(res):
    return {f.id: f for f in findings(res)}


def small(times):
    return [Row.of("smallcopy.d2h32", "per_copy_time", "us", [t], streams=k) for k, t in zip((1, 2, 4, 8, 16), times)]


def test_small_copies_serialized_vs_overlapped():
    f = by_id(synthetic(small([40, 40, 39.5, 39.8, 39])))["smallcopy.overlap"]
    assert f.outcome == "serialized" and "no overlap" in f.text and "16 streams" in f.text
    assert by_id(synthetic(small([17, 12, 8, 6, 4])))["smallcopy.overlap"].outcome == "overlapped"


def test_semantics_summary_and_cases():
    rows = []
    for s, frac in (("same", 1.0), ("idle", 0.01), ("event-wait", 0.5)):
        r = Row.of("semantics.nonblocking", "return_fraction", "fraction", [frac], dir="h2d", mem="pinned", stream=s)
        r.extra.update(verdict={1.0: "blocks", 0.01: "async", 0.5: "partial"}[frac], busy_ms=50, call_us=1)
        rows.append(r)
    fs = by_id(synthetic(rows))
    assert fs["semantics.h2d.pinned.same"].outcome == "blocks" and not fs["semantics.h2d.pinned.same"].shown
    summary = fs["semantics.h2d.pinned"]
    assert summary.shown and summary.outcome == "blocks/async/partial"
    assert "blocks on the busy stream" in summary.text


def test_transfer_pinned_collapse_is_called_out():
    rows = [Row.of("transfer.sweep", "bandwidth", "GB/s", [v], dir="h2d", mem=m, bytes=1 << 30)
            for m, v in (("pinned", 11.0), ("pageable", 15.0))]
    f = by_id(synthetic(rows))["transfer.h2d.pinned_vs_pageable"]
    assert f.outcome == "pageable-faster" and "collapsed" in f.text


def test_concurrency_scaling_named_by_mode():
    rows = []
    for mode, lo, hi in (("streams", 5, 5.1), ("threads", 5, 5), ("contexts", 5, 35), ("processes", 10, 35)):
        rows += [Row.of("concurrency.scaling", "aggregate_bandwidth", "GB/s", [v], mode=mode, dir="h2d", n=n)
                 for n, v in ((1, lo), (16, hi))]
    f = by_id(synthetic(rows))["concurrency.h2d"]
    assert f.outcome == "scales with contexts+processes"
    assert "contexts 7.00x" in f.text


def test_real_run_findings(h100):
    fs = by_id(h100)
    assert fs["smallcopy.overlap"].outcome == "overlapped"
    assert fs["semantics.h2d.pinned.same"].outcome == "async"
    assert fs["semantics.d2h.pageable.same"].outcome == "blocks"
    assert fs["semantics.d2d.device.same"].outcome == "async"
    assert fs["concurrency.h2d"].outcome == "flat"
    assert fs["transfer.h2d.pinned_vs_pageable"].outcome == "pinned-faster"
    assert {"launch.cost", "hostcrypto", "lifecycle"} <= set(fs)


def test_hostcrypto_names_the_paths_each_variant_masks(h100):
    text = by_id(h100)["hostcrypto"].text
    assert "with the wide-vector (VAES/VPCLMUL) paths masked" in text and "with every AES-NI path masked" in text
    assert "no wide vector" not in text and "no aes ni" not in text  # the variant's name read as its effect


def test_no_rows_no_findings():
    assert findings(synthetic([])) == []


def test_peer_findings_from_a_two_gpu_run():
    from conftest import DATA

    from ccbridge import results

    res = results.load(DATA / "h200x2-peer.json")
    fs = by_id(res)
    assert "2 ordered pairs" in fs["peer.p2p"].text
    assert {f"peer.allreduce.{4 << 10}", f"peer.allreduce.{256 << 20}"} <= set(fs)
    big = next(r for r in res.by_test("peer.allreduce") if r.params["bytes"] == 256 << 20)
    # nccl-tests' all-reduce busbw: size / time * 2(n-1)/n
    assert big.extra["busbw_GBps"] == (256 << 20) / (big.median * 1e-6) * 2 * (2 - 1) / 2 / 1e9


def test_every_finding_names_a_test_whose_rows_it_read(h100):
    """findings.TESTS maps finding ids to the test they read (compare leaves out those of a test one side never
    ran): its twin is the rules' ids, so every finding the real runs give must map to a test of that run."""
    from conftest import DATA

    from ccbridge import results

    for res in (h100, results.load(DATA / "h200x2-peer.json")):
        tests = {r.test for r in res.rows}
        for f in findings(res):
            assert f.test in tests, f"{f.id}: test {f.test!r} (add its id's start to findings.TESTS)"


def crypto(default: list[float], wide: list[float], aesni: list[float]):
    """hostcrypto rows of one run: the default, wide-vector masked and AES-NI masked encrypt rates (GB/s)."""
    return synthetic([Row.of("hostcrypto.aes256gcm", "throughput", "GB/s", xs, variant=v, op="encrypt", threads=1)
                      for v, xs in (("default", default), ("no-wide-vector", wide), ("no-aes-ni", aesni))])


def test_hostcrypto_states_no_ratio_within_the_noise():
    """A 2-core machine under load: the default row's p10-p90 1.2-5.0 GB/s, the masked one's inside it. The old
    finding stated 1.67x (0.39x to 2.22x over six runs); rows whose ranges overlap get no ratio."""
    f = by_id(crypto([1.1, 1.2, 1.5, 2.0, 3.0, 4.5, 5.0, 5.2], [2.4, 2.9, 3.3, 3.6, 4.0], [0.28, 0.29, 0.30]))
    text = f["hostcrypto"].text
    assert "with the wide-vector (VAES/VPCLMUL) paths masked, no difference beyond this run's noise" in text
    assert "x with the wide-vector" not in text
    assert "0.12x with every AES-NI path masked" in text  # 0.29 vs 2.5 GB/s, ranges far apart: a real difference


def test_hostcrypto_states_the_ratio_of_rows_clearly_apart():
    f = by_id(crypto([9.0, 9.1, 9.2, 9.3, 9.4], [3.6, 3.7, 3.7, 3.8], [0.19, 0.19, 0.2]))
    text = f["hostcrypto"].text
    assert text.startswith("CPU AES-256-GCM (OpenSSL): 9.20 GB/s per core; 0.40x with the wide-vector")
    assert "0.02x with every AES-NI path masked" in text and "noise" not in text


def test_hostcrypto_judges_no_ratio_from_one_sample():
    text = by_id(crypto([9.0], [3.7], [0.2]))["hostcrypto"].text
    assert "x with" not in text and text.count("too few samples to compare") == 2
