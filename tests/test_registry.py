import pytest

from ccbridge.probe import registry
from ccbridge.probe.registry import Machine, Settings
from ccbridge.results import Row


def test_every_family_is_registered_once():
    names = [t.name for t in registry.select(None)]
    assert len(names) == len(set(names))
    assert {t.family for t in registry.select(None)} == {"compute", "transfer", "semantics", "smallcopy", "concurrency",
                                                         "launch", "toll", "framework", "lifecycle", "hostcrypto",
                                                         "peer"}


def test_select_by_family_and_name():
    assert [t.name for t in registry.select("peer")] == ["peer.p2p", "peer.allreduce", "peer.sendrecv", "peer.allreduce_1rank"]
    assert [t.name for t in registry.select("launch.cost,launch")] == ["launch.cost"]
    with pytest.raises(ValueError, match="no probe test or family named 'bogus'; `ccbridge probe --list` names them"):
        registry.select("bogus")
    with pytest.raises(ValueError, match="named 'transfr' \\(did you mean transfer\\?\\)"):
        registry.select("transfr")
    for nothing in ("", ",", " , "):  # an empty list names no test: refused, not the whole suite
        with pytest.raises(ValueError, match="names no test"):
            registry.select(nothing)


def test_duplicate_and_unknown_needs_refused():
    with pytest.raises(ValueError, match="registered twice"):
        registry.test("launch.cost", "again")(lambda ctx: [])
    with pytest.raises(ValueError, match="unknown needs"):
        registry.test("x.y", "t", needs=("tpu",))


def test_run_skips_with_reason_and_survives_errors(monkeypatch):
    calls = []

    def good(ctx):
        calls.append(ctx.pick("full", "quick"))
        return [Row.of("fake.good", "m", "us", [1, 2])]

    def bad(ctx):
        raise RuntimeError("refused CUDA call")

    fake = {"fake.gpu": registry.Test("fake.gpu", "needs gpu", ("gpu",), good),
            "fake.bad": registry.Test("fake.bad", "fails", (), bad),
            "fake.good": registry.Test("fake.good", "works", (), good)}
    monkeypatch.setattr(registry, "REGISTRY", fake)
    monkeypatch.setattr(registry, "load_families", lambda: None)
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls, d: Machine(0, {"gpu": "no usable GPU: test"})))
    res = registry.run(Settings(quick=True), {"emulation": {"active": False}})
    assert res.skipped == [{"test": "fake.gpu", "reason": "no usable GPU: test"}]
    assert [e["test"] for e in res.errors] == ["fake.bad"] and "refused CUDA call" in res.errors[0]["error"]
    assert [r.test for r in res.rows] == ["fake.good"] and calls == ["quick"]
