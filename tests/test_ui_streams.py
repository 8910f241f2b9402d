"""The CLI's own streams and the files it is asked to write: a reader that goes, a closed descriptor, a stream
named as a result file, a folder of runs that is no folder (helper-69's review of the change that made them)."""

from __future__ import annotations

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
