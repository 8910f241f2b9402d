"""What-if overrides (--set KEY=VALUE): checked as a profile file's values are, and recorded."""

import pytest

from ccbridge.emulate import profiles
from ccbridge.emulate.profiles import ProfileError


def test_override_replaces_values_and_says_what_they_were():
    base = profiles.load("b300")
    p = profiles.override(base, ["launch_toll_us=0", " h2d_pinned_gbps = 20 ", "lanes=4"])
    assert p.params["launch_toll_us"].value == 0 and p.params["h2d_pinned_gbps"].value == 20
    assert p.params["launch_toll_us"].source == "overridden on the command line (was 18.6)"
    assert p.overrides == {"launch_toll_us": 18.6, "h2d_pinned_gbps": 11.26, "lanes": 6}
    assert p.params["sync_toll_us"] == base.params["sync_toll_us"] and p.targets == base.targets
    assert base.params["launch_toll_us"].value == 18.6 and not base.overrides  # the loaded profile is untouched
    text = p.config_text()
    assert "\nlaunch_toll_us=0\n" in text and "\nlanes=4\n" in text and "#was launch_toll_us=18.6\n" in text


def test_setting_a_key_again_keeps_the_profile_value_as_was():
    p = profiles.override(profiles.override(profiles.load("b300"), ["sync_toll_us=1"]), ["sync_toll_us=2"])
    assert p.params["sync_toll_us"].value == 2 and p.overrides == {"sync_toll_us": 22.4}
    assert "(was 22.4)" in p.params["sync_toll_us"].source


def test_no_settings_is_the_profile():
    base = profiles.load("h200")
    assert profiles.override(base, []) == base and profiles.override(base, None) == base


@pytest.mark.parametrize("setting,match", [
    ("warps=2", r"--set 'warps=2': unknown parameter 'warps'; `ccbridge profiles NAME` lists them"),
    ("launch_toll_us", "expected KEY=VALUE"),
    ("=3", "expected KEY=VALUE"),
    ("launch_toll_us=", "expected KEY=VALUE"),
    ("launch_toll_us=fast", "launch_toll_us needs a number, got 'fast'"),
    ("launch_toll_us=nan", r"parameter launch_toll_us = nan: expected a number in \[0, 10000000\] \(us\)"),
    ("sync_toll_us=inf", "parameter sync_toll_us = inf"),
    ("sync_toll_us=1e400", "parameter sync_toll_us = inf"),
    ("h2d_pinned_gbps=-1", r"expected a number in \[0, 10000\]"),
    ("h2d_pinned_ratio=1.5", r"expected a number in \[0.001, 1\]"),
    ("lanes=2.5", "expected a whole number in"),
    ("emulate=2", "expected a whole number in"),
])
def test_bad_settings_are_refused_naming_the_setting(setting, match):
    with pytest.raises(ProfileError, match=match) as e:
        profiles.override(profiles.load("b300"), ["launch_toll_us=1", setting])
    assert str(e.value).startswith(f"--set {setting!r}: ")


def test_a_profile_file_takes_overrides_too(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text((profiles._dir() / "b300.json").read_text())
    p = profiles.override(profiles.load(str(path)), ["d2h_toll_us=5"])
    assert p.path == str(path) and p.params["d2h_toll_us"].value == 5 and p.overrides == {"d2h_toll_us": 0.6}
