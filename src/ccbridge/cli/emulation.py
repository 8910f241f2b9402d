"""Programs under the emulator or recorded: run, the traces they leave, and account of what grew."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import sys
from pathlib import Path

from ccbridge import ui
from ccbridge.cli.args import add_set, command, what_if
from ccbridge.cli.reports import write_reports, wrote
from ccbridge.errors import UsageError
from ccbridge.textfit import cut


def cmd_run(args) -> int:
    from ccbridge.emulate import launcher, trace

    cmd = args.program[1:] if args.program[:1] == ["--"] else args.program
    if args.sites and not args.record:
        raise UsageError("--sites notes call sites beside a trace: give --record T too")
    if not args.profile and not args.record and not args.coverage:
        raise UsageError("give --profile NAME (emulate), --record T (record only) or --coverage FILE")
    prof = what_if(args, "passthrough")  # without a profile: the interposer records, adds no cost
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
    from ccbridge.emulate import launcher, profiles
    from ccbridge.results import Result

    rest = args.args[1:] if args.args[:1] == ["--"] else args.args
    out = ui.writable_folder(args.out or Path("ccbridge-results") / f"account-{dt.datetime.now():%Y%m%d-%H%M%S}", "--out",
                             fresh=("result.json",))
    runs_at: list[tuple[int, int] | None] = [None, None]  # each run's launch and end (ns)
    prof = what_if(args)
    if prof:
        runs = [(profiles.load("passthrough"), str(out / "native")), (prof, str(out / "emulated"))]
        for p, prefix in runs:  # both, before the first starts (an old trace at either refuses the run)
            launcher.check(p, rest)
            launcher.refuse_old_trace(prefix)
        prefixes = [prefix for _, prefix in runs]
        with ui.made_folder(out):  # the traces go there; a run that fails takes an empty folder away again
            for i, (p, prefix) in enumerate(runs):
                print(launcher.banner(p, f"ccbridge account: run {i + 1} of 2"), file=sys.stderr)
                rc, runs_at[i] = launcher.run_timed(p, rest, trace=prefix, sites=not args.no_sites)
                if rc:
                    raise UsageError(f"{cut(' '.join(rest), 40)} {_ended(rc)} in run {i + 1}; nothing to compare")
            base, other = _summaries(prefixes, rest, emulated=True)
    else:
        if args.no_sites:
            raise UsageError("--no-sites goes with --profile NAME -- CMD (traces keep the sites they were recorded with)")
        if len(rest) != 2:
            raise UsageError("give two trace prefixes (BASE OTHER, from `ccbridge run --record`), "
                             "or --profile NAME -- CMD")
        prefixes = [str(Path(x).resolve()) for x in rest]
        base, other = _summaries(prefixes, rest, emulated=False)
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
    paths = write_reports(res, out)
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
    print(wrote(*paths), file=sys.stderr)
    return 0


def _summaries(prefixes: list[str], rest: list[str], emulated: bool):
    """The two traces' summaries; a trace without a driver call is refused (nothing to attribute)."""
    from ccbridge.emulate import trace

    out = [trace.summarize(x) for x in prefixes]
    for x, s in zip(prefixes, out):
        if not s.by_api:
            raise UsageError(f"{cut(' '.join(rest), 40)} made no CUDA driver call: nothing to attribute" if emulated
                             else f"no trace lines under {x}.<pid>.csv: record with `ccbridge run --record {x} -- CMD`")
    return out


def cmd_trace(args) -> int:
    from ccbridge.emulate import trace

    s = trace.summarize(args.prefix)
    if not s.processes and not s.by_api:
        raise UsageError(f"no trace files {args.prefix}.<pid>.csv or .summary.json")
    print(trace.render(s))
    return 0


def add_parsers(sub) -> None:
    p = command(sub, "run", cmd_run,
                help="run a program under the emulated CC bridge: ccbridge run --profile b300 -- CMD; or record it: "
                     "ccbridge run --record T -- CMD")
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
    add_set(p)
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]", help="the program to run")

    p = command(sub, "account", cmd_account,
                help="which calls a workload's CC tax goes to: two traces compared, or CMD natively vs emulated (ccbridge "
                     "account --profile b300 -- CMD)")
    p.add_argument("--profile", help="record CMD natively, then under this emulator profile, and compare (both "
                                     "runs note Python call sites unless --no-sites)")
    p.add_argument("--no-sites", action="store_true", help="with --profile: per API only, no Python call sites "
                                                           "(no profile hook in CMD)")
    add_set(p)
    p.add_argument("--out", help="output folder (default ccbridge-results/account-<timestamp>)")
    p.add_argument("--why", action="store_true", help="also print the evidence behind each row (waits, tolls, "
                                                      "GPU time, the full recovery and call site)")
    p.add_argument("args", nargs="*", help="BASE OTHER (trace prefixes), or -- CMD [ARGS...] with --profile")

    p = command(sub, "trace", cmd_trace, help="summarise an emulator trace (TRACE.<pid>.csv files)")
    p.add_argument("prefix")
