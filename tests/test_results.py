import json
from pathlib import Path

import pytest

from ccbridge import results
from ccbridge.results import Result, Row
from conftest import DATA, set_field

DATA_H100 = DATA / "h100-native-full.json"


def test_row_key_is_order_independent():
    a = Row.of("t.x", "bandwidth", "GB/s", [1, 2, 3], dir="h2d", bytes=4096)
    b = Row.of("t.x", "bandwidth", "GB/s", [3, 2, 1], bytes=4096, dir="h2d")
    assert a.key() == b.key() == "t.x:bandwidth[bytes=4096,dir=h2d]"
    assert a.median == 2 and a.n == 3 and a.higher_is_better
    assert not Row.of("t.x", "latency", "us", [1]).higher_is_better
    assert Row.of("decode", "tok_per_s", "tok/s", [1]).higher_is_better  # compare reads a faster decode as better
    assert Row.of("kv", "host_hit_rate", "hit fraction", [1]).higher_is_better
    assert not Row.of("kv", "miss_rate", "fraction", [1]).higher_is_better


def test_save_load_round_trip(tmp_path):
    r = Result(kind="probe", env={"emulation": {"active": True, "profile": "b300"}}, settings={"quick": True},
               rows=[Row.of("a.b", "m", "us", [1.5, 2.5], k=1)], skipped=[{"test": "x", "reason": "no GPU"}])
    r.rows[0].extra["verdict"] = "async"
    p = tmp_path / "r.json"
    r.save(p)
    back = results.load(p)
    assert back.rows == r.rows and back.skipped == r.skipped and back.emulated


def test_real_result_loads(h100):
    assert len(h100.rows) > 150
    assert not h100.emulated
    assert {r.test.split(".")[0] for r in h100.rows} >= {"compute", "transfer", "semantics", "smallcopy",
                                                         "concurrency", "launch", "toll", "lifecycle", "hostcrypto"}


@pytest.mark.parametrize("content,match", [
    ("not json {", "not a JSON document"),
    ('{"schema": "other"}', "not a ccbridge result"),
    ('{"schema": "ccbridge.result", "version": 99, "env": {}}', "version 99"),
    ('{"schema": "ccbridge.result", "version": 1, "env": {}, "rows": [{"test": "a"}]}', "rows\\[0\\]: 'metric' is a required property"),
    ('{"schema": "ccbridge.result", "version": 1, "rows": []}', "bad.json: 'env' is a required property"),
    ('{"schema": "ccbridge.result", "version": 1, "env": []}', r"bad.json: env: \[\] is not of type 'object'"),
])
def test_malformed_files_are_clear_errors(tmp_path, content, match):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(results.ResultFileError, match=match) as e:
        results.load(p)
    assert str(p) in str(e.value)


def _doc_with(doc: dict, where: str, value) -> dict:
    """doc with the field at a dotted path (list indices as numbers) set to value (removed when value is ...)."""
    set_field(doc, where.split("."), value)
    return doc


@pytest.mark.parametrize("where,value,match", [
    ("rows", {"a": 1}, r"rows: \{'a': 1\} is not of type 'array'"),
    ("rows.0", "row", r"rows\[0\]: 'row' is not of type 'object'"),
    ("rows.0.median", "fast", r"rows\[0\].median: 'fast' is not of type 'number'"),
    ("rows.0.median", None, r"rows\[0\].median: None is not of type 'number'"),
    ("rows.0.median", True, r"rows\[0\].median: True is not of type 'number'"),
    ("rows.0.median", float("nan"), r"rows\[0\].median: nan is not a finite number"),
    ("rows.0.p90", float("inf"), r"rows\[0\].p90: inf is not a finite number"),
    ("rows.0.n", 0, r"rows\[0\].n: 0 is less than the minimum of 1"),
    ("rows.0.n", 2.5, r"rows\[0\].n: 2.5 is not of type 'integer'"),
    ("rows.0.n", 2.0, r"rows\[0\].n: 2.0 is not of type 'integer'"),
    ("rows.0.unit", ..., r"rows\[0\]: 'unit' is a required property"),
    ("rows.0.params", [1], r"rows\[0\].params: \[1\] is not of type 'object'"),
    ("rows.0.params", {"n": [1, 2]}, r"rows\[0\].params.n: \[1, 2\] is not of type 'string', 'number'"),
    ("rows.0.params", {"a b": {}}, r"rows\[0\].params\['a b'\]: \{\} is not of type 'string', 'number'"),
    ("rows.0.extra", [], r"rows\[0\].extra: \[\] is not of type 'object'"),
    ("rows.0.test", "decode", r"rows\[0\].test: 'decode' does not match"),  # a probe's rows are its families'
    ("settings", [], r"settings: \[\] is not of type 'object'"),
    ("settings.quick", "yes", "settings.quick: 'yes' is not of type 'boolean'"),
    ("settings.device", "0", "settings.device: '0' is not of type 'integer'"),
    ("settings.tests", "all", "settings.tests: 'all' is not of type 'array'"),
    ("settings.tests", [1], r"settings.tests\[0\]: 1 is not of type 'string'"),
    ("settings.missing", {"gpu": 1}, "settings.missing.gpu: 1 is not of type 'string'"),
    # settings under "decode" make a version-1 file a decode result's, whose settings hold nothing else
    ("settings.decode", {}, r"settings: Additional properties are not allowed \('device', 'quick', 'tests' were"),
    ("skipped", "none", "skipped: 'none' is not of type 'array'"),
    ("skipped", [{"test": "x"}], r"skipped\[0\]: 'reason' is a required property"),
    ("errors", [7], r"errors\[0\]: 7 is not of type 'object'"),
    ("env.emulation", True, "env.emulation: True is not of type 'object'"),
    ("env.emulation.active", "no", "env.emulation.active: 'no' is not of type 'boolean'"),
    ("env.emulation", {"active": True, "profile": None}, "env.emulation.profile: None is not of type 'string'"),
    ("env.emulation", {"active": True, "profile": "b300", "overrides": []},
     r"env.emulation.overrides: \[\] is not of type 'object'"),
    ("env.emulation", {"active": True, "profile": "b300", "overrides": {"lanes": 4}},
     "env.emulation.overrides.lanes: 4 is not of type 'object'"),
    ("env.emulation", {"active": True, "profile": "b300", "overrides": {"lanes": {"value": 4, "was": float("nan")}}},
     "env.emulation.overrides.lanes.was: nan is not a finite number"),
    ("env.nvml", "none", "env.nvml: 'none' is not of type 'object'"),
    ("created", 20261121, "created: 20261121 is not of type 'string'"),
    ("duration_s", "49 s", "duration_s: '49 s' is not of type 'number'"),
    ("extra_field", 1, r"Additional properties are not allowed \('extra_field' was unexpected\)"),
])
def test_every_field_is_checked(tmp_path, h100_doc, where, value, match):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(_doc_with(h100_doc, where, value)))
    with pytest.raises(results.ResultFileError, match=match) as e:
        results.load(p)
    assert str(p) in str(e.value)


def test_a_folder_is_named_as_such(tmp_path):
    with pytest.raises(results.ResultFileError, match="is a folder; pass the result.json in it"):
        results.load(tmp_path)
def test_wrong_typed_median_rejected(tmp_path, h100_doc):
    h100_doc["rows"][0]["median"] = "fast"
    p = tmp_path / "r.json"
    p.write_text(json.dumps(h100_doc))
    with pytest.raises(results.ResultFileError, match="median"):
        results.load(p)


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(results.ResultFileError, match="no such file"):
        results.load(tmp_path / "nope.json")
    p = tmp_path / "bin.json"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(results.ResultFileError, match="not a JSON"):
        results.load(p)


def test_a_what_if_run_round_trips(tmp_path, h100_doc):
    h100_doc["env"]["emulation"] = {"active": True, "profile": "b300",
                                    "overrides": {"launch_toll_us": {"value": 0, "was": 18.6}}}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(h100_doc))
    assert results.load(p).env["emulation"]["overrides"]["launch_toll_us"]["was"] == 18.6


def test_a_result_names_its_kind_and_a_version_1_file_has_it_told_once(tmp_path, h100_doc):
    assert h100_doc["version"] == 1 and "kind" not in h100_doc  # tests/data: written before results named their kind
    assert results.load(DATA_H100).kind == "probe"
    r = Result(kind="kv", env={}, settings={"kv": {}})
    r.save(tmp_path / "kv.json")
    doc = json.loads((tmp_path / "kv.json").read_text())
    assert (doc["version"], doc["kind"]) == (2, "kv") and results.load(tmp_path / "kv.json").kind == "kv"
    with pytest.raises(ValueError, match="result kind 'nope'"):
        Result(kind="nope", env={}, settings={})


@pytest.mark.parametrize("settings,rows,kind", [
    ({"device": 0, "quick": True, "tests": [], "missing": {}}, [], "probe"),
    ({}, [], "probe"),
    ({"decode": {"model": "tiny"}}, [], "decode"),
    ({"decode_tp": {"model": "tiny"}}, [], "decode_tp"),
    ({"kv": {"model": "tiny"}}, [], "kv"),
    ({"bench": "net", "inflight": 8}, [], "net"),
    ({"base": "a", "other": "b", "profile": None}, [], "account"),
    ({}, [{"test": "account.total"}], "account"),
])
def test_the_kind_of_a_version_1_result(settings, rows, kind):
    assert results.kind_of_v1(Path("r.json"), {"settings": settings, "rows": rows}) == kind


def test_a_version_1_result_of_no_kind_and_an_unknown_kind_are_refused(tmp_path, h100_doc):
    h100_doc["settings"] = {"gpus": 8}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(h100_doc))
    with pytest.raises(results.ResultFileError, match=r"r.json: a version-1 result of no kind this ccbridge can tell"):
        results.load(p)
    h100_doc.update(version=2, kind="training", settings={})
    p.write_text(json.dumps(h100_doc))
    with pytest.raises(results.ResultFileError, match=r"r.json: kind: 'training' is not one of probe, decode, "
                                                      r"decode_tp, kv, account, net, ddp, cipher, collectives, load$"):
        results.load(p)


def _row_with(doc: dict, i: int, **fields) -> dict:
    doc["rows"][i].update(fields)
    return doc


@pytest.mark.parametrize("change,match", [
    # a summary out of order: a schema cannot compare two fields, the reader does after it
    (lambda d: _row_with(d, 3, p10=d["rows"][3]["median"] * 2), r"rows\[3\].p10: .* is above its median"),
    (lambda d: _row_with(d, 3, p90=d["rows"][3]["median"] / 2), r"rows\[3\].median: .* is above its p90"),
    (lambda d: _row_with(d, 0, min=5.0, p10=5.0, median=5.0, p90=5.0, max=4.0), r"rows\[0\].p90: 5.0 is above its max"),
    (lambda d: _row_with(d, 0, min=790.0), r"rows\[0\].min: 790.0 is above its p10"),
    (lambda d: _doc_with(d, "created", "yesterday"), "created: 'yesterday' is not an ISO date-time"),
    (lambda d: _doc_with(d, "created", "2026-11-21"), "created: '2026-11-21' is not an ISO date-time"),
    (lambda d: _doc_with(d, "created", "2026-13-21T10:00:00"), "created: '2026-13-21T10:00:00' is not an ISO"),
    # one quantity twice: compare and advise would each read one of the two
    (lambda d: _doc_with(d, "rows", d["rows"] + [dict(d["rows"][5])]),
     r"rows\[203\] repeats transfer.sweep:.* \(rows\[5\]\): which one holds\?"),
])
def test_rows_that_cannot_be_are_refused(tmp_path, h100_doc, change, match):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(change(h100_doc)))
    with pytest.raises(results.ResultFileError, match=match) as e:
        results.load(p)
    assert str(e.value).startswith(f"{p}: ")


def test_a_date_time_in_utc_z_reads(tmp_path, h100_doc):
    """Z is ISO 8601's UTC (what other tools write); a date without a time is not a date-time."""
    for created, ok in (("2026-11-21T19:41:44Z", True), ("2026-11-21 19:41:44.5+01:00", True), ("2026-11-21", False)):
        p = tmp_path / "r.json"
        p.write_text(json.dumps(_doc_with(h100_doc, "created", created)))
        if ok:
            assert results.load(p).created == created
        else:
            with pytest.raises(results.ResultFileError, match="not an ISO date-time"):
                results.load(p)
