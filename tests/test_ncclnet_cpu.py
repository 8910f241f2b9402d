"""The NCCL net plugin (libnccl-net-ccbridge.so) driven through its v11 API
on the CPU, as NCCL's proxy thread drives it: two spawned processes, the
listen handle passed between them, connect/accept polled until they return
a comm, isend/irecv/test. Faults are injected on the wire by a man-in-the-
middle proxy (a thread here, on 127.0.0.1) that parses the plugin's records:
every fault must fail the receiver's request (or its accept) within a
deadline, and no request may complete with wrong data.
"""

import ctypes
import hashlib
import hmac
import multiprocessing as mp
import os
import random
import re
import statistics
import socket
import struct
import threading
import time
import types

import pytest

from ccbridge import pluginenv
from ccbridge.bindings import ncclnet
from ccbridge.secure import keys, netbench, netplugin

DEADLINE = 60.0
KEY = hashlib.sha256(b"ccbridge ncclnet test key").hexdigest()
OTHER_KEY = hashlib.sha256(b"ccbridge ncclnet other key").hexdigest()
HELLO, CONFIRM, HEADER, TAG = 80, 32, 40, 16  # the wire format of conn.c
RECORD_MIN, RECORD = 32 << 10, 512 << 10  # plan.h: one-record messages, the largest record
ADDR_OFF = 24  # net_handle.addr in net.h: a sockaddr_in, port at +2 (big-endian)
LANES_OFF = 52  # net_handle.nlanes

R = ctypes.c_int
P = ctypes.c_void_p
Net11, Props11 = ncclnet.Net11, ncclnet.Props11


class Net(netplugin.Net):
    """The package's driver with the key set for this process and NCCL_SOCKET_IFNAME=lo."""

    def __init__(self, lib_path, key):
        if key is None:
            os.environ.pop("CCBRIDGE_KEY", None)
        else:
            os.environ["CCBRIDGE_KEY"] = key
        os.environ["NCCL_SOCKET_IFNAME"] = "lo"
        super().__init__(lib_path)


def payload(seed, n):
    return random.Random(seed).randbytes(n)


def buffer(n):
    return (ctypes.c_char * max(n, 1))()


# ---- the two ranks (spawned) ----

def receiver(pipe, lib_path, key, sizes, capacity, concurrent, delays=None, die_after=None):
    """Listen, hand the handle over, accept, receive `sizes`; report what happened. delays: seconds
    to sleep before posting each batch (so that records arrive before their receive is posted).
    die_after: report, then end the process abruptly (no close) once that many messages arrived."""
    deadline = time.monotonic() + DEADLINE
    out = {"completed": [], "error": None, "where": None}
    try:
        net = Net(lib_path, key)
        if net.rc:
            raise netplugin.NetError("init", net.rc)
        handle, lcomm = net.listen()
        pipe.send(bytes(handle))
        rcomm = net.accept(lcomm, deadline)
        bufs = [buffer(capacity if capacity is not None else n) for n in sizes]
        received = []
        t0 = time.monotonic()
        try:
            for start in range(0, len(sizes), concurrent):
                if delays:
                    time.sleep(delays[start // concurrent % len(delays)])
                posted = [(i, net.irecv(rcomm, bufs[i], len(bufs[i]) if capacity or n else 0, deadline))
                          for i, n in list(enumerate(sizes))[start:start + concurrent]]
                received += [(i, net.wait(req, deadline)) for i, req in posted]
                if die_after is not None and len(received) >= die_after:
                    out["completed"] = [(i, got, True) for i, got in received]
                    pipe.send(out)
                    os._exit(9)  # a killed rank: its sockets close under the peer, nothing said
            out["seconds"] = time.monotonic() - t0
        finally:  # checked outside the timed loop, and also when a later request failed
            out["completed"] = [(i, got, got == sizes[i] and bufs[i].raw[:got] == payload(i, got))
                                for i, got in received]
        net.t.closeRecv(rcomm)
        net.t.closeListen(lcomm)
        net.t.finalize(net.ctx)
    except (netplugin.NetError, TimeoutError) as e:
        out["error"], out["where"] = str(e), getattr(e, "where", "timeout")
    out["logs"] = [m for _, m in (net.logs if "net" in locals() else [])]
    pipe.send(out)


def sender(pipe, lib_path, key, sizes, concurrent, port):
    deadline = time.monotonic() + DEADLINE
    out = {"error": None}
    try:
        net = Net(lib_path, key)
        if net.rc:
            raise netplugin.NetError("init", net.rc)
        handle = bytearray(pipe.recv())
        if port:  # through the proxy
            handle[ADDR_OFF + 2:ADDR_OFF + 4] = struct.pack(">H", port)
        bufs = []
        for i, n in enumerate(sizes):
            bufs.append(buffer(n))
            ctypes.memmove(bufs[i], payload(i, n), n)
        scomm = net.connect(handle, deadline)
        for start in range(0, len(sizes), concurrent):
            posted = [net.isend(scomm, bufs[i], n, deadline)
                      for i, n in list(enumerate(sizes))[start:start + concurrent]]
            for req in posted:
                net.wait(req, deadline)
        net.t.closeSend(scomm)
    except (netplugin.NetError, TimeoutError) as e:
        out["error"], out["where"] = str(e), getattr(e, "where", "timeout")
    out["elapsed"] = time.monotonic() - (deadline - DEADLINE)
    pipe.send(out)


def _reap(*procs):
    """Join each spawned rank (None: never started), killing one that outlives a 5 s grace."""
    for p in procs:
        if p is None:
            continue
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()


def run_pair(sizes, key=KEY, send_key=None, capacity=None, concurrent=1, port=0, recv_concurrent=None,
             delays=None, die_after=None):
    """Both ranks in processes of their own; killed at the deadline."""
    lib = str(pluginenv.library())
    ctx = mp.get_context("spawn")
    rp, rc = ctx.Pipe()
    sp, sc = ctx.Pipe()
    r = ctx.Process(target=receiver, args=(rc, lib, key, sizes, capacity, recv_concurrent or concurrent, delays,
                                           die_after))
    s = ctx.Process(target=sender, args=(sc, lib, send_key or key, sizes, concurrent, port))
    r.start()
    s.start()
    try:
        end = time.monotonic() + DEADLINE + 15
        assert rp.poll(max(0, end - time.monotonic())), "receiver never listened"
        sp.send(rp.recv())
        assert rp.poll(max(0, end - time.monotonic())), "receiver missed the deadline"
        got = rp.recv()
        assert sp.poll(max(0, end - time.monotonic())), "sender missed the deadline"
        return got, sp.recv()
    finally:
        _reap(r, s)


def stage_vars(mode: str) -> dict:
    """A lane's threads, as the variables to set (None: unset): "t<T>" CCBRIDGE_NET_TURNS=T (T threads taking turns
    at the socket; t1: turns off, the pipeline at its default depth), "default" neither (turns, 2 a lane), anything
    else CCBRIDGE_NET_TURNS=0 (turns off) and CCBRIDGE_NET_PIPELINE (the stage pipeline's depth; 0 one thread a
    lane, "" the default 2)."""
    if mode.startswith("t"):
        return {"CCBRIDGE_NET_TURNS": mode[1:], "CCBRIDGE_NET_PIPELINE": None}
    if mode == "default":
        return {"CCBRIDGE_NET_TURNS": None, "CCBRIDGE_NET_PIPELINE": None}
    return {"CCBRIDGE_NET_TURNS": "0", "CCBRIDGE_NET_PIPELINE": mode}


def set_stages(monkeypatch, mode: str) -> None:
    """stage_vars(mode) in this process's environment, which the ranks inherit."""
    for k, v in stage_vars(mode).items():
        monkeypatch.setenv(k, v) if v is not None else monkeypatch.delenv(k, raising=False)


def _mode_env(mode: str, **extra) -> dict:
    """This process's environment with the test key, loopback, stage_vars(mode) and extra."""
    env = {k: v for k, v in os.environ.items() if k not in ("CCBRIDGE_NET_PIPELINE", "CCBRIDGE_NET_TURNS")}
    env.update(CCBRIDGE_KEY=KEY, NCCL_SOCKET_IFNAME="lo", **extra)
    env.update({k: v for k, v in stage_vars(mode).items() if v is not None})
    return env


# ---- plain runs ----

@pytest.mark.parametrize("lanes", [1, 3, 4])
def test_messages_of_many_sizes_arrive_byte_exact(lanes, monkeypatch):
    monkeypatch.setenv("CCBRIDGE_NET_LANES", str(lanes))  # the listener's choice, inherited by both ranks
    sizes = [0, 1, 4096 + 3, RECORD_MIN, RECORD_MIN + 1, RECORD, RECORD + 1, 5 << 20, 64 << 20, 0, 7]
    got, sent = run_pair(sizes)
    assert got["error"] is None and sent["error"] is None, (got, sent)
    assert [(i, n, True) for i, n in enumerate(sizes)] == got["completed"]


@pytest.mark.parametrize("pipeline,lanes", [("0", 1), ("0", 3), ("1", 1), ("8", 1), ("8", 3), ("t2", 1), ("t3", 3),
                                            ("t8", 4), ("t1", 2)])
def test_every_pipeline_depth_arrives_byte_exact(pipeline, lanes, monkeypatch):
    # CCBRIDGE_NET_PIPELINE: 0 runs each lane's stages in turn on one thread, 1 is taken as 2 (one
    # slot cannot overlap), 8 the most; each side reads its own, so the two ranks may differ.
    # CCBRIDGE_NET_TURNS (t2..t8): a lane's threads take turns at its socket (t1: off, the pipeline's)
    monkeypatch.setenv("CCBRIDGE_NET_LANES", str(lanes))
    set_stages(monkeypatch, pipeline)
    sizes = [0, 1, RECORD_MIN, RECORD_MIN + 1, RECORD + 1, 5 << 20, 7, (16 << 20) + 3, 4096 + 3] * 2
    got, sent = run_pair(sizes, concurrent=8)
    assert got["error"] is None and sent["error"] is None, (got, sent)
    assert [(i, n, True) for i, n in enumerate(sizes)] == got["completed"]


def test_concurrent_requests_and_bandwidth():
    sizes = [32 << 20] * 4 + [4096 + 3] * 16
    got, sent = run_pair(sizes, concurrent=8)
    assert got["error"] is None and sent["error"] is None, (got, sent)
    assert all(ok for _, _, ok in got["completed"]) and len(got["completed"]) == len(sizes)
    total = sum(sizes)
    print(f"\nccbridge net plugin, loopback, encrypted: {total / got['seconds'] / 1e9:.2f} GB/s "
          f"({total >> 20} MiB, 8 requests in flight, 1 connection, {os.cpu_count()} cores)")


@pytest.mark.parametrize("lanes,pipeline", [(3, "2"), (8, "2"), (3, "t3")])
def test_sender_far_ahead_of_late_receives(lanes, pipeline, monkeypatch):
    # 32 sends in flight (NCCL's most) against receives posted one at a time, some only after a
    # pause longer than a lane waits with a record in its socket (conn.c EARLY_WAIT_MS, 20 ms): records
    # arrive before their receive in both ways (left in the socket until the post, and read and
    # authenticated into the lane's buffer first); sizes off the record grid, empty, one-record
    monkeypatch.setenv("CCBRIDGE_NET_LANES", str(lanes))
    set_stages(monkeypatch, pipeline)
    odd = [0, 1, RECORD_MIN - 1, RECORD_MIN + 1, RECORD - 1, RECORD + 4095, 3 * RECORD + 1, (1 << 20) + 5, 7,
           (2 << 20) - 3, 0, lanes * RECORD + 17]
    sizes = [odd[i % len(odd)] for i in range(96)]
    got, sent = run_pair(sizes, concurrent=32, recv_concurrent=1, delays=[0.05, 0, 0, 0.002, 0, 0])
    assert got["error"] is None and sent["error"] is None, (got, sent)
    assert [(i, n, True) for i, n in enumerate(sizes)] == got["completed"]


@pytest.mark.parametrize("pipeline", ["0", "2", "8", "t3"])
def test_a_killed_receiver_fails_the_sender_with_an_error_not_a_hang(pipeline, monkeypatch):
    """The receiving rank dies (no close) after two messages of a long stream: the sender's requests fail
    with the plugin's error well inside the deadline (NCCL then aborts that rank too), never complete
    into nowhere and never wait out the deadline; also with sealed records waiting in the lanes'
    rings for their send stage (pipeline 2, 8), and without that stage (0)."""
    set_stages(monkeypatch, pipeline)
    sizes = [1 << 20] * 400
    got, sent = run_pair(sizes, concurrent=8, die_after=2)
    assert got["error"] is None and len(got["completed"]) >= 2, got
    assert sent["error"] is not None and sent["where"] != "timeout", sent
    assert sent["elapsed"] < DEADLINE / 2, sent


def test_short_message_into_larger_buffer_reports_its_size():
    got, sent = run_pair([4096 + 3, 0], capacity=1 << 20)
    assert got["error"] is None, got
    assert got["completed"] == [(0, 4096 + 3, True), (1, 0, True)]


def test_message_longer_than_the_receive_buffer_fails():
    got, _ = run_pair([3 << 20], capacity=(2 << 20) + 7)
    assert got["error"] and got["where"] == "test" and got["completed"] == [], got
    assert any("longer than the posted receive buffer" in m for m in got["logs"])


def test_wrong_key_fails_the_handshake_on_both_sides():
    got, sent = run_pair([10], send_key=OTHER_KEY)
    assert got["where"] == "accept" and "connect" in sent["error"], (got, sent)
    # the lane that checks first says the confirmation failed; a lane whose peer gave up first says
    # the peer closed (a different key?): either way the log names the key
    assert any("confirmation does not verify" in m or "a different key" in m for m in got["logs"]), got["logs"]


# ---- faults on the wire ----

class Proxy:
    """Forwards one connection's lanes (sender -> 127.0.0.1:port -> receiver),
    the handshakes untouched unless told, then record by record with `fault`
    applied to lane 0's records (or to the lanes themselves)."""

    def __init__(self, target_port, fault, lanes, recorded=None):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.target, self.fault, self.lanes, self.recorded = target_port, fault, lanes, recorded
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.sock.settimeout(DEADLINE)
        pairs = []
        try:
            for _ in range(self.lanes):
                c, _ = self.sock.accept()
                c.settimeout(DEADLINE)
                pairs.append((c, socket.create_connection(("127.0.0.1", self.target), timeout=DEADLINE)))
            self._forward(pairs)
        except (OSError, EOFError):  # a side that failed its handshake closes: the test reads the verdict
            pass
        finally:
            for c, s in pairs:
                c.close(), s.close()
            self.sock.close()

    @staticmethod
    def _read(sock, n):
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return out

    def _records(self, c):
        out = []
        try:
            while True:
                h = self._read(c, HEADER)
                out.append(h + self._read(c, struct.unpack("<I", h[32:36])[0] + TAG))
        except (EOFError, OSError):
            return out

    def _forward(self, pairs):
        replay = self.fault == "replay_handshake"
        hellos = [self._read(c, HELLO) for c, _ in pairs]
        lane = [struct.unpack("<H", h[12:14])[0] for h in hellos]  # the sender's lane numbers
        by_lane = {lane[i]: i for i in range(len(pairs))}
        shake = {}
        for i, (c, s) in enumerate(pairs):
            old = self.recorded["handshake"][lane[i]] if replay else None
            s.sendall(old[0] if replay else hellos[i])
            c.sendall(self._read(s, HELLO))
            confirm = self._read(c, CONFIRM)
            shake[lane[i]] = (hellos[i], confirm)
            s.sendall(old[1] if replay else confirm)
            c.sendall(self._read(s, CONFIRM))
        if self.fault == "close":
            return
        records = {lane[i]: self._records(c) for i, (c, _) in enumerate(pairs)}
        if self.fault == "record":
            self.recorded.update(handshake=shake, records=records)
        if self.fault == "replay":
            records = self.recorded["records"]
        elif self.fault == "swap_lanes":  # lane 0's records down lane 1's socket and back
            records = {0: records[1], 1: records[0], **{k: v for k, v in records.items() if k > 1}}
        elif self.fault not in (None, "record", "replay_handshake"):
            records[0] = self._damage(records[0])
        elif self.fault == "replay_handshake":  # the old connection's records after its handshake
            records = self.recorded["records"]
        for n, recs in records.items():
            pairs[by_lane[n]][1].sendall(b"".join(recs))
        if self.fault == "truncate_mid":
            return
        time.sleep(0.2)

    def _damage(self, r):
        f = self.fault
        if f == "flip":
            b = bytearray(r[1])
            b[HEADER + 1000] ^= 0x04
            return [r[0], bytes(b), *r[2:]]
        if f == "flip_header":  # another message number: the AAD changes, the tag fails
            b = bytearray(r[1])
            b[8] ^= 1
            return [r[0], bytes(b), *r[2:]]
        if f == "drop":
            return [r[0], *r[2:]]
        if f == "duplicate":
            return [r[0], r[1], r[1], *r[2:]]
        if f == "reorder":
            return [r[0], r[2], r[1], *r[3:]]
        if f == "truncate_mid":
            return [r[0], r[1][:len(r[1]) // 2]]
        if f == "truncate_boundary":  # the last data record and the FIN: the lane ends without closing
            return r[:-2]
        if f == "drop_fin":
            return r[:-1]
        if f.startswith("tag_at_"):  # lane 0's data record i with its tag's last bit flipped (its payload intact)
            i = int(f[len("tag_at_"):])
            return [*r[:i], r[i][:-1] + bytes([r[i][-1] ^ 1]), *r[i + 1:]]
        if f == "wrap_offset":  # offset + n wraps to 0 (passes `offset + n <= size`): a record before the buffer
            b = bytearray(r[1])
            b[24:32] = struct.pack("<Q", (1 << 64) - RECORD)
            return [r[0], bytes(b), *r[2:]]
        raise AssertionError(f)


LANES = 2


def run_through_proxy(fault, sizes, recorded=None):
    """The sender's lanes go through a Proxy; the receiver's port is learned
    from its handle, so the pair runs in-line here."""
    lib = str(pluginenv.library())
    ctx = mp.get_context("spawn")
    rp, rc = ctx.Pipe()
    sp, sc = ctx.Pipe()
    os.environ["CCBRIDGE_NET_LANES"] = str(LANES)  # the listener's choice, inherited by the spawned receiver
    try:
        r = ctx.Process(target=receiver, args=(rc, lib, KEY, sizes, None, 1))
        r.start()
    finally:
        del os.environ["CCBRIDGE_NET_LANES"]
    s = None
    try:
        assert rp.poll(DEADLINE), "receiver never listened"
        handle = rp.recv()
        assert struct.unpack("<I", handle[LANES_OFF:LANES_OFF + 4])[0] == LANES
        proxy = Proxy(struct.unpack(">H", handle[ADDR_OFF + 2:ADDR_OFF + 4])[0], fault, LANES, recorded)
        s = ctx.Process(target=sender, args=(sc, lib, KEY, sizes, 1, proxy.port))
        s.start()
        sp.send(handle)
        t0 = time.monotonic()
        assert rp.poll(DEADLINE + 10), f"{fault}: the receiver neither failed nor finished within the deadline"
        got = rp.recv()
        got["elapsed"] = time.monotonic() - t0
        return got
    finally:
        _reap(r, s)


MESSAGE = [8 * RECORD + 5]  # nine records (the last of 5 bytes): five on lane 0, four on lane 1


def test_proxy_passes_an_honest_stream():
    got = run_through_proxy(None, MESSAGE)
    assert got["error"] is None and got["completed"] == [(0, MESSAGE[0], True)], got


@pytest.mark.parametrize("pipeline", ["0", "2", "t2"])
@pytest.mark.parametrize("fault", ["flip", "flip_header", "drop", "duplicate", "reorder",
                                   "truncate_mid", "truncate_boundary", "close", "swap_lanes"])
def test_wire_fault_fails_the_receiver(fault, pipeline, monkeypatch):
    # pipeline 2: a record that fails its tag fails in the open stage, with the lane's next records
    # read behind it; 0: in the lane's own thread
    set_stages(monkeypatch, pipeline)
    got = run_through_proxy(fault, MESSAGE)
    # a lane cut before the receive was posted fails the post itself (or the accept, when cut before
    # NCCL got the connection); either way the plugin says why
    where = ("test", "irecv", "accept") if fault == "close" else ("test", "irecv")
    assert got["error"] is not None and got["where"] in where, (fault, got)
    assert any("connection recv" in m for m in got["logs"]), got["logs"]
    assert got["completed"] == [], "a request completed despite the fault"
    assert got["elapsed"] < 20


@pytest.mark.parametrize("pipeline", ["0", "2", "8", "t3"])
def test_lost_fin_after_complete_messages_costs_nothing(pipeline, monkeypatch):
    # every record arrived, only lane 0's clean-close record is missing: the message stands
    set_stages(monkeypatch, pipeline)
    got = run_through_proxy("drop_fin", MESSAGE)
    assert got["error"] is None and got["completed"] == [(0, MESSAGE[0], True)], got


def test_offset_that_wraps_is_refused_before_a_byte_is_written():
    # no key needed: the header is read and checked before the tag, and the payload lands at
    # buffer + offset first; an offset of 2^64 - RECORD made offset + n wrap to 0 and wrote
    # a record of attacker bytes below the posted buffer before the tag failed
    got = run_through_proxy("wrap_offset", MESSAGE)
    assert got["error"] is not None and got["where"] in ("test", "irecv") and got["completed"] == [], got
    assert any("malformed record header" in m for m in got["logs"]), got["logs"]


@pytest.mark.parametrize("pipeline", ["2", "t2", "t3"])
def test_replayed_connection_fails(pipeline, monkeypatch):
    set_stages(monkeypatch, pipeline)
    recorded = {}
    got = run_through_proxy("record", MESSAGE, recorded)
    assert got["error"] is None and recorded["records"], got
    # the old connection's records into a fresh connection: other keys, every tag fails
    got = run_through_proxy("replay", MESSAGE, recorded)
    assert got["where"] in ("test", "irecv") and got["completed"] == [], got  # irecv: failed before it was posted
    assert any("failed authentication" in m for m in got["logs"])
    # the old connection's whole byte stream, handshake included: the confirmation fails
    got = run_through_proxy("replay_handshake", MESSAGE, recorded)
    assert got["where"] == "accept" and got["completed"] == [], got


# ---- a peer with the key that sends what it is told (the buggy-but-keyed peer), and the handle ----

MAGIC = b"CCBNET\x00\x03"


class RoguePeer:
    """The sending side of conn.c's protocol in Python, every lane's handshake honest, then records
    with whatever headers a test writes: what a buggy rank holding the key could put on the wire."""

    def __init__(self, handle, key=KEY, lanes=None):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        self.aesgcm = AESGCM
        port = struct.unpack(">H", handle[ADDR_OFF + 2:ADDR_OFF + 4])[0]
        self.nlanes = struct.unpack("<I", handle[LANES_OFF:LANES_OFF + 4])[0]
        self.listen_id, self.conn_id, secret = bytes(handle[8:24]), os.urandom(16), bytes.fromhex(key)
        self.socks, self.keys, self.seq = [], [], []
        for i in range(self.nlanes if lanes is None else lanes):
            s = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
            mine = self.hello(i)
            s.sendall(mine)
            theirs = Proxy._read(s, HELLO)
            th = hashlib.sha256(b"ccbridge/net/v2" + mine + theirs).digest()
            confirm = keys.hkdf(secret, th, b"ccbridge/net/v2 confirm sender")
            s.sendall(hmac.new(confirm, th, hashlib.sha256).digest())
            Proxy._read(s, CONFIRM)
            self.socks.append(s)
            self.keys.append(keys.hkdf(secret, th, b"ccbridge/net/v2 data sender->receiver"))
            self.seq.append(0)

    def hello(self, lane):
        return MAGIC + struct.pack("<IHH", 1, lane, self.nlanes) + os.urandom(32) + self.listen_id + self.conn_id

    def record(self, lane, msg, size, offset, data, n=None, flags=0, cut=None, bad_tag=False):
        """cut: send only the record's first `cut` bytes (a lane that ends mid-record); bad_tag: its tag's last
        bit flipped (a record tampered with on the wire, its header and payload as sealed)."""
        seq = self.seq[lane]
        h = struct.pack("<QQQQII", seq, msg, size, offset, len(data) if n is None else n, flags)
        epoch = keys.hkdf(self.keys[lane], bytes(32), b"ccbridge/net/v2 epoch" + struct.pack("<Q", seq >> 16))
        wire = h + self.aesgcm(epoch).encrypt(bytes(4) + struct.pack("<Q", seq), data, h)
        if bad_tag:
            wire = wire[:-1] + bytes([wire[-1] ^ 1])
        self.socks[lane].sendall(wire[:cut])
        self.seq[lane] += 1
        return wire

    def close(self):
        for s in self.socks:
            s.close()


def run_rogue(sizes, script, capacity=None, lanes=LANES, delays=None, peer_class=None):
    """The plugin receives `sizes` (one receive at a time) from a RoguePeer (or `peer_class`) that runs `script`."""
    lib = str(pluginenv.library())
    ctx = mp.get_context("spawn")
    rp, rc = ctx.Pipe()
    os.environ["CCBRIDGE_NET_LANES"] = str(lanes)
    try:
        r = ctx.Process(target=receiver, args=(rc, lib, KEY, sizes, capacity, 1, delays))
        r.start()
    finally:
        del os.environ["CCBRIDGE_NET_LANES"]
    rc.close()  # a receiver that dies (a wild write) reads as EOF here, not as a wait
    peer = None
    try:
        assert rp.poll(DEADLINE), "receiver never listened"
        peer = (peer_class or RoguePeer)(bytearray(rp.recv()))
        try:
            script(peer)
        except OSError:  # the receiver already failed the connection and closed
            pass
        assert rp.poll(20), "the receiver neither failed nor finished"
        try:
            return rp.recv()
        except EOFError:
            raise AssertionError(f"the receiver died (exit code {r.join(5) or r.exitcode})") from None
    finally:
        if peer:
            peer.close()
        r.join(timeout=5)
        if r.is_alive():
            r.kill()
            r.join()


def honest(peer, i, size):
    """Message i as conn.c's sender cuts it (first lane 0)."""
    data, rec = payload(i, size), netbench.record_bytes(size, peer.nlanes)
    for j in range(max(1, -(-size // rec))):
        peer.record(j % peer.nlanes, i, size, j * rec, data[j * rec:(j + 1) * rec])


def test_rogue_peer_speaks_the_protocol():
    got = run_rogue(MESSAGE + [0, 7], lambda p: [honest(p, i, n) for i, n in enumerate(MESSAGE + [0, 7])])
    assert got["error"] is None and got["completed"] == [(0, MESSAGE[0], True), (1, 0, True), (2, 7, True)], got


def _dup(p):  # record 0 nine times on lane 0: nine records counted, bytes RECORD.. never written
    for _ in range(9):
        p.record(0, 0, MESSAGE[0], 0, payload(0, RECORD))


def _short(p):  # every record one byte short of its slot: the message completes with holes
    data = payload(0, MESSAGE[0])
    for j in range(9):
        p.record(j % 2, 0, MESSAGE[0], j * RECORD, data[j * RECORD:(j + 1) * RECORD][:-1] or data[-1:])


def _wrong_lane(p):  # records 0 and 1 both on lane 0, then 1..8 as planned: 1 counted twice, 8 never
    data = payload(0, MESSAGE[0])
    p.record(0, 0, MESSAGE[0], RECORD, data[RECORD:2 * RECORD])
    for j in range(8):
        p.record(j % 2, 0, MESSAGE[0], j * RECORD, data[j * RECORD:(j + 1) * RECORD])


def _sizes_disagree(p):  # lane 1 claims the same message is one byte longer (the same record count)
    data = payload(0, MESSAGE[0] + 1)
    for j in range(9):
        p.record(j % 2, 0, MESSAGE[0] + (j % 2), j * RECORD, data[j * RECORD:(j + 1) * RECORD][:MESSAGE[0] - j * RECORD])


def _wrap_empty(p):  # a zero-byte message with 4 KiB at offset 2^64 - 4096 (authentic: the keyed peer sealed it)
    p.record(0, 0, 0, (1 << 64) - 4096, payload(0, 4096))


@pytest.mark.parametrize("pipeline", ["2", "t2", "t3"])
@pytest.mark.parametrize("script", [_dup, _short, _wrong_lane, _sizes_disagree, _wrap_empty],
                         ids=["duplicate", "short", "wrong_lane", "sizes_disagree", "wrap_empty"])
def test_keyed_peer_cannot_complete_a_message_out_of_place(script, pipeline, monkeypatch):
    set_stages(monkeypatch, pipeline)
    # authentic records that do not tile the message exactly once, as the plan cuts it, fail the
    # connection: none may complete a receive with holes, or write outside the posted buffer
    sizes = [0] if script is _wrap_empty else MESSAGE
    got = run_rogue(sizes, script, capacity=None if script is not _wrap_empty else 0)
    assert got["error"] is not None and got["completed"] == [], got
    assert any("connection recv" in m for m in got["logs"]), got["logs"]


class LastVersionPeer(RoguePeer):
    """A keyed peer of protocol version 2 (records of up to 256 KiB) opening every lane with its hello."""

    def __init__(self, handle):
        port = struct.unpack(">H", handle[ADDR_OFF + 2:ADDR_OFF + 4])[0]
        self.nlanes = struct.unpack("<I", handle[LANES_OFF:LANES_OFF + 4])[0]
        self.listen_id, self.conn_id, self.socks = bytes(handle[8:24]), os.urandom(16), []
        for i in range(self.nlanes):
            s = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
            self.socks.append(s)
            s.sendall(b"CCBNET\x00\x02" + self.hello(i)[8:])


def test_a_peer_of_the_last_protocol_version_is_refused_at_its_hello():
    # version 2 cut 4 MiB into records of 256 KiB, which this version's receiver (512 KiB) would take for malformed
    # records mid-stream, as if tampered with; the hello's version says it first, in words
    got = run_rogue(MESSAGE, lambda p: None, peer_class=LastVersionPeer)
    assert got["error"] is not None and got["completed"] == [], got
    assert any("not a ccbridge net plugin of this version" in m for m in got["logs"]), got["logs"]


@pytest.mark.parametrize("claimed,why", [(10 * RECORD, "a record of a finished message"),
                                         (MESSAGE[0], "malformed record header")], ids=["longer", "same_size"])
def test_keyed_peer_record_after_its_message_finished_fails(claimed, why):
    # a receiving lane keeps the receive it claimed for a message's later records: once its share
    # is in (and the message done, its slot free), one more record of that message on the lane must
    # not reach the old receive; the next message's receive fails instead, message 0 stands
    def script(p):
        honest(p, 0, MESSAGE[0])
        time.sleep(0.5)  # message 0 completes and the receive of message 1 is posted
        p.record(1, 0, claimed, 9 * RECORD, payload(0, 10 * RECORD)[9 * RECORD:10 * RECORD])
    got = run_rogue(MESSAGE * 2, script)
    assert got["error"] is not None and got["completed"] == [(0, MESSAGE[0], True)], got
    assert any(why in m for m in got["logs"]), got["logs"]


@pytest.mark.parametrize("pipeline", ["0", "2", "t2", "t3"])
@pytest.mark.parametrize("bad", range(5))
def test_a_bad_tag_anywhere_in_a_lane_completes_nothing(bad, pipeline, monkeypatch):
    # lane 0's five records of the message arrive back to back (one write), one of them with a bad tag: with
    # CCBRIDGE_NET_TURNS the lane's threads read up to T - 1 records past it and open those at once, in any
    # order; the message (which counts a record only once its tag verified) must still never complete
    set_stages(monkeypatch, pipeline)
    got = run_through_proxy(f"tag_at_{bad}", MESSAGE)
    assert got["error"] is not None and got["where"] in ("test", "irecv") and got["completed"] == [], got
    assert any("failed authentication" in m for m in got["logs"]), got["logs"]


@pytest.mark.parametrize("pipeline", ["0", "2", "t2", "t3"])
@pytest.mark.parametrize("bad", [0, 4, 8, 9])
def test_authentic_records_after_a_bad_one_complete_no_earlier_message(bad, pipeline, monkeypatch):
    # one lane, every receive posted at once: message 0 (nine records), then one-record messages 1 and 2,
    # written in one go; record `bad` of the stream has a bad tag (9: message 1's). The receives up to the
    # bad record's message may complete only if every record of theirs verified: message 0 never completes
    # with a bad record of its own, and whatever completed is byte-exact and before the bad record's message
    set_stages(monkeypatch, pipeline)
    sizes = MESSAGE + [7, RECORD_MIN]

    def script(p):
        data, n = payload(0, MESSAGE[0]), 0
        for j in range(9):
            p.record(0, 0, MESSAGE[0], j * RECORD, data[j * RECORD:(j + 1) * RECORD], bad_tag=n == bad)
            n += 1
        for i in (1, 2):
            p.record(0, i, sizes[i], 0, payload(i, sizes[i]), bad_tag=n == bad)
            n += 1
    lib = str(pluginenv.library())
    ctx = mp.get_context("spawn")
    rp, rc = ctx.Pipe()
    os.environ["CCBRIDGE_NET_LANES"] = "1"
    try:
        r = ctx.Process(target=receiver, args=(rc, lib, KEY, sizes, None, len(sizes)))
        r.start()
    finally:
        del os.environ["CCBRIDGE_NET_LANES"]
    rc.close()
    peer = None
    try:
        assert rp.poll(DEADLINE), "receiver never listened"
        peer = RoguePeer(bytearray(rp.recv()))
        time.sleep(0.3)  # every receive posted: each record lands in place
        try:
            in_one_write(script)(peer)
        except OSError:
            pass
        assert rp.poll(20), "the receiver neither failed nor finished"
        got = rp.recv()
    finally:
        if peer:
            peer.close()
        _reap(r)
    bad_msg = 0 if bad < 9 else 1
    assert got["error"] is not None, got
    assert all(ok and i < bad_msg for i, _, ok in got["completed"]), got
    assert any("failed authentication" in m for m in got["logs"]), got["logs"]


def test_extra_sockets_after_the_lanes_change_nothing():
    # a stranger connects once every lane was accepted, replaying lane 0's hello: it is never
    # accepted (the connection has its lanes), and the messages arrive
    def script(p):
        extra = socket.create_connection(p.socks[0].getpeername(), timeout=DEADLINE)
        extra.sendall(p.hello(0))
        honest(p, 0, MESSAGE[0])
        extra.close()
    got = run_rogue(MESSAGE, script)
    assert got["error"] is None and got["completed"] == [(0, MESSAGE[0], True)], got


# ---- a peer whose sockets end without FIN records (a rank that exits or is killed without closing) ----

def rounds_receiver(pipe, lib_path, key, sizes, rounds):
    """Listen once, then accept `rounds` connections in turn: each receives `sizes` one receive at a time,
    checked byte for byte, and is reported once closed."""
    net = Net(lib_path, key)
    handle, lcomm = net.listen()
    pipe.send(bytes(handle))
    for _ in range(rounds):
        deadline = time.monotonic() + 20
        out = {"completed": [], "error": None}
        rcomm = net.accept(lcomm, deadline)
        try:
            for i, n in enumerate(sizes):
                buf = buffer(n)
                got = net.wait(net.irecv(rcomm, buf, n, deadline), deadline)
                out["completed"].append((i, got, got == n and buf.raw[:got] == payload(i, got)))
        except (netplugin.NetError, TimeoutError) as e:
            out["error"] = str(e)
        net.t.closeRecv(rcomm)
        pipe.send(out)
    net.t.closeListen(lcomm)
    net.t.finalize(net.ctx)


def run_rounds(sizes, script, rounds, lanes):
    """rounds_receiver's reports of `rounds` connections in turn, each from a RoguePeer that runs `script`,
    then ends its sockets without FIN records."""
    lib = str(pluginenv.library())
    ctx = mp.get_context("spawn")
    rp, rc = ctx.Pipe()
    os.environ["CCBRIDGE_NET_LANES"] = str(lanes)
    try:
        r = ctx.Process(target=rounds_receiver, args=(rc, lib, KEY, sizes, rounds))
        r.start()
    finally:
        del os.environ["CCBRIDGE_NET_LANES"]
    rc.close()
    results = []
    try:
        assert rp.poll(DEADLINE), "receiver never listened"
        handle = bytearray(rp.recv())
        for _ in range(rounds):
            peer = RoguePeer(handle)
            script(peer)
            peer.close()
            assert rp.poll(30), "the receiver neither failed nor finished"
            results.append(rp.recv())
    finally:
        _reap(r)
    return results


def _write_all(sock, data):
    try:
        sock.sendall(data)
    except OSError:  # the receiver already failed the connection and closed
        pass


def in_one_write(script):
    """`script` with each lane's records gathered and written in one sendall (a thread a lane): the receiver
    reads them back to back, the next header already there behind each record, so its lanes hand every
    record to their open stage rather than opening it themselves."""
    def run(p):
        socks, wires = list(p.socks), [[] for _ in p.socks]
        p.socks[:] = [types.SimpleNamespace(sendall=w.append) for w in wires]
        try:
            script(p)
        finally:
            p.socks[:] = socks
        writers = [threading.Thread(target=_write_all, args=(s, b"".join(w))) for s, w in zip(socks, wires)]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
    return run


@pytest.mark.parametrize("write", ["per_record", "one_write"])
@pytest.mark.parametrize("pipeline", ["0", "2", "8", "t3"])
@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_sockets_ended_without_fin_after_complete_messages_cost_nothing(lanes, pipeline, write, monkeypatch):
    # the sending rank exits right after its last send completed, without closeSend: every lane's socket
    # ends at a record boundary with no FIN. A lane that ended so is done, and the receives its records
    # (and the other lanes' records, still being read) complete; a lane's end failed the whole connection
    # while another lane still read or opened records of a fully sent message (8 of 20 at 2 lanes). With
    # the open stage (pipeline 2, 8) the lane's last records may still sit in its ring as its socket ends:
    # they are opened and counted before the lane ends (they were dropped: 14 of 20 at 1 lane; in one write
    # 47-49 of 50 at 1, 2 and 4 lanes)
    set_stages(monkeypatch, pipeline)
    # (the last message has several records a lane at 4 lanes, so its lanes' last records queue in their rings)
    sizes, rounds = MESSAGE + [0, 7, 3 * RECORD + 1] + MESSAGE, 20
    def script(p):
        for i, n in enumerate(sizes):
            honest(p, i, n)
    results = run_rounds(sizes, script if write == "per_record" else in_one_write(script), rounds, lanes)
    bad = [got for got in results if got["error"] or got["completed"] != [(i, n, True) for i, n in enumerate(sizes)]]
    assert not bad, f"{len(bad)} of {rounds} connections lost messages: {bad[0]}"


def _cut_at_boundary(sent, close):
    """Message 0 (nine records over two lanes) with only the records `sent`, then the sockets of the lanes in
    `close` ended without FIN records at a record boundary; the other lanes stay open."""
    def script(p):
        data = payload(0, MESSAGE[0])
        for j in sent:
            p.record(j % 2, 0, MESSAGE[0], j * RECORD, data[j * RECORD:(j + 1) * RECORD])
        for i in close:
            p.socks[i].close()
    return script


@pytest.mark.parametrize("sent,close", [([0, 1, 2, 3, 5, 7], [0]), ([1, 3, 5, 7], [0]), ([0, 1, 2, 4, 6, 8], [1]),
                                        (range(7), [0, 1]), ([], [0, 1])],
                         ids=["lane0_short_lane1_open", "lane0_empty_lane1_open", "lane1_short_lane0_open",
                              "both_short", "nothing"])
@pytest.mark.parametrize("pipeline", ["0", "2", "t2"])
def test_a_message_cut_at_a_record_boundary_fails_promptly(sent, close, pipeline, monkeypatch):
    # a lane that ends quietly ends only itself, but a receive that still needs its records can never
    # complete: it fails at once, though another lane's socket stays open, and never completes with holes
    set_stages(monkeypatch, pipeline)
    t0 = time.monotonic()
    got = run_rogue(MESSAGE, _cut_at_boundary(sent, close))
    # irecv: nothing was sent, and both lanes ended before the receive was posted
    assert got["error"] is not None and got["where"] in ("test", "irecv") and got["completed"] == [], got
    assert time.monotonic() - t0 < 10, "the cut message failed only when the open lane ended"
    assert any("ended without closing" in m for m in got["logs"]), got["logs"]


@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("late", [False, True], ids=["pending", "posted_later"])
@pytest.mark.parametrize("pipeline", ["0", "2", "t2"])
def test_a_receive_no_lane_can_serve_fails_once_every_lane_ended(lanes, late, pipeline, monkeypatch):
    # message 0 complete, then every socket ends without FIN: message 1's receive, pending as the lanes
    # end or posted after, fails with the plugin's error (never waits for records that cannot come)
    set_stages(monkeypatch, pipeline)
    def script(p):
        honest(p, 0, MESSAGE[0])
        if not late:
            time.sleep(0.5)  # message 0 completes and message 1's receive is posted
        p.close()
    t0 = time.monotonic()
    got = run_rogue(MESSAGE * 2, script, lanes=lanes, delays=[0, 0.5] if late else None)
    assert got["error"] is not None and got["where"] in (("irecv", "test") if late else ("test",)), got
    assert got["completed"] == [(0, MESSAGE[0], True)], got
    assert time.monotonic() - t0 < 10
    assert any("ended without closing" in m for m in got["logs"]), got["logs"]


@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("cut", [HEADER // 2, HEADER + 1000], ids=["in_header", "in_payload"])
@pytest.mark.parametrize("pipeline", ["0", "2", "t2"])
def test_a_lane_that_ends_mid_record_fails_the_receive(cut, lanes, pipeline, monkeypatch):
    # lane 0's record 6 of message 0 stops part way and its socket ends (its later records never come): the
    # message fails, while lane 1 (at 2 lanes) has all of its records in and its socket still open
    set_stages(monkeypatch, pipeline)
    def script(p):
        data = payload(0, MESSAGE[0])
        for j in range(8 if lanes == 2 else 7):
            p.record(j % lanes, 0, MESSAGE[0], j * RECORD, data[j * RECORD:(j + 1) * RECORD],
                     cut=cut if j == 6 else None)
        p.socks[0].close()
    got = run_rogue(MESSAGE, script, lanes=lanes)
    assert got["error"] is not None and got["where"] == "test" and got["completed"] == [], got
    assert any("mid-record" in m for m in got["logs"]), got["logs"]


@pytest.mark.parametrize("pipeline", ["0", "2", "8", "t3"])
@pytest.mark.parametrize("cut", [HEADER // 2, HEADER + 1000], ids=["in_header", "in_payload"])
def test_a_message_sent_before_a_mid_record_cut_stands(cut, pipeline, monkeypatch):
    # one lane: message 0 whole, then message 1's first record stops part way and the socket ends (a rank
    # killed mid-send). Message 0 completes: its last records may still sit in the open stage's ring as the
    # lane meets the cut, and are opened and counted before it fails the connection; message 1 fails
    set_stages(monkeypatch, pipeline)
    def script(p):
        honest(p, 0, MESSAGE[0])
        rec = netbench.record_bytes(MESSAGE[0], 1)
        p.record(0, 1, MESSAGE[0], 0, payload(1, MESSAGE[0])[:rec], cut=cut)
    rounds = 10
    # in one write: the lane reads message 0's last record with (part of) the cut header behind it
    results = run_rounds(MESSAGE * 2, in_one_write(script), rounds, lanes=1)
    bad = [got for got in results if got["completed"] != [(0, MESSAGE[0], True)] or "mid-record" not in (got["error"] or "")]
    assert not bad, f"{len(bad)} of {rounds} connections: {bad[0]}"


def connect_with_stage(pipe, lib_path, key, stage):
    out = {"error": None}
    try:
        net = Net(lib_path, key)
        handle = bytearray(pipe.recv())
        handle[56:64] = struct.pack("<Q", stage)  # net_handle.stage: what a tampered bootstrap could carry
        scomm = net.connect(handle, time.monotonic() + DEADLINE)
        buf = buffer(7)
        ctypes.memmove(buf, payload(0, 7), 7)
        net.wait(net.isend(scomm, buf, 7, time.monotonic() + DEADLINE), time.monotonic() + DEADLINE)
        net.t.closeSend(scomm)
    except (netplugin.NetError, TimeoutError) as e:
        out["error"] = str(e)
    pipe.send(out)


def test_handle_from_the_wire_is_not_trusted_as_a_pointer():
    # the listen handle crosses NCCL's bootstrap (plain TCP): a connecting rank that took a non-zero
    # stage field as its own half-made connection dereferenced (and later freed) an attacker's pointer
    lib = str(pluginenv.library())
    ctx = mp.get_context("spawn")
    rp, rc = ctx.Pipe()
    sp, sc = ctx.Pipe()
    r = ctx.Process(target=receiver, args=(rc, lib, KEY, [7], None, 1))
    s = ctx.Process(target=connect_with_stage, args=(sc, lib, KEY, 0x4141414141414140))
    r.start(), s.start()
    rc.close(), sc.close()
    try:
        assert rp.poll(DEADLINE)
        sp.send(rp.recv())
        assert sp.poll(DEADLINE + 5)
        try:
            sent = sp.recv()
        except EOFError:
            raise AssertionError(f"the connecting rank died (exit code {s.join(5) or s.exitcode})") from None
        assert rp.poll(DEADLINE + 5)
        got = rp.recv()
        assert sent["error"] is None and got["completed"] == [(0, 7, True)], (sent, got)
    finally:
        _reap(r, s)


# ---- keys: the plugin and ccbridge.secure refuse the same material ----

def _keys_table():
    rnd = random.Random(5)
    strong = [rnd.randbytes(32) for _ in range(20)] + [hashlib.sha256(b"x%d" % i).digest() for i in range(10)]
    weak = [bytes(32), b"\xff" * 32, bytes(range(32)), bytes(range(100, 132)), bytes(16) + bytes(range(1, 17)),
            b"0123456789abcdef" * 2, rnd.randbytes(16) * 2, bytes([i % 15 for i in range(32)]),
            b"correct horse battery staple!!!!", ("pässwörd-über-alles-1234".encode() + b"x" * 32)[:32],
            bytes(rnd.randrange(256) for _ in range(20)) + bytes(range(40, 52)),
            bytes([rnd.choice(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJ") for _ in range(31)]) + b"\x01"]
    return strong, weak


def test_plugin_refuses_the_keys_ccbridge_secure_refuses():
    strong, weak = _keys_table()
    assert all(keys._weakness(k) is None for k in strong)
    assert all(keys._weakness(k) for k in weak)
    net = Net(str(pluginenv.library()), KEY)
    assert net.rc == 0
    for k in strong + weak:
        os.environ["CCBRIDGE_KEY"] = k.hex()
        ctx = ctypes.c_void_p()
        net.logs.clear()
        rc = net.t.init(ctypes.byref(ctx), 1, None, ctypes.cast(netplugin._LOG, P), None)
        assert (rc == 0) == (keys._weakness(k) is None), (k.hex(), rc, keys._weakness(k))
        if rc == 0:
            net.t.finalize(ctx)
        else:
            assert rc == 5 and net.logs and "refused" in net.logs[-1][1] and k.hex() not in net.logs[-1][1]
    os.environ["CCBRIDGE_KEY"] = KEY


@pytest.mark.parametrize("text,why", [("", "no key"), ("abc", "expected 64 hex digits"),
                                      ("zz" * 32, "not all hex digits")])
def test_plugin_refuses_malformed_or_missing_keys(text, why, monkeypatch):
    monkeypatch.delenv("CCBRIDGE_KEY_FILE", raising=False)
    net = Net(str(pluginenv.library()), text or None)
    assert net.rc == 5 and why in net.logs[-1][1]


def test_plugin_reads_a_key_file_only_when_private(tmp_path, monkeypatch):
    f = tmp_path / "key"
    f.write_text(KEY + "\n")
    f.chmod(0o644)
    monkeypatch.setenv("CCBRIDGE_KEY_FILE", str(f))
    net = Net(str(pluginenv.library()), None)
    assert net.rc == 5 and "chmod 600" in net.logs[-1][1]
    f.chmod(0o600)
    ctx = ctypes.c_void_p()
    assert net.t.init(ctypes.byref(ctx), 1, None, ctypes.cast(netplugin._LOG, P), None) == 0
    net.t.finalize(ctx)


def test_properties_host_memory_one_device():
    net = Net(str(pluginenv.library()), KEY)
    n = R()
    assert net.rc == 0 and net.t.devices(ctypes.byref(n)) == 0 and n.value == 1
    p = Props11()
    assert net.t.getProperties(0, ctypes.byref(p)) == 0
    assert p.ptrSupport == 1 and p.maxRecvs == 1 and p.name == b"lo" and p.maxMultiRequestSize == 1
    assert ctypes.sizeof(Net11) == 22 * 8  # name + 21 entry points (v11)
    v10 = ctypes.c_void_p.in_dll(net.lib, "ncclNetPlugin_v10")
    assert v10 is not None
    net.t.finalize(net.ctx)


def test_bench_net_runs_without_torch(tmp_path):
    """`bench net` needs neither torch nor a GPU (`pip install .` brings no torch): with torch's import refused in
    every process it starts, it still runs to its tables (it imported the torch benches' module for a helper)."""
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None  # import torch fails\n")
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "CCBRIDGE_KEY": KEY, "PYTHONPATH": path}
    p = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env)
    assert p.returncode == 1 and "ModuleNotFoundError" in p.stderr  # the block holds in a child
    p = subprocess.run([sys.executable, "-m", "ccbridge", "bench", "net", "--lanes", "1", "--total", "1M", "-b", "64K",
                        "-e", "64K", "--iters", "1"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert "GB/s" in p.stdout


def test_bench_net_writes_a_result_with_checked_bytes(tmp_path):
    import subprocess
    import sys

    from ccbridge import results

    out = tmp_path / "net.json"
    p = subprocess.run([sys.executable, "-m", "ccbridge", "bench", "net", "--lanes", "1", "3", "--total", "24M",
                        "-b", "64K", "-e", "512K", "--iters", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "CCBRIDGE_KEY": KEY})
    assert p.returncode == 0, p.stderr
    res = results.load(out)
    streams = [r for r in res.rows if r.metric == "stream"]
    assert sorted((r.params["lanes"], r.params["size"]) for r in streams) == [(1, 65536), (1, 524288),
                                                                             (3, 65536), (3, 524288)]
    assert all(r.median > 0 and r.extra["bad"] == 0 for r in streams) and not res.errors
    assert all(r.extra["cpu_s_per_gb_send"] > 0 and r.extra["cpu_s_per_gb_recv"] > 0 for r in streams)
    assert {r.params["size"] for r in res.rows if r.metric == "half_rtt"} == {8, 4096, 65536}
    # the account on stdout: each row once, in one table (progress, a line a measurement, went to stderr)
    table = [ln.split() for ln in p.stdout.splitlines() if re.match(r" +\d+ +\d+ ", ln)]
    assert sorted((int(t[1]), int(t[0])) for t in table) == sorted((r.params["lanes"], r.params["size"])
                                                                     for r in streams)
    assert all(float(t[2]) == round(r.median, 2) for t, r in zip(table, streams)) and res.env
    assert len(p.stdout.splitlines()) <= 2 + 1 + len(streams) + 3 and "CPU-s/GB" not in p.stderr
    assert sum(ln.startswith("  encrypted ") for ln in p.stderr.splitlines()) == len(streams)
    # which lane mode ran (what the two processes read from the environment they inherit)
    mode = pluginenv.lane_mode({**os.environ, "CCBRIDGE_KEY": KEY})
    assert res.settings["lane_mode"] == res.env["nccl_net_plugin"]["lane_mode"] == mode
    header = " ".join(line.lstrip("# ") for line in p.stdout.splitlines() if line.startswith("#"))
    assert f"cores, {mode}, spin {pluginenv.spin_us({**os.environ})} us" in header
    # beside each encrypted row: plain TCP at its lane count, the CPU bound and the inputs it was made of
    for r in streams:
        x = r.extra
        assert x["cores_visible"] == len(os.sched_getaffinity(0)) and x["tcp_gbps"] > 0 and x["bound_gbps"] > 0
        assert x["of_tcp"] == pytest.approx(r.median / x["tcp_gbps"], abs=2e-3)
        assert x["of_bound"] == pytest.approx(r.median / x["bound_gbps"], abs=2e-3)
        assert x["aes_gcm_gbps_per_core_encrypt"] > 0 and x["tcp_cpu_s_per_gb_send"] > 0
        assert len(x["poll_cores"]) == 1 and x["poll_cores"][0] >= 0  # the two polling threads, apart
    assert {r.params["record"] for r in res.rows if r.metric == "aes_gcm_encrypt"} == {32768, 65536, 176128, 524288}
    assert max(map(len, (p.stdout + p.stderr).splitlines())) <= 120
    # the plugin's work with none of its waits (ccbridge-net-bound), measured at the largest size, every lane count
    both = {r.params["streams"]: r for r in res.rows if r.metric == "uncoupled"}
    assert sorted(both) == [1, 3] and all(r.params["size"] == 524288 and r.median > 0 for r in both.values())
    for r in streams:
        x, u = r.extra, both[r.params["lanes"]]
        if r.params["size"] == 524288:  # paired: each repeat's share of the bound measured right after it
            assert x["of_uncoupled_each"] == pytest.approx([g / b for g, b in zip(x["gbps_each"], u.extra["both"])],
                                                           abs=2e-3)
            assert min(x["gbps_each"]) == pytest.approx(r.min, abs=1e-3) and min(u.extra["both"]) == u.min
            assert x["of_uncoupled"] == pytest.approx(statistics.median(x["of_uncoupled_each"]), abs=1e-3)
        else:
            assert "of_uncoupled" not in x  # measured at another record size: not set beside it
        assert u.extra["bytes"] > 0 and len(u.extra["streams"]) == len(u.extra["crypto"]) == u.n == r.n
        # the plugin's threads a lane, the bench's messages in flight, a polling thread a side as the bench's
        assert u.extra["crypto_threads"] == pluginenv.crypto_threads({**os.environ})
        assert (u.extra["inflight"], u.extra["poll"]) == (r.params["inflight"], 1)
    # beside each row at the largest size: the bound at once and the share of it, plain TCP at its lane count
    for t, r in zip(table, streams):
        x = r.extra
        assert t[3:] == [f"{x['uncoupled_gbps']:.2f}" if "of_uncoupled" in x else "-",
                         f"{x['of_uncoupled']:.2f}" if "of_uncoupled" in x else "-", f"{x['tcp_gbps']:.2f}"]


def test_a_missing_bound_program_is_a_skip_not_a_failure(monkeypatch):
    from ccbridge import pluginenv

    def gone():
        raise FileNotFoundError("ccbridge-net-bound is not built")
    monkeypatch.setattr(pluginenv, "bound_program", gone)
    bound, skipped = netbench._bound_for(1 << 16, 1 << 20, 4)
    assert bound is None and skipped == [{"test": "net_loopback:uncoupled",
                                         "reason": "the uncoupled bound did not run: ccbridge-net-bound is not built"}]


def test_a_bound_that_fails_mid_bench_is_one_skip_and_leaves_the_rows_unjudged(tmp_path):
    from ccbridge import pluginenv

    try:
        pluginenv.library()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    # a program that exits 1 with a message: each repeat's bound fails, the bench goes on, one skip says why
    fake = tmp_path / "bound"
    fake.write_text("#!/bin/sh\necho 'libcrypto: not found' >&2\nexit 1\n")
    fake.chmod(0o755)
    got = netbench._Bound((str(fake), "-j"), frozenset(os.sched_getaffinity(0))).once(2)
    assert got == "exit 1: libcrypto: not found"
    rows = netbench._Rows([("stream", 2, 1024, 1, 1024, 2)], lambda _: None)
    for rank, v in ((0, {"bytes": 1, "wall": 1, "plugin_cores": 1, "poll_cores": 0, "bad": 0, "bound": got}),
                    (1, {"bytes": 1024, "wall": 1e-6, "plugin_cores": 1, "poll_cores": 0, "bad": 0})) * 2:
        rows.take(rank, ("stream", v))
    assert [r.metric for r in rows.rows] == ["stream"] and not rows.bound_rows
    assert "of_uncoupled" not in rows.rows[0].extra and rows.skipped == [
        {"test": "net_loopback:uncoupled", "reason": "the uncoupled bound did not run: exit 1: libcrypto: not found"}]
    # the bound runs on the cores given, wider than this thread's own (a rank's where CCBRIDGE_RANK_CPUS splits
    # them), and this thread's are restored after it
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip("one core: no wider set to give")
    probe = tmp_path / "cores"
    probe.write_text("#!/bin/sh\ngrep Cpus_allowed_list /proc/self/status >&2\nexit 3\n")
    probe.chmod(0o755)
    got = {}

    def narrowed():  # a thread of its own, so that narrowing it leaves the test's thread as it was
        os.sched_setaffinity(0, {min(mine)})
        got["why"] = netbench._Bound((str(probe),), frozenset(mine)).once(1)
        got["after"] = os.sched_getaffinity(0)
    t = threading.Thread(target=narrowed)
    t.start()
    t.join()
    cpus = set()
    for part in got["why"].split("\t")[1].split(","):
        lo, _, hi = part.partition("-")
        cpus |= set(range(int(lo), int(hi or lo) + 1))
    assert got["why"].startswith("exit 3: Cpus_allowed_list:") and cpus == mine and got["after"] == {min(mine)}


def test_the_bound_program_refuses_bad_arguments_and_checks_its_tags():
    import subprocess

    from ccbridge import pluginenv

    try:
        prog = str(pluginenv.bound_program())
    except FileNotFoundError as e:
        pytest.skip(str(e))
    bad = subprocess.run([prog, "-x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage:" in bad.stderr
    assert subprocess.run([prog, "-l", "40"], capture_output=True, text=True).returncode == 2
    ok = subprocess.run([prog, "-j", "-l", "2", "-s", "256K", "-t", "4M", "-n", "2"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    import json
    g = json.loads(ok.stdout)
    # 256 KiB over 2 lanes: records of 128 KiB (the plugin's plan); 4 MiB in whole records, as both jobs move them
    assert (g["lanes"], g["record"], g["size"], g["bytes"]) == (2, 131072, 262144, 4 << 20)
    assert all(len(g[k]) == 2 and min(g[k]) > 0 for k in ("streams", "crypto", "both", "seal", "open", "tcp"))
    # both at once ends when the later job ends: no faster than either job at once
    assert all(b <= min(t, se, op) * 1.0001 for b, t, se, op in zip(g["both"], g["tcp"], g["seal"], g["open"]))
    assert g["crypto_threads"] == 1
    # -c: a lane's records split over that many crypto threads (5 records of 128 KiB a lane over 3: 2, 2, 1),
    # the same bytes in all; at most MAX_CRYPTO (8)
    three = subprocess.run([prog, "-j", "-l", "2", "-s", "256K", "-t", "1280K", "-n", "1", "-c", "3"],
                           capture_output=True, text=True)
    assert three.returncode == 0, three.stderr
    g3 = json.loads(three.stdout)
    assert (g3["crypto_threads"], g3["bytes"]) == (3, 1280 << 10) and min(g3["crypto"]) > 0
    # every record sealed and opened once over the lane's three threads (5 a lane): none dropped or done twice
    assert (g3["lane_records"], g3["sealed"], g3["opened"]) == ([5, 5], [10], [10])
    for c in ("0", "9"):
        too = subprocess.run([prog, "-c", c], capture_output=True, text=True)
        assert too.returncode == 2 and "-c: 1..8" in too.stderr
    # -i: the messages in flight the records lie in (default 8, the bench's); -y: a polling thread a side
    assert (g["inflight"], g["poll"], g3["poll"]) == (8, 0, 0)
    polled = subprocess.run([prog, "-j", "-l", "3", "-s", "64K", "-t", "1M", "-n", "1", "-i", "2", "-y"],
                            capture_output=True, text=True)
    assert polled.returncode == 0, polled.stderr
    gp = json.loads(polled.stdout)
    # 64 KiB over 3 lanes: two records of 32 KiB a message, so lane 2 carries none of the plan's and takes record 0
    assert (gp["inflight"], gp["poll"], gp["record"], gp["lanes"]) == (2, 1, 32768, 3) and min(gp["both"]) > 0
    for i in ("0", "65"):
        too = subprocess.run([prog, "-i", i], capture_output=True, text=True)
        assert too.returncode == 2 and "-i: 1..64" in too.stderr
    # -p: the pollers nap that long between passes (bench net's on a machine of few cores)
    napped = json.loads(subprocess.run([prog, "-j", "-l", "1", "-s", "64K", "-t", "1M", "-n", "1", "-y", "-p", "10"],
                                       capture_output=True, text=True, check=True).stdout)
    assert (napped["poll"], napped["poll_pause_us"]) == (1, 10)
    for bad, why in ((["-p", "-1"], "-p: 0..100000 us"), (["-s", "0"], "-s: at least 1 byte")):
        too = subprocess.run([prog] + bad, capture_output=True, text=True)
        assert too.returncode == 2 and why in too.stderr


def _bound(*args) -> dict:
    import json
    import subprocess

    from ccbridge import pluginenv

    try:
        prog = str(pluginenv.bound_program())
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return json.loads(subprocess.run([prog, "-j", "-n", "1", *args], capture_output=True, text=True,
                                     check=True).stdout)


def test_the_bound_keeps_its_records_inside_messages_of_any_size():
    # 40000 B over 1 lane: the plugin's plan rounds the record up to 40960, past the message; a record of one
    # message is the message (the bound read and wrote 960 B past each 40000 B buffer before)
    g = _bound("-l", "1", "-s", "40000", "-i", "1", "-t", "4M")
    assert (g["record"], g["lane_records"], g["bytes"]) == (40000, [104], 104 * 40000)
    assert _bound("-l", "1", "-s", "1K", "-r", "4K", "-t", "1M")["record"] == 1024
    # messages of one record travel on lane 0 alone, as the plugin sends them (its first lane rotates only for
    # messages of several): the other lanes carry nothing, and the bytes are lane 0's
    one = _bound("-l", "3", "-s", "1K", "-t", "1M")
    assert (one["lane_records"], one["bytes"], one["sealed"], one["opened"]) == ([1024, 0, 0], 1 << 20, [1024],
                                                                                  [1024])
    # 100 KiB over 3 lanes: records of 36 KiB, two whole ones a message; every lane carries its share
    odd = _bound("-l", "3", "-s", "100K", "-t", "3M")
    assert odd["record"] == 36864 and odd["lane_records"] == [28, 28, 28] and odd["bytes"] == 84 * 36864


def test_the_bounds_coupled_pass_hands_real_records_over_where_no_places_are_shared():
    # -k: a fourth pass whose receiving crypto threads open the records the sender sealed, in their places (a tag
    # that failed would end the program with 1): 1 MiB messages over 2 lanes in records of 256 KiB (two a lane a
    # message), one message in flight: the stream reads into a place again only once its record there is opened
    g = _bound("-l", "2", "-s", "1M", "-r", "256K", "-t", "8M", "-c", "3", "-i", "1", "-k")
    assert len(g["coupled"]) == 1 and g["coupled"][0] > 0
    assert "coupled" not in _bound("-l", "2", "-s", "1M", "-t", "4M")
    # one record a message travels on lane 0 alone: coupled too
    assert _bound("-l", "3", "-s", "16K", "-t", "1M", "-k")["coupled"][0] > 0
    # 64 KiB over 3 lanes: two records a message, so lane 2 reads into record 0's place as lane 0 does: none
    assert _bound("-l", "3", "-s", "64K", "-t", "1M", "-k")["coupled"] is None


def test_native_spin_hints_stay_inside_their_architectures_guards():
    # setup.py builds the plugin and its bound anywhere (plain C): an x86 builtin outside an x86 guard, as the bound's
    # coupled pass had, stops the whole build on aarch64 (conn.c's relax() guards its own)
    from pathlib import Path

    native = Path(pluginenv.__file__).parent / "native"
    if not native.is_dir():
        pytest.skip(f"no native sources at {native}")
    bare = []
    for path in sorted(native.rglob("*.[ch]")):
        conds = []  # the conditions of the #if blocks around each line (#else: the block's negation)
        for no, line in enumerate(path.read_text().splitlines(), 1):
            d = line.strip()
            if re.match(r"#\s*if", d):
                conds.append(d)
            elif re.match(r"#\s*elif", d):
                conds[-1] = d
            elif re.match(r"#\s*else", d):
                conds[-1] = "!" + conds[-1]
            elif re.match(r"#\s*endif", d):
                conds.pop()
            elif "__builtin_ia32_" in line and not any(c[0] != "!" and re.search(r"__x86_64__|__i386__", c)
                                                       for c in conds):
                bare.append(f"{path.relative_to(native)}:{no}")
    assert not bare, bare


def _children(pid):  # pid's live children (no zombies), lowest first: the bound forks its sender first
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if d.isdigit() and int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(d))
    return sorted(out)


def _threads(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))
    except OSError:
        return 0


def _alive(pid):  # running, not a zombie
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children_when(pid, ready, deadline, step=0.005):
    """pid's children once ready(children) holds, or at the deadline as they are then."""
    while not ready(kids := _children(pid)) and time.monotonic() < deadline:
        time.sleep(step)
    return kids


def _start_bound(*args):  # the bound program with args, its output piped; skipped where it is not built
    import subprocess

    try:
        prog = str(pluginenv.bound_program())
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return subprocess.Popen([prog, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _cpu_s(pid):  # pid's own user + system CPU seconds (not its children's)
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_bound_waits_for_the_later_side_without_taking_a_core():
    # the program polls both sides' reports; a side that reported and exited hangs up its socket, which poll
    # reports whatever the events asked, so the program spun on a core until the later side reported. Pass 1
    # (crypto alone, the sides share nothing): the receiver stopped, the sender ends, the program must sleep
    import signal

    p = _start_bound("-j", "-l", "1", "-s", "1M", "-t", "1G", "-n", "1")
    stopped = None
    try:
        deadline = time.monotonic() + 20
        first = _children_when(p.pid, lambda k: len(k) >= 2, deadline)
        # pass 1's pair, its receiver's crypto thread started (after the go)
        kids = _children_when(p.pid, lambda k: len(k) >= 2 and not set(k) & set(first) and _threads(k[1]) >= 2,
                              deadline)
        assert len(kids) == 2 and not set(kids) & set(first), (first, kids)
        os.kill(kids[1], signal.SIGSTOP)
        stopped = kids[1]
        while kids[0] in _children(p.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert kids[0] not in _children(p.pid), "the sender never ended its pass"
        c0 = _cpu_s(p.pid)
        time.sleep(0.5)
        spent = _cpu_s(p.pid) - c0
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert spent < 0.1, f"the program spent {spent:.2f} CPU-s of 0.5 s waiting for the receiver's report"
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        p.kill()
        p.wait()


# either side: the receiving one's death left the sender blocked on a socket the program still held, and the
# program waiting for the sender's figures, for ever
@pytest.mark.parametrize("dies", [0, 1], ids=["sender", "receiver"])
def test_a_bound_side_that_dies_takes_the_measurement_down_and_leaves_no_process(dies):
    import signal

    p = _start_bound("-j", "-l", "2", "-s", "4M", "-t", "64G", "-n", "1", "-y")
    try:
        # mid-pass: both sides forked and the sender's lane threads started (they start after the go)
        deadline = time.monotonic() + 20
        kids = _children_when(p.pid, lambda k: len(k) >= 2 and _threads(k[0]) >= 2, deadline, 0.05)
        assert len(kids) == 2 and _threads(kids[0]) >= 2, kids
        os.kill(kids[dies], signal.SIGKILL)  # mid-pass
        _, err = p.communicate(timeout=30)
        assert p.returncode == 1 and "result: a measuring process ended early" in err
        deadline = time.monotonic() + 10  # the other side ends with the program (its parent-death signal)
        while _alive(kids[1 - dies]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(kids[1 - dies])
    finally:
        p.kill()
        p.wait()


# a side that dies after its "ready" and before the go: the go met a closed socket and SIGPIPE killed the program
# (exit -13, no word said) rather than its one line and exit 1
def test_a_bound_side_that_dies_before_the_go_takes_the_measurement_down_with_a_line():
    import signal

    p = _start_bound("-j", "-l", "2", "-s", "4M", "-t", "64G", "-n", "1")
    stopped = None
    try:
        deadline = time.monotonic() + 20
        kids = _children_when(p.pid, lambda k: len(k) >= 2, deadline, 0.002)
        assert len(kids) == 2, kids
        os.kill(p.pid, signal.SIGSTOP)  # the program holds its go while both sides get ready
        stopped = p.pid
        time.sleep(0.5)  # a side's set-up (its messages touched) takes milliseconds; then it waits for the go
        assert _threads(kids[0]) == 1 and _threads(kids[1]) == 1, "a side started before the go"
        os.kill(kids[0], signal.SIGKILL)
        time.sleep(0.1)
        os.kill(p.pid, signal.SIGCONT)
        stopped = None
        _, err = p.communicate(timeout=30)
        assert p.returncode == 1 and "go: a measuring process ended early" in err, (p.returncode, err)
        deadline = time.monotonic() + 10
        while _alive(kids[1]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(kids[1])
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        p.kill()
        p.wait()


def test_the_cpu_bound_adds_a_seal_and_an_open_to_what_tcp_costs():
    # 0.1 + 0.1 CPU-s/GB of TCP and 5 GB/s per core each way (0.2 + 0.2): 0.6 CPU-s/GB, so 16 cores move 26.7 GB/s
    assert netbench.cpu_bound(16, 0.1, 0.1, 5.0, 5.0) == pytest.approx(16 / 0.6)
    # the plugin's record plan (ncclnet/plan.c record_plan): one record up to 32 KiB, then size / lanes in 4 KiB steps
    assert [netbench.record_bytes(s, n) for s, n in [(8, 4), (32 << 10, 8), (64 << 10, 8), (4 << 20, 8),
                                                     (512 << 10, 3)]] == [8, 32 << 10, 32 << 10, 512 << 10, 176128]


_PLAN_MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
uint32_t record_plan(size_t size, int nlanes, size_t *record);
int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        size_t rec;
        record_plan(strtoull(argv[i], NULL, 10), atoi(argv[i + 1]), &rec);
        printf("%zu\n", rec);
    }
    return 0;
}
"""


def test_bench_nets_record_plan_is_the_plugins(tmp_path):
    """netbench.record_bytes is the Python twin of plan.c's record_plan (the AES-GCM rate is measured at the record
    size the plugin uses): the two agree, the plugin's own function compiled and asked here."""
    import shutil
    import subprocess
    from pathlib import Path

    gcc = shutil.which("gcc") or shutil.which("cc")
    if not gcc:
        pytest.skip("no C compiler to build the plugin's record plan")
    src = Path(__file__).resolve().parent.parent / "src" / "ccbridge" / "native"
    (tmp_path / "main.c").write_text(_PLAN_MAIN)
    exe = tmp_path / "plan"
    subprocess.run([gcc, "-O1", "-std=gnu11", "-o", str(exe), str(tmp_path / "main.c"),
                    *sorted(str(p) for p in (src / "ncclnet").glob("*.c")), str(src / "common" / "ossl.c"),
                    "-ldl", "-lpthread"], check=True)
    cases = [(s, n) for s in (1, 4096, 32 << 10, (32 << 10) + 1, 64 << 10, 100_000, 512 << 10, 1 << 20, 4 << 20,
                              (4 << 20) + 5, 64 << 20) for n in (1, 2, 3, 4, 7, 8, 16)]
    out = subprocess.run([str(exe), *[str(v) for c in cases for v in c]], capture_output=True, text=True, check=True)
    assert [int(x) for x in out.stdout.split()] == [netbench.record_bytes(s, n) for s, n in cases]


def test_bench_net_renders_each_row_beside_its_anchors_within_120_columns(monkeypatch):
    from ccbridge.results import Result, Row
    from ccbridge.secure import benchrows

    monkeypatch.setattr(netbench, "cores_visible", lambda: 128)
    stream = Row.of("net_loopback", "stream", "GB/s", [20.0, 21.0, 22.0], size=4 << 20, lanes=16, inflight=8)
    stream.extra = {"plugin_cores_send": [8.0], "plugin_cores_recv": [9.0], "cpu_s_per_gb_send": 0.4,
                    "cpu_s_per_gb_recv": 0.45, "bad": 0}
    tcp = Row.of("net_loopback", "tcp_plaintext", "GB/s", [40.0], size=4 << 20, streams=16)
    tcp.extra = {"cores_send": [4.0], "cores_recv": [4.0], "cpu_s_per_gb_send": 0.1, "cpu_s_per_gb_recv": 0.1}
    gcm = [Row.of("net_loopback", f"aes_gcm_{op}", "GB/s per core", [5.0], record=256 << 10, threads=t)
           for t in (1, 128) for op in ("encrypt", "decrypt")]
    rows = [stream, tcp] + gcm
    netbench._compare(rows)
    x = stream.extra
    assert x["bound_gbps"] == pytest.approx(128 / 0.6, abs=1e-3) and x["of_tcp"] == 0.525
    assert x["of_bound"] == round(21.0 / (128 / 0.6), 3) and x["cpu_efficiency"] == round(0.6 / 0.85, 3)
    assert x["record"] == 256 << 10 and x["cores_visible"] == 128 and x["tcp_cpu_s_per_gb_recv"] == 0.1
    # the terminal's account: one line a row, with what judges it (the bound at once and the share of it, plain
    # TCP); the cores, CPU-s/GB and the CPU bound stay in the rows (--json), not in 13 columns and a page of prose
    stream.extra.update(uncoupled_gbps=25.0, of_uncoupled=0.84, bad=1)
    rtt = [Row.of("net_loopback", "half_rtt", "us", [v], size=s, lanes=n)
           for n, s, v in ((1, 8, 12.04), (1, 65536, 56.5), (16, 8, 14.5), (16, 65536, 60.61))]
    skip = {"test": "net_loopback:uncoupled", "reason": "the uncoupled bound did not run: exit 1: no libcrypto"}
    out = benchrows.render_net(Result(kind="net", env={}, settings={}, rows=rows + rtt, skipped=[skip]))
    lines = out.splitlines()
    assert max(map(len, lines)) <= 120 and all(ln == ln.rstrip() for ln in lines) and len(lines) == 6
    assert lines[:2] == ["  size (B)  lanes  encrypted GB/s  at once GB/s  of it  plain TCP GB/s",
                         "   4194304     16           21.00         25.00   0.84           40.00  WRONG BYTES"]
    assert lines[2].startswith("at once: the plugin's work with none of its waits") and lines[3].endswith(": --json")
    assert lines[4:] == [skip["reason"], "one-way trip (us) at 8 / 65536 B: 1 lane 12.0 / 56.5; 16 lanes 14.5 / 60.6"]
    assert "0.400" not in out and "213.33" not in out and "CPU eff" not in out  # the evidence: --json
    assert benchrows.render_net(Result(kind="net", env={}, settings={}, rows=[])) == lines[0]
    # the trips of many lane counts: each count's on one line, every line within 120 columns
    rtt = [Row.of("net_loopback", "half_rtt", "us", [123.45], size=s, lanes=n) for n in (1, 2, 4, 8, 16)
           for s in (8, 4096, 65536)]
    trips = benchrows.render_net(Result(kind="net", env={}, settings={}, rows=rtt)).splitlines()[1:]
    assert len(trips) == 2 and max(map(len, trips)) <= 120 and trips[1].startswith("  4 lanes 123.5 / 123.5 / 123.5;")


def test_bench_net_link_says_whether_the_largest_size_carried_it_and_the_cores_a_host_needs():
    from ccbridge.results import Result, Row
    from ccbridge.secure import benchrows

    def stream(size, lanes, gbps, send=0.4, recv=0.3):
        r = Row.of("net_loopback", "stream", "GB/s", [gbps], size=size, lanes=lanes, inflight=8)
        r.extra = {"cpu_s_per_gb_send": send, "cpu_s_per_gb_recv": recv, "cores_visible": 16}
        return r

    # the largest size's rows only (64 KiB's 30 GB/s is not a 4 MiB figure), each lane count's cores at the link
    res = Result(kind="net", env={}, settings={}, rows=[stream(64 << 10, 8, 30.0), stream(4 << 20, 1, 5.0),
                                                       stream(4 << 20, 8, 18.0, None, 0.3)])
    lines, carried = benchrows.link_lines(res, 200)
    assert not carried and lines == [
        "link 200 Gb/s = 25.00 GB/s, 4194304 B messages, 16 cores here (loopback: both sides on them):",
        "  1 lane: 5.00 GB/s (0.20 of the link); at the link a host needs 10.0 sending + 7.5 receiving cores",
        " 8 lanes: 18.00 GB/s (0.72 of the link); at the link a host needs - cores",
        "not carried here: at most 18.00 GB/s (8 lanes, 0.72 of the link)"]
    lines, carried = benchrows.link_lines(res, 100)
    assert carried and lines[-1] == "carried here at 8 lanes (18.00 GB/s)"
    assert benchrows.link_lines(Result(kind="net", env={}, settings={}, rows=[]), 100) == (
        ["link 100 Gb/s: no encrypted row was measured"], False)


@pytest.mark.parametrize("gbits,rc,said", [("0.001", 0, "carried here at 1 lane"), ("1e6", 1, "not carried here")])
def test_bench_net_link_exits_1_where_the_plugin_did_not_carry_it(gbits, rc, said, tmp_path):
    import subprocess
    import sys

    from ccbridge import results

    out = tmp_path / "net.json"
    p = subprocess.run([sys.executable, "-m", "ccbridge", "bench", "net", "--lanes", "1", "--total", "4M", "-b",
                        "64K", "-e", "64K", "--iters", "1", "--link", gbits, "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "CCBRIDGE_KEY": KEY})
    assert p.returncode == rc, p.stderr
    assert said in p.stdout and results.load(out).settings["link_gbits"] == float(gbits)


def test_bench_net_header_names_the_sizes_and_why_e_is_not_one(monkeypatch, capsys):
    """`-b 64K -e 1M` stopped at 512 KiB (8x steps: the next is 4 MiB) and the header named no size: it names the
    sizes before the run, and says why -e is not one of them."""
    from ccbridge import cli

    class Stop(Exception):
        pass

    def loopback(*a, **k):
        raise Stop

    monkeypatch.setattr(netbench, "loopback", loopback)
    monkeypatch.setenv("CCBRIDGE_KEY", KEY)
    for end, said in (("1M", "# sizes 64 KiB, 512 KiB (-e 1 MiB is not on the 8x steps from -b 64 KiB: the next, "
                             "4 MiB, is past it), lanes 1 2"),
                      ("512K", "# sizes 64 KiB, 512 KiB, lanes 1 2, 8 messages in flight")):
        with pytest.raises(Stop):
            cli.main(["bench", "net", "-b", "64K", "-e", end, "--lanes", "1", "2"])
        out = capsys.readouterr().out
        assert said in " ".join(ln.lstrip("#").strip() if ln.startswith("#   ") else ln for ln in out.splitlines())
        assert all(len(ln) <= 120 for ln in out.splitlines())


def test_bench_net_refuses_more_in_flight_than_the_plugin_holds():
    from ccbridge.errors import UsageError

    with pytest.raises(UsageError, match="at most 32"):
        netbench.loopback([1 << 16], [1], inflight=33)



def test_closing_with_records_in_flight_blames_no_peer():
    # an abort (closeRecv or closeSend with requests in flight) shuts the lanes' sockets under them:
    # a lane cut mid-record or mid-send by its own side's close must not log that the peer closed
    # the connection or that a send failed (a false lead in NCCL's log when a job aborts)
    net = Net(str(pluginenv.library()), KEY)
    assert net.rc == 0
    sizes, blamed = [4 << 20] * 8, []
    for lanes, first in ((2, "recv"), (8, "recv"), (2, "send"), (8, "send")):
        deadline = time.monotonic() + DEADLINE
        lcomm, s, r = net.pair(deadline, lanes)
        sb, rb = [buffer(n) for n in sizes], [buffer(n) for n in sizes]
        for i, n in enumerate(sizes):
            net.irecv(r, rb[i], n, deadline)
            net.isend(s, sb[i], n, deadline)
        time.sleep(0.02)  # records moving on every lane
        before = len(net.logs)
        (net.t.closeRecv if first == "recv" else net.t.closeSend)(r if first == "recv" else s)
        # the closed side's own lanes say nothing (the other side's may: its peer did go away)
        blamed += [m for _, m in net.logs[before:] if f"connection {first}:" in m]
        (net.t.closeSend if first == "recv" else net.t.closeRecv)(s if first == "recv" else r)
        net.t.closeListen(lcomm)
    assert not blamed, blamed
    net.t.finalize(net.ctx)

_LEFT_BEHIND_SCRIPT = r'''
import ctypes, json, os, sys, time
from ccbridge.secure import netplugin

def tasks():
    return len(os.listdir("/proc/self/task"))

def fds():
    return len(os.listdir("/proc/self/fd"))

def settled():
    # a joined thread can stay in /proc/self/task for a moment after pthread_join returns (the kernel wakes the
    # joiner before it reaps the thread): on a loaded host one was counted; a thread left behind never goes
    end = time.monotonic() + 2
    while tasks() > base[0] and time.monotonic() < end:
        time.sleep(0.005)
    return tasks() - base[0]

net = netplugin.Net(sys.argv[1])
assert net.rc == 0, net.logs
base = (tasks(), fds())
out = {"during": {}, "after": []}
sizes = [4 << 20] * 8 + [7, 0, 300001]
for lanes in (1, 4):
    for how in ("clean", "abort_recv", "abort_send"):
        lcomm, s, r = net.pair(time.monotonic() + 60, lanes)
        sb = [ctypes.create_string_buffer(max(n, 1)) for n in sizes]
        rb = [ctypes.create_string_buffer(max(n, 1)) for n in sizes]
        deadline = time.monotonic() + 60
        rq = [net.irecv(r, rb[i], n, deadline) for i, n in enumerate(sizes)]
        sq = [net.isend(s, sb[i], n, deadline) for i, n in enumerate(sizes)]
        if how == "clean":
            for q in sq + rq:
                net.wait(q, deadline, 0)
            out["during"][lanes] = tasks() - base[0]
            net.t.closeSend(s), net.t.closeRecv(r)
        else:  # records in the rings and on the wire when the close comes
            time.sleep(0.002)
            first, second = (r, s) if how == "abort_recv" else (s, r)
            (net.t.closeRecv if first is r else net.t.closeSend)(first)
            (net.t.closeSend if second is s else net.t.closeRecv)(second)
        net.t.closeListen(lcomm)
        out["after"].append((how, lanes, settled(), fds() - base[1]))
net.t.finalize(net.ctx)
print(json.dumps(out))
'''


@pytest.mark.parametrize("pipeline,per_lane", [("0", 1), ("2", 2), ("8", 2), ("", 2), ("t3", 3), ("t8", 8),
                                               ("default", 2)])
def test_pipeline_threads_and_no_thread_or_fd_left_behind(pipeline, per_lane):
    # with CCBRIDGE_NET_TURNS=0, CCBRIDGE_NET_PIPELINE (default 2): a lane is one thread at 0, two (a crypto
    # and a socket stage) otherwise, on each side; CCBRIDGE_NET_TURNS=T (t3, t8; unset: 2): T threads taking
    # turns. Every close, clean or with records in the rings (or being sealed/opened by a lane's threads), ends
    # them all and closes every socket
    import json
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _LEFT_BEHIND_SCRIPT, str(pluginenv.library())], capture_output=True,
                       text=True, timeout=300, env=_mode_env(pipeline))
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["during"] == {str(n): 2 * n * per_lane for n in (1, 4)}, out
    assert all(t == 0 and f == 0 for _, _, t, f in out["after"]), out["after"]


_THREADS_SCRIPT = r'''
import ctypes, os, sys, time
from ccbridge.secure import netplugin

net = netplugin.Net(sys.argv[1])
assert net.rc == 0, net.logs
base, n = len(os.listdir("/proc/self/task")), (1 << 20) + 5
deadline = time.monotonic() + 60
lcomm, s, r = net.pair(deadline, 2)
sb, rb = ctypes.create_string_buffer(b"z" * n, n), ctypes.create_string_buffer(n)
rq, sq = net.irecv(r, rb, n, deadline), net.isend(s, sb, n, deadline)
net.wait(sq, deadline, 0), net.wait(rq, deadline, 0)
assert rb.raw == sb.raw
print("threads", len(os.listdir("/proc/self/task")) - base)
net.t.closeSend(s), net.t.closeRecv(r), net.t.closeListen(lcomm)
net.t.finalize(net.ctx)
'''


@pytest.mark.parametrize("env,mode,per_lane", [
    ({}, "turns 2", 2),
    ({"CCBRIDGE_NET_PIPELINE": "0"}, "turns 2", 2),  # the pipeline's depth alone no longer picks the pipeline
    ({"CCBRIDGE_NET_TURNS": "", "CCBRIDGE_NET_PIPELINE": "0"}, "turns 2", 2),
    ({"CCBRIDGE_NET_TURNS": "0", "CCBRIDGE_NET_PIPELINE": "0"}, "pipeline 0", 1),
    ({"CCBRIDGE_NET_TURNS": "1", "CCBRIDGE_NET_PIPELINE": "0"}, "pipeline 0", 1),
    ({"CCBRIDGE_NET_TURNS": "0"}, "pipeline 2", 2),
    ({"CCBRIDGE_NET_TURNS": "12", "CCBRIDGE_NET_PIPELINE": "0"}, "turns 8", 8),
    ({"CCBRIDGE_NET_TURNS": " 3x"}, "turns 3", 3),  # atoi: leading blanks, trailing junk
    ({"CCBRIDGE_NET_TURNS": "two", "CCBRIDGE_NET_PIPELINE": "0"}, "pipeline 0", 1),  # no digits: 0
    ({"CCBRIDGE_NET_TURNS": "4294967298", "CCBRIDGE_NET_PIPELINE": "0"}, "turns 2", 2),  # glibc cuts to int: 2
], ids=["unset", "pipeline0_alone", "turns_empty", "turns0", "turns1", "turns0_depth_default", "turns12", "turns_3x",
        "turns_two", "turns_2_wrapped"])
def test_turns_are_the_default_and_turns_0_or_1_the_pipeline(env, mode, per_lane):
    # CCBRIDGE_NET_TURNS unset or empty: 2 threads a lane taking turns, whatever CCBRIDGE_NET_PIPELINE says (the
    # stage pipeline at 0 would run one thread a lane); 0 or 1: the stage pipeline at CCBRIDGE_NET_PIPELINE's
    # depth; above 8: 8. The threads of one 2-lane connection's two ends, and pluginenv.lane_mode (what a result
    # records) reading the same environment as the plugin
    import subprocess
    import sys

    full = {k: v for k, v in os.environ.items() if k not in ("CCBRIDGE_NET_PIPELINE", "CCBRIDGE_NET_TURNS")}
    full.update(CCBRIDGE_KEY=KEY, NCCL_SOCKET_IFNAME="lo", **env)
    assert pluginenv.lane_mode(full) == mode
    p = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(pluginenv.library())], capture_output=True,
                       text=True, timeout=120, env=full)
    assert p.returncode == 0 and p.stdout.split()[-2:] == ["threads", str(2 * 2 * per_lane)], p.stdout + p.stderr


def test_lane_mode_reads_the_environment_as_the_plugin_does():
    # C's atoi on a set, non-empty variable; net.h's defaults and bounds
    import re
    from pathlib import Path

    h = (Path(__file__).resolve().parent.parent / "src/ccbridge/native/ncclnet/net.h").read_text()
    defines = {k: int(v) for k, v in re.findall(r"(?m)^#define (\w+) (\d+)\b", h)}
    assert [defines[k] for k in ("DEFAULT_TURNS", "MAX_TURNS", "DEFAULT_PIPELINE", "MAX_PIPELINE", "MAX_LANES",
                                 "DEFAULT_LANES", "DEFAULT_SPIN_US", "SPIN_CORES", "MAX_SPIN_US")] == \
        [pluginenv.DEFAULT_TURNS, pluginenv.MAX_TURNS, pluginenv.DEFAULT_PIPELINE, pluginenv.MAX_PIPELINE,
         pluginenv.MAX_LANES, pluginenv.DEFAULT_LANES, pluginenv.DEFAULT_SPIN_US, pluginenv.SPIN_CORES,
         pluginenv.MAX_SPIN_US]
    mode = pluginenv.lane_mode
    assert mode({"CCBRIDGE_NET_TURNS": " 3x"}) == "turns 3" and mode({"CCBRIDGE_NET_TURNS": "-4"}) == "pipeline 2"
    assert mode({"CCBRIDGE_NET_TURNS": "two", "CCBRIDGE_NET_PIPELINE": "1"}) == "pipeline 2"
    assert mode({"CCBRIDGE_NET_TURNS": "0", "CCBRIDGE_NET_PIPELINE": "20"}) == "pipeline 8"
    assert mode({"CCBRIDGE_NET_TURNS": "0", "CCBRIDGE_NET_PIPELINE": "no"}) == "pipeline 0"
    assert mode({"CCBRIDGE_NET_TURNS": "0", "CCBRIDGE_NET_PIPELINE": ""}) == "pipeline 2"
    # the threads a lane seals (opens) with at once, which the bound gives each lane: T taking turns, else one
    threads = pluginenv.crypto_threads
    assert [threads({}), threads({"CCBRIDGE_NET_TURNS": "5"}), threads({"CCBRIDGE_NET_TURNS": "12"}),
            threads({"CCBRIDGE_NET_TURNS": "1"}), threads({"CCBRIDGE_NET_TURNS": "0", "CCBRIDGE_NET_PIPELINE": "0"})] \
        == [2, 5, 8, 1, 1]


_EPOCH_SCRIPT = r'''
import ctypes, sys, time
from ccbridge.secure import netplugin

net = netplugin.Net(sys.argv[1])
assert net.rc == 0, net.logs
deadline = time.monotonic() + 240
lcomm, s, r = net.pair(deadline, 1)
n, wrong = 66000, 0  # one record each on one lane: records 65535 and 65536 are sealed under different keys
for start in range(0, n, 32):
    idx = range(start, min(n, start + 32))
    sb = {i: ctypes.create_string_buffer(i.to_bytes(8, "little") * 3, 24) for i in idx}
    rb = {i: ctypes.create_string_buffer(24) for i in idx}
    rq = [(i, net.irecv(r, rb[i], 24, deadline)) for i in idx]
    sq = [net.isend(s, sb[i], 24, deadline) for i in idx]
    for q in sq:
        net.wait(q, deadline, 0)
    wrong += sum(net.wait(q, deadline, 0) != 24 or rb[i].raw != sb[i].raw for i, q in rq)
net.t.closeSend(s), net.t.closeRecv(r), net.t.closeListen(lcomm)
net.t.finalize(net.ctx)
print("wrong", wrong)
'''


@pytest.mark.parametrize("pipeline", ["2", "t2", "t3"])
def test_a_lane_crosses_its_record_key_epoch(pipeline):
    # a fresh record key every 2^16 records of a lane (conn.c EPOCH_SHIFT): with CCBRIDGE_NET_TURNS each of a
    # lane's threads keys its own context, so records either side of the boundary are sealed and opened at
    # once under different keys; 66000 one-record messages on one lane, 32 in flight, all byte-exact
    import subprocess
    import sys

    env = _mode_env(pipeline)
    p = subprocess.run([sys.executable, "-c", _EPOCH_SCRIPT, str(pluginenv.library())], capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0 and p.stdout.split()[-2:] == ["wrong", "0"], p.stdout + p.stderr


# ---- a lone one-record message: the lane's fast path (no hand-off, no other thread woken) ----

_WAKES_SCRIPT = r"""
import ctypes, json, os, sys, time
from ccbridge.secure import netplugin

def switches():
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/status") as f:
                out[int(t)] = sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except OSError:
            pass
    return out

net = netplugin.Net(sys.argv[1])
assert net.rc == 0, net.logs
deadline = time.monotonic() + 120
lcomm, s, r = net.pair(deadline, 1)
n = int(sys.argv[2])
sb, rb = ctypes.create_string_buffer(b"12345678", 8), ctypes.create_string_buffer(8)
for i in range(n + 20):  # one message at a time, each on its own; the first 20 warm up
    if i == 20:
        before = switches()
    rq, sq = net.irecv(r, rb, 8, deadline), net.isend(s, sb, 8, deadline)
    net.wait(sq, deadline, 0), net.wait(rq, deadline, 0)
after = switches()
net.t.closeSend(s), net.t.closeRecv(r), net.t.closeListen(lcomm)
net.t.finalize(net.ctx)
print(json.dumps(sorted(after[t] - before.get(t, 0) for t in after if t != os.getpid())))
"""


@pytest.mark.parametrize("mode", ["2", "t2", "t3"])
def test_a_lone_small_message_wakes_no_other_thread_of_its_lane(mode):
    # one 8-byte message at a time on one lane (no polling): the thread that takes it seals and writes it
    # (reads and opens it) itself, so each side's lane has one busy thread and the others never wake; with
    # CCBRIDGE_NET_TURNS each record used to pass the turn on, waking the lane's next thread on both sides
    import json
    import subprocess
    import sys

    n = 2000
    p = subprocess.run([sys.executable, "-c", _WAKES_SCRIPT, str(pluginenv.library()), str(n)], capture_output=True,
                       text=True, timeout=300, env=_mode_env(mode, CCBRIDGE_NET_SPIN_US="0"))
    assert p.returncode == 0, p.stdout + p.stderr
    switches = json.loads(p.stdout.strip().splitlines()[-1])  # the plugin's threads' context switches, fewest first
    assert len(switches) == 2 * (int(mode[1:]) if mode.startswith("t") else 2), switches
    assert switches[-2] >= n // 2 and sum(switches[:-2]) < n // 4, switches


_INTERLEAVED = [7, (1 << 20) + 5, 0, 4096 + 3, 1, RECORD_MIN, (5 << 20) + 1, 8, 8, 8, RECORD + 1, 3, RECORD_MIN + 1]


@pytest.mark.parametrize("how", ["one_at_a_time", "eight_in_flight", "late_receives"])
@pytest.mark.parametrize("lanes", [1, 3])
@pytest.mark.parametrize("mode", ["t2", "t3"])
def test_lone_small_messages_between_bulk_ones_keep_the_lanes_order(how, lanes, mode, monkeypatch):
    # one-record messages (lane 0) between multi-record ones on the same lanes and connection: the fast path
    # (a small message taken while nothing of the lane is in flight, one at a time) and the turns path
    # (behind bulk records still sealed or opened by the lane's other threads, or queued, or arriving before
    # their receive) take turns on the same lane; the receiver wants every lane's records in sequence
    monkeypatch.setenv("CCBRIDGE_NET_LANES", str(lanes))
    set_stages(monkeypatch, mode)
    sizes = _INTERLEAVED * 3
    if how == "late_receives":
        got, sent = run_pair(sizes, concurrent=16, recv_concurrent=1, delays=[0.03, 0, 0, 0.002])
    else:
        got, sent = run_pair(sizes, concurrent=1 if how == "one_at_a_time" else 8)
    assert got["error"] is None and sent["error"] is None, (got, sent)
    assert [(i, n, True) for i, n in enumerate(sizes)] == got["completed"]


@pytest.mark.parametrize("concurrent", [1, 32])
@pytest.mark.parametrize("mode", ["2", "t2", "t3"])
def test_many_small_messages_back_to_back(concurrent, mode, monkeypatch):
    # 3000 one-record messages of 0..3977 bytes on one connection: one at a time (each on the fast path), or
    # 32 in flight (queued behind each other: the fast path only when a lane's queue runs dry)
    set_stages(monkeypatch, mode)
    sizes = [i % 97 * 41 for i in range(3000)]
    got, sent = run_pair(sizes, concurrent=concurrent)
    assert got["error"] is None and sent["error"] is None, (got, sent)
    assert [(i, n, True) for i, n in enumerate(sizes)] == got["completed"]


_EPOCH_FAST_SCRIPT = r"""
import ctypes, sys, time
from ccbridge.secure import netplugin

net = netplugin.Net(sys.argv[1])
assert net.rc == 0, net.logs
deadline = time.monotonic() + 240
lcomm, s, r = net.pair(deadline, 1)
wrong, i = 0, 0

def move(sizes):  # these messages in flight at once, then every one checked
    global wrong, i
    sb = [ctypes.create_string_buffer(bytes((i + j + b) % 251 for b in range(n)), max(n, 1))
          for j, n in enumerate(sizes)]
    rb = [ctypes.create_string_buffer(max(n, 1)) for n in sizes]
    rq = [net.irecv(r, rb[j], n, deadline) for j, n in enumerate(sizes)]
    sq = [net.isend(s, sb[j], n, deadline) for j, n in enumerate(sizes)]
    for q in sq:
        net.wait(q, deadline, 0)
    wrong += sum(net.wait(q, deadline, 0) != n or rb[j].raw[:n] != sb[j].raw[:n]
                 for j, (q, n) in enumerate(zip(rq, sizes)))
    i += len(sizes)

# one lane: record numbers count records. Up to record 65536 - before, one-record messages 32 at a time
before = int(sys.argv[2])
for _ in range((65536 - before) // 32):
    move([24] * 32)
move([24] * ((65536 - before) % 32))
# then one at a time (each alone on the lane): before = 1 puts a small message at record 65536, the first
# under the new record key; before = 2 a 1 MiB message (4 records) across the change, small ones after it
for n in [8] * (before == 1) + [8, (1 << 20) + 5, 8, 4096 + 3, 0, 8]:
    move([n])
move([8, (1 << 20) + 5, 8] * 4)  # and in flight, each message behind another
net.t.closeSend(s), net.t.closeRecv(r), net.t.closeListen(lcomm)
net.t.finalize(net.ctx)
print("wrong", wrong)
"""


@pytest.mark.parametrize("before", [1, 2], ids=["small_at_the_change", "bulk_across_the_change"])
@pytest.mark.parametrize("mode", ["2", "t2", "t3"])
def test_a_lone_small_message_at_the_record_key_change(before, mode):
    # the fast path's record under the lane's next record key: the thread that keeps the turn keys its own
    # context for the new epoch (the first record under it a lone small one, or small ones right after a
    # bulk message crossed the change on the turns path)
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _EPOCH_FAST_SCRIPT, str(pluginenv.library()), str(before)],
                       capture_output=True, text=True, timeout=300, env=_mode_env(mode))
    assert p.returncode == 0 and p.stdout.split()[-2:] == ["wrong", "0"], p.stdout + p.stderr


_LONE = [7, 4096 + 3, 1, 4096 + 3, 8, RECORD_MIN]  # one record each; the fault is at message 3


def _lone(fault, recorded=None):
    """A RoguePeer script: _LONE one message at a time, 20 ms apart (each receive posted before its record
    arrives, nothing of the next one read with it: the fast path), message 3 with `fault`."""
    def script(p):
        wires = []
        for i, n in enumerate(_LONE):
            time.sleep(0.02)
            data = payload(i, n)
            if i != 3 or fault is None:
                wires.append(p.record(0, i, n, 0, data))
            elif fault == "bad_tag":
                p.record(0, i, n, 0, data, bad_tag=True)
            elif fault == "flip":  # a ciphertext bit
                w = bytearray(_sealed(p, i, n, data))
                w[HEADER + 100] ^= 0x10
                p.socks[0].sendall(bytes(w))
            elif fault == "truncate":  # half the record, then the socket's end
                p.record(0, i, n, 0, data, cut=HEADER + n // 2)
                time.sleep(0.1)
                p.socks[0].close()
                return
            elif fault == "drop":  # record 3 never sent: record 4 comes where 3 was due
                p.seq[0] += 1
            elif fault == "replay":  # record 2 again where 3 is due
                p.socks[0].sendall(wires[2])
            elif fault == "reorder":  # records 4 and 3 swapped
                p.seq[0] += 1
                p.record(0, 4, _LONE[4], 0, payload(4, _LONE[4]))
                p.seq[0] -= 2
                p.record(0, 3, n, 0, data)
                return
            elif fault == "replay_session":  # record 3 of an earlier connection, its header exactly as due
                p.socks[0].sendall(recorded[3])
                p.seq[0] += 1
        if recorded is not None and fault is None:
            recorded.extend(wires)
    return script


def _sealed(p, i, n, data):
    """Record i's wire as p would send it next, without sending it."""
    sent = []
    sock, p.socks[0] = p.socks[0], types.SimpleNamespace(sendall=sent.append)
    try:
        p.record(0, i, n, 0, data)
    finally:
        p.socks[0] = sock
    return sent[0]


@pytest.mark.parametrize("fault,why", [("bad_tag", "failed authentication"), ("flip", "failed authentication"),
                                       ("truncate", "mid-record"), ("drop", "replayed, reordered or dropped"),
                                       ("replay", "replayed, reordered or dropped"),
                                       ("reorder", "replayed, reordered or dropped"),
                                       ("replay_session", "failed authentication")])
@pytest.mark.parametrize("mode", ["2", "t2", "t3"])
def test_a_lone_small_record_is_checked_on_the_fast_path(fault, why, mode, monkeypatch):
    # each small record alone on its lane, its receive posted: read and opened by the thread that took it.
    # A tampered, truncated, dropped, reordered or replayed record (within the connection, or from an
    # earlier one) fails the connection there: the messages before it stand, it and the later ones never
    # complete
    set_stages(monkeypatch, mode)
    recorded = []
    if fault == "replay_session":
        got = run_rogue(_LONE, _lone(None, recorded))
        assert got["error"] is None and len(got["completed"]) == len(_LONE) and len(recorded) == len(_LONE), got
    got = run_rogue(_LONE, _lone(fault, recorded))
    assert got["error"] is not None and got["completed"] == [(i, _LONE[i], True) for i in range(3)], got
    assert any(why in m for m in got["logs"]), got["logs"]


@pytest.mark.parametrize("mode", ["t2", "t3"])
def test_a_killed_receiver_fails_a_sender_of_small_messages(mode, monkeypatch):
    # the sending lane's thread keeps the turn for message after message (each one record, one at a time):
    # once the receiving rank dies its writes fail, and so do the sender's requests, well inside the deadline
    set_stages(monkeypatch, mode)
    got, sent = run_pair([4096 + 3] * 20000, die_after=2)
    assert got["error"] is None and len(got["completed"]) >= 2, got
    assert sent["error"] is not None and sent["where"] != "timeout", sent
    assert sent["elapsed"] < DEADLINE / 2, sent


# ---- the plugin's threads under ThreadSanitizer ----

_RACE_SCRIPT = r'''
import ctypes, os, sys, time
from ccbridge.secure import netplugin

net = netplugin.Net(sys.argv[1])
assert net.rc == 0, net.logs
sizes = [0, 1, 4099, (1 << 20) + 5, 300001, 1 << 20]
for lanes in (1, 2, 8):
    for how in ("clean", "abort_recv", "abort_send"):
        for _ in range(8):
            lcomm, s, r = net.pair(time.monotonic() + 60, lanes)
            sb = [ctypes.create_string_buffer(b"x" * n, max(n, 1)) for n in sizes]
            rb = [ctypes.create_string_buffer(max(n, 1)) for n in sizes]
            deadline = time.monotonic() + 60
            rq = [net.irecv(r, rb[i], n, deadline) for i, n in enumerate(sizes)]
            sq = [net.isend(s, sb[i], n, deadline) for i, n in enumerate(sizes)]
            if how == "clean":  # every message in; the FINs reach lanes while closeRecv runs
                for q in sq + rq:
                    net.wait(q, deadline, 0)
                assert all(rb[i].raw[:n] == b"x" * n for i, n in enumerate(sizes))
                net.t.closeSend(s), net.t.closeRecv(r)
            else:  # closed with records in flight: lanes fail while the close runs
                time.sleep(0.002)
                first, second = (r, s) if how == "abort_recv" else (s, r)
                (net.t.closeRecv if first is r else net.t.closeSend)(first)
                (net.t.closeSend if second is s else net.t.closeRecv)(second)
            net.t.closeListen(lcomm)
for lanes in (1, 2):  # one message at a time: lone small ones on the lanes' fast path, bulk ones between them
    lcomm, s, r = net.pair(time.monotonic() + 60, lanes)
    deadline = time.monotonic() + 60
    for n in [8, 4099, 0, 1 << 20, 8, 1, 300001, 8] * 8:
        sb, rb = ctypes.create_string_buffer(b"y" * n, max(n, 1)), ctypes.create_string_buffer(max(n, 1))
        rq, sq = net.irecv(r, rb, n, deadline), net.isend(s, sb, n, deadline)
        net.wait(sq, deadline, 0), net.wait(rq, deadline, 0)
        assert rb.raw[:n] == b"y" * n
    net.t.closeSend(s), net.t.closeRecv(r), net.t.closeListen(lcomm)
net.t.finalize(net.ctx)
print("ok")
'''


@pytest.mark.parametrize("mode", ["2", "default", "t3"], ids=["pipeline", "turns2_default", "turns3"])
def test_lanes_and_close_are_race_free_under_thread_sanitizer(mode, tmp_path):
    # both ends of connections in one process (as NCCL holds many), messages on and off the record
    # grid, then closes that race the lanes: a clean close while the peer's FINs arrive, aborts with
    # records in flight on either side; then one message at a time (a lone small one kept by the thread
    # that took it, bulk ones passed between a lane's threads). comm_close destroyed lane i's condition
    # variable and closed its socket (the fd number free for reuse) while lane i+1 could still fail() the
    # connection, which broadcasts every lane's cv and shuts every lane's fd
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    gcc = shutil.which("gcc")
    tsan = subprocess.run([gcc, "-print-file-name=libtsan.so"], capture_output=True, text=True).stdout.strip() if gcc else ""
    if not tsan or not os.path.isabs(tsan):
        pytest.skip("gcc with ThreadSanitizer (libtsan) is not here")
    src = Path(__file__).resolve().parent.parent / "src" / "ccbridge" / "native"
    lib = tmp_path / "libnccl-net-ccbridge-tsan.so"
    subprocess.run([gcc, "-fsanitize=thread", "-g", "-O1", "-std=gnu11", "-fvisibility=hidden", "-shared", "-fPIC",
                    "-o", str(lib), *sorted(str(p) for p in (src / "ncclnet").glob("*.c")), str(src / "common" / "ossl.c"),
                    "-ldl", "-lpthread"], check=True)
    log = tmp_path / "tsan"
    env = _mode_env(mode, LD_PRELOAD=tsan,
                    TSAN_OPTIONS=f"halt_on_error=0 exitcode=0 history_size=4 log_path={log}")
    p = subprocess.run([sys.executable, "-c", _RACE_SCRIPT, str(lib)], capture_output=True, text=True, timeout=600,
                       env=env)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr
    # the plugin's reports only (the interpreter is not instrumented)
    reports = [r for f in tmp_path.glob("tsan.*") for r in f.read_text().split("==================") if "ncclnet/" in r]
    assert not reports, "\n".join(reports)


_INIT_LINE_SCRIPT = r'''
import sys
from ccbridge.secure import netplugin

net = netplugin.Net(sys.argv[1])
assert net.rc == 0, net.logs
print(*[m for lvl, m in net.logs if "records over TCP" in m], sep="\n")
net.t.finalize(net.ctx)
'''


@pytest.mark.parametrize("env,said", [
    ({}, "lanes 8, turns 2, spin {default} us"),
    ({"CCBRIDGE_NET_LANES": "", "CCBRIDGE_NET_TURNS": "", "CCBRIDGE_NET_SPIN_US": ""},
     "lanes 8, turns 2, spin {default} us"),
    ({"CCBRIDGE_NET_LANES": "99", "CCBRIDGE_NET_TURNS": "abc", "CCBRIDGE_NET_SPIN_US": "-1"},
     "lanes 16, pipeline 2, spin 0 us"),
    ({"CCBRIDGE_NET_LANES": "abc", "CCBRIDGE_NET_TURNS": "99", "CCBRIDGE_NET_SPIN_US": "abc"},
     "lanes 8, turns 8, spin 0 us"),
    ({"CCBRIDGE_NET_LANES": "-1", "CCBRIDGE_NET_TURNS": "0", "CCBRIDGE_NET_PIPELINE": "0",
      "CCBRIDGE_NET_SPIN_US": "9999999999"}, "lanes 8, pipeline 0, spin 100000 us"),
    ({"CCBRIDGE_NET_LANES": " 3x", "CCBRIDGE_NET_TURNS": "1", "CCBRIDGE_NET_PIPELINE": "99",
      "CCBRIDGE_NET_SPIN_US": "20"}, "lanes 3, pipeline 8, spin 20 us"),
], ids=["unset", "empty", "lanes99_turns_abc_spin_negative", "lanes_abc_turns99_spin_abc", "pipeline0_spin_huge",
        "lanes_3x_pipeline99"])
def test_the_plugins_init_line_names_the_lanes_mode_and_spin_it_runs_with(env, said):
    # a value out of range or not a number falls back (held to a bound, the default, or off) without an error:
    # NCCL's log (NCCL_DEBUG=INFO) is where every rank says what it took, in the words of `ccbridge env` and
    # `bench net`'s header (pluginenv.settings of pluginenv.status, which reads the environment as the plugin does)
    import subprocess
    import sys

    full = {k: v for k, v in os.environ.items() if not k.startswith("CCBRIDGE_NET_")}
    full.update(CCBRIDGE_KEY=KEY, NCCL_SOCKET_IFNAME="lo", **env)
    default = pluginenv.DEFAULT_SPIN_US if (os.sysconf("SC_NPROCESSORS_ONLN") or 1) >= 8 else 0
    said = said.format(default=default)
    assert pluginenv.settings(pluginenv.status(full)) == said
    p = subprocess.run([sys.executable, "-c", _INIT_LINE_SCRIPT, str(pluginenv.library())], capture_output=True,
                       text=True, timeout=60, env=full)
    assert p.returncode == 0 and p.stdout.strip() == f"NET/ccbridge: AES-256-GCM records over TCP on lo; {said}", \
        p.stdout + p.stderr


@pytest.mark.parametrize("how", ["short", "weak", "file_644", "file_missing"])
def test_bench_net_refuses_a_key_the_plugin_would_refuse_before_it_measures(how, tmp_path):
    # one line of the key's own words and exit 2, before the header and the AES-GCM rates (the ranks' init
    # failed after them, its reason behind "net bench rank 1 of 2 failed: NetError: init returned NCCL error 5")
    import subprocess
    import sys

    f = tmp_path / "key"
    f.write_text(KEY + "\n")
    f.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if k not in ("CCBRIDGE_KEY", "CCBRIDGE_KEY_FILE")}
    env.update({"short": {"CCBRIDGE_KEY": "abc"}, "weak": {"CCBRIDGE_KEY": "00" * 32},
                "file_644": {"CCBRIDGE_KEY_FILE": str(f)}, "file_missing": {"CCBRIDGE_KEY_FILE": str(tmp_path / "no")}
                }[how])
    p = subprocess.run([sys.executable, "-m", "ccbridge", "bench", "net", "--lanes", "1", "--total", "1M", "-b", "64K",
                        "-e", "64K", "--iters", "1"], capture_output=True, text=True, timeout=300, env=env)
    said = {"short": "$CCBRIDGE_KEY: expected 64 hex digits (32 bytes), got 3 characters",
            "weak": "$CCBRIDGE_KEY: refused, every byte is the same; use 32 random bytes, e.g. `openssl rand -hex 32`",
            "file_644": f"key file {f} is readable by group or others (mode 644); chmod 600 it",
            "file_missing": f"key file {tmp_path / 'no'}: No such file or directory"}[how]
    assert (p.returncode, p.stdout, p.stderr) == (2, "", f"ccbridge bench net: {said}\n")


def test_bench_net_takes_an_empty_key_variable_as_unset_as_the_plugin_does():
    # neither key set (an empty variable counts as unset, as the plugin reads it): the bench draws its own key
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("CCBRIDGE_KEY", "CCBRIDGE_KEY_FILE")}
    p = subprocess.run([sys.executable, "-m", "ccbridge", "bench", "net", "--lanes", "1", "--total", "1M", "-b", "64K",
                        "-e", "64K", "--iters", "1"], capture_output=True, text=True, timeout=300,
                       env={**env, "CCBRIDGE_KEY": "", "CCBRIDGE_KEY_FILE": ""})
    assert p.returncode == 0 and "GB/s" in p.stdout, p.stderr


_REFUSED_SCRIPT = """
import os, sys
from ccbridge.secure import netbench
before = dict(os.environ)
try:
    netbench.loopback([1 << 16], [1], total=1 << 20, repeat=1, progress=lambda line: print("measured:", line))
except netbench.netplugin.NetError as e:
    print("refused:", e)
print("environment kept" if dict(os.environ) == before else "environment changed")
"""


@pytest.mark.parametrize("ifname", ["nope", "=l"])  # a prefix of none, an exact name of none
def test_bench_net_finds_a_failing_plugin_init_before_it_measures(ifname):
    # in a fresh process: an interface the plugin found stays found for its process. The ranks' init failed after
    # the header and the AES-GCM rates ("net bench rank 1 of 2: init: no usable interface ..."): now the plugin's
    # own init, here, in the ranks' environment, says it before a measurement, and puts this environment back
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("CCBRIDGE_KEY", "CCBRIDGE_KEY_FILE")}
    p = subprocess.run([sys.executable, "-c", _REFUSED_SCRIPT], capture_output=True, text=True, timeout=120,
                       env={**env, "NCCL_SOCKET_IFNAME": ifname})
    assert p.returncode == 0 and p.stdout.splitlines() == [
        f"refused: the net plugin's init: no usable interface (NCCL_SOCKET_IFNAME={ifname})", "environment kept"], \
        p.stdout + p.stderr


_LOGGER_SCRIPT = r'''
import ctypes, gc, sys
from ccbridge.bindings import ncclnet
from ccbridge.secure import netplugin
a = netplugin.Net(sys.argv[1])
assert a.rc == 0, a.logs
b = netplugin.Net(sys.argv[1])  # as bench net's up-front check makes one and drops it
del b
gc.collect()
others = [ncclnet.LOGGER(lambda *x: print("ANOTHER CALLBACK RAN")) for _ in range(50)]  # the freed one's place taken
handle = ctypes.create_string_buffer(b"\xff" * ncclnet.HANDLE_BYTES, ncclnet.HANDLE_BYTES)
out = ctypes.c_void_p()
print("rc", a.t.connect(a.ctx, 0, handle, ctypes.byref(out), None), "logged", repr(a.why()))
'''


def test_a_net_dropped_in_a_process_leaves_the_plugin_logging_to_the_nets_alive():
    """The plugin keeps the last logger it was given for good: each Net's own ctypes callback, freed with the Net
    (bench net's up-front plugin check drops one), was called afterwards for another Net's messages: freed memory
    (helper-69 saw another callback run, and the live Net's warning lost)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _LOGGER_SCRIPT, str(pluginenv.library())], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "CCBRIDGE_KEY": os.urandom(32).hex()})
    assert p.returncode == 0 and "ANOTHER CALLBACK RAN" not in p.stdout, (p.returncode, p.stdout, p.stderr)
    assert "logged 'NET/ccbridge: connect: not a ccbridge handle" in p.stdout, p.stdout
