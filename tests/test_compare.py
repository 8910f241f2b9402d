import copy

import pytest
from conftest import synthetic

from ccbridge.compare import compare, render_html, render_markdown
from ccbridge.errors import UsageError
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
