"""Terminal output: rich consoles of at most textfit.WIDTH columns, progress for long runs (quiet when output is
not a terminal); sizes as people read them (human_bytes, approx_bytes); the check that where a command will
write can be written, made before the work, and the writing of a file it was asked for (write_out)."""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import re
import stat
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn, TransferSpeedColumn)

from ccbridge.errors import UsageError
from ccbridge.textfit import WIDTH


def terminal(stderr: bool = False) -> Console:
    """A rich console of the terminal's width (or $COLUMNS), at most WIDTH: rich wraps and shrinks to it. Into a
    pipe or a file without $COLUMNS, WIDTH (rich's 80 there split the paths a script reads from `wrote` lines)."""
    c = Console(stderr=stderr)
    c.width = min(c.width, WIDTH) if c.is_terminal or os.environ.get("COLUMNS") else WIDTH
    return c


class Unread:
    """A stream (sys.stdout, sys.stderr) whose reader may stop reading (`| head`): once a write meets the closed pipe,
    its descriptor is pointed at /dev/null and the rest is dropped, so the command finishes its work and exits with
    its own status. Without it print() raised in the middle of the work and rich exited 1 (a probe lost its run).
    stream None (a descriptor closed as the process started, `2>&-`): gone from the start, every write dropped."""

    def __init__(self, stream):
        self.stream = stream
        self.gone = stream is None

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.gone = True
        try:  # what is left in its buffer, Python's flush at exit and children's output go nowhere, not to EPIPE
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no descriptor (a test's stream): dropping is enough
            pass

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextmanager
def unread_ok():
    """sys.stdout and sys.stderr as Unread streams for the block (a command's run)."""
    was = sys.stdout, sys.stderr
    # a closed descriptor (`2>&-`) is None in sys: an Unread of none drops what is written to it, where
    # print(file=None) wrote to stdout (`2>&-` put the error line and `wrote FILE` into what stdout's reader read)
    sys.stdout, sys.stderr = (Unread(s) for s in was)
    try:
        yield
    finally:
        for s in (sys.stdout, sys.stderr):  # what print() left in the buffers goes through Unread, not Python's exit
            s.flush()
        sys.stdout, sys.stderr = was


def human_bytes(n: int) -> str:
    """An exact size, as messages and copies are given: 4 KiB, 1 GiB, 1536 B (a volume measured: approx_bytes)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def approx_bytes(n: float) -> str:
    """A volume for people: 2.3 GiB, 512 B (exact sizes of messages and copies: human_bytes)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def writable_folder(path: str | os.PathLike, what: str, create: bool = True, fresh: tuple[str, ...] = ()) -> Path:
    """`path` as a folder a command can write in, checked before its work starts.

    create: the folder may be missing (the command makes it) as long as its
    nearest existing parent takes a new folder; otherwise it must exist. The
    test is making and removing a folder there, not permission bits, so that
    root, read-only mounts and /proc answer truthfully; nothing is left behind.
    what: the option, for the message (e.g. "--out"). fresh: files the command
    writes there that must not exist yet (an earlier run's result is never
    overwritten); a name may be a glob pattern (model-*.safetensors).
    """
    _check_folder(Path(path), f"{what} {path}", create)
    for name in fresh:
        found = sorted(Path(path).glob(name)) if any(c in name for c in "*?[") else \
            [Path(path) / name] if (Path(path) / name).exists() else []
        if found:
            raise UsageError(f"{what} {path}: already holds {found[0].name}: give a new folder")
    return Path(path)


def writable_file(path: str | os.PathLike, what: str, fresh: bool = True) -> Path:
    """`path` as a file a command can write: not a folder, in an existing folder it can write in, and (fresh) no
    regular file yet: an earlier result is never overwritten, as an --out folder holding one is refused. A stream
    (a pipe, a device, /dev/stdout, a process substitution) holds no result: it is written to if it takes writes.
    This process's own descriptor (own_descriptor: /dev/stdout, /dev/fd/N) is judged by how it was opened, not by
    the file it leads to: it must be open, and open for writing (`5<file` is not; os.access on the file passed it
    and the write failed after the work).
    fresh=False: the command does not write `path` itself (a trace prefix, whose files check themselves).
    A command that `account` runs again (CCBRIDGE_ACCOUNT_SINCE, its start in ns) may overwrite what an earlier
    run of the same account wrote, not a file from before it."""
    p = Path(path)
    fd = own_descriptor(p)
    if fd is not None:
        _check_descriptor(fd, f"{what} {path}")
        return p
    if p.is_dir():
        raise UsageError(f"{what} {path}: is a folder, not a file")
    try:
        st = p.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UsageError(f"{what} {path}: {e.strerror}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):  # a pipe or a device (is_stream, from the stat above): the
        # folder holding it may take no new file
        if not os.access(p, os.W_OK):
            raise UsageError(f"{what} {path}: cannot write to it")
        return p
    _check_folder(p.parent, f"{what} {path}", create=False)
    since = os.environ.get("CCBRIDGE_ACCOUNT_SINCE", "")
    if fresh and st is not None and not (since.isdigit() and st.st_mtime_ns >= int(since)):
        raise UsageError(f"{what} {path} exists: remove it or name another file")
    return p


def _check_descriptor(fd: int, shown: str) -> None:
    """Descriptor fd of this process is open, and open for writing."""
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:  # EBADF: closed (`>&-`), or never opened here
        raise UsageError(f"{shown}: not open") from None
    if flags & os.O_ACCMODE == os.O_RDONLY:  # `5<file`, or an O_PATH descriptor
        raise UsageError(f"{shown}: not open for writing")


_OWN = re.compile(r"/dev/(stdout|stderr)|/(?:dev|proc/self)/fd/(\d+)")


def own_descriptor(path: str | os.PathLike) -> int | None:
    """The descriptor of this process that `path` names (/dev/stdout 1, /dev/stderr 2, /dev/fd/N and
    /proc/self/fd/N N), else None."""
    m = _OWN.fullmatch(os.path.abspath(path))
    if m is None:
        return None
    return int(m.group(2)) if m.group(2) else {"stdout": 1, "stderr": 2}[m.group(1)]


def is_stream(path: str | os.PathLike) -> bool:
    """`path` holds no result, as writable_file judges: this process's own descriptor (even where it leads to a
    file) or something there that is no regular file (a pipe, a device, a process substitution). What is written
    there stays: it takes one document, never an early copy that a later one replaces."""
    if own_descriptor(path) is not None:
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # nothing there yet (or not to be looked at): a file the command makes
        return False


def write_out(path: str | os.PathLike, text: str) -> None:
    """`text` as the file a command was asked to write (--json, --out, --coverage). This process's own descriptor
    (/dev/stdout, /dev/fd/N) is written through, after what print() holds for stdout and stderr: opened anew it
    was truncated and written from offset 0 where it led to a regular file (`--json /dev/stdout > out.txt` lost
    the table printed before), and came before the buffered table into a pipe. Anything else: written anew.
    An OSError (a full disk, a descriptor closed since the check, a pipe whose reader is gone) names `path`: the
    CLI's line said "Bad file descriptor" or "Broken pipe" and not which file."""
    fd = own_descriptor(path)
    streams = [s for s in (sys.stdout, sys.stderr) if s is not None] if fd is not None else []
    for s in streams:  # what print() holds goes first (their own errors are theirs, not path's)
        s.flush()
    try:
        if fd is None:
            Path(path).write_text(text)
        else:
            _write_fd(fd, text, streams)
    except OSError as e:
        if e.filename or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None  # (OSError makes the errno's subclass)


def _write_fd(fd: int, text: str, streams: list) -> None:
    for s in streams:  # stdout or stderr itself: through it, so that a reader gone is dropped as for print()
        if _fileno(s) == fd:
            s.write(text)
            s.flush()
            return
    data = text.encode()
    while data:
        data = data[os.write(fd, data):]


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # a test's stream, or one closed
        return None


@contextmanager
def made_folder(path: Path):
    """`path` made (with its parents) for a command's files; if the command fails before it wrote any there, the
    folders it made are removed again: a failed run leaves no empty result folder behind."""
    had = nearest_existing(path)
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        _remove_empty(path, had)
        raise


RESULTS_FOLDER = Path("ccbridge-results")
_RUN_FOLDERS: list[tuple[Path, Path]] = []  # run_folder()'s, each with the nearest folder that existed before it


def run_folder(prefix: str = "") -> Path:
    """A command's default output folder, ccbridge-results/<prefix><YYYYmmdd-HHMMSS>, made now: os.mkdir makes a
    name once, so runs started in the same second get folders of their own (<...>-2, -3), where a check of the name
    and a later write gave both one folder and kept the last run's result. Where the command writes nothing in it,
    run_folders() takes it away again."""
    stamp = f"{prefix}{dt.datetime.now():%Y%m%d-%H%M%S}"
    writable_folder(RESULTS_FOLDER / stamp, "--out")  # an unwritable place is refused as for --out
    had = nearest_existing(RESULTS_FOLDER)
    for k in range(1, 1000):
        path = RESULTS_FOLDER / (stamp if k == 1 else f"{stamp}-{k}")
        try:
            RESULTS_FOLDER.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file, or a link to nothing (an unmounted disk): no folder of runs
            raise UsageError(f"{RESULTS_FOLDER} is not a folder: give --out") from None
        except FileNotFoundError:  # taken away by another run just now
            continue
        try:
            path.mkdir()
        except (FileExistsError, FileNotFoundError):  # another run's (or its parent just taken away by one)
            continue
        except OSError as e:
            raise UsageError(f"--out {path}: cannot make it ({e.strerror})") from None
        _RUN_FOLDERS.append((path, had))
        return path
    raise UsageError(f"{RESULTS_FOLDER}: {stamp} and 998 more of its names are taken: give --out")


@contextmanager
def run_folders():
    """The run_folder()s made in the block kept where the command wrote in them, else removed with the parents
    made for them: a command that fails leaves no empty result folder behind."""
    start = len(_RUN_FOLDERS)
    try:
        yield
    finally:
        while len(_RUN_FOLDERS) > start:
            _remove_empty(*_RUN_FOLDERS.pop())


def _remove_empty(path: Path, had: Path) -> None:
    """path and its parents below had, where empty."""
    at = path
    try:
        while at != had and at.is_dir() and not any(at.iterdir()):
            at.rmdir()
            at = at.parent
    except OSError:  # another run wrote in it since: theirs
        pass


def nearest_existing(path: str | os.PathLike) -> Path:
    """`path` itself if it exists, else its nearest parent that does."""
    at = Path(path)
    while not at.exists() and at != at.parent:
        at = at.parent
    return at


def _check_folder(folder: Path, shown: str, create: bool) -> None:
    at = nearest_existing(folder) if create else folder
    if not at.exists():
        raise UsageError(f"{shown}: the folder {at} does not exist")
    if not at.is_dir():
        raise UsageError(f"{shown}: {at} is not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ccbridge-check-", dir=at))
    except OSError as e:
        raise UsageError(f"{shown}: cannot write in {at} ({e.strerror})") from None


class ProbeProgress:
    """The runner's progress hooks: begin/step/end/skipped per test."""

    def __init__(self, total: int, console: Console | None = None):
        self.console = console or terminal(stderr=True)
        self.bar = Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[test]}"), BarColumn(),
                            TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[step]}"),
                            TimeElapsedColumn(), console=self.console, transient=True,
                            disable=not self.console.is_terminal)
        self.task = self.bar.add_task("probe", total=total, test="", step="")
        self._last = 0.0
        self._last_skip = None

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        self.bar.__exit__(*exc)

    def begin(self, t):
        self.bar.update(self.task, test=t.name, step="")

    def step(self, t, msg):
        self.bar.update(self.task, step=msg)
        if not self.console.is_terminal and time.monotonic() - self._last > 5:
            self._last = time.monotonic()
            self.console.print(f"  {t.name}: {msg}", highlight=False)

    def end(self, t, status, seconds):
        self.bar.advance(self.task)
        mark = "[red]x[/red]" if status.startswith("error") else "[green]ok[/green]"
        self.console.print(f"{mark} {t.name:<24} {seconds:6.1f} s  {status}", highlight=False)

    def skipped(self, t, reason):
        self.bar.advance(self.task)
        shown = "(same reason)" if reason == self._last_skip else reason
        self._last_skip = reason
        self.console.print(f"[yellow]--[/yellow] {t.name:<24} skipped: {shown}", highlight=False)


@contextmanager
def _bar(label: str, columns):
    console = terminal(stderr=True)
    bar = Progress(SpinnerColumn(), TextColumn(f"[bold]{label}"), BarColumn(), *columns, TimeElapsedColumn(),
                   console=console, transient=True, disable=not console.is_terminal)
    with bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def bytes_progress(label: str):
    """A bar fed update(done_bytes, total_bytes); silent when stderr is not a terminal."""
    return _bar(label, [DownloadColumn(binary_units=False), TransferSpeedColumn()])


def count_progress(label: str):
    """A bar fed update(done, total) for countable steps."""
    return _bar(label, [MofNCompleteColumn()])


def read_small(path: str, limit: int) -> bytes:
    """A small file ccbridge wrote (a trace's summary or stamp), read whole: opened without waiting (a FIFO would
    block the open), refused unless a regular file of at most limit bytes (a device such as /dev/zero would run
    the reader out of memory). OSError with the reason; FileNotFoundError where there is none."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
        if st.st_size > limit:
            raise OSError(0, f"{st.st_size} bytes (at most {limit})")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:  # it grew while read
            raise OSError(0, f"more than {limit} bytes")
        return data
    finally:
        os.close(fd)
