"""The sample traces in examples/traces (README, "Try it without a GPU") read and account on any machine, in the
trace schema of this ccbridge: a schema that moves on fails here first, and they are recorded again."""

import json
import re
from pathlib import Path

import pytest

from ccbridge import account
from ccbridge.cli import main
from ccbridge.emulate import recorded, trace
from ccbridge.errors import UsageError

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"
SAMPLES = ("decode-h200", "ddp-h200x2")


@pytest.mark.parametrize("sample", SAMPLES)
def test_each_sample_is_a_native_and_an_emulated_run_in_this_schema(sample):
    for side, profile, emulate in (("native", "passthrough", "0"), ("emulated", "b300", "1")):
        csvs = sorted((TRACES / sample).glob(f"{side}.*.csv"))
        assert csvs, f"{sample}: no {side} trace"
        for csv in csvs:
            head = trace.SCHEMA_LINE.match(csv.read_text().split("\n", 1)[0])
            assert head and head.groups() == (str(trace.SCHEMA), profile, emulate), (csv.name, head)
            assert csv.with_suffix(".summary.json").exists()


@pytest.mark.parametrize("sample, gpus", [("decode-h200", 2), ("ddp-h200x2", 2)])  # the decode loop used one of two
def test_each_sample_says_where_it_was_recorded(tmp_path, capsys, sample, gpus):
    stamps = {side: recorded.read(str(TRACES / sample / side)) for side in ("native", "emulated")}
    for side, st in stamps.items():
        assert st, f"{sample}/{side}: no stamp"
        assert [g["name"] for g in st["env"]["nvml"]["gpus"]] == ["NVIDIA H200"] * gpus
        assert st["env"]["nvml"]["cc"]["mode"] == "off" and st["env"]["emulation"]["active"] == (side == "emulated")
    _, res = _account(tmp_path, sample, capsys)
    assert res["env"] == stamps["emulated"]["env"] and res["settings"]["recorded"][0]["machine"].startswith("host ")
    assert (tmp_path / sample / "report.md").read_text().startswith("# ccbridge account — NVIDIA H200 — ")


def _account(tmp_path, sample: str, capsys) -> tuple[str, dict]:
    out = tmp_path / sample
    rc = main(["account", str(TRACES / sample / "native"), str(TRACES / sample / "emulated"), "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    return text, json.loads((out / "result.json").read_text())


def test_the_decode_sample_accounts_its_slowdown_to_launches_and_its_own_lines(tmp_path, capsys):
    text, res = _account(tmp_path, "decode-h200", capsys)
    assert text.startswith("EMULATED: OTHER ran under the emulator (profile b300)")
    apis = [line.split()[0] for line in text.splitlines() if re.match(r"cu\w+\s+\w+\s", line)]
    assert apis[0] == "cuLaunchKernel", apis  # the launches grew the most: 1920 of them, the toll on each
    assert "examples/decode_loop.py" in text  # the per-site table names the example's own lines
    assert res["kind"] == "account" and res["settings"]["profile"] == "b300"


def test_the_decode_samples_call_sites_keep_their_file_line_and_function(tmp_path, capsys):
    """The call-site table cut every site to 26 columns from the right: each row read `examples/decode_loop.py...`,
    its line number lost. Now the row takes the room up to 120 columns and drops leading folders first."""
    text, _ = _account(tmp_path, "decode-h200", capsys)
    rows = text.split("by call site")[1].splitlines()[2:]
    assert rows and all(len(line) <= 120 for line in rows)
    assert all(re.search(r"decode_loop\.py:\d+ (step|main)\b", line) for line in rows), rows
    assert "decode_loop.py:20 step -> nn.functional.silu" in rows[0], rows[0]


def test_a_site_is_shortened_from_its_folders_then_its_callees_modules():
    site = "/home/u/examples/decode_loop.py:20 step -> torch.nn.functional.silu"
    assert account.short_site(site, 80) == site
    assert account.short_site(site, 47) == "decode_loop.py:20 step -> nn.functional.silu"
    assert account.short_site(site, 30) == "decode_loop.py:20 step -> silu"
    assert account.short_site(site, 20) == "decode_loop.py:20..."
    assert account.short_site("x.py:3 f", 9) == "x.py:3 f"


def test_the_decode_samples_head_says_what_the_slowdown_is_of_and_what_the_calls_leave(tmp_path, capsys):
    """The head named a 97.6 ms 'wall time slowdown' with no baseline: it is the traces' spans' (first to last
    driver call), and 54 ms of it lay between the calls (session 27's sample), which the head now names as the rank
    table's host does."""
    text, res = _account(tmp_path, "decode-h200", capsys)
    head = text.split("\napi ")[0].replace("\n  ", " ")
    assert ("the traces' span (first to last driver call) 660.8 -> 722.0 ms, +61.2 ms (+9.3%), which the shares "
            "below are of: calls that grew explain 44.3 ms (72%); the rest, +16.9 ms (28%), is time between calls "
            "(host work and waits outside traced calls)") in head, head
    assert "net of the calls that shrank" not in head  # none shrank: it would repeat the calls' 44.3 ms
    total = {r["metric"]: r for r in res["rows"] if r["test"] == "account.total"}
    assert abs(total["between_calls"]["median"] - 0.0169) < 1e-4
    assert abs(total["share_base"]["extra"]["base_s"] - 0.6608) < 1e-4
    assert total["wall_slowdown"]["extra"]["of"] == "the traces' spans (first to last driver call)"


def test_the_ddp_sample_accounts_each_rank_over_its_marked_steps(tmp_path, capsys):
    text, res = _account(tmp_path, "ddp-h200x2", capsys)
    ranks = [line.split() for line in text.splitlines() if re.match(r"\s+[01] marks\s", line)]
    assert [r[0] for r in ranks] == ["0", "1"], text  # two ranks, each on the window its marks made
    assert all(float(r[4]) > 0 for r in ranks)  # each rank's marked steps were slower emulated
    assert "ncclAllReduce" in text
    # the collective's device time is the emulator's toll queued ahead of it: none natively, not 'no GPU time'
    assert "device time the emulator queued ahead of them (toll_ns) 0.00 -> 1.07 ms" in text.replace("\n  ", " ")
    assert "GPU time 0.00" not in text


def test_why_on_the_ddp_sample_gives_event_timing_a_timing_recovery(tmp_path, capsys):
    out = tmp_path / "why"
    assert main(["account", str(TRACES / "ddp-h200x2" / "native"), str(TRACES / "ddp-h200x2" / "emulated"),
                 "--out", str(out), "--why"]) == 0
    text = capsys.readouterr().out.replace("\n    ", " ")
    timing = [line for line in text.splitlines() if line.startswith("cuEventElapsedTime_v2 (timing)")]
    assert timing and all("StagedH2D" not in line for line in timing), timing
    assert all("recovery: time GPU work with %globaltimer stamps" in line for line in timing if "recovery" in line)


def test_trace_summarises_a_sample(capsys):
    assert main(["trace", str(TRACES / "decode-h200" / "emulated")]) == 0
    assert "EMULATED trace: 1 process(es) (b300)" in capsys.readouterr().out


def _advice(tmp_path, sample: str, capsys) -> list[dict]:
    _account(tmp_path, sample, capsys)
    assert main(["advise", str(tmp_path / sample / "result.json"), "--json", str(tmp_path / "advice.json")]) == 0
    capsys.readouterr()
    return json.loads((tmp_path / "advice.json").read_text())["advice"]


def test_advice_on_the_decode_sample_gives_each_setting_once_for_both_launch_apis(tmp_path, capsys):
    advice = _advice(tmp_path, "decode-h200", capsys)
    settings = [(a["stack"], a["setting"]) for a in advice]
    assert len(settings) == len(set(settings)), settings  # one line a setting, not one a launch API
    graphs = [a for a in advice if a["stack"] == "vLLM" and "CUDA graphs" in a["setting"]]
    assert len(graphs) == 1 and "cuLaunchKernel (launch) and cuLaunchKernelEx (launch): 59%" in graphs[0]["why"]


def test_advice_on_the_ddp_sample_reads_its_collectives_size_from_the_ranks(tmp_path, capsys):
    advice = _advice(tmp_path, "ddp-h200x2", capsys)
    coll = [a for a in advice if "ncclAllReduce" in a["why"]]
    assert coll and all("of ?" not in a["why"] for a in coll)
    assert all("64.0 MiB each" in a["why"] for a in coll), coll[0]["why"]
    # the 'all' rows sum the two ranks, which ran 32 all-reduces each (not 64), 1.07 ms of queued device time each
    sized = [a for a in coll if "MiB each" in a["why"]]
    assert all("32 ncclAllReduce a rank x 2 ranks of 64.0 MiB each" in a["why"] for a in sized), sized[0]["why"]
    assert all("(23.1 ms, 2 ranks summed); 1.1 ms a rank of device time the emulator queued" in a["why"]
               for a in sized)
    assert all(a["brief"] == "32 ops x 2 ranks of 64.0 MiB, 21%" for a in sized)
    # 64 MiB an operation is bandwidth-bound: overlap it, not larger DDP buckets against a per-operation toll
    assert any("overlap collectives" in a["setting"] for a in coll)
    assert not any("bucket_cap_mb" in a["setting"] for a in coll)


def test_advice_on_the_ddp_sample_comes_largest_share_first(tmp_path, capsys):
    advice = _advice(tmp_path, "ddp-h200x2", capsys)
    settings = [a["setting"] for a in advice]
    graphs = next(i for i, s in enumerate(settings) if "CUDA graphs" in s)  # the launches: 73-75% a rank
    overlap = next(i for i, s in enumerate(settings) if "overlap collectives" in s)  # the all-reduces: 8-11%
    assert graphs < overlap, settings


def test_a_mistaken_trace_prefix_is_named_in_one_line(tmp_path, monkeypatch, capsys):
    """A folder given as a prefix, or a prefix one letter short, said 'no trace lines under
    .../decode-h200.<pid>.csv: record with `ccbridge run --record ...`' in up to 204 columns: wrong advice, the
    traces were there. Now one line of at most 120 columns, exit 2, naming the folder's traces or the nearest
    prefixes; from the repository (paths as given) and from elsewhere (absolute paths, their start cut)."""
    sample = TRACES / "decode-h200"
    for cwd in (TRACES.parent.parent, tmp_path):
        monkeypatch.chdir(cwd)
        at = str(sample.relative_to(cwd)) if cwd != tmp_path else str(sample)
        for argv, says in (
                (["account", at, f"{at}/emulated"], "is a folder, not a trace prefix; its traces: emulated, native"),
                (["account", f"{at}/nativ", f"{at}/emulated"], "nativ; the nearest in its folder: native"),
                (["trace", at], "is a folder, not a trace prefix; its traces: emulated, native"),
                (["trace", f"{at}/nativ"], "nativ; the nearest in its folder: native"),
                (["trace", f"{at}/native.932.csv"], "/native, not its file native.932.csv"),
                (["trace", f"{at}/zz"], "zz; the traces in its folder: emulated, native"),
                (["trace", str(tmp_path / "none")], "none; `ccbridge run --record T -- CMD` records one")):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err.splitlines()
            assert len(err) == 1 and len(err[0]) <= 120 and says in err[0], (argv, err)
            assert err[0].startswith(f"ccbridge {argv[0]}: "), err
    if TRACES.parent.parent != tmp_path:
        monkeypatch.chdir(TRACES.parent.parent)
    assert main(["trace", "examples/traces"]) == 2  # no trace beside them: those in its folders named
    assert "examples/traces is a folder, not a trace prefix; its traces: ddp-h200x2/emulated" in capsys.readouterr().err


def test_a_prefix_a_run_just_recorded_at_may_hold_no_file():
    """A program that made no CUDA driver call leaves no trace file: where this process ran it to record
    (its caller says recorded), summarize() gives an empty trace, which account and run then speak of
    (`made no CUDA driver call`), instead of calling the prefix a mistake."""
    prefix = str(TRACES / "decode-h200" / "never-recorded-here")
    with pytest.raises(UsageError, match="no trace has the prefix"):
        trace.summarize(prefix)
    s = trace.summarize(prefix, recorded=True)
    assert not s.processes and not s.by_api


@pytest.mark.parametrize("sample", SAMPLES)
def test_trace_of_a_sample_keeps_its_columns_in_120(sample, capsys):
    """The DDP sample's `collective` kind (10 letters in an 8-column kind) pushed its rows' figures out of line, to
    122 columns; and 'hooked calls: cuLaunchKernel 1370' beside 1280 in the table did not say that the hooks'
    counts take in paused and untraced calls."""
    assert main(["trace", str(TRACES / sample / "emulated")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 120 for line in lines), [len(line) for line in lines]
    head = next(i for i, line in enumerate(lines) if line.startswith("api "))
    table = lines[head:next(i for i, line in enumerate(lines) if line.startswith("hooked calls"))]
    assert {len(line) for line in table} == {len(lines[head])}  # every row ends where the header does
    kinds = {line[28:38].strip() for line in table[1:]}  # the kind column: where the header puts it
    assert kinds <= set(trace.KINDS) and (sample != "ddp-h200x2" or "collective" in kinds), kinds
    assert "the paused (trace.paused) and untraced ones too" in "\n".join(lines)


def test_trace_table_keeps_its_columns_for_large_figures():
    """A long trace's figures (ten million calls, hours in calls) lose decimals, not their columns."""
    s = trace.TraceSummary(processes=1)
    s.by_api[("a_mark_named_at_great_length_by_the_program", "-", "-")] = {
        "kind": "collective", "count": 123_456_789, "bytes": 2**60, "blocked_ns": 9e15, "stream_wait_ns": 3e13,
        "channel_wait_ns": 1e12, "toll_ns": 4e14, "captured": 0, "replays": 0}
    lines = trace.render(s).splitlines()
    assert [len(line) for line in lines[1:3]] == [120, 120], lines


def test_compare_names_an_account_of_the_samples_emulated_on_the_h200(tmp_path, capsys):
    """compare labelled an account 'no GPU, CC off' (the machine that read the traces, its own state), where OTHER
    ran under b300 on an H200."""
    _account(tmp_path, "decode-h200", capsys)
    res = str(tmp_path / "decode-h200" / "result.json")
    main(["compare", res, res])
    said = capsys.readouterr()
    assert "BASE NVIDIA H200, EMULATED profile b300" in (said.out + said.err).replace("\n  ", " ")
