"""The schema machinery (ccbridge.schema) and the stamps env.stamp() writes, held to the stamp's schema."""

import pynvml
import pytest

import fake_nvml
from ccbridge import env, schema
from ccbridge.emulate import profiles, trace
from ccbridge.load import checkpoint
from ccbridge.errors import ResultFileError
from ccbridge.resultschema import RESULTS, STAMP_SCHEMA
from ccbridge.results import KINDS


@pytest.mark.parametrize("nv", [
    None,  # this machine's own NVML (none here: the error)
    fake_nvml.make(fake_nvml.b300_tenant(4, clique=11)),  # GPUs on a fabric, CC on in the NVLE mode
    fake_nvml.make(fake_nvml.Scenario(cc="devtools", gpus=[fake_nvml.GPU(), fake_nvml.GPU()])),
    fake_nvml.make(fake_nvml.Scenario(settings=pynvml.NVML_ERROR_NOT_SUPPORTED, cc="raise")),
    fake_nvml.make(fake_nvml.Scenario(init=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)),
])
def test_every_stamp_env_writes_is_one_its_schema_takes(nv):
    assert STAMP_SCHEMA.problem(env.stamp(nv)) is None


def test_a_field_path_names_list_items_fields_and_odd_keys():
    assert schema.field_path(["env", "nvml", "gpus", 0, "name"]) == "env.nvml.gpus[0].name"
    assert schema.field_path(["rows", 3, "params", "a b"]) == "rows[3].params['a b']"
    assert schema.field_path([]) == ""


@pytest.mark.parametrize("sub, value, problem", [
    (schema.NUMBER, float("nan"), "x: nan is not a finite number"),
    (schema.NUMBER, float("-inf"), "x: -inf is not a finite number"),
    (schema.NUMBER, True, "x: True is not of type 'number'"),
    (schema.INTEGER, 2.0, "x: 2.0 is not of type 'integer'"),
    (schema.INTEGER, False, "x: False is not of type 'integer'"),
    (schema.TEXT, " ", "x: ' ' must be a non-empty string"),
    (schema.INTEGER, "a" * 100, "x: 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa... is not of type 'integer'"),
    ({"enum": ["sync", "async"]}, "turbo", "x: 'turbo' is not one of sync, async"),
    (schema.NUMBER, 1.5, None),
    (schema.NUMBER, 2, None),
    (schema.INTEGER, 2, None),
    (schema.TEXT, "a source", None),
])
def test_numbers_are_finite_integers_are_written_as_integers_and_messages_stay_short(sub, value, problem):
    assert schema.Schema(schema.record({"x": sub})).problem({"x": value}) == problem


def test_the_first_defect_in_document_order_is_the_one_told():
    s = schema.Schema(schema.record({"a": schema.array(schema.record({"b": schema.COUNT}, required=("b",)))}))
    assert s.problem({"a": [{"b": 1}, {"b": -1}, {}]}) == "a[1].b: -1 is less than the minimum of 0"
    with pytest.raises(ResultFileError, match=r"^f.json: a\[2\]: 'b' is a required property$"):
        s.check({"a": [{"b": 1}, {"b": 2}, {}]}, "f.json", ResultFileError)


def test_every_kind_has_its_schema_and_every_schema_is_one():
    assert set(RESULTS) == set(KINDS)
    for s in [*RESULTS.values(), STAMP_SCHEMA, trace.SUMMARY, profiles.SCHEMA, checkpoint.INDEX]:
        s.check_schema()
