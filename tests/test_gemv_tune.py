"""The fused GEMV's tile tuning (serve/gemv_tune.py) on the CPU, with an injected timer (no kernel runs): the
fastest candidate wins, the rule's within 2% of it; the choice is cached in the process and on disk (keyed by GPU
name and versions; a corrupt file is ignored with a warning and rewritten); CCBRIDGE_GEMV_TUNE=0 and gemv.TUNED
give their tiles; the engine tunes each of its shapes over its own layers' weights and records the tiles. The
kernel's results at every candidate: tests/test_gemv_cpu.py (interpreter) and tests/test_gemv_gpu.py."""

import json
import time

import pytest

torch = pytest.importorskip("torch")

from ccbridge import resultschema, textfit  # noqa: E402 - after torch's skip
from ccbridge.schema import Schema  # noqa: E402
from ccbridge.serve import decode, engine, gemv, gemv_tune  # noqa: E402

SHAPES = [(48, 256, "norm"), (64, 128, ""), (96, 256, "norm"), (64, 192, "silu")]


class Timer:
    """A fake timer: us by tile (default: 10 + a fixed spread), recording each call's weights and tile."""

    def __init__(self, times=None, delay=0.0):
        self.times, self.delay, self.calls = times or {}, delay, []

    def __call__(self, ws, prologue, tile):
        self.calls.append((tuple(ws[0].shape), len(ws), prologue, tile))
        time.sleep(self.delay)
        return self.times.get(tile, 10.0 + sum(tile) % 7)


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    """A cache of this test's own (file and process) and tuning on."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(gemv_tune.ENV, raising=False)
    monkeypatch.setattr(gemv_tune, "CHOSEN", {})
    monkeypatch.setattr(gemv, "TUNED", {})


def test_the_candidates_cover_the_measured_winners_and_the_rule():
    winners = {(1536, 4096): (8, 2048, 8), (4096, 1024): (2, 1024, 4), (7168, 4096): (32, 512, 4),
               (4096, 3584): (4, 512, 8), (6144, 4096): (16, 1024, 4), (4096, 4096): (2, 4096, 4),
               (28672, 4096): (4, 512, 4), (4096, 14336): (4, 2048, 4)}
    for (n, k), best in winners.items():
        got = gemv_tune.candidates(n, k)
        assert best in got and gemv.rule(n, k) in got and 10 <= len(got) <= 15, (n, k, got)
        assert len(set(got)) == len(got)
    for bn, bk, warps in gemv_tune.CANDIDATES:  # partial sums within 128 fp32 registers a thread (bench/gemv.py)
        assert bn * bk <= 128 * 32 * warps
    small = gemv_tune.candidates(40, 300)  # blocks clamped to the shape, the rule's K step of 128 kept
    assert (2, 128, 4) in small and all(bn <= 64 and bk <= 512 for bn, bk, _ in small)


def test_tune_times_every_candidate_and_takes_the_fastest(tmp_path):
    n, k, pro = SHAPES[0]
    fast = gemv_tune.candidates(n, k)[3]
    timer = Timer({fast: 5.0})
    got = gemv_tune.tune([SHAPES[0]], "cpu", timer=timer, progress=False)
    assert got == {SHAPES[0]: fast}
    assert sorted(c[3] for c in timer.calls) == sorted(gemv_tune.candidates(n, k))
    assert all(c[:3] == ((n, k), 1, pro) for c in timer.calls)  # no weights given: one random weight of the shape


def test_a_tie_within_two_percent_goes_to_the_rule():
    n, k, _ = SHAPES[1]
    rule, other = gemv.rule(n, k), next(t for t in gemv_tune.candidates(n, k) if t != gemv.rule(n, k))
    assert gemv_tune.choose({rule: 10.19, other: 10.0}, rule) == rule
    assert gemv_tune.choose({rule: 10.25, other: 10.0}, rule) == other
    got = gemv_tune.tune([SHAPES[1]], "cpu", timer=Timer({rule: 5.08, other: 5.0}), progress=False)
    assert got[SHAPES[1]] == rule


def test_the_choice_is_cached_in_the_process_and_on_disk(tmp_path, monkeypatch):
    timer = Timer()
    first = gemv_tune.tune(SHAPES, "cpu", timer=timer, progress=False)
    assert set(first) == set(SHAPES) and all(first[s] in gemv_tune.candidates(*s[:2]) for s in SHAPES)
    timed = len(timer.calls)
    assert gemv_tune.tune(SHAPES, "cpu", timer=timer, progress=False) == first and len(timer.calls) == timed
    path = tmp_path / "ccbridge" / "gemv-tiles.json"
    data = json.loads(path.read_text())
    assert data["format"] == gemv_tune.FORMAT and len(data["tiles"]) == len(SHAPES)
    assert all(key.startswith(f"cpu | {gemv_tune.versions()} | ") for key in data["tiles"])
    monkeypatch.setattr(gemv_tune, "CHOSEN", {})  # a new process: the file answers
    assert gemv_tune.tune(SHAPES, "cpu", timer=timer, progress=False) == first and len(timer.calls) == timed
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("what", ["name", "versions"])
def test_another_gpu_or_version_misses(what, monkeypatch):
    timer = Timer()
    gemv_tune.tune(SHAPES[:1], "cpu", timer=timer, progress=False)
    monkeypatch.setattr(gemv_tune, "CHOSEN", {})
    if what == "name":
        monkeypatch.setattr(gemv_tune, "device_name", lambda dev: "NVIDIA H100 80GB HBM3")
    else:
        monkeypatch.setattr(gemv_tune, "versions", lambda: "torch 9.9, triton 9.9")
    timed = len(timer.calls)
    gemv_tune.tune(SHAPES[:1], "cpu", timer=timer, progress=False)
    assert len(timer.calls) == 2 * timed
    tiles = json.loads(gemv_tune.cache_path().read_text())["tiles"]
    assert len(tiles) == 2  # both kept: the file serves either


@pytest.mark.parametrize("bad", ["{not json", '{"format": 1, "tiles": {"k": [3, 512, 4]}}', "[]", "\xff\xfe"])
def test_a_corrupt_cache_is_ignored_with_a_warning_and_rewritten(bad, capsys):
    path = gemv_tune.cache_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(bad.encode("latin-1"))
    got = gemv_tune.tune(SHAPES[:2], "cpu", timer=Timer(), progress=False)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("ccbridge: GEMV tile cache ignored and rewritten (") and \
        len(err[0]) <= 120, err
    tiles = json.loads(path.read_text())["tiles"]
    assert sorted(map(tuple, tiles.values())) == sorted(got.values())


def test_an_unwritable_cache_warns_and_the_tiles_are_still_used(monkeypatch, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # its ccbridge/ folder cannot be made
    got = gemv_tune.tune(SHAPES[:1], "cpu", timer=Timer(), progress=False)
    assert got[SHAPES[0]] in gemv_tune.candidates(48, 256)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "not written" in err[0]


def test_tuning_off_or_a_tuned_override_times_nothing(monkeypatch):
    timer = Timer()
    monkeypatch.setenv(gemv_tune.ENV, "0")
    assert gemv_tune.tune(SHAPES, "cpu", timer=timer) == {s: gemv.rule(*s[:2]) for s in SHAPES}
    monkeypatch.delenv(gemv_tune.ENV)
    gemv.TUNED[(48, 256)] = (32, 256, 8)  # bench/tp_step.py --tiles
    got = gemv_tune.tune(SHAPES[:1], "cpu", timer=timer, progress=False)
    assert got == {SHAPES[0]: (32, 256, 8)} and timer.calls == [] and not gemv_tune.cache_path().exists()


def test_a_line_of_progress_only_once_tuning_takes_a_second(capsys):
    gemv_tune.tune(SHAPES[:1], "cpu", timer=Timer())
    assert capsys.readouterr().err == ""
    gemv_tune.tune(SHAPES[1:2], "cpu", timer=Timer(delay=0.2))  # 7 candidates at 0.2 s
    err = capsys.readouterr().err.splitlines()
    assert err == [textfit.cut(f"ccbridge: tuning 1 GEMV shape on cpu (cached in {gemv_tune.cache_path()})", 120)]


def test_the_engine_tunes_its_shapes_over_its_own_layers_and_records_the_tiles(monkeypatch):
    spec = decode.PRESETS["tiny"]
    m = engine.build(spec, 0, 1, "cpu", torch.float32, seed=3, compiled=False, fused=True)
    rule = {name: gemv.rule(*getattr(m.layers[0], name).shape) for name in engine.GEMVS}
    assert m.gemv_tiles == rule  # on a CPU: no timing, the rule's
    plain = engine.build(spec, 0, 1, "cpu", torch.float32, seed=3, compiled=False, fused=False)
    assert plain.gemv_tiles == {} and plain.tiles_used() == {}

    timer = Timer()
    monkeypatch.setattr(gemv_tune, "tunes", lambda dev: True)  # as on a GPU, the fake timer for CUDA graphs
    monkeypatch.setattr(gemv_tune, "cold_us", timer)
    m = engine.build(spec, 0, 1, "cpu", torch.float32, seed=3, compiled=False, fused=True)
    layers = spec["num_hidden_layers"]
    shapes = {name: tuple(getattr(m.layers[0], name).shape) for name in engine.GEMVS}
    timed = {(shape, pro) for shape, count, pro, _ in timer.calls if count == layers}
    assert timed == {(shapes[name], pro) for name, pro in engine.GEMVS.items()} and len(timed) == 4
    assert all(count == layers for _, count, _, _ in timer.calls)  # each shape over the layers' own weights
    for name, tile in m.gemv_tiles.items():
        assert tile in gemv_tune.candidates(*shapes[name]), name
    used = m.tiles_used()
    assert used == {f"{name} {shapes[name][0]}x{shapes[name][1]}": list(m.gemv_tiles[name]) for name in shapes}
    settings = {"decode_tp": {"gemv_tiles": {"1": used}}}  # as serve/tp.py records rank 0's
    Schema(resultschema.SETTINGS["decode_tp"]).check(settings, "settings", ValueError)


# --- review 30: failing before its fixes ---

def test_no_home_and_no_cache_home_writes_no_cache_under_the_working_folder(monkeypatch, tmp_path):
    """A container's uid with no passwd entry and HOME unset: expanduser('~') is '~' itself, so the cache went to
    ./~/.cache/ccbridge/ under whatever folder the bench ran in (a '~' folder that `rm -rf ~` would 'clean')."""
    import pwd

    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    monkeypatch.chdir(tmp_path)
    got = gemv_tune.tune(SHAPES[:1], "cpu", timer=Timer(), progress=False)
    assert got[SHAPES[0]] in gemv_tune.candidates(48, 256)  # still tuned, in this process
    assert list(tmp_path.iterdir()) == []


def test_a_relative_cache_home_is_ignored_as_the_xdg_spec_says(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", "rel")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gemv_tune.cache_path() == tmp_path / "home" / ".cache" / "ccbridge" / "gemv-tiles.json"


def test_a_cached_tile_that_no_tuning_could_choose_is_timed_again():
    """The file parses and each value is 3 powers of two, but the tile is none of the shape's candidates (an edited
    or planted file, or one from before CANDIDATES changed): the engine compiled whatever it said (here 4096-wide
    blocks and 64 warps, which Triton cannot launch) instead of tuning."""
    n, k, pro = SHAPES[0]
    path = gemv_tune.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": gemv_tune.FORMAT,
                                "tiles": {gemv_tune.key("cpu", SHAPES[0]): [4096, 4096, 64]}}))
    timer = Timer()
    got = gemv_tune.tune(SHAPES[:1], "cpu", timer=timer, progress=False)
    assert got[SHAPES[0]] in gemv_tune.candidates(n, k) and timer.calls
    assert json.loads(path.read_text())["tiles"][gemv_tune.key("cpu", SHAPES[0])] == list(got[SHAPES[0]])


def test_tuning_runs_with_emulation_and_the_trace_paused(monkeypatch):
    """Under `ccbridge run --profile P` the build is traced-paused by serve/tp.py, but the tolls go on: each timed
    graph replay paid the launch toll between its start and end events, so the emulated run's tiles were chosen
    on toll-inflated times (the rule favoured by TIE) and cached on disk for native runs too."""
    from ccbridge.emulate import interposer

    off = {"ccbemu_emulate_pause": 0, "ccbemu_trace_pause": 0}

    def switch(name, required, needs):
        def fn(pause):
            was = not off[name]
            off[name] = pause
            return was
        return fn

    monkeypatch.setattr(interposer, "switch", switch)
    seen = []

    def timer(ws, prologue, tile):
        seen.append(dict(off))
        return 10.0 + sum(tile) % 7

    gemv_tune.tune(SHAPES[:1], "cpu", timer=timer, progress=False)
    assert seen and all(s == {"ccbemu_emulate_pause": 1, "ccbemu_trace_pause": 1} for s in seen), seen[:1]
    assert off == {"ccbemu_emulate_pause": 0, "ccbemu_trace_pause": 0}  # both on again after


def test_adopt_makes_another_rank_s_tiles_this_process_s_and_the_cache_s(tmp_path):
    theirs = {SHAPES[0]: (8, 256, 4), SHAPES[1]: (2, 128, 4)}
    gemv.TUNED[SHAPES[1][:2]] = (4, 128, 8)  # an override is kept, neither adopted nor cached
    assert gemv_tune.adopt(theirs, "cpu", path=tmp_path / "c.json") == theirs
    timer = Timer()
    got = gemv_tune.tune(SHAPES[:2], "cpu", timer=timer, path=tmp_path / "c.json", progress=False)
    assert got == {SHAPES[0]: (8, 256, 4), SHAPES[1]: (4, 128, 8)} and timer.calls == []
    gemv_tune.CHOSEN.clear()  # a later process: the file alone
    on_disk = gemv_tune.load(tmp_path / "c.json")
    assert on_disk == {gemv_tune.key("cpu", SHAPES[0]): (8, 256, 4)}


def test_a_job_s_ranks_all_run_rank_0_s_tiles():
    """Each rank tunes its own GPU; the engine then takes rank 0's tile for every shape on every rank, through the
    group's sum (rank 0's tiles plus the others' zeros)."""
    rank0 = {SHAPES[0]: (8, 256, 4), SHAPES[2]: (16, 512, 8)}
    rank1 = {SHAPES[0]: (2, 128, 4), SHAPES[2]: (4, 256, 4)}

    def group_sum(t):  # rank 1's view of the all-reduce: its own contribution plus rank 0's
        t += torch.tensor([v for s in rank0 for v in rank0[s]], dtype=t.dtype)

    m = engine.ShardedDecoder.__new__(engine.ShardedDecoder)
    m.rank, m.all_reduce = 1, group_sum
    assert m._rank0s(rank1, "cpu") == rank0
    m.rank, m.all_reduce = 0, lambda t: None  # rank 0's view: the others add zeros
    assert m._rank0s(rank0, "cpu") == rank0


def test_in_a_job_rank_0_alone_tunes(monkeypatch):
    """The other ranks time nothing (their tiles would be thrown away): they take rank 0's through the group."""
    from types import SimpleNamespace

    layer = SimpleNamespace(**{name: torch.zeros(n, k) for name, (n, k) in
                               zip(engine.GEMVS, [(48, 256), (64, 128), (96, 256), (64, 192)])})
    calls = []
    monkeypatch.setattr(gemv_tune, "tunes", lambda dev: True)
    monkeypatch.setattr(gemv_tune, "tune", lambda shapes, dev, weights, progress: calls.append(progress) or
                        {s: (8, 256, 4) for s in shapes})
    m = engine.ShardedDecoder.__new__(engine.ShardedDecoder)
    m.layers, m.rank, m.all_reduce = [layer], 1, lambda t: t.add_(torch.tensor([8, 256, 4] * 4))
    assert m._tune_gemvs("cpu") == {name: (8, 256, 4) for name in engine.GEMVS} and calls == []
    m.rank, m.all_reduce = 0, lambda t: None
    assert m._tune_gemvs("cpu") == {name: (8, 256, 4) for name in engine.GEMVS} and calls == [True]
