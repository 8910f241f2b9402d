"""The versioned result file: one JSON document per run of a command that measures, naming its kind.

A row is one measured quantity at one set of parameters, with its unit,
median, spread and sample count. Reports and comparisons read rows only;
they never re-measure. Every file read back is checked against its kind's
schema (resultschema) first.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ccbridge import env as envmod, ui
from ccbridge.errors import ResultFileError  # noqa: F401 - part of this module's API
from ccbridge.resultschema import RESULTS, STAMP_SCHEMA
from ccbridge.stats import summarize

SCHEMA = "ccbridge.result"
SCHEMA_VERSION = 2  # 2: every result names its kind; a version-1 file's kind is told once at read (kind_of_v1)

# What wrote a result, and so its settings' shape and its rows' tests. calibrate's calibration.json is no Result:
# it holds verdicts of a profile's targets (text, None where rows were missing), not measurements with samples,
# it is derived from two results that carry their own stamps, and ccbridge never reads it back.
KINDS = {
    "probe": "ccbridge probe",
    "decode": "ccbridge bench decode",
    "decode_tp": "ccbridge bench decode --tp",
    "kv": "ccbridge bench kv",
    "account": "ccbridge account",
    "net": "ccbridge bench net",
    "ddp": "ccbridge bench ddp",
    "cipher": "ccbridge bench cipher",
    "collectives": "ccbridge collectives",
    "load": "ccbridge load --bench",
}

# Units where a larger number is better; for every other unit smaller is.
HIGHER_IS_BETTER = {"GB/s", "TFLOP/s", "tok/s", "hit fraction"}


@dataclass
class Row:
    """One measured quantity: test and metric name it, params say where it was measured (bytes, mode, ...), unit
    its unit; median, p10, p90, min and max summarise its n samples; extra holds what a report adds (notes,
    verdicts, headline). key() identifies it across runs and machines (compare pairs rows by it)."""
    test: str
    metric: str
    unit: str
    params: dict[str, Any]
    median: float
    p10: float
    p90: float
    min: float
    max: float
    n: int
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, test: str, metric: str, unit: str, samples: Iterable[float], **params: Any) -> "Row":
        return cls(test=test, metric=metric, unit=unit, params=params, **summarize(list(samples)))

    def key(self) -> str:
        """Identity of the quantity, shared by runs on different machines."""
        ps = ",".join(f"{k}={self.params[k]}" for k in sorted(self.params))
        return f"{self.test}:{self.metric}[{ps}]"

    @property
    def spread(self) -> float:
        """Relative p10-p90 width around the median (0 when the median is 0)."""
        return (self.p90 - self.p10) / abs(self.median) if self.median else 0.0

    @property
    def higher_is_better(self) -> bool:
        return self.unit in HIGHER_IS_BETTER


@dataclass
class Result:
    """Every measurement's format (probe, load, collectives, calibrate, account, bench ...): its kind, the env
    stamp of the machine and run (emulated: the stamp says it ran under the emulator), the settings it ran with,
    its rows, what it skipped and what failed; load() reads one back, checked, and save() writes one."""
    kind: str  # one of KINDS
    env: dict[str, Any]
    settings: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"result kind {self.kind!r}: expected one of {', '.join(KINDS)}")

    @property
    def emulated(self) -> bool:
        return bool(self.env.get("emulation", {}).get("active"))

    @property
    def no_gpu(self) -> str | None:
        """Why the GPU families were skipped, when the machine had no usable GPU."""
        reason = self.settings.get("missing", {}).get("gpu")
        return reason if reason and self.skipped else None

    def by_test(self, test: str) -> list[Row]:
        return [r for r in self.rows if r.test == test]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "kind": self.kind,
            "created": self.created,
            "duration_s": self.duration_s,
            "env": self.env,
            "settings": self.settings,
            "rows": [asdict(r) for r in self.rows],
            "skipped": self.skipped,
            "errors": self.errors,
        }

    def save(self, path: Path) -> None:
        """The result as JSON at path (ui.write_out: /dev/stdout and the like are written through)."""
        ui.write_out(path, json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n")


def recorded(res: Result) -> list[dict] | None:
    """An account of traces given: where each trace was recorded, BASE first, as their stamps said (settings
    "recorded", emulate/recorded.py; an entry's machine None: no stamp beside it). A result from before stamps:
    BASE's not known. None: no account of traces (another kind, or an account that ran CMD here)."""
    if res.kind != "account" or res.settings.get("command"):
        return None
    return res.settings.get("recorded") or [{"trace": "BASE", "machine": None, "cc": None, "driver": None}]


def recorded_text(entries: list[dict]) -> str:
    """Where an account's traces were recorded, each machine (with its CC mode and driver) once, the traces
    recorded there named: 'BASE and OTHER recorded on host h (NVIDIA H200), CC off, driver 580.95; BASE2: no
    stamp'."""
    groups: dict[tuple, list[str]] = {}
    for x in entries:
        groups.setdefault((x["machine"], x["cc"], x["driver"]), []).append(x["trace"])
    def named(names: list[str]) -> str:
        return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
    return "; ".join(f"{named(names)} recorded on {m}, CC {cc}, driver {drv}" if m else f"{named(names)}: no stamp"
                     for (m, cc, drv), names in groups.items())


def machine_name(res: Result) -> str:
    """The GPU a result's machine is named by; for an account of traces none of which says where it was recorded,
    that this is not known (its stamp is then the machine that read them)."""
    rec = recorded(res)
    if rec is not None and not any(x["machine"] for x in rec):
        return "recorded where: unknown"
    return envmod.gpu_name(res.env)


def cc_state(res: Result) -> str:
    """'on', 'off' or 'unknown' by NVML: for an account of traces, the mode OTHER's trace was recorded in (the run
    whose cost it accounts; 'on' where any OTHER was; 'unknown' where none says); else the result's stamp's."""
    rec = recorded(res)
    if rec is None:
        return envmod.cc_mode(res.env)
    others = [x["cc"] for x in rec[1::2] if x["cc"]]
    return "on" if "on" in others else others[0] if others else "unknown"


def emulated_as(res: Result) -> str | None:
    """The profile a result's figures were emulated under (an account's: OTHER's), None where none was."""
    emu = res.env.get("emulation") or {}
    if emu.get("active"):
        return envmod.emulation_label(emu)
    return res.settings.get("profile") if res.kind == "account" else None


def read_json(path: str | Path, folder: str = "pass the result.json in it"):
    """A JSON document from a file; every defect is a ResultFileError naming the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ResultFileError(f"{path}: is a folder; {folder}") from None
    except OSError as e:
        raise ResultFileError(f"{path}: cannot read ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ResultFileError(f"{path}: not a JSON document ({e})") from None


def load(path: str | Path) -> Result:
    """Read and validate a result file; every defect is a ResultFileError naming the file and the field."""
    return from_doc(path, read_json(path))


def read_stamped(path: str | Path, hint: str) -> tuple[dict, Result | None]:
    """A result.json (its stamp and the Result) or an env stamp (`ccbridge env --json`: the stamp and None), as
    advise and plan-tenants take either; anything else a ResultFileError naming the file."""
    path = Path(path)
    doc = read_json(path, hint)
    if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
        res = from_doc(path, doc)
        return res.env, res
    if isinstance(doc, dict) and "schema" not in doc and ("ccbridge" in doc or "nvml" in doc):
        STAMP_SCHEMA.check(doc, str(path), ResultFileError)
        return doc, None
    raise ResultFileError(f"{path}: not a ccbridge result or env stamp (`ccbridge env --json`)")


def from_doc(path: str | Path, doc) -> Result:
    """Check a result document read from `path` against its kind's schema (every defect a ResultFileError
    naming the file and the field); the Result."""
    path = Path(path)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ResultFileError(f"{path}: not a ccbridge result (schema field missing or wrong)")
    version = doc.get("version")
    if version == 1:
        doc = {**doc, "kind": kind_of_v1(path, doc)}
    elif version != SCHEMA_VERSION:
        raise ResultFileError(f"{path}: result version {version!r:.40}, this ccbridge reads 1 and {SCHEMA_VERSION}")
    elif doc.get("kind") not in KINDS:
        raise ResultFileError(f"{path}: kind: {doc.get('kind')!r:.40} is not one of {', '.join(KINDS)}")
    RESULTS[doc["kind"]].check(doc, str(path), ResultFileError)
    rows = [Row(**{k: r[k] for k in _ROW_FIELDS}, extra=r.get("extra", {})) for r in doc.get("rows", [])]
    _check_consistent(path, doc.get("created"), rows)
    return Result(kind=doc["kind"], env=doc["env"], settings=doc.get("settings", {}), rows=rows,
                  skipped=doc.get("skipped", []), errors=doc.get("errors", []), created=doc.get("created", ""),
                  duration_s=doc.get("duration_s", 0.0))


_ROW_FIELDS = ("test", "metric", "unit", "params", "median", "p10", "p90", "min", "max", "n")
_ORDER = ("min", "p10", "median", "p90", "max")  # Row.of's summary is in this order (stats.summarize)
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")


def _check_consistent(path: Path, created: str | None, rows: list[Row]) -> None:
    """What a schema cannot say, as it cannot compare fields: `created` is an ISO date-time, each row's summary
    is in order (min <= p10 <= median <= p90 <= max) and no two rows are one quantity (compare and advise would
    read one of them). ResultFileError naming the field otherwise."""
    if created is not None and not _iso_date_time(created):
        raise ResultFileError(f"{path}: created: {created!r:.40} is not an ISO date-time (2026-11-21T19:41:44+00:00)")
    seen: dict[str, int] = {}
    for i, r in enumerate(rows):
        for lo, hi in zip(_ORDER, _ORDER[1:]):
            if getattr(r, lo) > getattr(r, hi):
                raise ResultFileError(f"{path}: rows[{i}].{lo}: {getattr(r, lo)!r} is above its {hi} "
                                      f"({getattr(r, hi)!r})")
        key = r.key()
        if key in seen:
            raise ResultFileError(f"{path}: rows[{i}] repeats {key} (rows[{seen[key]}]): which one holds?")
        seen[key] = i


def _iso_date_time(text: str) -> bool:
    if not _DATE_TIME.match(text):
        return False
    try:  # before 3.11 fromisoformat takes no Z
        _dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return False
    return True

# The settings a probe writes (probe/registry.py): a version-1 result holding only these is a probe's.
_PROBE_SETTINGS = {"device", "quick", "tests", "missing"}


def kind_of_v1(path: Path, doc: dict) -> str:
    """The kind of a version-1 result (written before results named their kind), told from what each of its
    writers put in it: the one place that reads a kind from content. ResultFileError when nothing tells."""
    settings = doc.get("settings") if isinstance(doc.get("settings"), dict) else {}
    rows = doc.get("rows") if isinstance(doc.get("rows"), list) else []
    tests = {r.get("test") for r in rows if isinstance(r, dict)}
    for kind in ("decode_tp", "decode", "kv"):  # bench decode [--tp] and bench kv: their settings under their name
        if kind in settings:
            return kind
    if settings.get("bench") == "net":
        return "net"
    if any(isinstance(t, str) and t.startswith("account.") for t in tests) or {"base", "other"} <= settings.keys():
        return "account"
    if settings.keys() <= _PROBE_SETTINGS:
        return "probe"
    raise ResultFileError(f"{path}: a version-1 result of no kind this ccbridge can tell (settings "
                          f"{', '.join(sorted(settings))[:60]}): write it again with this ccbridge")
