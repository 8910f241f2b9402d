"""bench/timer_agreement.py's judgement on the CPU: the paired statistic, and a recorded run judged again (issue 32)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
_spec = importlib.util.spec_from_file_location(
    "timer_agreement", Path(__file__).resolve().parents[1] / "bench" / "timer_agreement.py")
ta = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ta)


def test_the_judged_difference_is_the_median_of_signed_paired_differences():
    # rounds that move by 20% with the timers 2% apart in each: 2%, where the medians' ratio would mislead
    ev = [1.0, 1.2, 0.9, 1.1, 1.0]
    gt = [e * 1.02 for e in ev]
    assert ta.paired_diff(ev, gt) == pytest.approx(0.02)
    # noise either way around agreement: the signed median, not the median of |differences| (3.4% here)
    ev, gt = [1.0] * 5, [1.035, 0.997, 1.005, 0.909, 1.034]
    assert ta.paired_diff(ev, gt) == pytest.approx(0.005)
    assert ta.paired_diff([], []) == float("inf")


def _line(name, ev, gt, own_ns=5000.0, **extra):
    return json.dumps(dict({"figure": name, "stamp_cost_ns": own_ns, "rounds": {"events": ev, "globaltimer": gt}},
                           **extra))


def test_a_recorded_run_is_judged_as_the_timer_now_reads(tmp_path, capsys):
    """Lines from before the stamp's cost stopped being taken off get it back per call (not the C kernel gap's);
    lines written since are judged as they are; a figure past its bound makes the exit 1."""
    f = tmp_path / "old.json"
    f.write_text("\n".join([
        "# a comment line",
        _line("graph_replay_50", [0.051] * 5, [0.046] * 5),  # 0.046 + 0.005 = 0.051: agreed
        _line("peer_allreduce_graph_4KiB_x4", [0.0130] * 5, [0.01275] * 5),  # + 5 us / 20 ops = 0.013
        _line("small_kernels_x100", [0.0068] * 5, [0.00675] * 5),  # + 5 us / 100 calls = 0.0068
        _line("kernel_gap", [0.0015] * 5, [0.0014] * 5),  # as recorded: 6.7%, within its wide bound
    ]) + "\n")
    assert ta.rejudge(str(f)) == 0
    got = {d["figure"]: d for d in map(json.loads, capsys.readouterr().out.splitlines())}
    assert got["graph_replay_50"]["diff"] == pytest.approx(0, abs=1e-9)
    assert got["peer_allreduce_graph_4KiB_x4"]["diff"] == pytest.approx(0, abs=1e-9)
    assert got["peer_allreduce_graph_4KiB_x4"]["calls"] == 20 and got["small_kernels_x100"]["calls"] == 100
    assert got["small_kernels_x100"]["bound"] == pytest.approx(0.05)  # 2 x 5 us over 100 x 6.8 us: under 5%
    assert got["kernel_gap"]["diff"] == pytest.approx(1 / 15)
    new = tmp_path / "new.json"
    new.write_text(_line("matmul_bf16_4096", [0.2364] * 5, [0.2212] * 5, stamp_taken_off=False, calls=1) + "\n")
    assert ta.rejudge(str(new)) == 1  # 6.4% > 5%: out
    assert json.loads(capsys.readouterr().out)["within"] is False


@pytest.mark.parametrize("text", [None, "not json {\n", '{"figure": "x"}\n'])
def test_a_file_that_is_no_record_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, text):
    f = tmp_path / "r.json"
    if text is not None:
        f.write_text(text)
    monkeypatch.setattr("sys.argv", ["timer_agreement.py", "--rejudge", str(f)])
    assert ta.main() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"--rejudge {f}: not a timer_agreement record")
