"""Worker processes, one per rank: the one place ccbridge starts them. The collectives and DDP benches
(secure/bench.py), the peer family's NCCL operations (probe/peer.py), tensor-parallel decode (serve/tp.py) and the
net plugin's loopback pair (secure/netbench.py) all run their ranks through run().

run(n, target, *args) starts n ranks and returns, by rank, what target(rank, n, dev, send, *args) returned in each.
A rank is a fresh interpreter (never a fork: the parent may hold a CUDA context), started with its environment in
place from exec: the dynamic loader reads LD_LIBRARY_PATH only then, and the net plugin's folder must be on it
before NCCL looks (secure/bench.py's transports). So the caller's os.environ is never written: `env` adds to what
the ranks inherit, and NVLS_OFF goes on top of both, since NVLink multicast must stay off in every rank whatever
the caller's environment says (on shared machines it can take the host's GPUs down; a CC tenant has none, bridge
law section 6).

Unless backend is None (ranks that meet their own way, or not at all), each rank joins one process group before
target runs: rank r on GPU devices[r], or a CPU rank with its share of the host's cores, through tcp:// on a free
port of 127.0.0.1 or file:// in a private folder; dev is its torch.device (None without a group). send(obj) in a
rank calls on_message(rank, obj) here as it happens; messages and answers travel pickled over one socket per rank.

CCBRIDGE_RANK_CPUS pins each rank to its own cores: "0-15;16-31;..." (a CPU list per rank, rank 0's first,
`taskset -c`'s ranges without strides, no CPU in two lists; a job of fewer ranks takes the first lists), or "auto"
(this process's CPUs cut into even runs of whole cores, SMT siblings kept together, by package), checked here
before any rank starts; a rank is pinned before its job is unpickled (which imports torch). Ranks that share
cores, or a rank whose cores an SMT sibling shares with another rank's spinning thread, run their host work at
different speeds from run to run, and in a job that steps together the others wait for the slowest (`ccbridge
account` names such a rank).

Every failure is one line naming the rank, raised here as a ccbridge error: a rank's own ccbridge error keeps its
class, anything else it raised becomes `failure` (GpuError unless the caller says) naming the class; a rank that
dies, or ends without an answer, is named with its exit status; ranks that say nothing for stall_s, or have not all
answered after timeout_s, are stopped. Whatever happens, no rank is left running when run() returns or raises.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Callable

from ccbridge import errors
from ccbridge.errors import GpuError, UsageError

# NVLink multicast off in each library that would use it: NCCL, PyTorch's symmetric memory, NVSHMEM.
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
POLL_S = 0.2  # how often the parent looks at its ranks while none speaks
GRACE_S = 3.0  # after a rank's failure, how long the others may take to say (or show) theirs
END_S = 60.0  # after every rank answered, how long each may take to end on its own before it is stopped
RENDEZVOUS = ("tcp", "file")
CPUS_ENV = "CCBRIDGE_RANK_CPUS"

# The started interpreter. Its link to the parent is the socket in argv[1]; the parent's sys.path comes first, so
# that ccbridge and the target's module (a test's too) import as they did there.
_BOOT = ("import sys\n"
         "from multiprocessing.connection import Connection\n"
         "link = Connection(int(sys.argv[1]))\n"
         "sys.path[:] = link.recv()\n"
         "from ccbridge import ranks\n"
         "ranks.rank_main(link)\n")


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now (rank 0 binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _class_name(e: BaseException) -> str:
    """The name of the class the parent raises again: the first of ccbridge.errors' in e's (a subclass defined
    elsewhere, the net plugin's NetError, is its SecureError: its message says what failed), else e's own."""
    for cls in type(e).__mro__:
        if getattr(errors, cls.__name__, None) is cls and issubclass(cls, errors.CCBridgeError):
            return cls.__name__
    return type(e).__name__


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:400]


def rank_error(label: str, rank: int, n: int, name: str, text: str,
               failure: type[errors.CCBridgeError] = GpuError) -> errors.CCBridgeError:
    """What a rank raised (its class's name and first line), as raised here: its own class when it is one of
    ccbridge.errors' (its message says what to do), else `failure` naming the class."""
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.CCBridgeError):
        return cls(f"{label} rank {rank} of {n}: {text}")
    return failure(f"{label} rank {rank} of {n} failed: {name}: {text}")


@dataclass(frozen=True)
class _Job:
    """What every rank runs, and how it joins its group (backend None: no group)."""
    target: Callable
    args: tuple
    n: int
    backend: str | None
    devices: tuple[int, ...] | None
    init_method: str | None
    group_timeout_s: float | None
    gate: str | None = None  # a file the ranks wait for before they join (Gate)


MAX_CPU = 1 << 16  # CPU numbers above this are no machine's (a typo: never expanded into a set)


def _cpu_list(text: str) -> frozenset[int]:
    """'0-3,8,10-11' as a set of CPU numbers; ValueError for anything else."""
    out: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isascii() or not lo.isdigit() or dash and not (hi.isascii() and hi.isdigit()):
            raise ValueError(part)
        a, b = int(lo), int(hi) if dash else int(lo)
        if not a <= b < MAX_CPU:
            raise ValueError(part)
        out.update(range(a, b + 1))
    return frozenset(out)


def even_cpus(n: int, sysfs: str = "/sys/devices/system/cpu") -> tuple[frozenset[int], ...]:
    """This process's CPUs cut into n runs of whole cores (a core's SMT siblings never split between ranks), in
    (package, core) order, so a rank's cores sit on as few packages as the count allows; a UsageError where there
    are fewer cores than ranks."""
    allowed = os.sched_getaffinity(0)
    cores: dict[tuple[int, frozenset[int]], None] = {}
    for cpu in sorted(allowed):
        try:
            with open(f"{sysfs}/cpu{cpu}/topology/thread_siblings_list") as f:
                sib = _cpu_list(f.read().strip()) & allowed
            with open(f"{sysfs}/cpu{cpu}/topology/physical_package_id") as f:
                pkg = int(f.read())
        except (OSError, ValueError):  # no topology to read: each CPU its own core
            sib, pkg = frozenset({cpu}), 0
        cores[(pkg, sib)] = None
    taken: set[int] = set()  # a CPU in two sibling lists (one of them unreadable) goes with the first
    order = []
    for pkg, sib in sorted(cores, key=lambda k: (k[0], min(k[1]))):
        if sib - taken:
            order.append((pkg, sib - taken))
            taken |= sib
    if len(order) < n:
        raise UsageError(f"{CPUS_ENV}=auto: {len(order)} core{'s' if len(order) != 1 else ''} for {n} ranks")
    per = len(order) // n
    return tuple(frozenset().union(*(sib for _, sib in order[r * per:(r + 1) * per])) for r in range(n))


def rank_cpus(n: int, text: str | None = None) -> tuple[frozenset[int], ...] | None:
    """Each of n ranks' cores from CCBRIDGE_RANK_CPUS (text: its value; None reads the environment), or None where
    it is unset; a UsageError (one line) for a malformed list, a count other than n, or cores this process may not
    use."""
    text = (os.environ.get(CPUS_ENV, "") if text is None else text).strip()
    if not text:
        return None
    if text.lower() == "auto":
        return even_cpus(n)
    try:
        sets = tuple(_cpu_list(t) for t in text.split(";"))
    except ValueError:
        raise UsageError(f"{CPUS_ENV}={text[:40]!r}: expected a CPU list per rank, ';' between ranks (0-15;16-31)") \
            from None
    if len(sets) < n:  # more than n: a job of fewer ranks takes the first (bench decode --tp 2 4 with 4 lists)
        raise UsageError(f"{CPUS_ENV}: {len(sets)} CPU list{'s' if len(sets) > 1 else ''} for {n} ranks")
    sets, allowed = sets[:n], os.sched_getaffinity(0)
    for r, cpus in enumerate(sets):
        if not cpus <= allowed:
            raise UsageError(f"{CPUS_ENV}: rank {r}'s CPUs {_ranges(cpus - allowed)} are outside this process's "
                             f"{_ranges(allowed)}")
        for q in range(r):
            if cpus & sets[q]:
                raise UsageError(f"{CPUS_ENV}: ranks {q} and {r} share CPUs {_ranges(cpus & sets[q])}: each rank "
                                 "is meant to have its own")
    return sets


def _ranges(cpus) -> str:
    """CPUs as a CPU list is written (0-3,8,10-11), the first few runs of them."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    text = ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:4])
    return text + (",..." if len(runs) > 4 else "")


def _send(link: Connection, obj) -> None:
    # plain pickle, not multiprocessing's: torch registers reductions there that share a tensor's memory through
    # a server only this rank's own multiprocessing children could reach
    link.send_bytes(pickle.dumps(obj))


def _join(job: _Job, rank: int, pinned: bool = False):
    """This rank's device, with the group joined (None and nothing joined without a backend); pinned: the rank
    runs on its own cores (CCBRIDGE_RANK_CPUS)."""
    if job.backend is None:
        return None
    import torch  # deferred: torch, which ranks without a group (the net bench's) need not have
    import torch.distributed as dist

    if job.devices is None:  # CPU ranks share the host's cores: n ranks of all-core thread pools would fight
        torch.set_num_threads(len(os.sched_getaffinity(0)) if pinned else max(1, (os.cpu_count() or 1) // job.n))
        dev = torch.device("cpu")
    else:
        d, count = job.devices[rank], torch.cuda.device_count()
        if not 0 <= d < count:  # torch would only fail at the first op, if at all
            raise GpuError(f"GPU {d} is not visible ({count} GPUs)")
        torch.cuda.set_device(d)
        dev = torch.device("cuda", d)
    timeout = {} if job.group_timeout_s is None else {"timeout": timedelta(seconds=job.group_timeout_s)}
    dist.init_process_group(job.backend, init_method=job.init_method, rank=rank, world_size=job.n, **timeout)
    return dev


class Gate:
    """Ranks started ahead of their turn (run(..., gate=Gate())): they start their interpreter and import torch,
    then wait, touching no GPU, until open() lets them join their group and run, or shut() sends them home (run()
    then returns None for each). A probe starts its slow-to-start ranks with its own start-up this way."""

    def __init__(self):
        self._dir = tempfile.TemporaryDirectory(prefix="ccbridge-gate-")
        self.path = os.path.join(self._dir.name, "gate")
        self.word: str | None = None  # "open" or "shut" once set (run() counts its clocks from the opening)
        self.stopped = False  # stop(): the caller gave up on the ranks, and run() stops them

    def _set(self, word: str) -> None:
        if self._dir is None or self.word is not None:
            return  # closed, or already open or shut: a gate is set once
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.write(word)
        os.replace(tmp, self.path)  # whole or absent: a rank never reads half a word
        self.word = word

    def open(self) -> None:
        self._set("open")

    def shut(self) -> None:
        self._set("shut")

    def stop(self) -> None:
        """The caller gives up on the ranks (they have not ended when it must go on): run() stops them, terminated,
        then killed, at its next pass, and raises its failure."""
        self.stopped = True

    def close(self) -> None:
        """Shut (if it was never opened) and gone; again: nothing."""
        if self._dir is not None:
            self.shut()
            self._dir.cleanup()
            self._dir = None


def _wait_gate(path: str, link: Connection) -> bool:
    """True once the gate opens, False when it was shut, its folder went away or the parent ended (the parent sends
    nothing after the job, so a readable link is its end)."""
    while not os.path.exists(path):
        if not os.path.isdir(os.path.dirname(path)) or link.poll(0.002):
            return False
    with open(path) as f:
        return f.read() == "open"


def rank_main(link: Connection) -> None:
    """A started rank, after _BOOT: join the group, run the target, hand its answer (or its error, one line) to the
    parent. Not for callers: run() starts it."""
    try:
        rank = link.recv()
        cpus = link.recv()
        if cpus:  # before the job is unpickled: that imports its module, and torch sizes its thread pools then
            os.sched_setaffinity(0, cpus)
        job = pickle.loads(link.recv_bytes())
        if job.gate is not None:
            if job.backend is not None:
                import torch.distributed  # noqa: F401 - deferred: torch, its import (seconds) done before the gate
            if not _wait_gate(job.gate, link):
                _send(link, ("done", None))
                return
        dev = _join(job, rank, bool(cpus))
        out = job.target(rank, job.n, dev, lambda obj: _send(link, ("msg", obj)), *job.args)
        if job.backend is not None:
            import torch.distributed as dist  # deferred: torch, as in _join (which imported it)

            dist.destroy_process_group()  # on success only: a failed group's peers may wait in a collective
        _send(link, ("done", out))
    except BaseException as e:  # noqa: BLE001 - every failure goes to the parent as one line
        try:
            _send(link, ("error", (_class_name(e), _first_line(e), time.monotonic())))
        except OSError:
            pass  # the parent is gone: nobody to tell
        sys.exit(1)  # SystemExit: no traceback printed


class _Ranks:
    """The started ranks and what the parent has heard from each."""

    def __init__(self, label: str, n: int, on_message: Callable, failure: type[errors.CCBridgeError]):
        self.label, self.n, self.on_message, self.failure = label, n, on_message, failure
        self.procs: list[subprocess.Popen] = []
        self.links: list[Connection] = []
        self.open: set[int] = set()  # ranks whose link has not ended
        self.done: dict[int, object] = {}
        self.failed: dict[int, tuple[str, str, float]] = {}  # rank -> its error: class name, line, when raised

    def start(self, job: bytes, env: dict[str, str], cpus: tuple[frozenset[int], ...] | None = None) -> None:
        for r in range(self.n):
            mine, theirs = socket.socketpair()
            with theirs:
                self.procs.append(subprocess.Popen([sys.executable, "-c", _BOOT, str(theirs.fileno())], env=env,
                                                   stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),)))
            self.links.append(Connection(mine.detach()))
            self.open.add(r)
            try:
                self.links[r].send(sys.path)
                self.links[r].send(r)
                self.links[r].send(set(cpus[r]) if cpus else None)
                self.links[r].send_bytes(job)
            except OSError:  # it ended before reading its job: hear() and dead() will say so
                pass

    def hear(self, timeout: float) -> bool:
        """What the ranks sent, waiting up to timeout for the first of it; True if any rank spoke."""
        spoke = False
        for link in wait([self.links[r] for r in sorted(self.open)], timeout):
            r = self.links.index(link)
            try:
                kind, body = pickle.loads(link.recv_bytes())
            except (EOFError, OSError):  # the rank ended (OSError: in the middle of a message)
                self.open.discard(r)
                continue
            spoke = True
            if kind == "msg":
                self.on_message(r, body)
            elif kind == "done":
                self.done[r] = body
            else:
                self.failed.setdefault(r, body)
        return spoke

    def dead(self) -> list[int]:
        """Ranks that ended with neither an answer nor an error, everything they sent read."""
        return [r for r, p in enumerate(self.procs) if p.poll() is not None and r not in self.done
                and r not in self.failed and not (r in self.open and self.links[r].poll(0))]

    def answered(self) -> str:
        return f"answered: {sorted(self.done) or 'none'} of {self.n}"

    def cause(self) -> errors.CCBridgeError:
        """The error to raise once a rank failed. The others get GRACE_S to speak or end first: a rank that died
        without a word is then the cause (its peers' errors are a lost connection), else the first error raised (by
        the ranks' monotonic clock, the host's: two errors may reach here in either order)."""
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(p.poll() is None and r not in self.failed and r not in self.done
                                                  for r, p in enumerate(self.procs)):
            self.hear(POLL_S)
        for r in self.dead():
            code = self.procs[r].returncode
            how = f"signal {-code}" if code < 0 else f"exit status {code}"
            return self.failure(f"{self.label} rank {r} of {self.n} {'died' if code else 'ended'} ({how}) "
                                "without a word")
        rank, (name, text, _) = min(self.failed.items(), key=lambda kv: kv[1][2])
        return rank_error(self.label, rank, self.n, name, text, self.failure)

    def stop(self, grace_s: float) -> None:
        """Every rank ended: each may take grace_s on its own, then it is terminated, then killed."""
        for p in self.procs:
            for end, wait_s in ((None, grace_s), (p.terminate, 5.0), (p.kill, None)):
                if end is not None:
                    end()
                try:
                    p.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        for link in self.links:
            link.close()


def run(n: int, target: Callable, *args, label: str, backend: str | None = None,
        devices: list[int] | None = None, rendezvous: str = "tcp", env: dict[str, str] | None = None,
        on_message: Callable = lambda rank, obj: None, stall_s: float | None = None, timeout_s: float | None = None,
        failure: type[errors.CCBridgeError] = GpuError, gate: Gate | None = None) -> list:
    """target(rank, n, dev, send, *args) on n started ranks; their return values, by rank.

    label names the ranks in errors ("tensor-parallel rank 1 of 2 failed: ..."). backend: "nccl" or "gloo" to join
    one process group before target runs (devices: rank r on GPU devices[r]; None: CPU ranks), None for none.
    rendezvous: "tcp" (a free port of 127.0.0.1) or "file" (a file in a private folder). env: variables the ranks
    have on top of this process's environment (NVLS_OFF always on top). on_message(rank, obj) here for each
    send(obj) there. stall_s: stop the ranks when none has spoken for that long (also the group's timeout);
    timeout_s: when they have not all answered after that long. target, args and what ranks send must pickle
    (target a module-level function). gate: the ranks wait for it (Gate) before they join; stall_s and timeout_s
    count from its opening."""
    if rendezvous not in RENDEZVOUS:
        raise ValueError(f"rendezvous must be one of {', '.join(RENDEZVOUS)}, not {rendezvous!r}")
    if devices is not None and len(devices) != n:
        raise ValueError(f"{n} ranks need {n} devices, got {len(devices)}")
    cpus = rank_cpus(n)
    ranks = _Ranks(label, n, on_message, failure)
    ok = False
    with tempfile.TemporaryDirectory(prefix="ccbridge-ranks-") as tmp:
        init = (None if backend is None else f"file://{os.path.join(tmp, 'init')}" if rendezvous == "file"
                else f"tcp://127.0.0.1:{free_port()}")
        job = pickle.dumps(_Job(target, args, n, backend, None if devices is None else tuple(devices), init, stall_s,
                                None if gate is None else gate.path))
        try:
            ranks.start(job, {**os.environ, **(env or {}), **NVLS_OFF}, cpus)
            start = heard = time.monotonic()
            while len(ranks.done) < n:
                if gate is not None and gate.word is None:  # waiting for its turn: no clock yet
                    start = heard = time.monotonic()
                if gate is not None and gate.stopped:
                    raise failure(f"{label} ranks: stopped by their caller ({ranks.answered()})")
                if ranks.hear(POLL_S):
                    heard = time.monotonic()
                if ranks.failed or ranks.dead():
                    raise ranks.cause()
                if stall_s is not None and time.monotonic() - heard > stall_s:
                    raise failure(f"{label} ranks: none spoke for {stall_s:g} s ({ranks.answered()}); stopped them")
                if timeout_s is not None and time.monotonic() - start > timeout_s:
                    raise failure(f"{label} ranks: not all answered within {timeout_s:g} s ({ranks.answered()}); "
                                  "stopped them")
            ok = True
        finally:
            ranks.stop(END_S if ok else 0)
    return [ranks.done[r] for r in range(n)]
