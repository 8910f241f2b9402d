"""What CC drivers answer, on a GPU under the emulator: pinned memory typed managed (torch's is_pinned() False under
b300, copies byte-exact, passthrough untouched), an engine's is_pinned-gated view stale under b300 and live natively,
and the queries' trace lines at the program's own line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs torch")

from ccbridge.emulate import trace  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU")]
BENCH = Path(__file__).resolve().parent.parent / "bench" / "pinned_managed.py"


def cases(profile=None, record=None):
    cmd = [sys.executable, str(BENCH)]
    if profile:
        cmd = [sys.executable, "-m", "ccbridge", "run", "--profile", profile,
               *(["--record", str(record), "--sites"] if record else []), "--"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return {o["case"]: o for o in map(json.loads, (l for l in p.stdout.splitlines() if l.startswith("{")))}


def test_natively_and_under_passthrough_pinned_memory_is_pinned():
    for got in (cases(), cases("passthrough")):
        assert got["is_pinned"]["value"] is True and got["pin_memory_copies"]["value"] is False
        assert got["engine_view"] == {"case": "engine_view", "taken_as": "view", "sees_later_write": True}
        assert got["non_blocking_ms"]["exact"]


def test_under_b300_pinned_memory_reads_managed_and_the_engine_view_goes_stale(tmp_path):
    got = cases("b300", record=tmp_path / "t")
    assert got["is_pinned"]["value"] is False
    assert got["pin_memory_copies"]["value"] is True  # re-pinned: a host copy and a pinned allocation
    assert got["dataloader"]["batches_pinned"] == 0  # its pin thread's batches read "not pinned" too
    assert got["non_blocking_ms"]["exact"]  # the bytes are right; only the answers changed
    assert got["engine_view"] == {"case": "engine_view", "taken_as": "copy", "sees_later_write": False}
    s = trace.summarize(str(tmp_path / "t"))
    queries = {site: a["count"] for (site, api, d, m), a in s.by_site.items() if a["kind"] == "query"}
    assert queries and any("pinned_managed.py" in site for site in queries), queries
