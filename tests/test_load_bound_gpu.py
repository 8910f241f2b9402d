"""The loader's uncoupled bound on a GPU (marked): every figure measured in each pool shape, and the bench's report."""

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("need_gpu")]

from ccbridge import results  # noqa: E402
from ccbridge.load import bench, benchresult, bound, policy, synth  # noqa: E402
from ccbridge.textfit import fit  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("bound-gpu-ckpt")
    return d, [str(p) for p in synth.make_checkpoint(d, 24 * MiB, 8 * MiB, jobs=1)]


SHAPES = [{}, {"contexts": 0, "staging": "pageable"}, {"contexts": 2, "workers": 4, "staging": "pinned"},
          {"contexts": 2, "workers": 3, "staging": "pageable"}]


@pytest.mark.parametrize("opts", SHAPES, ids=["policy", "primary-pageable", "2ctx-pinned", "2ctx-pageable"])
def test_every_figure_is_measured(ckpt, opts):
    _, files = ckpt
    plan = policy.for_device(0, chunk_bytes=MiB, **opts)
    got = bound.measure(files, bound.shape_of(plan.config), repeat=2)
    assert got["streams"] == plan.config.workers and got["contexts"] == plan.config.contexts
    for k in bound.ROWS:
        assert got["gbps"][k] > 0 and len(got["samples"][k]) == 2 and all(v > 0 for v in got["samples"][k]), k
    # the copies move at least the checkpoint's bytes, in whole chunks (ceil over the chunks, then the workers)
    n, s = got["bytes"], got["samples"]
    assert n <= got["copy_bytes"] < n + (got["streams"] + 1) * MiB and s["copy_bytes"] == [got["copy_bytes"]] * 2
    for r in range(2):
        (r0, r1), (c0, c1) = s["reads_span_ns"][r], s["copies_span_ns"][r]
        assert min(r0, c0) == 0 and r0 < r1 and c0 < c1, (r0, r1, c0, c1)
        # the run at once's evidence: the spans' overlap over the shorter. Whether they did overlap is the host's
        # (this checkpoint's copies take under a millisecond, the readers' start can take as long: session 25 saw
        # the copies end before the reads began), and the report says so where they did not
        inter = max(0, min(r1, c1) - max(r0, c0))
        assert s["overlap"][r] == pytest.approx(inter / min(r1 - r0, c1 - c0), abs=1e-4)  # spans in whole ns
        scaled = c0 + (c1 - c0) * n / s["copy_bytes"][r]  # where the checkpoint's bytes of copies would have ended
        assert s["both_at_once"][r] == pytest.approx(n / (max(r1, scaled) - min(r0, c0)), rel=1e-3)
        assert s["both_at_once"][r] <= min(s["reads_at_once"][r], s["copies_at_once"][r]) * (1 + 1e-3)
    for k in bound.ROWS:
        assert got["best"][k] == max(s[k]) >= got["gbps"][k], k
    assert (got["overlap_warning"] is None) == (min(s["overlap"]) >= bound.MIN_OVERLAP)
    lines = bound.render_lines(got)
    assert lines[0].startswith("bound: ") and all(len(line) <= 120 for line in lines)


def test_load_bench_bound_reports_and_renders(ckpt, tmp_path):
    pytest.importorskip("torch")
    d, _ = ckpt
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "ccbridge", "load", str(d), "--bench", "--bound", "--repeat", "1",
                        "--chunk", "1MiB", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = results.load(out)  # a Result of kind load
    assert res.kind == "load" and {r.metric for r in res.by_test("load_bound")} == set(bound.ROWS)
    rep = benchresult.report_of(res)
    assert "error" not in rep["bound"] and all(v > 0 for v in rep["bound"]["gbps"].values())
    assert rep["bound"]["best"]["both_at_once"] >= rep["bound"]["gbps"]["both_at_once"]
    assert rep["bound"]["chunk_bytes"] == MiB and rep["bound"]["readers"] == rep["pool"]["workers"]
    assert "bound: " in r.stdout and "/ bound" in r.stdout
    assert all(len(line) <= 120 for line in r.stdout.splitlines())
    assert fit(bench.render(rep)).splitlines() == r.stdout.splitlines()
