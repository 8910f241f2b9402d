"""What every kind's advice is made of: an input file, a line of advice with the rows behind it, and the three
ways of showing them (a 120-column table, --why, --json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ccbridge import env as envmod
from ccbridge import textfit
from ccbridge.results import Result, Row, cc_state, emulated_as, machine_name


@dataclass
class Cite:
    key: str
    median: float
    unit: str

    @classmethod
    def of(cls, row: Row) -> "Cite":
        return cls(row.key(), row.median, row.unit)

    def text(self) -> str:
        return f"{self.key} = {self.median:.4g} {self.unit}"


@dataclass
class Advice:
    stack: str
    setting: str
    why: str
    source: str
    emulated: bool
    cites: list[Cite] = field(default_factory=list)
    brief: str = ""  # the number behind it in a few words, for the 120-column table (why and cites: --why, --json)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# settings nested under the kind's own name (results.KINDS writers: bench decode [--tp], bench kv)
_NESTED = ("decode", "decode_tp", "kv")


@dataclass
class Input:
    path: str
    kind: str  # "env" (a stamp) or the result's kind
    env: dict[str, Any]
    result: Result | None
    emulated: bool

    @property
    def settings(self) -> dict[str, Any]:
        """The run's settings (a serving bench's own, under its kind's name)."""
        s = self.result.settings if self.result else {}
        return s.get(self.kind, {}) if self.kind in _NESTED else s

    def summary(self) -> dict[str, Any]:
        emu = self.env.get("emulation") or {}
        return {"file": self.path, "kind": self.kind, "gpu": machine_name(self.result) if self.result else
                envmod.gpu_name(self.env), "cc_mode": self.cc_mode,
                "tee": (self.env.get("tee") or {}).get("kind", "unknown"),
                "emulated": self.emulated,
                "emulation_profile": (emulated_as(self.result) if self.result else
                                      envmod.emulation_label(emu) if emu.get("active") else None),
                "cc_applies": self.cc_applies}

    @property
    def cc_mode(self) -> str:
        """'on', 'off' or 'unknown' by NVML: an account of traces, as OTHER's was recorded (results.cc_state)."""
        return cc_state(self.result) if self.result else envmod.cc_mode(self.env)

    @property
    def cc_applies(self) -> bool:
        return self.cc_mode == "on" or self.emulated


Add = Callable[..., None]  # add(stack, setting, why, *rows, brief=None): one line of advice


def adder(inp: Input) -> tuple[list[Advice], Add]:
    """A list of advice for one input, and the function that appends to it."""
    out: list[Advice] = []

    def add(stack: str, setting: str, why: str, *rows: Row, brief: str | None = None) -> None:
        cites = [Cite.of(r) for r in rows]
        out.append(Advice(stack, setting, why, inp.path, inp.emulated, cites,
                          brief if brief is not None else _brief(cites)))

    return out, add


def _brief(cites: list[Cite]) -> str:
    """The first number cited, in a few words: its metric and median (fractions as percentages)."""
    if not cites:
        return "no measurement"
    c = cites[0]
    value = f"{c.median:.0%}" if c.unit == "fraction" else f"{c.median:.3g} {c.unit}"
    return f"{c.key.split(':')[1].split('[')[0].replace('_', ' ')} {value}"


def state(inp: Input) -> str:
    """The input's CC state in a few words: emulated, on or off by NVML, or unknown."""
    if inp.emulated:
        return "CC emulated"
    return {"on": "CC on (NVML)", "off": "CC off (NVML)"}.get(inp.cc_mode, "CC state unknown")


def one(rows: list[Row], **params) -> Row | None:
    """The first row with these parameters."""
    return next((r for r in rows if all(r.params.get(k) == v for k, v in params.items())), None)


def _header(inp: Input) -> str:
    s = inp.summary()
    return (f"# {s['file']}: {s['kind']}, {s['gpu']}, {state(inp)}"
            + (f" (profile {s['emulation_profile']})" if s["emulated"] else "")
            + ("" if s["cc_applies"] else ": CC-aware settings do not apply"))


def _label(a: Advice) -> str:
    return "EMULATED" if a.emulated else "measured" if a.cites else "-"


# stack, setting, emulated or measured, the number in a few words: 19 + 56 + 8 + 31 and three gaps of 2 = 120
COLUMNS = (("stack", 19), ("setting", 56), ("figure", 8), ("number behind it (--why)", 31))


def render(inputs: list[Input], recs: list[Advice]) -> str:
    """The advice in 120 columns, under the input it came from: setting, EMULATED or measured, and the number
    behind it in a few words (the row keys and the reasoning: render_why, --json)."""
    lines = []
    for inp in inputs:
        lines += textfit.wrap([_header(inp)])
        mine = [a for a in recs if a.source == inp.path]
        if mine:
            lines += textfit.table([h for h, _ in COLUMNS], [[a.stack, a.setting, _label(a), a.brief] for a in mine],
                                   [w for _, w in COLUMNS])
    return "\n".join(lines)


def render_why(inputs: list[Input], recs: list[Advice]) -> str:
    """--why: per line, the setting, why, and each row key with its median behind it, wrapped to 120 columns."""
    lines = []
    for inp in inputs:
        lines += textfit.wrap([_header(inp)])
        for a in (a for a in recs if a.source == inp.path):
            lines += textfit.wrap([f"{a.stack}: {a.setting} [{_label(a)}]"])
            lines += textfit.wrap([f"  why: {a.why}"], indent="    ")
            lines += textfit.wrap([f"  [{c.text()}]" for c in a.cites] or ["  [no measurement]"], indent="    ")
    return "\n".join(lines)


def to_json(inputs: list[Input], recs: list[Advice]) -> dict[str, Any]:
    return {"inputs": [i.summary() for i in inputs], "advice": [a.as_dict() for a in recs]}
