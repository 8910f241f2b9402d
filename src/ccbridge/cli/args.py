"""What every command's parser shares: the parser class, argument types, --set and the profile it changes."""

from __future__ import annotations

import argparse
import os
import shutil

from ccbridge import gputimer
from ccbridge.emulate import profiles
from ccbridge.errors import UsageError
from ccbridge.load.loader import check_device
from ccbridge.load.synth import parse_size
from ccbridge.textfit import WIDTH  # columns of --help and of every line, at most (a narrower terminal: its own)


class HelpFormatter(argparse.HelpFormatter):
    def __init__(self, prog, **kw):
        kw.setdefault("width", min(shutil.get_terminal_size().columns, WIDTH) - 2)  # argparse's own margin
        super().__init__(prog, **kw)


class Parser(argparse.ArgumentParser):
    """argparse whose errors read like every other: one line `ccbridge CMD: reason`, exit 2, and whose --help
    fits WIDTH. Subcommands' parsers (and theirs) are of this class too: add_subparsers makes them the parent's."""

    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kw)

    def error(self, message):
        head, choose, choices = message.partition(" (choose from ")
        if choose and len(f"{self.prog}: {message}") > WIDTH:  # argparse lists every choice: those that fit, ...
            shown = choices[:-1].split(", ")
            while shown and len(f"{self.prog}: {head}{choose}{', '.join(shown)}, ...)") > WIDTH:
                shown.pop()
            message = f"{head}{choose}{', '.join(shown)}, ...)"
        self.exit(2, one_line(self.prog, message, hint=f" (see {self.prog} --help)") + "\n")


def one_line(prog: str, message: str, hint: str = "") -> str:
    """An error as the one line `prog: message` a user sees, the hint added where it still fits WIDTH columns.
    (The messages fit WIDTH with paths of a few words; a longer path the user gave is echoed whole.)"""
    line = f"{prog}: {message}"
    return line + hint if len(line + hint) <= WIDTH else line


def command(sub, name: str, fn, **kw) -> Parser:
    """A subcommand's parser, with its handler and its full name (`ccbridge bench kv`) for main's messages. Its
    --help opens with its line of the parent's --help (help) as a sentence, unless given a description of its own."""
    if kw.get("help"):
        kw.setdefault("description", kw["help"][0].upper() + kw["help"][1:] + ".")
    p = sub.add_parser(name, **kw)
    p.set_defaults(fn=fn, prog=p.prog)
    return p


def checked(parse):
    """An argparse type from a parser that raises UsageError, so that argparse names the option."""
    def conv(text):
        try:
            return parse(text)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    conv.__name__ = parse.__name__
    return conv


def _size(text: str) -> int:
    return parse_size(text)


def _device_spec(text: str) -> str:
    return check_device(text)


size = checked(_size)  # bytes: 4GiB, 256M, 8
device_spec = checked(_device_spec)  # cuda, cuda:N or cpu


def integer(lo: int, hi: int | None = None):
    """An argparse type: an integer in lo..hi (no upper bound when hi is None)."""
    def an_integer(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise UsageError(f"not an integer: {text!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise UsageError(f"expected {lo}..{hi}, got {v}" if hi is not None else f"expected at least {lo}, got {v}")
        return v

    return checked(an_integer)


def _float_ge0(text: str) -> float:
    """A finite number >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise UsageError(f"not a number: {text!r}") from None
    if not (v >= 0 and v < float("inf")):
        raise UsageError(f"expected a finite number >= 0, got {text}")
    return v


def _float_gt0(text: str) -> float:
    """A finite number > 0: one message for 0, -5 and inf (the check of >= 0 said "finite number >= 0" of -5)."""
    try:
        v = float(text)
    except ValueError:
        raise UsageError(f"not a number: {text!r}") from None
    if not 0 < v < float("inf"):
        raise UsageError(f"expected a finite number above 0, got {text}")
    return v


float_ge0, float_gt0 = checked(_float_ge0), checked(_float_gt0)


class Distinct(argparse.Action):
    """A list option whose values each make a row or a run: a value given twice, which would make two rows of
    one key, is refused (`--batch 1 is given twice`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:
            raise argparse.ArgumentError(None, f"{'/'.join(self.option_strings)} {twice[0]} is given twice")
        setattr(namespace, self.dest, values)


def what_if(args, default: str | None = None):
    """The profile args names, with its --set what-ifs applied; `default` when none is named
    (None: no profile). --set without a profile is refused here, for every command."""
    if args.overrides and not args.profile:
        raise UsageError("--set changes an emulator profile: it needs --profile")
    name = args.profile or default
    return profiles.override(profiles.load(name), args.overrides) if name else None


def add_timer(p: argparse.ArgumentParser) -> None:
    """--timer: the GPU timer of every GPU-time figure (ccbridge/gputimer.py)."""
    p.add_argument("--timer", choices=("auto", "events", "globaltimer"), help="GPU time from CUDA events or "
                   "%%globaltimer stamps (auto, default: globaltimer where CC is on, events are unreliable there)")


def apply_timer(args) -> str:
    """The GPU timer the run uses (chosen from --timer, $CCBRIDGE_TIMER, the machine), set in this process's
    environment so that every process it starts (ranks, child probes) times the same way."""
    chosen = gputimer.choose(getattr(args, "timer", None))
    os.environ[gputimer.ENV_VAR] = chosen
    return chosen


def add_set(p: argparse.ArgumentParser) -> None:
    """--set KEY=VALUE, repeatable: a what-if on the emulator profile (profiles.override checks it)."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="set a profile parameter for this run, e.g. launch_toll_us=0 (repeatable; "
                        "see `ccbridge profiles NAME`)")
