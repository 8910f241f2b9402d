"""The CLI's own streams and the files it is asked to write: a reader that goes, a closed descriptor, a stream
named as a result file, a folder of runs that is no folder (helper-69's review of the change that made them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ccbridge import ui
from ccbridge.cli import main
from ccbridge.errors import UsageError

# prints through ui.unread_ok() as a command does: plain print(), block-buffered (no PYTHONUNBUFFERED), the first
# line flushed so that the reader can go before the rest is written
_PRINTS = """
import sys
from ccbridge import ui
with ui.unread_ok():
    print("first", flush=True)
    sys.stdin.readline()  # the reader has gone
    for i in range(5):  # within the buffer: no write meets the pipe before the command ends
        print("line", i)
"""


def test_what_print_left_in_the_buffer_meets_the_gone_reader_inside_the_command():
    """Lines print() buffered after the reader went were flushed by Python at exit, past the wrapper: exit 120 and
    "Exception ignored ... BrokenPipeError" (bench net | head -1, without PYTHONUNBUFFERED)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    p = subprocess.Popen([sys.executable, "-c", _PRINTS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, text=True)
    assert p.stdout.readline() == "first\n"
    p.stdout.close()
    _, err = p.communicate("go\n", timeout=60)
    assert p.returncode == 0 and "BrokenPipeError" not in err, (p.returncode, err)


@pytest.mark.parametrize("closed", ["1", "2"])
def test_a_closed_descriptor_writes_nothing_and_keeps_the_status(closed):
    """`ccbridge profiles >&-` raised AttributeError ('NoneType' has no write) and exited 1; `profiles nosuch 2>&-`
    exited 1, not 2."""
    for argv, status in ((["profiles"], 0), (["profiles", "nosuch"], 2)):
        p = subprocess.run(f"{sys.executable} -m ccbridge {' '.join(argv)} {closed}>&-", shell=True,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == status, (argv, closed, p.stdout, p.stderr)
        assert "Traceback" not in p.stdout + p.stderr


def test_what_goes_to_a_closed_stderr_is_dropped_not_written_to_stdout(tmp_path):
    """sys.stderr is None where fd 2 was closed (`2>&-`), and print(..., file=None) writes to stdout: the error
    line, and `wrote FILE` after a table, went into what stdout's reader took for the command's output."""
    r = _ccbridge(["profiles", "nosuch"], "2>&-")
    assert r.returncode == 2 and r.stdout == "", r.stdout
    out = tmp_path / "plan.json"
    argv = _TABLE_AND_JSON["plan-tenants"]
    r = _ccbridge(argv + ["--json", str(out)], "2>&-")
    assert r.returncode == 0 and r.stdout == _ccbridge(argv).stdout and json.loads(out.read_text()), r.stdout[-300:]


def test_a_broken_pipe_past_the_terminal_streams_is_one_line_not_success(monkeypatch, capsys):
    """A BrokenPipeError that reached the CLI (an --json stream's reader gone) returned 0, whatever the command's
    answer: it is the machine refusing a write, one line and exit 2."""
    from ccbridge.cli import probing

    def gone(args):
        raise BrokenPipeError(32, "Broken pipe", "/dev/stdout")

    monkeypatch.setattr(probing, "cmd_profiles", gone)
    assert main(["profiles"]) == 2
    assert capsys.readouterr().err.strip() == "ccbridge profiles: Broken pipe: /dev/stdout"


def test_a_stream_named_as_a_result_file_is_written_and_a_regular_file_is_not_overwritten(tmp_path, monkeypatch):
    """/dev/fd/N was refused (its folder takes no new file), as /dev/stdout was where stdout led to a file (for
    a user other than root /dev/null too); a regular file under /dev (/dev/shm) was overwritten."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that the pipe takes writes
    try:
        for stream in ("/dev/null", "/dev/stdout", "/dev/fd/1", str(fifo)):
            assert ui.writable_file(stream, "--json") == Path(stream)
    finally:
        os.close(r)
    kept = tmp_path / "r.json"
    kept.write_text("{}")
    with pytest.raises(UsageError, match="exists: remove it or name another file"):
        ui.writable_file(kept, "--json")
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        shm = f"/dev/shm/ccbridge-test-{os.getpid()}.json"
        open(shm, "w").close()
        try:
            with pytest.raises(UsageError, match="exists"):
                ui.writable_file(shm, "--json")
        finally:
            os.unlink(shm)


def test_an_account_run_may_write_again_what_its_earlier_run_wrote_and_nothing_older(tmp_path, monkeypatch):
    """account runs CMD natively then emulated (and --repeat more): CMD's --json FILE was refused in run 2."""
    old = tmp_path / "old.json"
    old.write_text("{}")
    time.sleep(0.02)
    monkeypatch.setenv("CCBRIDGE_ACCOUNT_SINCE", str(time.time_ns()))
    time.sleep(0.02)
    mine = tmp_path / "mine.json"
    mine.write_text("{}")  # run 1's
    assert ui.writable_file(mine, "--json") == mine
    with pytest.raises(UsageError, match="exists"):
        ui.writable_file(old, "--json")


def test_a_folder_of_runs_that_is_no_folder_is_said_once(tmp_path, monkeypatch):
    """A ccbridge-results that is a link to nothing (an unmounted disk) was retried 999 times and said "998 more
    of its names are taken"."""
    monkeypatch.chdir(tmp_path)
    os.symlink(tmp_path / "nowhere", "ccbridge-results")
    with pytest.raises(UsageError, match="^ccbridge-results is not a folder: give --out$"):
        ui.run_folder()


_DATA = Path(__file__).parent / "data"
_TABLE_AND_JSON = {  # commands that print a table and write --json, on CPU from tests/data
    "advise": ["advise", str(_DATA / "h100-native-full.json")],
    "plan-tenants": ["plan-tenants", "--request", "4", "2"],
}


def _ccbridge(argv: list[str], shell_tail: str = "") -> subprocess.CompletedProcess:
    """`ccbridge ARGV SHELL_TAIL` in a shell, block-buffered as a user's run is (no PYTHONUNBUFFERED)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    words = " ".join(f"'{w}'" for w in [sys.executable, "-m", "ccbridge", *argv])
    return subprocess.run(f"{words} {shell_tail}", shell=True, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("cmd", sorted(_TABLE_AND_JSON))
def test_json_to_stdout_led_to_a_file_follows_the_table(tmp_path, cmd):
    """`--json /dev/stdout > out.txt` opened the file anew with O_TRUNC: the table printed before was gone (the JSON
    at offset 0, and had it been shorter, the table's tail after it). Now the file holds the table, then the JSON,
    then (2>&1: stderr shares stdout's offset) the `wrote` line."""
    argv = _TABLE_AND_JSON[cmd]
    table = _ccbridge(argv).stdout
    assert table.strip() and not table.lstrip().startswith("{")
    out = tmp_path / "out.txt"
    r = _ccbridge(argv + ["--json", "/dev/stdout"], f"> '{out}'")
    assert r.returncode in (0, 1), r.stderr
    text = out.read_text()
    assert text.startswith(table), text[:200]
    assert isinstance(json.loads(text[len(table):]), dict)
    both = tmp_path / "both.txt"
    _ccbridge(argv + ["--json", "/dev/stdout"], f"> '{both}' 2>&1")
    text = both.read_text()
    assert text.startswith(table) and text.endswith("wrote /dev/stdout\n"), text[-200:]
    json.loads(text[len(table):-len("wrote /dev/stdout\n")])


def test_json_to_stdout_in_a_pipe_follows_the_table_and_a_new_file_holds_the_json(tmp_path):
    """Into a pipe the JSON was written by a descriptor of its own while print() still held the table: the JSON
    came first. A new file is written as before: the JSON alone."""
    argv = _TABLE_AND_JSON["advise"]
    table = _ccbridge(argv).stdout
    r = _ccbridge(argv + ["--json", "/dev/stdout"], "| cat")
    assert r.stdout.startswith(table) and json.loads(r.stdout[len(table):])["advice"]
    new = tmp_path / "advice.json"
    r = _ccbridge(argv + ["--json", str(new)])
    assert r.stdout == table and json.loads(new.read_text())["advice"]


def test_a_result_saved_to_a_descriptor_of_a_file_is_written_at_its_offset(tmp_path):
    """Result.save (every bench's --json) to /dev/fd/N where N leads to a file: what was written through N before
    and after stays, the result between them."""
    from ccbridge import results

    res = results.Result(kind="cipher", env={}, settings={})
    path = tmp_path / "log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"before\n")
        res.save(Path(f"/dev/fd/{fd}"))
        os.write(fd, b"after\n")
    finally:
        os.close(fd)
    text = path.read_text()
    assert text.startswith("before\n") and text.endswith("}\nafter\n"), text
    assert json.loads(text[len("before\n"):-len("after\n")])["kind"] == "cipher"


def test_a_descriptor_named_as_a_result_file_is_judged_by_how_it_was_opened_before_the_work(tmp_path):
    """os.access judged the file a descriptor leads to: `--json /dev/fd/5 5<file` ran the work, then failed "Bad
    file descriptor" (no path); `--json /dev/stdout >&-` was taken for a new file, the work ran, then "No such file
    or directory: /dev/stdout". Now one line naming the option and the path, exit 2, before any work."""
    argv = _TABLE_AND_JSON["advise"]
    read_only = tmp_path / "input.txt"
    read_only.write_text("kept\n")
    for name, tail, why in (("/dev/fd/5", f"5< '{read_only}'", "not open for writing"),
                            ("/proc/self/fd/5", f"5< '{read_only}'", "not open for writing"),
                            ("/dev/fd/5", "", "not open"), ("/dev/stdout", ">&-", "not open")):
        r = _ccbridge(argv + ["--json", name], tail)
        assert r.returncode == 2 and r.stdout == "", (name, tail, r.stdout[:200], r.stderr)
        assert r.stderr == f"ccbridge advise: --json {name}: {why}\n", (name, tail, r.stderr)
    assert read_only.read_text() == "kept\n"
    fd = os.open(read_only, os.O_RDONLY)
    try:
        with pytest.raises(UsageError, match=f"^--json /dev/fd/{fd}: not open for writing$"):
            ui.writable_file(f"/dev/fd/{fd}", "--json")
    finally:
        os.close(fd)
    with pytest.raises(UsageError, match=f"^--json /dev/fd/{fd}: not open$"):
        ui.writable_file(f"/dev/fd/{fd}", "--json")
    both = os.open(read_only, os.O_RDWR)  # open for writing (5<>file): taken, as 5>file is
    try:
        assert ui.writable_file(f"/dev/fd/{both}", "--json") == Path(f"/dev/fd/{both}")
    finally:
        os.close(both)


def test_a_late_write_error_names_the_path(tmp_path):
    """A write that fails after the checks (the reader of a /dev/fd/N pipe gone, a descriptor closed since) ended
    "ccbridge advise: Broken pipe" or "Bad file descriptor", without the path."""
    r, w = os.pipe()
    os.close(r)  # the reader is gone
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        p = subprocess.run([sys.executable, "-m", "ccbridge", *_TABLE_AND_JSON["advise"], "--json", f"/dev/fd/{w}"],
                           pass_fds=[w], capture_output=True, text=True, env=env, timeout=120)
    finally:
        os.close(w)
    assert p.returncode == 2 and p.stderr == f"ccbridge advise: Broken pipe: /dev/fd/{w}\n", p.stderr
    fd = os.open(tmp_path / "x", os.O_RDONLY | os.O_CREAT, 0o644)  # as though it were reopened so after the check
    try:
        with pytest.raises(OSError) as got:
            ui.write_out(f"/dev/fd/{fd}", "{}\n")
    finally:
        os.close(fd)
    assert got.value.filename == f"/dev/fd/{fd}" and got.value.strerror == "Bad file descriptor"
