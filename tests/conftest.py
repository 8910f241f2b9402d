import copy
import json
from pathlib import Path

import pytest

from ccbridge import results
from ccbridge.bindings import core
from ccbridge.errors import GpuError
from ccbridge.results import Result, Row

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def need_gpu():
    """Skip the module's tests, with the reason, where the driver sees no GPU."""
    try:
        if core.device_count() < 1:
            pytest.skip("the CUDA driver sees no GPU")
    except GpuError as e:
        pytest.skip(f"no GPU: {e}")


@pytest.fixture
def driver_here(monkeypatch):
    """The CUDA driver loads (bindings.core.driver_missing says so): an emulated run faked by its environment
    on a machine without one is stamped as emulating, as it would be where the interposer has a driver to hook."""
    from ccbridge.bindings import core

    monkeypatch.setattr(core, "driver_missing", lambda: None)


@pytest.fixture
def h100() -> Result:
    """A real full probe run (H100, native, 2026-11-21): every single-GPU family's rows."""
    return results.load(DATA / "h100-native-full.json")


def set_field(doc, path: list[str], value) -> None:
    """Set the field at path in a JSON document (list indices as digit strings); value ... removes it."""
    *parents, last = path
    node = doc
    for k in parents:
        node = node[int(k)] if isinstance(node, list) else node[k]
    key = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[key]
    else:
        node[key] = value


def synthetic(rows: list[Row], emulated: str | None = None) -> Result:
    return Result(kind="probe", env={"emulation": {"active": bool(emulated), "profile": emulated}}, settings={},
                  rows=rows)


@pytest.fixture
def h100_doc() -> dict:
    return copy.deepcopy(json.loads((DATA / "h100-native-full.json").read_text()))
