"""Measuring the bridge: the probe, the emulator profiles it can run under, and calibrating one against both."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ccbridge import env, results, ui
from ccbridge.bindings import core
from ccbridge.cli.args import add_set, add_timer, apply_timer, command, integer, what_if
from ccbridge.cli.reports import EarlyReports, write_reports, wrote
from ccbridge.emulate import calibrate, launcher, profiles
from ccbridge.errors import GpuError, UsageError
from ccbridge.findings import shown
from ccbridge.probe import registry
from ccbridge.textfit import cut, wrap


DEFAULT_ROUNDS = 3  # calibrate's native/emulated pairs for the delta checks


def cmd_probe(args) -> int:
    if args.list:
        for t in registry.select(None):
            needs = f" (needs {', '.join(t.needs)})" if t.needs else ""
            print("\n".join(wrap([f"{t.name:<24} {t.title}{needs}"], indent=" " * 25)))
        return 0
    # Everything a run needs is checked before it starts: a run can take many minutes.
    # --record alone: the probe runs natively, recorded (the passthrough interposer adds no cost)
    prof = what_if(args, "passthrough" if args.record else None)
    tests = registry.select(args.tests)
    registry.check_device(args.device)
    out = ui.writable_folder(args.out or ui.run_folder(), "--out", fresh=("result.json",))
    if prof:
        return _probe_under(args, prof, out)
    t_enter = time.perf_counter()
    console = ui.terminal(stderr=True)
    of = f" of {len(registry.select(None))}" if args.tests else ""
    console.print(f"ccbridge probe: {len(tests)}{of} test{'s' if len(tests) != 1 or of else ''}, "
                  f"{'quick' if args.quick else 'full'} suite, device {args.device}")
    settings = registry.Settings(device=args.device, quick=args.quick, tests=args.tests, timer=apply_timer(args))
    # first: their start-ups (interpreters, imports) overlap the stamp's (torch's import) and the run
    started, reports = registry.prestart(settings), EarlyReports()
    registry.import_torch_early()  # the stamp's torch part waits for the end of the run
    try:
        stamp = env.stamp(with_torch=False)
        if stamp["emulation"]["active"]:
            console.print(f"[bold yellow]EMULATED run (profile {env.emulation_label(stamp['emulation'])}): "
                          "figures are not CC hardware measurements[/]")
        t_run = time.perf_counter()
        with ui.ProbeProgress(len(tests), console) as progress:
            res = registry.run(settings, stamp, progress, started)
        res.env["torch"] = env.torch_info()
        t_reports = time.perf_counter()
        paths = reports.write(res, out)
        phases = (f"start-up {t_run - t_enter:.1f} s, tests {res.duration_s:.1f} s, "
                  f"reports {time.perf_counter() - t_reports:.1f} s")
    finally:
        reports.close()
        for handle in filter(None, started.values()):
            handle.close()
    # the answer on stdout (`ccbridge probe > findings.txt`), its progress and the files' paths on stderr
    answer = ui.terminal()
    for f in shown(res):
        answer.print(f"- {f.text}", highlight=False)
    if res.no_gpu:  # the reason whole is in result.json and report.md
        answer.print(f"[yellow]GPU families skipped: {registry.briefly(res.no_gpu)}; the host families ran.[/]")
    elif res.skipped:
        answer.print("[yellow]Skipped: " + "; ".join(f"{s['test']} ({s['reason']})" for s in res.skipped) + "[/]")
    answer.print(f"\n{len(res.rows)} rows in {time.perf_counter() - t_enter:.0f} s ({phases})", highlight=False)
    console.print(wrote(*paths), highlight=False)
    if res.errors:
        console.print(f"[red]{len(res.errors)} test(s) failed:[/] " + "; ".join(f"{e['test']}: {e['error']}" for e in res.errors))
        return 1
    return 0


def _probe_under(args, prof, out: Path) -> int:
    """The probe again, in a child process started under the emulator."""
    rest = ["probe", "--device", str(args.device), "--out", str(out), "--timer", apply_timer(args)]
    rest += ["--quick"] if args.quick else []
    rest += ["--tests", args.tests] if args.tests else []
    cmd = launcher.python_cmd(*rest)
    launcher.check(prof, cmd, args.record)
    print(launcher.announce(prof, who="ccbridge probe"), file=sys.stderr)
    return launcher.run(prof, cmd, trace=args.record)


def cmd_profiles(args) -> int:
    if args.overrides and not args.name:
        raise UsageError("--set changes one profile: name it (ccbridge profiles NAME --set KEY=VALUE)")
    if not args.name:
        for p in [profiles.load(n) for n in profiles.names()]:
            print(f"{p.name:<12} {p.title}")
        print("\n`ccbridge profiles NAME` shows each parameter, what it is and where its value comes from.")
        return 0

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


def cmd_calibrate(args) -> int:
    prof = profiles.override(profiles.load(args.profile), args.overrides)
    out = ui.writable_folder(args.out or ui.run_folder(f"calibrate-{prof.name}-"), "--out", fresh=("calibration.json",))
    if args.rounds is not None and args.emulated is not None:
        raise UsageError("--rounds repeats native and emulated runs; with --emulated given this command runs no "
                         "emulated probe")
    # Given results are read and checked first: a bad one fails now, not after a probe run of minutes.
    given = {k: calibrate.check_side(results.load(p), k, prof, f"--{k} {p}")
             for k, p in (("native", args.native), ("emulated", args.emulated)) if p is not None}
    if len(given) < 2:
        _gpu_for_probes()
    if "emulated" not in given:
        launcher.check(prof, launcher.python_cmd())
    timer = apply_timer(args)  # both sides' probes time the GPU the same way

    def probe(kind: str, tests: str, folder: Path):
        """One probe run, natively or under the profile; its result, checked."""
        cmd = launcher.python_cmd("probe", "--tests", tests, "--device", str(args.device), "--timer", timer,
                                  *([] if args.full else ["--quick"]), "--out", str(folder))
        rc = subprocess.call(cmd) if kind == "native" else launcher.run(calibrate.probe_profile(prof), cmd)
        if not (folder / "result.json").exists():
            raise UsageError(f"the {kind} probe run exited with status {rc} and wrote no result (its message is above)")
        return calibrate.check_side(results.load(folder / "result.json"), kind, prof, f"the {kind} probe run")

    for kind in ("native", "emulated"):
        if kind not in given:
            print(launcher.banner(prof, who="ccbridge calibrate: emulated probe run") if kind == "emulated"
                  else "ccbridge calibrate: native probe run", file=sys.stderr)
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
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.md").write_text(calibrate.render(prof, checks, native, emulated))
    (out / "calibration.json").write_text(json.dumps(calibrate.to_json(checks), indent=1))
    print(calibrate.render_text(prof, checks, native, emulated))
    print(wrote(out / "calibration.md", out / "calibration.json"), file=sys.stderr)
    return 1 if any(c.ok is False for c in checks) else 0  # a row out of range is the no; n/a is not


def _gpu_for_probes() -> None:
    """calibrate's probe runs measure GPU rows: without a GPU it says so now, not after a CPU-only probe run."""
    try:
        count, why = core.device_count(), "the CUDA driver sees no GPU"
    except GpuError as e:
        count, why = 0, str(e)
    if not count:
        raise UsageError(cut(f"{registry.briefly(why)}; without a GPU give --native and --emulated results", 100))


def add_parsers(sub) -> None:
    p = command(sub, "probe", cmd_probe, help="measure the bridge; writes result.json, report.md, report.html")
    add_timer(p)
    p.add_argument("--tests", help="comma list of test or family names (see --list); default all")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (under a minute)")
    p.add_argument("--device", type=integer(0), default=0, help="CUDA device index (default 0)")
    p.add_argument("--out", help="output folder (default ccbridge-results/<timestamp>)")
    p.add_argument("--list", action="store_true", help="list the registered tests and exit")
    p.add_argument("--profile", help="run the probe under the emulator with this profile (see `ccbridge profiles`)")
    p.add_argument("--record", metavar="T", help="record every crossing, launch and synchronize to T.<pid>.csv "
                   "(with --profile: emulated; without: native)")
    add_set(p)

    p = command(sub, "profiles", cmd_profiles, help="list emulator profiles; with NAME, each parameter and its source")
    p.add_argument("name", nargs="?", help="a profile's name (b300, h200, ...) or a .json profile file: each "
                   "parameter, what it is and where its value comes from")
    add_set(p)

    p = command(sub, "calibrate", cmd_calibrate,
                help="emulated probe vs native probe vs the profile's published targets")
    add_timer(p)
    p.add_argument("--profile", required=True, help="the emulator profile to calibrate: a name or a .json file "
                   "(see `ccbridge profiles`)")
    p.add_argument("--native", help="use this native result.json instead of running the probe")
    p.add_argument("--emulated", help="use this emulated result.json instead of running the probe")
    p.add_argument("--full", action="store_true", help="full probe suite instead of --quick")
    p.add_argument("--rounds", type=integer(1, 20),
                   help="pairs of native and emulated runs of the delta tests (launch, 32-byte D2H), alternating; "
                        f"the delta checks take their median (default {DEFAULT_ROUNDS}; not with --emulated)")
    p.add_argument("--device", type=integer(0), default=0, help="CUDA device index of the probe runs (default 0)")
    p.add_argument("--out", help="output folder (default ccbridge-results/calibrate-<profile>-<timestamp>)")
    add_set(p)
