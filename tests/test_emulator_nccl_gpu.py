"""The emulator's NCCL side on one GPU (marked): a one-rank NCCL job through torch and through a ctypes-loaded
libnccl (tests/gpu/nccl_one_rank.py), natively, under passthrough and under b300 with --record.

Each collective is a trace line with its charge; the GPU timeline of an all_reduce (events around it, the GPU
kept busy ahead so that host launch costs stay hidden) is longer by the profile's per-operation toll, within
15%, eager and graph-replayed; results stay exact; multicast stays off (the attribute reads 0 under b300).
Run through scripts/device-check (PARTS=mgpu also prints the figures).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ccbridge.emulate import profiles, trace

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("need_gpu")]
PROG = Path(__file__).parent / "gpu" / "nccl_one_rank.py"


def job(*prefix, reps=40):
    p = subprocess.run([*prefix, sys.executable, str(PROG), str(reps)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def ccbridge_run(*args):
    return [sys.executable, "-m", "ccbridge", "run", *args, "--"]


@pytest.fixture(scope="module")
def native():
    return job()


def test_one_rank_nccl_under_b300_pays_the_toll_on_the_gpu_timeline_and_traces_each_collective(native, tmp_path):
    """One rank crosses no GPU, so b300 charges it nothing; with nccl_one_rank=1 (calibration's setting) it pays
    the toll, which one GPU can then measure."""
    plain = job(*ccbridge_run("--profile", "b300"))
    for way in ("torch", "ctypes"):
        delta = plain[way]["eager_device_us"] - native[way]["eager_device_us"]
        assert abs(delta) <= 0.15 * profiles.load("b300").params["nccl_toll_us"].value, (way, delta)
    prefix = tmp_path / "t"
    emu = job(*ccbridge_run("--profile", "b300", "--set", "nccl_one_rank=1", "--record", str(prefix)))
    toll = profiles.load("b300").params["nccl_toll_us"].value
    for way in ("torch", "ctypes"):
        assert native[way]["exact"] and emu[way]["exact"], way
        delta = emu[way]["eager_device_us"] - native[way]["eager_device_us"]
        assert abs(delta - toll) <= 0.15 * toll, f"{way}: GPU timeline +{delta:.2f} us, toll {toll} us"
    delta = emu["torch"]["graph_device_us_per_op"] - native["torch"]["graph_device_us_per_op"]
    assert abs(delta - toll) <= 0.15 * toll, f"graph replay: +{delta:.2f} us per op, toll {toll} us"
    s = trace.summarize(str(prefix))
    lines = s.by_api[("ncclAllReduce", "-", "-")]
    assert lines["kind"] == "collective"
    # every eager op and every captured one has its line; each charged the toll (one rank: no wire bytes)
    assert lines["count"] >= 2 * 40 + 20
    assert lines["toll_ns"] == pytest.approx(lines["count"] * toll * 1e3)
    rows = [r for r in trace_rows(prefix) if r["kind"] == "collective"]
    assert {r["ranks"] for r in rows} == {"1"} and {r["wire_bytes"] for r in rows} == {"0"}


def trace_rows(prefix):
    import csv

    out = []
    for path in sorted(Path(prefix).parent.glob(Path(prefix).name + ".*.csv")):
        lines = path.read_text().splitlines()
        out += list(csv.DictReader(lines[1:]))
    return out


def test_passthrough_leaves_the_job_exact_and_its_device_time_unchanged(native):
    passed = job(*ccbridge_run("--profile", "passthrough"))
    for way in ("torch", "ctypes"):
        assert passed[way]["exact"]
        # no charge: within the run-to-run spread of a 4 KiB all_reduce (a few tenths of a us), never a toll
        assert passed[way]["eager_device_us"] - native[way]["eager_device_us"] < 2.0, way


MULTICAST = r"""
import ctypes, os
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
v = ctypes.c_int(-1)
assert cu.cuDeviceGetAttribute(ctypes.byref(v), 132, 0) == 0  # CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
print(v.value, os.environ.get("NCCL_NVLS_ENABLE"), os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST"))
"""


def test_under_b300_multicast_reads_unsupported_and_the_libraries_are_told_so():
    # (the real cuMulticastCreate is never called here: on shared hosts it can take the GPUs out of service;
    # the CPU tests hold that the entry points refuse without reaching the driver)
    p = subprocess.run([*ccbridge_run("--profile", "b300"), sys.executable, "-c", MULTICAST], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "0", "1"]
