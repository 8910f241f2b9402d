"""Bad input at the command line: one clear line, exit 2, nothing left behind.

Each case runs the real CLI in a subprocess (`python -m ccbridge.cli`, cwd the
shared fixture folder) and asserts what a user sees: exit status 2; stderr
exactly one line, `ccbridge CMD: reason`, holding the expected fragment;
nothing on stdout; no traceback; and the fixture folder exactly as it was
(no output folder, .partial file or check folder left), plus any path the
case names as absent. argparse's own errors are held to the same format: the
CLI's parser prints them as one line too (`ccbridge CMD: argument --x: ...
(see ccbridge CMD --help)`).

The cases need no GPU: argument checks run before the GPU is looked for.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DATA, set_field

from ccbridge import cli

TIMEOUT_S = 60  # a hang fails its case instead of blocking the run


def _big_memory() -> bool:
    """More than 2 PiB free: collectives -e 100T might fit (then the case is not bad input)."""
    from ccbridge import hostmem

    return (hostmem.available_bytes() or 0) > 2 << 50


def _safetensors(header_text: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header_text)) + header_text + data


def _profile(**change) -> str:
    """The b300 profile with parameters changed (value ... removes one), as JSON text."""
    from ccbridge.emulate import profiles

    doc = json.loads((Path(profiles.__file__).parent / "profiles" / "b300.json").read_text())
    for key, value in change.items():
        if value is ...:
            del doc["params"][key]
        else:
            doc["params"][key]["value"] = value
    return json.dumps(doc)  # NaN and Infinity go out as JSON's tokens for them


def _trace_file(emulate: int) -> str:
    """A trace of one good H2D call, emulated (under b300) or not."""
    from ccbridge.emulate import trace

    return (f"# ccbridge trace schema {trace.SCHEMA}, profile {'b300' if emulate else 'passthrough'}, emulate "
            f"{emulate}\n" + ",".join(trace.COLUMNS) + "\n1,2,3,,,cuMemcpyHtoD_v2,crossing,h2d,pinned,4,0,0,0,0,,,,\n")


def _row(test: str, metric: str, **params) -> dict:
    """A row of a result: one sample of 1.0."""
    return {"test": test, "metric": metric, "unit": "x", "params": params, "median": 1.0, "p10": 1.0, "p90": 1.0,
            "min": 1.0, "max": 1.0, "n": 1, "extra": {}}


def _result(**change) -> str:
    """A real result (tests/data) with fields changed at dotted paths (value ... removes one)."""
    doc = json.loads((DATA / "h100-native-full.json").read_text())
    for where, value in change.items():
        set_field(doc, where.split("__"), value)
    return json.dumps(doc)


FILES = {
    "good.json": lambda: (DATA / "h100-native-full.json").read_text(),
    "rows_not_list.json": lambda: _result(rows={"a": 1}),
    "row_not_dict.json": lambda: _result(rows__0="row"),
    "median_text.json": lambda: _result(rows__0__median="fast"),
    "median_nan.json": lambda: _result(rows__0__median=math.nan),
    "p10_above.json": lambda: _result(rows__0__p10=1e9),
    "created_text.json": lambda: _result(created="yesterday"),
    "row_twice.json": lambda: _result(rows__1=json.loads((DATA / "h100-native-full.json").read_text())["rows"][0]),
    "no_unit.json": lambda: _result(rows__0__unit=...),
    "params_list.json": lambda: _result(rows__0__params=[1]),
    "settings_list.json": lambda: _result(settings=[]),
    "quick_text.json": lambda: _result(settings__quick="yes"),
    "skipped_bad.json": lambda: _result(skipped=[{"test": "x"}]),
    "emulation_bad.json": lambda: _result(env__emulation=True),
    "active_bad.json": lambda: _result(env__emulation__active="no"),
    "p_nan.json": lambda: _profile(h2d_toll_us=math.nan),
    "p_inf.json": lambda: _profile(d2h_toll_us=math.inf),
    "p_huge.json": lambda: _profile(sync_toll_us=1e300),
    "p_neg.json": lambda: _profile(h2d_pinned_gbps=-1),
    "p_lanes.json": lambda: _profile(lanes=2.5),
    "p_ratio.json": lambda: _profile(h2d_pinned_ratio=1.5),
    "p_text.json": lambda: _profile(chunk_bytes="big"),
    "p_bool.json": lambda: _profile(emulate=True),
    "p_missing.json": lambda: _profile(lanes=...),
    "p_unknown.json": lambda: _profile()[:-1] + ', "extra": 1}',
    "p_unknown_param.json": lambda: _profile().replace('"lanes"', '"warps"'),
    "p_broken.json": lambda: _profile()[:-5],
    "ok.safetensors": lambda: _safetensors(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "deep.safetensors": lambda: _safetensors(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "surrogate.safetensors": lambda: _safetensors(b'{"a\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "rank.safetensors": lambda: _safetensors(json.dumps({"a": {"dtype": "U8", "shape": [1] * 10**6,
                                                               "data_offsets": [0, 1]}}).encode(), b"\x01"),
    "notexec": lambda: "#!/bin/sh\necho hi\n",
    "afile": lambda: "a file where a folder is expected\n",
    "emu.1.csv": lambda: _trace_file(1),  # an emulated trace and a native one: account refuses them swapped
    "nat.1.csv": lambda: _trace_file(0),
    "tr.1.csv": lambda: (f"# ccbridge trace schema {__import__('ccbridge.emulate.trace', fromlist=['SCHEMA']).SCHEMA}, "
                         "profile b300, emulate 1\n"
                         + ",".join(__import__("ccbridge.emulate.trace", fromlist=["COLUMNS"]).COLUMNS)
                         + "\n1,2,3,,,cuMemcpyHtoD_v2,crossing,h2d,pinned,lots,0,0,0,0,\n"),
    "told.1.csv": lambda: ("t_enter_ns,t_return_ns,tid,ctx,stream,api,dir,mem,bytes,blocked_channel_ns,"  # schema 1
                           "blocked_stream_ns,toll_ns\n1,2,3,0x1,(nil),cuMemcpyHtoD_v2,h2d,pinned,4,0,0,0\n"),
    "ts.1.summary.json": lambda: "{not json",
    "tstamp.1.csv": lambda: "# a trace whose stamp beside it is broken\n",
    "tstamp.env.json": lambda: "{not json",
    "decode_empty.json": lambda: _result(settings={"decode": {"model": "tiny"}}, rows=[]),
    "decode_tp0.json": lambda: _result(settings={"decode_tp": {"model": "tiny"}},
                                       rows=[_row("decode_tp", "tok_per_s", batch=1, mode="async", tp=0)]),
    "kv_no_ttft.json": lambda: _result(settings={"kv": {}}, rows=[_row("kv", "spill_bytes", threshold=1, mode="sync")]),
    "ts2.1.csv": lambda: (f"# ccbridge trace schema {__import__('ccbridge.emulate.trace', fromlist=['SCHEMA']).SCHEMA}, "
                          "profile b300, emulate 1\n"
                          + ",".join(__import__("ccbridge.emulate.trace", fromlist=["COLUMNS"]).COLUMNS)
                          + "\n1,2,3,,,cuMemcpyHtoD_v2,crossing,h2d,pinned,4,0,0,0,0,0\n"),
    "ts2.1.sites.json": lambda: "[" * 100_000 + "]" * 100_000,
    "emu_h200.json": lambda: _result(env__emulation={"active": True, "profile": "h200"}),
    "no_gpu.json": lambda: _result(settings__missing={"gpu": "no NVIDIA driver"}, skipped=[{"test": "x", "reason": "no GPU"}]),
    "tr_back.1.csv": lambda: (f"# ccbridge trace schema {__import__('ccbridge.emulate.trace', fromlist=['SCHEMA']).SCHEMA}, "
                              "profile b300, emulate 1\n"
                              + ",".join(__import__("ccbridge.emulate.trace", fromlist=["COLUMNS"]).COLUMNS)
                              + "\n5,2,3,,,cuMemcpyHtoD_v2,crossing,h2d,pinned,4,0,0,0,0,\n"),
    "tr_huge.1.csv": lambda: (f"# ccbridge trace schema {__import__('ccbridge.emulate.trace', fromlist=['SCHEMA']).SCHEMA}, "
                              "profile b300, emulate 1\n"
                              + ",".join(__import__("ccbridge.emulate.trace", fromlist=["COLUMNS"]).COLUMNS)
                              + "\n1," + "9" * 4000 + ",3,,,cuMemcpyHtoD_v2,crossing,h2d,pinned,4,0,0,0,0,\n"),
    "stamp_nofabric.json": lambda: _result(env__nvml__cc__multi_gpu_mode="nvle"),
    "stamp_mgpu_none.json": lambda: _result(env__nvml__cc__multi_gpu_mode="none"),
    "stamp_clique_bad.json": lambda: _result(env__nvml__cc__multi_gpu_mode="nvle",
                                             env__nvml__fabric={"cliques": [{"cluster_uuid": "u", "clique_id": 1,
                                                                             "gpus": [0, 1]}]}),
}


@pytest.fixture(scope="module")
def d(tmp_path_factory) -> Path:
    """One folder of malformed inputs shared by every case (each case must leave it as it was)."""
    root = tmp_path_factory.mktemp("fuzz")
    for name, make in FILES.items():
        content = make()
        (root / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    (root / "folder").mkdir()
    (root / "sites_only.77.sites.json").write_text("{}")  # a recorded run that made no driver call: sites alone
    (root / "probed").mkdir()  # a probe's folder, and another result put beside its result.json
    (root / "probed" / "result.json").write_text((DATA / "h100-native-full.json").read_text())
    (root / "probed" / "peer.json").write_text((DATA / "h200x2-peer.json").read_text())
    (root / "acc_old").mkdir()  # an account folder whose emulated trace is there already
    (root / "acc_old" / "emulated.7.csv").write_text("")
    (root / "used").mkdir()  # a checkpoint folder an earlier make-checkpoint wrote
    (root / "used" / "model.safetensors.index.json").write_text('{"metadata": {}, "weight_map": {}}')
    return root


def _no_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return True
    return False


def _gpu() -> bool:
    """The CUDA driver sees a GPU: a command that needs one would run."""
    from ccbridge.bindings import core
    from ccbridge.errors import GpuError

    try:
        return core.device_count() > 0
    except GpuError:
        return False


def _driver() -> bool:
    """The CUDA driver loads: a recorded run would record."""
    from ccbridge.bindings import core

    return core.driver_missing() is None


def _attest_sdk() -> bool:
    """NVIDIA's attestation SDK is installed: --verify would run it."""
    import importlib.util

    return importlib.util.find_spec("nv_attestation_sdk") is not None


def _no_plugin() -> bool:
    """The net plugin is not built: `bench net` refuses for that before its init is tried."""
    from ccbridge import pluginenv

    return not (pluginenv.path() / pluginenv.NAME).exists()


def _terabyte_fits() -> bool:
    return shutil.disk_usage("/tmp").free > 2**40 + (1 << 30)


def _not_its(bench: str, *words: str) -> tuple[list[str], str]:
    """Another bench's option given to this one: argparse refuses it, naming this bench (and its --help where the
    line has room: a path of the fixture folder takes it)."""
    hint = "" if any("{d}" in w for w in words) else f" (see ccbridge bench {bench} --help)"
    return ["bench", bench, *words], f"ccbridge bench {bench}: unrecognized arguments: {' '.join(words)}{hint}"


EXISTS = "{d}/good.json exists: remove it or name another file"  # a result file given again

# (argv with {d} for the fixture folder, expected fragment of the one stderr line[, extra]).
# extra: absent = paths that must not exist after the case; skip = a precondition callable; wide = why the line
# may pass 120 columns for now; env = variables the command runs with (input too); stdin = a file of the fixture
# folder ({d}/NAME) the command's standard input is opened on, read-only.
CASES = [
    # every subcommand, argparse's own errors included, says which subcommand it was
    (["env", "--bogus"], "unrecognized arguments: --bogus (see ccbridge env --help)"),
    (["--help-me"], "unrecognized arguments: --help-me (see ccbridge --help)"),  # said: COMMAND is required
    (["bench", "--bogus"], "ccbridge bench: unrecognized arguments: --bogus (see ccbridge bench --help)"),
    (["bench"], "ccbridge bench: the following arguments are required: BENCH"),
    (["probe", "--quick", "extra"], "unrecognized arguments: extra"),
    (["load"], "the following arguments are required: paths"),
    # probe: checked before the run starts (a run takes minutes)
    (["probe", "--tests", ","], "--tests ',' names no test; `ccbridge probe --list` names them"),
    (["probe", "--tests", ""], "--tests '' names no test"),  # not the whole suite
    (["probe", "--tests", "nope"], "no probe test or family named 'nope'; `ccbridge probe --list` names them"),
    (["probe", "--tests", "hostcrypt"], "no probe test or family named 'hostcrypt' (did you mean hostcrypto?)"),
    (["probe", "--out", "/proc/forbidden", "--tests", "hostcrypto"], "--out /proc/forbidden: cannot write in /proc"),
    (["probe", "--out", "{d}/afile/out", "--tests", "hostcrypto"], "--out {d}/afile/out: {d}/afile is not a folder"),
    (["probe", "--device", "-1"], "argument --device: expected at least 0, got -1"),
    (["probe", "--device", "99"], "--device 99: "),
    (["probe", "--device", "x"], "argument --device: not an integer: 'x'"),
    (["probe", "--record", "/nonexistent/dir/t"], "the folder /nonexistent/dir does not exist"),
    (["probe", "--profile", "nosuch"], "unknown profile 'nosuch'"),
    (["probe", "--set", "lanes=2", "--tests", "hostcrypto"], "--set changes an emulator profile: it needs --profile"),
    (["probe", "--profile", "b300", "--set", "nosuch=1"], "unknown parameter 'nosuch'"),
    (["probe", "--profile", "b300", "--set", "lanes=inf"], "parameter lanes = inf: expected a whole number in [1, 64]"),
    (["probe", "--profile", "b300", "--set", "lanes=0"], "parameter lanes = 0.0: expected a whole number in [1, 64]"),
    (["probe", "--profile", "b300", "--set", "lanes"], "expected KEY=VALUE"),
    (["probe", "--profile", "passthrough", "--record", "/nonexistent/dir/t"],
     "the folder /nonexistent/dir does not exist", {"absent": ["/nonexistent"]}),
    # run
    (["run", "--profile", "b300", "--", "{d}/notexec"], "{d}/notexec is not executable"),
    (["run", "--profile", "b300", "--", "nosuch-command-4c1e"], "command not found: nosuch-command-4c1e"),
    (["run", "--profile", "b300"], "no command given: put the program after --, as in `-- CMD [ARGS...]`"),
    (["account", "--profile", "b300"], "no command given: put the program after --"),
    (["run", "--profile", "b300", "--"], "no command given"),
    (["run", "--profile", "b300", "--", "{d}/folder"], "{d}/folder is a folder, not a program"),
    (["run", "--profile", "b300", "--record", "/nonexistent/dir/t", "--", "true"],
     "trace prefix /nonexistent/dir/t: the folder /nonexistent/dir does not exist", {"absent": ["/nonexistent"]}),
    (["run", "--profile", "b300", "--record", "{d}/folder/sub/t", "--", "true"],
     "the folder {d}/folder/sub does not exist"),
    (["run", "--profile", "{d}/p_nan.json", "--", "true"], "parameter h2d_toll_us = nan: expected a number in [0, 10000000]"),
    (["run"], "give --profile NAME (emulate), --record T (record only), --coverage FILE or --project GPU"),
    (["run", "--profile", "b300", "--set", "warps=2", "--", "true"], "--set 'warps=2': unknown parameter 'warps'; `ccbridge profiles NAME` lists them"),
    (["run", "--profile", "b300", "--set", "nccltoll=1", "--", "true"], "unknown parameter 'nccltoll' (did you mean nccl_toll_us"),
    (["run", "--profile", "b300", "--set", "launch_toll_us=fast", "--", "true"], "launch_toll_us needs a number, got 'fast'"),
    (["run", "--profile", "b300", "--set", "launch_toll_us=nan", "--", "true"], "parameter launch_toll_us = nan"),
    # the multi-GPU parameters (issue 25): a negative toll, a bandwidth kept above 1, NaN, a fractional flag
    (["run", "--profile", "b300", "--set", "nccl_toll_us=-1", "--", "true"], "parameter nccl_toll_us = -1.0: expected a number in [0, "),
    (["run", "--profile", "b300", "--set", "nvlink_kept=1.5", "--", "true"], "parameter nvlink_kept = 1.5: expected a number in [0.001, 1]"),
    (["run", "--profile", "h200", "--set", "nvlink_kept=nan", "--", "true"], "parameter nvlink_kept = nan"),
    (["run", "--profile", "b300", "--set", "mgpu_launch_factor=0.5", "--", "true"], "parameter mgpu_launch_factor = 0.5"),
    (["run", "--profile", "b300", "--set", "nvls=0.5", "--", "true"], "parameter nvls = 0.5: expected a whole number in [0, 1]"),
    (["run", "--profile", "b300", "--set", "h2d_pinned_ratio=2", "--", "true"],
     "parameter h2d_pinned_ratio = 2.0: expected a number in [0.001, 1]"),
    (["run", "--profile", "b300", "--set", "launch_toll_us", "--", "true"], "--set 'launch_toll_us': expected KEY=VALUE"),
    (["run", "--profile", "{d}/p_nan.json", "--set", "h2d_toll_us=1", "--", "true"], "parameter h2d_toll_us = nan"),
    # profiles: every value finite and in range, files well-formed
    (["profiles", "nosuch"], "unknown profile 'nosuch'; known: b300"),
    (["profiles", "{d}/p_inf.json"], "parameter d2h_toll_us = inf: expected a number in [0, 10000000] (us)"),
    (["profiles", "{d}/p_huge.json"], "parameter sync_toll_us = 1e+300"),
    (["profiles", "{d}/p_neg.json"], "parameter h2d_pinned_gbps = -1: expected a number in [0, 10000] (GB/s)"),
    (["profiles", "{d}/p_lanes.json"], "parameter lanes = 2.5: expected a whole number in [1, 64]"),
    (["profiles", "{d}/p_ratio.json"], "parameter h2d_pinned_ratio = 1.5: expected a number in [0.001, 1]"),
    (["profiles", "{d}/p_text.json"], "parameter chunk_bytes = 'big': expected a whole number in [4096, 1073741824]"),
    (["profiles", "{d}/p_bool.json"], "parameter emulate = True"),
    (["profiles", "{d}/p_missing.json"], "p_missing.json: params: 'lanes' is a required property"),
    (["profiles", "{d}/p_unknown.json"], "p_unknown.json: Additional properties are not allowed ('extra' was unexpected)"),
    (["profiles", "{d}/p_unknown_param.json"], "params: 'warps' is no profile parameter (see `ccbridge profiles "
                                                "b300`)"),
    (["profiles", "{d}/p_broken.json"], "p_broken.json: not valid JSON"),
    (["profiles", "{d}/nope.json"], "{d}/nope.json: no such profile file"),
    (["profiles", "{d}/folder/"], "cannot read the profile"),
    (["profiles", "--set", "lanes=2"], "--set changes one profile: name it"),
    (["profiles", "b300", "--set", "nosuch=1"], "unknown parameter 'nosuch'"),
    (["profiles", "b300", "--set", "sync_toll_us=-5"], "parameter sync_toll_us = -5.0: expected a number in [0, 10000000]"),
    (["profiles", "b300", "--set", "sync_toll_us=NaN"], "parameter sync_toll_us = nan"),
    (["profiles", "b300", "--set", "sync_toll_us=1e9"], "parameter sync_toll_us = 1000000000.0",
     {"wide": "--set's setting and the parameter's own message both show the value (test_profiles_override)"}),
    (["profiles", "b300", "--set", "sync_toll_us:3"], "--set 'sync_toll_us:3': expected KEY=VALUE"),
    # compare and report: results validated field by field on load
    (["compare", "{d}/good.json", "{d}/rows_not_list.json"], "rows_not_list.json: rows: {'a': 1} is not of type 'array'"),
    (["compare", "{d}/row_not_dict.json", "{d}/good.json"], "rows[0]: 'row' is not of type 'object'"),
    (["compare", "{d}/good.json", "{d}/median_text.json"], "rows[0].median: 'fast' is not of type 'number'"),
    (["compare", "{d}/good.json", "{d}/median_nan.json"], "rows[0].median: nan is not a finite number"),
    (["compare", "{d}/good.json", "{d}/no_unit.json"], "rows[0]: 'unit' is a required property"),
    (["compare", "{d}/good.json", "{d}/p10_above.json"], "rows[0].p10: 1000000000.0 is above its median"),
    (["compare", "{d}/created_text.json", "{d}/good.json"], "created: 'yesterday' is not an ISO date-time"),
    (["compare", "{d}/good.json", "{d}/row_twice.json"], "rows[1] repeats compute.parity:matmul_bf16[n=8192] (rows[0])"),
    (["compare", "{d}/good.json", "{d}/params_list.json"], "rows[0].params: [1] is not of type 'object'"),
    (["compare", "{d}/good.json", "{d}/settings_list.json"], "settings: [] is not of type 'object'"),
    (["compare", "{d}/good.json", "{d}/quick_text.json"], "settings.quick: 'yes' is not of type 'boolean'"),
    (["compare", "{d}/good.json", "{d}/skipped_bad.json"], "skipped[0]: 'reason' is a required property"),
    (["compare", "{d}/good.json", "{d}/emulation_bad.json"], "env.emulation: True is not of type 'object'"),
    (["compare", "{d}/good.json", "{d}/active_bad.json"], "env.emulation.active: 'no' is not of type 'boolean'"),
    (["compare", "{d}/good.json", "{d}/kv_no_ttft.json"], "BASE is a probe result and OTHER a kv result: compare "
                                                          "takes two results of one kind"),
    (["compare", "{d}/good.json", "{d}/folder"], "{d}/folder: is a folder; pass the result.json in it"),
    (["compare", "{d}/good.json", "{d}/good.json", "--out", "/proc/forbidden"], "--out /proc/forbidden: cannot write in /proc"),
    (["report", "{d}/median_text.json", "--out", "{d}/rep"], "median_text.json: rows[0].median: 'fast' is not",
     {"absent": ["{d}/rep"]}),
    (["report", "{d}/folder"], "is a folder; pass the result.json in it"),
    (["report", "{d}/probed/peer.json"], "{d}/probed/result.json is another result, whose reports these would "
                                         "replace: give --out a folder"),
    (["report", "{d}/good.json", "--out", "/proc/forbidden"], "--out /proc/forbidden: cannot write in /proc"),
    # calibrate: given results read first, the output folder checked first
    (["calibrate", "--profile", "b300", "--native", "{d}/missing.json"], "{d}/missing.json: no such file"),
    (["calibrate", "--profile", "b300", "--native", "{d}/good.json", "--emulated", "{d}/rows_not_list.json"],
     "rows: {'a': 1} is not of type 'array'"),
    (["calibrate", "--profile", "b300", "--native", "{d}/good.json", "--emulated", "{d}/good.json"],
     "the 'emulated' result was not made under the emulator"),
    (["calibrate", "--profile", "b300", "--native", "{d}/good.json", "--out", "/proc/forbidden"],
     "--out /proc/forbidden: cannot write in /proc"),
    (["calibrate", "--profile", "nosuch"], "unknown profile 'nosuch'"),
    (["calibrate", "--profile", "b300", "--set", "nosuch=1"], "unknown parameter 'nosuch'"),
    (["calibrate", "--profile", "b300", "--set", "launch_toll_us=-1"], "parameter launch_toll_us = -1.0"),
    (["calibrate", "--profile", "b300", "--set", "launch_toll_us=inf"], "parameter launch_toll_us = inf"),
    (["calibrate", "--profile", "b300", "--set", "launch_toll_us=x"], "launch_toll_us needs a number"),
    (["calibrate", "--profile", "b300", "--set", "launch_toll_us"], "expected KEY=VALUE"),
    (["calibrate", "--profile", "b300", "--rounds", "0"], "--rounds: expected 1..20, got 0"),
    (["calibrate", "--profile", "b300", "--rounds", "21"], "--rounds: expected 1..20, got 21"),
    (["calibrate", "--profile", "b300", "--rounds", "two"], "--rounds: not an integer: 'two'"),
    (["calibrate", "--profile", "b300", "--rounds", "2", "--native", "{d}/good.json", "--emulated", "{d}/good.json"],
     "with --emulated given this command runs no emulated probe"),
    (["calibrate", "--profile", "b300", "--native", "{d}/kv_no_ttft.json"], "a `ccbridge bench kv` result, not a probe's"),
    (["calibrate", "--profile", "b300", "--native", "{d}/good.json", "--emulated", "{d}/emu_h200.json"],
     "emulated under profile h200, not b300"),
    (["calibrate", "--profile", "b300", "--native", "{d}/emu_h200.json"], "the 'native' result was made under the emulator"),
    (["calibrate", "--profile", "b300", "--native", "{d}/no_gpu.json"], "the probe ran none of its GPU tests"),
    # without a GPU, said before a probe runs (and without the native probe's folder)
    (["calibrate", "--profile", "b300"], "; without a GPU give --native and --emulated results",
     {"skip": _gpu}),
    (["calibrate", "--profile", "b300", "--native", "{d}/good.json"], "without a GPU give --native and --emulated",
     {"skip": _gpu}),
    # trace
    (["trace", "{d}/none"], "no trace has the prefix none; the traces in its folder: emu, nat, told, tr, tr_back and 4 more"),
    (["trace", "/nonexistent/dir/t"], "no trace has the prefix /nonexistent/dir/t; `ccbridge run --record T -- CMD` "
                                      "records one"),
    # a prefix mistaken: a folder (its traces named), a typo (the nearest prefixes named)
    (["trace", "{d}/acc_old"], "acc_old is a folder, not a trace prefix; its traces: emulated"),
    (["trace", "{d}/folder/"], "folder is a folder holding no trace; `ccbridge run --record T -- CMD` records one"),
    (["trace", "{d}/tr_bak"], "no trace has the prefix tr_bak; the nearest in its folder: tr_back"),
    (["account", "{d}/acc_old", "{d}/tr"], "acc_old is a folder, not a trace prefix; its traces: emulated"),
    (["account", "{d}/tr_bak", "{d}/tr"], "no trace has the prefix tr_bak; the nearest in its folder: tr_back"),
    (["trace", "{d}/tr"], "unreadable trace {d}/tr.1.csv, line 3"),
    (["trace", "{d}/tr_back"], "unreadable trace {d}/tr_back.1.csv, line 3: t_return_ns 2 is before t_enter_ns 5"),
    (["trace", "{d}/tr_huge"], "unreadable trace {d}/tr_huge.1.csv, line 3: t_return_ns '9999999999999...' is not a 64-bit count"),
    (["account", "{d}/tr", "{d}/tr_huge"], "unreadable trace {d}/tr"),
    (["trace", "{d}/ts2"], "unreadable call sites {d}/ts2.1.sites.json: not JSON: nested too deep"),
    (["trace", "{d}/tr.1.csv"], "give the trace's prefix tr, not its file tr.1.csv"),
    (["account", "{d}/tr.1.csv", "{d}/tr"], "give the trace's prefix tr, not its file tr.1.csv"),
    (["calibrate", "--profile", "b300", "--native", ""], ".: is a folder; pass the result.json in it"),
    (["trace", "{d}/told"], "trace {d}/told.1.csv: an older ccbridge (schema 1); this ccbridge reads trace schema 5: record it again"),
    (["trace", "{d}/ts"], "unreadable trace summary {d}/ts.1.summary.json"),
    (["trace", "{d}/tstamp"], "tstamp.env.json: not JSON (line 1 column 2)"),
    (["account", "{d}/tstamp", "{d}/tr"], "unreadable trace stamp ..."),
    # collectives and bench: arguments checked before the GPU is looked for
    (["collectives", "-b", "foo"], "argument -b/--minbytes: not a size: 'foo' (e.g. 4096, 512K"),
    (["collectives", "-b", "1M", "-e", "1K"], "-e/--maxbytes (1024) is smaller than -b/--minbytes (1048576)"),
    (["collectives", "-e", "0"], "argument -e/--maxbytes: size '0' is under one byte"),
    (["collectives", "-f", "1"], "argument -f/--stepfactor: expected at least 2, got 1"),
    (["collectives", "-f", "0"], "argument -f/--stepfactor: expected at least 2, got 0"),
    (["collectives", "-n", "0"], "argument -n/--iters: expected at least 1, got 0"),
    (["collectives", "-w", "-1"], "argument -w/--warmup: expected at least 0, got -1"),
    (["collectives", "-g", "0"], "argument -g/--ngpus: expected at least 2, got 0"),
    (["collectives", "-d", "float128"], "argument -d/--dtype: invalid choice: 'float128'"),
    (["collectives", "--json", "/proc/forbidden/c.json"], "--json /proc/forbidden/c.json: the folder /proc/forbidden does not exist"),
    (["collectives", "--json", "{d}/folder"], "--json {d}/folder: is a folder, not a file"),
    (["collectives", "--backend", "gloo", "-g", "1"], "argument -g/--ngpus: expected at least 2, got 1"),
    (["collectives", "--backend", "gloo", "-g", "4096", "-e", "8"], "4096 ranks: at most 4 a CPU"),
    (["collectives", "--backend", "gloo", "--transport", "sockets"], "--transport sockets picks NCCL's transport: it "
                                                                     "goes with --backend nccl"),
    (["bench", "decode", "--device", "cpu", "--timer", "globaltimer"], "--timer globaltimer times GPU work"),
    (["bench", "kv", "--device", "cpu", "--timer", "events"], "--timer events times GPU work"),
    (["run", "--profile", "b300", "--set", "launch_toll_us=1", "--set", "launch_toll_us=2", "--", "true"],
     "--set launch_toll_us is given twice"),
    (["collectives", "--backend", "gloo", "-e", "100T"], "size 65536.0 GiB: ", {"skip": _big_memory}),
    (["collectives", "--backend", "gloo", "-b", "1.5"], "argument -b/--minbytes: size '1.5' is not a whole number of "
                                                      "bytes (1.5)"),
    (["collectives", "--backend", "gloo", "-e", "1.1k"], "size '1.1k' is not a whole number of bytes (1126.4)"),
    (["bench", "cipher", "-b", "foo"], "argument -b/--minbytes: not a size: 'foo'"),
    (["bench", "cipher", "-b", "1G", "-e", "1M"], "-e/--maxbytes (1048576) is smaller than -b/--minbytes"),
    (["bench", "ddp", "--ngpus", "0"], "argument --ngpus: expected at least 2, got 0"),
    (["bench", "ddp", "--buckets", "-1"], "argument --buckets: expected at least 1, got -1"),
    (["bench", "ddp", "--models", "alexnet"], "argument --models: invalid choice: 'alexnet'"),
    (["collectives", "--net", "ccbridge", "--backend", "gloo"], "--net compares NCCL's own transports"),
    (["collectives", "--net", "ccbridge", "--transport", "sockets"], "--net compares NCCL's own transports"),
    (["collectives", "--net", "tls"], "argument --net: invalid choice: 'tls'"),
    # no GPU: what runs without one is named (Gloo's CPU ranks), where the options allow it
    (["collectives", "-e", "8"], "needs NVIDIA GPUs; torch sees none (without one: --backend gloo, CPU ranks)",
     {"skip": _gpu}),
    (["bench", "ddp", "--wrap", "fsdp"], "--wrap fsdp goes with `bench ddp --net ccbridge`"),
    _not_its("cipher", "--net", "ccbridge"),
    (["bench", "ddp", "--wrap", "zero3"], "argument --wrap: invalid choice: 'zero3'"),
    (["bench", "net", "--lanes", "0"], "argument --lanes: expected at least 1, got 0"),
    (["bench", "net", "--lanes", "2", "17"], "--lanes: at most 16 (got 17)"),
    (["bench", "net", "--inflight", "0"], "argument --inflight: expected at least 1, got 0"),
    (["bench", "net", "--link", "0"], "argument --link: expected a finite number above 0, got 0"),
    (["bench", "net", "--link", "-5"], "argument --link: expected a finite number above 0, got -5"),
    (["bench", "net", "--link", "inf"], "argument --link: expected a finite number above 0, got inf"),
    (["bench", "net", "--link", "fast"], "argument --link: not a number: 'fast'"),
    (["bench", "net", "--total", "lots"], "argument --total: not a size: 'lots'"),
    (["bench", "net", "-b", "4M", "-e", "64K"], "-e/--maxbytes (65536) is smaller than -b/--minbytes"),
    (["bench", "net", "--json", "/nonexistent-dir/x.json"], "--json"),
    # fewer bytes than the messages each measurement moves: the plugin, plain TCP and the bound moved different ones
    (["bench", "net", "--total", "1K", "-b", "64K", "-e", "64K"], "--total 1024: at least 1048576 here"),
    (["bench", "net", "--total", "15M", "--lanes", "16", "--inflight", "1", "-b", "1M", "-e", "1M"],
     "--total 15728640: at least 16777216 here"),
    (["bench", "net", "--inflight", "33"], "--inflight: at most 32, the plugin's requests per connection (got 33)"),
    # the plugin's init, in the two processes' environment, before the header (a rank's failure after the AES-GCM rates)
    (["bench", "net", "--lanes", "1", "-b", "64K", "-e", "64K", "--total", "1M", "--iters", "1"],
     "ccbridge bench net: the net plugin's init: no usable interface (NCCL_SOCKET_IFNAME=nope)",
     {"env": {"NCCL_SOCKET_IFNAME": "nope"}, "skip": _no_plugin}),
    (["bench", "decode", "--model", "gpt5"], "argument --model: invalid choice: 'gpt5'"),
    (["bench", "decode", "--batch", "0"], "argument --batch: expected at least 1, got 0"),
    (["bench", "decode", "--output", "0"], "argument --output: expected at least 2, got 0"),
    (["bench", "decode", "--prompt", "0"], "argument --prompt: expected at least 1, got 0"),
    (["bench", "decode", "--modes", "eager"], "argument --modes: invalid choice: 'eager'"),
    (["bench", "decode", "--device", "tpu"], "argument --device: device must be cpu, cuda or cuda:N"),
    (["bench", "decode", "--device", "cpu", "--graphs"], "--graphs captures CUDA graphs: it needs a CUDA device"),
    (["bench", "decode", "--json", "{d}/folder"], "--json {d}/folder: is a folder, not a file"),
    _not_its("cipher", "--model", "tiny"),
    _not_its("net", "--checkpoint", "{d}/folder"),
    (["bench", "decode", "--checkpoint", "{d}/nosuch", "--device", "cpu"], "--checkpoint {d}/nosuch: not a folder (a Hugging Face model folder: config.json"),
    (["bench", "decode", "--checkpoint", "{d}/folder", "--device", "cpu"], "--checkpoint {d}/folder: no config.json or no *.safetensors in it"),
    (["bench", "decode", "--checkpoint", "{d}/folder", "--model", "tiny"], "give --model (a preset with random weights) or --checkpoint DIR"),
    (["bench", "decode", "--checkpoint", "", "--device", "cpu"], "--checkpoint : not a folder"),
    (["bench", "decode", "--host-prep-us", "-1"], "argument --host-prep-us: expected a finite number >= 0, got -1"),
    (["bench", "decode", "--host-prep-us", "x"], "argument --host-prep-us: not a number: 'x'"),
    (["bench", "decode", "--host-prep-us", "2e6", "--device", "cpu", "--model", "tiny"],
     "--host-prep-us 2e+06: expected 0 to 1e+06 us of host work per step"),
    _not_its("kv", "--host-prep-us", "100"),
    # bench decode --tp: degrees checked before a rank is spawned or a GPU looked for
    (["run", "--project", "h200", "--project-by", "-2", "--", "true"], "--project-by -2: a ratio is above 0"),
    (["account", "--profile", "b300", "--project-by", "banana", "--", "true"], "--project-by goes with --project GPU"),
    (["run", "--project", "h200", "--project-by", "hbm:1.5", "--", "true"],
     "--project-by hbm:F: F, the GPU time's share at the HBM roofline, is above 0 and at most 1, got '1.5'"),
    (["bench", "decode", "--tp", "0"], "argument --tp: expected at least 1, got 0"),
    (["bench", "decode", "--tp", "two"], "argument --tp: not an integer: 'two'"),
    (["bench", "decode", "--tp", "5", "--device", "cpu", "--model", "tiny"], "--tp 5: at most 4 ranks on --device cpu"),
    (["bench", "decode", "--tp", "4", "--device", "cpu", "--model", "tiny"],
     "--tp 4: tiny has 2 key-value heads, which 4 ranks cannot split evenly"),
    (["bench", "decode", "--tp", "1", "3", "--device", "cpu", "--model", "tiny"], "--tp 3: tiny has 4 attention heads"),
    (["bench", "decode", "--tp", "2", "--device", "cuda:1"], "--device cuda:1: --tp puts rank r on cuda:r"),
    (["bench", "decode", "--tp", "2", "--device", "cpu", "--graphs"], "--graphs captures CUDA graphs: it needs a CUDA device"),
    (["bench", "decode", "--tp", "2", "--checkpoint", "{d}/folder", "--device", "cpu"],
     "--tp splits a preset's layers (--model, random weights); --checkpoint runs on one GPU"),
    (["bench", "decode", "--tp", "2", "--device", "cpu", "--model", "tiny", "--json", "{d}/folder"],
     "--json {d}/folder: is a folder, not a file"),
    _not_its("kv", "--tp", "2"),
    (["bench", "kv", "--churn", "-1"], "argument --churn: expected at least 0, got -1"),
    (["bench", "kv", "--churn", "101", "--device", "cpu", "--model", "tiny"], "--churn 101: one-off requests per request must be 0 to 100"),
    (["bench", "kv", "--requests", "100000000000", "--device", "cpu", "--model", "tiny"],
     "--prefixes and --requests must be 1 to 100000"),
    (["bench", "kv", "--prefixes", "1000000000000", "--device", "cpu", "--model", "tiny"],
     "--prefixes and --requests must be 1 to 100000"),
    (["bench", "kv", "--device-blocks", "100000000000000", "--device", "cpu", "--model", "tiny"],
     "--device-blocks 100000000000000: at most 10000000"),
    (["bench", "decode", "--batch", "100000000000", "--device", "cpu", "--model", "tiny"], "batch sizes must be 1 to 4096"),
    _not_its("decode", "--churn", "2"),
    (["bench", "kv", "--modes", "staged"], "argument --modes: invalid choice: 'staged' (choose from 'sync', 'async')"),
    (["bench", "kv", "--modes", "eager"], "argument --modes: invalid choice: 'eager'"),
    (["bench", "kv", "--model", "gpt5"], "argument --model: invalid choice: 'gpt5'"),
    (["bench", "kv", "--model", "llama-70b"], "argument --model: invalid choice: 'llama-70b'"),  # needs --tp
    _not_its("kv", "--tp", "2"),
    (["bench", "kv", "--thresholds", "0"], "argument --thresholds: expected at least 1, got 0"),
    (["bench", "kv", "--prefixes", "0"], "argument --prefixes: expected at least 1, got 0"),
    (["bench", "kv", "--requests", "x"], "argument --requests: not an integer: 'x'"),
    (["bench", "kv", "--suffix-len", "0"], "argument --suffix-len: expected at least 1, got 0"),
    (["bench", "kv", "--prefix-len", "8", "--device", "cpu"], "--prefix-len 8: shorter than one KV block (16 tokens)"),
    (["bench", "kv", "--prefix-len", "4090", "--model", "tiny", "--device", "cpu"],
     "--prefix-len + --suffix-len = 4122 tokens, tiny holds 4096"),
    (["bench", "kv", "--zipf", "-1"], "argument --zipf: expected a finite number >= 0, got -1"),
    (["bench", "kv", "--zipf", "nan"], "argument --zipf: expected a finite number >= 0, got nan"),
    (["bench", "kv", "--gpu-fraction", "0", "--device", "cpu"], "--gpu-fraction 0.0: expected a fraction in (0, 1]"),
    (["bench", "kv", "--gpu-fraction", "2", "--device", "cpu"], "--gpu-fraction 2.0: expected a fraction in (0, 1]"),
    (["bench", "kv", "--gpu-fraction", "0.5", "--device-blocks", "99", "--device", "cpu"],
     "give --gpu-fraction or --device-blocks, not both"),
    (["bench", "kv", "--device-blocks", "3", "--device", "cpu"], "--device-blocks 3: one request holds 6 blocks"),
    _not_its("kv", "--batch", "2"),
    _not_its("kv", "--checkpoint", "{d}/folder"),
    (["bench", "kv", "--device", "tpu"], "argument --device: device must be cpu, cuda or cuda:N"),
    (["bench", "kv", "--json", "{d}/folder"], "--json {d}/folder: is a folder, not a file"),
    _not_its("decode", "--thresholds", "2"),
    _not_its("net", "--prefix-len", "64"),
    # every benchmark's own options are refused by the others, not accepted and ignored
    _not_its("net", "--models", "resnet50"),
    _not_its("net", "--wrap", "fsdp"),
    _not_its("net", "--warmup", "5"),
    _not_its("decode", "--lanes", "2"),
    _not_its("decode", "--net", "ccbridge"),
    _not_its("kv", "--total", "1M"),
    _not_its("kv", "-b", "1M"),
    _not_its("ddp", "-e", "1M"),
    _not_its("cipher", "--seed", "1"),
    _not_its("cipher", "--ngpus", "2"),
    (["bench"], "ccbridge bench: the following arguments are required: BENCH (see ccbridge bench --help)"),
    (["bench", "gemm"], "ccbridge bench: argument BENCH: invalid choice: 'gemm'"),
    # a value given twice would make two rows of one key
    (["bench", "decode", "--batch", "1", "1"], "ccbridge bench decode: --batch 1 is given twice"),
    (["bench", "decode", "--modes", "sync", "async", "sync"], "--modes sync is given twice"),
    (["bench", "ddp", "--models", "resnet50", "resnet50"], "--models resnet50 is given twice"),
    (["bench", "ddp", "--ngpus", "2", "2"], "--ngpus 2 is given twice"),
    (["bench", "ddp", "--buckets", "25", "25"], "--buckets 25 is given twice"),
    (["bench", "decode", "--tp", "2", "1", "2"], "--tp 2 is given twice"),
    (["bench", "kv", "--thresholds", "2", "1", "2"], "--thresholds 2 is given twice"),
    (["bench", "kv", "--modes", "sync", "sync"], "--modes sync is given twice"),
    (["bench", "net", "--lanes", "4", "4"], "--lanes 4 is given twice"),
    # load
    (["load", "--device", "nosuch", "{d}/ok.safetensors"], "argument --device: device must be cpu, cuda or cuda:N"),
    (["load", "--device", "cuda:-1", "{d}/ok.safetensors"], "argument --device: device must be cpu, cuda or cuda:N"),
    (["load", "--device", "cpu", "{d}/ok.safetensors", "{d}/ok.safetensors"], "{d}/ok.safetensors is given twice"),
    (["load", "--device", "cpu", "{d}/missing"], "{d}/missing: no such file or directory"),
    (["load", "--device", "cpu", "{d}/folder"], "{d}/folder: empty checkpoint"),
    (["load", "--chunk", "foo", "{d}/ok.safetensors"], "argument --chunk: not a size: 'foo'"),
    (["load", "--workers", "0", "{d}/ok.safetensors"], "argument --workers: expected 1..64, got 0"),
    (["load", "--workers", "100", "{d}/ok.safetensors"], "argument --workers: expected 1..64, got 100"),
    (["load", "--buffers", "9", "{d}/ok.safetensors"], "argument --buffers: expected 1..8, got 9"),
    (["load", "--json", "{d}/r.json", "{d}/ok.safetensors"], "--json and --ceiling go with --bench"),
    (["load", "--bound", "{d}/ok.safetensors"], "--bound goes with --bench"),
    (["load", "--bench", "--bound", "--device", "cpu", "{d}/ok.safetensors"],
     "--bound times copies to a GPU: a load into host memory has none; give a CUDA --device"),
    (["load", "--bench", "--json", "/proc/forbidden/r.json", "{d}/ok.safetensors"], "--json /proc/forbidden/r.json: "),
    (["load", "--bench", "--ceiling", "{d}/median_text.json", "{d}/ok.safetensors"], "rows[0].median: 'fast' is not"),
    (["load", "--device", "cpu", "{d}/deep.safetensors"], "deep.safetensors: not JSON: nested deeper than the JSON parser",
     {"skip": _no_torch}),
    (["load", "--device", "cpu", "{d}/surrogate.safetensors"], "not UTF-8: 'a\\ud800' holds an unpaired surrogate escape",
     {"skip": _no_torch}),
    (["load", "--device", "cpu", "{d}/rank.safetensors"], "shape: tensor 'a': 1000000 dimensions; at most 64 are accepted",
     {"skip": _no_torch}),
    (["load", "--device", "cpu", "--contexts", "3", "--workers", "2", "{d}/ok.safetensors"],
     "contexts and staging choose how a load crosses to a GPU: a load into host memory has neither",
     {"skip": _no_torch}),
    # make-checkpoint: sizes, folder and free space checked before the first byte
    (["make-checkpoint", "{d}/mc", "--size", "-1"], "argument --size: not a size: '-1'", {"absent": ["{d}/mc"]}),
    (["make-checkpoint", "{d}/mc", "--size", "nan"], "argument --size: not a size: 'nan'"),
    (["make-checkpoint", "{d}/mc", "--size", "0"], "argument --size: size '0' is under one byte"),
    (["make-checkpoint", "{d}/mc", "--size", "1" + "0" * 400], "is too large (the limit is 2^63 bytes)"),
    (["make-checkpoint", "{d}/mc", "--shard-size", "4GiBs"], "argument --shard-size: not a size: '4GiBs'"),
    (["make-checkpoint", "{d}/mc", "--size", "1TB"], "not enough free space in {d}/mc: needs 931.32 GiB",
     {"skip": _terabyte_fits, "absent": ["{d}/mc"]}),
    (["make-checkpoint", "{d}/mc", "--size", "1000TB"], "not enough free space in {d}/mc", {"absent": ["{d}/mc"]}),
    (["make-checkpoint", "/proc/forbidden/mc", "--size", "1M"], "output folder /proc/forbidden/mc: cannot write in /proc"),
    (["make-checkpoint", "{d}/afile", "--size", "1M"], "output folder {d}/afile: {d}/afile is not a folder"),
    # the folder is made, not its parents (it made /nonexistent): as every output file's folder must exist
    (["make-checkpoint", "/nonexistent/mc", "--size", "1M"], "output folder /nonexistent/mc: the folder /nonexistent "
     "does not exist", {"absent": ["/nonexistent"]}),
    (["make-checkpoint", "{d}/nosuch/mc", "--size", "1M"], "output folder {d}/nosuch/mc: the folder {d}/nosuch does "
     "not exist", {"absent": ["{d}/nosuch"]}),
    (["make-checkpoint", "{d}/mc", "--seed", "-1"], "argument --seed: expected at least 0, got -1"),
    (["make-checkpoint", "{d}/used", "--size", "1M"],
     "output folder {d}/used: already holds model.safetensors.index.json: give a new folder"),
    # run --coverage (emulator coverage report)
    (["run", "--profile", "b300", "--coverage", "/nonexistent/dir/c.json", "--", "true"],
     "--coverage /nonexistent/dir/c.json: the folder /nonexistent/dir does not exist", {"absent": ["/nonexistent"]}),
    (["run", "--profile", "b300", "--coverage", "{d}/folder", "--", "true"], "--coverage {d}/folder: is a folder, not a file"),
    # run --record (record-only without --profile)
    (["run", "--record", "/nonexistent/dir/t", "--", "true"],
     "trace prefix /nonexistent/dir/t: the folder /nonexistent/dir does not exist", {"absent": ["/nonexistent"]}),
    (["run", "--record", "{d}/t", "--set", "lanes=2", "--", "true"], "--set changes an emulator profile: it needs --profile"),
    # where no CUDA driver loads there is nothing to record: refused before the program starts (it claimed success)
    (["run", "--record", "{d}/t", "--", "true"], "(no NVIDIA driver here?): nothing to record", {"skip": _driver}),
    (["run", "--coverage", "{d}/c.json", "--", "true"], "(no NVIDIA driver here?): nothing to record",
     {"skip": _driver, "absent": ["{d}/c.json"]}),
    (["run", "--profile", "b300", "--record", "{d}/t", "--", "true"], "nothing to record", {"skip": _driver}),
    (["probe", "--record", "{d}/t", "--tests", "hostcrypto", "--out", "{d}/p"], "nothing to record",
     {"skip": _driver, "absent": ["{d}/p"]}),
    (["run", "--trace", "{d}/t", "--profile", "b300", "--", "true"], "unrecognized arguments"),
    # account
    (["account"], "give two trace prefixes"),
    (["account", "{d}/nosuch", "{d}/nosuch2"], "no trace has the prefix nosuch; the traces in its folder: emu, nat, told,"),
    (["account", "{d}/sites_only", "{d}/sites_only"], "the trace at {d}/sites_only holds no CUDA driver call (its "
                                                    "program made none)"),
    (["account", "{d}/nosuch"], "give two trace prefixes"),
    (["account", "--set", "lanes=2", "{d}/a", "{d}/b"], "--set changes an emulator profile: it needs --profile"),
    (["account", "--profile", "nosuch", "--", "true"], "unknown profile 'nosuch'"),
    (["account", "--profile", "b300"], "no command given"),
    (["account", "--profile", "b300", "--set", "lanes=0", "--", "true"], "parameter lanes = 0.0"),
    (["account", "--profile", "b300", "--", "nosuch-command-4c1e"], "command not found: nosuch-command-4c1e"),
    (["account", "--profile", "b300", "--out", "{d}/acc_old", "--", "true"],
     "trace prefix {d}/acc_old/emulated: 1 file(s) of an earlier run (emulated.7.csv): give another prefix"),
    (["account", "{d}/a", "{d}/b", "--out", "/proc/forbidden"], "--out /proc/forbidden: cannot write in /proc"),
    (["account", "--profile", "b300", "--repeat", "0", "--", "true"], "argument --repeat: expected at least 1, got 0"),
    (["account", "--profile", "b300", "--repeat", "two", "--", "true"], "argument --repeat: not an integer: 'two'"),
    (["account", "--repeat", "2", "{d}/a", "{d}/b"], "--repeat goes with --profile NAME -- CMD (trace pairs: give BASE1 OTHER1"),
    (["account", "--warmup", "{d}/a", "{d}/b"],
     "--warmup goes with --profile NAME -- CMD (it runs CMD once, untraced, before the traced runs)"),
    (["account", "{d}/a", "{d}/b", "{d}/c"], "give two trace prefixes"),
    (["account", "{d}/emu", "{d}/nat"], "BASE {d}/emu ran emulated, OTHER {d}/nat did not: give the native "
                                        "(CC-off or record-only) trace first"),
    # advise: every file read and checked before any advice is printed
    # call sites: beside a trace only
    (["run", "--profile", "b300", "--sites", "--", "true"], "--sites notes call sites beside a trace: give --record T too"),
    (["run", "--sites", "--", "true"], "--sites notes call sites beside a trace: give --record T too"),
    (["run", "--record", "{d}/tr", "--", "true"],
     "trace prefix {d}/tr: 1 file(s) of an earlier run (tr.1.csv): give another prefix"),
    (["account", "{d}/a", "{d}/b", "--no-sites"], "--no-sites goes with --profile NAME -- CMD"),
    (["advise"], "the following arguments are required: FILE"),
    (["advise", "{d}/missing.json"], "{d}/missing.json: no such file"),
    (["advise", "{d}/good.json", "{d}/good.json"], "{d}/good.json is given twice"),
    (["advise", "{d}/good.json", "--json", "{d}/good.json"], "--json {d}/good.json is one of the inputs"),
    (["advise", "{d}/good.json", "{d}/p_broken.json"], "{d}/p_broken.json: not a JSON document"),
    (["advise", "{d}/p_unknown.json"], "{d}/p_unknown.json: not a ccbridge result or env stamp"),
    (["advise", "{d}/median_text.json"], "rows[0].median: 'fast' is not of type 'number'"),
    (["advise", "{d}/folder"], "{d}/folder: is a folder"),
    (["advise", "{d}/decode_empty.json"], "decode_empty.json: no tok_per_s rows (an interrupted `ccbridge bench decode`?)"),
    (["advise", "{d}/good.json", "{d}/kv_no_ttft.json"], "kv_no_ttft.json: no ttft_ms rows (an interrupted `ccbridge bench kv`?)"),
    (["advise", "{d}/good.json", "--json", "/proc/forbidden/a.json"], "--json /proc/forbidden/a.json: "),
    (["advise", "{d}/good.json", "--json", "{d}/folder"], "--json {d}/folder: is a folder, not a file"),
    (["advise", "--why"], "the following arguments are required: FILE"),
    (["advise", "--why", "{d}/good.json", "{d}/p_broken.json"], "{d}/p_broken.json: not a JSON document"),
    (["advise", "{d}/decode_tp0.json"], "rows[0].params.tp: 0 is less than the minimum of 1"),
    (["account", "--why", "{d}/a"], "give two trace prefixes"),
    (["account", "--why", "{d}/nosuch", "{d}/nosuch2"], "no trace has the prefix nosuch; the traces in its folder"),
    # attest: the nonce, the bundle's file and the verifier checked before any evidence is collected
    (["attest"], "the following arguments are required: --nonce"),
    (["attest", "--nonce", "zz"], "argument --nonce: not hex: 'zz'"),
    (["attest", "--nonce", "a" * 65], "argument --nonce: an odd number of hex digits (65): a nonce is whole bytes, 64 hex digits"),
    (["attest", "--nonce", "00"], "argument --nonce: expected 32 bytes (64 hex digits), got 1"),
    (["attest", "--nonce", "0" * 64], "argument --nonce: a nonce of one repeated byte (00...) is no fresh challenge"),
    (["attest", "--nonce", bytes(range(32)).hex(), "--out", "/proc/forbidden/b.json"], "--out /proc/forbidden/b.json: "),
    (["attest", "--nonce", bytes(range(32)).hex(), "--out", "{d}/folder"], "--out {d}/folder: is a folder, not a file"),
    (["attest", "--nonce", bytes(range(32)).hex(), "--out", "{d}/nosuch/b.json"], "the folder {d}/nosuch does not exist"),
    (["attest", "--nonce", bytes(range(32)).hex(), "--verify", "nowhere"], "argument --verify: invalid choice: 'nowhere'"),
    (["attest", "--nonce", bytes(range(32)).hex(), "--verifier-url", "https://v.example"], "--verifier-url names the remote verifier: "
     "it goes with --verify remote"),
    (["attest", "--nonce", bytes(range(32)).hex(), "--verify", "local", "--verifier-url", "https://v.example"], "goes with --verify remote"),
    (["attest", "--nonce", bytes(range(32)).hex(), "--verify", "remote"], "pip install 'ccbridge[attest]'", {"skip": _attest_sdk}),
    (["attest", "--nonce", bytes(range(32)).hex(), "--allow-unprotected", "yes"], "unrecognized arguments: yes"),
    # plan-tenants: sizes, node, mode and busy GPUs checked, the stamp read whole, before a plan is printed
    (["plan-tenants"], "the following arguments are required: --request"),
    (["plan-tenants", "--request", "3"], "tenant size 3: a fabric partition holds 1, 2, 4 or 8 GPUs"),
    (["plan-tenants", "--request", "0"], "argument --request: expected at least 1, got 0"),
    (["plan-tenants", "--request", "two"], "argument --request: not an integer: 'two'"),
    (["plan-tenants", "--request", *["1"] * 65], "65 tenants requested: at most 64"),
    (["plan-tenants", "--request", "1", "--gpus", "3"], "3 GPUs: a node is partitioned in aligned halves"),
    (["plan-tenants", "--request", "1", "--gpus", "0"], "argument --gpus: expected at least 1, got 0"),
    (["plan-tenants", "--request", "1", "--mode", "nvlink"], "argument --mode: invalid choice: 'nvlink'"),
    (["plan-tenants", "--request", "1", "--busy", "x"], "argument --busy: expected GPU indices such as 0,1, got 'x'"),
    (["plan-tenants", "--request", "1", "--busy", "8"], "busy GPU 8: the node's GPUs are 0..7"),
    (["plan-tenants", "--request", "1", "--busy", "1,1"], "busy GPUs 1,1: a GPU is given twice"),
    (["plan-tenants", "--request", "1", "--from-stamp", "{d}/missing.json"], "{d}/missing.json: no such file"),
    (["plan-tenants", "--request", "1", "--from-stamp", "{d}/folder"], "{d}/folder: is a folder"),
    (["plan-tenants", "--request", "1", "--from-stamp", "{d}/p_unknown.json"], "not a ccbridge result or env stamp"),
    (["plan-tenants", "--request", "1", "--from-stamp", "{d}/median_text.json"], "rows[0].median: 'fast' is not"),
    (["plan-tenants", "--request", "1", "--from-stamp", "{d}/good.json"], "the stamp has no multi-GPU CC mode"),
    (["plan-tenants", "--request", "1", "--from-stamp", "{d}/stamp_nofabric.json"], "no fabric state (nvml.fabric.cliques): give --gpus, --mode and --busy"),
    (["plan-tenants", "--request", "1", "--from-stamp", "{d}/stamp_mgpu_none.json"], "multi-GPU CC mode is none"),
    (["plan-tenants", "--request", "1", "--from-stamp", "{d}/stamp_clique_bad.json"],
     "nvml.fabric.cliques[0].gpus must list GPU indices 0..0"),
    (["plan-tenants", "--request", "1", "--from-stamp", "{d}/good.json", "--busy", "0"],
     "--busy and --from-stamp: the stamp gives the GPUs, mode and busy GPUs"),
    (["plan-tenants", "--request", "1", "--json", "{d}/folder"], "--json {d}/folder: is a folder, not a file"),
    (["plan-tenants", "--request", "1", "--json", "/proc/forbidden/p.json"], "--json /proc/forbidden/p.json: "),
    # a result file that exists is refused before any measurement (and kept: the tree is compared), as an --out
    # folder holding a result is; it was overwritten
    (["bench", "net", "--json", "{d}/good.json"], f"--json {EXISTS}"),
    (["bench", "cipher", "--json", "{d}/good.json"], f"--json {EXISTS}"),
    (["bench", "ddp", "--json", "{d}/good.json"], f"--json {EXISTS}"),
    (["bench", "decode", "--device", "cpu", "--json", "{d}/good.json"], f"--json {EXISTS}"),
    (["bench", "kv", "--device", "cpu", "--json", "{d}/good.json"], f"--json {EXISTS}"),
    (["collectives", "--backend", "gloo", "--json", "{d}/good.json"], f"--json {EXISTS}"),
    (["load", "--bench", "--device", "cpu", "--json", "{d}/good.json", "{d}/ok.safetensors"], f"--json {EXISTS}"),
    (["advise", "{d}/emu_h200.json", "--json", "{d}/good.json"], f"--json {EXISTS}"),
    (["plan-tenants", "--request", "1", "--json", "{d}/good.json"], f"--json {EXISTS}"),
    # this process's own descriptor is judged by how it was opened, before the work (not by the file it leads to)
    (["advise", "{d}/good.json", "--json", "/dev/fd/9"], "--json /dev/fd/9: not open"),  # none is passed on
    (["plan-tenants", "--request", "1", "--json", "/proc/self/fd/9"], "--json /proc/self/fd/9: not open"),
    (["advise", "{d}/good.json", "--json", "/dev/fd/0"], "--json /dev/fd/0: not open for writing",
     {"stdin": "{d}/p_text.json"}),
    (["attest", "--nonce", bytes(range(32)).hex(), "--out", "{d}/good.json"], f"--out {EXISTS}"),
    (["run", "--profile", "b300", "--coverage", "{d}/good.json", "--", "true"], f"--coverage {EXISTS}"),
]


README = Path(__file__).resolve().parent.parent / "README.md"


def readme_commands() -> set[str]:
    """The commands of the README's table (its first column: `ccbridge probe ...`), `bench X` as two words."""
    names = set()
    for line in README.read_text().splitlines():
        if line.startswith("| `ccbridge "):
            for words in re.findall(r"`ccbridge ([\w-]+)(?: ([\w-]+))?", line.split(" | ")[0]):
                names.add(" ".join(words) if words[0] == "bench" else words[0])
    return names


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size if p.is_file() else -1 for p in root.rglob("*")}


def run_cli(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
            stdin: str | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, in a terminal wider than any line may be (its lines must fit 120 columns); stdin:
    a file its standard input is opened on (read-only)."""
    with open(stdin, "rb") if stdin else contextlib.nullcontext() as given:
        return subprocess.run([sys.executable, "-m", "ccbridge.cli", *argv], cwd=cwd, capture_output=True, text=True,
                              timeout=TIMEOUT_S, env={**os.environ, "COLUMNS": "250", **(env or {})}, stdin=given)


def _benches() -> set[str]:
    """The names `ccbridge bench` takes, from its parser."""
    def subs(parser):
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices

    return set(subs(subs(cli.build_parser())["bench"]))


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_is_one_clear_line(d, case):
    argv, fragment, extra = case[0], case[1], (case[2] if len(case) > 2 else {})
    if extra.get("skip", lambda: False)():
        pytest.skip(f"precondition {extra['skip'].__name__} holds here")
    argv = [a.replace("{d}", str(d)) for a in argv]
    fragment = fragment.replace("{d}", str(d))
    before = _tree(d)
    r = run_cli(argv, d, extra.get("env"), extra.get("stdin", "").replace("{d}", str(d)) or None)
    lines = r.stderr.splitlines()
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    assert r.returncode == 2, r.stderr
    # a bench's errors, argparse's and its own checks' alike, name the bench (`ccbridge bench kv: ...`)
    head = f"ccbridge bench {argv[1]}: " if argv[:1] == ["bench"] and argv[1:2] and argv[1] in _benches() else \
        "ccbridge: " if argv[0].startswith("-") else f"ccbridge {argv[0]}: "  # no command: ccbridge's own
    assert len(lines) == 1 and lines[0].startswith(head), r.stderr
    assert fragment in lines[0]
    if "wide" not in extra:  # 120 columns where the fixture folder's name is short
        assert len(lines[0].replace(str(d), "{d}")) <= 120, lines[0]
    assert r.stdout == ""
    assert _tree(d) == before  # nothing made, nothing removed: no output folder, .partial or check folder
    for path in extra.get("absent", []):
        assert not Path(path.replace("{d}", str(d))).exists()


def test_a_failed_account_profile_leaves_no_result_folder(tmp_path):
    """Both runs made (their banners), then nothing to attribute: the folders it made are taken away again. Where
    no CUDA driver loads, refused before the first run (test_account.py makes the runs there too)."""
    from ccbridge.bindings import core

    r = run_cli(["account", "--profile", "b300", "--", "true"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    why = core.driver_missing()
    assert r.stderr.splitlines()[-1] == (f"ccbridge account: {why}: nothing to emulate" if why else
                                         "ccbridge account: true made no CUDA driver call: nothing to attribute")
    assert ("run 1 of 2" in r.stderr) == (why is None)
    assert list(tmp_path.iterdir()) == []  # no ccbridge-results/account-<timestamp>, nor ccbridge-results
    r = run_cli(["account", "--profile", "b300", "--out", "a/b", "--", "true"], tmp_path)
    assert r.returncode == 2 and list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()  # a folder the user made stays
    r = run_cli(["account", "--profile", "b300", "--out", "kept", "--", "true"], tmp_path)
    assert r.returncode == 2 and [p.name for p in tmp_path.iterdir()] == ["kept"]


def test_every_readme_command_has_a_bad_input_case():
    covered = {" ".join(c[0][:2]) if c[0][0] == "bench" else c[0][0] for c in CASES}
    assert readme_commands() - covered == set()
    assert {"probe", "env", "make-checkpoint", "bench kv", "plan-tenants"} <= readme_commands()  # the parse works


@pytest.mark.parametrize("value,fragment", [
    ("bogus", "CCBRIDGE_RANK_CPUS='bogus': expected a CPU list per rank"),
    ("0;0", "CCBRIDGE_RANK_CPUS: ranks 0 and 1 share CPUs 0:"), ("0", "CCBRIDGE_RANK_CPUS: 1 CPU list for 2 ranks")])
def test_a_bad_rank_cpu_list_is_one_line_before_any_rank_starts(tmp_path, value, fragment):
    """CCBRIDGE_RANK_CPUS is input too: a bench whose ranks it would pin refuses a bad one in one line, exit 2."""
    r = subprocess.run([sys.executable, "-m", "ccbridge.cli", "bench", "decode", "--tp", "2", "--device", "cpu",
                        "--model", "tiny", "--batch", "1", "--output", "4", "--iters", "1"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=TIMEOUT_S,
                       env={**os.environ, "CCBRIDGE_RANK_CPUS": value})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines[-1]) <= 120, r.stderr
    assert lines[-1].startswith("ccbridge bench") and fragment in lines[-1], r.stderr
    # collectives: before its header, nothing on stdout
    r = subprocess.run([sys.executable, "-m", "ccbridge.cli", "collectives", "--backend", "gloo", "-e", "8"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S,
                       env={**os.environ, "CCBRIDGE_RANK_CPUS": value})
    assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith("ccbridge collectives: " + fragment[:19])
    assert fragment in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr


def test_run_is_named_run_and_passes_the_status(tmp_path):
    """`run` errors used to be prefixed with the program's argv (one dest for two things)."""
    r = run_cli(["run", "--profile", "passthrough", "--", sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path)
    assert r.returncode == 3 and "Traceback" not in r.stderr


def test_interrupted_make_checkpoint_leaves_nothing(tmp_path):
    """Ctrl-C mid-write (SIGINT to the whole process group): one line, exit 130, no shard, no .partial, no folder."""
    out = tmp_path / "ckpt"
    p = subprocess.Popen([sys.executable, "-m", "ccbridge.cli", "make-checkpoint", str(out), "--size", "2GiB",
                          "--shard-size", "256MiB"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + TIMEOUT_S
    while not list(tmp_path.rglob("*.partial")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert p.poll() is None, "the write ended before it could be interrupted"
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=TIMEOUT_S)
    assert p.returncode == 130 and err.strip() == "ccbridge make-checkpoint: interrupted", err
    assert not out.exists()


def test_a_failed_shard_write_removes_its_partial(tmp_path, monkeypatch):
    from ccbridge.load import synth

    def disk_full(tmp, tensors, seed):
        Path(tmp).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(synth, "_stream", disk_full)
    with pytest.raises(OSError, match="No space left"):
        synth._write_shard(str(tmp_path / "s.safetensors"), [], 0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_while_writing_is_one_line(tmp_path):
    """The output folder passed its check, then the disk filled (report.md is /dev/full)."""
    shutil.copy(DATA / "h100-native-full.json", tmp_path / "r.json")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").symlink_to("/dev/full")
    r = run_cli(["report", str(tmp_path / "r.json"), "--out", str(out)], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccbridge report: No space left on device"), r.stderr


def test_python_dash_m_ccbridge_cli_runs_main():
    r = subprocess.run([sys.executable, "-m", "ccbridge.cli", "--version"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0 and r.stdout.startswith("ccbridge ")


def test_a_bad_gemv_pdl_switch_is_one_line_before_any_rank_starts(tmp_path):
    """CCBRIDGE_GEMV_PDL is input too: the TP bench refuses a value other than 0, 1 or empty in one line, exit 2."""
    r = subprocess.run([sys.executable, "-m", "ccbridge.cli", "bench", "decode", "--tp", "1", "--device", "cpu",
                        "--model", "tiny", "--batch", "1", "--output", "4", "--iters", "1"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=TIMEOUT_S, env={**os.environ, "CCBRIDGE_GEMV_PDL": "yes"})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1 and len(lines[0]) <= 120, r.stderr
    assert lines[0].startswith("ccbridge bench decode: CCBRIDGE_GEMV_PDL='yes': 0 (off), 1 (on)"), r.stderr
