import math

import pytest

from ccbridge.stats import percentile, plan_iters, summarize


def test_percentile_interpolates():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 10) == pytest.approx(1.4)
    assert percentile(xs, 90) == pytest.approx(4.6)
    assert percentile([7.0], 90) == 7.0


def test_summarize_sorts_and_counts():
    s = summarize([5, 1, 4, 2, 3])
    assert (s["median"], s["min"], s["max"], s["n"]) == (3, 1, 5, 5)
    assert s["p10"] < s["median"] < s["p90"]


def test_summarize_refuses_nan_and_empty():
    with pytest.raises(ValueError):
        summarize([1.0, math.nan])
    with pytest.raises(ValueError):
        summarize([])


def test_plan_iters_clamps():
    assert plan_iters(0.01, 1.0, 5, 50) == 50
    assert plan_iters(1.0, 1.0, 5, 50) == 5
    assert plan_iters(0.1, 1.0, 5, 50) == 10
    assert plan_iters(0.0, 1.0, 5, 50) == 50


def test_settled_stops_once_samples_agree_and_repeats_noisy_ones():
    from ccbridge.stats import settled

    tight = iter([10.0, 10.05, 10.02, 99.0, 99.0])
    assert settled(lambda: next(tight), 3, 5) == [10.0, 10.05, 10.02]
    noisy = iter([10.0, 12.0, 10.0, 11.0, 10.5, 99.0])
    assert settled(lambda: next(noisy), 3, 5) == [10.0, 12.0, 10.0, 11.0, 10.5]  # never past hi
    spread = iter([10.0, 11.0, 10.9, 10.95])
    assert settled(lambda: next(spread), 2, 4, spread=0.01) == [10.0, 11.0, 10.9, 10.95]
    objects = iter([(1, 100.0), (2, 100.5), (3, 50.0)])
    assert settled(lambda: next(objects), 2, 3, value=lambda o: o[1]) == [(1, 100.0), (2, 100.5)]


def test_settled_judges_each_figure_of_a_sample():
    """A sample of several figures (one round making two rows) stops only once every figure agrees."""
    from ccbridge.stats import settled

    both = iter([(1.0, 0.5), (1.01, 0.505), (9.0, 9.0)])
    assert settled(lambda: next(both), 2, 3, value=tuple) == [(1.0, 0.5), (1.01, 0.505)]
    second_apart = iter([(1.0, 0.5), (1.0, 0.6), (1.0, 0.55), (9.0, 9.0)])
    assert settled(lambda: next(second_apart), 2, 3, value=tuple) == [(1.0, 0.5), (1.0, 0.6), (1.0, 0.55)]
    first_apart = iter([(1.0, 0.5), (1.1, 0.5), (1.0, 0.5)])
    assert len(settled(lambda: next(first_apart), 2, 3, value=tuple)) == 3


def test_settled_judges_from_more_than_half_the_allowed_samples():
    """Of five allowed, two agreeing samples do not stop it (the other three could all lie on one side, and the
    median of five with them), three do; of three allowed, two do. Whatever the samples not taken, the median of
    every allowed one lies within the range of those that stopped it."""
    import itertools

    from ccbridge.stats import settle_after, settled

    assert [settle_after(n) for n in (1, 2, 3, 4, 5, 7)] == [1, 2, 2, 3, 3, 4]
    agree = [10.0, 10.01, 10.02, 9.0, 9.0]
    assert settled(iter(agree).__next__, settle_after(5), 5) == agree[:3]
    assert settled(iter(agree).__next__, settle_after(3), 3) == agree[:2]
    two_then_apart = [10.0, 10.01, 9.0, 9.0, 9.0]
    assert settled(iter(two_then_apart).__next__, settle_after(5), 5) == two_then_apart  # 2 of 5: never enough
    for hi in (2, 3, 4, 5):
        taken = [10.0, 10.1, 10.2][:settle_after(hi)]
        for rest in itertools.product((0.0, 10.05, 99.0), repeat=hi - len(taken)):
            assert min(taken) <= summarize(taken + list(rest))["median"] <= max(taken), (hi, rest)


def test_settled_judges_values_near_zero_against_a_scale():
    """Fractions of a whole near 0 never agree within 2% of their own median; against the whole (scale=1) two
    within 0.02 of each other stop, and two 0.05 apart do not."""
    from ccbridge.stats import settled

    near_zero = [0.001, 0.003, 0.002]
    assert settled(iter(near_zero).__next__, 2, 3) == near_zero
    assert settled(iter(near_zero).__next__, 2, 3, scale=1.0) == near_zero[:2]
    apart = [0.0, 0.05, 0.01]
    assert settled(iter(apart).__next__, 2, 3, scale=1.0) == apart
    blocks = [1.02, 1.021, 0.5]
    assert settled(iter(blocks).__next__, 2, 3, scale=1.0) == blocks[:2]
    infinite = [float("inf"), 1.0, 1.0]  # a sample that could not be taken never agrees with anything
    assert settled(iter(infinite).__next__, 2, 3, scale=1.0) == infinite


def test_paired_loops_take_every_repetition_unless_asked_to_settle():
    """Latency loops keep all their repetitions (their medians ride out a preempted sample, and framework.launch
    counts every launch it made); a bandwidth loop may stop once its samples agree."""
    from ccbridge.probe.framework import paired_us
    from ccbridge.stats import settle_after

    calls = []
    samples, paused = paired_us(lambda: calls.append(1), lambda: None, 10, 7)
    assert len(samples) == 7 and paused is None and len(calls) == 70
    calls.clear()
    settled_samples, _ = paired_us(lambda: calls.append(1), lambda: None, 10, 7, settle=True)
    assert settle_after(7) <= len(settled_samples) <= 7 and len(calls) == 10 * len(settled_samples)


def test_ratio_range_and_apart():
    from ccbridge.stats import apart, ratio_range

    assert ratio_range((2.0, 4.0), (1.0, 2.0)) == (1.0, 4.0)
    assert not apart((2.0, 4.0), (1.0, 2.0))  # touching ranges: no claim
    assert apart((2.1, 4.0), (1.0, 2.0)) and apart((0.1, 0.2), (1.0, 2.0))
    assert not apart((1.0, 2.0), (0.0, 1.0))  # no range where the denominator's reaches 0
