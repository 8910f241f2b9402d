"""The examples accounted on GPUs as README's "Try it without a GPU" says to record them: the decode loop on one
GPU, the DDP steps under torchrun on two (each rank over its marked steps). Run through scripts/device-check."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the examples need torch")

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU")]


def _account(out: Path, *cmd: str) -> dict:
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    proc = subprocess.run([sys.executable, "-m", "ccbridge", "account", "--profile", "b300", "--out", str(out), "--",
                           *cmd], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "result.json").read_text())


def _launches(res: dict) -> dict:
    """cuLaunchKernel's account.api rows, by metric."""
    return {r["metric"]: r for r in res["rows"]
            if r["test"] == "account.api" and r["params"]["api"] == "cuLaunchKernel"}


def test_the_decode_loop_pays_the_launch_toll_on_every_recorded_step(tmp_path):
    res = _account(tmp_path / "acc", sys.executable, "examples/decode_loop.py", "--steps", "16", "--warmup", "2")
    launch = _launches(res)
    # the recorded steps' launches only (the sample's 128 steps made 1280: 10 a step), the same count both runs
    assert launch["share_of_slowdown"]["extra"]["calls"] == [160, 160]
    assert launch["in_call_delta"]["median"] > 0 and launch["in_call_delta"]["extra"]["toll_ms"] > 0
    # each trace says where it was recorded: this GPU, under the profile it ran
    for side, profile in (("native", "passthrough"), ("emulated", "b300")):
        stamp = json.loads((tmp_path / "acc" / f"{side}.env.json").read_text())["env"]
        assert stamp["nvml"]["gpus"][0]["name"] == torch.cuda.get_device_name(0), stamp["nvml"]
        assert stamp["emulation"]["profile"] == profile and stamp["emulation"]["active"] == (side == "emulated")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2+ GPUs (one rank per GPU)")
def test_the_ddp_steps_are_accounted_per_rank_over_their_marks(tmp_path):
    res = _account(tmp_path / "acc", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                   "examples/ddp_steps.py", "--steps", "4", "--warmup", "2")
    slow = {r["params"]["rank"]: r for r in res["rows"] if r["test"] == "account.rank" and r["metric"] == "slowdown"}
    # each rank on the window its marks made; "all" is their sum
    assert {k: r["extra"]["window"] for k, r in slow.items()} == {0: "marks", 1: "marks", "all": "sum"}, slow
