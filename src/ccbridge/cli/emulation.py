"""Programs under the emulator or recorded: run, the traces they leave, and account of what grew."""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ccbridge import account, account_ranks, env, environ, ui
from ccbridge.bindings import core
from ccbridge.cli.args import add_set, command, integer, what_if
from ccbridge.cli.reports import write_reports, wrote
from ccbridge.emulate import coverage, launcher, profiles, recorded, runs, targets, trace
from ccbridge.errors import EmulatorError, UsageError
from ccbridge.results import Result, Row
from ccbridge.textfit import cut, wrap


def cmd_run(args) -> int:
    cmd = args.program[1:] if args.program[:1] == ["--"] else args.program
    if args.sites and not args.record:
        raise UsageError("--sites notes call sites beside a trace: give --record T too")
    if not args.profile and not args.record and not args.coverage and not args.project:
        raise UsageError("give --profile NAME (emulate), --record T (record only), --coverage FILE or --project GPU")
    prof = what_if(args, "passthrough")  # without a profile: the interposer records, adds no cost
    proj = projection(args)
    launcher.check(prof, cmd, args.record, args.coverage)
    print(launcher.announce(prof, proj, projecting=bool(args.project)), file=sys.stderr)
    ran = launcher.launch(prof, cmd, trace=args.record, coverage=args.coverage, sites=args.sites, projection=proj)
    if args.record:
        print(trace.render(trace.summarize(str(Path(args.record).resolve()), recorded=True)), file=sys.stderr)
    if ran.coverage is not None:  # the report written, as written (FILE may be a stream: never read back)
        print(coverage.render(ran.coverage), file=sys.stderr)
    return ran.rc


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
    rest = args.args[1:] if args.args[:1] == ["--"] else args.args
    out = ui.writable_folder(args.out or ui.run_folder("account-"), "--out", fresh=("result.json",))
    prof = what_if(args)
    proj = getattr(args, "projected", None)  # the second pass of --project: both runs in dilated time
    if args.project and not prof:
        raise UsageError("--project goes with --profile NAME -- CMD (it runs CMD again as the target would)")
    if args.repeat > 1 and not prof:
        raise UsageError("--repeat goes with --profile NAME -- CMD (trace pairs: give BASE1 OTHER1 BASE2 OTHER2 ...)")
    if args.warmup and not prof:
        raise UsageError("--warmup goes with --profile NAME -- CMD (it runs CMD once, untraced, before the traced "
                         "runs)")
    if proj is None:
        args.target = projection(args)  # made (or refused) now, before the first run; the second pass runs as it
    if prof:
        pairs, runs_at, each = _record(args, prof, proj, rest, out)
    else:
        if args.no_sites:
            raise UsageError("--no-sites goes with --profile NAME -- CMD (traces keep the sites they were recorded with)")
        if not rest or len(rest) % 2:
            raise UsageError("give two trace prefixes (BASE OTHER, from `ccbridge run --record`), "
                             "or --profile NAME -- CMD")
        prefixes = [str(Path(x).resolve()) for x in rest]
        pairs, runs_at = list(zip(prefixes[::2], prefixes[1::2])), [(None, None)] * (len(rest) // 2)
        each = [_summaries(list(pair), rest, emulated=False) for pair in pairs]
        for (b, o), j in zip(each, range(0, len(rest), 2)):  # before any work: every figure would be backwards
            if b.emulated and not o.emulated:
                raise UsageError(f"BASE {rest[j]} ran emulated, OTHER {rest[j + 1]} did not: give the native "
                                 "(CC-off or record-only) trace first")
    both = [runs.merge([e[i] for e in each]) for i in (0, 1)]
    base, other = both[0][0], both[1][0]
    walls = [_summed(side) for side in zip(*map(_walls, runs_at))]
    # each side's phases, the runs summed (launch -> first call -> last call -> exit; none for traces given)
    times = [runs.phases([account.phase_times(e[i], at[i]) for e, at in zip(each, runs_at)]) for i in (0, 1)]
    where = account.by_phase(*times)
    emulated_as, settings = _settings(args, base, other, pairs, rest, proj)
    stamp, unlike = (None, None) if prof else _recorded(each, settings)
    summed = _Runs(each, runs_at, out if prof else None, list(dict.fromkeys(both[0][1] + both[1][1])),
                   stamp["env"] if stamp else env.stamp())
    if unlike:  # before the work that can refuse: it says what the traces are
        _note(unlike)
    cold = _cold_start(times[0]["start-up"], times[1]["start-up"], len(each), args.warmup) if where else None
    if account_ranks.multi_process(base, other):
        return _account_ranks(args, base, other, where, prof, out, emulated_as, settings, summed, cold)
    of, base_s = _share_of(base, other, walls, where)
    shares = account.measurable(of, base_s)  # a slowdown within noise (or none) gets no shares
    lines, wall = account.attribute(base, other, *walls, share_of_s=of if shares else 0.0)
    at_sites = account.attribute_sites(base, other, of if shares else 0.0)
    res = Result(kind="account", env=summed.env, settings=settings,
                 rows=_noted(account.rows(lines, wall, at_sites, where, spans=not args.profile, base_s=base_s), cold)
                 + summed.rows())
    paths = write_reports(res, out)
    print("\n".join([account.render(lines, wall, where=where, emulated=emulated_as, shares=shares, base_s=base_s)]
                     + summed.text()))
    for x in summed.notes + ([cold] if cold else []):
        _note(x)
    if not shares:
        _note(f"OTHER was not measurably slower than BASE ({of * 1e3:+.1f} ms of {base_s * 1e3:.1f} ms"
              f"{' between the first and the last driver call' if where else ''}): no shares, nothing to recover")
    if at_sites:
        print(account.render_sites(at_sites))
    elif base.by_site or other.by_site:
        print(f"no per-site table: only {'the base' if base.by_site else 'the other'} trace noted call sites "
              "(record both with --sites)")
    if args.why:
        print(account.render_why(lines, at_sites))
    print(wrote(*paths), file=sys.stderr)
    return _then_projected(args, out)


def _record(args, prof, proj, rest: list[str], out: Path) -> tuple[list[tuple[str, str]], list[tuple], list]:
    """CMD natively, then under the emulator, args.repeat times (B1 O1 B2 O2 ...: a drift of the host's speed
    falls on both sides alike): each run's trace prefixes, its launch and end times (ns) and its summaries."""
    k = args.repeat
    sides = [(profiles.load("passthrough"), "native"), (prof, "emulated")]
    at = [out] if k == 1 else [out / f"run{j}" for j in range(1, k + 1)]  # one pair: out/native, out/emulated
    pairs = [tuple(str(d / name) for _, name in sides) for d in at]
    for pair in pairs:  # every run's, before the first starts (an old trace at any prefix refuses the run)
        for prefix in pair:
            launcher.refuse_old_trace(prefix)
    for p, _ in sides:  # (the driver last: bad input is named first)
        launcher.check(p, rest, needs_driver=True)
    runs_at: list[tuple] = []
    with contextlib.ExitStack() as made:  # the traces go there; a run that fails takes empty folders away again
        # CMD runs 2 x repeat times: a file it writes (its --json) may be written again by a later run of this
        # account, never a file from before it (ui.writable_file)
        made.enter_context(environ.setting({"CCBRIDGE_ACCOUNT_SINCE": str(time.time_ns())}))
        for d in at:
            made.enter_context(ui.made_folder(d))
        if args.warmup:
            _warm_up(rest)
        for j, pair in enumerate(pairs, 1):
            when = []
            for i, ((p, name), prefix) in enumerate(zip(sides, pair)):
                label = f"run {i + 1} of 2" if k == 1 else f"run {j} of {k}: {name}"
                print(launcher.banner(p, proj, f"ccbridge account: {label}"), file=sys.stderr)
                rc, t = launcher.run_timed(p, rest, trace=prefix, sites=not args.no_sites, projection=proj)
                if rc:
                    raise UsageError(f"{cut(' '.join(rest), 40)} {_ended(rc)} in run "
                                     f"{i + 1 if k == 1 else f'{j} of {k} ({name})'}; nothing to compare")
                when.append(t)
            runs_at.append(tuple(when))
        # read inside: a command that made no driver call takes the folders away again
        return pairs, runs_at, [_summaries(list(pair), rest, emulated=True) for pair in pairs]


def _warm_up(rest: list[str]) -> None:
    """--warmup: CMD once before the traced runs, natively, with no interposer and no trace (its environment is
    theirs, less the interposer's), so that the first traced run does not read its libraries from a cold page
    cache; it counts in nothing."""
    print("ccbridge account: warm-up run: natively, no interposer, untraced; it counts in no figure", file=sys.stderr)
    try:
        rc = subprocess.call(rest)
    except OSError as e:  # checked before; what is left: it changed since, or exec refused it
        raise EmulatorError(f"cannot run {rest[0]}: {e.strerror or e}") from None
    if rc:
        raise UsageError(f"{cut(' '.join(rest), 40)} {_ended(rc)} in the warm-up run; nothing to compare")


# An emulated run only adds costs, so OTHER's start-up (launch to first traced driver call) is never shorter than
# BASE's but by noise: a process's start-up and imports move by about 0.1 s from one run to the next on a loaded
# host, and by a share of a long start-up. Shorter beyond the larger of these, the runs differed in more than the
# bridge. A small decode loop's native run on an H200 host (bench/RESULTS.md, session 27): 2.0 s longer as the
# lease's first torch program (a cold page cache), still 0.8 s longer after a run of it before the account: which
# first-run cost that is (the driver, the GPU waking, the host) the traces do not say, so the note names none.
COLD_START = (0.2, 0.15)  # s a run, and a fraction of BASE's start-up: the larger is the noise allowed


def _cold_start(base: float, other: float, k: int, warmed: bool) -> str | None:
    """Where OTHER's start-up (launch to first driver call, s, summed over k runs) is shorter than BASE's beyond
    COLD_START (its seconds k times: each run's start-up has its own noise): a note that says so; else None."""
    if base - other <= max(COLD_START[0] * k, COLD_START[1] * base):
        return None
    why = ("CMD ran once before them (--warmup), so not only the page cache: the driver, the GPU or the host's "
           "speed" + ("; --repeat K averages it" if k == 1 else "") if warmed else "a cold page cache for CMD's "
           "libraries in the first run, the driver, the GPU or the host's speed; --warmup (or a run of CMD before the "
           "account) evens the first")
    return (f"OTHER's start-up (launch to first driver call) took {other * 1e3:.1f} ms, BASE's {base * 1e3:.1f} ms"
            f"{' (the runs summed)' if k > 1 else ''}: an emulated run is never faster than the native one, "
            f"so the runs differ in more than the bridge: {why}")


def _noted(rows: list[Row], cold: str | None) -> list[Row]:
    """rows, the start-up phase's row given the cold-start note (its verdict, which the reports show)."""
    for r in rows if cold else []:
        if r.test == "account.phase" and r.params.get("phase") == "start-up":
            r.extra["verdict"] = cold
    return rows


def _note(text: str) -> None:
    """A note beside an account's tables, on stderr, in 120 columns."""
    print("\n".join(wrap([f"note: {text}"])), file=sys.stderr)


def _walls(at: tuple) -> list:
    """A run's BASE and OTHER wall times (s) from their launch and end (ns; None: not known)."""
    return [(r[1] - r[0]) / 1e9 if r else None for r in at]


def _summed(values) -> float | None:
    """Values of several runs summed; None where one is not known."""
    return None if any(v is None for v in values) else sum(values)


def _share_of(base, other, walls: list, where: dict) -> tuple[float, float]:
    """The slowdown the shares are of (s), and the base time it is measured against (s)."""
    of = account.share_base(account.wall_slowdown(base, other, *walls), where)
    return of, (base.last_ns - base.first_ns) / 1e9 if where else (walls[0] or base.span_ns / 1e9)


def _settings(args, base, other, pairs: list[tuple[str, str]], rest: list[str], proj) -> tuple[str | None, dict]:
    """What the account ran under (None: native) and its Result's settings. Two traces given: what their own
    headers say they ran under is what the rows are made of; either emulated makes every figure an emulated one
    (a BASE emulated and OTHER not is refused before: cmd_account)."""
    emulated_as = args.profile or (", ".join(sorted((base.profiles | other.profiles) - {"passthrough"}))
                                   if base.emulated or other.emulated else None)
    return emulated_as, {"base": pairs[0][0], "other": pairs[0][1], "profile": emulated_as,
                         "overrides": args.overrides, "command": rest if args.profile else None,
                         "projection": proj.as_dict() if proj else None,
                         **({"runs": [list(p) for p in pairs]} if len(pairs) > 1 else {})}


@dataclass
class _Runs:
    """The runs an account summed (--repeat K, or K trace pairs given), each run's own share beside the sums: a
    host speed that moved between one run and the next shows as their spread."""
    each: list  # each run's (BASE, OTHER) summaries
    runs_at: list  # each run's (BASE's, OTHER's) launch and end (ns; None: traces given)
    at: Path | None  # the folder that holds run1, run2, ... (None: trace pairs given)
    notes: list[str]  # on what of the runs could not be summed
    env: dict  # the result's stamp: this machine's where it ran CMD, else the one that recorded OTHER (_recorded)

    def shares(self, ranks: list | None) -> dict[str, list]:
        """Per rank (and all ranks: "all"), each run's explained share (None: no measurable slowdown); ranks None:
        of one process, the share of the span's slowdown its driver calls hold, under "all"."""
        out: dict[str, list] = {}
        for (b, o), at in zip(self.each, self.runs_at):
            if ranks is None:
                walls = _walls(at)
                where = account.phases(b, o, *at)
                of, base_s = _share_of(b, o, walls, where)
                net = account.net_in_calls_s(account.attribute(b, o, *walls, share_of_s=of)[0])
                out.setdefault("all", []).append(net / of if account.measurable(of, base_s) else None)
                continue
            mine = account_ranks.per_rank(b, o)[0]
            mine = {(a.job, a.rank): a for a in mine + ([account_ranks.overall(b, o, mine)] if mine else [])}
            for a in ranks:
                got = mine.get((a.job, a.rank))
                out.setdefault(a.name, []).append(got.explained_ms / got.slowdown_ms if got and got.measurable
                                                  else None)
        return out

    def rows(self, ranks: list | None = None) -> list[Row]:
        """account.run rows: each run's own explained share (none where that run had no measurable slowdown)."""
        if len(self.each) == 1:
            return []
        out = []
        for name, shares in self.shares(ranks).items():
            for j, v in enumerate(shares, 1):
                if v is not None:
                    out.append(Row.of("account.run", "explained_share", "fraction", [v], run=j, rank=name))
                    out[-1].extra["what"] = "this run's own share of its slowdown the calls explain (the sums: above)"
        return out

    def text(self, ranks: list | None = None) -> list[str]:
        """The line that says the runs were summed, with each run's own share; nothing for one run."""
        k = len(self.each)
        if k == 1:
            return []
        how = (f"{k} runs, BASE and OTHER alternately (traces in {self.at}/run1 .. run{k})" if self.at else
               f"{k} trace pairs")
        each = "; ".join(f"{'rank ' if name != 'all' else ''}{name} " + " ".join("-" if v is None else f"{v:.0%}"
                                                                                for v in shares)
                         for name, shares in self.shares(ranks).items())
        what = "explained" if ranks is not None else "held by the driver calls"
        return wrap([f"summed over {how}: every figure above is of the sums; each run's own share {what}: {each}"])


def _then_projected(args, out: Path) -> int:
    """With --project: the same account again, both runs in dilated time as the target GPU (out/projected)."""
    if not args.project or getattr(args, "projected", None) is not None:
        return 0
    proj = args.target
    print(f"\n{proj.describe()}: the same account as the target would pay it; times are dilated (divide by "
          f"{proj.r:.3g}), shares read directly")
    again = argparse.Namespace(**vars(args))
    again.projected, again.out = proj, str(out / "projected")
    again.warmup = False  # CMD's libraries are in the page cache: the account before ran it
    return cmd_account(again)


def _account_ranks(args, base, other, where, prof, out: Path, emulated_as: str | None, settings: dict,
                   summed: _Runs, cold: str | None) -> int:
    """A job of several ranks: each rank on its job's steady-state window, then all of them summed; the start-up
    and teardown phases apart, never in the shares. Several runs: each rank's windows and calls summed over them."""
    ranks, notes = account_ranks.per_rank(base, other)
    notes = summed.notes + notes
    if not ranks:
        raise UsageError("no rank of the job could be compared" + (f": {notes[0]}" if notes else ""))
    every = ranks + [account_ranks.overall(base, other, ranks)]
    rows = account_ranks.rank_rows(every) + _noted([Row.of("account.phase", "slowdown", "s", [v], phase=k)
                                              for k, v in where.items()], cold)
    rows += summed.rows(every)
    res = Result(kind="account", env=summed.env, settings=dict(settings, ranks=[a.rank for a in ranks]), rows=rows)
    paths = write_reports(res, out)
    if emulated_as:
        print(f"EMULATED: OTHER ran under the emulator (profile {emulated_as}); no figure below is a CC hardware "
              "measurement")
    factor = prof.params["mgpu_launch_factor"].value if prof else None
    print("\n".join([account_ranks.render_ranks(every, notes, factor)] + summed.text(every)))
    if where:
        runs = " (the runs summed)" if len(summed.each) > 1 else ""
        print(f"outside the windows, not in any share{runs}: " +
              ", ".join(f"{k} {v * 1e3:+.1f} ms" for k, v in where.items() if k != "driver calls"))
    if cold:
        _note(cold)
    if args.why:
        for a in every:
            print(f"rank {a.name}:\n" + account.render_why(a.lines))
    print(wrote(*paths), file=sys.stderr)
    return _then_projected(args, out)


def _recorded(each: list, settings: dict) -> tuple[dict | None, str | None]:
    """Traces given: where each was recorded (its stamp, emulate/recorded.py), kept in settings "recorded" (BASE1,
    OTHER1, BASE2, ...); the stamp the result carries: OTHER's (the run whose cost it accounts: its machine, CC
    mode, emulation), else BASE's (None: no trace has one, and the result is this machine's, as its reports say);
    a note where they were not all recorded alike."""
    k = len(each)
    names = [f"{side}{j if k > 1 else ''}" for j in range(1, k + 1) for side in ("BASE", "OTHER")]
    found = [s.stamp for pair in each for s in pair]
    settings["recorded"] = [recorded.entry(n, st) for n, st in zip(names, found)]
    stamp = next((st for st in found[1::2] + found[0::2] if st), None)
    return stamp, recorded.differ(settings["recorded"])


def _summaries(prefixes: list[str], rest: list[str], emulated: bool):
    """The two traces' summaries; a trace without a driver call is refused (nothing to attribute)."""
    out = [trace.summarize(x, recorded=emulated) for x in prefixes]  # emulated: _record just ran CMD there
    for x, s in zip(prefixes, out):
        if not s.by_api and emulated:
            raise UsageError(f"{cut(' '.join(rest), 40)} made no CUDA driver call: nothing to attribute")
        if not s.by_api:  # files there (summarize refuses a prefix without any), but no driver call in them
            raise UsageError(f"the trace at {x} holds no CUDA driver call (its program made none): nothing to "
                             "attribute")
    return out


def cmd_trace(args) -> int:
    print(trace.render(trace.summarize(args.prefix)))  # a prefix without files is refused there, in one line
    return 0


def add_project(p) -> None:
    p.add_argument("--project", metavar="GPU", help="run in dilated time as this faster GPU would (b300, b200, h200, "
                   "...; see README, Projection): every figure PROJECTED, a model")
    p.add_argument("--project-by", metavar="BY", default="hbm", help="the ratio r: hbm (datasheet memory bandwidth, "
                   "default: decode is memory-bound), flops (dense BF16), hbm:F (F of this GPU's busy time at its HBM "
                   "roofline, the rest as flops: `bench decode --tp` measures F, its hbm_share row) or a number")


def projection(args):
    """The --project of a command (None without it), checked now: its ratio below 1 is refused in one line."""
    if not args.project:
        if args.project_by != "hbm":
            raise UsageError("--project-by goes with --project GPU")
        return None
    name, by = (env.nvml_info().get("gpus") or [{}])[0].get("name"), targets.parse_by(args.project_by)
    if name is None and not isinstance(by, float) and core.driver_missing():
        # no GPU: no datasheet ratio to take, and nothing a projection would dilate (the run says it is not PROJECTED)
        targets.target(args.project)  # an unknown target is bad input all the same
        return None
    return targets.project(args.project, name, by)


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
    add_project(p)
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]", help="the program to run")

    p = command(sub, "account", cmd_account,
                help="which calls a workload's CC tax goes to: two traces compared, or CMD natively vs emulated (ccbridge "
                     "account --profile b300 -- CMD)")
    p.add_argument("--profile", help="record CMD natively, then under this emulator profile, and compare (both "
                                     "runs note Python call sites unless --no-sites)")
    p.add_argument("--no-sites", action="store_true", help="with --profile: per API only, no Python call sites "
                                                           "(no profile hook in CMD)")
    add_set(p)
    p.add_argument("--repeat", type=integer(1), default=1, metavar="K",
                   help="with --profile: run CMD natively and emulated K times, alternately, each run's traces in "
                        "OUT/runJ, and account each rank over the K runs summed (a host whose speed moves from one "
                        "process to the next averages out; it costs 2K runs; default 1)")
    p.add_argument("--warmup", action="store_true",
                   help="with --profile: run CMD once first, natively and untraced, so that the first traced run "
                        "does not read its libraries from a cold page cache (a cost the emulated run after it would "
                        "not pay); it counts in nothing")
    p.add_argument("--out", help="output folder (default ccbridge-results/account-<timestamp>)")
    p.add_argument("--why", action="store_true", help="also print the evidence behind each row (waits, tolls, "
                                                      "GPU time, the full recovery and call site)")
    add_project(p)
    p.add_argument("args", nargs="*", help="BASE OTHER (trace prefixes; several pairs, BASE1 OTHER1 BASE2 OTHER2 ..., "
                                           "are summed as runs), or -- CMD [ARGS...] with --profile")

    p = command(sub, "trace", cmd_trace, help="per-API accounting of a trace of `ccbridge run --record T`: crossings, "
                "bytes, time blocked, waiting for the stream or the channel")
    p.add_argument("prefix", metavar="T", help="the trace prefix given to --record (its files: T.<pid>.csv and "
                                               "T.<pid>.summary.json)")
