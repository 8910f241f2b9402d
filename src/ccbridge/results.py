"""The versioned result file: one JSON document per probe run.

A row is one measured quantity at one set of parameters, with its unit,
median, spread and sample count. Reports and comparisons read rows only;
they never re-measure.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ccbridge.errors import ResultFileError  # noqa: F401 - part of this module's API
from ccbridge.stats import summarize

SCHEMA = "ccbridge.result"
SCHEMA_VERSION = 1

# Units where a larger number is better; for every other unit smaller is.
HIGHER_IS_BETTER = {"GB/s", "TFLOP/s"}


@dataclass
class Row:
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
    env: dict[str, Any]
    settings: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    duration_s: float = 0.0

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
            "created": self.created,
            "duration_s": self.duration_s,
            "env": self.env,
            "settings": self.settings,
            "rows": [asdict(r) for r in self.rows],
            "skipped": self.skipped,
            "errors": self.errors,
        }

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n")


_ROW_FIELDS = {"test": str, "metric": str, "unit": str, "params": dict, "median": (int, float),
               "p10": (int, float), "p90": (int, float), "min": (int, float), "max": (int, float), "n": int}


def load(path: str | Path) -> Result:
    """Read and validate a result file; every defect is a ResultFileError naming the file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultFileError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResultFileError(f"{path}: not a JSON document ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ResultFileError(f"{path}: not a ccbridge result (schema field missing or wrong)")
    if doc.get("version") != SCHEMA_VERSION:
        raise ResultFileError(f"{path}: result version {doc.get('version')!r}, this ccbridge reads {SCHEMA_VERSION}")
    rows = []
    for i, r in enumerate(doc.get("rows", [])):
        if not isinstance(r, dict):
            raise ResultFileError(f"{path}: row {i} is not an object")
        for name, typ in _ROW_FIELDS.items():
            if not isinstance(r.get(name), typ) or isinstance(r.get(name), bool):
                raise ResultFileError(f"{path}: row {i} field {name!r} missing or of the wrong type")
        rows.append(Row(**{k: r[k] for k in _ROW_FIELDS}, extra=r.get("extra") or {}))
    if not isinstance(doc.get("env"), dict):
        raise ResultFileError(f"{path}: env stamp missing")
    return Result(env=doc["env"], settings=doc.get("settings", {}), rows=rows,
                  skipped=doc.get("skipped", []), errors=doc.get("errors", []),
                  created=doc.get("created", ""), duration_s=doc.get("duration_s", 0.0))
