"""What the serving benches' advice shares (bench decode [--tp], bench kv): the rows a result must hold, when a
run can carry advice at all, and how a choice must beat the engine default to be worth a change."""

from __future__ import annotations

from pathlib import Path

from ccbridge.advise.core import Add, Input, state
from ccbridge.errors import ResultFileError
from ccbridge.results import KINDS, Row

MARGIN = 1.05  # a mode or threshold must beat the engine default by this much to be worth a change (run noise)

# the row each kind's advice stands on, and what a mismatch in it means
HEADLINE = {"decode": "tok_per_s", "decode_tp": "tok_per_s", "kv": "ttft_ms"}
_MISMATCH = {"decode": "its modes generated different tokens", "decode_tp": "its modes generated different tokens",
             "kv": "restored KV gave different first tokens"}


def check(inp: Input) -> None:
    """Headline rows (the reader checked each row's parameters, and that none repeats another); ResultFileError
    naming the file otherwise."""
    p, kind, res = Path(inp.path), inp.kind, inp.result
    metric = HEADLINE[kind]
    if not any(r.metric == metric for r in res.rows):
        raise ResultFileError(f"{p}: no {metric} rows (an interrupted `{KINDS[kind]}`?): nothing to advise")


def more(a: Row, b: Row) -> float:
    """How many times a beats b where more is better (tok/s); medians are positive (the schema checks them)."""
    return a.median / b.median


def less(a: Row, b: Row) -> float:
    """How many times a beats b where less is better (TTFT)."""
    return b.median / a.median


def pick(measured: dict, order: list, gain):
    """The first choice in order (the engine default first, then the least change) within MARGIN of the best
    measured (gain(a, b): how many times a beats b), so run noise never turns into a recommendation."""
    ref = next(iter(measured.values()))
    best = measured[max(measured, key=lambda k: gain(measured[k], ref))]
    return next(k for k in order if k in measured and gain(best, measured[k]) < MARGIN)


def unusable(inp: Input) -> tuple[str, str] | None:
    """Why a serving result can carry no advice (setting, reason), or None: recorded errors, a token
    mismatch, or a CPU run."""
    res = inp.result
    metric = HEADLINE[inp.kind]
    mismatch = any((r.extra.get("mismatches") if inp.kind == "kv" else not r.extra.get("tokens_match", True))
                   for r in res.rows if r.metric == metric)
    if res.errors or mismatch:
        first = res.errors[0].get("error", "") if res.errors else _MISMATCH[inp.kind]
        return (f"none from this run: {_MISMATCH[inp.kind] if mismatch else 'it recorded errors'}",
                f"{state(inp)}; a failed run measures a bug, not a setting (first: {first})")
    if str(inp.settings.get("device", "")).startswith("cpu"):
        return ("none for GPU engines: measured on the CPU, where nothing crosses a bridge",
                f"run `{KINDS[inp.kind]}` on a GPU, natively and under `ccbridge run --profile NAME --`")
    return None


def trustworthy(inp: Input, add: Add) -> bool:
    """A serving result advice can stand on (else the one line saying why)."""
    why = unusable(inp)
    if why:
        add("all", *why)
    return why is None
