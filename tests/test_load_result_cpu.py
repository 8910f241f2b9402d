"""`ccbridge load --bench --json` writes a Result of kind load: its round trip prints the same report, its schema
refuses what it does not hold, and compare, report and advise take it as they take the other kinds."""

import json

import pytest
from test_load_bound_cpu import measured_bound, report

from ccbridge import env, results
from ccbridge.cli import main
from ccbridge.errors import ResultFileError
from ccbridge.load import bench, benchresult, bound

STAMP = env.stamp(with_torch=False)


def saved(tmp_path, rep, name="r.json", **more):
    path = tmp_path / name
    benchresult.to_result({**rep, "emulation": None, "ceiling_gbps": 55.12, **more}, STAMP, 1.5).save(path)
    return path


def evidenced(**kw):
    """A measured bound with the run at once's evidence per repeat, as bound.measure() returns it."""
    b = measured_bound(**kw)
    b["samples"].update({"reads_span_ns": [[0, 300]] * 3, "copies_span_ns": [[5, 310]] * 3,
                         "copy_bytes": [16_812_000_000] * 3, "overlap": [0.98] * 3})
    return {**b, "copy_bytes": 16_812_000_000}


BOUNDS = {"no bound": None, "measured": evidenced(), "failed": {**measured_bound(), "error": "GpuError: no memory"},
          "interrupted": {**measured_bound(), "error": "the run stopped before the bound finished"}}


@pytest.mark.parametrize("which", BOUNDS)
@pytest.mark.parametrize("ceiling", [None, 55.12])
def test_the_result_renders_as_the_report_it_was_made_from(tmp_path, which, ceiling):
    rep = {**report(bound=BOUNDS[which]), "emulation": None, "ceiling_gbps": 55.12}
    res = results.load(saved(tmp_path, rep))  # validated against the kind's schema
    assert res.kind == "load" and res.env == STAMP and res.duration_s == 1.5
    assert bench.render(benchresult.report_of(res), ceiling) == bench.render(rep, ceiling)
    assert res.skipped == [{"test": "load:fastsafetensors_nogds", "reason": "not installed here"}]
    loads = {r.metric: r for r in res.by_test("load")}
    assert set(loads) == {"ccbridge_prewarmed", "ccbridge_cold"}
    mine = loads["ccbridge_prewarmed"]
    assert mine.unit == "GB/s" and mine.params == {"loader": "ccbridge prewarmed"} and mine.extra["seconds"] == [0.35]
    assert mine.extra["ceiling_ratio"] == pytest.approx(48.39 / 55.12)
    figures = {r.metric: r for r in res.by_test("load_bound")}
    if which == "measured":
        assert list(figures) == list(bound.ROWS) and mine.extra["bound_ratio"] == pytest.approx(48.39 / 51.56)
        assert figures["both_at_once"].extra["best"] == 51.56 and figures["both_at_once"].extra["overlap"] == [0.98] * 3
        assert res.settings["bound"]["readers"] == 14 and not res.errors
        assert benchresult.report_of(res)["bound"] == rep["bound"]
    else:
        assert not figures and "bound_ratio" not in mine.extra
        assert res.errors == ([{"test": "load_bound", "error": BOUNDS[which]["error"]}] if which != "no bound"
                              else [])


def test_a_loader_that_failed_is_an_error_and_one_that_failed_later_keeps_its_repeats(tmp_path):
    rep = report()
    rep["loaders"]["safetensors load_file"] = {"gbps": None, "seconds": [], "error": "OSError: gone",
                                               "stages": {}}
    rep["loaders"]["ccbridge cold"] = {**rep["loaders"]["ccbridge cold"], "error": "LoadError: round 2"}
    rep["loaders"] = {n: rep["loaders"][n] for n in benchresult.LOADERS if n in rep["loaders"]}  # the bench's order
    res = results.load(saved(tmp_path, rep))
    assert {"test": "load:safetensors_load_file", "error": "OSError: gone", "stages": {}} in res.errors
    cold = next(r for r in res.rows if r.metric == "ccbridge_cold")
    assert cold.extra["error"] == "LoadError: round 2"
    full = {**rep, "emulation": None, "ceiling_gbps": 55.12}
    assert bench.render(benchresult.report_of(res), 55.12) == bench.render(full, 55.12)
    wrong = saved(tmp_path, {**rep, "verified": "w: bytes differ", "error": "ccbridge's tensors differ"}, "w.json")
    assert results.load(wrong).settings["error"] == "ccbridge's tensors differ"


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d["settings"].update(loaders={}), "settings: Additional properties are not allowed ('loaders'"),
    (lambda d: d["rows"][0]["params"].clear(), "rows[0].params: 'loader' is a required property"),
    (lambda d: d["rows"][0].update(test="loads"), "rows[0].test: 'loads' is not one of load, load_bound"),
    (lambda d: d["rows"][0].update(unit="s"), "rows[0].unit"),
    (lambda d: d["rows"][-1]["extra"].pop("best"), "'best' is a required property"),
    (lambda d: d["settings"]["bound"].update(readers=0), "settings.bound.readers"),
])
def test_the_schema_refuses_what_a_load_result_does_not_hold(tmp_path, edit, fragment):
    path = saved(tmp_path, report(bound=evidenced()))
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultFileError, match="r.json: ") as e:
        results.load(path)
    assert fragment in str(e.value)


def test_compare_matches_two_load_results_by_key(tmp_path, capsys):
    a = saved(tmp_path, report(bound=evidenced()), "a.json")
    b = saved(tmp_path, report(bound=evidenced(both=45.0, best=46.0), gbps=40.0), "b.json")
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "7 common rows; 0 only in BASE, 0 only in OTHER." in out
    assert all(len(line) <= 120 for line in out.splitlines())
    both = next(line for line in out.splitlines() if "both_at_once" in line)
    assert both.split()[-2] == f"{45.0 / 50.09:.3f}"


def test_report_writes_a_load_result_and_advise_refuses_it_in_one_line(tmp_path, capsys):
    path = saved(tmp_path, report(bound=evidenced()))
    assert main(["report", str(path), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "# ccbridge load --bench" in md and "both_at_once" in md and "load:fastsafetensors_nogds" in md
    capsys.readouterr()
    assert main(["advise", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"ccbridge advise: {path}: a load result: advise reads env stamps")
