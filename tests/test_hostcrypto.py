import pytest

from ccbridge import env
from ccbridge.probe import hostcrypto


def test_masks_name_the_documented_bits():
    # OPENSSL_ia32cap(3): word 0 bit 57 AES-NI, bit 33 PCLMULQDQ; word 1 bits 41/42 VAES/VPCLMULQDQ.
    w0, w1 = hostcrypto.VARIANTS["no-aes-ni"].split(":")
    assert int(w0.lstrip("~"), 16) == (1 << 57) | (1 << 33)
    assert int(w1.lstrip("~"), 16) == (1 << 41) | (1 << 42)
    assert hostcrypto.VARIANTS["no-wide-vector"] == f":~{(1 << 41) | (1 << 42):#x}"
    assert hostcrypto.VARIANTS["default"] is None


def test_worker_measures_both_directions():
    for op in ("encrypt", "decrypt"):
        out = hostcrypto.run_variant("default", op, 1, 0.05)
        assert len(out["samples"]) >= 3 and all(s > 0 for s in out["samples"])
        assert out["openssl"].startswith("OpenSSL")


@pytest.mark.skipif(not env.cpu_info()["flags"].get("aes"), reason="CPU without AES-NI: nothing to mask")
def test_aesni_mask_reaches_openssl():
    # A behaviour check, not a benchmark: the table-based fallback is an order of
    # magnitude slower, so a mask that never reached OpenSSL would show ~1x. Each variant's best sample: the one
    # a loaded CPU disturbed least (a worst one may be anything).
    fast = max(hostcrypto.run_variant("default", "encrypt", 1, 0.05)["samples"])
    slow = max(hostcrypto.run_variant("no-aes-ni", "encrypt", 1, 0.05)["samples"])
    assert slow < 0.5 * fast


def test_family_rows(monkeypatch):
    from ccbridge.probe.registry import Machine, ProbeContext, Settings

    ctx = ProbeContext(Settings(quick=True), Machine())
    rows = hostcrypto.aes256gcm(ctx)
    variants = {(r.params["variant"], r.params["op"]) for r in rows}
    assert {("default", "encrypt"), ("no-wide-vector", "encrypt"), ("no-aes-ni", "encrypt"), ("default", "decrypt")} <= variants
    assert all(r.unit == "GB/s" and r.n >= 3 for r in rows)


def test_workers_started_ahead_measure_at_their_turn_and_leave_unasked():
    """The family's interpreters start ahead (with the probe) and wait: each measures when asked, in the plan's order
    or any other; those never asked leave on close() without measuring, and none is left running."""
    w = hostcrypto.Workers([("default", "encrypt", 1), ("no-aes-ni", "encrypt", 1), ("default", "decrypt", 1)], 0.05)
    out = w.result(2)
    assert len(out["samples"]) >= 3 and all(s > 0 for s in out["samples"])
    # the measurement began once every worker was ready: none started up beside it
    assert None not in w.ready_at and out["started"] >= max(w.ready_at)
    w.close()
    assert all(p.poll() == 0 for p in w.procs)
