"""The loader pool's publish protocol (native/loader/load.c) under ThreadSanitizer and AddressSanitizer, on the CPU.

tests/loader_stress.c (from review helper-45's harness) drives load.c, compiled as in ccbridge._native except that
its pread goes through the harness's checked ccbt_pread, with randomized loads on every pool shape: the host
target (the real pread path) and five device shapes on tests/fake_cuda_loader.c, a driver table whose streams are
threads and whose device memory is host memory. Per load: items over one or two files, nready, publishes in random
steps (stale, smaller, past the end, under another load's id), cancels by the publisher and by the consumer,
truncations, frees while workers wait, injected driver errors; and pools closed during their prewarm. It aborts on
a write into an unpublished or released destination, a copy left queued once the pool is idle, a tensor reported
twice or with wrong bytes, a successful load that misses a tensor, a published tensor held back, or a hang. Here: each sanitizer, a fixed seed and a random one,
no suppressions, and every shape must have run loads that succeeded (so the test cannot pass by doing nothing).
CCB_LOADER_STRESS_S sets the seconds per seed (default 8).
"""

import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
LOADER = HERE.parent / "src" / "ccbridge" / "native" / "loader"
SECONDS = float(os.environ.get("CCB_LOADER_STRESS_S", "8"))  # per seed; two seeds per sanitizer
HANG_S = 10  # no progress for this long: a hang (the harness's watchdog; a load takes milliseconds)
FIXED_SEED = 45
SHAPES = ("host", "host-pageable", "submitter", "primary-pageable", "primary-mapped", "2ctx-pinned", "2ctx-mapped")
CASES = ("failed", "cancelled by the publisher", "by the consumer", "pools freed mid-load", "truncations",
         "publishes under another load's id", "pools closed in their prewarm")
CFLAGS = ["-g", "-O1", "-std=gnu11", "-Wall", "-U_FORTIFY_SOURCE", "-fno-omit-frame-pointer"]
SANITIZERS = {  # -fsanitize=, its runtime, its options (no suppressions)
    "thread": ("libtsan.so", {"TSAN_OPTIONS": "halt_on_error=1"}),
    "address": ("libasan.so", {"ASAN_OPTIONS": "halt_on_error=1:abort_on_error=1:detect_leaks=1"}),
}


def sanitizer_env(san: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TSAN_OPTIONS", "ASAN_OPTIONS", "LD_PRELOAD")}
    env.update(SANITIZERS[san][1])
    env["CCBT_STATS"] = "1"  # the consumer also reads the pool's stats during each load
    return env


def compiler_for(san: str, tmp_path: Path) -> str:
    """gcc, where it builds and runs a program under the sanitizer here; else skip, saying why."""
    gcc = shutil.which("gcc")
    if not gcc:
        pytest.skip("gcc is not here")
    runtime = subprocess.run([gcc, f"-print-file-name={SANITIZERS[san][0]}"], capture_output=True,
                             text=True).stdout.strip()
    if not os.path.isabs(runtime):
        pytest.skip(f"gcc without the {san} sanitizer runtime ({SANITIZERS[san][0]})")
    (tmp_path / "probe.c").write_text("int main(void) { return 0; }\n")
    probe = tmp_path / "probe"
    built = subprocess.run([gcc, f"-fsanitize={san}", "-o", str(probe), str(tmp_path / "probe.c")],
                           capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"gcc cannot link with -fsanitize={san}: {built.stderr.strip()[-300:]}")
    ran = subprocess.run([str(probe)], capture_output=True, text=True, env=sanitizer_env(san), timeout=60)
    if ran.returncode != 0:  # e.g. TSan's "unexpected memory mapping" on kernels with more mmap randomness
        pytest.skip(f"the {san} sanitizer's runtime does not start here: {ran.stderr.strip()[-300:]}")
    return gcc


def build(gcc: str, san: str, tmp_path: Path) -> Path:
    """load.c as in ccbridge._native, its pread renamed to the harness's checked one, with the harness."""
    obj, exe = tmp_path / f"load-{san}.o", tmp_path / f"loader_stress-{san}"
    subprocess.run([gcc, *CFLAGS, f"-fsanitize={san}", "-Dpread=ccbt_pread", f"-I{LOADER}", "-c",
                    str(LOADER / "load.c"), "-o", str(obj)], check=True)
    subprocess.run([gcc, *CFLAGS, f"-fsanitize={san}", str(HERE / "loader_stress.c"), str(HERE / "fake_cuda_loader.c"),
                    str(LOADER.parent / "common" / "err.c"), str(obj), "-lpthread", "-o", str(exe)], check=True)
    return exe


def counts(out: str) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """The harness's last two lines: its tallies ("123 failed", ...), and loads and successes per shape."""
    summary = next(line for line in out.splitlines() if line.startswith("seed "))
    tallies = {what: int(n) for n, what in re.findall(r"(\d+) ([a-z' -]+?)(?:,|$)", summary.split(" loads: ")[1])}
    shapes = next(line for line in out.splitlines() if line.startswith("loads by shape:"))
    per_shape = {name: (int(n), int(ok)) for name, n, ok in re.findall(r"([\w-]+) (\d+) ok (\d+)", shapes)}
    return tallies, per_shape


def stress(exe: Path, san: str, seed: int) -> str:
    cmd = [str(exe), "all", str(SECONDS), str(seed), str(HANG_S)]
    again = " ".join([*(f"{k}='{v}'" for k, v in SANITIZERS[san][1].items()), *cmd])  # to run it again by hand
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=sanitizer_env(san), timeout=SECONDS + HANG_S + 60)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        pytest.fail(f"seed {seed}: no end and no watchdog report (a hang?); again: {again}\n{out[-6000:]}")
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"seed {seed}: exit {p.returncode}; again: {again}\n{out[-8000:]}"
    tallies, per_shape = counts(p.stdout)
    assert set(per_shape) == set(SHAPES), p.stdout
    idle = [name for name, (n, ok) in per_shape.items() if n == 0 or ok == 0]
    assert not idle, f"seed {seed}: shapes with no successful load: {idle}\n{p.stdout}"
    assert all(tallies.get(what, 0) > 0 for what in CASES), f"seed {seed}: a case never ran\n{p.stdout}"
    return p.stdout


@pytest.mark.parametrize("san", ["thread", "address"], ids=["tsan", "asan"])
def test_loader_pool_stress_under_sanitizer(san, tmp_path):
    gcc = compiler_for(san, tmp_path)
    exe = build(gcc, san, tmp_path)
    for seed in (FIXED_SEED, random.SystemRandom().randrange(1, 1 << 31)):
        print(stress(exe, san, seed))
