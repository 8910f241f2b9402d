"""Files ccbridge reads back, checked against a JSON Schema (jsonschema, Draft 2020-12) before any field is used.

A defect is one line naming the field path and what is wrong with it, e.g.
`env.nvml.gpus[0]: 'x' is not of type 'object'`: the first defect in the document, in the order the
schema lists its fields. The readers prefix the file's name and raise their own error (ResultFileError,
ProfileError, HeaderError), so the CLI prints it as one line and exits 2.

Two rules differ from plain JSON Schema, because ccbridge writes its files with Python's json: a number
must be finite (json reads NaN and Infinity) and an integer must be written as one (2, not 2.0).
A subschema may carry "message": the text for any defect found by that subschema's own keywords.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any


@functools.cache
def _validator_class():
    """Draft 2020-12 with ccbridge's two rules for numbers."""
    from jsonschema import Draft202012Validator, validators  # (deferred: jsonschema, 80 ms of every command's
    # start-up otherwise, `--help` included; only a command that reads a file back pays it)

    base = Draft202012Validator.TYPE_CHECKER

    def number(checker, x) -> bool:
        return base.is_type(x, "number") and math.isfinite(x)

    def integer(checker, x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    return validators.extend(Draft202012Validator, type_checker=base.redefine_many({"number": number,
                                                                                     "integer": integer}))


# Common field types.
STRING = {"type": "string"}
TEXT = {"type": "string", "pattern": r"\S", "message": "must be a non-empty string"}
BOOL = {"type": "boolean"}
NUMBER = {"type": "number"}
INTEGER = {"type": "integer"}
COUNT = {"type": "integer", "minimum": 0}
POSITIVE = {"type": "integer", "minimum": 1}
SCALAR = {"type": ["string", "number", "boolean", "null"]}


def nullable(schema: dict) -> dict:
    """schema, or null."""
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return {**schema, "type": [*types, "null"]}


def array(items: dict, **more) -> dict:
    return {"type": "array", "items": items, **more}


def mapping(values: dict, **more) -> dict:
    """An object of any keys, each value of this schema."""
    return {"type": "object", "additionalProperties": values, **more}


def record(properties: dict, required: tuple = (), closed: bool = False, **more) -> dict:
    """An object with these fields (required: those it must have; closed: no others)."""
    out = {"type": "object", "properties": properties, **more}
    if required:
        out["required"] = list(required)
    if closed:
        out["additionalProperties"] = False
    return out


class Schema:
    """A schema and what a document breaks of it. (That each schema is itself valid is a test's to check:
    checking the schemas at import would cost every command a third of a second.)"""

    def __init__(self, schema: dict):
        self.schema = schema

    @functools.cached_property
    def _validator(self):
        return _validator_class()(self.schema)

    def check_schema(self) -> None:
        """SchemaError where the schema itself breaks Draft 2020-12."""
        _validator_class().check_schema(self.schema)

    def problem(self, doc: Any) -> str | None:
        """The first defect of doc as `field.path: what is wrong`, or None."""
        err = next(iter(self._validator.iter_errors(doc)), None)
        if err is None:
            return None
        where = field_path(err.absolute_path)
        return f"{where}: {_what(err)}" if where else _what(err)

    def check(self, doc: Any, name: str, error: type[Exception]) -> None:
        """error(f"{name}: {problem}") when doc breaks the schema."""
        problem = self.problem(doc)
        if problem is not None:
            raise error(f"{name}: {problem}")


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def field_path(path) -> str:
    """rows[0].params.batch; a key that is no plain name in brackets: sites['a b']."""
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _NAME.fullmatch(p):
            out += f".{p}" if out else p
        else:
            out += f"[{_show(p)}]"
    return out


def _show(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def _what(err) -> str:
    """What is wrong, in one line of reasonable length (jsonschema's words, with long values cut)."""
    if isinstance(err.schema, dict) and "message" in err.schema:
        return f"{_show(err.instance)} {err.schema['message']}"
    if err.validator == "type":
        if isinstance(err.instance, float) and not math.isfinite(err.instance):
            return f"{err.instance!r} is not a finite number"
        types = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        return f"{_show(err.instance)} is not of type {', '.join(repr(t) for t in types)}"
    if err.validator == "enum":
        return f"{_show(err.instance)} is not one of {', '.join(map(str, err.validator_value))}"[:160]
    message = " ".join(err.message.split())
    return message if len(message) <= 160 else message[:157] + "..."
