"""`ccbridge advise`: the CC-mode-aware settings for the stacks people run, from files ccbridge wrote.

Each input is an env stamp (`ccbridge env --json`) or a result of a kind advise reads: probe (`ccbridge
probe`), account (`ccbridge account`), decode (`ccbridge bench decode`), decode_tp (`bench decode --tp`) or
kv (`ccbridge bench kv`); the result names its kind and one module here advises from each. Every
recommendation names the stack, the setting, why (the row key, its median and unit: the number behind it)
and whether that number is EMULATED. A stamp alone carries no number: it says whether CC-aware settings
apply at all, and what to measure.

core holds the input and advice types and their three renderings; a kind's module holds check(inp) (what
advise needs of the file beyond its schema, before any advice is printed) and advise(inp); decode and
decode_tp also pairs(inputs), advice from a CC-off result beside a CC one of the same run.
"""

from __future__ import annotations

from pathlib import Path

from ccbridge import results
from ccbridge.advise import account, decode, decode_tp, kv, probe
from ccbridge.advise.core import Advice, Cite, Input, render, render_why, to_json
from ccbridge.errors import ResultFileError

__all__ = ["Advice", "Cite", "Input", "READERS", "advise", "read", "render", "render_why", "to_json"]

# input kind -> the module that advises from it ("env": a bare env stamp)
READERS = {"env": probe, "probe": probe, "account": account, "decode": decode, "decode_tp": decode_tp, "kv": kv}
PAIRS = (decode.pairs, decode_tp.pairs)  # advice from two inputs together


def read(path: str | Path) -> Input:
    """One input file, by its kind; every defect is a ResultFileError naming the file."""
    p = Path(path)
    stamp, res = results.read_stamped(p, "pass a result.json or an env stamp")
    if res is None:
        if "emulation" not in stamp:
            raise ResultFileError(f"{p}: not a ccbridge result or env stamp (`ccbridge env --json`)")
        inp = Input(str(p), "env", stamp, None, bool(stamp["emulation"].get("active")))
    elif res.kind not in READERS:
        kinds = [k for k in READERS if k != "env"]
        raise ResultFileError(f"{p}: a {res.kind} result: advise reads env stamps and {', '.join(kinds[:-1])} "
                              f"and {kinds[-1]} results")
    else:
        # an account's OTHER ran under the emulator where it names a profile (its stamp may be the parent's)
        inp = Input(str(p), res.kind, res.env, res, results.emulated_as(res) is not None)
    READERS[inp.kind].check(inp)
    return inp


def advise(paths: list[str]) -> tuple[list[Input], list[Advice]]:
    inputs = [read(p) for p in paths]  # every file checked before any advice
    out: list[Advice] = []
    for inp in inputs:
        out += READERS[inp.kind].advise(inp)
    for pairs in PAIRS:
        out += pairs(inputs)
    return inputs, out
