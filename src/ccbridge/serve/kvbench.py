"""A prefix-reuse churn workload on a real transformer: what a reuse-aware host KV tier costs and saves.

D distinct shared prefixes of P tokens; a seeded stream of requests, each one
prefix (drawn Zipf-like: prefix i with weight 1/(i+1)^s) plus a short unique
suffix, generating one token (warm time to first token is the metric). After
each of them come C churn requests (--churn, default 3 as the published
setup): one-off prompts of P + suffix tokens that nobody asks for again, as a
busy server's other traffic. The KV of a request lives in a
ccbridge.serve.KVCache whose device pool holds about a third of the distinct
prefixes (--gpu-fraction), so blocks are evicted, spilled to the host tier
when the store threshold allows (looked up at least N times) and restored
from it. The host tier holds the shared prefixes twice over (HOST_FRACTION):
one-off blocks spilled into it compete with them. Two warm-up passes over
every prefix (with their churn) come first: the timed window is the steady
state in which each shared prefix has been seen reused.

One request:
  lookup(tokens)        chained block hashes; the cached prefix of the chain is pinned
  restore(hits)         host-tier hits cross in, batched (one H2D per staging batch)
  allocate(lookup)      device slots for the misses (may evict; evicted blocks spill or drop)
  prefill               only the uncached tokens, the hits' KV as a transformers DynamicCache
  first token           greedy, read to the host: TTFT ends here
  store                 the misses' KV written into their slots, commit, release

Scheduling: `async` issues restores and spills the way KVCache does (restore
H2D on an idle prep stream the compute stream waits for with an event; spill
D2H on its DrainWorker, off this thread). `sync` waits for each crossing
before going on: torch.cuda.synchronize() after a restore and cache.flush()
(every spill landed in the host tier) after allocate. KVCache has no knob of
its own for this; on the CPU both modes run the same copies, sync only waits
for the drain thread.

Correctness: the first token of a checked request must be the one a full
prefill of its tokens without any cache gives. On bf16 two paths may order a
near tie differently, so a different token counts as a mismatch only when
the reference's logits for the two tokens differ by more than TIE_TOL of the
largest logit; near ties are counted apart.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ccbridge import choices, env
from ccbridge.errors import UsageError
from ccbridge.results import Result, Row
from ccbridge.serve import KVCache, decode
from ccbridge.serve.judge import TIE_TOL
from ccbridge.serve.stepper import Stepper, transformers
from ccbridge.ui import approx_bytes

MODES = choices.KV_MODES  # (in choices, which the CLI reads without importing torch)
BLOCK_TOKENS = 16

DEFAULTS = dict(suffix_len=32, zipf=1.0, gpu_fraction=1 / 3, thresholds=(1, 2, 3), modes=MODES, warmup=2, iters=1,
                check_every=8, churn=3)
# On CUDA the published setup's shape: Qwen2.5-3B, a 1.1 GiB prefix per request (31744 tokens x 36 KiB), churn 3;
# 4 prefixes and 12 timed requests keep a run to a few minutes on an H100 (with 1B-model, 1024-token prefixes a
# miss recomputes in a few ms and no threshold moves TTFT much: H100, 2026-11-22). On the CPU, a small shape.
DEVICE_DEFAULTS = {"cuda": dict(model="qwen2.5-3b", prefixes=4, prefix_len=31744, requests=12),
                   "cpu": dict(model="llama-1b", prefixes=8, prefix_len=64, requests=64)}
HOST_FRACTION = 2.0  # host tier blocks: the shared prefixes' blocks twice over (plus one request's)
CHURN = -1  # a stream entry's prefix index for a churn request
MAX_COUNT, MAX_CHURN, MAX_BLOCKS = 100_000, 100, 10_000_000  # bounds of a run that can finish (and fit a host)


@dataclass
class Workload:
    prefixes: list[list[int]]
    stream: list[tuple[int, list[int]]]   # (prefix index or CHURN, full tokens), passes concatenated
    warm: list[list[int]]                  # the warm-up requests: every prefix once per pass, each with its churn


def workload(vocab: int, prefixes: int, prefix_len: int, suffix_len: int, requests: int, zipf: float,
             seed: int = 0, warmup: int = 1, iters: int = 1, churn: int = 0) -> Workload:
    """Seeded prefixes, warm-up passes over them and iters passes of requests (each suffix drawn afresh),
    each request followed by churn one-off requests of the same length."""
    g = torch.Generator().manual_seed(seed)
    pre = [torch.randint(0, vocab, (prefix_len,), generator=g).tolist() for _ in range(prefixes)]
    # exp(-s log(i+1)) rather than 1/(i+1)^s: a large s underflows to 0 (prefix 0 only) instead of overflowing
    weights = torch.tensor([math.exp(-zipf * math.log(i + 1)) for i in range(prefixes)], dtype=torch.float64)

    def suffix() -> list[int]:
        return torch.randint(0, vocab, (suffix_len,), generator=g).tolist()

    def one_off() -> list[int]:
        return torch.randint(0, vocab, (prefix_len + suffix_len,), generator=g).tolist()

    warm = [t for _ in range(warmup) for p in pre for t in [p + suffix()] + [one_off() for _ in range(churn)]]
    stream = []
    for _ in range(iters):
        for i in torch.multinomial(weights, requests, replacement=True, generator=g).tolist():
            stream.append((i, pre[i] + suffix()))
            stream += [(CHURN, one_off()) for _ in range(churn)]
    return Workload(pre, stream, warm)


def device_budget(prefixes: int, prefix_len: int, suffix_len: int, gpu_fraction: float | None,
                  device_blocks: int | None, block_tokens: int = BLOCK_TOKENS) -> int:
    """Device blocks: given, or gpu_fraction of the distinct prefixes' blocks; never below one request's blocks."""
    need = (prefix_len + suffix_len) // block_tokens
    if device_blocks is None:
        device_blocks = max(need, math.ceil(gpu_fraction * prefixes * (prefix_len // block_tokens)))
    if device_blocks < need:
        raise UsageError(f"--device-blocks {device_blocks}: one request holds {need} blocks of {block_tokens} "
                         f"tokens ({prefix_len} + {suffix_len} tokens); give at least {need}")
    return device_blocks


def check(model: str, prefixes: int, prefix_len: int, suffix_len: int, requests: int, thresholds: list[int],
          modes: list[str], device: str, zipf: float = 1.0, gpu_fraction: float | None = None,
          device_blocks: int | None = None, churn: int = 0) -> torch.device:
    """Every argument checked before a model is built; the torch device to run on."""
    if model not in decode.PRESETS:
        raise UsageError(f"unknown model {model!r} (one of {', '.join(decode.PRESETS)})")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise UsageError(f"--modes {bad[0]}: bench kv schedules {' or '.join(MODES)}")
    if not modes or not thresholds or min(thresholds) < 1:
        raise UsageError("give at least one mode and thresholds of at least 1")
    if not (1 <= prefixes <= MAX_COUNT and 1 <= requests <= MAX_COUNT and suffix_len >= 1):
        raise UsageError(f"--prefixes and --requests must be 1 to {MAX_COUNT}, --suffix-len at least 1")
    if not 0 <= churn <= MAX_CHURN:
        raise UsageError(f"--churn {churn}: one-off requests per request must be 0 to {MAX_CHURN}")
    if device_blocks is not None and device_blocks > MAX_BLOCKS:
        raise UsageError(f"--device-blocks {device_blocks}: at most {MAX_BLOCKS}")
    if prefix_len < BLOCK_TOKENS:
        raise UsageError(f"--prefix-len {prefix_len}: shorter than one KV block ({BLOCK_TOKENS} tokens), "
                         "nothing could be reused")
    if not (zipf >= 0 and math.isfinite(zipf)):
        raise UsageError(f"--zipf {zipf}: the exponent must be a finite number >= 0 (0: uniform)")
    if gpu_fraction is not None and device_blocks is not None:
        raise UsageError("give --gpu-fraction or --device-blocks, not both")
    if gpu_fraction is not None and not (0 < gpu_fraction <= 1):
        raise UsageError(f"--gpu-fraction {gpu_fraction}: expected a fraction in (0, 1]")
    limit = decode.PRESETS[model]["max_position_embeddings"]
    if prefix_len + suffix_len > limit:
        raise UsageError(f"--prefix-len + --suffix-len = {prefix_len + suffix_len} tokens, {model} holds {limit}")
    device_budget(prefixes, prefix_len, suffix_len, DEFAULTS["gpu_fraction"] if gpu_fraction is None else gpu_fraction,
                  device_blocks)
    return decode.check(model, [1], prefix_len + suffix_len - 1, 2, ["sync"], device, False)


def _layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a transformers cache, (1, heads, tokens, head_dim) each."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))  # transformers < 4.56


class Server:
    """One model and one KVCache: serve(tokens) runs a request, returns (token, ttft_s, total_s)."""

    def __init__(self, model, kv, mode: str):
        self.model, self.kv, self.mode = model, kv, mode
        self.dev = next(model.parameters()).device
        self.cuda = self.dev.type == "cuda"
        self.st = Stepper(model)
        self.tf = transformers()

    def _sync_crossings(self, spills: bool) -> None:
        if self.mode != "sync":
            return
        if spills:
            self.kv.flush()  # every spill issued so far has landed in the host tier
        elif self.cuda:
            torch.cuda.synchronize(self.dev)  # the restore's H2D (and the scatter after it) done

    @torch.no_grad()
    def serve(self, tokens: list[int]) -> tuple[int, float, float]:
        kv, bt = self.kv, self.kv.block_tokens
        t0 = time.perf_counter()
        lk = kv.lookup(tokens)
        self.split = (len(lk.device), len(lk.host), len(lk.misses))  # this request's blocks, by where they were
        try:
            hits = lk.hits
            if len(hits) * bt >= len(tokens):  # the whole prompt is cached: recompute its last block for logits
                hits = hits[:-1]
            ids = kv.restore(hits) if hits else []
            self._sync_crossings(spills=False)
            slots = kv.allocate(lk)
            self._sync_crossings(spills=True)
            past = self.tf.DynamicCache()
            start = len(hits) * bt
            if ids:
                # a gather by Python ints: an index tensor would be one more H2D crossing per request
                blocks = torch.stack([kv.device_pool[i] for i in ids])   # (n, L, 2, H, bt, D)
                n, L, _, H, _, D = blocks.shape
                kvs = blocks.permute(1, 2, 3, 0, 4, 5).reshape(L, 2, H, n * bt, D)
                for layer in range(L):
                    past.update(kvs[layer, 0][None], kvs[layer, 1][None], layer)
            new = torch.tensor([tokens[start:]], device=self.dev)
            pos = torch.arange(start, len(tokens), device=self.dev)
            kw = {"cache_position": pos} if self.st.cache_position else {}
            out = self.model(input_ids=new, position_ids=pos[None], past_key_values=past, use_cache=True,
                             **kw, **self.st.keep)
            tok = int(out.logits[0, -1].argmax())
            ttft = time.perf_counter() - t0
            if slots:
                layers = _layers(out.past_key_values)
                full = torch.stack([torch.stack([k[0], v[0]]) for k, v in layers])  # (L, 2, H, tokens, D)
                first = len(lk.hashes) - len(lk.misses)
                L, _, H, _, D = full.shape
                part = full[:, :, :, first * bt:(first + len(slots)) * bt].reshape(L, 2, H, len(slots), bt, D)
                torch._foreach_copy_([kv.device_pool[i] for i in slots],
                                     list(part.permute(3, 0, 1, 2, 4, 5).to(kv.dtype).unbind(0)))
            kv.commit(lk)
        finally:
            kv.release(lk)
        return tok, ttft, time.perf_counter() - t0


@torch.no_grad()
def reference(model, tokens: list[int]) -> torch.Tensor:
    """The last position's logits of a full prefill without any cache (float32, on the host)."""
    dev = next(model.parameters()).device
    st = Stepper(model)
    out = model(input_ids=torch.tensor([tokens], device=dev), use_cache=False, **st.keep)
    return out.logits[0, -1].float().cpu()


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def bench(model: str | None = None, prefixes: int | None = None, prefix_len: int | None = None,
          suffix_len: int | None = None, requests: int | None = None, thresholds: list[int] | None = None,
          modes: list[str] | None = None, device: str = "cuda", zipf: float | None = None,
          gpu_fraction: float | None = None, device_blocks: int | None = None, seed: int = 0,
          warmup: int | None = None, iters: int | None = None, check_every: int | None = None,
          churn: int | None = None, log: Callable[[str], None] = lambda _: None, _model=None):
    """Every (threshold, mode) on a fresh KVCache: the warm-up passes, then the timed stream; a Result.

    Rows per (threshold, mode): kv:ttft_ms (median = p50, extra p99), kv:request_ms (lookup to stored),
    kv:spill_bytes, kv:restore_bytes, kv:device_hit_rate, kv:host_hit_rate, kv:miss_rate (of the blocks the
    timed requests looked up; counters of the warm-up pass excluded). Every check_every-th timed request's
    first token is compared with a full prefill's; each config with a mismatch adds an entry to errors."""
    d = {**DEFAULTS, **DEVICE_DEFAULTS["cuda" if str(device).split(":")[0] == "cuda" else "cpu"]}
    model = d["model"] if model is None else model
    prefixes = d["prefixes"] if prefixes is None else prefixes
    suffix_len = d["suffix_len"] if suffix_len is None else suffix_len
    requests = d["requests"] if requests is None else requests
    thresholds = list(d["thresholds"] if thresholds is None else thresholds)
    modes = list(d["modes"] if modes is None else modes)
    zipf = d["zipf"] if zipf is None else zipf
    warmup = d["warmup"] if warmup is None else warmup
    iters = d["iters"] if iters is None else iters
    check_every = d["check_every"] if check_every is None else check_every
    churn = d["churn"] if churn is None else churn
    prefix_len = d["prefix_len"] if prefix_len is None else prefix_len
    dev = check(model, prefixes, prefix_len, suffix_len, requests, thresholds, modes, device, zipf, gpu_fraction,
                device_blocks, churn)
    blocks = device_budget(prefixes, prefix_len, suffix_len,
                           d["gpu_fraction"] if gpu_fraction is None else gpu_fraction, device_blocks)
    stamp = env.stamp()
    t_start = time.monotonic()
    if _model is None:
        log(f"building {model} (random weights, seed {seed}) on {dev}")
        _model = decode.build(model, dev, seed)
    m = _model
    cfg = m.config
    heads = cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dtype = next(m.parameters()).dtype
    shape = (cfg.num_hidden_layers, 2, heads, BLOCK_TOKENS, head_dim)
    wl = workload(cfg.vocab_size, prefixes, prefix_len, suffix_len, requests, zipf, seed, warmup, iters, churn)
    per_req = (prefix_len + suffix_len) // BLOCK_TOKENS
    host_blocks = math.ceil(HOST_FRACTION * prefixes * (prefix_len // BLOCK_TOKENS)) + per_req
    measured = [i for i, (p, _) in enumerate(wl.stream) if p != CHURN]
    checked = [i for n, i in enumerate(measured) if check_every and n % check_every == 0]
    log(f"reference prefills (no cache) of {len(checked)} of {len(measured)} requests")
    with decode.deterministic_attention(), decode.quiet_cache_rename():
        refs = {i: reference(m, wl.stream[i][1]) for i in checked}
    tol = TIE_TOL.get(dtype, 2e-2)
    block_bytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    settings = {"kv": {"model": model, "device": str(dev), "dtype": str(dtype).split(".")[-1], "prefixes": prefixes,
                       "prefix_len": prefix_len, "suffix_len": suffix_len, "requests": requests, "zipf": zipf,
                       "churn": churn, "host_fraction": HOST_FRACTION,
                       "block_tokens": BLOCK_TOKENS, "block_bytes": block_bytes, "device_blocks": blocks,
                       "host_blocks": host_blocks, "gpu_fraction": blocks / (prefixes * (prefix_len // BLOCK_TOKENS)),
                       "thresholds": thresholds, "modes": modes, "warmup": warmup, "iters": iters, "seed": seed,
                       "checked": len(checked), "transformers": transformers().__version__,
                       "cudnn_attention": False}}
    res = Result(kind="kv", env=stamp, settings=settings)
    threads = torch.get_num_threads()
    if dev.type == "cpu":  # the drain thread's copies beside a multi-threaded forward make OpenMP spin (100s of ms)
        torch.set_num_threads(1)
        settings["kv"]["cpu_threads"] = 1
    try:
        with decode.deterministic_attention(), decode.quiet_cache_rename():
            _sweep(res, m, wl, refs, shape, dtype, blocks, host_blocks, thresholds, modes, tol, model, log)
    finally:
        torch.set_num_threads(threads)
    res.duration_s = time.monotonic() - t_start
    return res


PROGRESS_S = 10.0  # a progress line at most this often during a pass (a long pass says where it is)


class _Every:
    """Calls log(text) when PROGRESS_S has passed since the last line (outside the timed section's cost)."""

    def __init__(self, log: Callable[[str], None], period: float):
        self.log, self.period, self.last = log, period, time.monotonic()

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if now - self.last >= self.period:
            self.log(text)
            self.last = now


def _sweep(res, m, wl, refs, shape, dtype, blocks, host_blocks, thresholds, modes, tol, model, log) -> None:
    dev = next(m.parameters()).device
    checked = sorted(refs)
    for th in thresholds:
        for mode in modes:
            timed = sum(p != CHURN for p, _ in wl.stream)
            log(f"threshold {th}, {mode}: {len(wl.warm)} warm-up + {len(wl.stream)} requests served, "
                f"{timed} of them timed (the rest churn)")
            with KVCache(shape, dtype, device_blocks=blocks, host_blocks=host_blocks, block_tokens=BLOCK_TOKENS,
                         device=dev, threshold=th) as kv:
                srv = Server(m, kv, mode)
                every = _Every(log, PROGRESS_S)
                for n, toks in enumerate(wl.warm):
                    srv.serve(toks)
                    every(f"threshold {th}, {mode}: warm-up {n + 1}/{len(wl.warm)}")
                kv.flush()
                before = kv.stats()
                ttft, total, bad, ties = [], [], [], 0
                split = [0, 0, 0]  # the measured requests' blocks: device hits, host hits, misses
                for i, (p, toks) in enumerate(wl.stream):
                    tok, t1, t2 = srv.serve(toks)
                    every(f"threshold {th}, {mode}: served {i + 1}/{len(wl.stream)}")
                    if p == CHURN:  # served for its traffic; neither timed nor checked
                        continue
                    split = [a + b for a, b in zip(split, srv.split)]
                    ttft.append(t1 * 1e3)
                    total.append(t2 * 1e3)
                    if i in refs and tok != int(refs[i].argmax()):
                        lg = refs[i]
                        if float(lg.max() - lg[tok]) <= tol * float(lg.abs().max()):
                            ties += 1
                        else:
                            bad.append(i)
                kv.flush()
                after = kv.stats()
            # the lookups of the measured requests; crossings and drops of the whole window, churn included
            c = dict(zip(("device_hits", "host_hits", "misses"), split), blocks_looked_up=sum(split))
            c |= {k: after[k] - before[k] for k in ("spill_bytes", "spilled_blocks", "spill_crossings",
                                                    "restore_bytes", "restored_blocks", "restore_crossings",
                                                    "dropped_threshold", "dropped_host_full", "host_evictions")}
            n = max(1, c["blocks_looked_up"])
            params = dict(model=model, threshold=th, mode=mode)
            extra = {"p50": None, "p99": _pct(ttft, 0.99), "checked": len(checked), "mismatches": len(bad),
                     "near_ties": ties, **c}
            res.rows.append(Row.of("kv", "ttft_ms", "ms", ttft, **params))
            res.rows[-1].extra = extra
            extra["p50"] = res.rows[-1].median  # the row's median (nearest-rank p99 beside it)
            res.rows.append(Row.of("kv", "request_ms", "ms", total, **params))
            res.rows.append(Row.of("kv", "spill_bytes", "B", [c["spill_bytes"]], **params))
            res.rows.append(Row.of("kv", "restore_bytes", "B", [c["restore_bytes"]], **params))
            for name, v, unit in (("device_hit_rate", c["device_hits"], "hit fraction"),
                                  ("host_hit_rate", c["host_hits"], "hit fraction"),
                                  ("miss_rate", c["misses"], "fraction")):  # compare: more hits, fewer misses
                res.rows.append(Row.of("kv", name, unit, [v / n], **params))
            if bad:
                res.errors.append({"test": "kv", "error": f"threshold {th}, {mode}: the first token differs from a "
                                   f"full prefill's in {len(bad)} of {len(checked)} checked requests (first: request "
                                   f"{bad[0]})"})


def _churn_words(s: dict) -> str:
    c = s.get("churn", 0)
    return (f", each followed by {c} one-off request{'s' if c > 1 else ''} of {s['prefix_len'] + s['suffix_len']} "
            "tokens (churn, not timed)") if c else ""


def render(res) -> str:
    """A table: one line per (threshold, mode)."""
    s = res.settings["kv"]
    head = (f"# ccbridge bench kv: {s['model']} (random weights), {s['dtype']} on {s['device']}; {s['prefixes']} "
            f"prefixes of {s['prefix_len']} tokens, Zipf s={s['zipf']:g}, {s['requests']} requests x {s['iters']} "
            f"(+{s['prefixes'] * s['warmup']} warm-up) with {s['suffix_len']}-token unique suffixes, 1 token each"
            f"{_churn_words(s)}\n"
            f"# KV blocks of {s['block_tokens']} tokens ({approx_bytes(s['block_bytes'])}): {s['device_blocks']} on the "
            f"device ({s['gpu_fraction']:.0%} of the prefixes' blocks), {s['host_blocks']} on the host; first tokens "
            f"of {s['checked']} request{'s' if s['checked'] != 1 else ''} checked against a full prefill")
    if banner := env.emulated_banner(res.env.get("emulation", {})):  # EMULATED, or a projected CC-off run
        head += f"\n# {banner}"
    lines = [head, f"{'thresh':>6} {'mode':<5} {'TTFT50 ms':>9} {'p99 ms':>8} {'req ms':>8} {'spill D2H':>10} "
                   f"{'restore H2D':>11} {'dev hit':>7} {'host hit':>8} {'miss':>6}  tokens"]
    rows = {(r.params["threshold"], r.params["mode"], r.metric): r for r in res.rows}
    for r in res.rows:
        if r.metric != "ttft_ms":
            continue
        k = (r.params["threshold"], r.params["mode"])
        g = {m: rows[(*k, m)].median for m in ("request_ms", "spill_bytes", "restore_bytes", "device_hit_rate",
                                               "host_hit_rate", "miss_rate")}
        e = r.extra
        ok = "same" if not e["mismatches"] else f"{e['mismatches']} DIFFER"
        if e["near_ties"]:
            ok += f" ({e['near_ties']} near ties)"
        lines.append(f"{k[0]:>6} {k[1]:<5} {r.median:>9.2f} {e['p99']:>8.2f} {g['request_ms']:>8.2f} "
                     f"{approx_bytes(g['spill_bytes']):>10} {approx_bytes(g['restore_bytes']):>11} {g['device_hit_rate']:>7.1%} "
                     f"{g['host_hit_rate']:>8.1%} {g['miss_rate']:>6.1%}  {ok}")
    return "\n".join(lines)
