"""`ccbridge bench net`: the NCCL net plugin's own loopback stream between two
processes (started by ccbridge.ranks, linked by a socket of their own), driven
through its v11 API as NCCL's proxy thread drives it (no GPU, no NCCL):
encrypted GB/s per message size and lane count with the cores the plugin's
threads used on each side, and the half round trip of small messages. Beside each
encrypted row: plain TCP loopback with as many streams, and the CPU's own bound
for encrypted TCP on the cores this process may use (`cpu_bound`), from rates
measured in the same run. Received bytes are checked against what was sent (first and last round of
every measurement, by memcmp against patterns made before the clock starts).
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener

from ccbridge import env as envmod
from ccbridge import environ, libcrypto, pluginenv, ranks
from ccbridge.bindings import libc, ncclnet
from ccbridge.errors import SecureError, UsageError
from ccbridge.results import Result, Row
from ccbridge.secure import keys, netplugin

DEADLINE_S = 120.0
# the stream's polling pause. NCCL's proxy thread polls without one but yields its core after a pass that found
# nothing (proxy.cc: `if (idle) sched_yield();`), so a plugin thread woken on that core runs at once; on a machine
# of few cores a Python loop that never sleeps still takes the plugin threads' CPU, so it sleeps there
POLL_S = 0.0 if (os.cpu_count() or 1) >= 8 else 1e-5


# the plugin's record plan (native/ncclnet/plan.c record_plan, plan.h RECORD_MIN/RECORD_MAX): the record size
# the AES-GCM rate is measured at
RECORD_MIN, RECORD_MAX = 32 << 10, 512 << 10
HEADER_BYTES = 40  # a record's header, its AAD
GCM_S = 0.25  # seconds of AES-GCM per thread per measurement


def record_bytes(size: int, lanes: int) -> int:
    if size <= RECORD_MIN:
        return max(size, 1)
    r = -(-size // lanes)
    r = (r + 4095) & ~4095
    return min(max(r, RECORD_MIN), RECORD_MAX)


def cores_visible() -> int:
    return len(os.sched_getaffinity(0))


def _gcm_thread(record: int, decrypt: bool, out: list) -> None:
    """AES-256-GCM over record-sized pieces, as a lane seals or opens them, for GCM_S seconds of this
    thread's CPU: appends (bytes, CPU seconds). One EVP update per record (a fresh nonce every 64
    records): the ctypes call costs ~1 us, under 2% of a 256 KiB record's time at 4 GB/s."""
    so = libcrypto.lib()
    init, update = (so.EVP_DecryptInit_ex, so.EVP_DecryptUpdate) if decrypt else (so.EVP_EncryptInit_ex,
                                                                                  so.EVP_EncryptUpdate)
    ctx = so.EVP_CIPHER_CTX_new()
    src, dst = ctypes.create_string_buffer(os.urandom(record), record), ctypes.create_string_buffer(record)
    aad, outl, iv = ctypes.create_string_buffer(HEADER_BYTES), ctypes.c_int(), bytearray(12)
    try:
        if init(ctx, so.EVP_aes_256_gcm(), None, os.urandom(32), None) != 1:
            raise SecureError("bench net: EVP cipher initialisation failed")
        done, c0 = 0, time.thread_time()
        while time.thread_time() - c0 < GCM_S:
            iv[4:12] = done.to_bytes(8, "little")
            init(ctx, None, None, None, bytes(iv))
            update(ctx, None, ctypes.byref(outl), aad, HEADER_BYTES)
            for _ in range(64):
                if update(ctx, dst, ctypes.byref(outl), src, record) != 1:
                    raise SecureError("bench net: EVP update failed")
            done += 64
        out.append((done * record, time.thread_time() - c0))
    finally:
        so.EVP_CIPHER_CTX_free(ctx)


def gcm_rate(record: int, threads: int, decrypt: bool) -> float:
    """GB/s per core of AES-256-GCM at this record size with `threads` threads at once (ctypes releases the
    GIL): bytes over the threads' own CPU time, which the machine's other load does not blur."""
    out: list = []
    ts = [threading.Thread(target=_gcm_thread, args=(record, decrypt, out)) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if len(out) != threads:
        raise SecureError("bench net: the AES-GCM rate measurement failed")
    return sum(b for b, _ in out) / sum(c for _, c in out) / 1e9


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pattern(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


class _Side:
    """One process: the plugin, a send comm to the peer and a receive comm from it."""

    def __init__(self, pipe, lanes: int):
        os.environ["CCBRIDGE_NET_LANES"] = str(lanes)
        self.net = netplugin.Net()
        self.net.check("init", self.net.rc)
        self.pipe = pipe
        deadline = time.monotonic() + DEADLINE_S
        handle, self.lcomm = self.net.listen()
        pipe.send(bytes(handle))
        peer = pipe.recv()
        # connect and accept progress together (each side's accept needs the other's connect)
        sc, rc = ctypes.c_void_p(), ctypes.c_void_p()
        buf = ctypes.create_string_buffer(peer, ncclnet.HANDLE_BYTES)
        while not (sc.value and rc.value):
            if not sc.value:
                self.net.check("connect", self.net.t.connect(self.net.ctx, 0, buf, ctypes.byref(sc), None))
            if not rc.value:
                self.net.check("accept", self.net.t.accept(self.lcomm, ctypes.byref(rc), None))
            if time.monotonic() > deadline:
                raise TimeoutError("connect/accept")
            time.sleep(0.001)
        self.send, self.recv = sc, rc

    def close(self):
        self.net.t.closeSend(self.send)
        self.net.t.closeRecv(self.recv)
        self.net.t.closeListen(self.lcomm)
        self.net.t.finalize(self.net.ctx)


def _stream(side: _Side, sender: bool, size: int, inflight: int, total: int) -> dict:
    """Move `total` bytes in messages of `size`, `inflight` at a time; the receiver times it.

    The loop is what NCCL's proxy thread does and no more: the plugin's own entry points with
    arguments made before the clock starts (the blocking helpers of netplugin.Net cost ~10 us a
    message in Python, which capped 64 KiB messages), and the received bytes of the first and
    last rounds compared with a memcmp against patterns also made before (drawing a 4 MiB pattern
    in the loop took ~5 ms, 16 times a measurement: more than the plugin's own time at 4 MiB)."""
    net, t = side.net, side.net.t
    memcmp = libc.lib().memcmp
    n = max(size, 1)
    bufs = [(ctypes.c_char * n)() for _ in range(inflight)]
    want = [(ctypes.c_char * n).from_buffer_copy(_pattern(i, size).ljust(n, b"\0")) for i in range(inflight)]
    if sender:
        for b, w in zip(bufs, want):
            ctypes.memmove(b, w, size)
    count = max(2 * inflight, total // n)
    comm = side.send if sender else side.recv
    reqs = [ctypes.c_void_p() for _ in range(inflight)]
    preqs = [ctypes.byref(r) for r in reqs]
    done, got = ctypes.c_int(), ctypes.c_int()
    pdone, pgot = ctypes.byref(done), ctypes.byref(got)
    if sender:
        def post(slot):
            return t.isend(comm, bufs[slot], size, 0, None, None, preqs[slot])
    else:
        datas = [(ctypes.c_void_p * 1)(ctypes.addressof(b)) for b in bufs]
        sizes = [(ctypes.c_size_t * 1)(size) for _ in bufs]
        tag = (ctypes.c_int * 1)(0)

        def post(slot):
            return t.irecv(comm, 1, datas[slot], sizes[slot], tag, None, None, preqs[slot])
    side.pipe.send("ready")
    side.pipe.recv()  # the peer may have measured the uncoupled bound meanwhile: the deadline counts from here
    deadline = time.monotonic() + DEADLINE_S
    main0, cpu0, t0 = time.thread_time(), _cpu_s(), time.perf_counter()
    bad = 0
    for m in range(count + inflight):
        slot = m % inflight
        if m >= inflight:  # message m - inflight, in this slot
            while True:
                rc = t.test(reqs[slot], pdone, pgot)
                if rc:
                    raise netplugin.NetError("test", rc, net.why())
                if done.value:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("test")
                netplugin.idle(POLL_S)
            if not sender and (m - inflight < inflight or m - inflight >= count - inflight):
                bad += got.value != size or (size and memcmp(bufs[slot], want[slot], size) != 0)
        if m < count:
            reqs[slot].value = None
            while not reqs[slot].value:  # NULL: the plugin is full, NCCL retries
                rc = post(slot)
                if rc:
                    raise netplugin.NetError("isend" if sender else "irecv", rc, net.why())
                if time.monotonic() > deadline:
                    raise TimeoutError("isend" if sender else "irecv")
    wall = time.perf_counter() - t0
    poll_cpu = time.thread_time() - main0
    plugin_cpu = (_cpu_s() - cpu0) - poll_cpu
    return {"wall": wall, "bytes": count * size, "plugin_cores": plugin_cpu / wall, "poll_cores": poll_cpu / wall,
            "bad": bad}


def _tcp_stream(pipe, sender: bool, size: int, streams: int, total: int, inflight: int) -> dict:
    """The same bytes over `streams` plain TCP loopback connections, one thread each, no
    encryption: what this kernel's loopback carries with as many streams as the plugin's lanes.
    The senders cycle through `inflight` buffers as the plugin's stream does (one shared 4 MiB
    buffer stayed in cache, where the plugin reads 8 x 4 MiB from memory); the receivers' own
    buffers, one a stream, add up to about the plugin's receive buffers."""
    per = max(1, total // max(size, 1) // streams)
    bufs = [bytearray(_pattern(i, size)) for i in range(max(inflight, 1))]
    if sender:
        pipe.send("ready")
        port = pipe.recv()
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(streams)]
    else:
        ls = socket.create_server(("127.0.0.1", 0), backlog=streams)
        pipe.send(ls.getsockname()[1])
        pipe.recv()
        socks = [ls.accept()[0] for _ in range(streams)]
        ls.close()
    cpu0, t0 = _cpu_s(), time.perf_counter()

    def send(s, first):
        for i in range(per):
            s.sendall(bufs[(first + i) % len(bufs)])

    def recv(s):
        view, want = memoryview(bytearray(size)), per * size
        while want:
            n = s.recv_into(view, min(size, want))
            if not n:
                raise ConnectionError("the peer closed early")
            want -= n

    threads = [threading.Thread(target=send, args=(s, i)) if sender else threading.Thread(target=recv, args=(s,))
               for i, s in enumerate(socks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for s in socks:
        s.close()
    return {"wall": wall, "bytes": per * size * streams, "plugin_cores": (_cpu_s() - cpu0) / wall, "bad": 0}


def _pingpong(side: _Side, first: bool, size: int, iters: int) -> float:
    net = side.net
    out, back = (ctypes.c_char * max(size, 1))(), (ctypes.c_char * max(size, 1))()
    side.pipe.send("ready")
    side.pipe.recv()
    deadline = time.monotonic() + DEADLINE_S
    t0 = 0.0
    for i in range(iters + 50):  # 50 warm-up round trips
        if i == 50:
            t0 = time.perf_counter()
        if first:
            s = net.isend(side.send, out, size, deadline)
            r = net.irecv(side.recv, back, size, deadline)
            net.wait(s, deadline, pause=POLL_S)
            net.wait(r, deadline, pause=POLL_S)
        else:
            net.wait(net.irecv(side.recv, back, size, deadline), deadline, pause=POLL_S)
            net.wait(net.isend(side.send, out, size, deadline), deadline, pause=POLL_S)
    return (time.perf_counter() - t0) / iters / 2 * 1e6


def _meet(rank: int, path: str) -> Connection:
    """The link to the other process, a Unix socket at `path` (in the parent's private folder): rank 0 listens,
    rank 1 calls until it answers. The two agree on each step over it (the plugin's handles, the TCP baseline's
    port, "ready"); their results go to the parent."""
    if rank == 0:
        with Listener(path, family="AF_UNIX") as ls:
            return ls.accept()
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            return Client(path, family="AF_UNIX")
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise TimeoutError("the other bench process did not listen") from None
            time.sleep(0.01)


def _rank(rank: int, n: int, dev, send, plan: list[tuple], meet: str, bound: _Bound | None = None) -> None:
    """One of the two bench processes (ccbridge.ranks started it, no process group): rank 0 sends, rank 1
    receives; each result goes to the parent through send. With `bound`, rank 0
    measures the bound once right after each repeat of a stream at the largest size, at its lanes, while rank 1
    waits for the next step: each repeat has its bound from the same moment of a host whose speed drifts."""
    pipe = _meet(rank, meet)
    paired = max((s[2] for s in plan if s[0] == "stream"), default=None) if bound else None
    lanes = None
    side = None
    for what, lanes_now, size, inflight, amount, repeat in plan:
        if lanes_now != lanes:
            if side:
                side.close()
            side, lanes = _Side(pipe, lanes_now), lanes_now
        for _ in range(repeat):
            if what == "stream":
                got = _stream(side, rank == 0, size, inflight, amount)
                if rank == 0 and size == paired:
                    got["bound"] = bound.once(lanes_now)
                send(("stream", got))
            elif what == "tcp":
                send(("tcp", _tcp_stream(pipe, rank == 0, size, lanes_now, amount, inflight)))
            else:
                send(("rtt", _pingpong(side, rank == 0, size, amount)))
    side.close()


class _Rows:
    """The two processes' results, paired in plan order (each sends one per repeat of each step): a row, and its
    progress line, as soon as both gave every repeat of a step."""

    def __init__(self, plan: list[tuple], progress):
        self.plan, self.progress = list(plan), progress
        self.got: tuple[list, list] = ([], [])
        self.rows: list[Row] = []
        self.bound_rows: list[Row] = []
        self.skipped: list[dict] = []

    def take(self, rank: int, msg: tuple) -> None:
        self.got[rank].append(msg[1])
        while len(self.rows) < len(self.plan) and min(map(len, self.got)) >= self.plan[len(self.rows)][5]:
            rep = self.plan[len(self.rows)][5]
            pairs = list(zip(self.got[0][:rep], self.got[1][:rep]))
            del self.got[0][:rep], self.got[1][:rep]
            self.rows.append(self._row(self.plan[len(self.rows)], pairs))
        if len(self.rows) == len(self.plan) and any(self.got):
            raise netplugin.NetError("bench", -1, "a bench process ran past the plan")

    def _row(self, step: tuple, pairs: list[tuple]) -> Row:
        what, n, size, infl, _, _ = step
        samples, extra = [], {"plugin_cores_send": [], "plugin_cores_recv": [], "bad": 0}
        for v0, v1 in pairs:
            if what in ("stream", "tcp"):
                samples.append(v1["bytes"] / v1["wall"] / 1e9)
                if "bound" in v0:
                    extra.setdefault("bounds", []).append(v0["bound"])
                extra["plugin_cores_send"].append(round(v0["plugin_cores"], 2))
                extra["plugin_cores_recv"].append(round(v1["plugin_cores"], 2))
                if what == "stream":  # the polling threads (as NCCL's proxy threads poll), beside the plugin's
                    extra.setdefault("poll_cores", []).append(round(v0["poll_cores"] + v1["poll_cores"], 2))
                extra["bad"] += v1["bad"]
            else:
                samples.append(v0)
        # the cost per byte, which a loaded machine's wall clock does not blur: CPU-seconds of the
        # plugin's threads (or the TCP streams' threads) per GB moved (cores / GB/s), the median over
        # the repeats, per side
        for side in ("send", "recv"):
            per = sorted(c / g for c, g in zip(extra[f"plugin_cores_{side}"], samples) if g > 0)
            extra[f"cpu_s_per_gb_{side}"] = round(per[len(per) // 2], 3) if per else None
        if what == "tcp":
            row = Row.of("net_loopback", "tcp_plaintext", "GB/s", samples, size=size, streams=n)
            row.extra = {"cores_send": extra["plugin_cores_send"], "cores_recv": extra["plugin_cores_recv"],
                         "cpu_s_per_gb_send": extra["cpu_s_per_gb_send"],
                         "cpu_s_per_gb_recv": extra["cpu_s_per_gb_recv"]}
            self.progress(f"  plain TCP {size:>10} B, streams {n:>2}: {row.median:6.2f} GB/s")
        elif what == "stream":
            bounds = extra.pop("bounds", None)
            row = Row.of("net_loopback", "stream", "GB/s", samples, size=size, lanes=n, inflight=infl)
            row.extra = extra
            self.progress(f"  encrypted {size:>10} B, lanes {n:>2}: {row.median:6.2f} GB/s"
                          + ("  WRONG BYTES" if extra["bad"] else ""))
            if bounds:  # after the row's line: the bound's names the row's share of it
                self._bound(row, samples, bounds)
        else:
            row = Row.of("net_loopback", "half_rtt", "us", samples, size=size, lanes=n)
            self.progress(f"  one-way trip {size:>7} B, lanes {n:>2}: {row.median:7.1f} us")
        return row

    def _bound(self, row: Row, samples: list[float], bounds: list) -> None:
        """The stream row's paired bound: an `uncoupled` row of the repeats' bounds, and the row's share of it per
        repeat (its own GB/s over the bound measured right after it); its median is the row's `of_uncoupled`. A
        bound that failed is a skip and leaves the row without one."""
        bad = next((b for b in bounds if isinstance(b, str)), None)
        if bad is not None:
            skip = {"test": "net_loopback:uncoupled", "reason": f"the uncoupled bound did not run: {bad}"}
            if skip not in self.skipped:  # the same failure at every lane count is said once
                self.skipped.append(skip)
            return
        n = row.params["lanes"]
        u = Row.of("net_loopback", "uncoupled", "GB/s", [b["both"][0] for b in bounds], size=row.params["size"],
                   streams=n)
        u.extra = {k: bounds[0][k] for k in ("record", "crypto_threads", "inflight", "poll", "poll_pause_us", "bytes",
                                             "lane_records")}
        u.extra.update({k: [b[k][0] for b in bounds] for k in ("both", "streams", "crypto", "cores", "seal", "open",
                                                                "tcp", "sealed", "opened")})
        each = [round(g / b, 3) for g, b in zip(samples, u.extra["both"])]
        row.extra.update(uncoupled_gbps=round(u.median, 3), gbps_each=[round(g, 3) for g in samples],
                         of_uncoupled_each=each,
                         of_uncoupled=round(statistics.median(each), 3))
        self.bound_rows.append(u)
        self.progress(f"  at once   {row.params['size']:>10} B, lanes {n:>2}: {u.median:6.2f} GB/s, the encrypted "
                      f"stream {statistics.median(each):.2f} of it")


def check(sizes: list[int], lanes: list[int], inflight: int, total: int) -> None:
    """The bench's inputs, checked before it starts (the CLI calls it before it prints a line)."""
    if not lanes or min(lanes) < 1:
        raise UsageError(f"--lanes: each between 1 and {pluginenv.MAX_LANES}")
    if max(lanes) > pluginenv.MAX_LANES:
        raise UsageError(f"--lanes: at most {pluginenv.MAX_LANES} (got {max(lanes)})")
    if inflight > 32:  # the plugin holds NCCL_NET_MAX_REQUESTS; more would wait out the deadline
        raise UsageError(f"--inflight: at most 32, the plugin's requests per connection (got {inflight})")
    # every measurement moves whole messages: the stream at least twice the messages in flight (_stream), plain
    # TCP one a stream (_tcp_stream), of the largest size; with fewer bytes asked the three moved different ones
    least = max(2 * inflight, max(lanes)) * max(sizes)
    if total < least:
        raise UsageError(f"--total {total}: at least {least} here (max(2 x --inflight, lanes) messages of "
                         f"{max(sizes)} B)")


def rank_env() -> dict[str, str]:
    """What the two processes add to this one's environment: the interface (loopback unless one is named) and,
    where none is configured, a benchmark key for both."""
    env = {"NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME", "lo")}
    if not keys.configured():
        env[keys.ENV_VAR] = os.urandom(32).hex()
    return env


def plugin_ready(env: dict[str, str] | None = None) -> None:
    """The plugin's own init, here, in the environment the two processes get (`env`, default rank_env()): what
    would fail in both (an interface that matches nothing, no libcrypto) is one line in the plugin's words before
    anything is measured, not a rank's failure after the AES-GCM rates. NetError where it fails. The plugin reads
    that environment with getenv, so it is set for the call and put back. Its interface, once found, stays for this
    process (a later call here passes whatever it names); the ranks are fresh processes."""
    with environ.setting(rank_env() if env is None else env):
        net = netplugin.Net()
    if net.rc:
        raise netplugin.NetError("the net plugin's init", net.rc, net.why())
    net.t.finalize(net.ctx)


def loopback(sizes: list[int], lanes: list[int], inflight: int = 8, total: int = 2 << 30, repeat: int = 3,
             rtt_sizes: tuple[int, ...] = (8, 4096, 65536), rtt_iters: int = 1000,
             tcp_baseline: bool = True, progress=print) -> Result:
    check(sizes, lanes, inflight, total)
    env = rank_env()  # the two processes', not this one's
    plugin_ready(env)
    plan = []  # grouped by lane count: each group uses one pair of connections
    for n in lanes:
        plan += [("stream", n, s, inflight, total, repeat) for s in sizes]
        plan += [("tcp", n, max(sizes), inflight, total, repeat)] if tcp_baseline else []
        plan += [("rtt", n, s, 0, rtt_iters, repeat) for s in rtt_sizes]
    res = Result(kind="net", env=envmod.stamp(),
                 settings={"bench": "net", "inflight": inflight, "total_bytes": total, "repeat": repeat,
                           "spin_us": os.environ.get("CCBRIDGE_NET_SPIN_US"),
                           # a lane's threads (threads taking turns, or the stage pipeline's depth), as the
                           # two processes inherit them, and the mode the plugin reads from them ("turns 2")
                           "pipeline": os.environ.get("CCBRIDGE_NET_PIPELINE"),
                           "turns": os.environ.get("CCBRIDGE_NET_TURNS"), "lane_mode": pluginenv.lane_mode(),
                           "interface": env["NCCL_SOCKET_IFNAME"]})
    t_start = time.perf_counter()
    bound, skipped = _bound_for(max(sizes), total, inflight) if tcp_baseline else (None, [])
    gcm = _gcm_rows(sorted({record_bytes(s, n) for s in sizes for n in lanes}), progress) if tcp_baseline else []
    got = _Rows(plan, progress)
    with tempfile.TemporaryDirectory(prefix="ccbridge-net-") as d:
        # two processes, no process group: they meet over their own socket, which no parent relays
        ranks.run(2, _rank, plan, os.path.join(d, "meet"), bound, label="net bench", env=env, on_message=got.take,
                  stall_s=2 * DEADLINE_S + (bound.timeout_s if bound else 0), failure=SecureError)
    if len(got.rows) < len(plan):
        raise netplugin.NetError("bench", -1, "a bench process stopped before the end of the plan")
    res.rows = got.rows + got.bound_rows + gcm
    res.skipped += skipped + got.skipped
    _compare(res.rows)
    res.duration_s = time.perf_counter() - t_start
    if any(r.extra.get("bad") for r in res.rows):
        res.errors.append({"test": "net_loopback", "error": "received bytes differ from the sent ones"})
    return res


@dataclass(frozen=True)
class _Bound:
    """ccbridge-net-bound as the bench runs it (the plugin's work with none of its waits: as many plain TCP streams
    and crypto threads a lane as the plugin's, its messages in flight, a polling thread a side as the bench's): its
    command line less the lanes, the cores it runs on, and how long one measurement may take."""
    argv: tuple[str, ...]
    cpus: frozenset[int]
    timeout_s: float = 60.0

    def once(self, lanes: int) -> dict | str:
        """One measurement at `lanes` (its JSON object), or why it failed within timeout_s (a string; the program's
        own processes end with it). It runs on `cpus`, the bench's, not only on this rank's where
        CCBRIDGE_RANK_CPUS splits them: the plugin's two processes had both sets."""
        mine = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, self.cpus)  # this thread's, which the child inherits
            out = subprocess.run([*self.argv, "-l", str(lanes)], capture_output=True, text=True,
                                 timeout=self.timeout_s)
            if out.returncode:
                raise OSError(f"exit {out.returncode}: {(out.stderr.strip().splitlines() or ['no message'])[-1]}")
            return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
        except (OSError, subprocess.TimeoutExpired, ValueError, StopIteration) as e:
            return str(e) or type(e).__name__
        finally:
            try:
                os.sched_setaffinity(0, mine)
            except OSError:
                pass  # the wider set stays with this thread: the bench's own cores


def _bound_for(size: int, total: int, inflight: int) -> tuple[_Bound | None, list[dict]]:
    """The bound at the bench's largest size, bytes and messages in flight, on this process's cores; or None and a
    skip where the program is missing, which costs the bench nothing else."""
    try:
        prog = pluginenv.bound_program()
    except OSError as e:
        return None, [{"test": "net_loopback:uncoupled", "reason": f"the uncoupled bound did not run: {e}"}]
    argv = (str(prog), "-j", "-y", "-p", str(round(POLL_S * 1e6)), "-n", "1", "-s", str(size), "-t", str(total),
            "-i", str(inflight), "-c", str(pluginenv.crypto_threads()))
    # one measurement may take its three passes over `total` bytes at 0.5 GB/s, and a minute more
    return _Bound(argv, frozenset(os.sched_getaffinity(0)), 60.0 + 3 * total / 0.5e9), []


def _gcm_rows(records: list[int], progress) -> list[Row]:
    """AES-256-GCM GB/s per core at each record size, sealing and opening, on 1 thread and on as many threads as
    this process may use cores (the bound's rate: the cores all busy, as the stream keeps them)."""
    rows, cores = [], cores_visible()
    for rec in records:
        for threads in sorted({1, cores}):
            for op in ("encrypt", "decrypt"):
                row = Row.of("net_loopback", f"aes_gcm_{op}", "GB/s per core",
                             [gcm_rate(rec, threads, op == "decrypt")], record=rec, threads=threads)
                rows.append(row)
            many = "s" if threads != 1 else ""
            progress(f"  AES-256-GCM {rec:>7} B records, {threads:>3} thread{many}: encrypt {rows[-2].median:6.2f} "
                     f"decrypt {rows[-1].median:6.2f} GB/s per core")
    return rows


def cpu_bound(cores: int, tcp_send: float, tcp_recv: float, enc: float, dec: float) -> float:
    """GB/s that `cores` can move encrypted at most: each byte costs plain TCP's CPU on both sides plus one seal and
    one open (CPU-s/GB = 1 / GB/s per core); the plugin adds both to what TCP alone costs."""
    return cores / (tcp_send + tcp_recv + 1 / enc + 1 / dec)


def _compare(rows: list[Row]) -> None:
    """Each encrypted row's anchors at its lane count: plain TCP with as many streams and the CPU bound, with the
    inputs (cores visible, plain TCP's CPU-s/GB per side, AES-GCM GB/s per core on every visible core)."""
    cores = cores_visible()
    tcp = {r.params["streams"]: r for r in rows if r.metric == "tcp_plaintext"}
    gcm = {(r.metric, r.params["record"]): round(r.median, 3) for r in rows
           if r.metric.startswith("aes_gcm") and r.params["threads"] == cores}
    for r in rows:
        t = tcp.get(r.params.get("lanes")) if r.metric == "stream" else None
        if t is None:
            continue
        rec = record_bytes(r.params["size"], r.params["lanes"])
        enc, dec = gcm.get(("aes_gcm_encrypt", rec)), gcm.get(("aes_gcm_decrypt", rec))
        ts, tr = t.extra.get("cpu_s_per_gb_send"), t.extra.get("cpu_s_per_gb_recv")
        r.extra.update(tcp_gbps=t.median, tcp_size=t.params["size"], of_tcp=round(r.median / t.median, 3),
                       cores_visible=cores, tcp_cpu_s_per_gb_send=ts, tcp_cpu_s_per_gb_recv=tr, record=rec,
                       aes_gcm_gbps_per_core_encrypt=enc, aes_gcm_gbps_per_core_decrypt=dec)
        if enc and dec and ts is not None and tr is not None:
            bound = cpu_bound(cores, ts, tr, enc, dec)
            r.extra.update(bound_gbps=round(bound, 3), of_bound=round(r.median / bound, 3))
            # per byte, which the machine's other load does not blur: the bound's CPU-s/GB over the plugin's
            per = (r.extra.get("cpu_s_per_gb_send") or 0) + (r.extra.get("cpu_s_per_gb_recv") or 0)
            r.extra["cpu_efficiency"] = round((ts + tr + 1 / enc + 1 / dec) / per, 3) if per else None
