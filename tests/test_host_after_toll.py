"""bench/host_after_toll.py: bad arguments are one line and exit 2, before torch is imported."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "host_after_toll.py"


def test_bad_arguments_are_one_line_and_exit_2():
    for args in (["-n", "5"], ["--spin-us", "-1"], ["-n", "x"]):
        out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
        assert out.returncode == 2 and out.stdout == "", (args, out)
        assert len([x for x in out.stderr.splitlines() if "error" in x or "host_after_toll:" in x]) == 1, out.stderr


def test_the_work_it_times_is_the_same_each_call():
    sys.path.insert(0, str(SCRIPT.parent))
    import host_after_toll as h
    d = {i: i * i for i in range(200)}
    assert h.work(d) == sum(i * i for i in range(60)) and h.work(d) == h.work(d)
    assert len(h.timed(10, lambda: None, d)) == 10
