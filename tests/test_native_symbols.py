"""The native libraries export their API and nothing else.

The emulator is preloaded into other programs: any internal symbol it
exported (cfg, drv, emu_*) could collide with, or be interposed on, the
program's own. It is built with hidden visibility; only the hooked driver
entry points (its hook table), dlsym and the EMU_API declarations of emu.h
are exported. The native core (ccbridge._native: the probe core, the loader
pool and the GPU AES-GCM host side) exports the CCB_API declarations of its
parts' headers (core/core.h, loader/loader.h, gcm/gcm.h) and nothing else.
"""

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ccbridge.bindings import emu
from ccbridge.emulate import launcher

SRC = Path(__file__).resolve().parent.parent / "src" / "ccbridge"
NATIVE = SRC / "native"
CORE_HEADERS = ("core/core.h", "loader/loader.h", "gcm/gcm.h")  # the parts of ccbridge._native
# symbols some linkers add to every shared object
LINKER = {"_init", "_fini", "_edata", "_end", "__bss_start"}


def exported(path: str) -> set[str]:
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", path], check=True, capture_output=True, text=True).stdout
    names = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    return names - LINKER


def marked(header: Path, macro: str) -> set[str]:
    """The functions a header declares with its export macro."""
    return set(re.findall(rf"(?m)^{macro}\s[^;(]*?\b(\w+)\(", header.read_text()))


def test_emulator_exports_only_its_hooks_dlsym_and_its_declared_api():
    path = launcher.library()
    lib = emu.load(path)
    hooks = set()
    while (name := lib.ccbemu_hook_name(len(hooks))) is not None:
        hooks.add(name.decode())
    assert "cuMemcpyHtoDAsync_v2" in hooks and len(hooks) > 40
    declared = marked(NATIVE / "emu" / "emu.h", "EMU_API")
    assert {"dlsym", "ccbemu_test_init", "ccbemu_summary"} <= declared
    got = exported(path)
    assert got - hooks - declared == set(), "internal symbols exported"
    assert hooks - got == set(), "hooks not exported: programs linked against libcuda would miss them"
    assert declared - got == set(), "declared API not exported"


def test_native_core_exports_exactly_what_its_headers_mark():
    spec = importlib.util.find_spec("ccbridge._native")
    assert spec and spec.origin
    parts = [marked(NATIVE / h, "CCB_API") for h in CORE_HEADERS]
    declared = set().union(*parts)
    assert sum(map(len, parts)) == len(declared), "a function marked in two headers"
    assert {"ccb_pool_new", "ccb_error", "ccb_gcm_crypt", "ccb_session_open"} <= declared
    for c in NATIVE.rglob("*.c"):
        assert not re.search(r"(?m)^CCB_API\b", c.read_text()), f"{c}: export marked at a definition, not in its header"
    got = exported(spec.origin)
    assert got - declared == set(), "internal symbols exported"
    assert declared - got == set(), "declared CCB_API but not exported"


def test_nccl_net_plugin_exports_only_its_plugin_tables():
    from ccbridge import pluginenv

    declared = set(re.findall(r"(?m)^NET_API\s[^;]*?\b(\w+);", (NATIVE / "ncclnet" / "ncclnet.h").read_text()))
    assert declared == {"ncclNetPlugin_v11", "ncclNetPlugin_v10"}
    assert exported(str(pluginenv.library())) == declared, "the plugin must export its ncclNet tables and nothing else"
