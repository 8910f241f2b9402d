"""Rank bodies for the encrypted-collective tests (spawned, one process per rank).

Each scenario raises AssertionError with what went wrong; mp.spawn re-raises
it in the test. Runs on Gloo with CPU tensors (CI) and on NCCL/Gloo with GPUs.

Attack scenarios (attack_*) leave the transport out of step on purpose, so
each runs in processes of its own: every rank writes its verdict (the error
it raised, how long it took) to $CCB_VERDICTS/rank<r>.json and leaves at once,
without the barrier and teardown a broken transport would hang in.
"""

import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ccbridge import secure
from ccbridge.secure import gcm

KEY = hashlib.sha256(b"ccbridge test key").digest()
OTHER_KEY = hashlib.sha256(b"ccbridge other key").digest()
TIMEOUT = float(os.environ.get("CCB_TEST_TIMEOUT", "30"))  # the groups' deadline in these tests


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


ATTACKS = ["drop", "duplicate", "truncate", "reorder", "dead_rank"]


def run_attack(n: int, backend: str, device: str, attack: str, tmp_path, timeout_s: float = 5.0) -> dict:
    """Run one wire attack on n ranks (scenario attack_<attack>); every rank
    left alive must raise a ccbridge SecureError, in one line, within a deadline."""
    out = tmp_path / f"{attack}-{n}"
    out.mkdir()
    spawn(n, backend, device, ["attack_" + attack],
          env={"CCB_VERDICTS": str(out), "CCB_ATTACK_TIMEOUT": str(timeout_s)}, deadline_s=120)
    verdicts = {v["rank"]: v for v in (json.loads(f.read_text()) for f in out.iterdir())}
    for r in range(n - 1) if attack == "dead_rank" else range(n):
        v = verdicts.get(r)
        assert v is not None, f"{attack}: rank {r} left no verdict"
        assert v["secure"], f"{attack}: rank {r} raised {v['error']} ({v['message']}), not a ccbridge SecureError"
        assert v["elapsed_s"] < 3 * timeout_s + 10, f"{attack}: rank {r} took {v['elapsed_s']:.1f} s"
        assert "\n" not in v["message"] and "Traceback" not in v["message"], f"{attack}: rank {r}: not one line"
    return verdicts


def _main(rank, n, backend, device, scenarios, port):
    if os.environ.get("CCB_DUMP_AFTER"):  # diagnosis of a hang: every thread's stack, on stderr
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["CCB_DUMP_AFTER"]), exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=n)
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    if scenarios[0].startswith("attack_"):
        _verdict(rank, n, dev, scenarios[0])
    try:
        for name in scenarios:
            globals()["scenario_" + name](rank, n, dev)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _verdict(rank, n, dev, name):
    """Run one attack; record what this rank raised and when; leave without teardown."""
    t0, err = time.monotonic(), None
    try:
        globals()["scenario_" + name](rank, n, dev)
    except secure.SecureError as e:
        err = e
    except BaseException as e:  # noqa: BLE001 - recorded, the test says it is the wrong kind
        err = e
    out = {"rank": rank, "error": type(err).__name__ if err else None, "secure": isinstance(err, secure.SecureError),
           "message": str(err) if err else None, "elapsed_s": time.monotonic() - t0}
    with open(os.path.join(os.environ["CCB_VERDICTS"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    os._exit(0)


def _group(dev, key=KEY, timeout=TIMEOUT):
    return secure.SecureGroup(keys=secure.StaticKey(key), device=dev, timeout=timeout)


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
    for bad in (rank, n, -1):  # itself or no rank of the group: refused before anything moves
        try:
            g.send(torch.zeros(4, device=dev), bad)
        except ValueError as e:
            assert "not another rank" in str(e)
        else:
            raise AssertionError(f"send to peer {bad} was accepted")


class _Tap:
    """Wraps the transport calls to watch or alter what this rank puts on the
    wire. alter(t, i, kind) may change t in place (kind "p2p" or "gather", i
    counts every message this rank sent inside the tap); for a p2p message it
    may return a list of tensors to send in t's place ([] drops it, [t, t]
    duplicates it). An all-gather's own slot keeps the original: a wire
    attacker changes what others receive, not what a rank keeps."""

    def __init__(self, alter=None):
        self.sent, self.alter = [], alter
        # the gather into one tensor under each name a torch has for it (2.13: all_gather_single as well)
        self._single = [n for n in ("all_gather_into_tensor", "all_gather_single") if hasattr(dist, n)]
        self._orig = (dist.batch_isend_irecv, [getattr(dist, n) for n in self._single], dist.all_gather)

    def _touch(self, t, kind):
        verdict = self.alter(t, len(self.sent), kind) if self.alter else None
        # a copy on t's device, ordered on the stream: .cpu() here would block the host until that
        # stream reached this point, and an attack that stalls the stream would hang the test, not the group
        self.sent.append(t.detach().clone())
        return verdict

    def __enter__(self):
        orig_batch, orig_singles, orig_ag = self._orig

        def batch(ops):
            out = []
            for op in ops:
                instead = self._touch(op.tensor, "p2p") if op.op is dist.isend else None
                if instead is None:
                    out.append(op)
                else:
                    out += [dist.P2POp(dist.isend, t, op.peer, op.group) for t in instead]
            return orig_batch(out) if out else []

        def gathered(orig, out, inp, group, async_op, own):
            keep = inp.clone()
            self._touch(inp, "gather")
            work = orig(out, inp, group=group, async_op=async_op)
            if not async_op:
                own().copy_(keep)
            return work

        def single(orig):
            def agit(out, inp, group=None, async_op=False):
                r, m = dist.get_rank(group), inp.numel()
                return gathered(orig, out, inp, group, async_op, lambda: out[r * m:(r + 1) * m])
            return agit

        def ag(outs, inp, group=None, async_op=False):
            return gathered(orig_ag, outs, inp, group, async_op, lambda: outs[dist.get_rank(group)])

        dist.batch_isend_irecv, dist.all_gather = batch, ag
        for name, orig in zip(self._single, orig_singles):
            setattr(dist, name, single(orig))
        return self

    def __exit__(self, *exc):
        dist.batch_isend_irecv, _, dist.all_gather = self._orig
        for name, orig in zip(self._single, self._orig[1]):
            setattr(dist, name, orig)


def _expect_integrity_error(fn, what):
    try:
        fn()
    except secure.IntegrityError:
        return
    raise AssertionError(f"{what}: no IntegrityError on this rank")


def _fails_then_refuses(g, fn, what):
    """fn raises IntegrityError on this rank, and the group is then fail-stop."""
    _expect_integrity_error(fn, what)
    try:
        g.all_reduce(torch.zeros(4, device=g.device))
    except secure.PeerError:
        return
    raise AssertionError(f"{what}: the group was used again after an authentication failure")


def scenario_integrity(rank, n, dev):
    x = _data(torch.float32, 50000, rank, dev)

    def flip(offset_from_end=None):
        def alter(t, i, kind):
            if i == 0:  # the first message this rank sends
                pos = t.numel() - 1 - offset_from_end if offset_from_end is not None else t.numel() // 3
                t[pos] ^= 0x01
        return alter

    # a flipped bit in ciphertext, then in a tag, at rank 1 only: every rank raises
    for what, alter in [("ciphertext bit", flip()), ("tag bit", flip(0))]:
        g, y = _group(dev), x.clone()
        with _Tap(alter if rank == 1 else None):
            _fails_then_refuses(g, lambda: g.all_reduce(y), what)
    # a new group on the same transport works
    g, y, ref = _group(dev), x.clone(), x.clone()
    g.all_reduce(y)
    dist.all_reduce(ref)
    assert _close(y, ref, torch.float32, n), "clean all_reduce in a new group after failures"

    # replay: rank 1 sends, in a later collective, what it sent in an earlier one
    recorded = {}

    def record(t, i, kind):
        recorded.setdefault(i, t.clone())

    def replay(t, i, kind):
        if i in recorded and recorded[i].numel() == t.numel():
            t.copy_(recorded[i])

    y = x.clone()
    with _Tap(record if rank == 1 else None):
        g.all_reduce(y)
    y = x.clone()
    with _Tap(replay if rank == 1 else None):
        _fails_then_refuses(g, lambda: g.all_reduce(y), "replayed message")

    # reorder: swap two chunks (ciphertext and tags) of rank 1's first message
    g = _group(dev)

    def swap(t, i, kind):
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
        _fails_then_refuses(g, lambda: g.all_reduce(y), "reordered chunks")

    # a failure in a broadcast's last hop still reaches every rank
    def last_hop(t, i, kind):
        if i == 0:
            t[0] ^= 0x80

    g, b = _group(dev), x.clone()
    with _Tap(last_hop if rank == n - 2 else None):
        _fails_then_refuses(g, lambda: g.broadcast(b, 0), "broadcast tampered on its last hop")

    # wrong key on one rank: every rank refuses the session before any data moves
    try:
        _group(dev, key=OTHER_KEY if rank == n - 1 else KEY)
    except secure.HandshakeError:
        pass
    else:
        raise AssertionError("wrong key on the last rank: the handshake passed on this rank")


def scenario_transport(rank, n, dev):
    """Only ciphertext crosses; nothing sent repeats across steps, collectives
    or sessions; no (key, nonce) pair is used twice by any rank in any session.
    With $CCB_KEYLOG, rank 0 appends every pair used to that file, so a test can
    check that a restarted job uses none of them again."""
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
            for _session in range(2):  # the same traffic in two sessions of one job
                g = _group(dev)
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
    payloads = [t.cpu().numpy().tobytes() for t in tap.sent]
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
    assert len(pairs) >= n * 10, "too few encryptions logged"
    if rank == 0 and os.environ.get("CCB_KEYLOG"):
        with open(os.environ["CCB_KEYLOG"], "a") as f:
            f.writelines(f"{k} {p.hex()}\n" for k, p in pairs)


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


def scenario_sessions(rank, n, dev):
    """A recorded session replayed into a later one is refused on every rank:
    the whole of it (handshake and data, in order), and its data alone after
    an honest handshake."""
    x = _data(torch.float32, 50000, rank, dev)
    recorded = []
    with _Tap((lambda t, i, kind: recorded.append((kind, t.clone()))) if rank == 0 else None):
        a = _group(dev)
        y = x.clone()
        a.all_reduce(y)

    def replay_all(t, i, kind):
        if i < len(recorded) and recorded[i][1].numel() == t.numel():
            t.copy_(recorded[i][1])

    with _Tap(replay_all if rank == 0 else None):
        try:
            _group(dev)
        except secure.HandshakeError:
            pass
        else:
            raise AssertionError("session A's handshake replayed into session B was accepted")

    b = _group(dev)
    assert a.session != b.session, "two sessions share their keys"
    old = [t for kind, t in recorded if kind == "p2p"]

    def replay_data(t, i, kind):  # session A's message of the same size, in A's order (its group's
        same = [k for k, o in enumerate(old) if o.numel() == t.numel()] if kind == "p2p" else []  # warm-up
        if same:  # messages are smaller than the all_reduce's)
            t.copy_(old.pop(same[0]))

    y = x.clone()
    with _Tap(replay_data if rank == 0 else None):
        _fails_then_refuses(b, lambda: b.all_reduce(y), "session A's data replayed into session B")
    c, y, ref = _group(dev), x.clone(), x.clone()
    c.all_reduce(y)
    dist.all_reduce(ref)
    assert _close(y, ref, torch.float32, n), "clean all_reduce in a new session after the replay"


# ---- attacks that leave the transport out of step (one spawn each, see _verdict) ----

ATTACK_TIMEOUT = float(os.environ.get("CCB_ATTACK_TIMEOUT", "5"))
ATTACK_NUMEL = 3_000_000  # 12 MB: every ring segment moves in 2+ slices


def _attacked_all_reduce(rank, dev, alter):
    """rank 1 alters what it sends during one all_reduce; raises what the group raises."""
    g = _group(dev, timeout=ATTACK_TIMEOUT)
    x = _data(torch.float32, ATTACK_NUMEL, rank, dev)
    with _Tap(alter if rank == 1 else None):
        g.all_reduce(x)
    raise AssertionError("an attacked all_reduce returned on this rank")


def scenario_attack_drop(rank, n, dev):
    _attacked_all_reduce(rank, dev, lambda t, i, kind: [] if (kind, i) == ("p2p", 1) else None)


def scenario_attack_duplicate(rank, n, dev):
    _attacked_all_reduce(rank, dev, lambda t, i, kind: [t, t.clone()] if (kind, i) == ("p2p", 0) else None)


def scenario_attack_truncate(rank, n, dev):
    _attacked_all_reduce(rank, dev, lambda t, i, kind: [t[:-16].clone()] if (kind, i) == ("p2p", 0) else None)


def scenario_attack_reorder(rank, n, dev):
    """Rank 1's first two messages (slices 0 and 1 of one hop) swap places on the wire."""
    held = []

    def alter(t, i, kind):
        if kind != "p2p" or i > 1:
            return None
        if i == 0:
            held.append(t.clone())
            return []
        return [t, held[0]]

    _attacked_all_reduce(rank, dev, alter)


def scenario_attack_dead_rank(rank, n, dev):
    """The last rank dies in the middle of an all_reduce (after its first message)."""
    g = _group(dev, timeout=ATTACK_TIMEOUT)
    x = _data(torch.float32, ATTACK_NUMEL, rank, dev)

    def die(t, i, kind):
        if kind == "p2p" and i == 1:
            os._exit(0)

    with _Tap(die if rank == n - 1 else None):
        g.all_reduce(x)
    raise AssertionError("an all_reduce with a dead rank returned on this rank")
