import copy

import pytest
from conftest import DATA, synthetic

from ccbridge import results
from ccbridge.compare import compare, render_html, render_markdown, render_text
from ccbridge.errors import UsageError
from ccbridge.findings import findings
from ccbridge.results import Result, Row


def pair(base_v, other_v, unit="GB/s"):
    return Row.of("t.x", "m", unit, base_v, k=1), Row.of("t.x", "m", unit, other_v, k=1)


def test_ratio_range_and_cost():
    b, o = pair([50, 55, 60], [10, 11, 12])
    c = compare(synthetic([b]), synthetic([o]))
    (r,) = c.ratios
    assert r.ratio == 11 / 55
    lo, hi = r.range
    assert lo < r.ratio < hi
    assert r.cost == 55 / 11 - 1  # throughput: OTHER needs 5x the time
    b, o = pair([10], [40], unit="us")
    assert compare(synthetic([b]), synthetic([o])).ratios[0].cost == 3.0


def test_unmatched_rows_and_changed_findings():
    base = [Row.of("smallcopy.d2h32", "per_copy_time", "us", [t], streams=k) for k, t in ((1, 17), (16, 5))]
    other = [Row.of("smallcopy.d2h32", "per_copy_time", "us", [t], streams=k) for k, t in ((1, 40), (16, 39))]
    other.append(Row.of("only.other", "m", "us", [1]))
    c = compare(synthetic(base), synthetic(other, emulated="b300"))
    assert len(c.ratios) == 2 and [r.test for r in c.only_other] == ["only.other"]
    assert ("smallcopy.overlap", "overlapped", "serialized") == c.changed[0][:3]
    md = render_markdown(c)
    assert "EMULATED" in md and "## Findings that changed" in md
    assert "data:image/png" in render_html(c)


def test_same_run_compares_to_one(h100):
    other = copy.deepcopy(h100)
    c = compare(h100, other)
    assert len(c.ratios) == len(h100.rows) and not c.changed
    assert all(r.ratio == 1.0 for r in c.ratios if r.base.median)


def test_two_kinds_are_refused(h100):
    with pytest.raises(UsageError, match="BASE is a probe result and OTHER a kv result: compare takes two results of "
                                         "one kind"):
        compare(h100, Result(kind="kv", env={}, settings={"kv": {}}))


def _copies(streams_and_us):
    return [Row.of("smallcopy.d2h32", "per_copy_time", "us", [t], streams=k) for k, t in streams_and_us]


def test_other_says_what_other_found_or_nothing():
    """OTHER ran the test but drew no finding from it (one stream count): its column is empty, not BASE's text."""
    c = compare(synthetic(_copies(((1, 17), (16, 5)))), synthetic(_copies(((1, 17),))))
    assert c.changed == [("smallcopy.overlap", "overlapped", "absent", "")]
    c = compare(synthetic(_copies(((1, 17),))), synthetic(_copies(((1, 17), (16, 5)))))
    assert c.changed[0][:3] == ("smallcopy.overlap", "absent", "overlapped") and "overlap across streams" in c.changed[0][3]
    assert "smallcopy.overlap: overlapped -&gt; absent.</li>" in render_html(compare(synthetic(_copies(((1, 17), (16, 5)))),
                                                          synthetic(_copies(((1, 17),)))))


def test_a_test_one_side_did_not_run_is_no_change(h100):
    """h200x2-peer ran launch.cost and peer only; the H100 skipped peer (one GPU): no finding changed, one line says
    which tests only one side ran."""
    peer = results.load(DATA / "h200x2-peer.json")
    c = compare(h100, peer)
    assert c.changed == [] and c.ran_once == (sorted({r.test for r in h100.rows} - {"launch.cost"}),
                                              ["peer.allreduce", "peer.p2p"])
    text = render_text(c)
    assert "Findings that changed" not in text and "-> absent" not in text
    assert "only BASE ran compute.parity, concurrency.scaling" in " ".join(text.split())
    assert "; only OTHER ran peer.allreduce, peer.p2p: their findings are not compared" in " ".join(text.split())
    peer.errors.append({"test": "hostcrypto.aes256gcm", "error": "boom"})
    assert "hostcrypto.aes256gcm (failed in OTHER)" in " ".join(render_text(compare(h100, peer)).split())


def test_every_finding_names_the_test_it_reads(h100):
    for res in (h100, results.load(DATA / "h200x2-peer.json")):
        tests = {r.test for r in res.rows}
        assert all(f.test in tests for f in findings(res)), [(f.id, f.test) for f in findings(res)]


@pytest.mark.parametrize("base_v,other_v,unit,ratio,cost", [
    (1e-3, 12.006776, "us", "1.2e+04", "+1.2e+06%"),  # the review's 12006.776 and +1200577.6%, each split in two
    (12.006776, 1e-3, "GB/s", "8.3e-05", "+1.2e+06%"),
    (1e-300, 1e300, "us", "n/a", "n/a"),  # past float's range
    (2.0, -1.8e150, "us", "-9e+149", "-9e+151%"),
    (123456789.0, 987654321.0, "us", "8.000", "+700.0%"),
    (0.0, 5.0, "us", "n/a", "n/a"),  # no ratio of a zero
    (5.0, 0.0, "GB/s", "0.000", "n/a"),  # none of a throughput: no finite 'worse by'
])
def test_a_ratio_row_is_one_line_whatever_its_numbers(base_v, other_v, unit, ratio, cost):
    b, o = pair([base_v], [other_v], unit=unit)
    text = render_text(compare(synthetic([b]), synthetic([o])))
    table = text.split("Ratios (OTHER / BASE):\n")[1].splitlines()
    assert len(table) == 2 and all(len(line) <= 120 for line in text.splitlines()), text
    assert table[1].split()[-2:] == [ratio, cost]
    assert "nan" not in render_markdown(compare(synthetic([b]), synthetic([o])))


def test_rows_in_two_units_are_not_compared():
    """A row in us against the same row in ms read '99.9% better'."""
    b, o = Row.of("t.x", "m", "us", [1000.0], k=1), Row.of("t.x", "m", "ms", [1.0], k=1)
    c = compare(synthetic([b, Row.of("t.y", "m", "us", [1])]), synthetic([o, Row.of("t.y", "m", "us", [2])]))
    assert [r.base.test for r in c.ratios] == ["t.y"] and c.unlike == [(b, o)]
    text = render_text(c)
    assert "1 row(s) of both not comparable (t.x:m[k=1]: units differ: us vs ms)" in text and "99.9%" not in text
    assert "units differ: us vs ms" in render_markdown(c)


def _machine(gpu="NVIDIA H100 80GB HBM3", cpu="Xeon 8480", cc="off", emulated=None, rows=None):
    res = synthetic(rows or [Row.of("launch.cost", "time_per_kernel", "us", [3.0], mode="graph")], emulated)
    res.env.update(nvml={"gpus": [{"index": 0, "name": gpu}], "cc": {"mode": cc}}, cpu={"model": cpu})
    return res


@pytest.mark.parametrize("base,other,says,not_says", [
    (_machine(), _machine(gpu="NVIDIA H200", cc="on"),
     "different GPUs (NVIDIA H100 80GB HBM3 vs NVIDIA H200) in different CC states (off vs on): the ratios compare "
     "machines, not only a CC tax", "is the CC tax"),
    (_machine(), _machine(cpu="EPYC 9654"), "different CPUs (Xeon 8480 vs EPYC 9654): the ratios compare machines, "
                                            "not a CC tax", "is the CC tax"),
    (_machine(), _machine(cc="on"), "one machine, BASE CC-off and OTHER CC-on: 'OTHER worse by' is the CC tax",
     "different"),
    (_machine(cc="on"), _machine(), "give the CC-off run as BASE", "different"),
    (_machine(), _machine(emulated="b300"), "'OTHER worse by' is profile b300's CC tax, EMULATED, not measured",
     "different"),
    (_machine(), _machine(rows=[Row.of("launch.cost", "time_per_kernel", "us", [4.0], mode="graph")]),
     "1 common rows", "CC tax"),  # one machine, one CC state: no CC tax to read
])
def test_compare_says_what_the_ratios_compare(base, other, says, not_says):
    text = " ".join(render_text(compare(base, other)).split())  # a long line wraps
    assert says in text and not_says not in text, text
    assert says in render_markdown(compare(base, other))


def test_one_result_twice_is_nothing_to_compare(h100):
    c = compare(h100, copy.deepcopy(h100))
    assert c.same
    assert render_text(c).splitlines()[1:] == ["BASE and OTHER are one result (a file and itself, or a copy of it): "
                                               "nothing to compare"]
    assert "Ratios" not in render_markdown(c) and "nothing to compare" in render_html(c)


def test_a_wrapped_cell_breaks_between_words_or_after_a_separator():
    """The terminal table broke account rows' parameters mid-word ('api=cuStreamSynchroniz' / 'e, kind=...',
    'site=examples/d' / 'ecode_loop.py:4' / '5'): a cell breaks at spaces, a word longer than its column after a
    separator in it (/ : . , = -), only a part still longer (no separator in 22 columns) anywhere."""
    from ccbridge.textfit import cell, table

    params = "api=cuStreamSynchronize, kind=sync, dir=-, mem=-, site=examples/decode_loop.py:45 main -> print"
    assert cell(params, 22) == ["api=", "cuStreamSynchronize,", "kind=sync, dir=-,", "mem=-, site=examples/",
                                "decode_loop.py:45 main", "-> print"]
    assert cell("", 5) == [""] and cell("a b  c", 10) == ["a b c"] and cell("x" * 30, 22) == ["x" * 22, "x" * 8]
    assert cell("hello world this is text", 8) == ["hello", "world", "this is", "text"]  # as textwrap had it
    assert table(["t", "p"], [["account.site", params]], [12, 22])[1:3] == ["account.site  api=",
                                                                          "              cuStreamSynchronize,"]


def test_compare_of_two_accounts_keeps_their_parameters_whole(tmp_path, capsys):
    """compare of the decode sample's account with the native trace's against itself (an emulated BASE is refused):
    each API name and call site in the parameters column is whole on a line, or broken after one of its separators."""
    from pathlib import Path

    from ccbridge.cli import main

    traces = Path(__file__).resolve().parent.parent / "examples" / "traces" / "decode-h200"
    for name, sides in (("a", ("native", "emulated")), ("b", ("native", "native"))):
        assert main(["account", *(str(traces / s) for s in sides), "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    text = render_text(compare(results.load(tmp_path / "a" / "result.json"),
                               results.load(tmp_path / "b" / "result.json")))
    lines = text.splitlines()
    assert all(len(line) <= 120 for line in lines)
    column = [line[23:45].strip() for line in lines if line[:1] in ("a", " ") and len(line) > 23]
    assert "cuStreamSynchronize," in column and "cuMemcpyDtoHAsync_v2," in column, column[:20]
    assert "mem=-, site=examples/" in column and "decode_loop.py:20 step" in column, column
    assert not any(c.endswith("Synchroniz") or c.endswith("examples/d") or c.endswith(".py:4") for c in column)
