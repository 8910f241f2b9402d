"""Peer: GPU-to-GPU copies and NCCL operations, at the level bridge-law section 6 publishes them.

Under CC each cross-GPU operation pays a fixed device-side toll (the secure firmware sets it up) and large
transfers keep a fraction of NVLink's bandwidth (Tinfoil, NCCL 2.28.9). So per-op latency (4 KiB-1 MiB) is
timed two ways: `eager`, N back-to-back ops between CUDA events (the host's launches are in it, and under CC
their toll), and `graph`, the same N ops captured into one CUDA graph and replayed (the GPU's time per op:
where `ccbridge calibrate` compares the published toll); bandwidth at 256 MiB and 1 GiB as nccl-tests defines it.
Every rank checks every sample exactly: random integers 1..15 (no zeros, so a missed contribution shows),
restored before each sample, each op on its own buffer, sums exact in float32. Each sample starts, on every rank,
right after one 4-byte all_reduce that all ranks queue ahead of it (untimed): the ranks' samples start together
on their GPUs, so rank 0's figure holds no other rank's late start (nccl-tests meets at a barrier before timing).
One process per GPU, started by ccbridge.ranks (never a fork of a CUDA process); ranks inherit the environment,
so an emulator's preload applies to every rank. Rank 0's times make the rows.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import warnings
from dataclasses import dataclass

from ccbridge import busbw, gputimer, ranks
from ccbridge.bindings import core
from ccbridge.errors import GpuError
from ccbridge.gputimer import time_ms as gpu_time_ms
from ccbridge.probe.registry import test
from ccbridge.results import Row
from ccbridge.textfit import wrap

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
P2P_BYTES = 256 * MiB
SMALL_BYTES = (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB)  # the published toll: messages <= 1 MB
LARGE_BYTES = (256 * MiB, GiB)  # the published bandwidth kept: large transfers (quick: 256 MiB only)
MODES = ("eager", "graph")
ALLREDUCE, SENDRECV, ONE_RANK = "peer.allreduce", "peer.sendrecv", "peer.allreduce_1rank"
MODE_NOTE = {"eager": "N back-to-back ops between CUDA events: host launches included",
             "graph": "N ops captured in one CUDA graph, replayed: device time per op"}
RANK_TIMEOUT_S = 900


@test("peer.p2p", "GPU-to-GPU copy bandwidth matrix and 8-byte exchange latency", needs=("gpu", "torch", "multi_gpu"))
def p2p(ctx):
    import torch  # deferred: torch, which the registry must not need to list the tests

    n = torch.cuda.device_count()
    reps = ctx.pick(5, 3)
    rows = []
    bufs = [torch.randint(0, 255, (P2P_BYTES,), dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    small = [torch.randint(1, 255, (8,), dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            ctx.step(f"GPU{i} -> GPU{j}")
            dst = torch.empty_like(bufs[i], device=f"cuda:{j}")
            dst.copy_(bufs[i])
            torch.cuda.synchronize(j)
            if not torch.equal(dst.cpu()[:4096], bufs[i].cpu()[:4096]):
                raise GpuError(f"GPU{i}->GPU{j} copy is not byte-exact")
            with torch.cuda.device(j):
                ms = gpu_time_ms(torch, lambda: dst.copy_(bufs[i]), reps=reps)
            rows.append(Row.of("peer.p2p", "bandwidth", "GB/s", [P2P_BYTES / (t * 1e-3) / 1e9 for t in ms], src=i, dst=j))
            del dst
            lat = []
            sdst = torch.empty(8, dtype=torch.uint8, device=f"cuda:{j}")
            for _ in range(ctx.pick(200, 50)):
                t0 = time.perf_counter()
                sdst.copy_(small[i])
                torch.cuda.synchronize(j)
                lat.append((time.perf_counter() - t0) * 1e6)
            rows.append(Row.of("peer.p2p", "latency_8B", "us", lat, src=i, dst=j))
    return rows


@dataclass(frozen=True)
class Plan:
    """What each rank runs: op ("all_reduce" or "sendrecv": each rank sends to the next, receives from the
    previous, one NCCL group), the latency and bandwidth sizes, ops per latency sample, samples per case."""
    op: str
    small: tuple[int, ...]
    large: tuple[int, ...]
    ops: int
    reps: int


class _Case:
    """`n` ops of `nbytes` each, every op on its own slice of one flat buffer; restore() puts the inputs back,
    check() compares every slice with the exact expected result."""

    def __init__(self, torch, dist, op: str, nbytes: int, n: int, rank: int, world: int):
        self.torch, self.dist, self.op, self.n = torch, dist, op, n
        self.rank, self.world, self.count = rank, world, nbytes // 4
        dev = torch.device("cuda", torch.cuda.current_device())

        def data(r):  # rank r's input, regenerated on any rank from its seed
            g = torch.Generator(device=dev).manual_seed(1_000_003 * nbytes + r)
            return torch.randint(1, 16, (n * self.count,), generator=g, device=dev, dtype=torch.float32)

        self.input = data(rank)
        if op == "all_reduce":
            self.buf, self.expect = torch.empty_like(self.input), data(0)
            for r in range(1, world):
                self.expect += data(r)
        else:
            self.buf, self.expect = torch.empty_like(self.input), data((rank - 1) % world)
        self.peers = ((rank + 1) % world, (rank - 1) % world)
        self.meet = torch.ones(1, device=dev)  # the untimed all_reduce every sample starts after (align())

    def restore(self) -> None:
        if self.op == "all_reduce":
            self.buf.copy_(self.input)
        else:
            self.buf.zero_()

    def run(self, i: int) -> None:
        part = slice(i * self.count, (i + 1) * self.count)
        if self.op == "all_reduce":
            self.dist.all_reduce(self.buf[part])
            return
        d = self.dist
        for req in d.batch_isend_irecv([d.P2POp(d.isend, self.input[part], self.peers[0]),
                                        d.P2POp(d.irecv, self.buf[part], self.peers[1])]):
            req.wait()

    def run_all(self) -> None:
        for i in range(self.n):
            self.run(i)

    def check(self) -> None:
        if not self.torch.equal(self.buf, self.expect):
            bad = int((self.buf != self.expect).sum())
            raise GpuError(f"{self.op} of {self.count * 4} B on rank {self.rank} of {self.world}: {bad} of "
                           f"{self.buf.numel()} values differ from the exact result")

    def sample_ms(self, body, backend: str | None = None) -> float:
        """Device time per op (ms) of body() (all n ops), by `backend` (None: the run's GPU timer), inputs
        restored first, checked after."""
        torch = self.torch
        self.restore()
        torch.cuda.synchronize()
        ms = gpu_time_ms(torch, body, 1, backend=backend, before=self.align if self.world > 1 else None)[0]
        self.check()
        return ms / self.n

    def align(self) -> None:
        """One 4-byte all_reduce, queued ahead of a sample's start mark: the current stream reaches the mark when
        every rank has joined it, so the ranks' samples start together on their GPUs."""
        self.dist.all_reduce(self.meet)

    def graph(self):
        """The n ops captured into one CUDA graph (thread-local capture: NCCL's watchdog thread may query
        events while this thread captures)."""
        g = self.torch.cuda.CUDAGraph()
        with warnings.catch_warnings():
            # natively a one-rank in-place all_reduce is no work at all: its graph is rightly empty
            warnings.filterwarnings("ignore", "The CUDA Graph is empty")
            with self.torch.cuda.graph(g, capture_error_mode="thread_local"):
                self.run_all()
        return g


def _measure(torch, dist, plan: Plan, rank: int, world: int) -> dict:
    """{"small": {mode: {bytes: [ms per op]}}, "large": {bytes: [ms per op]}}; the first sample of each case
    (communicator set-up, graph upload) is not kept."""
    out: dict = {"small": {m: {} for m in MODES}, "large": {}}
    for nbytes in plan.small:
        case = _Case(torch, dist, plan.op, nbytes, plan.ops, rank, world)
        for mode in MODES:
            body = case.graph().replay if mode == "graph" else case.run_all
            out["small"][mode][nbytes] = [case.sample_ms(body) for _ in range(plan.reps + 1)][1:]
    for nbytes in plan.large:
        case = _Case(torch, dist, plan.op, nbytes, 1, rank, world)
        out["large"][nbytes] = [case.sample_ms(case.run_all) for _ in range(plan.reps + 1)][1:]
        del case
        torch.cuda.empty_cache()
    return out


def timer_pairs(rank: int, world: int, dev, send, plan: Plan, rounds: int) -> dict:
    """A rank of bench/timer_agreement.py --peer (issue 32): each small case of `plan` timed by both GPU timers
    on the same ranks, in alternation, so the two meet the same op on the same communicator and buffers (apart
    runs of the peer family move a row by up to 1.5x)."""
    import torch  # deferred, as in _rank
    import torch.distributed as dist

    return _timer_pairs(torch, dist, plan, rank, world, rounds)


def _timer_pairs(torch, dist, plan: Plan, rank: int, world: int, rounds: int, case=None) -> dict:
    """{mode: {bytes: {backend: [the median of plan.reps samples, each round]}}}: per round, one median of each
    backend in turn (gputimer.in_turn: events first in even rounds), after one untimed sample per case and mode
    (set-up, graph upload)."""
    out: dict = {m: {} for m in MODES}
    for nbytes in plan.small:
        c = (case or _Case)(torch, dist, plan.op, nbytes, plan.ops, rank, world)
        for mode in MODES:
            body = c.graph().replay if mode == "graph" else c.run_all
            c.sample_ms(body)
            by = out[mode].setdefault(nbytes, {b: [] for b in gputimer.BACKENDS})
            for r in range(rounds):
                for b in gputimer.in_turn(r):
                    by[b].append(statistics.median(c.sample_ms(body, b) for _ in range(plan.reps)))
    return out


def _rank(rank: int, world: int, dev, send, plan: Plan) -> dict:
    """One rank, on its GPU and in its NCCL group (ccbridge.ranks joined them): its measurements."""
    import torch  # deferred: torch (the probe registry imports this module where torch may be missing)
    import torch.distributed as dist

    out = _measure(torch, dist, plan, rank, world)
    send(out)  # now: leaving the group and ending take longer than the measurements (run_ranks)
    return out


def run_ranks(devices: list[int], plan: Plan, timeout_s: float = RANK_TIMEOUT_S, gate: ranks.Gate | None = None,
              env: dict[str, str] | None = None, on_message=lambda rank, obj: None) -> dict | None:
    """Run `plan` on one rank per device, started by ccbridge.ranks (rank r on devices[r], one NCCL group met
    through a file); rank 0's measurements (None when a gate was shut), or a GpuError naming the first rank that
    failed, died or did not answer in time. Each rank also sends its measurements (on_message(rank, them)) before
    it leaves its group and ends, which take it half a second or more (bench/RESULTS.md 2026-11-28, session 24)."""
    return ranks.run(len(devices), _rank, plan, label=plan.op, backend="nccl", devices=devices, rendezvous="file",
                     timeout_s=timeout_s, gate=gate, env=env, on_message=on_message)[0]


class EarlyRanks:
    """run_ranks() started ahead of its test's turn (ranks.Gate: the ranks start and import torch, then wait,
    touching no GPU); result() lets them run and returns rank 0's measurements as soon as they arrive: the ranks
    leave their group and end in the background, and close() waits for that (the probe calls it after its
    reports, which it hides behind; the test runs last for it: registry's `last`)."""

    ENDING_S = 30.0  # how long close() lets the rank end (it takes about a second) before it stops it

    def __init__(self, devices: list[int], plan: Plan, timer: str):
        if len(devices) != 1:  # rank 0's measurements say nothing of another rank's exact-result check
            raise ValueError(f"EarlyRanks runs a one-rank job, not {len(devices)} ranks")
        self.devices, self.plan, self.timer, self.gate = devices, plan, timer, ranks.Gate()
        self._out: dict = {}
        self._arrived = threading.Event()  # rank 0's measurements, or the job's end (with or without them)
        self._thread = threading.Thread(target=self._run, daemon=True, name="ccbridge-early-ranks")
        self._thread.start()

    def _heard(self, rank: int, obj) -> None:
        if rank == 0:
            self._out.setdefault("payload", obj)
            self._arrived.set()

    def _run(self) -> None:
        try:
            # started before the run sets its timer in the environment: the ranks get it here
            payload = run_ranks(self.devices, self.plan, gate=self.gate, env={gputimer.ENV_VAR: self.timer},
                                on_message=self._heard)
            self._out.setdefault("payload", payload)
        except BaseException as e:  # noqa: BLE001 - handed to result(), unless the measurements came first
            self._out["error"] = e
        finally:
            self._arrived.set()

    def result(self) -> dict:
        self.gate.open()
        self._arrived.wait()
        if "payload" not in self._out:
            raise self._out["error"]
        return self._out["payload"]

    def close(self) -> None:
        """The ranks ended: waits ENDING_S for that, then stops them; an error after the measurements (a rank
        that failed or hung while it left its group) is a note on stderr, the measurements stand."""
        self.gate.close()  # unopened: the ranks leave without joining
        self._thread.join(timeout=self.ENDING_S)
        if self._thread.is_alive():
            self.gate.stop()
            self._thread.join(timeout=15)  # run() terminates them, then kills them after 5 s
        if "payload" in self._out and "error" in self._out:
            print("\n".join(wrap([f"ccbridge probe: note: after its measurements, {self._out['error']}"])),
                  file=sys.stderr)


def rows(test_id: str, op: str, payload: dict, world: int, ops: int) -> list[Row]:
    """Rows of one rank's measurements: us per op by size and mode; GB/s (bus bandwidth) at the large sizes."""
    out = []
    for mode, by_size in payload["small"].items():
        for nbytes, ms in by_size.items():
            r = Row.of(test_id, "time_per_op", "us", [t * 1e3 for t in ms], bytes=nbytes, mode=mode, ranks=world)
            r.extra.update(ops_per_sample=ops, note=MODE_NOTE[mode])
            out.append(r)
    for nbytes, ms in payload["large"].items():
        r = Row.of(test_id, "busbw", "GB/s", [nbytes / (t * 1e-3) / 1e9 * busbw.factor(op, world) for t in ms],
                   bytes=nbytes, ranks=world)
        r.extra.update(time_us=statistics.median(ms) * 1e3,
                       note=f"nccl-tests' bus bandwidth: bytes / time x {busbw.formula(op)}")
        out.append(r)
    return out


def _plan(settings, op: str, small, large) -> Plan:
    return Plan(op, tuple(small), tuple(large), ops=settings.pick(50, 20), reps=settings.pick(20, 10))


def _collective(ctx, test_id: str, op: str, devices: list[int], small, large) -> list[Row]:
    plan = _plan(ctx.settings, op, small, large)
    ctx.step(f"NCCL {op} on {len(devices)} GPU(s)")
    early = ctx.ahead
    if isinstance(early, EarlyRanks) and (early.devices, early.plan, early.timer) == (devices, plan,
                                                                                      ctx.settings.timer):
        payload = early.result()
    else:
        payload = run_ranks(devices, plan)
    return rows(test_id, op, payload, len(devices), plan.ops)


@test(ALLREDUCE, "NCCL all_reduce on all GPUs: per-op time 4 KiB-1 MiB (eager and graph), bus bandwidth from 256 MiB",
      needs=("gpu", "torch", "multi_gpu"))
def allreduce(ctx):
    return _collective(ctx, ALLREDUCE, "all_reduce", list(range(ctx.machine.gpu_count)), SMALL_BYTES,
                       ctx.pick(LARGE_BYTES, LARGE_BYTES[:1]))


@test(SENDRECV, "NCCL send/recv ring on all GPUs: per-op time 4 KiB-1 MiB (eager and graph), bandwidth from 256 MiB",
      needs=("gpu", "torch", "multi_gpu"))
def sendrecv(ctx):
    return _collective(ctx, SENDRECV, "sendrecv", list(range(ctx.machine.gpu_count)), SMALL_BYTES,
                       ctx.pick(LARGE_BYTES, LARGE_BYTES[:1]))


def _early_one_rank(settings) -> EarlyRanks | None:
    """The one-rank job's rank, started while the probe starts (its interpreter and torch take seconds)."""
    if core.device_count() <= settings.device:
        return None
    return EarlyRanks([settings.device], _plan(settings, "all_reduce", SMALL_BYTES[:1], ()), settings.timer)


@test(ONE_RANK, "NCCL all_reduce of 4 KiB on a one-rank communicator: per-op time, eager and graph (an emulator's "
      "per-op charge alone)", needs=("gpu", "torch"), ahead=_early_one_rank, last=True)
def allreduce_1rank(ctx):
    return _collective(ctx, ONE_RANK, "all_reduce", [ctx.device], SMALL_BYTES[:1], ())
