"""ccbridge advise: settings per stack from stamps, probe and account results, each citing its number."""

import json
import re
import subprocess
import sys

import pytest

from ccbridge import account, advise
from ccbridge.errors import ResultFileError
from ccbridge.results import Result, Row


def stamp(cc="off", emulated=None):
    return {"ccbridge": "test", "nvml": {"gpus": [{"index": 0, "name": "GPU X"}], "cc": {"mode": cc}},
            "tee": {"kind": "tdx" if cc == "on" else "none"},
            "emulation": {"active": bool(emulated), "profile": emulated}}


def cc_probe_rows():
    """What a CC-on (or emulated) bridge looks like: readbacks hold the host, pinned lost its lead,
    launches are dear, contexts scale, small readbacks serialize."""
    rows = [Row.of("semantics.nonblocking", "return_fraction", "fraction", [1.0, 0.98, 1.01], dir="d2h", mem="pinned",
                   stream="same"),
            Row.of("semantics.nonblocking", "return_fraction", "fraction", [0.95, 0.97], dir="h2d", mem="pinned",
                   stream="same"),
            Row.of("semantics.nonblocking", "return_fraction", "fraction", [0.01], dir="h2d", mem="pinned", stream="idle"),
            Row.of("transfer.sweep", "bandwidth", "GB/s", [4.1, 4.3, 4.2], dir="h2d", mem="pinned", bytes=1 << 30),
            Row.of("transfer.sweep", "bandwidth", "GB/s", [3.9, 4.0], dir="h2d", mem="pageable", bytes=1 << 30),
            Row.of("transfer.sweep", "bandwidth", "GB/s", [9.0], dir="h2d", mem="pinned", bytes=4096),
            Row.of("launch.cost", "time_per_kernel", "us", [26.0, 25.0, 27.5], mode="pipelined"),
            Row.of("launch.cost", "time_per_kernel", "us", [1.2], mode="graph"),
            Row.of("smallcopy.d2h32", "per_copy_time", "us", [180.0], streams=1),
            Row.of("smallcopy.d2h32", "per_copy_time", "us", [176.0], streams=16)]
    rows += [Row.of("concurrency.scaling", "aggregate_bandwidth", "GB/s", [v], mode="contexts", dir="h2d", n=n)
             for n, v in ((1, 4.0), (4, 11.5), (8, 13.0), (16, 12.0))]
    return rows


def native_probe_rows():
    rows = [Row.of("semantics.nonblocking", "return_fraction", "fraction", [0.0001], dir="d2h", mem="pinned",
                   stream="same"),
            Row.of("semantics.nonblocking", "return_fraction", "fraction", [0.0], dir="h2d", mem="pinned", stream="same"),
            Row.of("transfer.sweep", "bandwidth", "GB/s", [54.7], dir="h2d", mem="pinned", bytes=1 << 30),
            Row.of("transfer.sweep", "bandwidth", "GB/s", [8.6], dir="h2d", mem="pageable", bytes=1 << 30),
            Row.of("launch.cost", "time_per_kernel", "us", [3.7], mode="pipelined"),
            Row.of("launch.cost", "time_per_kernel", "us", [0.8], mode="graph"),
            Row.of("smallcopy.d2h32", "per_copy_time", "us", [7.1], streams=1),
            Row.of("smallcopy.d2h32", "per_copy_time", "us", [7.0], streams=16)]
    rows += [Row.of("concurrency.scaling", "aggregate_bandwidth", "GB/s", [v], mode="contexts", dir="h2d", n=n)
             for n, v in ((1, 54.7), (4, 54.2), (16, 54.6))]
    return rows


def save(tmp_path, name, res_or_doc):
    p = tmp_path / name
    if isinstance(res_or_doc, Result):
        res_or_doc.save(p)
    else:
        p.write_text(json.dumps(res_or_doc))
    return str(p)


def find(recs, stack, fragment):
    return [a for a in recs if a.stack == stack and fragment in a.setting]


def medians(res):
    return {r.key(): r.median for r in res.rows}


def test_emulated_cc_probe_calls_for_sync_scheduling_graphs_pool_and_is_labelled(tmp_path):
    res = Result(kind="probe", env=stamp("off", emulated="b300"), settings={"quick": True}, rows=cc_probe_rows())
    inputs, recs = advise.advise([save(tmp_path, "x.json", res)])
    assert inputs[0].kind == "probe" and inputs[0].emulated and inputs[0].summary()["cc_applies"]
    assert find(recs, "vLLM", "--async-scheduling off")
    assert find(recs, "SGLang", "--disable-overlap-schedule")
    assert find(recs, "TRT-LLM", "disable_overlap_scheduler=True")
    assert find(recs, "torch", "StagedH2D")
    assert find(recs, "vLLM", "CUDA graphs on") and find(recs, "SGLang", "CUDA graphs on")
    assert find(recs, "loader", "pool of 8 contexts: ccbridge load --contexts 8 --workers 8")
    assert find(recs, "loader", "--staging pageable") and not find(recs, "loader", "--staging pinned")
    assert find(recs, "torch", "one D2H per step")
    assert not find(recs, "vLLM/SGLang/TRT-LLM", "async / overlap scheduling on")
    assert not find(recs, "all", "no CC-specific change")
    assert recs and all(a.emulated for a in recs)
    # every number cited is the median of the row it names
    m = medians(res)
    for a in recs:
        assert a.cites, a
        for c in a.cites:
            assert c.median == m[c.key] and c.unit in ("fraction", "GB/s", "us")
    vllm = find(recs, "vLLM", "--async-scheduling off")[0]
    assert [c.key for c in vllm.cites] == ["semantics.nonblocking:return_fraction[dir=d2h,mem=pinned,stream=same]"]
    assert vllm.cites[0].median == 1.0
    text = advise.render(inputs, recs)
    assert "CC emulated (profile b300)" in text
    rows = [l for l in text.splitlines()[2:] if not l.startswith(" ")]  # a row's first line, not its wrapped rest
    assert len(rows) == len(recs) and all(" EMULATED " in l for l in rows)
    why = advise.render_why(inputs, recs)
    assert "[semantics.nonblocking:return_fraction[dir=d2h,mem=pinned,stream=same] = 1 fraction]" in why


def test_a_framework_only_emulated_probe_cites_the_emulated_launch_not_its_paused_twin(tmp_path):
    """Under a profile the framework loops also write *_emulation_paused twins (the same params): the launch
    toll advice reads the emulated row."""
    rows = [r for r in cc_probe_rows() if r.test != "launch.cost"]
    rows += [Row.of("framework.launch", "time_per_op", "us", [27.0], mode="pipelined"),
             Row.of("framework.launch", "time_per_op_emulation_paused", "us", [8.0], mode="pipelined")]
    res = Result(kind="probe", env=stamp("off", emulated="b300"), settings={}, rows=rows)
    _, recs = advise.advise([save(tmp_path, "f.json", res)])
    graphs = find(recs, "vLLM", "CUDA graphs on")
    assert graphs and graphs[0].cites[0].key == "framework.launch:time_per_op[mode=pipelined]" and graphs[0].cites[0].median == 27.0
    assert not find(recs, "all", "the launch toll is small here")


def test_native_cc_off_probe_keeps_defaults_and_says_cc_does_not_apply(tmp_path):
    res = Result(kind="probe", env=stamp("off"), settings={}, rows=native_probe_rows())
    inputs, recs = advise.advise([save(tmp_path, "n.json", res)])
    assert not inputs[0].summary()["cc_applies"]
    assert find(recs, "all", "no CC-specific change")
    assert find(recs, "vLLM/SGLang/TRT-LLM", "async / overlap scheduling on")
    assert find(recs, "loader", "--staging pinned") and find(recs, "torch", "pin host buffers")
    assert find(recs, "all", "CUDA graphs as the engine ships them")
    assert find(recs, "loader", "one context")
    for bad in (("vLLM", "--async-scheduling off"), ("torch", "StagedH2D"), ("loader", "pool of"),
                ("torch", "one D2H per step"), ("vLLM", "CUDA graphs on")):
        assert not find(recs, *bad), bad
    assert not any(a.emulated for a in recs)
    assert "EMULATED" not in advise.render(inputs, recs)
    pin = find(recs, "loader", "--staging pinned")[0]
    assert [(c.median, c.unit) for c in pin.cites] == [(54.7, "GB/s"), (8.6, "GB/s")]
    assert "6.36x at 1 GiB" in pin.why


def test_real_cc_on_is_cc_but_not_emulated(tmp_path):
    res = Result(kind="probe", env=stamp("on"), settings={}, rows=cc_probe_rows())
    inputs, recs = advise.advise([save(tmp_path, "on.json", res)])
    assert inputs[0].summary()["cc_applies"] and not inputs[0].emulated
    assert find(recs, "vLLM", "--async-scheduling off") and not any(a.emulated for a in recs)


def test_bare_env_stamp(tmp_path):
    inputs, recs = advise.advise([save(tmp_path, "on.json", stamp("on"))])
    assert inputs[0].kind == "env"
    assert find(recs, "vLLM", "DrainWorker") and all(not a.cites for a in recs)
    assert all("no measurement" in a.why for a in recs)
    inputs, recs = advise.advise([save(tmp_path, "off.json", stamp("off"))])
    assert [(a.stack, a.setting.split(" (")[0]) for a in recs] == [("all", "engine defaults")]
    assert "do not apply" in recs[0].why
    inputs, recs = advise.advise([save(tmp_path, "emu.json", stamp("off", emulated="b300"))])
    assert find(recs, "vLLM", "DrainWorker") and all(a.emulated for a in recs)


def account_result(profile="b300"):
    rows = [Row.of("account.total", "wall_slowdown", "s", [0.175])]
    for api, kind, d, m, share, rec in (
            ("cuMemcpyDtoHAsync_v2", "crossing", "d2h", "pinned", 0.78,
             "drain on a worker (ccbridge.serve.DrainWorker): the readback waits for the stream"),
            ("cuLaunchKernel", "launch", "", "", 0.21, "CUDA graphs: one launch toll per graph instead of one per kernel"),
            ("cuMemcpyHtoD_v2", "crossing", "h2d", "pageable", 0.01, "larger, fewer crossings: each pays a fixed toll")):
        r = Row.of("account.api", "share_of_slowdown", "fraction", [share], api=api, kind=kind, dir=d, mem=m)
        r.extra["recovery"] = rec
        rows.append(r)
    return Result(kind="account", env=stamp("off"), settings={"base": "a", "other": "b", "profile": profile},
                  rows=rows)


def test_account_top_rows_map_to_stack_settings(tmp_path):
    res = account_result()
    inputs, recs = advise.advise([save(tmp_path, "acc.json", res)])
    assert inputs[0].kind == "account"
    assert inputs[0].emulated  # account --profile: the other trace ran under the emulator
    assert all(a.emulated for a in recs)
    drain = find(recs, "vLLM", "DrainWorker")
    assert drain and "78% of the slowdown (175.0 ms)" in drain[0].why
    assert drain[0].cites[0].key == "account.api:share_of_slowdown[api=cuMemcpyDtoHAsync_v2,dir=d2h,kind=crossing,mem=pinned]"
    assert drain[0].cites[0].median == 0.78 and drain[0].cites[1].median == 0.175
    assert find(recs, "TRT-LLM", "cuda_graph_config") and find(recs, "torch", "DrainWorker")
    assert not find(recs, "DDP", "larger buckets")  # 1% of the slowdown: below the cut
    assert recs.index(drain[0]) < recs.index(find(recs, "vLLM", "CUDA graphs on")[0])  # largest share first


def test_account_advice_names_the_lines_where_the_time_went(tmp_path):
    res = account_result()
    for site, share in (("serve.py:88 step -> TensorBase.item", 0.70), ("serve.py:12 warmup -> TensorBase.cpu", 0.06),
                        ("serve.py:99 log -> TensorBase.tolist", 0.02)):
        r = Row.of("account.site", "share_of_slowdown", "fraction", [share], api="cuMemcpyDtoHAsync_v2",
                   kind="crossing", dir="d2h", mem="pinned", site=site)
        res.rows.append(r)
    _, recs = advise.advise([save(tmp_path, "acc.json", res)])
    drain = find(recs, "vLLM", "DrainWorker")[0]
    assert "70% at serve.py:88 step -> TensorBase.item; 6% at serve.py:12 warmup" in drain.why
    assert "tolist" not in drain.why  # under 5% of the slowdown: not worth a line
    assert any("site=serve.py:88" in c.key for c in drain.cites)


def test_small_readbacks_are_packed_on_the_device_not_staged(tmp_path):
    rows = [Row.of("account.total", "wall_slowdown", "s", [0.1])]
    r = Row.of("account.api", "share_of_slowdown", "fraction", [0.9], api="cuMemcpyDtoHAsync_v2", kind="crossing",
               dir="d2h", mem="pinned")
    r.extra["recovery"] = "pack small readbacks into one (gather a step's results on the device, one D2H)"
    res = Result(kind="account", env=stamp("on"), settings={}, rows=rows + [r])
    _, recs = advise.advise([save(tmp_path, "a.json", res)])
    assert find(recs, "vLLM/SGLang/TRT-LLM", "one D2H per step") and not any("StagedH2D" in a.setting for a in recs)


def test_account_of_two_native_traces_is_not_emulated(tmp_path):
    _, recs = advise.advise([save(tmp_path, "acc.json", account_result(profile=None))])
    assert recs and not any(a.emulated for a in recs)


def test_json_output_has_records_and_env_summaries(tmp_path):
    emu = save(tmp_path, "emu.json", Result(kind="probe", env=stamp("off", emulated="b300"), settings={},
                                            rows=cc_probe_rows()))
    st = save(tmp_path, "stamp.json", stamp("off"))
    out = tmp_path / "advice.json"
    p = subprocess.run([sys.executable, "-m", "ccbridge.cli", "advise", emu, st, "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert [(i["kind"], i["emulated"], i["cc_applies"]) for i in doc["inputs"]] == [("probe", True, True),
                                                                                     ("env", False, False)]
    assert doc["inputs"][0]["emulation_profile"] == "b300" and doc["inputs"][1]["cc_mode"] == "off"
    assert {a["source"] for a in doc["advice"]} == {emu, st}
    assert all(a["emulated"] == (a["source"] == emu) for a in doc["advice"])
    rows = [l for l in p.stdout.splitlines() if not l.startswith((" ", "#", "stack "))]
    assert len(rows) == len(doc["advice"])  # one row per record (its wrapped lines indented)


@pytest.mark.parametrize("content, fragment", [
    ("{not json", "not a JSON document"),
    ('{"hello": 1}', "not a ccbridge result or env stamp"),
    ("[1, 2]", "not a ccbridge result or env stamp"),
])
def test_bad_files(tmp_path, content, fragment):
    p = tmp_path / "f.json"
    p.write_text(content)
    with pytest.raises(ResultFileError, match=fragment):
        advise.read(p)


def decode_result(tok: dict, emulated=None, graphs=False, match=True):
    """bench decode's rows: tok:{(batch, mode): tok/s}."""
    rows = []
    for (b, mode), v in tok.items():
        r = Row.of("decode", "tok_per_s", "tok/s", [v * 0.99, v, v * 1.01], model="tiny", batch=b, mode=mode,
                   graphs=graphs)
        r.extra = {"tokens_match": match, "gpu_busy": 0.5}
        rows += [r, Row.of("decode", "step_ms", "ms", [b * 1e3 / v], model="tiny", batch=b, mode=mode, graphs=graphs)]
    return Result(kind="decode", env=stamp("off", emulated), settings={"decode": {"model": "tiny", "graphs": graphs}},
                  rows=rows)


def test_decode_under_emulation_picks_the_drain_and_maps_it_to_the_engines(tmp_path):
    res = decode_result({(1, "sync"): 40.0, (1, "async"): 41.0, (1, "staged"): 41.5, (1, "drain"): 41.2,
                         (64, "sync"): 900.0, (64, "async"): 910.0, (64, "staged"): 930.0, (64, "drain"): 1500.0},
                        emulated="b300")
    inputs, recs = advise.advise([save(tmp_path, "dec.json", res)])
    assert inputs[0].kind == "decode" and inputs[0].emulated and all(a.emulated for a in recs)
    # batch 1: nothing beats async by 5%, so the engine default stays; batch 64: the drain (1.65x async)
    assert find(recs, "torch", "batch 1: async scheduling")
    b64 = find(recs, "torch", "batch 64: drain scheduling")
    assert b64 and "1.65x async" in b64[0].why and len(b64[0].cites) == 4
    vllm = find(recs, "vLLM", "DrainWorker")
    assert vllm and "batch 64: drain 1500 tok/s vs async 910" in vllm[0].why
    assert not find(recs, "vLLM", "scheduling sync: leave")
    assert find(recs, "all", "--graphs")  # eager under CC: graphs are the next thing to measure
    text = advise.render(inputs, recs)
    assert "EMULATED" in text and "drain 1500 tok/s (1.65x async)" in text and "decode:tok_per_s[" not in text
    assert "decode:tok_per_s[" in advise.render_why(inputs, recs)  # the row keys: --why


def test_decode_natively_keeps_async_and_sync_wins_only_by_margin(tmp_path):
    native = decode_result({(8, "sync"): 500.0, (8, "async"): 700.0, (8, "drain"): 710.0})
    _, recs = advise.advise([save(tmp_path, "n.json", native)])
    assert find(recs, "torch", "batch 8: async scheduling") and find(recs, "vLLM/SGLang/TRT-LLM", "engine default")
    assert not any(a.emulated for a in recs) and not find(recs, "all", "--graphs")  # CC off: no CC advice
    slow = decode_result({(8, "sync"): 800.0, (8, "async"): 700.0}, emulated="b300", graphs=True)
    _, recs = advise.advise([save(tmp_path, "s.json", slow)])
    assert find(recs, "SGLang", "--disable-overlap-schedule") and find(recs, "vLLM", "leave --async-scheduling off")
    assert not find(recs, "all", "--graphs")  # this run already used graphs


def test_a_native_and_an_emulated_decode_give_the_tax_and_the_gap_each_mode_closes(tmp_path):
    native = decode_result({(8, "sync"): 600.0, (8, "async"): 1000.0, (8, "drain"): 1010.0,
                            (64, "sync"): 3000.0, (64, "async"): 5000.0, (64, "staged"): 5000.0, (64, "drain"): 5000.0})
    cc = decode_result({(8, "sync"): 500.0, (8, "async"): 520.0, (8, "drain"): 900.0,
                        (64, "sync"): 2500.0, (64, "async"): 2600.0, (64, "staged"): 2700.0, (64, "drain"): 4760.0},
                       emulated="b300")
    other = decode_result({(64, "async"): 100.0}, emulated="b300", graphs=True)  # another run: not paired
    _, recs = advise.advise([save(tmp_path, "n.json", native), save(tmp_path, "c.json", cc),
                             save(tmp_path, "g.json", other)])
    tax = {a.setting: a for a in recs if "CC tax" in a.setting}
    assert set(tax) == {"batch 64, sync: CC tax 17%", "batch 64, async: CC tax 48%", "batch 64, staged: CC tax 46%",
                        "batch 64, drain: CC tax 5%"}  # the largest batch both measured
    drain = tax["batch 64, drain: CC tax 5%"]
    assert "closes 90% of the gap to native async (5000)" in drain.why and drain.emulated  # (4760-2600)/2400
    assert "closes" not in tax["batch 64, async: CC tax 48%"].why
    assert len(drain.cites) == 2


def test_runs_that_are_not_the_same_or_not_clean_are_not_compared(tmp_path):
    tok = {(8, "sync"): 600.0, (8, "async"): 1000.0}
    native, cc = decode_result(tok), decode_result({(8, "sync"): 500.0, (8, "async"): 520.0}, emulated="b300")
    native.settings["decode"].update(device="cuda:0", seed=0, dtype="bfloat16")
    for change in ({"seed": 1}, {"device": "cpu"}, {"dtype": "float32"}, {"checkpoint": "/a/llama"}):
        cc.settings["decode"].update({"device": "cuda", "seed": 0, "dtype": "bfloat16", "checkpoint": None, **change})
        _, recs = advise.advise([save(tmp_path, "n.json", native), save(tmp_path, "c.json", cc)])
        assert not any("CC tax" in a.setting for a in recs), change
    cc.settings["decode"].update(device="cuda", seed=0, dtype="bfloat16", checkpoint=None)
    _, recs = advise.advise([save(tmp_path, "n.json", native), save(tmp_path, "c.json", cc)])
    assert any("CC tax" in a.setting for a in recs)  # cuda and cuda:0 are the same kind of device
    cc.errors.append({"test": "decode", "error": "tokens differ"})
    _, recs = advise.advise([save(tmp_path, "n.json", native), save(tmp_path, "c.json", cc)])
    assert not any("CC tax" in a.setting for a in recs)  # a failed run is no half of a comparison


def test_decode_with_differing_tokens_gives_no_schedule(tmp_path):
    res = decode_result({(8, "sync"): 500.0, (8, "drain"): 900.0}, emulated="b300", match=False)
    _, recs = advise.advise([save(tmp_path, "bad.json", res)])
    assert len(recs) == 1 and "different tokens" in recs[0].setting


def test_decode_advice_needs_the_default_a_gpu_and_a_clean_run(tmp_path):
    only_sync = decode_result({(8, "sync"): 500.0, (8, "drain"): 900.0}, emulated="b300")
    _, recs = advise.advise([save(tmp_path, "s.json", only_sync)])
    assert len(recs) == 1 and "measure async too" in recs[0].setting  # nothing to compare a change with
    cpu = decode_result({(8, "sync"): 500.0, (8, "async"): 900.0})
    cpu.settings["decode"]["device"] = "cpu"
    _, recs = advise.advise([save(tmp_path, "c.json", cpu)])
    assert len(recs) == 1 and "measured on the CPU" in recs[0].setting
    failed = decode_result({(8, "sync"): 500.0, (8, "async"): 900.0})
    failed.errors.append({"test": "decode", "error": "out of memory at batch 256"})
    _, recs = advise.advise([save(tmp_path, "f.json", failed)])
    assert len(recs) == 1 and "it recorded errors" in recs[0].setting and "out of memory" in recs[0].why


@pytest.mark.parametrize("change,fragment", [
    (lambda r: setattr(r.rows[0], "median", 0.0), "rows[0].median: 0.0 must be positive"),
    (lambda r: setattr(r.rows[0], "median", -5.0), "rows[0].median: -5.0 must be positive"),
    (lambda r: r.rows[0].params.update(mode="turbo"), "rows[0].params.mode: 'turbo' is not one of sync, async, staged, "
                                                      "drain"),
    (lambda r: r.rows[0].params.update(batch="8"), "rows[0].params.batch: '8' is not of type 'integer'"),
    (lambda r: r.rows[0].params.update(batch=0), "rows[0].params.batch: 0 is less than the minimum of 1"),
    (lambda r: r.rows[0].params.pop("batch"), "rows[0].params: 'batch' is a required property"),
    (lambda r: r.rows.append(r.rows[0]), "repeats decode:tok_per_s[batch=8"),
    (lambda r: r.settings.update(decode=[1]), "settings.decode: [1] is not of type 'object'"),
    (lambda r: r.settings.update(kv={}), "settings: Additional properties are not allowed ('kv' was unexpected)"),
])
def test_malformed_decode_rows_are_refused(tmp_path, change, fragment):
    res = decode_result({(8, "sync"): 500.0, (8, "async"): 900.0})
    change(res)
    with pytest.raises(ResultFileError, match=re.escape(fragment)):
        advise.read(save(tmp_path, "d.json", res))


def kv_result(ttft: dict, spill: dict, emulated="b300", mismatches=0):
    """bench kv's rows: ttft:{(threshold, mode): ms}, spill:{threshold: bytes}."""
    rows = []
    for (th, mode), v in ttft.items():
        r = Row.of("kv", "ttft_ms", "ms", [v * 0.98, v, v * 1.05], model="tiny", threshold=th, mode=mode)
        r.extra = {"p99": v * 1.2, "mismatches": mismatches, "near_ties": 0}
        rows += [r, Row.of("kv", "spill_bytes", "B", [spill[th]], model="tiny", threshold=th, mode=mode)]
    return Result(kind="kv", env=stamp("off", emulated), settings={"kv": {"model": "tiny"}}, rows=rows)


def test_kv_recommends_the_store_threshold_that_earns_its_crossings(tmp_path):
    spill = {1: 2.3 * (1 << 30), 2: 2.3 * (1 << 20), 3: 2.2 * (1 << 20)}
    res = kv_result({(1, "sync"): 1615.0, (2, "sync"): 544.0, (3, "sync"): 540.0,
                     (1, "async"): 1900.0, (2, "async"): 700.0, (3, "async"): 705.0}, spill)
    inputs, recs = advise.advise([save(tmp_path, "kv.json", res)])
    assert inputs[0].kind == "kv" and all(a.emulated for a in recs)
    # threshold 3 (540 ms) is within 5% of 2 (544 ms): the smaller filter, which drops fewer reused blocks
    v = find(recs, "vLLM", 'OffloadingConnector kv_connector_extra_config {"store_threshold": 2}')
    v = [a for a in v if a.setting.startswith("sync ")]
    assert len(v) == 1 and "544.0 ms at threshold 2 vs 1615.0 ms at 1" in v[0].why
    assert "spill D2H 2.3 MiB vs 2.3 GiB" in v[0].why
    assert find(recs, "torch", "async scheduling: ccbridge.serve.KVCache(threshold=")
    assert find(recs, "vLLM", "scheduling sync while KV restores")  # sync 544 vs async 700 at their best
    close = kv_result({(1, "sync"): 100.0, (1, "async"): 103.0}, {1: 1 << 20})
    _, recs = advise.advise([save(tmp_path, "close.json", close)])
    assert find(recs, "vLLM", "async scheduling (the default)")  # sync is not 5% faster: the default stays


def test_kv_without_a_gain_keeps_no_filter_and_mismatches_give_none(tmp_path):
    res = kv_result({(1, "sync"): 100.0, (2, "sync"): 98.0}, {1: 1 << 20, 2: 1 << 10}, emulated=None)
    _, recs = advise.advise([save(tmp_path, "kv.json", res)])
    assert find(recs, "vLLM", "no store_threshold") and find(recs, "torch", "KVCache(threshold=1)")
    bad = kv_result({(1, "sync"): 100.0, (2, "sync"): 50.0}, {1: 1, 2: 1}, mismatches=3)
    _, recs = advise.advise([save(tmp_path, "bad.json", bad)])
    assert len(recs) == 1 and "different first tokens" in recs[0].setting


def test_kv_needs_threshold_one_and_sane_rows(tmp_path):
    res = kv_result({(2, "sync"): 100.0, (3, "sync"): 90.0}, {2: 1, 3: 1})
    _, recs = advise.advise([save(tmp_path, "k.json", res)])
    assert len(recs) == 1 and "measure threshold 1 too" in recs[0].setting
    for change, fragment in ((lambda r: r.rows[0].params.update(threshold=2.5), "rows[0].params.threshold: 2.5 is not "
                              "of type 'integer'"),
                             (lambda r: r.rows[0].params.update(mode="x"), "rows[0].params.mode: 'x' is not one of "
                                                                           "sync, async"),
                             (lambda r: r.rows[0].params.update(threshold=-3), "rows[0].params.threshold: -3 is less "
                                                                               "than the minimum of 1")):
        bad = kv_result({(1, "sync"): 100.0}, {1: 1})
        change(bad)
        with pytest.raises(ResultFileError, match=re.escape(fragment)):
            advise.read(save(tmp_path, "b.json", bad))


def test_empty_serving_and_unread_results_are_refused(tmp_path):
    dec = Result(kind="decode", env=stamp(), settings={"decode": {}}, rows=[])
    with pytest.raises(ResultFileError, match="no tok_per_s rows .an interrupted `ccbridge bench decode`.*nothing to advise"):
        advise.read(save(tmp_path, "d.json", dec))
    kv = Result(kind="kv", env=stamp(), settings={"kv": {}},
                rows=[Row.of("kv", "spill_bytes", "B", [1.0], threshold=1, mode="sync")])
    with pytest.raises(ResultFileError, match="no ttft_ms rows .an interrupted `ccbridge bench kv`.*nothing to advise"):
        advise.read(save(tmp_path, "k.json", kv))
    other = Result(kind="probe", env=stamp(), settings={},
                   rows=[Row.of("hostcrypto.aes256gcm", "throughput", "GB/s", [3.0])])
    with pytest.raises(ResultFileError, match="a probe with none of the GPU families advise reads: nothing to advise from"):
        advise.read(save(tmp_path, "h.json", other))


def _numbers(text):
    return re.findall(r"\d+(?:\.\d+)?", text)


def test_the_short_view_fits_120_columns_and_its_numbers_are_in_the_json(tmp_path):
    """Issue 26: a decode pair and an account result, advised at the terminal: no line over 120 characters by
    default or with --why, and every number the table shows is in --json (outside the table's own brief)."""
    native = decode_result({(8, "async"): 1000.0, (64, "sync"): 3000.0, (64, "async"): 5000.0, (64, "drain"): 5000.0})
    cc = decode_result({(8, "async"): 520.0, (64, "sync"): 2500.0, (64, "async"): 2600.0, (64, "drain"): 4760.0},
                       emulated="b300")
    acc = account_result()
    acc.rows.append(Row.of("account.site", "share_of_slowdown", "fraction", [0.7], api="cuMemcpyDtoHAsync_v2",
                           kind="crossing", dir="d2h", mem="pinned",
                           site="serve/engine/loop.py:1288 Scheduler.step_and_collect -> TensorBase.item " * 2))
    files = [save(tmp_path, "n.json", native), save(tmp_path, "c.json", cc), save(tmp_path, "acc.json", acc)]
    out = tmp_path / "advice.json"
    cli = [sys.executable, "-m", "ccbridge.cli", "advise", *files, "--json", str(out)]
    p = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) > 20 and all(len(l) <= 120 for l in lines), max(lines, key=len)
    assert "78% of slowdown (175.0 ms)" in p.stdout and "4760 vs 5000 tok/s" in p.stdout
    doc = json.loads(out.read_text())
    for a in doc["advice"]:
        a.pop("brief")
    evidence = json.dumps(doc)
    for line in lines:
        if not line.startswith("stack "):
            missing = [n for n in _numbers(line) if n not in evidence]
            assert not missing, (line, missing)
    why = subprocess.run(cli[:-2] + ["--why"], capture_output=True, text=True, timeout=60)
    assert why.returncode == 0 and all(len(l) <= 120 for l in why.stdout.splitlines())
    assert "account.site:share_of_slowdown[api=cuMemcpyDtoHAsync_v2" in why.stdout  # the full keys, wrapped


def collective_account(nvls="0", per_op=64 << 10, share=0.6):
    res = account_result()
    res.env["emulation"] = {"active": True, "profile": "b300", "params": {"nvls": nvls}}
    p = dict(api="ncclAllReduce", kind="collective", dir="-", mem="-")
    r = Row.of("account.api", "share_of_slowdown", "fraction", [share], **p)
    r.extra.update(recovery="fewer, larger collectives: ...", calls=[4000, 4000])
    res.rows += [r, Row.of("account.api", "gpu_time", "ms", [120.0], **p),
                 Row.of("account.api", "payload_per_op", "B", [per_op], **p)]
    return res


def test_many_small_collectives_call_for_larger_buckets_graphs_a_narrower_tp_and_no_multicast(tmp_path):
    _, recs = advise.advise([save(tmp_path, "acc.json", collective_account())])
    ddp = find(recs, "DDP", "bucket_cap_mb=100")
    assert ddp and "4000 ncclAllReduce of 64.0 KiB each: 60% of the slowdown" in ddp[0].why
    assert "120.0 ms of device time the emulator queued ahead of them (toll_ns)" in ddp[0].why
    assert ddp[0].brief == "4000 ops of 64.0 KiB, 60%"
    assert [c.median for c in ddp[0].cites[:3]] == [0.6, 64 << 10, 120.0]
    assert find(recs, "vLLM", "captured collectives drop their launch tolls")
    assert find(recs, "vLLM/SGLang", "narrower tensor-parallel degree")
    nvls = find(recs, "all", "NCCL_NVLS_ENABLE=0")
    assert nvls and "profile b300: nvls = 0" in nvls[0].why and nvls[0].emulated
    assert find(recs, "torch", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1") and find(recs, "vLLM", "VLLM_ALLREDUCE_USE_SYMM_MEM=0")
    assert find(recs, "SGLang", "--enable-nccl-nvls off") and find(recs, "TRT-LLM", "allreduce_strategy: NCCL")
    assert not any(a.setting.startswith("--disable-custom-all-reduce") for a in recs)  # not the multicast switch
    # the collective row is not mapped through the crossing/launch recoveries
    assert not any("ncclAllReduce" in a.why for a in find(recs, "TRT-LLM", "cuda_graph_config"))
    _, recs = advise.advise([save(tmp_path, "h.json", collective_account(nvls="1"))])
    assert find(recs, "DDP", "bucket_cap_mb") and not find(recs, "all", "NCCL_NVLS_ENABLE")  # multicast kept
    _, recs = advise.advise([save(tmp_path, "big.json", collective_account(per_op=64 << 20))])
    assert find(recs, "DDP/torch", "overlap collectives") and not find(recs, "DDP", "bucket_cap_mb")


def test_a_stamp_in_the_nvle_mode_turns_multicast_off_protected_pcie_keeps_it(tmp_path):
    on = stamp("on")
    on["nvml"]["cc"]["multi_gpu_mode"] = "nvle"
    _, recs = advise.advise([save(tmp_path, "nvle.json", on)])
    nvls = find(recs, "all", "NCCL_NVLS_ENABLE=0")
    assert nvls and "NVML multi-GPU CC mode nvle" in nvls[0].why and not nvls[0].cites and not nvls[0].emulated
    on["nvml"]["cc"]["multi_gpu_mode"] = "protected-pcie"
    _, recs = advise.advise([save(tmp_path, "ppcie.json", on)])
    assert not find(recs, "all", "NCCL_NVLS_ENABLE")


def tp_result(tok: dict, emulated=None):
    """bench decode --tp rows (serve/tp.py: test decode_tp, settings.decode_tp): tok:{(tp, batch, mode): tok/s}."""
    res = decode_result({(b, m): v for (_, b, m), v in tok.items()}, emulated=emulated)
    res.kind, res.rows, res.settings = "decode_tp", [], {"decode_tp": {"model": "tiny", "graphs": False, "degrees": [2, 4, 8]}}
    for (tp, b, mode), v in tok.items():
        r = Row.of("decode_tp", "tok_per_s", "tok/s", [v], model="tiny", batch=b, mode=mode, graphs=False, tp=tp)
        r.extra = {"tokens_match": True}
        res.rows.append(r)
    if emulated:
        res.env["emulation"]["params"] = {"nvls": "0"}
    return res


def test_the_narrowest_tp_degree_within_the_margin_is_advised_and_the_pair_says_what_each_keeps(tmp_path):
    cc = tp_result({(2, 8, "async"): 400.0, (4, 8, "async"): 410.0, (8, 8, "async"): 300.0,
                    (2, 8, "drain"): 700.0, (4, 8, "drain"): 600.0, (8, 8, "drain"): 500.0}, emulated="b300")
    native = tp_result({(2, 8, "async"): 500.0, (4, 8, "async"): 700.0, (8, 8, "async"): 900.0,
                        (2, 8, "drain"): 505.0, (4, 8, "drain"): 705.0, (8, 8, "drain"): 905.0})
    inputs, recs = advise.advise([save(tmp_path, "n.json", native), save(tmp_path, "c.json", cc)])
    tp = find(recs, "vLLM", "--tensor-parallel-size")
    # TP 4 is 2.5% faster than TP 2: within the margin, so the narrower split, which pays the toll on fewer GPUs
    assert [a.setting for a in tp if a.source.endswith("c.json")] == ["--tensor-parallel-size 2"]
    assert "TP 2 400, TP 4 410, TP 8 300" in tp[-1].why and tp[-1].brief == "TP 2 400 tok/s vs TP 4 410"
    assert find(recs, "torch", "TP 2, batch 8: drain scheduling")  # the modes at the degree advised
    kept = {a.setting for a in recs if "of native tok/s" in a.setting}
    assert kept == {"batch 8, TP 2: keeps 0.80 of native tok/s", "batch 8, TP 4: keeps 0.59 of native tok/s",
                    "batch 8, TP 8: keeps 0.33 of native tok/s"}
    best = find(recs, "all", "batch 8: TP 2 keeps most (0.80)")
    assert best and "against its own processes' native step" not in best[0].why  # no native_step_ms rows
    # an emulated run's own processes' native step (emulation paused) beside its step: the keep without the two
    # runs' native difference, in the why
    for (t, ms, native_ms) in ((2, 10.0, 9.0), (4, 8.0, 6.8), (8, 12.0, 9.6)):
        for metric, v in (("step_ms", ms), ("native_step_ms", native_ms)):
            cc.rows.append(Row.of("decode_tp", metric, "ms", [v], model="tiny", batch=8, mode="async", graphs=False,
                                  tp=t))
    _, again = advise.advise([save(tmp_path, "n.json", native), save(tmp_path, "c2.json", cc)])
    why = find(again, "all", "batch 8: TP 2 keeps most (0.80)")[0].why
    assert "against its own processes' native step" in why and "TP 2 0.90, TP 4 0.85, TP 8 0.80" in why
    # under CC two TP=2 replicas make 800 tok/s on 4 GPUs against TP 4's 410; two TP=4 ones 820 against TP 8's 300
    assert find(recs, "all", "batch 8: two TP=2 replicas instead of one TP=4")
    assert find(recs, "all", "batch 8: two TP=4 replicas instead of one TP=8")
    assert find(recs, "torch", "TP 8, batch 8, async: CC tax 67%")
    assert find(recs, "all", "NCCL_NVLS_ENABLE=0")
    text = advise.render(inputs, recs)
    assert all(len(l) <= 120 for l in text.splitlines())


def test_a_step_not_at_its_hbm_roofline_is_advised_a_mixed_projection_ratio(tmp_path):
    """hbm_share below 0.9 at a batch: `--project-by hbm:F` for it (async where measured); at the roofline none;
    a run projected by the HBM ratio alone is told its times overstate the target's speed-up."""
    res = tp_result({(1, 1, "sync"): 100.0, (1, 1, "async"): 120.0, (1, 128, "async"): 3000.0})
    for (b, mode), f in {(1, "sync"): 0.55, (1, "async"): 0.49, (128, "async"): 0.93}.items():
        res.rows.append(Row.of("decode_tp", "hbm_share", "of GPU time", [f], model="tiny", batch=b, mode=mode,
                               graphs=False, tp=1))
    inputs, recs = advise.advise([save(tmp_path, "n.json", res)])
    got = find(recs, "ccbridge", "--project-by hbm:")
    assert [a.setting for a in got] == ["TP 1, batch 1: project it with --project-by hbm:0.49"]
    assert "0.49 of the step's GPU time" in got[0].why and "overstate" not in got[0].why
    res.env.setdefault("emulation", {})["projection"] = {"target": "h200", "by": "hbm", "r": 1.43}
    _, recs = advise.advise([save(tmp_path, "p.json", res)])
    assert "projected so (x1.43): its times overstate" in find(recs, "ccbridge", "--project-by hbm:")[0].why
    assert all(len(l) <= 120 for l in advise.render(inputs, recs).splitlines())


def test_a_probe_of_a_machine_without_a_gpu_is_one_short_line(tmp_path):
    """Issue 33: `ccbridge probe` then `ccbridge advise` on a CPU machine: one short line, not 220 columns."""
    res = Result(kind="probe", env=stamp(), settings={"missing": {"gpu": "no usable GPU: cannot load libcuda.so.1 "
                                                                          "(no NVIDIA driver here?)"}},
                 rows=[Row.of("hostcrypto.aes256gcm", "throughput", "GB/s", [3.0])],
                 skipped=[{"test": "transfer.sweep", "reason": "no usable GPU"}])
    p = subprocess.run([sys.executable, "-m", "ccbridge.cli", "advise", save(tmp_path, "r.json", res)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [f"ccbridge advise: {tmp_path}/r.json: a probe of a machine with no usable GPU: "
                                     "nothing to advise from"]


def test_a_slowdown_of_nothing_recommends_nothing(tmp_path):
    """Issue 33: a 0.0 ms slowdown gave StagedH2D as '100% of slowdown (0.0 ms)'."""
    rows = [Row.of("account.total", "wall_slowdown", "s", [0.00002]),
            Row.of("account.total", "share_base", "s", [0.00002])]
    r = Row.of("account.api", "share_of_slowdown", "fraction", [1.0], api="cuMemcpyHtoDAsync_v2", kind="crossing",
               dir="h2d", mem="pinned")
    r.extra["recovery"] = "stage per-step inputs through ccbridge.serve.StagedH2D"
    res = Result(kind="account", env=stamp("on"), settings={"base": "a", "other": "b", "profile": None},
                 rows=rows + [r])
    inputs, recs = advise.advise([save(tmp_path, "acc.json", res)])
    assert [(a.stack, a.setting) for a in recs] == [("all", "no change: OTHER was not measurably slower than BASE")]
    assert recs[0].brief == "slowdown 0.0 ms" and "100%" not in advise.render(inputs, recs)
    res.rows[1] = Row.of("account.total", "share_base", "s", [0.0002])  # 0.2 ms: the shares count
    r.extra["recovery"] = "x"
    _, recs = advise.advise([save(tmp_path, "acc.json", res)])
    assert recs[0].setting == "x" and recs[0].brief == "100% of slowdown (0.2 ms)"


def test_the_advise_modules_import_one_way_and_nothing_private():
    """A shared core, one module per kind, none reaching into another's private names, no cycle."""
    import ast
    from pathlib import Path

    folder = Path(advise.__file__).parent
    graph = {}
    for f in folder.glob("*.py"):
        tree = ast.parse(f.read_text())
        uses = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ccbridge"):
                assert not any(a.name.startswith("_") for a in node.names), (f.name, node.module)
                if node.module == "ccbridge.advise":
                    uses |= {a.name for a in node.names}
                elif node.module.startswith("ccbridge.advise."):
                    uses.add(node.module.rsplit(".", 1)[1])
        graph[f.stem] = uses - {f.stem}
    assert graph["core"] == set() and "__init__" not in set().union(*graph.values())

    def reaches(a, seen=()):
        return {b for n in graph[a] for b in {n} | (reaches(n, seen + (a,)) if n not in seen else set())}

    assert not [m for m in graph if m in reaches(m)]


def test_a_multi_process_account_advises_from_all_ranks_summed(tmp_path):
    """A DDP/TP job's account (account.rank rows): the collectives' share of all ranks' slowdown behind the bucket
    and graphs advice."""
    res = Result(kind="account", env=stamp(), settings={"base": "n", "other": "c", "profile": "b300",
                                                          "overrides": [], "command": None, "ranks": [0, 1]})
    res.env["emulation"] = {"active": True, "profile": "b300", "params": {"nvls": "0"}}
    res.rows = [Row.of("account.rank", "slowdown", "ms", [40.0], rank="all")]
    r = Row.of("account.rank_api", "delta", "ms", [36.0], rank="all", api="ncclAllReduce", kind="collective",
               dir="-", mem="-")
    r.extra.update(share=0.9, recovery="fewer, larger collectives", calls=[200, 200], replays=0)
    res.rows.append(r)
    inputs, recs = advise.advise([save(tmp_path, "acct.json", res)])
    ddp = find(recs, "DDP", "bucket_cap_mb=100")
    assert ddp and "90% of the slowdown (40.0 ms)" in ddp[0].why
    assert find(recs, "vLLM", "CUDA graphs on")


def test_an_account_names_pinned_type_queries_and_event_timing_under_cc(tmp_path):
    """Issue 32: the trace's query lines (pinned memory answered 'managed') and timing lines (cuEventElapsedTime)
    each give one advise line, with their call site."""
    res = Result(kind="account", env=stamp(), settings={"base": "n", "other": "c", "profile": "b300",
                                                          "overrides": [], "command": None})
    res.env["emulation"] = {"active": True, "profile": "b300", "params": {"nvls": "0"}}
    res.rows = [Row.of("account.total", "share_base", "s", [0.5])]
    for test, kind, api, site in (("account.api", "query", "cuPointerGetAttributes", None),
                                  ("account.site", "query", "cuPointerGetAttributes", "serve.py:12 gate"),
                                  ("account.api", "timing", "cuEventElapsedTime", None)):
        params = dict(api=api, kind=kind, dir="-", mem="pinned" if kind == "query" else "-")
        if site:
            params["site"] = site
        r = Row.of(test, "share_of_slowdown", "fraction", [0.0], **params)
        r.extra.update(calls=[0, 7], recovery="")
        res.rows.append(r)
    _, recs = advise.advise([save(tmp_path, "a.json", res)])
    risk = find(recs, "torch", "at risk under CC: pinned memory reads as managed")
    assert risk and "7 pointer-type queries" in risk[0].why and "serve.py:12 gate" in risk[0].why
    assert find(recs, "torch", "time GPU work with %globaltimer stamps")


def test_a_timing_row_that_grew_gets_its_cc_answer_once_not_a_share_line_too(tmp_path):
    """A timing call (cuEventElapsedTime) now carries a timing recovery (it got StagedH2D's): its advice is
    cc_answers' %globaltimer line, not a second 'all' line of the recovery's text from its share."""
    res = Result(kind="account", env=stamp(), settings={"base": "n", "other": "c", "profile": "b300",
                                                          "overrides": [], "command": None})
    res.rows = [Row.of("account.total", "share_base", "s", [0.5])]
    r = Row.of("account.api", "share_of_slowdown", "fraction", [0.2], api="cuEventElapsedTime_v2", kind="timing",
               dir="-", mem="-")
    r.extra.update(calls=[32, 32], recovery=account.recovery("timing", "-", 32, 0, 0, 0, 0))
    res.rows.append(r)
    _, recs = advise.advise([save(tmp_path, "a.json", res)])
    timer = [a for a in recs if "%globaltimer" in a.setting]
    assert [(a.stack, a.setting.split(" (")[0]) for a in timer] == [
        ("torch", "time GPU work with %globaltimer stamps where CC is on")]
    assert [a.setting for a in recs if a not in timer] == ["no change: no call family explains 5% of the slowdown"]


def shares_account(*rows) -> Result:
    """An account whose share rows are (api, kind, dir, mem, share, recovery name in account.RECOVERIES)."""
    res = Result(kind="account", env=stamp("on"), settings={"base": "a", "other": "b", "profile": None},
                 rows=[Row.of("account.total", "share_base", "s", [0.1])])
    for api, kind, d, m, share, name in rows:
        r = Row.of("account.api", "share_of_slowdown", "fraction", [share], api=api, kind=kind, dir=d, mem=m)
        r.extra.update(recovery=account.RECOVERIES[name], calls=[10, 10])
        res.rows.append(r)
    return res


def test_a_call_familys_label_leaves_out_empty_and_dash_parts_as_the_account_does(tmp_path):
    res = shares_account(("cuLaunchKernel", "launch", "", "", 0.5, "CUDA graphs"))
    _, recs = advise.advise([save(tmp_path, "a.json", res)])
    assert find(recs, "vLLM", "CUDA graphs")[0].why.startswith("cuLaunchKernel (launch): 50% of the slowdown")
    assert account.kind_dir_mem("launch", "", "-") == "launch"
    assert account.kind_dir_mem("crossing", "d2h", "pinned") == "crossing/d2h/pinned"


def test_recoveries_that_call_for_the_same_settings_give_one_line_and_pass_the_cut_together(tmp_path):
    """'fewer syncs' and DrainWorker both give the DrainWorker settings, 'pack crossings' and StagedH2D both give
    StagedH2D's: grouped by recovery text, each setting was printed twice, or (3% each) not at all."""
    res = shares_account(("cuStreamSynchronize", "sync", "-", "-", 0.10, "fewer syncs"),
                         ("cuMemcpyDtoHAsync_v2", "crossing", "d2h", "pinned", 0.10, "DrainWorker"),
                         ("cuMemcpyHtoD_v2", "crossing", "h2d", "pageable", 0.03, "pack crossings"),
                         ("cuMemcpyHtoDAsync_v2", "crossing", "h2d", "pinned", 0.03, "StagedH2D"))
    _, recs = advise.advise([save(tmp_path, "a.json", res)])
    settings = [(a.stack, a.setting) for a in recs]
    assert len(settings) == len(set(settings)), settings
    drain = find(recs, "vLLM", "DrainWorker")
    assert len(drain) == 1 and drain[0].brief == "20% of slowdown (100.0 ms)"
    assert drain[0].why.startswith("cuStreamSynchronize (sync) and cuMemcpyDtoHAsync_v2 (crossing/d2h/pinned): 20%")
    assert account.RECOVERIES["fewer syncs"] in drain[0].why and account.RECOVERIES["DrainWorker"] in drain[0].why
    staged = find(recs, "torch", "ccbridge.serve.StagedH2D: packed inputs")  # 3% + 3%: over the 5% cut together
    assert len(staged) == 1 and staged[0].brief == "6% of slowdown (100.0 ms)"


def test_a_sites_apis_are_summed_into_one_figure(tmp_path):
    """cuLaunchKernel and cuLaunchKernelEx at one line: one '30% at' for it, not '20% at' and '10% at' the same."""
    res = shares_account(("cuLaunchKernel", "launch", "-", "-", 0.25, "CUDA graphs"),
                         ("cuLaunchKernelEx", "launch", "-", "-", 0.13, "CUDA graphs"))
    for api, share in (("cuLaunchKernel", 0.2), ("cuLaunchKernelEx", 0.1)):
        res.rows.append(Row.of("account.site", "share_of_slowdown", "fraction", [share], api=api, kind="launch",
                               dir="-", mem="-", site="loop.py:20 step -> silu"))
    _, recs = advise.advise([save(tmp_path, "a.json", res)])
    why = find(recs, "vLLM", "CUDA graphs")[0].why
    assert why.count("loop.py:20") == 1 and "; 30% at loop.py:20 step -> silu;" in why, why
