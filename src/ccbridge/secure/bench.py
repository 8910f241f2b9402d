"""Benchmarks of the encrypted collectives: an nccl-tests style table
(plaintext torch.distributed vs ccbridge.secure, side by side) and DDP
training iterations plain vs encrypted.

Both run one process per GPU, started by ccbridge.ranks (or run as one rank
under torchrun when RANK/WORLD_SIZE are set). Data are random small integers
stored in the tensor's dtype, so sums are exact in any order and #wrong counts
real errors.
"""

from __future__ import annotations

import glob
import os
import re
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ccbridge import busbw, choices, hostmem, marks, pluginenv, ranks, ui
from ccbridge import env as envmod
from ccbridge.errors import GpuError, UsageError
from ccbridge.gputimer import time_ms as gpu_time_ms
from ccbridge.results import Result
from ccbridge.secure import benchrows, gcm
from ccbridge.secure import keys as keymod
from ccbridge.secure import tensorops
from ccbridge.secure.group import SecureGroup, allreduce_hook

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
RANK_BUFFERS = 7  # buffers of the largest size a collectives rank holds at once, besides its draw (_buffers_fit)
RANK_PROCESS_BYTES = 512 << 20  # a CPU rank's own: an interpreter with torch and Gloo loaded
RANKS_PER_CPU = 4  # Gloo ranks a CPU at most: more only queue for it (and each holds torch's memory)
STALL_S = 600.0  # no word from any rank this long: stuck (rank 0 speaks after each size or each model's mode)
DTYPES = {name: getattr(torch, dtype) for name, dtype in choices.SECURE_DTYPES.items()}


NETS = {"socket": "Socket", "ccbridge": "ccbridge"}  # --net name -> NCCL_NET


def transport_env(transport: str) -> dict:
    """NCCL forced onto the network (no P2P, no shared memory): a stand-in for
    crossing nodes. "sockets" is NCCL's plaintext socket transport; "ccbridge"
    is the same traffic through the ccbridge net plugin (AES-256-GCM)."""
    if transport == "default":
        return {}
    if transport not in ("sockets", "ccbridge"):
        raise ValueError(f"transport must be default, sockets or ccbridge, not {transport!r}")
    out = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": NETS["socket"],
           "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME", "lo")}  # both transports on one interface
    if transport == "ccbridge":
        out.update({k: v for k, v in pluginenv.env().items() if k in ("NCCL_NET_PLUGIN", "LD_LIBRARY_PATH")})
        out["NCCL_NET"] = NETS["ccbridge"]  # required: NCCL fails instead of falling back to plaintext
    return out


def progress() -> bool:
    """Rank 0 prints each size's row (each model's mode) as it comes: CCBRIDGE_PROGRESS unset or 1."""
    return os.environ.get("CCBRIDGE_PROGRESS", "1") == "1"


def rows_shown() -> bool:
    """This process printed collectives' rows as they came (progress(), and rank 0 of a torchrun job)."""
    return progress() and (not _torchrun() or os.environ["RANK"] == "0")


def _torchrun() -> bool:
    """This process is a rank a launcher started (launch() then runs the rank's work here)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def nranks(nproc: int | None, backend: str) -> int:
    """The ranks collectives() runs: under torchrun its world; else nproc or every GPU (Gloo: at least two, sharing
    the GPUs, rank % GPUs, or CPU ranks where there is none), where this machine holds them: NCCL wants a GPU of
    its own for each rank, and Gloo's ranks, each a process with torch loaded, are at most RANKS_PER_CPU a CPU."""
    if _torchrun():
        return int(os.environ["WORLD_SIZE"])
    gpus, cpus = torch.cuda.device_count(), len(os.sched_getaffinity(0))
    nproc = nproc or (max(2, gpus) if backend == "gloo" else gpus)
    if nproc < 2:
        raise GpuError(f"collectives need at least 2 GPUs; this machine has {gpus} (--backend gloo runs CPU ranks "
                       "where there is none)")
    if backend == "nccl" and nproc > gpus:
        raise UsageError(f"{nproc} ranks: NCCL needs a GPU for each and this machine has {gpus}")
    if nproc > max(2, RANKS_PER_CPU * cpus):
        raise UsageError(f"{nproc} ranks: at most {RANKS_PER_CPU} a CPU, and this process may use {cpus} CPU"
                         f"{'s' if cpus != 1 else ''}")
    ranks.rank_cpus(nproc)  # a bad CCBRIDGE_RANK_CPUS for them: one line now, not once the ranks start
    return nproc


def sizes(op: str, begin: int, end: int, factor: int, dtype: str, nproc: int) -> list[int]:
    """collectives()' sizes, as whole elements (-b 1 -e 2 of float: one size of 4 B, not two), once each
    checked to fit (_buffers_fit)."""
    if end < begin:
        raise UsageError(f"the largest size ({end}) is smaller than the smallest ({begin})")
    item = DTYPES[dtype].itemsize
    out = sorted({_count(op, b, nproc, DTYPES[dtype]) * item for b in busbw.sizes(begin, end, factor)})
    _buffers_fit(out[-1], nproc, item)
    return out


def _buffers_fit(largest: int, nproc: int, itemsize: int) -> None:
    """A UsageError before any rank starts where the largest size's buffers cannot fit. A rank holds about
    RANK_BUFFERS of them at once (input, output, the input kept, the exact result, ciphertexts) and, while it draws
    its data, 8 bytes an element (randint's int64); on its GPU, or with none all of this host's ranks' (with
    RANK_PROCESS_BYTES each) in this machine's memory."""
    bufs = RANK_BUFFERS + 8 / itemsize
    per, size = largest * bufs, ui.approx_bytes(largest)
    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        if per > 0.9 * total:
            raise UsageError(f"size {size}: a rank needs {per / 2**30:.1f} GiB (~{bufs:.0f} buffers of it), a GPU "
                             f"holds {total / 2**30:.0f} GiB")
        return
    here = int(os.environ.get("LOCAL_WORLD_SIZE", nproc))  # a torchrun job's ranks on this host
    per += RANK_PROCESS_BYTES
    if (avail := hostmem.available_bytes()) is not None and here * per > 0.8 * avail:
        raise UsageError(f"size {size}: {here} ranks x {per / 2**30:.1f} GiB (~{bufs:.0f} buffers of it, and torch), "
                         f"{avail / 2**30:.1f} GiB free")


def _nccl_log_env(d: str) -> dict:
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": os.path.join(d, "nccl.%h.%p.log")}


def _nets_in_logs(d: str) -> list[str]:
    """The networks NCCL said it used ("Using network X"), from every rank's debug log."""
    found = set()
    for f in glob.glob(os.path.join(d, "nccl.*.log")):
        with open(f, errors="replace") as fh:
            found.update(re.findall(r"Using network (\S+)", fh.read()))
    return sorted(found)


def launch(fn, nproc: int, *args, env: dict | None = None, label: str = "bench"):
    """fn(rank, nproc, *args) as this torchrun rank (RANK and WORLD_SIZE set), or on nproc ranks started by
    ccbridge.ranks with `env` on top of this process's environment: rank 0's result. A started rank joins its group
    as a torchrun rank does (_init, env://), at a free port of 127.0.0.1; rank 0's progress lines are printed here
    as they come. label names the ranks in errors."""
    if _torchrun():
        return fn(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), *args)
    env = {**(env or {}), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ranks.free_port())}
    if not keymod.configured():  # a benchmark key, shared by the ranks; a key the user named is theirs to use
        env.setdefault(keymod.ENV_VAR, os.urandom(32).hex())
    return ranks.run(nproc, _started, fn, *args, label=label, env=env,
                     on_message=lambda rank, line: _show(line), stall_s=STALL_S)[0]


def _show(line: str | None) -> None:
    """Rank 0's progress: a line to print, or None (a sign of life alone)."""
    if line is not None:
        print(line, flush=True)


def _started(rank, n, dev, send, fn, *args):
    """A rank started by launch(): fn as under torchrun, its progress lines sent to the parent."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank))  # this rank's own environment
    return fn(rank, n, *args, say=send)


def _init(rank: int, n: int, backend: str, secure: bool = True):
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=n)
    if not secure:
        return None

    return SecureGroup()


def _barrier() -> None:
    """dist.barrier(), under NCCL on this rank's GPU: named, as torch (2.11) warns on every rank-0 barrier where it
    must take the current device itself."""
    nccl = dist.get_backend() == "nccl"
    dist.barrier(device_ids=[torch.cuda.current_device()] if nccl else None)


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _op(api, op: str, out, inp):
    """One collective through api: torch.distributed (plaintext) or a SecureGroup (same names)."""
    if op == "all_reduce":
        api.all_reduce(out)
    elif op == "all_gather":
        (tensorops.all_gather if api is dist else api.all_gather_into_tensor)(out, inp)
    elif op == "reduce_scatter":
        (tensorops.reduce_scatter if api is dist else api.reduce_scatter_tensor)(out, inp)
    else:
        api.broadcast(out, 0)


def _count(op: str, nbytes: int, n: int, dtype) -> int:
    count = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
    return max(n, count - count % n) if op in ("all_gather", "reduce_scatter") else count


def _data(rank: int, count: int, dtype, device):
    """Rank `rank`'s input: small random integers (exact in every dtype, summed in any order)."""
    g = torch.Generator(device=device).manual_seed(1234 + rank)
    return torch.randint(-8, 9, (count,), generator=g, device=device).to(dtype)


def _buffers(op: str, nbytes: int, n: int, dtype, device, rank: int):
    """(input, output) of a collective moving nbytes (nccl-tests' size: the larger buffer for gathers)."""
    count = _count(op, nbytes, n, dtype)
    big = _data(rank, count, dtype, device)
    if op == "all_gather":
        return big[: count // n].clone(), torch.empty(count, dtype=dtype, device=device)
    if op == "reduce_scatter":
        return big, torch.empty(count // n, dtype=dtype, device=device)
    return big, big.clone()


def _expected(op: str, nbytes: int, n: int, dtype, device, rank: int):
    """The op's exact result on this rank, from every rank's input regenerated here (no collective)."""
    count = _count(op, nbytes, n, dtype)
    if op == "broadcast":
        return _data(0, count, dtype, device)
    if op == "all_gather":
        # each rank's part cloned off its whole draw at once, so one draw at a time is alive, not n
        return torch.cat([_data(r, count, dtype, device)[: count // n].clone() for r in range(n)])
    total = _data(0, count, dtype, device)
    for r in range(1, n):
        total += _data(r, count, dtype, device)
    return total if op == "all_reduce" else total[rank * (count // n):(rank + 1) * (count // n)].clone()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn, iters: int, warmup: int) -> float:
    """Seconds per call of fn over iters back-to-back calls after warmup; the timed calls between
    ccbridge.mark("begin") and ("end"): this rank's window for `ccbridge account` (warm-up apart)."""
    for _ in range(warmup):
        fn()
    _sync()
    marks.mark("begin")
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync()
    took = (time.perf_counter() - t0) / iters
    marks.mark("end")
    return took


def timed_steps(step, warmup: int, iters: int, between=lambda: None, sync=_sync) -> tuple[list[float], list]:
    """warmup + iters calls of step, each between two synchronizes, and between() after each but the last: the
    timed ones' seconds and every call's result. The timed steps lie between ccbridge.mark("begin") and ("end"):
    this rank's window for `ccbridge account` (its steady state: warm-up and what follows the loop apart)."""
    times, out = [], []
    for i in range(warmup + iters):
        sync()
        if i == warmup:
            marks.mark("begin")
        t0 = time.perf_counter()
        out.append(step())
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        if i < warmup + iters - 1:
            between()
    if iters:
        marks.mark("end")
    return times, out


def _collectives_rank(rank, n, op, size_list, dtype_name, iters, warmup, backend, secure=True, say=_show):
    """Times NCCL (and, when secure, the SecureGroup) per size; every result is checked
    element by element against the exact expected value, before the timed loops. Rank 0
    says each size's row, or None with CCBRIDGE_PROGRESS=0 (say: _show, or launch()'s
    parent's, for whom it is a sign of life either way)."""
    g = _init(rank, n, backend, secure)
    dtype, dev = DTYPES[dtype_name], g.device if secure else _device()
    rows = []
    for nbytes in size_list:
        inp, out = _buffers(op, nbytes, n, dtype, dev, rank)
        orig = out.clone()
        want = _expected(op, nbytes, n, dtype, dev, rank)
        _op(dist, op, out, inp)
        row = {"wrong_plain": int((out != want).sum())}
        out.copy_(orig)
        if secure:
            _op(g, op, out, inp)
            row["wrong"] = int((out != want).sum())
        # timings: the op alone, restoring the input outside the timed loop is not
        # possible for in-place ops, so all_reduce/broadcast time on evolving data
        t_plain = _time(lambda: _op(dist, op, out, inp), iters, warmup)
        size = max(out.numel(), inp.numel()) * out.element_size()
        f = busbw.factor(op, n)
        row.update({"size": size, "count": max(out.numel(), inp.numel()), "type": dtype_name,
                    "plain_us": t_plain * 1e6, "plain_algbw": size / t_plain / 1e9,
                    "plain_busbw": size / t_plain / 1e9 * f})
        if secure:
            t_sec = _time(lambda: _op(g, op, out, inp), iters, warmup)
            row.update({"secure_us": t_sec * 1e6, "secure_algbw": size / t_sec / 1e9,
                        "secure_busbw": size / t_sec / 1e9 * f})
        rows.append(row)
        if rank == 0:
            say(benchrows.render_collectives([row], header=len(rows) == 1)
                if progress() else None)
    _barrier()
    dist.destroy_process_group()
    return {"op": op, "nranks": n, "backend": backend, "rows": rows}


def collectives(op: str, begin: int, end: int, factor: int, dtype: str = "float", iters: int = 20, warmup: int = 5,
                nproc: int | None = None, backend: str = "nccl", transport: str = "default",
                net: str | None = None) -> Result:
    """The nccl-tests style table, as a Result of kind collectives (benchrows.collectives_result). Without
    `net`: NCCL (plaintext, on `transport`) beside ccbridge.secure's encrypted collectives. With
    net="ccbridge": NCCL on its plaintext socket transport beside the same NCCL on the ccbridge net plugin
    (AES-256-GCM on the wire), each run's NCCL log checked for the network it used."""
    stamp, t0 = envmod.stamp(), time.perf_counter()
    settings = {"dtype": dtype, "minbytes": begin, "maxbytes": end, "stepfactor": factor, "iters": iters,
                "warmup": warmup, "net": net}
    got = _collectives(op, begin, end, factor, dtype, iters, warmup, nproc, backend, transport, net)
    res = benchrows.collectives_result(got, stamp, settings)
    res.duration_s = round(time.perf_counter() - t0, 2)
    return res


def _collectives(op: str, begin: int, end: int, factor: int, dtype: str, iters: int, warmup: int, nproc: int | None,
                 backend: str, transport: str, net: str | None) -> dict:
    """collectives()' measurement: {op, nranks, backend, transport, encrypted, rows[, nets, env]}."""
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
    nproc = nranks(nproc, backend)
    size_list = sizes(op, begin, end, factor, dtype, nproc)
    if net is None:
        res = launch(_collectives_rank, nproc, op, size_list, dtype, iters, warmup, backend,
                     env=transport_env(transport), label="collectives")
        res.update(transport=transport, encrypted="ccbridge.secure")
        return res
    if net != "ccbridge" or backend != "nccl":
        raise ValueError("--net ccbridge compares NCCL's transports: it needs --backend nccl")

    runs = {}
    for t in ("sockets", "ccbridge"):
        with tempfile.TemporaryDirectory() as d:
            if progress():
                print(f"# NCCL on {'its plaintext sockets' if t == 'sockets' else 'the ccbridge net plugin'}", flush=True)
            runs[t] = launch(_collectives_rank, nproc, op, size_list, dtype, iters, warmup, backend, False,
                             env={**transport_env(t), **_nccl_log_env(d)}, label="collectives")
            runs[t]["nets"] = _nets_in_logs(d)
    if NETS["ccbridge"] not in runs["ccbridge"]["nets"]:
        raise RuntimeError(f"NCCL's log does not show the ccbridge plugin in use (networks: {runs['ccbridge']['nets']})")
    rows = []
    for a, b in zip(runs["sockets"]["rows"], runs["ccbridge"]["rows"]):
        rows.append({**a, "wrong": b["wrong_plain"], "secure_us": b["plain_us"], "secure_algbw": b["plain_algbw"],
                     "secure_busbw": b["plain_busbw"]})
    return {"op": op, "nranks": nproc, "backend": backend, "transport": "sockets vs ccbridge net plugin",
            "encrypted": "NCCL + ccbridge net plugin", "rows": rows,
            "nets": {t: r["nets"] for t, r in runs.items()},
            "env": {k: v for k, v in transport_env("ccbridge").items() if k != "LD_LIBRARY_PATH"}}


# ---- DDP ----

def _model(name: str):
    """(model, batch maker) with random initialization."""
    if name == "resnet50":
        import torchvision  # deferred: torchvision, an optional dependency of this one model

        m = torchvision.models.resnet50()
        return m, lambda b, dev: (torch.randn(b, 3, 224, 224, device=dev), torch.randint(0, 1000, (b,), device=dev)), 64
    import transformers  # deferred: Hugging Face transformers, an optional dependency (seconds of import)

    if name == "bert-large":
        cfg = transformers.BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
        m, seq = transformers.BertForMaskedLM(cfg), 128
    elif name == "gpt2-large":
        cfg = transformers.GPT2Config(n_embd=1280, n_layer=36, n_head=20)
        m, seq = transformers.GPT2LMHeadModel(cfg), 256
    else:
        raise ValueError(f"unknown model {name} ({', '.join(choices.DDP_MODELS)})")
    vocab = cfg.vocab_size
    return m, lambda b, dev: (torch.randint(0, vocab, (b, seq), device=dev), None), 8


def _step(model, name, batch, opt):
    """One training iteration: forward, backward (the gradients' all-reduce), optimizer step; the loss."""
    x, y = batch
    with torch.autocast("cuda", dtype=torch.bfloat16):
        if name == "resnet50":
            loss = torch.nn.functional.cross_entropy(model(x), y)
        else:
            loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    return loss.detach()


def compare_losses(rows: list[dict]) -> None:
    """Each row's per-iteration losses beside those of its model's plaintext row (NCCL plain, or NCCL on
    sockets): loss_equal (bit for bit, every step) and loss_max_rel_diff, in the row. An optimizer step
    feeds each step's reduced gradients into the next step's loss, so a wrong byte on the wire shows."""
    base = {r["model"]: r["losses"] for r in rows if r["mode"] in ("plain", "nccl-sockets") and r.get("losses")}
    for r in rows:
        ref, got = base.get(r["model"]), r.get("losses")
        if not ref or not got or len(ref) != len(got):
            r["loss_equal"], r["loss_max_rel_diff"] = None, None
            continue
        r["loss_equal"] = ref == got
        r["loss_max_rel_diff"] = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(ref, got))


def _blocks(model, name: str):
    """The submodules FSDP2 shards one by one (then the root): transformer blocks, ResNet stages."""
    if name == "gpt2-large":
        return list(model.transformer.h)
    if name == "bert-large":
        return list(model.bert.encoder.layer)
    return [model.layer1, model.layer2, model.layer3, model.layer4]


def _grads_agree(model) -> bool:
    """DDP leaves bit-identical gradients on every rank: a wrong byte anywhere on the wire shows here."""
    sums = torch.stack([p.grad.double().sum() for p in model.parameters() if p.grad is not None][:64])
    every = [torch.empty_like(sums) for _ in range(dist.get_world_size())]
    dist.all_gather(every, sums)
    return all(torch.equal(every[0], e) for e in every)


def _ddp_rank(rank, n, models, plan, iters, warmup, backend, wrap="ddp", say=_show):
    """plan: (mode, bucket_cap_mb) pairs; mode "secure" adds ccbridge.secure's hook,
    any other mode is NCCL as configured (its name says which transport). Rank 0 says
    each row's line (say: _show, or launch()'s parent's)."""
    g = _init(rank, n, backend, secure=any(m == "secure" for m, _ in plan))
    dev = _device()
    rows = []
    for name in models:
        torch.manual_seed(0)
        base, make, bsz = _model(name)
        base = base.to(dev)
        params = sum(p.numel() for p in base.parameters())
        batch = make(bsz, dev)
        start = {k: v.detach().clone() for k, v in base.state_dict().items()}  # every mode trains from here
        for mode, cap in plan:
            base.load_state_dict(start)
            if wrap == "fsdp":
                from torch.distributed.fsdp import fully_shard  # deferred: FSDP2, only in newer torch (--wrap fsdp)

                for blk in _blocks(base, name):
                    fully_shard(blk)
                model = fully_shard(base)
            else:
                model = DDP(base, device_ids=[dev.index], bucket_cap_mb=cap)
                if mode == "secure":
                    model.register_comm_hook(g, allreduce_hook)
            opt = torch.optim.SGD(model.parameters(), lr=1e-4)
            times, losses = timed_steps(lambda: _step(model, name, batch, opt), warmup, iters,
                                        lambda: opt.zero_grad(set_to_none=True), torch.cuda.synchronize)
            agree = _grads_agree(base) if wrap == "ddp" else None  # the last step's gradients
            opt.zero_grad(set_to_none=True)
            rows.append({"model": name, "params": params, "nranks": n, "mode": mode, "wrap": wrap,
                         "bucket_cap_mb": cap, "batch_per_gpu": bsz, "iter_ms": statistics.median(times) * 1e3,
                         "iter_ms_min": min(times) * 1e3, "iter_ms_max": max(times) * 1e3, "grads_agree": agree,
                         "iter_ms_all": [t * 1e3 for t in times], "losses": [float(x) for x in losses]})
            if rank == 0:
                r = rows[-1]
                say(f"{name:>11} n={n} {wrap} {mode:>13} bucket {cap or '-':>4} MB: {r['iter_ms']:8.1f} ms/iter"
                    + ("" if agree in (True, None) else "  GRADIENTS DIFFER ACROSS RANKS"))
            del model
        del base
        torch.cuda.empty_cache()
    _barrier()
    dist.destroy_process_group()
    return {"nranks": n, "rows": rows}


def ddp(models: list[str], nprocs: list[int] | None, buckets: list[int], iters: int = 10, warmup: int = 3,
        backend: str = "nccl", net: str | None = None, wrap: str = "ddp", show=lambda table: None) -> Result:
    """Training iterations at each world size in nprocs (None: 2 and 4, where the GPUs are there), as a Result
    of kind ddp (benchrows.ddp_rows); show(table) after each world size. Without `net`: NCCL (plaintext, default
    transport) beside ccbridge.secure's DDP hook at each bucket size. With net="ccbridge": NCCL on its plaintext
    sockets beside NCCL on the ccbridge net plugin, DDP at the default 25 MB buckets or FSDP2 (wrap="fsdp")."""
    gpus = torch.cuda.device_count()
    if not nprocs and gpus < 2:
        raise UsageError(f"the ddp bench runs a rank on each of 2 or more GPUs, and this machine has {gpus}")
    nprocs = nprocs or [n for n in (2, 4) if n <= gpus]
    for nproc in nprocs:
        if nproc < 2 or nproc > gpus:
            raise UsageError(f"--ngpus {nproc}: the ddp bench runs 2 to this machine's {gpus} GPUs, one rank each")
    if net is None and wrap != "ddp":
        raise ValueError("--wrap fsdp goes with --net ccbridge (ccbridge.secure's hook is for DDP)")
    res = Result(kind="ddp", env=envmod.stamp(),
                 settings={"models": list(models), "ngpus": list(nprocs), "buckets": list(buckets), "iters": iters,
                           "warmup": warmup, "backend": backend, "net": net, "wrap": wrap})
    t0 = time.perf_counter()
    for nproc in nprocs:
        res.rows += benchrows.ddp_rows(_ddp(models, nproc, buckets, iters, warmup, backend, net, wrap))
        show(benchrows.render_ddp(res, nproc))
    res.duration_s = round(time.perf_counter() - t0, 2)
    return res


def _ddp(models: list[str], nproc: int, buckets: list[int], iters: int, warmup: int, backend: str,
         net: str | None, wrap: str) -> dict:
    """One world size's runs: {nranks, rows[, nets]}, each row with the networks NCCL's log showed (net)."""
    if net is None:
        res = launch(_ddp_rank, nproc, models, [("plain", 25)] + [("secure", b) for b in buckets], iters, warmup,
                     backend, label="ddp bench")
        compare_losses(res["rows"])
        return res

    rows, nets = [], {}
    for t in ("sockets", "ccbridge"):
        with tempfile.TemporaryDirectory() as d:
            r = launch(_ddp_rank, nproc, models, [(f"nccl-{t}", 25 if wrap == "ddp" else None)], iters, warmup,
                       backend, wrap, env={**transport_env(t), **_nccl_log_env(d)}, label="ddp bench")
            nets[t] = _nets_in_logs(d)
            rows += [{**x, "nets": nets[t]} for x in r["rows"]]
    if NETS["ccbridge"] not in nets["ccbridge"]:
        raise RuntimeError(f"NCCL's log does not show the ccbridge plugin in use (networks: {nets['ccbridge']})")
    compare_losses(rows)
    return {"nranks": nproc, "rows": rows, "nets": nets}


# ---- the cipher alone ----

def cipher(size_list: list[int], iters: int = 20, device: str = "cuda") -> Result:
    """GB/s of the GPU kernels: encrypt, verify+decrypt, and a fused reduce-scatter hop (decrypt + add +
    encrypt) over random float32 data, as a Result of kind cipher (benchrows.cipher_result)."""
    stamp, t0 = envmod.stamp(), time.perf_counter()
    c = gcm.GpuCipher(os.urandom(32), device)
    dev = c.device
    ident = gcm.Ident(os.urandom(8), os.urandom(32))
    ident2 = gcm.Ident(os.urandom(8), os.urandom(32))
    fail = torch.zeros(1, dtype=torch.int32, device=dev)
    rows = []
    for n in size_list:
        x = torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev)
        w = torch.empty(gcm.wire_len(n), dtype=torch.uint8, device=dev)
        w2 = torch.empty_like(w)
        y = torch.empty_like(x)
        ops = {"encrypt": lambda: c.encrypt(ident, x, w),
               "decrypt": lambda: c.decrypt(ident, w, y, fail),
               "reduce_hop": lambda: c.reduce("float32", ident, w, x, fail, ident_out=ident2, wire_out=w2)}
        row = {"size": n, "chunk": gcm.chunk_for(n)}
        for name, fn in ops.items():
            fn()
            ms = gpu_time_ms(torch, fn, 1, iters)[0]
            row[name] = n / (ms / 1e3) / 1e9
        if int(fail.item()):
            raise RuntimeError("cipher bench: a verification failed on untampered data")
        rows.append(row)
    res = benchrows.cipher_result({"device": torch.cuda.get_device_name(dev), "rows": rows}, stamp, iters)
    res.duration_s = round(time.perf_counter() - t0, 2)
    return res
