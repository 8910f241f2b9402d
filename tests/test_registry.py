import pytest

from ccbridge import resultschema
from ccbridge.probe import registry
from ccbridge.probe.registry import Machine, Settings
from ccbridge.results import Row
from ccbridge.schema import Schema


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
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls, d, **kw: Machine(0, {"gpu": "no usable GPU: test"}, True)))
    res = registry.run(Settings(quick=True), {"emulation": {"active": False}})
    assert res.skipped == [{"test": "fake.gpu", "reason": "no usable GPU: test"}]
    assert [e["test"] for e in res.errors] == ["fake.bad"] and "refused CUDA call" in res.errors[0]["error"]
    assert [r.test for r in res.rows] == ["fake.good"] and calls == ["quick"]


class _Handle:
    def __init__(self, log, name):
        self.log, self.name = log, name
        log.append(("started", name))

    def close(self):
        self.log.append(("closed", self.name))


def test_ahead_handles_start_before_the_run_reach_their_tests_and_are_always_closed(monkeypatch):
    """What a test's ahead() started is its ctx.ahead; one whose start failed leaves the test to start its own;
    each run test's seconds are in the settings. Handles the caller started are the caller's to close (the probe
    closes them after its reports, which hide their ends); those run() started itself it closes when the run
    ends, the test's own, a failed test's and a skipped test's alike."""
    log, seen = [], {}

    def ahead(name):
        return lambda settings: _Handle(log, name)

    def broken(settings):
        raise OSError("no interpreter")

    def uses(ctx):
        seen[ctx.settings.tests] = ctx.ahead
        log.append(("ran", ctx.ahead.name if ctx.ahead else None))
        return [Row.of("fake.a", "m", "us", [1])]

    def fails(ctx):
        raise RuntimeError("refused")

    fake = {"fake.a": registry.Test("fake.a", "uses", (), uses, ahead("a")),
            "fake.b": registry.Test("fake.b", "fails", (), fails, ahead("b")),
            "fake.c": registry.Test("fake.c", "skipped", ("gpu",), uses, ahead("c")),
            "fake.d": registry.Test("fake.d", "start failed", (), uses, broken)}
    monkeypatch.setattr(registry, "REGISTRY", fake)
    monkeypatch.setattr(registry, "load_families", lambda: None)
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls, d, **kw: Machine(0, {"gpu": "no usable GPU: test"}, True)))
    settings = Settings(quick=True)
    started = registry.prestart(settings)
    assert log == [("started", "a"), ("started", "b"), ("started", "c")] and started["fake.d"] is None
    res = registry.run(settings, {"emulation": {"active": False}}, started=started)
    assert ("ran", "a") in log and ("ran", None) in log  # fake.d started its own
    assert not [n for what, n in log if what == "closed"]  # the caller's
    assert set(res.settings["seconds"]) == {"fake.a", "fake.b", "fake.d"}
    assert all(s >= 0 for s in res.settings["seconds"].values())
    log.clear()
    registry.run(settings, {"emulation": {"active": False}})
    assert sorted(n for what, n in log if what == "closed") == ["a", "b", "c"]
    assert log.index(("ran", "a")) < log.index(("closed", "a"))


def test_tests_without_torch_run_first_and_the_result_keeps_the_selection_order(monkeypatch):
    """torch's import hides behind the tests that need no torch: they run first (a host-only one after the import
    is over: it would share the CPU it measures), torch's tests after, one marked last (its processes end in the
    background) after every other; rows, errors and seconds come back in the order the tests were selected."""
    import threading
    import time as time_

    ran, importing = [], threading.Event()

    def make(name):
        def fn(ctx):
            ran.append((name, importing.is_set()))
            return [Row.of(name, "m", "us", [1])]
        return fn

    fake = {n: registry.Test(n, n, needs, make(n), last=n == "fake.l1") for n, needs in
            (("fake.l1", ("gpu", "torch")), ("fake.t1", ("gpu", "torch")), ("fake.g1", ("gpu",)), ("fake.h1", ()),
             ("fake.t2", ("torch",)))}
    monkeypatch.setattr(registry, "REGISTRY", fake)
    monkeypatch.setattr(registry, "load_families", lambda: None)
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls, d, **kw: Machine(1, {}, True)))
    monkeypatch.setattr(registry.core, "Session", lambda *a, **k: type("S", (), {"close": lambda self: None})())

    def slow_import():
        importing.set()
        time_.sleep(0.5)
        importing.clear()

    th = threading.Thread(target=slow_import)
    monkeypatch.setattr(registry, "_torch_import", th)
    th.start()
    res = registry.run(Settings(), {"emulation": {"active": False}})
    assert [n for n, _ in ran] == ["fake.g1", "fake.h1", "fake.t1", "fake.t2", "fake.l1"]
    assert dict(ran)["fake.h1"] is False  # the host-only test waited for the import to end
    assert [r.test for r in res.rows] == ["fake.l1", "fake.t1", "fake.g1", "fake.h1", "fake.t2"]
    assert list(res.settings["seconds"]) == ["fake.l1", "fake.t1", "fake.g1", "fake.h1", "fake.t2"]


def test_each_tests_steps_and_their_seconds_are_in_the_settings(monkeypatch):
    """Where a test's seconds went: each ctx.step's seconds to the next step or the test's end, after its lead-in;
    a test that names no step has none; the settings stay valid."""
    import time as time_

    def stepped(ctx):
        time_.sleep(0.02)
        ctx.step("open")
        time_.sleep(0.05)
        ctx.step("copy")
        time_.sleep(0.01)
        return [Row.of("fake.s", "m", "us", [1])]

    fake = {"fake.s": registry.Test("fake.s", "stepped", (), stepped),
            "fake.n": registry.Test("fake.n", "no steps", (), lambda ctx: [Row.of("fake.n", "m", "us", [1])])}
    monkeypatch.setattr(registry, "REGISTRY", fake)
    monkeypatch.setattr(registry, "load_families", lambda: None)
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls, d, **kw: Machine(0, {}, True)))
    res = registry.run(Settings(quick=True), {"emulation": {"active": False}})
    steps = res.settings["steps"]
    assert list(steps) == ["fake.s"] and [s["step"] for s in steps["fake.s"]] == ["(before its first step)", "open",
                                                                                   "copy"]
    lead, opened, copied = (s["s"] for s in steps["fake.s"])
    assert lead >= 0.015 and opened >= 0.045 and copied >= 0.005  # each at least its sleep (a busy host: more)
    assert abs(lead + opened + copied - res.settings["seconds"]["fake.s"]) < 0.01
    Schema(resultschema.SETTINGS["probe"]).check(res.settings, "the probe's settings", ValueError)


def test_torch_imports_with_a_short_switch_interval_then_the_interpreter_gets_its_own_back():
    import sys

    was = sys.getswitchinterval()
    th = registry.import_torch_early()
    assert sys.getswitchinterval() in (registry.IMPORT_SWITCH_S, was)  # (was: the import already over)
    th.join()
    assert sys.getswitchinterval() == was


def test_torch_imported_early_twice_still_gives_the_interpreter_its_own_switch_interval_back(monkeypatch):
    """A second call while torch imports gives the same thread: it never takes the short interval for the one to
    restore. The import is held (a finder that waits, then finds nothing) so that the calls overlap."""
    import sys
    import threading

    gate = threading.Event()

    class Held:
        def find_spec(self, name, path=None, target=None):
            if name == "torch":
                gate.wait(30)
                raise ImportError("held by the test")
            return None

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Held(), *sys.meta_path])
    was = sys.getswitchinterval()
    first = registry.import_torch_early()
    second = registry.import_torch_early()
    assert sys.getswitchinterval() == registry.IMPORT_SWITCH_S
    gate.set()
    first.join(30)
    second.join(30)
    assert sys.getswitchinterval() == was and second is first
    third = registry.import_torch_early()  # over: a new import, from the interpreter's own interval
    third.join(30)
    assert third is not first and sys.getswitchinterval() == was
