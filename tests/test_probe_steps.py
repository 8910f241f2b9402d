"""bench/probe_steps.py: where a probe's seconds went, from its result.json (issue 35)."""

import subprocess
import sys
from pathlib import Path

from ccbridge.results import Result, Row

ROOT = Path(__file__).resolve().parents[1]


def _run(*args):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "probe_steps.py"), *map(str, args)],
                          capture_output=True, text=True)


def test_the_tests_and_their_slowest_steps_are_printed_slowest_first(tmp_path):
    res = Result(kind="probe", env={"emulation": {"active": False}}, settings={"quick": True},
                 rows=[Row.of("a.b", "m", "us", [1.5])])
    res.settings["seconds"] = {"concurrency.scaling": 11.9, "transfer.sweep": 9.5, "launch.overhead": 0.4}
    slow = "processes: closing contexts, opening 16 workers"
    res.settings["steps"] = {
        "concurrency.scaling": [{"step": "(before its first step)", "s": 0.01}, {"step": "streams x1 h2d", "s": 0.3},
                                {"step": slow, "s": 3.2}],
        "transfer.sweep": [{"step": "h2d pinned", "s": 4.1}]}
    res.save(tmp_path / "result.json")
    out = _run(tmp_path / "result.json", "--top", 3)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split() == ["11.90", "s", "concurrency.scaling"] and lines[3].endswith("launch.overhead")
    assert lines[4] == "slowest steps:" and "h2d pinned" in lines[5] and slow in lines[6]
    assert len(lines) == 8 and all(len(x) <= 120 for x in lines)


def test_a_file_that_is_no_probe_result_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    Result(kind="account", env={"emulation": {"active": False}}, settings={}, rows=[]).save(tmp_path / "acct.json")
    for args in ([tmp_path / "missing.json"], [tmp_path / "bad.json"], [tmp_path / "acct.json"],
                 [tmp_path / "acct.json", "--top", "-1"]):
        out = _run(*args)
        assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
