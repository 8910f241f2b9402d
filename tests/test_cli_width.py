"""Every line ccbridge prints fits 120 columns, however wide the terminal.

Each command of the README's table that runs on a CPU-only machine, and the bad inputs whose messages ran
widest, run twice as a user would run them: through a pipe with COLUMNS=250, and in a pseudo-terminal 250
columns wide (rich and argparse follow the terminal, and a terminal turns on rich's progress bars and colours,
so a plain pipe at 80 columns would hide the wide lines). Every line of stdout and stderr is checked, progress
redraws (\\r) and colour codes taken apart first. JSON documents (`env --json`, attest's bundle without --out)
are for programs and are not run here; the evidence that does not fit goes there and to the HTML reports.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from conftest import DATA
from test_account import decode_loop
from test_cli_fuzz import _driver, _profile

WIDTH = 120
COLUMNS = 250  # the terminal: wider than any line may be
TIMEOUT_S = 240
NONCE = bytes(range(32)).hex()
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][0-9A-Za-z]")


def _gpu() -> bool:
    from ccbridge.bindings import core
    from ccbridge.errors import GpuError

    try:
        return core.device_count() > 0
    except GpuError:
        return False


GPU = _gpu()
DRIVER = _driver()  # the CUDA driver loads: a recorded run records

# (argv, exit status or None for either 0 or 1[, "cpu": only where there is no GPU (it would measure for minutes, or
# it answers differently, on one)]). {m}: this run's mode, so that each run writes its own folder.
MATRIX = [
    (["--help"], 0),
    (["bench", "decode", "--help"], 0),
    (["probe", "--list"], 0),
    (["probe", "--quick", "--tests", "hostcrypto,launch", "--out", "probe-{m}"], 0),
    (["probe", "--profile", "b300", "--quick", "--tests", "hostcrypto,launch", "--out", "probe-emu-{m}"], 0),
    (["env"], 0),
    (["attest", "--nonce", NONCE, "--out", "attest-{m}.json"], None),
    (["report", "good.json", "--out", "report-{m}"], 0),
    (["compare", "good.json", "peer.json"], 0),
    (["compare", "good.json", "emu_b300.json", "--out", "compare-{m}"], 0),
    (["run", "--profile", "b300", "--set", "launch_toll_us=0", "--set", "h2d_pinned_gbps=20", "--", "true"], 0),
    (["run", "--record", "rec-{m}", "--", "true"], 0 if DRIVER else 2),  # no driver: nothing to record, refused
    (["profiles"], 0),
    (["profiles", "b300", "--set", "launch_toll_us=0"], 0),
    (["calibrate", "--profile", "b300", "--native", "good.json", "--emulated", "emu_b300.json", "--out", "cal-{m}"], 1),
    (["trace", "cc"], 0),
    (["account", "native", "cc", "--why", "--out", "account-{m}"], 0),
    (["account", "--profile", "b300", "--", "true"], 2),  # its two runs' banners, then: no driver call
    (["advise", "good.json", "--why"], 0),
    (["advise", "cpu_probe.json"], 2),  # probe, then advise, on a CPU machine: one short line
    (["plan-tenants", "--request", "4", "2", "2", "1", "--busy", "0"], 1),
    (["plan-tenants", "--request", "2", "--from-stamp", "stamp.json"], 0),
    (["make-checkpoint", "ckpt-{m}", "--size", "3M", "--shard-size", "1M"], 0),
    (["load", "ckpt-{m}", "--device", "cpu"], 0),
    (["load", "ckpt-{m}", "--device", "cpu", "--bench", "--repeat", "1"], 0),
    (["load", "ckpt-{m}"], 2, "cpu"),
    (["collectives", "--backend", "gloo", "-e", "1K", "-f", "32", "-n", "1", "-w", "0"], 0, "cpu"),
    (["bench", "net", "--total", "16M", "--lanes", "1", "--iters", "1", "-b", "1M", "-e", "1M"], 0),
    (["bench", "decode", "--device", "cpu", "--model", "tiny", "--batch", "1", "--prompt", "4", "--output", "3",
      "--iters", "1", "--warmup", "0", "--modes", "sync", "drain"], 0),
    (["bench", "kv", "--device", "cpu", "--model", "tiny", "--prefixes", "2", "--requests", "2", "--churn", "0",
      "--thresholds", "1", "--modes", "async", "--warmup", "0"], 0),
    (["bench", "ddp"], 2, "cpu"),
    (["bench", "cipher"], 2, "cpu"),
    # bad inputs whose one line ran to 213-494 columns
    (["probe", "--tests", "nosuch"], 2),
    (["probe", "--tests", ""], 2),
    (["profiles", "unknown_param.json"], 2),
    (["run", "--profile", "b300", "--set", "nccl_small_tollus=1", "--", "true"], 2),
    (["make-checkpoint", "x", "--size", "1ZiB"], 2),
    (["make-checkpoint", "x", "--shard-size", "1" + "0" * 40], 2),
    (["make-checkpoint", "ckpt-{m}", "--size", "1M"], 2),  # a used folder
    (["calibrate", "--profile", "b300", "--out", "cal-nogpu-{m}"], 2, "cpu"),
]


@pytest.fixture(scope="module")
def d(tmp_path_factory) -> Path:
    """The inputs the matrix reads, under short names (the runs' cwd, so that paths take few columns)."""
    root = tmp_path_factory.mktemp("width")
    shutil.copy(DATA / "h100-native-full.json", root / "good.json")
    shutil.copy(DATA / "h200x2-peer.json", root / "peer.json")
    doc = json.loads((DATA / "h100-native-full.json").read_text())
    doc["env"]["emulation"] = {"active": True, "profile": "b300"}
    (root / "emu_b300.json").write_text(json.dumps(doc))
    doc["env"]["emulation"] = {"active": False}
    doc["env"]["nvml"]["gpus"] = doc["env"]["nvml"]["gpus"] * 4
    doc["env"]["nvml"]["cc"]["multi_gpu_mode"] = "protected-pcie"
    doc["env"]["nvml"]["fabric"] = {"cliques": []}
    (root / "stamp.json").write_text(json.dumps(doc))
    (root / "unknown_param.json").write_text(_profile().replace('"lanes"', '"warps"'))
    cpu = json.loads((DATA / "h100-native-full.json").read_text())  # `ccbridge probe` on a machine without a GPU
    cpu["settings"]["missing"] = {"gpu": "no usable GPU: cannot load the CUDA driver library libcuda.so.1 (no "
                                         "NVIDIA driver here?)"}
    cpu["skipped"] = [{"test": "transfer.sweep", "reason": cpu["settings"]["missing"]["gpu"]}]
    cpu["rows"] = [r for r in cpu["rows"] if r["test"].startswith("hostcrypto")]
    (root / "cpu_probe.json").write_text(json.dumps(cpu))
    decode_loop(root / "native", d2h_us=30, launch_us=5)
    decode_loop(root / "cc", d2h_us=1400, launch_us=24, profile="b300", emulate=1)
    return root


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return {**env, **extra}


def in_pipe(argv: list[str], cwd: Path) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-m", "ccbridge.cli", *argv], cwd=cwd, capture_output=True, text=True,
                       timeout=TIMEOUT_S, env=_env(COLUMNS=str(COLUMNS)))
    return r.returncode, r.stdout + r.stderr


def in_terminal(argv: list[str], cwd: Path) -> tuple[int, str]:
    """argv in a pseudo-terminal COLUMNS wide (stdout and stderr both the terminal); its status and output."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, COLUMNS, 0, 0))
    p = subprocess.Popen([sys.executable, "-m", "ccbridge.cli", *argv], cwd=cwd, stdin=follower, stdout=follower,
                         stderr=follower, env=_env(TERM="xterm-256color"), start_new_session=True)
    os.close(follower)
    out, deadline = b"", time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 1)[0]:
                try:
                    chunk = os.read(leader, 1 << 16)
                except OSError:  # EIO: every writer has closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif p.poll() is not None:
                break
        else:
            p.kill()
            pytest.fail(f"{argv} ran past {TIMEOUT_S} s")
    finally:
        os.close(leader)
    return p.wait(timeout=TIMEOUT_S), out.decode(errors="replace").replace("\r\n", "\n")


def too_wide(text: str) -> list[str]:
    """The lines (and the pieces a \\r redraws) longer than WIDTH, colour and cursor codes removed."""
    return [piece for line in ESCAPE.sub("", text).split("\n") for piece in line.split("\r") if len(piece) > WIDTH]


@pytest.mark.parametrize("mode", ["pipe", "terminal"])
@pytest.mark.parametrize("case", MATRIX, ids=[" ".join(c[0])[:50] for c in MATRIX])
def test_every_line_fits_120_columns(d, case, mode):
    argv, status, *only = case
    if only and GPU:
        pytest.skip("answers differently, or measures for minutes, where there is a GPU")
    argv = [a.replace("{m}", mode) for a in argv]
    rc, text = (in_pipe if mode == "pipe" else in_terminal)(argv, d)
    assert "Traceback" not in text, text
    assert rc == status if status is not None else rc in (0, 1), text
    wide = too_wide(text)
    assert not wide, "\n".join(f"{len(w)}: {w}" for w in wide)


def test_the_matrix_covers_every_readme_command():
    """Each command of the README's table runs above (or, needing a GPU, is said to: bench ddp and cipher)."""
    from test_cli_fuzz import readme_commands

    ran = {" ".join(c[0][:2]) if c[0][0] == "bench" else c[0][0] for c in MATRIX}
    assert readme_commands() <= ran, readme_commands() - ran


def test_the_width_check_sees_a_wide_line_through_a_terminal(d):
    """The harness itself: rich draws to the terminal's width unless told otherwise, and the check sees that."""
    code = "from rich.console import Console; Console().print('x' * 200)"
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, COLUMNS, 0, 0))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=follower, stderr=follower, env=_env())
    os.close(follower)
    p.wait(timeout=TIMEOUT_S)
    out = b""
    while select.select([leader], [], [], 0.5)[0]:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert too_wide(out.decode()) == ["x" * 200]


def test_a_pipe_without_columns_gets_the_full_width(d):
    """Into a pipe with no $COLUMNS rich would wrap at 80 and split the paths of the `wrote` line a script reads:
    the probe's lines run to 120 there too."""
    p = subprocess.run([sys.executable, "-m", "ccbridge", "probe", "--quick", "--out", str(d / "pipe-probe")],
                       cwd=d, capture_output=True, text=True, timeout=TIMEOUT_S, env=_env())  # no COLUMNS
    assert p.returncode == 0, p.stderr
    lengths = [len(line) for line in p.stderr.splitlines()]
    assert 80 < max(lengths) <= WIDTH, p.stderr
