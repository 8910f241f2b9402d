import json

import pytest

from ccbridge import results
from ccbridge.results import Result, Row


def test_row_key_is_order_independent():
    a = Row.of("t.x", "bandwidth", "GB/s", [1, 2, 3], dir="h2d", bytes=4096)
    b = Row.of("t.x", "bandwidth", "GB/s", [3, 2, 1], bytes=4096, dir="h2d")
    assert a.key() == b.key() == "t.x:bandwidth[bytes=4096,dir=h2d]"
    assert a.median == 2 and a.n == 3 and a.higher_is_better
    assert not Row.of("t.x", "latency", "us", [1]).higher_is_better


def test_save_load_round_trip(tmp_path):
    r = Result(env={"emulation": {"active": True, "profile": "b300"}}, settings={"quick": True},
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
    ('{"schema": "ccbridge.result", "version": 1, "env": {}, "rows": [{"test": "a"}]}', "row 0 field 'metric'"),
    ('{"schema": "ccbridge.result", "version": 1, "rows": []}', "env stamp missing"),
])
def test_malformed_files_are_clear_errors(tmp_path, content, match):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(results.ResultFileError, match=match) as e:
        results.load(p)
    assert str(p) in str(e.value)


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
