"""Rank bodies for the encrypted-collective tests (spawned, one process per rank).

Each scenario raises AssertionError with what went wrong; mp.spawn re-raises
it in the test. Runs on Gloo with CPU tensors (CI) and on NCCL/Gloo with GPUs.
"""

import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ccbridge import secure
from ccbridge.secure import gcm

KEY = bytes(range(32))


def spawn(n: int, backend: str, device: str, scenarios: list[str], env: dict | None = None, deadline_s: float = 150) -> None:
    """Run the scenarios on n ranks; a rank that dies leaves its peers blocked
    in the transport, so all are killed at the deadline and the test fails."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(env or {})
    ctx = mp.start_processes(_main, args=(n, backend, device, scenarios, port), nprocs=n, join=False, start_method="spawn")
    end = time.monotonic() + deadline_s
    while not ctx.join(timeout=5):  # raises as soon as a rank fails
        if time.monotonic() > end:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"{scenarios} on {n} ranks ({backend}) did not finish in {deadline_s:.0f} s")


def _main(rank, n, backend, device, scenarios, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=n)
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    try:
        for name in scenarios:
            globals()["scenario_" + name](rank, n, dev)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _group(dev, key=KEY):
    return secure.SecureGroup(keys=secure.StaticKey(key), device=dev)


def _data(dtype, numel, rank, dev):
    g = torch.Generator().manual_seed(100 + rank + numel)
    if dtype.is_floating_point:
        return (torch.randn(numel, generator=g) * 4).to(dtype).to(dev)
    return torch.randint(-50, 50, (numel,), generator=g).to(dtype).to(dev)


def _close(a, b, dtype, n):
    if not dtype.is_floating_point:
        return torch.equal(a, b)
    # reduction order differs from the plaintext transport's: allow its rounding
    eps = {torch.float16: 2**-10, torch.bfloat16: 2**-7}.get(dtype, 1e-6)
    return torch.allclose(a.float(), b.float(), rtol=4 * n * eps, atol=4 * n * eps * 16)


def scenario_correctness(rank, n, dev):
    g = _group(dev)
    for dtype in [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.uint8]:
        for numel in [0, 1, 7, 1000, 70001]:
            x = _data(dtype, numel, rank, dev)
            ref = x.clone()
            dist.all_reduce(ref)
            y = x.clone()
            g.all_reduce(y)
            assert _close(y, ref, dtype, n), f"all_reduce {dtype} x{numel}: differs from plaintext"
    for dtype in [torch.float32, torch.int32]:  # segments of several pipeline slices
        x = _data(dtype, 3_000_017, rank, dev)
        y, ref = x.clone(), x.clone()
        g.all_reduce(y)
        dist.all_reduce(ref)
        assert _close(y, ref, dtype, n), f"all_reduce {dtype} of 12 MB (sliced): differs from plaintext"
    x = _data(torch.float32, 1000, rank, dev)
    y, ref = x.clone(), x.clone()
    g.all_reduce(y, op="avg")
    dist.all_reduce(ref)
    assert _close(y, ref / n, torch.float32, n), "avg"
    x = _data(torch.int32, 1_000_001, rank, dev)
    out = torch.empty(1_000_001 * n, dtype=torch.int32, device=dev)
    g.all_gather_into_tensor(out, x)
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x)
    assert torch.equal(out, torch.cat(parts)), "all_gather"
    x = _data(torch.int64, 333 * n, rank, dev)
    o = torch.empty(333, dtype=torch.int64, device=dev)
    g.reduce_scatter_tensor(o, x)
    full = x.clone()
    dist.all_reduce(full)
    assert torch.equal(o, full[rank * 333:(rank + 1) * 333]), "reduce_scatter"
    for src in range(n):
        b = _data(torch.float32, 5000, src, dev) if rank == src else torch.zeros(5000, device=dev)
        g.broadcast(b, src)
        assert torch.equal(b, _data(torch.float32, 5000, src, dev)), f"broadcast from {src}"
    if rank == 0:
        for dst in range(1, n):
            g.send(_data(torch.float32, 100 + dst, dst, dev), dst)
    else:
        t = torch.zeros(100 + rank, device=dev)
        g.recv(t, 0)
        assert torch.equal(t, _data(torch.float32, 100 + rank, rank, dev)), "send/recv"


class _Tap:
    """Wraps the transport calls to watch or alter what crosses them."""

    def __init__(self, alter=None):
        self.sent, self.alter = [], alter
        self._orig = (dist.batch_isend_irecv, dist.all_gather_into_tensor, dist.all_gather)

    def __enter__(self):
        orig_batch, orig_agit, orig_ag = self._orig

        def batch(ops):
            for op in ops:
                if op.op is dist.isend:
                    if self.alter:
                        self.alter(op.tensor, len(self.sent))
                    self.sent.append(op.tensor.detach().cpu().clone())
            return orig_batch(ops)

        def agit(out, inp, group=None, async_op=False):
            self.sent.append(inp.detach().cpu().clone())
            return orig_agit(out, inp, group=group, async_op=async_op)

        def ag(outs, inp, group=None, async_op=False):
            self.sent.append(inp.detach().cpu().clone())
            return orig_ag(outs, inp, group=group, async_op=async_op)

        dist.batch_isend_irecv, dist.all_gather_into_tensor, dist.all_gather = batch, agit, ag
        return self

    def __exit__(self, *exc):
        dist.batch_isend_irecv, dist.all_gather_into_tensor, dist.all_gather = self._orig


def _expect_integrity_error(fn, what):
    try:
        fn()
    except secure.IntegrityError:
        return
    raise AssertionError(f"{what}: no IntegrityError on this rank")


def scenario_integrity(rank, n, dev):
    g = _group(dev)
    x = _data(torch.float32, 50000, rank, dev)

    def flip(offset_from_end=None):
        def alter(t, i):
            if i == 0:  # the first message this rank sends
                pos = t.numel() - 1 - offset_from_end if offset_from_end is not None else t.numel() // 3
                t[pos] ^= 0x01
        return alter

    # a flipped bit in ciphertext, then in a tag, at rank 1 only: every rank raises
    for what, alter in [("ciphertext bit", flip()), ("tag bit", flip(0))]:
        y = x.clone()
        with _Tap(alter if rank == 1 else None):
            _expect_integrity_error(lambda: g.all_reduce(y), what)
    # the group is still usable afterwards
    y, ref = x.clone(), x.clone()
    g.all_reduce(y)
    dist.all_reduce(ref)
    assert _close(y, ref, torch.float32, n), "clean all_reduce after failures"

    # replay: rank 1 sends, in a later collective, what it sent in an earlier one
    recorded = {}

    def record(t, i):
        recorded.setdefault(i, t.clone())

    def replay(t, i):
        if i in recorded and recorded[i].numel() == t.numel():
            t.copy_(recorded[i])

    y = x.clone()
    with _Tap(record if rank == 1 else None):
        g.all_reduce(y)
    y = x.clone()
    with _Tap(replay if rank == 1 else None):
        _expect_integrity_error(lambda: g.all_reduce(y), "replayed message")

    # reorder: swap two chunks (ciphertext and tags) of rank 1's first message
    def swap(t, i):
        if i == 0:
            lo, hi = g._segments(50000, 4)[1]  # rank 1's first message: its segment 1
            nb = hi - lo
            ch = gcm.chunk_for(nb)
            if gcm.nchunks(nb, ch) >= 2:
                a, b = t[:ch].clone(), t[ch:2 * ch].clone()
                t[:ch], t[ch:2 * ch] = b, a
                off = gcm.tags_offset(nb)
                ta, tb = t[off:off + 16].clone(), t[off + 16:off + 32].clone()
                t[off:off + 16], t[off + 16:off + 32] = tb, ta
            else:
                t[0] ^= 1

    y = x.clone()
    with _Tap(swap if rank == 1 else None):
        _expect_integrity_error(lambda: g.all_reduce(y), "reordered chunks")

    # a failure in a broadcast's last hop still reaches every rank
    def last_hop(t, i):
        if i == 0:
            t[0] ^= 0x80

    b = x.clone()
    with _Tap(last_hop if rank == n - 2 else None):
        _expect_integrity_error(lambda: g.broadcast(b, 0), "broadcast tampered on its last hop")

    # wrong key on one rank: everyone raises
    bad = _group(dev, key=bytes(32) if rank == n - 1 else KEY)
    y = x.clone()
    _expect_integrity_error(lambda: bad.all_reduce(y), "wrong key on the last rank")


def scenario_transport(rank, n, dev):
    """Only ciphertext crosses; nothing sent repeats across steps or collectives;
    no (key, nonce) pair is used twice by any rank."""
    g = _group(dev)
    x = _data(torch.float32, 40000, rank, dev)
    plain_bytes = x.view(torch.uint8).cpu().numpy().tobytes()
    used = []

    def keyname(c):
        return hashlib.sha256(c.key if isinstance(c, gcm.CpuCipher) else bytes(c.schedule.raw)).hexdigest()

    originals = {}
    for cls in (gcm.CpuCipher, gcm.GpuCipher):
        originals[cls] = (cls.encrypt, cls.reduce)

        def enc(self, ident, plain, wire, chunk=None, _o=cls.encrypt):
            used.append((keyname(self), ident.prefix))
            return _o(self, ident, plain, wire, chunk)

        def red(self, dtype, ident_in, wire_in, local, fail, plain=None, ident_out=None, wire_out=None, chunk=None,
                _o=cls.reduce, cls=cls):
            if ident_out is not None and cls is gcm.GpuCipher:  # CpuCipher.reduce calls encrypt
                used.append((keyname(self), ident_out.prefix))
            return _o(self, dtype, ident_in, wire_in, local, fail, plain, ident_out, wire_out, chunk)

        cls.encrypt, cls.reduce = enc, red
    try:
        with _Tap() as tap:
            for _ in range(3):
                y = x.clone()
                g.all_reduce(y)  # same input every time
            out = torch.empty(40000 * n, device=dev)
            g.all_gather_into_tensor(out, x)
            o = torch.empty(40000 // n, device=dev)
            g.reduce_scatter_tensor(o, x[: (40000 // n) * n])
            g.broadcast(x.clone(), 0)
            if rank == 0:
                g.send(x, 1)
            elif rank == 1:
                g.recv(torch.empty_like(x), 0)
    finally:
        for cls, (e, r) in originals.items():
            cls.encrypt, cls.reduce = e, r
    payloads = [t.numpy().tobytes() for t in tap.sent]
    assert payloads, "nothing was captured"
    for p in payloads:
        for k in range(0, len(plain_bytes) - 64, 4096):
            assert plain_bytes[k:k + 64] not in p, "plaintext bytes reached the transport"
    big = [p for p in payloads if len(p) > 64]
    assert len(set(big)) == len(big), "a payload repeated across steps or collectives"
    gathered = [None] * n
    dist.all_gather_object(gathered, used)
    pairs = [u for per in gathered for u in per]
    import collections

    dups = [k for k, c in collections.Counter(pairs).items() if c > 1]
    assert not dups, f"(key, nonce prefix) pairs used twice: {dups[:3]}"
    assert len(pairs) >= n * 5, "too few encryptions logged"


def scenario_rotation(rank, n, dev):
    """Keys rotate before their budget; all ranks rotate together and results stay right."""
    from ccbridge.secure import keys

    g = _group(dev)
    saved = keys.BYTES_PER_KEY
    keys.BYTES_PER_KEY = 3 * 2 * n * 4000  # three 1000-float all_reduces per key
    try:
        for i in range(7):
            x = _data(torch.float32, 1000, rank + i, dev)
            y, ref = x.clone(), x.clone()
            g.all_reduce(y)
            dist.all_reduce(ref)
            assert _close(y, ref, torch.float32, n), f"all_reduce {i} across rotation"
        assert g.epoch == 2, f"expected 2 rotations, got epoch {g.epoch}"
    finally:
        keys.BYTES_PER_KEY = saved


def scenario_ddp(rank, n, dev):
    """The DDP hook returns the averaged gradients: same as plain DDP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    g = _group(dev)
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
    grads = []
    for hook in (None, secure.allreduce_hook):
        model = torch.nn.Sequential(*[m for m in base]).to(dev)
        ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=0.01)
        if hook:
            ddp.register_comm_hook(g, hook)
        torch.manual_seed(rank)
        xb = torch.randn(32, 64, device=dev)
        ddp(xb).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        model.zero_grad(set_to_none=True)
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), "DDP with the encrypted hook differs from plain DDP"
