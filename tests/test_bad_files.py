"""Every file ccbridge reads back, malformed: one line naming the file and the field path, exit 2, never a
traceback (issue 33, item 4). The fixtures are in tests/data/bad/; results go through report, compare and
advise, the other files through the command that reads them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ccbridge.cli import main

BAD = Path(__file__).parent / "data" / "bad"
GOOD = Path(__file__).parent / "data" / "h100-native-full.json"

# result.json files, and the field each breaks (the first five crashed report, compare and advise before)
RESULTS = {
    "env_gpus_of_strings.json": "env.nvml.gpus[0]: 'x' is not of type 'object'",
    "env_gpus_a_number.json": "env.nvml.gpus: 3 is not of type 'array'",
    "env_cpu_flags_a_list.json": "env.cpu.flags: [1] is not of type 'object'",
    "env_gpu_name_a_number.json": "env.nvml.gpus[0].name: 5 is not of type 'string', 'null'",
    "env_cc_a_string.json": "env.nvml.cc: 'on' is not of type 'object'",
    "kind_unknown.json": "kind: 'training' is not one of probe, decode, decode_tp, kv, account, net, ddp, cipher, "
                         "collectives, load",
    "v1_of_no_kind.json": "a version-1 result of no kind this ccbridge can tell (settings gpus): write it again with "
                          "this ccbridge",
    "decode_with_probe_settings.json": "settings: 'decode' is a required property",
    "kv_mode_unknown.json": "rows[0].params.mode: 'later' is not one of sync, async",
}


def _one_line(capsys, rc: int, command: str, path: Path, fragment: str) -> None:
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "Traceback" not in err, err
    assert err.splitlines() == [f"ccbridge {command}: {path}: {fragment}"]


@pytest.mark.parametrize("name", RESULTS)
def test_a_malformed_result_is_one_line_in_report_compare_and_advise(tmp_path, capsys, name):
    path = BAD / name
    _one_line(capsys, main(["report", str(path), "--out", str(tmp_path / "rep")]), "report", path, RESULTS[name])
    assert not (tmp_path / "rep").exists()
    _one_line(capsys, main(["compare", str(GOOD), str(path)]), "compare", path, RESULTS[name])
    _one_line(capsys, main(["compare", str(path), str(GOOD)]), "compare", path, RESULTS[name])
    _one_line(capsys, main(["advise", str(GOOD), str(path)]), "advise", path, RESULTS[name])


@pytest.mark.parametrize("argv, name, fragment", [
    (["advise"], "stamp_gpus_of_strings.json", "nvml.gpus[0]: 'x' is not of type 'object'"),
    (["plan-tenants", "--request", "1", "--from-stamp"], "stamp_gpus_of_strings.json",
     "nvml.gpus[0]: 'x' is not of type 'object'"),
    (["advise"], "stamp_emulated_without_profile.json", "emulation.profile: None is not of type 'string'"),
    (["profiles"], "profile_empty_source.json", "params.lanes.source: '' must be a non-empty string"),
    (["profiles"], "profile_zero_tolerance.json", "targets.h2d_pinned_ratio.tolerance: 0 is less than or equal to "
                                                  "the minimum of 0"),
    (["calibrate", "--native", str(GOOD), "--emulated", str(GOOD), "--profile"], "profile_empty_source.json",
     "params.lanes.source: '' must be a non-empty string"),
])
def test_a_malformed_stamp_or_profile_is_one_line(capsys, argv, name, fragment):
    path = BAD / name
    _one_line(capsys, main([*argv, str(path)]), argv[0], path, fragment)


@pytest.mark.parametrize("prefix, fragment", [
    ("trace_neg", "calls.cuInit: -1 is less than the minimum of 0"),
    ("trace_crossings", "crossings.h2d: 5 is not of type 'object'"),
])
def test_a_malformed_trace_summary_is_one_line(capsys, prefix, fragment):
    rc = main(["trace", str(BAD / prefix)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.splitlines() == [
        f"ccbridge trace: trace summary {BAD / prefix}.7.summary.json: {fragment}"]


def test_a_malformed_checkpoint_index_is_one_line(tmp_path, capsys):
    folder = shutil.copytree(BAD / "index_weight_map_of_numbers", tmp_path / "ck")
    _one_line(capsys, main(["load", str(folder), "--device", "cpu"]), "load", folder / "model.safetensors.index.json",
              "malformed index: weight_map.a: 5 is not of type 'string'")
