"""One GPU timer (ccbridge/gputimer.py): the choice follows --timer, then $CCBRIDGE_TIMER, then the machine's CC state;
results say which timer made them; compare says when two results mix timers. (The timers themselves run on a GPU:
tests/test_gputimer_gpu.py.)"""

import pytest

from ccbridge import compare, gputimer
from ccbridge.errors import UsageError
from conftest import synthetic


def test_the_choice_follows_the_option_then_the_environment_then_cc(monkeypatch):
    monkeypatch.delenv(gputimer.ENV_VAR, raising=False)
    assert gputimer.choose("events", cc_mode="on") == "events"  # asked: as asked, CC or not
    assert gputimer.choose(None, cc_mode="on") == "globaltimer"  # auto: CC on makes events unreliable
    assert gputimer.choose(None, cc_mode="off") == "events"
    assert gputimer.choose("auto", cc_mode="unknown") == "events"
    monkeypatch.setenv(gputimer.ENV_VAR, "globaltimer")
    assert gputimer.choose(None, cc_mode="off") == "globaltimer"
    assert gputimer.choose("events", cc_mode="off") == "events"  # the option over the environment
    monkeypatch.setenv(gputimer.ENV_VAR, "stopwatch")
    with pytest.raises(UsageError, match="CCBRIDGE_TIMER 'stopwatch': expected one of auto, events, globaltimer"):
        gputimer.choose(None)


def test_compare_flags_results_of_two_timers():
    a, b = synthetic([]), synthetic([])
    a.settings["timer"], b.settings["timer"] = "events", "globaltimer"
    line = compare.timer_mix(compare.compare(a, b))
    assert "BASE's GPU times are from events, OTHER's from globaltimer" in line
    b.settings["timer"] = "events"
    assert compare.timer_mix(compare.compare(a, b)) is None
    b.settings = {"decode": {"timer": "globaltimer"}}  # a bench's settings hold it one level down
    assert compare.timer_mix(compare.compare(a, b)) is not None


def test_a_probe_run_records_its_timer(monkeypatch):
    from ccbridge import env
    from ccbridge.probe import registry

    monkeypatch.delenv(gputimer.ENV_VAR, raising=False)
    res = registry.run(registry.Settings(tests="hostcrypto", quick=True, timer="globaltimer"), env.stamp())
    assert res.settings["timer"] == "globaltimer"


def test_the_device_copy_rate_counts_read_and_write_of_a_byte_exact_copy(monkeypatch):
    torch = pytest.importorskip("torch")
    timed = []

    def fake_time_ms(torch_, fn, reps, inner=1, backend=None):
        fn()
        timed.append((reps, inner))
        return [1.0, 2.0][:reps]

    monkeypatch.setattr(gputimer, "time_ms", fake_time_ms)
    got = gputimer.device_copy_gbps(torch, "cpu", 2, inner=3, nbytes=1000, generator=torch.Generator().manual_seed(1))
    assert got == pytest.approx([2e-3, 1e-3]) and timed == [(2, 3)]  # 2 x 1000 B in 1 ms and in 2 ms


def test_what_goes_before_a_sample_is_queued_ahead_of_its_start_mark_and_not_timed(monkeypatch):
    """time_ms(before=...): per sample, before() then the start mark then fn then the end mark, on both backends
    (the peer family's ranks meet in one all_reduce there)."""
    order = []

    class Event:
        def __init__(self, **_):
            pass

        def record(self):
            order.append("mark")

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 2.0

    class Torch:
        cuda = type("cuda", (), {"Event": Event})

    got = gputimer.time_ms(Torch, lambda: order.append("fn"), 2, backend="events", before=lambda: order.append("meet"))
    assert got == [2.0, 2.0] and order == ["meet", "mark", "fn", "mark"] * 2


def test_peer_timer_pairs_alternate_both_timers_on_the_same_case_after_one_untimed_sample(monkeypatch):
    """bench/timer_agreement.py --peer: each case and mode meets both timers in turn on the same ranks and
    buffers, events first in even rounds and last in odd ones, rounds times; one sample first that no timer keeps
    (set-up, graph upload); each round's figure the median of plan.reps samples of that timer."""
    from ccbridge.probe import peer

    calls, built = [], []

    class Case:
        def __init__(self, torch, dist, op, nbytes, n, rank, world):
            built.append((op, nbytes, n, rank, world))
            self.nbytes, self.k = nbytes, 0

        def graph(self):
            return type("G", (), {"replay": lambda _: None})()

        def run_all(self):
            pass

        def sample_ms(self, body, backend=None):
            calls.append((self.nbytes, backend))
            self.k += 1
            return {None: 99.0, "events": 1.0, "globaltimer": 2.0}[backend] * self.k

    plan = peer.Plan("all_reduce", (4096, 65536), (), ops=20, reps=3)
    got = peer._timer_pairs(None, None, plan, rank=1, world=4, rounds=2, case=Case)
    assert built == [("all_reduce", 4096, 20, 1, 4), ("all_reduce", 65536, 20, 1, 4)]
    per_mode = [None] + ["events"] * 3 + ["globaltimer"] * 3 + ["globaltimer"] * 3 + ["events"] * 3
    assert calls == [(4096, b) for b in per_mode * 2] + [(65536, b) for b in per_mode * 2]
    # samples count on from the untimed one: eager's round 1 events are the 2nd-4th (median 3), globaltimer 5th-7th;
    # round 2 globaltimer the 8th-10th (x2), events the 11th-13th
    assert got["eager"][4096] == {"events": [3.0, 12.0], "globaltimer": [12.0, 18.0]}
    assert got["graph"][65536] == {"events": [16.0, 25.0], "globaltimer": [38.0, 44.0]}
    assert set(got) == set(peer.MODES) and 99.0 not in got["eager"][4096]["events"]


def test_graphed_warms_up_on_a_side_stream_then_captures_once():
    """graphed(): fn once on a side stream that waits for the current one (a JIT's first compile stays out of the
    capture), the current stream waits for it, then fn captured once: the graph and what fn returned in it."""
    order = []

    class FakeStream:
        def __init__(self, name="side"):
            self.name = name

        def wait_stream(self, other):
            order.append(f"{self.name} waits {other.name}")

    class Ctx:
        def __init__(self, what):
            self.what = what

        def __enter__(self):
            order.append(f"enter {self.what}")

        def __exit__(self, *a):
            order.append(f"exit {self.what}")

    main = FakeStream("main")

    class cuda:
        Stream = FakeStream
        CUDAGraph = object
        current_stream = staticmethod(lambda: main)
        stream = staticmethod(lambda s: Ctx(f"stream {s.name}"))
        graph = staticmethod(lambda g: Ctx("capture"))

    class Torch:
        pass

    Torch.cuda = cuda
    calls = iter(["warm", "captured"])
    graph, out = gputimer.graphed(Torch, lambda: order.append(next(calls)) or order[-1])
    assert out == "captured" and graph is not None
    assert order == ["side waits main", "enter stream side", "warm", "exit stream side", "main waits side",
                     "enter capture", "captured", "exit capture"]
