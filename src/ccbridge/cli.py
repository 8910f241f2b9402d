"""The ccbridge command line: thin wrappers that parse, call and print."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from ccbridge import __version__, ui
from ccbridge.choices import DDP_MODELS, DECODE_MODES, DECODE_PRESETS, SECURE_DTYPES
from ccbridge.errors import UsageError


class _Parser(argparse.ArgumentParser):
    """argparse whose errors read like every other: one line `ccbridge CMD: reason`, exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _checked(parse):
    """An argparse type from a parser that raises UsageError, so that argparse names the option."""
    def conv(text):
        try:
            return parse(text)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    conv.__name__ = parse.__name__
    return conv


def _size(text: str) -> int:
    from ccbridge.load.synth import parse_size

    return parse_size(text)


def _device_spec(text: str) -> str:
    from ccbridge.load.loader import check_device

    return check_device(text)


def _int(lo: int, hi: int | None = None):
    """An argparse type: an integer in lo..hi (no upper bound when hi is None)."""
    def integer(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise UsageError(f"not an integer: {text!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise UsageError(f"expected {lo}..{hi}, got {v}" if hi is not None else f"expected at least {lo}, got {v}")
        return v

    return _checked(integer)


def _float_ge0(text: str) -> float:
    """A finite number >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise UsageError(f"not a number: {text!r}") from None
    if not (v >= 0 and v < float("inf")):
        raise UsageError(f"expected a finite number >= 0, got {text}")
    return v


def _what_if(args, default: str | None = None):
    """The profile args names, with its --set what-ifs applied; `default` when none is named
    (None: no profile). --set without a profile is refused here, for every command."""
    from ccbridge.emulate import profiles

    if args.overrides and not args.profile:
        raise UsageError("--set changes an emulator profile: it needs --profile")
    name = args.profile or default
    return profiles.override(profiles.load(name), args.overrides) if name else None


def _add_set(p: argparse.ArgumentParser) -> None:
    """--set KEY=VALUE, repeatable: a what-if on the emulator profile (profiles.override checks it)."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="set a profile parameter for this run, e.g. launch_toll_us=0 (repeatable; "
                        "see `ccbridge profiles NAME`)")


def _write_reports(res, out: Path) -> list[Path]:
    from ccbridge.report import html, markdown

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "result.json", out / "report.md", out / "report.html"]
    res.save(paths[0])
    paths[1].write_text(markdown.render(res))
    paths[2].write_text(html.render(res))
    return paths


def cmd_env(args) -> int:
    from ccbridge import env

    stamp = env.stamp()
    if args.json:
        print(json.dumps(stamp, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    from ccbridge.report.tables import machine_table

    t = machine_table(stamp)
    table = Table(title="ccbridge env", show_header=False)
    for row in t.rows:
        table.add_row(*row)
    Console().print(table)
    return 0


def _nonce(text: str) -> bytes:
    from ccbridge.attest import parse_nonce

    return parse_nonce(text)


def cmd_attest(args) -> int:
    from ccbridge import attest

    if args.verifier_url and args.verify != "remote":
        raise UsageError("--verifier-url names the remote verifier: it goes with --verify remote")
    out = ui.writable_file(args.out, "--out") if args.out else None
    sdk = attest.load_sdk(required=bool(args.verify))
    b = attest.bundle(args.nonce, sdk=sdk)
    if args.verify:
        b["verification"] = attest.verify(sdk, args.nonce, b["gpu_evidence"], args.verify, args.verifier_url)
    b["protection"]["unprotected_allowed"] = bool(args.allow_unprotected)
    text = json.dumps(b, indent=1)
    if out:
        out.write_text(text + "\n")
        print("\n".join(attest.summary(b)) + f"\nbundle: {out}")
    else:
        print(text)
    failed = []
    if not b["protection"]["protected"] and not args.allow_unprotected:
        pr = b["protection"]
        failed.append(f"not protected (CPU TEE {pr['tee']}, GPU CC {pr['gpu_cc']}): the bundle's protection.why "
                      "says why (--allow-unprotected accepts it)")
    if args.verify and not b["verification"]["result"]:
        failed.append(f"{b['verification']['verifier']} did not pass the GPU evidence")
    if failed:
        print(f"ccbridge attest: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def cmd_probe(args) -> int:
    from rich.console import Console

    from ccbridge import env
    from ccbridge.findings import shown
    from ccbridge.probe import registry

    if args.list:
        for t in registry.select(None):
            needs = f" (needs {', '.join(t.needs)})" if t.needs else ""
            print(f"{t.name:<24} {t.title}{needs}")
        return 0
    # Everything a run needs is checked before it starts: a run can take many minutes.
    # --record alone: the probe runs natively, recorded (the passthrough interposer adds no cost)
    prof = _what_if(args, "passthrough" if args.record else None)
    tests = registry.select(args.tests)
    registry.check_device(args.device)
    out = ui.writable_folder(args.out or Path("ccbridge-results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S"), "--out",
                             fresh=("result.json",))
    if prof:
        return _probe_under(args, prof, out)
    console = Console(stderr=True)
    console.print(f"ccbridge probe: {len(tests)} tests, {'quick' if args.quick else 'full'} suite, device {args.device}")
    stamp = env.stamp()
    if stamp["emulation"]["active"]:
        console.print(f"[bold yellow]EMULATED run (profile {env.emulation_label(stamp['emulation'])}): "
                      "figures are not CC hardware measurements[/]")
    from ccbridge.ui import ProbeProgress

    settings = registry.Settings(device=args.device, quick=args.quick, tests=args.tests)
    with ProbeProgress(len(tests), console) as progress:
        res = registry.run(settings, stamp, progress)
    paths = _write_reports(res, out)
    console.print()
    for f in shown(res):
        console.print(f"- {f.text}", highlight=False)
    if res.no_gpu:
        console.print(f"[yellow]The GPU families need a GPU ({res.no_gpu}); ran what needs none.[/]")
    elif res.skipped:
        console.print("[yellow]Skipped: " + "; ".join(f"{s['test']} ({s['reason']})" for s in res.skipped) + "[/]")
    console.print(f"\n{len(res.rows)} rows in {res.duration_s:.0f} s; wrote " + ", ".join(str(p) for p in paths))
    if res.errors:
        console.print(f"[red]{len(res.errors)} test(s) failed:[/] " + "; ".join(f"{e['test']}: {e['error']}" for e in res.errors))
        return 1
    return 0


def _probe_under(args, prof, out: Path) -> int:
    """The probe again, in a child process started under the emulator."""
    from ccbridge.emulate import launcher

    rest = ["probe", "--device", str(args.device), "--out", str(out)]
    rest += ["--quick"] if args.quick else []
    rest += ["--tests", args.tests] if args.tests else []
    cmd = launcher.python_cmd(*rest)
    launcher.check(prof, cmd, args.record)
    print(launcher.banner(prof), file=sys.stderr)
    return launcher.run(prof, cmd, trace=args.record)


def cmd_run(args) -> int:
    from ccbridge.emulate import launcher, trace

    cmd = args.program[1:] if args.program[:1] == ["--"] else args.program
    if args.sites and not args.record:
        raise UsageError("--sites notes call sites beside a trace: give --record T too")
    if not args.profile and not args.record and not args.coverage:
        raise UsageError("give --profile NAME (emulate), --record T (record only) or --coverage FILE")
    prof = _what_if(args, "passthrough")  # without a profile: the interposer records, adds no cost
    launcher.check(prof, cmd, args.record, args.coverage)
    print(launcher.banner(prof), file=sys.stderr)
    rc = launcher.run(prof, cmd, trace=args.record, coverage=args.coverage, sites=args.sites)
    if args.record:
        print(trace.render(trace.summarize(str(Path(args.record).resolve()))), file=sys.stderr)
    if args.coverage:
        from ccbridge.emulate import coverage

        print(coverage.render(json.loads(Path(args.coverage).read_text())), file=sys.stderr)
    return rc


def _ended(rc: int) -> str:
    """How a child process ended, for a message: its status, or the signal that killed it."""
    if rc >= 0:
        return f"exited with status {rc}"
    try:
        return f"was killed by {signal.Signals(-rc).name}"
    except ValueError:
        return f"was killed by signal {-rc}"


def cmd_account(args) -> int:
    """Attribute the wall-time difference of two traces (or of CMD natively vs emulated) to the calls that grew."""
    from ccbridge import account, env
    from ccbridge.emulate import launcher, profiles, trace
    from ccbridge.results import Result

    rest = args.args[1:] if args.args[:1] == ["--"] else args.args
    out = ui.writable_folder(args.out or Path("ccbridge-results") / f"account-{dt.datetime.now():%Y%m%d-%H%M%S}", "--out",
                             fresh=("result.json",))
    runs_at: list[tuple[int, int] | None] = [None, None]  # each run's launch and end (ns)
    prof = _what_if(args)
    if prof:
        runs = [(profiles.load("passthrough"), str(out / "native")), (prof, str(out / "emulated"))]
        for p, prefix in runs:  # both, before the first starts (an old trace at either refuses the run)
            launcher.check(p, rest)
            launcher.refuse_old_trace(prefix)
        out.mkdir(parents=True, exist_ok=True)  # the traces go there
        for i, (p, prefix) in enumerate(runs):
            print(f"ccbridge account: run {i + 1} of 2, {launcher.banner(p)}", file=sys.stderr)
            rc, runs_at[i] = launcher.run_timed(p, rest, trace=prefix, sites=not args.no_sites)
            if rc:
                raise UsageError(f"{' '.join(rest)} {_ended(rc)} in run {i + 1}; nothing to compare")
        prefixes = [prefix for _, prefix in runs]
    else:
        if args.no_sites:
            raise UsageError("--no-sites goes with --profile NAME -- CMD (traces keep the sites they were recorded with)")
        if len(rest) != 2:
            raise UsageError("give two trace prefixes (BASE OTHER, from `ccbridge run --record`), "
                             "or --profile NAME -- CMD")
        prefixes = [str(Path(x).resolve()) for x in rest]
    base, other = (trace.summarize(x) for x in prefixes)
    for x, s in zip(prefixes, (base, other)):
        if not s.by_api:
            raise UsageError(f"{' '.join(rest)} made no CUDA driver call: nothing to attribute" if args.profile else
                             f"no trace lines under {x}.<pid>.csv: record with `ccbridge run --record {x} -- CMD`")
    walls = [(r[1] - r[0]) / 1e9 if r else None for r in runs_at]
    where = account.phases(base, other, *runs_at)
    of = account.share_base(account.wall_slowdown(base, other, *walls), where)
    lines, wall = account.attribute(base, other, *walls, share_of_s=of)
    at_sites = account.attribute_sites(base, other, of)
    # two traces given: what their own headers say they ran under is what the rows are made of; either emulated
    # makes every figure an emulated one (a BASE emulated and OTHER not is also noted below)
    emulated_as = args.profile or (", ".join(sorted((base.profiles | other.profiles) - {"passthrough"}))
                                   if base.emulated or other.emulated else None)
    res = Result(env=env.stamp(), settings={"base": prefixes[0], "other": prefixes[1], "profile": emulated_as,
                                             "overrides": args.overrides, "command": rest if args.profile else None},
                 rows=account.rows(lines, wall, at_sites, where, spans=not args.profile))
    paths = _write_reports(res, out)
    print(account.render(lines, wall, where=where, emulated=emulated_as))
    if base.emulated and not other.emulated:
        print("note: BASE ran under the emulator and OTHER did not: give the CC-off (or record-only) trace first",
              file=sys.stderr)
    if of <= 0:
        print(f"note: OTHER was not slower than BASE ({of * 1e3:+.1f} ms{' between the first and the last driver call' if where else ''}): "
              "nothing to recover", file=sys.stderr)
    if at_sites:
        print(account.render_sites(at_sites))
    elif base.by_site or other.by_site:
        print(f"no per-site table: only {'the base' if base.by_site else 'the other'} trace noted call sites "
              "(record both with --sites)")
    if args.why:
        print(account.render_why(lines, at_sites))
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def cmd_advise(args) -> int:
    """The CC-mode-aware settings for vLLM, SGLang, TRT-LLM, torch and the loader, from stamps and results."""
    import os

    from ccbridge import advise

    seen: dict = {}
    for f in args.files:  # the same file twice would print every line twice
        key = os.path.realpath(f)
        if key in seen:
            raise UsageError(f"{f} is given twice (as {seen[key]})")
        seen[key] = f
    if args.json:
        if os.path.realpath(args.json) in seen:
            raise UsageError(f"--json {args.json} is one of the inputs: it would be overwritten")
        ui.writable_file(args.json, "--json")
    inputs, recs = advise.advise(args.files)
    print(advise.render_why(inputs, recs) if args.why else advise.render(inputs, recs))
    if args.json:
        Path(args.json).write_text(json.dumps(advise.to_json(inputs, recs), indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _gpu_list(text: str) -> list[int]:
    """GPU indices, comma-separated: 0,1."""
    try:
        return [int(g) for g in text.split(",")]
    except ValueError:
        raise UsageError(f"expected GPU indices such as 0,1, got {text!r}") from None


def cmd_plan_tenants(args) -> int:
    """Confidential tenants placed on the node's fabric partitions (or its whole complex, protected PCIe)."""
    from ccbridge import tenants

    if args.from_stamp:
        given = [o for o, v in (("--gpus", args.gpus), ("--mode", args.mode), ("--busy", args.busy)) if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)} and --from-stamp: the stamp gives the GPUs, mode and busy GPUs")
        n, mode, busy = tenants.from_stamp(args.from_stamp)
    else:
        n, mode, busy = args.gpus or 8, args.mode or "nvle", args.busy or []
    if args.json:
        ui.writable_file(args.json, "--json")
    plan = tenants.plan(n, args.request, mode, busy, source=args.from_stamp)
    print(tenants.render(plan))
    if args.json:
        Path(args.json).write_text(json.dumps(plan.as_dict(), indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def cmd_profiles(args) -> int:
    from ccbridge.emulate import profiles

    if args.overrides and not args.name:
        raise UsageError("--set changes one profile: name it (ccbridge profiles NAME --set KEY=VALUE)")
    if not args.name:
        for p in [profiles.load(n) for n in profiles.names()]:
            print(f"{p.name:<12} {p.title}")
        print("\n`ccbridge profiles NAME` shows each parameter, what it is and where its value comes from.")
        return 0
    from ccbridge.textfit import wrap

    p = profiles.override(profiles.load(args.name), args.overrides)
    out = wrap([f"# profile {p.name}: {p.title}"]
               + ([f"# what-if: {', '.join(p.overrides)} set on the command line"] if p.overrides else [])) + [""]
    for key, (unit, what) in profiles.PARAMS.items():
        v = p.params[key].value
        out.append(f"{key} = {profiles.show(key, v)} {unit}")
        out += wrap([f"    what:   {what}", f"    source: {p.params[key].source}"], indent=" " * 12)
    if p.targets:
        out.append("\npublished targets checked by `ccbridge calibrate`:")
        out += wrap([f"  {key} = {t.value:g} (±{t.tolerance:.0%}): {t.source}" for key, t in p.targets.items()],
                    indent="    ")
    print("\n".join(out))
    return 0


DEFAULT_ROUNDS = 3  # calibrate's native/emulated pairs for the delta checks


def cmd_calibrate(args) -> int:
    from ccbridge import results
    from ccbridge.emulate import calibrate, launcher, profiles

    prof = profiles.override(profiles.load(args.profile), args.overrides)
    out = ui.writable_folder(args.out or Path("ccbridge-results") / f"calibrate-{prof.name}-{dt.datetime.now():%Y%m%d-%H%M%S}",
                             "--out", fresh=("calibration.json",))
    if args.rounds is not None and args.emulated is not None:
        raise UsageError("--rounds pairs fresh native and emulated runs of the delta tests; with --emulated given "
                         "this command runs no emulated probe")
    # Given results are read and checked first: a bad one fails now, not after a probe run of minutes.
    given = {k: calibrate.check_side(results.load(p), k, prof, f"--{k} {p}")
             for k, p in (("native", args.native), ("emulated", args.emulated)) if p is not None}
    if "emulated" not in given:
        launcher.check(prof, launcher.python_cmd())

    def probe(kind: str, tests: str, folder: Path):
        """One probe run, natively or under the profile; its result, checked."""
        cmd = launcher.python_cmd("probe", "--tests", tests, "--device", str(args.device),
                                  *([] if args.full else ["--quick"]), "--out", str(folder))
        rc = subprocess.call(cmd) if kind == "native" else launcher.run(prof, cmd)
        if not (folder / "result.json").exists():
            raise UsageError(f"the {kind} probe run exited with status {rc} and wrote no result (its message is above)")
        return calibrate.check_side(results.load(folder / "result.json"), kind, prof, f"the {kind} probe run")

    for kind in ("native", "emulated"):
        if kind not in given:
            print(f"ccbridge calibrate: {kind} probe run" + (f" ({launcher.banner(prof)})" if kind == "emulated" else ""),
                  file=sys.stderr)
            given[kind] = probe(kind, calibrate.PROBE_TESTS, out / kind)
    native, emulated = given["native"], given["emulated"]
    n = 1 if args.emulated is not None else args.rounds or DEFAULT_ROUNDS
    rounds = []  # more pairs of the delta tests, alternating, when this command runs the emulated probe
    for i in range(2, n + 1):
        pair = []
        for kind in ("native", "emulated"):
            print(f"ccbridge calibrate: delta tests, round {i} of {n}, {kind}", file=sys.stderr)
            pair.append(probe(kind, calibrate.DELTA_TESTS, out / f"round{i}" / kind))
        rounds.append(tuple(pair))
    checks = calibrate.evaluate(prof, native, emulated, rounds)
    md = calibrate.render(prof, checks, native, emulated)
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.md").write_text(md)
    (out / "calibration.json").write_text(json.dumps(calibrate.to_json(checks), indent=1))
    print(md)
    print(f"wrote {out / 'calibration.md'}, {out / 'calibration.json'}", file=sys.stderr)
    return 0 if all(c.ok for c in checks) else 1


def cmd_trace(args) -> int:
    from ccbridge.emulate import trace

    s = trace.summarize(args.prefix)
    if not s.processes and not s.by_api:
        raise UsageError(f"no trace files {args.prefix}.<pid>.csv or .summary.json")
    print(trace.render(s))
    return 0


def cmd_report(args) -> int:
    from ccbridge import results

    out = ui.writable_folder(args.out or Path(args.result).parent, "--out")
    res = results.load(args.result)
    for p in _write_reports(res, out)[1:]:
        print(p)
    return 0


def cmd_compare(args) -> int:
    from ccbridge import compare, results

    out = ui.writable_folder(args.out, "--out") if args.out else None
    base, other = results.load(args.base), results.load(args.other)
    c = compare.compare(base, other)
    md = compare.render_markdown(c)
    print(md)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(md)
        (out / "compare.html").write_text(compare.render_html(c))
        print(f"wrote {out / 'compare.md'}, {out / 'compare.html'}", file=sys.stderr)
    if not c.ratios:
        print("ccbridge compare: the two results share no rows", file=sys.stderr)
        return 1
    return 0


def cmd_load(args) -> int:
    from ccbridge import env
    from ccbridge.load import bench, checkpoint, loader

    if not args.bench and (args.json or args.ceiling):
        raise UsageError("--json and --ceiling go with --bench")
    if args.json:
        ui.writable_file(args.json, "--json")
    checkpoint.resolve(args.paths)  # the paths exist and none is given twice, before torch is imported
    ceiling = bench.probe_ceiling(args.ceiling) if args.ceiling else None
    try:
        import torch  # noqa: F401
    except ImportError:
        print("ccbridge load: needs torch (pip install torch)", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in dict(workers=args.workers, contexts=args.contexts, staging=args.staging,
                                       chunk_bytes=args.chunk, buffers=args.buffers).items() if v is not None}
    label = env.emulated_banner(env.emulation_info())
    if label:
        print(f"ccbridge load: {label}", file=sys.stderr)
    if args.bench:
        rep = bench.run(args.paths, args.device, args.repeat, overrides,
                        log=lambda m: print(f"ccbridge load: {m}", file=sys.stderr))
        rep["emulation"] = label
        rep["ceiling_gbps"] = ceiling
        print(bench.render(rep, ceiling))
        if args.json:
            Path(args.json).write_text(json.dumps(rep, indent=1))
            print(f"wrote {args.json}", file=sys.stderr)
        if rep.get("error"):
            print(f"ccbridge load: {rep['error']}", file=sys.stderr)
            return 1
        return 0
    st = loader.LoadStats()
    with ui.bytes_progress("loading") as advance:
        got = loader.load_safetensors(args.paths, args.device, stats=st, progress=advance, **overrides)
    st.join_teardown()
    print(f"{st.tensors} tensors from {st.files} files, {st.bytes / 1e9:.2f} GB to {args.device} in {st.total_s:.2f} s: "
          f"{st.gbps:.2f} GB/s ({st.load_gbps:.2f} GB/s once the pool was warm)" + (f" [{label}]" if label else ""))
    print(f"pool: {st.why}")
    print(f"stages: headers {st.headers_s:.3f} s, allocation {st.alloc_s:.3f} s, pool prewarm {st.prewarm_s:.3f} s "
          f"(waited {st.prewarm_wait_s:.3f} s), data {st.load_s:.3f} s (per worker: read {st.read_s:.3f} s, "
          f"copy {st.copy_s:.3f} s), teardown {st.teardown_s or 0:.3f} s (in the background)")
    del got
    return 0


def cmd_make_checkpoint(args) -> int:
    from ccbridge.load import synth

    with ui.count_progress("writing shards") as step:
        files = synth.make_checkpoint(args.out, args.size, args.shard_size, seed=args.seed, progress=step)
    size = sum(Path(f).stat().st_size for f in files)
    print(f"wrote {len(files)} shards, {size / 2**30:.2f} GiB, and model.safetensors.index.json to {args.out}")
    return 0


def _secure_ready(cmd: str, args) -> bool:
    """The arguments first (they need no GPU), then torch and GPUs."""
    if args.maxbytes < args.minbytes:
        raise UsageError(f"-e/--maxbytes ({args.maxbytes}) is smaller than -b/--minbytes ({args.minbytes})")
    if args.json:
        ui.writable_file(args.json, "--json")
    try:
        import torch
    except ImportError:
        print(f"ccbridge {cmd}: needs torch (pip install torch)", file=sys.stderr)
        return False
    if not torch.cuda.is_available():
        print(f"ccbridge {cmd}: needs NVIDIA GPUs; torch sees none", file=sys.stderr)
        return False
    return True


def cmd_collectives(args) -> int:
    if args.net and (args.backend != "nccl" or args.transport != "default"):
        raise UsageError("--net compares NCCL's own transports: it takes neither --backend gloo nor --transport")
    if args.net:
        _plugin_built()
    if not _secure_ready("collectives", args):
        return 2
    from ccbridge.secure import bench

    res = bench.collectives(args.op, args.minbytes, args.maxbytes, args.stepfactor, args.dtype,
                            args.iters, args.warmup, args.ngpus, args.backend, args.transport, args.net)
    how = ("each encrypted op ends with a host wait" if args.net is None
           else f"NCCL's log showed networks {res['nets']}")
    print(f"# ccbridge collectives: {args.op} on {res['nranks']} GPUs, backend {res['backend']}, transport "
          f"{res['transport']}, {args.iters} iterations ({how}); #wrong: elements differing from the exact result")
    print(bench.render_collectives(res["rows"], encrypted=res["encrypted"]))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 1 if any(r["wrong"] or r["wrong_plain"] for r in res["rows"]) else 0


# bench kv's own options (None when not given), refused by every other benchmark.
KV_OPTIONS = {"prefixes": "--prefixes", "prefix_len": "--prefix-len", "suffix_len": "--suffix-len",
              "requests": "--requests", "thresholds": "--thresholds", "zipf": "--zipf",
              "device_blocks": "--device-blocks", "gpu_fraction": "--gpu-fraction", "churn": "--churn"}


# The other benchmarks' own options (None when not given) and the benchmarks that read them: any other
# refuses them rather than run without them.
BENCH_OPTIONS = {"models": ("--models", ("ddp",)), "ngpus": ("--ngpus", ("ddp",)), "buckets": ("--buckets", ("ddp",)),
                 "net": ("--net", ("ddp",)), "wrap": ("--wrap", ("ddp",)), "lanes": ("--lanes", ("net",)),
                 "inflight": ("--inflight", ("net",)), "total": ("--total", ("net",)),
                 "minbytes": ("-b/--minbytes", ("cipher", "net")), "maxbytes": ("-e/--maxbytes", ("cipher", "net")),
                 "warmup": ("--warmup", ("ddp", "decode", "kv")), "seed": ("--seed", ("decode", "kv")),
                 "host_prep_us": ("--host-prep-us", ("decode",)), "tp": ("--tp", ("decode",))}
# list options whose values each make a row or a run: one given twice would make two rows of one key
BENCH_LISTS = {"models": "--models", "ngpus": "--ngpus", "buckets": "--buckets", "lanes": "--lanes",
               "batch": "--batch", "modes": "--modes", "thresholds": "--thresholds", "tp": "--tp"}


def cmd_bench(args) -> int:
    given_kv = [flag for name, flag in KV_OPTIONS.items() if getattr(args, name) is not None]
    if args.what != "kv" and given_kv:
        raise UsageError(f"{given_kv[0]} goes with `bench kv`")
    for name, (flag, whats) in BENCH_OPTIONS.items():
        if getattr(args, name) is not None and args.what not in whats:
            raise UsageError(f"{flag} goes with " + " or ".join(f"`bench {w}`" for w in whats))
    for name, flag in BENCH_LISTS.items():
        values = getattr(args, name) or []
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:
            raise UsageError(f"{flag} {twice[0]} is given twice")
    defaults = {"models": list(DDP_MODELS), "ngpus": [2, 4], "buckets": [25, 100, 400, 800], "wrap": "ddp",
                "lanes": [1, 2, 4, 8], "inflight": 8, "total": _size("2G"), "seed": 0}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.what == "decode":
        return _bench_decode(args)
    if args.what == "kv":
        return _bench_kv(args)
    if args.graphs or args.model or args.batch or args.modes or args.device or args.prompt or args.output or \
            args.checkpoint is not None:
        raise UsageError("--model, --checkpoint, --batch, --prompt, --output, --modes, --graphs and --device go with "
                         "`bench decode` (--model, --modes and --device also with `bench kv`)")
    args.warmup = 3 if args.warmup is None else args.warmup
    default = {"net": ("64K", "4M"), "cipher": ("1M", "1G"), "ddp": ("1M", "1G")}[args.what]
    args.iters = args.iters or (3 if args.what == "net" else 10)
    args.minbytes = _size(default[0]) if args.minbytes is None else args.minbytes
    args.maxbytes = _size(default[1]) if args.maxbytes is None else args.maxbytes
    if args.what == "net":
        return _bench_net(args)
    if args.wrap == "fsdp" and (args.what != "ddp" or not args.net):
        raise UsageError("--wrap fsdp goes with `bench ddp --net ccbridge` (ccbridge.secure's hook is for DDP)")
    if args.net and args.what != "ddp":
        raise UsageError("--net goes with `bench ddp` (and `bench net` needs none)")
    if args.net:
        _plugin_built()
    if not _secure_ready("bench", args):
        return 2
    from ccbridge.secure import bench

    if args.what == "cipher":
        res = bench.cipher(bench.sizes(args.minbytes, args.maxbytes, 4), args.iters)
        print(bench.render_cipher(res))
    else:
        res = {"runs": []}
        for n in args.ngpus:
            r = bench.ddp(args.models, n, args.buckets, args.iters, args.warmup, net=args.net, wrap=args.wrap)
            res["runs"].append(r)
            print(bench.render_ddp(r))
        if any(row["grads_agree"] is False for r in res["runs"] for row in r["rows"]):
            print("ccbridge bench: gradients differ across ranks (see the grads column)", file=sys.stderr)
            if args.json:
                Path(args.json).write_text(json.dumps(res, indent=1))
            return 1
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


def _bench_decode(args) -> int:
    """Greedy decode of a transformer (random weights) in each scheduling mode; tokens must agree."""
    if args.json:
        ui.writable_file(args.json, "--json")
    if args.graphs and args.device == "cpu":
        raise UsageError("--graphs captures CUDA graphs: it needs a CUDA device (not --device cpu)")
    if args.checkpoint is not None and args.model:
        raise UsageError("give --model (a preset with random weights) or --checkpoint DIR (real weights), not both")
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        print("ccbridge bench: decode needs torch (pip install torch)", file=sys.stderr)
        return 2
    from ccbridge.serve import decode

    batches = args.batch or [1, 8, 32, 128]
    common = dict(iters=args.iters or 3, warmup=1 if args.warmup is None else args.warmup, graphs=args.graphs,
                  seed=args.seed, log=lambda m: print(f"ccbridge bench: {m}", file=sys.stderr, flush=True),
                  host_prep_us=args.host_prep_us or 0.0)
    shape = (batches, args.prompt or 128, args.output or 64, args.modes or list(DECODE_MODES), args.device or "cuda")
    if args.tp:
        if args.checkpoint is not None:
            raise UsageError("--tp splits a preset's layers (--model, random weights); --checkpoint runs on one GPU")
        from ccbridge.serve import tp

        res = tp.bench(args.model or "llama-1b", args.tp, *shape, **common)
        return _bench_done(res, tp.render(res), args.json)
    res = decode.bench(args.model or "llama-1b", *shape, checkpoint=args.checkpoint, **common)
    return _bench_done(res, decode.render(res), args.json)


def _bench_kv(args) -> int:
    """Prefix-reuse churn through a KVCache with a host tier, per store threshold and sync/async crossings."""
    if args.graphs or args.batch or args.prompt or args.output or args.checkpoint is not None:
        raise UsageError("--batch, --prompt, --output, --checkpoint and --graphs go with `bench decode` "
                         "(kv: --prefix-len, --suffix-len, --requests)")
    if args.json:
        ui.writable_file(args.json, "--json")
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        print("ccbridge bench: kv needs torch (pip install torch)", file=sys.stderr)
        return 2
    from ccbridge.serve import kvbench

    res = kvbench.bench(args.model, args.prefixes, args.prefix_len, args.suffix_len, args.requests,
                        args.thresholds, args.modes, args.device or "cuda", zipf=args.zipf,
                        gpu_fraction=args.gpu_fraction, device_blocks=args.device_blocks, seed=args.seed,
                        warmup=args.warmup, iters=args.iters, churn=args.churn,
                        log=lambda m: print(f"ccbridge bench: {m}", file=sys.stderr, flush=True))
    return _bench_done(res, kvbench.render(res), args.json)


def _bench_done(res, table: str, json_path: str | None) -> int:
    """A bench Result's ending: its table, the file, its errors on stderr; 1 if it had any."""
    print(table)
    if json_path:
        res.save(Path(json_path))
        print(f"wrote {json_path}", file=sys.stderr)
    for e in res.errors:
        print(f"ccbridge bench: {e['error']}", file=sys.stderr)
    return 1 if res.errors else 0


def _plugin_built() -> None:
    from ccbridge.secure import netplugin

    try:
        netplugin.library()
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None


def _bench_net(args) -> int:
    """The net plugin's loopback stream: needs neither torch nor a GPU."""
    import os

    from ccbridge.secure import bench, netbench, netplugin

    if args.maxbytes < args.minbytes:
        raise UsageError(f"-e/--maxbytes ({args.maxbytes}) is smaller than -b/--minbytes ({args.minbytes})")
    if args.json:
        ui.writable_file(args.json, "--json")
    if max(args.lanes) > 16:
        raise UsageError(f"--lanes: at most 16 (got {max(args.lanes)})")
    _plugin_built()
    print(f"# ccbridge bench net: {netplugin.NAME} loopback, two processes, {args.inflight} messages in flight, "
          f"{args.total} bytes per measurement x {args.iters}, {os.cpu_count()} cores", flush=True)
    res = netbench.loopback(bench.sizes(args.minbytes, args.maxbytes, 8), args.lanes, args.inflight, args.total,
                            args.iters)
    return _bench_done(res, netbench.render(res), args.json)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="ccbridge", description="Measure the CPU<->GPU bridge of GPU confidential computing.")
    ap.add_argument("--version", action="version", version=f"ccbridge {__version__}")
    # dest "command": a subcommand's own arguments must not reuse the name (run's program did).
    sub = ap.add_subparsers(dest="command", required=True)
    size, device_index = _checked(_size), _int(0)

    p = sub.add_parser("env", help="print the environment stamp (GPUs, driver, CC state, TEE, CPU crypto)")
    p.add_argument("--json", action="store_true", help="the raw stamp as JSON")
    p.set_defaults(fn=cmd_env)

    p = sub.add_parser("attest", help="one JSON bundle of GPU evidence, CPU TEE report, CC settings and fabric state, "
                                      "bound to a verifier's nonce; verification is NVIDIA's and the CPU vendor's")
    p.add_argument("--nonce", required=True, type=_checked(_nonce), metavar="HEX",
                   help="the verifier's fresh 32-byte nonce, as 64 hex digits")
    p.add_argument("--out", metavar="FILE", help="write the bundle here and print a summary (default: the bundle "
                                                 "to stdout)")
    p.add_argument("--verify", choices=["local", "remote"], help="hand the GPU evidence to NVIDIA's attestation SDK "
                   "(pip install 'ccbridge[attest]'): its local verifier, or NVIDIA's remote service")
    p.add_argument("--verifier-url", metavar="URL", help="with --verify remote: another remote verifier's URL")
    p.add_argument("--allow-unprotected", action="store_true", help="exit 0 where this is not a CVM or GPU CC is "
                   "off (the bundle says so either way)")
    p.set_defaults(fn=cmd_attest)

    p = sub.add_parser("probe", help="measure the bridge; writes result.json, report.md, report.html")
    p.add_argument("--tests", help="comma list of test or family names (see --list); default all")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (under a minute)")
    p.add_argument("--device", type=device_index, default=0, help="CUDA device index (default 0)")
    p.add_argument("--out", help="output folder (default ccbridge-results/<timestamp>)")
    p.add_argument("--list", action="store_true", help="list the registered tests and exit")
    p.add_argument("--profile", help="run the probe under the emulator with this profile (see `ccbridge profiles`)")
    p.add_argument("--record", metavar="T", help="record every crossing, launch and synchronize to T.<pid>.csv "
                   "(with --profile: emulated; without: native)")
    _add_set(p)
    p.set_defaults(fn=cmd_probe)

    p = sub.add_parser("run", help="run a program under the emulated CC bridge: ccbridge run --profile b300 -- CMD; "
                                   "or record it: ccbridge run --record T -- CMD")
    p.add_argument("--profile", help="emulate with this profile: name or .json path (see `ccbridge profiles`); "
                                     "without it the program runs natively (with --record or --coverage)")
    p.add_argument("--record", metavar="T", help="trace every crossing, launch, synchronize, context and pinned "
                                                 "allocation to T.<pid>.csv and a summary per process (T's folder "
                                                 "must exist); without --profile the program is only recorded, not "
                                                 "emulated")
    p.add_argument("--coverage", metavar="FILE", help="write every driver entry point the program resolved, classified "
                                                      "hooked/harmless/MISSING/unclassified, to FILE (JSON) and print it")
    p.add_argument("--sites", action="store_true", help="with --record: also note which Python line issued each call "
                                                        "(T.<pid>.sites.json; a profile hook in every Python process "
                                                        "of the run, which slows Python-heavy loops)")
    _add_set(p)
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]", help="the program to run")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("account", help="which calls a workload's CC tax goes to: two traces compared, or CMD "
                                       "natively vs emulated (ccbridge account --profile b300 -- CMD)")
    p.add_argument("--profile", help="record CMD natively, then under this emulator profile, and compare (both "
                                     "runs note Python call sites unless --no-sites)")
    p.add_argument("--no-sites", action="store_true", help="with --profile: per API only, no Python call sites "
                                                           "(no profile hook in CMD)")
    _add_set(p)
    p.add_argument("--out", help="output folder (default ccbridge-results/account-<timestamp>)")
    p.add_argument("--why", action="store_true", help="also print the evidence behind each row (waits, tolls, "
                                                      "GPU time, the full recovery and call site)")
    p.add_argument("args", nargs="*", help="BASE OTHER (trace prefixes), or -- CMD [ARGS...] with --profile")
    p.set_defaults(fn=cmd_account)

    p = sub.add_parser("advise", help="CC-aware settings for vLLM, SGLang, TRT-LLM, torch and the loader from env "
                                      "stamps and probe, account, bench decode and bench kv results, each with the "
                                      "number behind it")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="result.json of probe, account, bench decode or bench kv, or `ccbridge env --json` output")
    p.add_argument("--json", help="also write the advice and the inputs' env summaries here")
    p.add_argument("--why", action="store_true", help="print the full evidence per line (the row keys and "
                                                      "medians behind each number) instead of the table")
    p.set_defaults(fn=cmd_advise)

    from ccbridge import tenants  # its MODES; it imports no GPU library

    p = sub.add_parser("plan-tenants", help="place confidential tenants of the requested sizes on a multi-GPU node's "
                                            "fabric partitions; what does not fit and the free GPUs left")
    p.add_argument("--request", type=_int(1), nargs="+", required=True, metavar="SIZE",
                   help="tenant sizes in GPUs, each 1, 2, 4 or 8 (aligned fabric partitions)")
    p.add_argument("--gpus", type=_int(1), help="GPUs of the node: 1, 2, 4 or 8 (default 8, an HGX baseboard)")
    p.add_argument("--mode", choices=tenants.MODES, help="multi-GPU CC mode: nvle (B300: a tenant "
                   "is a fabric partition; default) or protected-pcie (Hopper: one tenant takes every GPU)")
    p.add_argument("--busy", type=_checked(_gpu_list), help="GPUs other tenants hold, e.g. 0,1")
    p.add_argument("--from-stamp", metavar="FILE", help="`ccbridge env --json` output or a result.json taken on "
                   "the node: GPUs, mode and busy GPUs from its NVML multi-GPU mode and fabric cliques")
    p.add_argument("--json", help="also write the plan here")
    p.set_defaults(fn=cmd_plan_tenants)

    p = sub.add_parser("profiles", help="list emulator profiles; with NAME, each parameter and its source")
    p.add_argument("name", nargs="?")
    _add_set(p)
    p.set_defaults(fn=cmd_profiles)

    p = sub.add_parser("calibrate", help="emulated probe vs native probe vs the profile's published targets")
    p.add_argument("--profile", required=True)
    p.add_argument("--native", help="use this native result.json instead of running the probe")
    p.add_argument("--emulated", help="use this emulated result.json instead of running the probe")
    p.add_argument("--full", action="store_true", help="full probe suite instead of --quick")
    p.add_argument("--rounds", type=_int(1, 20),
                   help="pairs of native and emulated runs of the delta tests (launch, 32-byte D2H), alternating; "
                        f"the delta checks take their median (default {DEFAULT_ROUNDS}; not with --emulated)")
    p.add_argument("--device", type=device_index, default=0)
    p.add_argument("--out", help="output folder (default ccbridge-results/calibrate-<profile>-<timestamp>)")
    _add_set(p)
    p.set_defaults(fn=cmd_calibrate)

    p = sub.add_parser("trace", help="summarise an emulator trace (TRACE.<pid>.csv files)")
    p.add_argument("prefix")
    p.set_defaults(fn=cmd_trace)

    p = sub.add_parser("report", help="re-render report.md and report.html from a result.json")
    p.add_argument("result")
    p.add_argument("--out", help="output folder (default: beside the result)")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("compare", help="OTHER/BASE ratio table and changed findings of two probe results")
    p.add_argument("base")
    p.add_argument("other")
    p.add_argument("--out", help="also write compare.md and compare.html here")
    p.set_defaults(fn=cmd_compare)

    from ccbridge.load.engine import MAX_BUFS, MAX_WORKERS  # the pool's own limits, refused before it sees them

    p = sub.add_parser("load", help="load safetensors to the GPU through ccbridge's pool; --bench compares loaders")
    p.add_argument("paths", nargs="+", help=".safetensors files, a checkpoint directory or its index json")
    p.add_argument("--device", type=_checked(_device_spec), default="cuda:0", help="cuda, cuda:N or cpu (default cuda:0)")
    p.add_argument("--bench", action="store_true", help="compare with safetensors and fastsafetensors on the same files")
    p.add_argument("--repeat", type=_int(1), default=3, help="with --bench: loads per loader (default 3)")
    p.add_argument("--ceiling", help="with --bench: a probe result.json whose best multi-worker H2D is the ceiling")
    p.add_argument("--json", help="with --bench: write the full report here")
    p.add_argument("--workers", type=_int(1, MAX_WORKERS), help="worker threads (default: by CC state or emulation profile)")
    p.add_argument("--contexts", type=_int(0, MAX_WORKERS), help="contexts of the pool's own; 0 = the primary context")
    p.add_argument("--staging", choices=["pinned", "pageable"], help="host staging buffers")
    p.add_argument("--chunk", type=size, help="bytes per read and copy, e.g. 16MiB")
    p.add_argument("--buffers", type=_int(1, MAX_BUFS), help="staging buffers per worker")
    p.set_defaults(fn=cmd_load)

    p = sub.add_parser("make-checkpoint", help="write a synthetic large-model checkpoint of random bytes")
    p.add_argument("out", help="output directory")
    p.add_argument("--size", type=size, default="32GiB", help="total size (default 32GiB)")
    p.add_argument("--shard-size", type=size, default="4GiB", help="shard size (default 4GiB)")
    p.add_argument("--seed", type=_int(0), default=0)
    p.set_defaults(fn=cmd_make_checkpoint)

    p = sub.add_parser("collectives", help="nccl-tests style table: plaintext vs encrypted collectives (spawns one rank per GPU)")
    p.add_argument("--op", default="all_reduce", choices=["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
    p.add_argument("-b", "--minbytes", type=size, default="8", help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", type=size, default="256M", help="largest size (default 256M)")
    p.add_argument("-f", "--stepfactor", type=_int(2), default=2, help="size multiplier, at least 2 (default 2)")
    p.add_argument("-d", "--dtype", default="float", choices=list(SECURE_DTYPES))
    p.add_argument("-n", "--iters", type=_int(1), default=20)
    p.add_argument("-w", "--warmup", type=_int(0), default=5)
    p.add_argument("-g", "--ngpus", type=_int(2), help="ranks, at least 2 (default: every GPU)")
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    p.add_argument("--transport", default="default", choices=["default", "sockets"],
                   help="sockets: NCCL without P2P or shared memory, a stand-in for crossing nodes")
    p.add_argument("--net", choices=["ccbridge"],
                   help="compare NCCL's plaintext socket transport with NCCL on the ccbridge net plugin "
                        "(both without P2P or shared memory) instead of with ccbridge.secure")
    p.add_argument("--json", help="write the rows here")
    p.set_defaults(fn=cmd_collectives)

    p = sub.add_parser("bench", help="benchmarks of the encryption: ddp (training iterations), cipher (the GPU "
                       "kernels) or net (the NCCL net plugin's loopback stream, CPU only); decode: a transformer's "
                       "greedy decode under sync/async/staged/drain scheduling; kv: prefix-reuse churn through a "
                       "KV cache with a host tier (TTFT, spill and restore bytes, hit rates per store threshold)")
    p.add_argument("what", choices=["ddp", "cipher", "net", "decode", "kv"])
    p.add_argument("--models", nargs="+", choices=DDP_MODELS, help="ddp: models (default all three)")
    p.add_argument("--ngpus", type=_int(2), nargs="+", help="ddp: world sizes, each at least 2 (default 2 4)")
    p.add_argument("--buckets", type=_int(1), nargs="+",
                   help="ddp: bucket_cap_mb sweep for the encrypted runs (default 25 100 400 800)")
    p.add_argument("--iters", type=_int(1), help="ddp, cipher: timed iterations (default 10); net: repeats (default 3); "
                                                 "decode: timed runs per batch and mode (default 3); kv: passes of "
                                                 "the request stream, each with fresh suffixes (default 1)")
    p.add_argument("--warmup", type=_int(0), help="ddp: warm-up iterations (default 3); decode: warm-up runs (default 1); "
                   "kv: untimed passes over every prefix, with its churn, before the stream (default 2)")
    p.add_argument("-b", "--minbytes", type=size, help="cipher, net: smallest size (default 1M; net 64K)")
    p.add_argument("-e", "--maxbytes", type=size, help="cipher, net: largest size (default 1G; net 4M)")
    p.add_argument("--net", choices=["ccbridge"], help="ddp: NCCL's plaintext sockets beside NCCL on the ccbridge "
                   "net plugin (both without P2P or shared memory) instead of ccbridge.secure's hook")
    p.add_argument("--wrap", choices=["ddp", "fsdp"], help="ddp: DDP (default) or FSDP2 (with --net)")
    p.add_argument("--lanes", type=_int(1), nargs="+",
                   help="net: sockets (each with a thread) per connection to compare (default 1 2 4 8; at most 16)")
    p.add_argument("--inflight", type=_int(1), help="net: messages in flight (default 8, as NCCL's steps)")
    p.add_argument("--total", type=size, help="net: bytes moved per measurement (default 2G)")
    p.add_argument("--model", choices=list(DECODE_PRESETS), help="decode, kv: model shape, random weights (default llama-1b; kv on CUDA: qwen2.5-3b, "
                        "the published setup's)")
    p.add_argument("--checkpoint", metavar="DIR", help="decode: a local Hugging Face model folder (config.json, "
                                                       "*.safetensors) read by ccbridge's loader, instead of --model")
    p.add_argument("--batch", type=_int(1), nargs="+", help="decode: batch sizes (default 1 8 32 128)")
    p.add_argument("--prompt", type=_int(1), help="decode: prompt tokens (default 128)")
    p.add_argument("--output", type=_int(2), help="decode: tokens generated per sequence, the first by prefill "
                                                  "(default 64)")
    p.add_argument("--modes", nargs="+", choices=DECODE_MODES, help="decode: scheduling modes (default all); kv: "
                   "sync (wait for each restore and spill crossing) and/or async (default both)")
    p.add_argument("--graphs", action="store_true", help="decode: each step one CUDA-graph replay over a static KV cache (captured per run, "
                        "outside the timing); needs a CUDA device")
    p.add_argument("--host-prep-us", type=_checked(_float_ge0), metavar="US",
                   help="decode: an engine's host work per step (scheduling, metadata), as CPU time between the "
                        "step's input crossings and its launch (default 0: the harness's own few us)")
    p.add_argument("--tp", type=_int(1), nargs="+", metavar="N",
                   help="decode: tensor-parallel degrees, e.g. 1 2 4 8: one process per GPU over NCCL (gloo, at most "
                        "4 ranks, on --device cpu), an all-reduce after each layer's attention and MLP; tokens "
                        "checked across degrees and modes")
    p.add_argument("--device", type=_checked(_device_spec), help="decode, kv: cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--seed", type=_int(0), help="decode, kv: seed of the weights, prompts and the kv "
                                                           "request stream (default 0)")
    p.add_argument("--prefixes", type=_int(1), help="kv: distinct shared prefixes (default 4 on CUDA, 8 on the CPU)")
    p.add_argument("--churn", type=_int(0), help="kv: one-off requests (prefix + suffix tokens, never reused) after "
                                                 "each request, not timed (default 3)")
    p.add_argument("--prefix-len", type=_int(1), help="kv: tokens per prefix (default 31744 on CUDA, "
                   "a 1.1 GiB prefix of qwen2.5-3b as published; 64 on the CPU)")
    p.add_argument("--suffix-len", type=_int(1), help="kv: unique tokens after the prefix per request (default 32)")
    p.add_argument("--requests", type=_int(1), help="kv: timed requests per pass, each generating 1 token (default 12 on CUDA, 64 on the CPU; "
                                                    "--iters passes, --warmup passes over every prefix first)")
    p.add_argument("--thresholds", type=_int(1), nargs="+", help="kv: store thresholds to sweep: a block is spilled "
                   "to the host on eviction only if looked up this often (default 1 2 3)")
    p.add_argument("--zipf", type=_checked(_float_ge0), help="kv: reuse skew, prefix i drawn with weight "
                   "1/(i+1)^S (default 1; 0 uniform)")
    p.add_argument("--gpu-fraction", type=_checked(_float_ge0), help="kv: device KV blocks as a fraction of the "
                   "distinct prefixes' blocks (default 1/3)")
    p.add_argument("--device-blocks", type=_int(1), help="kv: device KV blocks (16 tokens each), instead of "
                   "--gpu-fraction")
    p.add_argument("--json", help="write the rows here (decode, kv: a result file `ccbridge compare` reads)")
    p.set_defaults(fn=cmd_bench)
    return ap


def main(argv: list[str] | None = None) -> int:
    from ccbridge.errors import CCBridgeError

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would blame the top-level parser; the words belong to the subcommand
        parser.exit(2, f"ccbridge {args.command}: unrecognized arguments: {' '.join(extra)} "
                       f"(see ccbridge {args.command} --help)\n")
    try:
        return args.fn(args)
    except CCBridgeError as e:  # say why, lose nothing
        print(f"ccbridge {args.command}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader stopped (`| head`): nothing went wrong, and nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python's own flush at exit would fail)
        return 0
    except OSError as e:  # the machine refused after the checks passed: a full disk, a lost mount
        where = f": {e.filename}" if e.filename else ""
        print(f"ccbridge {args.command}: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # whatever was half-written has been removed on the way out
        print(f"ccbridge {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
