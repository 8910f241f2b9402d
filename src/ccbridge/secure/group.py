"""Encrypted collectives on torch.distributed.

SecureGroup wraps a process group (NCCL within a node; NCCL or Gloo across
nodes) and runs ring algorithms whose every message is the chunked
AES-256-GCM wire format: only ciphertext and tags reach the transport.

all_reduce is a ring reduce-scatter then all-gather. Each reduce-scatter hop
is one fused pass (verify+decrypt what arrived, add the local segment,
encrypt the sum for the next rank); the owner of a fully reduced segment
encrypts it once and the all-gather forwards that ciphertext unchanged (all
ranks share the group key), each rank only verifying+decrypting its copy.

Sessions: the group's constructor runs an authenticated handshake
(handshake.py) to which every rank contributes fresh randomness; every key
derives from its transcript, and a rank refuses (HandshakeError) a transcript
it did not take part in, before any data is sent.

Integrity: a chunk that fails verification is zeroed and counted on the
device, and what it would have fed is sent on with a poisoned tag. At the end
of each collective every rank sends an authenticated status (its failure
count, bound to the collective's sequence number) to all others; so a
tampered, replayed, reordered or truncated message, or a wrong key anywhere,
makes wait() raise IntegrityError on every rank, with no host sync before
wait().

Deadlines: every wait on the transport is bounded by the group's timeout. A
dead peer or a dropped message raises PeerError within it (also on ranks that
only wait for a rank that waits), and the group refuses further use.
"""

from __future__ import annotations

import collections
import re
import time
from contextlib import contextmanager
from datetime import timedelta
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from ccbridge import marks
from ccbridge.errors import CCBridgeError, IntegrityError, PeerError
from ccbridge.secure import gcm, handshake, tensorops
from ccbridge.secure import keys as keymod
from ccbridge.secure.gcm import Ident
from ccbridge.secure.work import SecureWork

OPS = {"all_reduce": 1, "all_gather": 2, "reduce_scatter": 3, "broadcast": 4, "p2p": 5}
STATUS_STEP = keymod.MAX_STEPS - 1
STATUS_MAGIC = b"ccbS"
# Each ring segment moves in up to MAX_SLICES slices of at least SLICE_BYTES,
# so the cipher works on one slice while the next is on the wire. A slice is
# its own message: step ids are hop * MAX_SLICES + slice.
MAX_SLICES, SLICE_BYTES = 8, 2 << 20
# NCCL works the host may run ahead of the GPU by. Without a bound, a stalled peer
# (dropped or reordered messages, a dead rank) leaves NCCL kernels that never finish,
# the launch queue behind them fills, and the next kernel launch blocks the host for
# good; bounded, the host waits on the oldest work under the group's deadline instead.
MAX_INFLIGHT = 16


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _dtype_code(t: torch.Tensor) -> int:
    return gcm.DTYPES.get(_dtype_name(t), 255)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError("encrypted collectives need contiguous tensors")
    return t.reshape(-1).view(torch.uint8)


def _wire(n: int, device) -> torch.Tensor:
    return torch.empty(gcm.wire_len(n), dtype=torch.uint8, device=device)


class SecureGroup:
    """Encrypted collectives over a torch.distributed process group.

    keys: a KeyProvider (default: $CCBRIDGE_KEY or $CCBRIDGE_KEY_FILE); device: where the ciphertext lives (default
    this rank's current GPU, else the CPU). The group must be formed on every rank in the same order, like the
    process group itself; collectives must be issued in the same order on every rank. Raises KeyMaterialError (bad
    key material), HandshakeError (a peer with another key or session), IntegrityError (tampered or replayed
    ciphertext) and PeerError (a peer that stopped answering; the group is then unusable): all SecureErrors.
    """

    def __init__(self, group=None, *, keys: keymod.KeyProvider | None = None, device=None, name: str = "",
                 timeout: float = 600.0):
        """name: the job's or group's name, bound into the session (groups of
        different names never accept each other's handshake). timeout: seconds
        any wait on the transport may take before PeerError (default 600,
        NCCL's own default)."""
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call init_process_group first")
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.timeout, self._broken = float(timeout), None
        self.pg = group or dist.group.WORLD
        self.rank, self.n = dist.get_rank(self.pg), dist.get_world_size(self.pg)
        if self.n * MAX_SLICES >= STATUS_STEP:  # step ids must stay below the status step
            raise ValueError(f"at most {STATUS_STEP // MAX_SLICES} ranks")
        self.backend = dist.get_backend(self.pg)
        self.provider = keys or keymod.default_provider()
        self.provider.secret()  # fail early on bad key material
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self.device = torch.device(device)
        self.session = self._handshake(name)
        self.epoch, self.seq, self.used = 0, 0, 0
        self._ciphers: dict = {}
        self._p2p: dict = {}  # (src, dst) -> [epoch, counter, bytes]
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._completer = None
        self._inflight: collections.deque = collections.deque()  # NCCL works not yet seen complete
        # made here, on the caller's stream: inside a collective, a host-to-device copy would hold
        # the thread until the group's stream got there, which a dead peer stalls for good
        status = torch.zeros(16, dtype=torch.uint8)
        status[:4] = torch.frombuffer(bytearray(STATUS_MAGIC), dtype=torch.uint8)
        self._status = status.to(self.device)
        if self.device.type == "cuda":
            self._warm()

    def _warm(self) -> None:
        """One small encrypted op of every kind and dtype, now. CUDA loads a kernel at its first
        launch (lazy loading), NCCL connects a pair of ranks at their first point-to-point
        message, and both wait for the device: behind a collective that a dead or cheating peer
        stalled, a first launch would hold the host for good, past every deadline (found on
        2x H200: the drop, reorder and dead-rank attacks on a group's first all_reduce). Costs a
        few milliseconds per group, on every rank alike (collectives in the same order)."""
        for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
                   torch.uint8, torch.int8):
            for per in (8, 11):  # a whole number of 16-byte blocks, and a tail
                x = torch.zeros(self.n * per, dtype=dt, device=self.device)
                self.all_reduce(x)
                self.reduce_scatter_tensor(torch.empty(per, dtype=dt, device=self.device), x)
                self.all_gather_into_tensor(x, x[:per].clone())
                self.broadcast(x, 0)
        torch.cuda.synchronize(self.device)

    def _handshake(self, name: str) -> bytes:
        """Agree on a fresh, authenticated session with every rank (handshake.py)."""
        mine = handshake.fresh()
        got = self._gather_host(mine, "session handshake")
        got[self.rank] = mine  # this rank's own contribution, from memory: only the others' cross the wire
        ident = handshake.identity([self._global(r) for r in range(self.n)], name)
        session = handshake.transcript(ident, got)
        secret = self.provider.secret()
        expected = [handshake.confirmation(secret, session, r) for r in range(self.n)]
        del secret  # out of the frames a handshake failure's traceback holds
        confirms = self._gather_host(expected[self.rank], "session handshake")
        handshake.verify(expected, confirms, self.rank)
        return session

    # ---- plumbing ----
    def poll(self, done, what: str, timeout=None) -> None:
        """Wait until done() is true, at most timeout (default the group's)
        seconds; then PeerError, and the group is broken for good."""
        if done():
            return
        limit = self.timeout if timeout is None else timeout
        began = time.monotonic_ns()
        end, delay = began / 1e9 + limit, 10e-6
        while not done():
            if time.monotonic() > end:
                self._break(f"rank {self.rank}: {what} did not complete within {limit:g} s: a peer is dead or "
                            "messages were dropped")
            time.sleep(delay)
            delay = min(2 * delay, 1e-3)
        marks.waited("secure.poll", began)  # a wait for the GPU or the peers: a call in the trace, not host work

    def _await(self, works, what: str) -> None:
        """Wait for transport works within the group's deadline; their errors become PeerError."""
        end = time.monotonic() + self.timeout
        for w in works:
            with self._transport(what, end):
                if self.backend == "nccl":
                    self.poll(w.is_completed, what, max(end - time.monotonic(), 0.0))
                    w.wait()
                else:  # Gloo's point-to-point works complete only inside wait(), which takes the deadline
                    w.wait(timeout=timedelta(seconds=max(end - time.monotonic(), 1e-3)))

    @contextmanager
    def _transport(self, what: str, end: float | None = None):
        """Around every torch.distributed call: its failure (a closed
        connection, a timeout) becomes PeerError and breaks the group."""
        try:
            yield
        except CCBridgeError:
            raise
        except Exception as e:  # noqa: BLE001 - the transport's own error, one line of it
            first = re.sub(r"^\[[^]]*\]\s*", "", (str(e).strip().splitlines() or [type(e).__name__])[0])
            if end is not None and time.monotonic() >= end:
                self._break(f"rank {self.rank}: {what} did not complete within {self.timeout:g} s: a peer is "
                            f"dead or messages were dropped ({first})")
            self._break(f"rank {self.rank}: {what}: the transport failed ({first})")

    def fail_integrity(self, why: str):
        """An authentication failure is fail-stop: an attacker can show it to
        some ranks only (the last message of any round can be altered on one
        link), so a group that went on could leave ranks out of step; the
        others fail at their next call (PeerError, within the deadline)."""
        self._broken = f"an earlier collective failed authentication ({why})"
        raise IntegrityError(f"{why}; this SecureGroup cannot be used again (destroy the process group)")

    def _break(self, why: str):
        self._broken = why
        raise PeerError(f"{why}; this SecureGroup cannot be used again (destroy the process group)")

    def check_usable(self) -> None:
        """PeerError where the group failed earlier (a broken group is never used again)."""
        if self._broken:
            raise PeerError(f"rank {self.rank}: this SecureGroup failed earlier and cannot be used again: {self._broken}")

    def _gather_host(self, data: bytes, what: str) -> list[bytes]:
        """All-gather a few bytes from every rank to this host, within the deadline."""
        inp = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self._comm_device())
        if self.backend == "nccl":
            out = torch.empty(len(data) * self.n, dtype=torch.uint8, device=inp.device)
            with self._transport(what):
                work = tensorops.all_gather(out, inp, group=self.pg, async_op=True)
            self._await([work], what)
            parts = list(out.cpu().split(len(data)))
        else:
            parts = [torch.empty_like(inp) for _ in range(self.n)]
            with self._transport(what):
                work = dist.all_gather(parts, inp, group=self.pg, async_op=True)
            self._await([work], what)
        return [bytes(p.cpu().numpy()) for p in parts]

    def _comm_device(self):
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def _global(self, r: int) -> int:
        return dist.get_global_rank(self.pg, r) if self.pg is not dist.group.WORLD else r

    def _cipher(self, kind, epoch, key_fn):
        k = (kind, epoch)
        if k not in self._ciphers:
            key = key_fn()
            self._ciphers = {kk: v for kk, v in self._ciphers.items() if kk[0] != kind or kk[1] >= epoch - 1}
            self._ciphers[k] = gcm.GpuCipher(key, self.device) if self.device.type == "cuda" else gcm.CpuCipher(key)
        return self._ciphers[k]

    def _begin(self, nbytes: int):
        """Next sequence number; rotate the group key first if its budget would run out."""
        cost = 2 * self.n * max(nbytes, 1)
        if cost > keymod.BYTES_PER_KEY:
            raise ValueError(f"one collective of {nbytes} bytes on {self.n} ranks would encrypt more than one key "
                             f"may ({keymod.BYTES_PER_KEY} bytes): split the tensor")
        if self.seq >= keymod.MAX_SEQ - 1 or self.used + cost > keymod.BYTES_PER_KEY:
            self.epoch, self.seq, self.used = self.epoch + 1, 0, 0
        seq = self.seq
        self.seq += 1
        self.used += cost
        return seq, self._cipher("group", self.epoch, lambda e=self.epoch: self.provider.group_key(self.session, e))

    def _ident(self, op: str, dtype: int, origin: int, step: int, seq: int, epoch=None) -> Ident:
        epoch = self.epoch if epoch is None else epoch
        return Ident(keymod.prefix(origin, seq, step), keymod.message_id(self.session, OPS[op], dtype, origin, step, seq, epoch))

    def _post(self, send: torch.Tensor | None, dst: int, recv: torch.Tensor | None, src: int):
        """Start sending one wire buffer and receiving another (only ciphertext
        ever passes here); returns wait(), after which recv holds the data
        (for the caller's stream)."""
        cpu_transport = self.backend != "nccl" and self.device.type == "cuda"
        ops, staged = [], recv
        if send is not None:
            ops.append(dist.P2POp(dist.isend, send.cpu() if cpu_transport else send, self._global(dst), self.pg))
        if recv is not None:
            staged = torch.empty(recv.shape, dtype=recv.dtype) if cpu_transport else recv
            ops.append(dist.P2POp(dist.irecv, staged, self._global(src), self.pg))
        if self.backend == "nccl":
            self._bound_inflight("a ring step")
        with self._transport("a ring step"):
            works = dist.batch_isend_irecv(ops) if ops else []
        if self.backend == "nccl":
            self._inflight.extend(works)

        def wait():
            if self.backend == "nccl":  # stream-ordered: the deadline is SecureWork.wait's
                for w in works:
                    w.wait()
            else:
                self._await(works, "a ring step")
            if staged is not recv:
                recv.copy_(staged)
        return wait

    def _exchange(self, send: torch.Tensor | None, dst: int, recv: torch.Tensor | None, src: int) -> None:
        self._post(send, dst, recv, src)()

    def _bound_inflight(self, what: str) -> None:
        """Keep at most MAX_INFLIGHT NCCL works ahead of the GPU (see MAX_INFLIGHT)."""
        while self._inflight and self._inflight[0].is_completed():
            self._inflight.popleft()
        while len(self._inflight) >= MAX_INFLIGHT:
            w = self._inflight.popleft()
            with self._transport(what):
                self.poll(w.is_completed, what)

    def _all_gather_bytes(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        if self.backend == "nccl":
            self._bound_inflight("the status round")
            with self._transport("the status round"):
                work = tensorops.all_gather(out, inp, group=self.pg, async_op=True)
            self._inflight.append(work)
            work.wait()  # stream-ordered: the host does not wait here
        else:
            parts = [torch.empty_like(inp, device="cpu") for _ in range(self.n)]
            with self._transport("the status round"):
                work = dist.all_gather(parts, inp.cpu(), group=self.pg, async_op=True)
            self._await([work], "the status round")
            out.copy_(torch.cat(parts))

    def _finish(self, what: str, op: str, seq: int, cipher, fail: torch.Tensor, result=None) -> SecureWork:
        """The authenticated status round: everyone learns if anyone failed."""
        status = self._status.clone()  # magic | failures | zeros: the sequence number is bound by the nonce and AAD
        status[4:8] = fail.view(torch.uint8)
        wl = gcm.wire_len(16)
        mine = torch.empty(wl, dtype=torch.uint8, device=self.device)
        cipher.encrypt(self._ident(op, 0, self.rank, STATUS_STEP, seq), status, mine)
        allw = torch.empty(wl * self.n, dtype=torch.uint8, device=self.device)
        self._all_gather_bytes(allw, mine)
        got = torch.empty(16 * self.n, dtype=torch.uint8, device=self.device)
        for r in range(self.n):
            cipher.decrypt(self._ident(op, 0, r, STATUS_STEP, seq), allw[r * wl:(r + 1) * wl], got[16 * r:16 * (r + 1)], fail)
        fails = got.view(self.n, 16)[:, 4:8].contiguous().view(torch.int32).sum()
        total = (fail + fails).to(torch.int32)
        return SecureWork(self, what, total, result)

    def _run(self, fn, *args, async_op: bool):
        """Run a collective on the group's side stream, so it overlaps the
        caller's compute; wait() synchronizes the host with it, so whatever the
        caller launches after wait() sees the result."""
        self.check_usable()
        if self._stream is None:
            work = fn(*args)
        else:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                for a in args:
                    if isinstance(a, torch.Tensor):
                        a.record_stream(self._stream)
                work = fn(*args)
        if not async_op:
            work.wait()
        return work

    # ---- ring pieces ----
    def _segments(self, nelem: int, itemsize: int):
        """n segment bounds in bytes, each a multiple of 16 bytes except the last nonempty one."""
        per = max(1, 16 // itemsize)
        base = -(-nelem // self.n)
        base = -(-base // per) * per
        return [(min(k * base, nelem) * itemsize, min((k + 1) * base, nelem) * itemsize) for k in range(self.n)]

    @staticmethod
    def _slices(lo: int, hi: int) -> list[tuple[int, int]]:
        """A segment's byte range cut into pipeline slices (16-byte aligned;
        a function of the range only, so sender and receiver agree)."""
        nb = hi - lo
        p = max(1, min(MAX_SLICES, nb // SLICE_BYTES))
        if not nb:
            return [(lo, hi)]
        size = (-(-nb // p) + 15) // 16 * 16
        return [(x, min(hi, x + size)) for x in range(lo, hi, size)]

    def _pipeline(self, sends: list, recvs: list, nxt: int, prv: int):
        """Post one send/receive pair per slice; returns the waiters, in slice
        order, so the cipher works on slice p while p+1 is still in flight."""
        return [self._post(sends[p] if p < len(sends) else None, nxt, recvs[p] if p < len(recvs) else None, prv)
                for p in range(max(len(sends), len(recvs)))]

    def _encrypt_slices(self, cipher, op: str, code: int, seq: int, src: torch.Tensor, lo: int, hi: int) -> list:
        """This rank's first message of a ring: bytes lo..hi of src, one wire per slice (slice p is step p)."""
        wires = []
        for p, (a, b) in enumerate(self._slices(lo, hi)):
            wires.append(_wire(b - a, self.device))
            cipher.encrypt(self._ident(op, code, self.rank, p, seq), src[a:b], wires[-1])
        return wires

    def _ring_reduce_scatter(self, cipher, seq, op, dtype, src: torch.Tensor, seg, shift: int, dst_final):
        """Ring reduce-scatter over byte segments seg of src; rank r ends owning
        segment (r + 1 + shift) % n, written to dst_final (a tensor of its
        size), and returns its encryption (origin r, last step) for an all-gather."""
        n, r = self.n, self.rank
        prv, nxt = (r - 1) % n, (r + 1) % n
        fail = torch.zeros(1, dtype=torch.int32, device=self.device)
        code = gcm.DTYPES.get(dtype, 255)
        sends = self._encrypt_slices(cipher, op, code, seq, src, *seg[(r + shift) % n])
        for s in range(n - 1):
            kr = (r - s - 1 + shift) % n
            sl = self._slices(*seg[kr])
            recvs = [_wire(hi - lo, self.device) for lo, hi in sl]
            waits = self._pipeline(sends, recvs, nxt, prv)
            last = s == n - 2
            outs = []
            for p, (lo, hi) in enumerate(sl):
                waits[p]()
                out = _wire(hi - lo, self.device)
                base = seg[kr][0]
                cipher.reduce(dtype, self._ident(op, code, prv, s * MAX_SLICES + p, seq), recvs[p], src[lo:hi], fail,
                              plain=dst_final[lo - base:hi - base] if last else None,
                              ident_out=self._ident(op, code, r, (s + 1) * MAX_SLICES + p, seq), wire_out=out)
                outs.append(out)
            for w in waits[len(sl):]:
                w()
            sends = outs
        return sends, fail

    def _ring_all_gather(self, cipher, seq, op, code, dst: torch.Tensor, seg, mine: list, owner_of, fail, step: int):
        """Ring all-gather: segment k of dst arrives encrypted by rank owner_of(k)
        (slice p as step `step + p`); rank r starts with its own segment's
        wires `mine` and forwards what it gets unchanged."""
        n, r = self.n, self.rank
        prv, nxt = (r - 1) % n, (r + 1) % n
        sends = mine
        first = next(k for k in range(n) if owner_of(k) == r)
        for s in range(n - 1):
            kr = (first - s - 1) % n
            sl = self._slices(*seg[kr])
            recvs = [_wire(hi - lo, self.device) for lo, hi in sl]
            waits = self._pipeline(sends, recvs, nxt, prv)
            for p, (lo, hi) in enumerate(sl):
                waits[p]()
                cipher.decrypt(self._ident(op, code, owner_of(kr), step + p, seq), recvs[p], dst[lo:hi], fail)
            for w in waits[len(sl):]:
                w()
            sends = recvs

    # ---- collectives ----
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False) -> SecureWork:
        """In place, like dist.all_reduce; op "sum" or "avg" (floating types), or dist.ReduceOp.SUM / AVG."""
        op = tensorops.reduce_op(op, "all_reduce")
        if op == "avg" and not tensor.is_floating_point():
            raise ValueError("avg needs a floating-point tensor")
        self._check_device(tensor)
        return self._run(self._all_reduce, tensor, op, async_op=async_op)

    def _all_reduce(self, tensor, op):
        flat, name = _bytes(tensor), _dtype_name(tensor)
        seq, cipher = self._begin(flat.numel())
        if self.n == 1:
            fail = torch.zeros(1, dtype=torch.int32, device=self.device)
        else:
            seg = self._segments(tensor.numel(), tensor.element_size())
            r = self.rank
            own = (r + 1) % self.n
            lo, hi = seg[own]
            mine, fail = self._ring_reduce_scatter(cipher, seq, "all_reduce", name, flat, seg, 0, flat[lo:hi])
            self._ring_all_gather(cipher, seq, "all_reduce", _dtype_code(tensor), flat, seg, mine,
                                  lambda k: (k - 1) % self.n, fail, (self.n - 1) * MAX_SLICES)
        if op == "avg":
            tensor.div_(self.n)
        return self._finish("all_reduce", "all_reduce", seq, cipher, fail, tensor)

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> SecureWork:
        """output (n * input.numel() elements) gets every rank's input, in rank order."""
        if output.numel() != self.n * input.numel() or output.dtype != input.dtype:
            raise ValueError("output must hold n inputs of the same dtype")
        self._check_device(output, input)
        return self._run(self._all_gather, output, input, async_op=async_op)

    def _all_gather(self, output, input):
        src, dst = _bytes(input), _bytes(output)
        m = src.numel()
        seq, cipher = self._begin(m)
        seg = [(k * m, (k + 1) * m) for k in range(self.n)]
        fail = torch.zeros(1, dtype=torch.int32, device=self.device)
        dst[seg[self.rank][0]:seg[self.rank][1]].copy_(src)
        code = _dtype_code(input)
        mine = self._encrypt_slices(cipher, "all_gather", code, seq, src, 0, m)
        if self.n > 1:
            self._ring_all_gather(cipher, seq, "all_gather", code, dst, seg, mine, lambda k: k, fail, 0)
        return self._finish("all_gather", "all_gather", seq, cipher, fail, output)

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum",
                              async_op: bool = False) -> SecureWork:
        """output gets the sum (or average: op as all_reduce's) over ranks of input's segment `rank` (input has
        n * output.numel() elements)."""
        if input.numel() != self.n * output.numel() or output.dtype != input.dtype:
            raise ValueError("input must hold n outputs of the same dtype")
        op = tensorops.reduce_op(op, "reduce_scatter")
        self._check_device(output, input)
        return self._run(self._reduce_scatter, output, input, op, async_op=async_op)

    def _reduce_scatter(self, output, input, op):
        src, dst = _bytes(input), _bytes(output)
        m = dst.numel()
        seq, cipher = self._begin(src.numel())
        if self.n == 1:
            dst.copy_(src)
            fail = torch.zeros(1, dtype=torch.int32, device=self.device)
        else:
            seg = [(k * m, (k + 1) * m) for k in range(self.n)]
            _, fail = self._ring_reduce_scatter(cipher, seq, "reduce_scatter", _dtype_name(input), src, seg, -1, dst)
        if op == "avg":
            output.div_(self.n)
        return self._finish("reduce_scatter", "reduce_scatter", seq, cipher, fail, output)

    def broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> SecureWork:
        """tensor from rank src to all: encrypted once at src, forwarded along the ring as is."""
        if not 0 <= src < self.n:
            raise ValueError(f"src {src} is not a rank of this group of {self.n}")
        self._check_device(tensor)
        return self._run(self._broadcast, tensor, src, async_op=async_op)

    def _broadcast(self, tensor, src):
        flat = _bytes(tensor)
        seq, cipher = self._begin(flat.numel())
        fail = torch.zeros(1, dtype=torch.int32, device=self.device)
        ident = self._ident("broadcast", _dtype_code(tensor), src, 0, seq)
        n, r = self.n, self.rank
        pos = (r - src) % n  # place along the chain src -> src+1 -> ...
        w = _wire(flat.numel(), self.device)
        if pos == 0:
            cipher.encrypt(ident, flat, w)
        else:
            self._exchange(None, 0, w, (r - 1) % n)
            cipher.decrypt(ident, w, flat, fail)
        if pos < n - 1:
            self._exchange(w, (r + 1) % n, None, 0)
        return self._finish("broadcast", "broadcast", seq, cipher, fail, tensor)

    def _p2p_state(self, src: int, dst: int, nbytes: int):
        peer = dst if src == self.rank else src
        if not (0 <= peer < self.n) or peer == self.rank:
            raise ValueError(f"peer {peer} is not another rank of this group of {self.n}")
        if nbytes > keymod.BYTES_PER_KEY:
            raise ValueError(f"a message of {nbytes} bytes is more than one key may encrypt: split the tensor")
        st = self._p2p.setdefault((src, dst), [0, 0, 0])
        if st[1] >= keymod.MAX_SEQ - 1 or st[2] + nbytes > keymod.BYTES_PER_KEY:
            st[:] = [st[0] + 1, 0, 0]
        epoch, counter = st[0], st[1]
        st[1] += 1
        st[2] += max(nbytes, 1)
        cipher = self._cipher(("p2p", src, dst), epoch, lambda: self.provider.p2p_key(self.session, src, dst, epoch))
        return epoch, counter, cipher

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Encrypted point-to-point send (own key per direction and pair)."""
        self.check_usable()
        self._check_device(tensor)
        flat = _bytes(tensor)
        epoch, counter, cipher = self._p2p_state(self.rank, dst, flat.numel())
        w = _wire(flat.numel(), self.device)
        cipher.encrypt(self._ident("p2p", _dtype_code(tensor), self.rank, 0, counter, epoch), flat, w)
        self._exchange(w, dst, None, 0)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        """Receive, verify and decrypt into tensor; IntegrityError if it fails."""
        self.check_usable()
        self._check_device(tensor)
        flat = _bytes(tensor)
        epoch, counter, cipher = self._p2p_state(src, self.rank, flat.numel())
        w = _wire(flat.numel(), self.device)
        self._exchange(None, 0, w, src)
        fail = torch.zeros(1, dtype=torch.int32, device=self.device)
        cipher.decrypt(self._ident("p2p", _dtype_code(tensor), src, 0, counter, epoch), w, flat, fail)
        SecureWork(self, "recv", fail).wait()

    def _check_device(self, *ts):
        for t in ts:
            if t.device != self.device:
                raise ValueError(f"tensor on {t.device}, but this SecureGroup runs on {self.device}")

    # ---- DDP ----
    def _complete_later(self, work: SecureWork, fut: torch.futures.Future, value) -> None:
        """Complete fut from a worker thread once work is done (the caller's thread never blocks)."""
        if self._completer is None:
            self._completer = ThreadPoolExecutor(1, thread_name_prefix="ccbridge-secure")

        def done():
            try:
                work.wait()
                fut.set_result(value)
            except BaseException as e:  # noqa: BLE001 - handed to the future's waiter
                fut.set_exception(e)

        self._completer.submit(done)


def allreduce_hook(state: SecureGroup, bucket):  # no annotations: DDP checks them literally
    """DDP comm hook: average the bucket's gradients with an encrypted all-reduce.

        ddp.register_comm_hook(SecureGroup(), ccbridge.secure.allreduce_hook)
    """
    t = bucket.buffer()
    work = state.all_reduce(t, op="avg", async_op=True)
    fut = torch.futures.Future()
    state._complete_later(work, fut, t)
    return fut
