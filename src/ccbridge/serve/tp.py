"""Tensor-parallel decode: decode.py's bench with the model split over N ranks, one process per GPU.

Why: confidential AI serves tensor-parallel across a multi-GPU tenant, and under CC every cross-GPU
operation pays a fixed toll (bridge law, section 6: +10-15 us on B300). Tensor parallelism pays it twice
per layer per token, so a narrower split keeps more. This bench measures tok/s per degree and batch,
natively or under the emulator (`ccbridge run --profile b300 -- ccbridge bench decode --tp 2 ...`: the
interposer is LD_PRELOADed through the environment, which the spawned ranks inherit).

The split (Megatron-style, on the Hugging Face Llama/Qwen2 modules in place, see shard()): every rank
builds the same full model (decode.build(), same seed), then keeps its share. q/k/v and gate/up are
column-parallel (a contiguous block of whole heads, of kv heads, of the MLP's intermediate features);
o_proj and down_proj are row-parallel, each followed by one all-reduce of its output: exactly two
all-reduces per layer per step. Embeddings, norms and lm_head stay replicated (the simplest split: the
logits, hence the greedy token, are computed whole on every rank from the same all-reduced hidden state),
so TP=1 and TP=N compute the same function up to the order of the sums.

Ranks: one process each, started by ccbridge.ranks, rank r on cuda:r over NCCL (gloo ranks in float32 on
--device cpu, so CI tests TP=2 without a GPU), meeting at 127.0.0.1 on a free port. --tp 1 runs the same
code (a one-rank group, its all-reduces NCCL's too) so one GPU tests the path; natively it measures what
the single-GPU bench does, but under an emulator profile its one-rank all-reduces are charged the
per-operation toll as every NCCL operation is (the cost of the split's code, not of one GPU). Each (batch, mode) runs as
decode.bench runs it (decode.measure: warm-up, then timed runs traced alone under `ccbridge run
--record`), in every rank at once; the four modes schedule each rank's own host work as decode() does.
With --graphs each step's CUDA graph holds its all-reduces (NCCL ops are captured as any kernel is).

Tokens: after each run every rank takes rank 0's tokens (a broadcast, outside the timing) and the group
counts those that differed (a rank that sampled otherwise is an error: the split must not change the
token a rank sees). Every run is judged with decode's near-tie logic (decode._Judge, the forwards on the
split model, every rank in step) against one reference per batch: the first run of the first mode of the
smallest degree (TP=1 when run), or the tokens the caller gives (bench(reference=...)). Rank 0 builds each
(batch, mode)'s rows and hands them to this process, which keeps them in a Result; an error in a rank is
one line here (its class kept when it is ccbridge's), a rank that dies fails the bench, and a group that
says nothing for STALL_S is stopped rather than waited for.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ccbridge import ranks
from ccbridge.emulate import trace as emu_trace
from ccbridge.errors import GpuError, UsageError
from ccbridge.serve import decode

TEST = "decode_tp"  # rows' test name: not decode's, whose readers (advise) key its rows by batch and mode alone
MAX_CPU_RANKS = 4  # gloo ranks on --device cpu: enough to test a split, few enough for a CI runner
STALL_S = 600.0  # no word from any rank this long: stuck (a build of llama-8b or one (batch, mode) takes far less)
_SPLIT = (("num_attention_heads", "attention heads"), ("num_key_value_heads", "key-value heads"),
          ("intermediate_size", "MLP intermediate features"))


def _divides(name: str, counts: dict, n: int) -> None:
    for key, what in _SPLIT:
        if counts[key] % n:
            raise UsageError(f"--tp {n}: {name} has {counts[key]} {what}, which {n} ranks cannot split evenly")


def check(model: str, degrees: list[int], device: str) -> None:
    """The degrees for this model and device, before any GPU is looked for (bench() counts the GPUs after
    decode.check has found CUDA)."""
    dev = torch.device(device)
    if not degrees or min(degrees) < 1:
        raise UsageError("--tp degrees must be at least 1")
    twice = [n for i, n in enumerate(degrees) if n in degrees[:i]]
    if twice:
        raise UsageError(f"--tp {twice[0]} is given twice")
    if dev.type == "cuda" and dev.index is not None:
        raise UsageError(f"--device {device}: --tp puts rank r on cuda:r; give --device cuda "
                         "(CUDA_VISIBLE_DEVICES chooses the GPUs)")
    if dev.type == "cpu" and max(degrees) > MAX_CPU_RANKS:
        raise UsageError(f"--tp {max(degrees)}: at most {MAX_CPU_RANKS} ranks on --device cpu")
    for n in sorted(degrees) if model in decode.PRESETS else ():  # an unknown model: decode.check names it
        _divides(model, decode.PRESETS[model], n)


class RowParallel(torch.nn.Module):
    """A row-parallel Linear: this rank's block of input features (its heads' or MLP features' outputs, as
    the column-parallel layers before it left them) times the matching block of the weight, summed over the
    ranks by one all-reduce; the bias, whole, added once after the sum."""

    def __init__(self, lin: torch.nn.Linear, rank: int, n: int):
        super().__init__()
        k = lin.in_features // n
        self.weight = torch.nn.Parameter(lin.weight.detach()[:, rank * k:(rank + 1) * k].contiguous(),
                                         requires_grad=False)
        self.bias = lin.bias
        self.in_features, self.out_features = k, lin.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)
        dist.all_reduce(out)
        return out if self.bias is None else out + self.bias


def _keep_outputs(lin: torch.nn.Linear, rank: int, n: int) -> None:
    """Column-parallel, in place: this rank's contiguous block of output features (and of the bias)."""
    k = lin.out_features // n
    part = slice(rank * k, (rank + 1) * k)
    lin.weight = torch.nn.Parameter(lin.weight.detach()[part].clone(), requires_grad=False)
    if lin.bias is not None:
        lin.bias = torch.nn.Parameter(lin.bias.detach()[part].clone(), requires_grad=False)
    lin.out_features = k


_ATTN, _MLP = ("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")


def shard(model, rank: int, n: int):
    """Split a transformers Llama/Qwen2 causal LM in place for rank `rank` of n; returns it.

    Contiguous blocks keep grouped-query attention intact: rank r's query heads [rH/n, (r+1)H/n) read kv
    heads [rK/n, (r+1)K/n), the same kv heads the whole model pairs them with (H/K queries per kv head). The
    installed transformers reshapes by -1 heads; older ones keep num_heads, num_key_value_heads and
    hidden_size on the attention module and size a StaticCache from the config's kv heads, so those are
    set to this rank's share too (the config then describes the rank's shard, with head_dim pinned)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers or not all(all(hasattr(getattr(layer, "self_attn", None), p) for p in _ATTN)
                             and all(hasattr(getattr(layer, "mlp", None), p) for p in _MLP) for layer in layers):
        raise UsageError("--tp splits Llama/Qwen2-shaped layers (self_attn.q/k/v/o_proj, mlp.gate/up/down_proj)")
    cfg = model.config
    _divides(cfg.model_type, {key: getattr(cfg, key) for key, _ in _SPLIT}, n)
    head_dim = layers[0].self_attn.head_dim
    for layer in layers:
        att, mlp = layer.self_attn, layer.mlp
        for lin in (att.q_proj, att.k_proj, att.v_proj, mlp.gate_proj, mlp.up_proj):
            _keep_outputs(lin, rank, n)
        att.o_proj, mlp.down_proj = RowParallel(att.o_proj, rank, n), RowParallel(mlp.down_proj, rank, n)
        for attr in ("num_heads", "num_key_value_heads", "hidden_size"):
            if isinstance(getattr(att, attr, None), int):
                setattr(att, attr, getattr(att, attr) // n)
    cfg.head_dim = head_dim
    for key, _ in _SPLIT:
        setattr(cfg, key, getattr(cfg, key) // n)
    return model


def run_ranks(n: int, target: Callable, *args, device: str = "cpu", on_message: Callable = lambda rank, obj: None,
              stall_s: float = STALL_S) -> list:
    """target(rank, n, dev, send, *args) on n tensor-parallel ranks started by ccbridge.ranks: rank r on cuda:r over
    NCCL, or gloo ranks on the CPU, meeting at a free port; their return values, by rank. send(obj) in a rank calls
    on_message(rank, obj) here. A rank's failure is one line (its class kept when it is ccbridge's, else a
    GpuError); ranks that say nothing for stall_s seconds are stopped."""
    cuda = torch.device(device).type == "cuda"
    return ranks.run(n, target, *args, label="tensor-parallel", backend="nccl" if cuda else "gloo",
                     devices=list(range(n)) if cuda else None, on_message=on_message, stall_s=stall_s)


def _agree(runs: list, dev) -> int:
    """Every rank takes rank 0's tokens of each run; the tokens that differed from them, over all ranks."""
    differ = 0
    for r in runs:
        t = r.tokens.to(dev)
        dist.broadcast(t, src=0)
        mine, r.tokens = r.tokens, t.cpu()
        differ += int((mine != r.tokens).sum())
    total = torch.tensor([differ], dtype=torch.int64, device=dev)
    dist.all_reduce(total)
    return int(total)


@torch.no_grad()
def _bench_rank(rank: int, n: int, dev, send, job: dict) -> None:
    """One rank of one degree: build, shard, then every (batch, mode) as decode.bench runs it, in step with
    the other ranks; rank 0 sends each (batch, mode)'s rows, errors and first run's tokens."""
    say = send if rank == 0 else (lambda _: None)
    model, prompt, output, warmup, iters = job["model"], job["prompt"], job["output"], job["warmup"], job["iters"]
    with emu_trace.paused(required=False) as recording:  # only the timed runs are traced (decode.measure)
        say(("log", f"tp {n}: building {model} (random weights, seed {job['seed']}) on each rank, rank 0 on {dev}"))
        m = shard(decode.build(model, dev, job["seed"]), rank, n)
        with decode.deterministic_attention(), decode.quiet_cache_rename():
            for b in job["batches"]:
                ids = decode.prompts(decode.PRESETS[model]["vocab_size"], b, prompt, job["seed"])
                judge = decode._Judge(m, ids)
                want = job["refs"].get(b)
                want = None if want is None else (want[0], torch.tensor(want[1], dtype=torch.int64))
                for mode in job["modes"]:
                    what = f"tp {n}, batch {b}, mode {mode}"
                    say(("log", f"{what}: {warmup} warm-up + {iters} timed runs{decode._memory(dev)}"))
                    try:
                        runs = decode.measure(m, ids, output, mode, warmup, iters, recording, graphs=job["graphs"],
                                              host_prep_us=job["host_prep_us"])
                    except torch.OutOfMemoryError as e:  # the parent keeps the rows so far and says where
                        send(("oom", f"{what}: {str(e).split('. ')[0]}{decode._memory(dev)}"))
                        raise
                    differ = _agree(runs, dev)
                    if want is None:
                        want = (f"tp {n} {mode}", runs[0].tokens)
                    bad, ties = decode.verdict(judge, want, runs, what)
                    if rank:
                        continue
                    extra = {"tokens_match": bad is None, "near_ties": len(ties), "ranks_agree": differ == 0,
                             "reference": want[0]}
                    wrong = [bad] if bad else []
                    if differ:
                        wrong.append(f"{what}: the ranks sampled different tokens ({differ} differ from rank 0's)")
                    send(("rows", {"batch": b, "mode": mode, "errors": wrong, "tokens": runs[0].tokens.tolist(),
                                   "rows": decode.rows_of(TEST, runs[warmup:], output, extra, model=model, tp=n,
                                                          batch=b, mode=mode, graphs=job["graphs"])}))


def bench(model: str, degrees: list[int], batches: list[int], prompt: int, output: int, modes: list[str],
          device: str = "cuda", iters: int = 3, warmup: int = 1, graphs: bool = False, seed: int = 0,
          log: Callable[[str], None] = lambda _: None, host_prep_us: float = 0.0,
          reference: dict[int, torch.Tensor] | None = None):
    """Every degree (ascending), batch and mode: a Result of decode_tp rows tok_per_s, step_ms, token_gap_ms
    (params model, tp, batch, mode, graphs; tok_per_s's extra: tokens_match, near_ties, ranks_agree, the
    reference's label, gpu_busy and the crossing counts, as decode's). reference: {batch: (batch, output)
    tokens} to judge every run against (e.g. decode.decode's on one GPU) instead of the smallest degree's.
    A degree that runs out of memory keeps its rows so far, says where in Result.errors, and the next
    degree runs; any other rank failure raises."""
    from ccbridge import env
    from ccbridge.results import Result

    check(model, degrees, device)
    dev = decode.check(model, batches, prompt, output, modes, device, graphs)
    if dev.type == "cuda" and max(degrees) > torch.cuda.device_count():
        raise UsageError(f"--tp {max(degrees)}: one process per GPU, and torch sees {torch.cuda.device_count()} GPU(s)")
    decode.check_host_prep(host_prep_us)
    stamp = env.stamp()
    t_start = time.monotonic()
    layers = decode.PRESETS[model]["num_hidden_layers"]
    settings = decode.settings_of(model, dev, decode.dtype_for(dev), prompt, output, batches, modes, iters, warmup,
                                  graphs, seed, host_prep_us)
    settings.update(degrees=sorted(degrees), backend="nccl" if dev.type == "cuda" else "gloo",
                    all_reduces_per_step=2 * layers, replicated="embeddings, norms, lm_head",
                    reference="given" if reference else "smallest degree's first mode")
    res = Result(env=stamp, settings={"decode_tp": settings})
    refs = {b: ("the given reference", t.tolist()) for b, t in (reference or {}).items()}
    for n in sorted(degrees):
        got, oom = [], []

        def on_message(rank, msg):
            kind, body = msg
            if kind == "log":
                log(body)
            elif kind == "oom":
                oom.append(body)
            else:
                got.append(body)

        job = dict(model=model, batches=list(batches), prompt=prompt, output=output, modes=list(modes), iters=iters,
                   warmup=warmup, graphs=graphs, seed=seed, host_prep_us=host_prep_us, refs=dict(refs))
        try:
            run_ranks(n, _bench_rank, job, device=str(dev), on_message=on_message)
        except GpuError:
            if not oom:
                raise
            res.errors.append({"test": TEST, "error": f"{oom[0]}; the larger batches and later modes did not run "
                                                      f"at tp {n}"})
        for g in got:
            res.rows += g["rows"]
            res.errors += [{"test": TEST, "error": e} for e in g["errors"]]
            refs.setdefault(g["batch"], (f"tp {n} {g['mode']}", g["tokens"]))  # the smallest degree's first mode
    res.duration_s = time.monotonic() - t_start
    return res


def render(res) -> str:
    """A table, one line per (tp, batch, mode): tok/s, step and token-gap times, GPU busy, tok/s over TP=1's at
    that batch and mode, and the tokens' verdict against the reference."""
    s = res.settings["decode_tp"]
    where = "one process per GPU, NCCL" if s["backend"] == "nccl" else "CPU ranks, gloo"
    lines = [f"# ccbridge bench decode --tp {' '.join(map(str, s['degrees']))}: {s['model']} (random weights), "
             f"{s['dtype']} on {s['device']} ({where})",
             f"# prompt {s['prompt']}, output {s['output']}, {'CUDA graphs' if s['graphs'] else 'eager'}, "
             f"{s['iters']} timed runs; an all-reduce after each layer's attention and MLP: "
             f"{s['all_reduces_per_step']} per step",
             "# embeddings and lm_head replicated on every rank; x TP=1: tok/s over TP=1's at the same batch and mode"]
    if s.get("host_prep_us"):
        lines.append(f"# {s['host_prep_us']:g} us of host preparation per step (modelled engine work)")
    if res.emulated:
        from ccbridge import env

        lines.append(f"# {env.emulated_banner(res.env['emulation'])}")
    lines.append(f"{'tp':>3} {'batch':>6} {'mode':<7} {'tok/s':>10} {'step ms':>9} {'gap p50':>8} {'gap p90':>8} "
                 f"{'gpu busy':>8} {'x TP=1':>7}  tokens")
    by = {(r.params["tp"], r.params["batch"], r.params["mode"], r.metric): r for r in res.rows}
    for r in res.rows:
        if r.metric != "tok_per_s":
            continue
        tp, b, mode = r.params["tp"], r.params["batch"], r.params["mode"]
        st, gap = by[(tp, b, mode, "step_ms")], by[(tp, b, mode, "token_gap_ms")]
        one = by.get((1, b, mode, "tok_per_s"))
        busy = r.extra.get("gpu_busy")
        word = decode._tokens_word(r.extra) + ("" if r.extra.get("ranks_agree", True) else ", RANKS DIFFER")
        lines.append(f"{tp:>3} {b:>6} {mode:<7} {r.median:>10.1f} {st.median:>9.3f} {gap.median:>8.3f} "
                     f"{gap.p90:>8.3f} {'-' if busy is None else f'{busy:.2f}':>8} "
                     f"{'-' if one is None else f'{r.median / one.median:.2f}':>7}  {word}")
    return "\n".join(lines)
