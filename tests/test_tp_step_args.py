"""bench/tp_step.py and bench/gemv.py: bad arguments are one line and exit 2 before any GPU is asked for; a good
--tiles file becomes serve/gemv.py's TUNED (their measurements run on a GPU)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
BENCH = Path(__file__).resolve().parents[1] / "bench"


def _run(script, *args):
    return subprocess.run([sys.executable, str(BENCH / script), *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "rows.json").write_text(json.dumps([{"n": 8, "k": 16}]))
    (tmp_path / "empty.json").write_text("[]")
    cases = [("tp_step.py", "--tp", "0"), ("tp_step.py", "--tiles", tmp_path / "missing.json"),
             ("tp_step.py", "--tiles", tmp_path / "bad.json"), ("tp_step.py", "--tiles", tmp_path / "rows.json"),
             ("tp_step.py", "--tiles", tmp_path / "empty.json"), ("gemv.py", "--tp", "0")]
    for script, *args in cases:
        out = _run(script, *args)
        assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, (args, out.stderr)
        assert len(out.stderr) <= 121, out.stderr


def test_gemv_json_rows_become_tuned_tiles(tmp_path):
    spec = importlib.util.spec_from_file_location("tp_step", BENCH / "tp_step.py")
    tp_step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tp_step)
    rows = [{"gemv": "qkv", "n": 1536, "k": 4096, "tile": [4, 512, 4], "fused_us": 8.5},
            {"gemv": "o", "n": 4096, "k": 1024, "tile": [2, 512, 4], "fused_us": 4.4}]
    (tmp_path / "g.json").write_text(json.dumps(rows))
    assert tp_step.tiles(tmp_path / "g.json") == {(1536, 4096): (4, 512, 4), (4096, 1024): (2, 512, 4)}
