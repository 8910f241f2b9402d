"""Calibration logic on the CPU: targets and law checks from a native and an emulated result."""

import copy

import pytest

from ccbridge.emulate import calibrate, profiles
from ccbridge.results import Result

from conftest import synthetic


def as_emulated(res: Result, scale: dict) -> Result:
    """A copy of a native result, labelled emulated, with chosen rows scaled."""
    emu = copy.deepcopy(res)
    emu.env = {**emu.env, "emulation": {"active": True, "profile": "b300"}}
    for r in emu.rows:
        for (test, metric, params), f in scale.items():
            if r.test == test and r.metric == metric and all(r.params.get(k) == v for k, v in params):
                r.median *= f
    return emu


def check(checks, cid):
    return next(c for c in checks if c.id == cid)


def test_transfer_ratio_target_holds_when_the_emulated_run_matches(h100):
    emu = as_emulated(h100, {("transfer.sweep", "bandwidth", (("dir", "h2d"), ("mem", "pinned"))): 0.2})
    checks = calibrate.evaluate(profiles.load("b300"), h100, emu)
    c = check(checks, "h2d_pinned_ratio")
    assert c.measured == pytest.approx(0.2) and c.ok is True
    assert check(checks, "d2h_pinned_ratio").ok is False  # left at native speed: ratio 1, target 0.211


def test_native_verdicts_fail_the_law_and_name_the_cases(h100):
    checks = calibrate.law_checks(as_emulated(h100, {}))
    sem = check(checks, "semantics")
    assert sem.ok is False
    assert "h2d/pinned/same: async (law: blocks)" in sem.measured
    assert check(checks, "streams_h2d").ok is True      # natively flat...
    assert check(checks, "contexts_h2d").ok is False    # ...and contexts add nothing


def test_missing_rows_are_not_counted_as_holding(h100):
    empty = synthetic([], emulated="b300")
    checks = calibrate.evaluate(profiles.load("b300"), h100, empty)
    assert all(c.ok is None for c in checks)
    assert "| n/a |" in calibrate.render(profiles.load("b300"), checks, h100, empty)


def test_sides_must_be_labelled_right(h100):
    with pytest.raises(ValueError, match="not made under the emulator"):
        calibrate.evaluate(profiles.load("b300"), h100, h100)
    with pytest.raises(ValueError, match="native' result was made under the emulator"):
        calibrate.evaluate(profiles.load("b300"), as_emulated(h100, {}), as_emulated(h100, {}))


def test_every_shipped_target_has_a_rule():
    for name in profiles.names():
        for tid in profiles.load(name).targets:
            assert tid in calibrate.TARGETS, (name, tid)


def test_profile_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"params": {"h2d_pinned_gbps": {"value": 1}}}')
    with pytest.raises(profiles.ProfileError, match="needs a 'source'"):
        profiles.load(str(bad))
    bad.write_text("{nope")
    with pytest.raises(profiles.ProfileError, match="not valid JSON"):
        profiles.load(str(bad))
    with pytest.raises(profiles.ProfileError, match="unknown profile 'b999'"):
        profiles.load("b999")
