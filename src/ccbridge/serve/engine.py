"""An engine-like decoder for the tensor-parallel bench: built directly as one rank's shard, few large kernels.

Why not transformers' modules (decode.build) split in place: (1) a 70B-class model does not fit one GPU, so
each rank must build only its shard; (2) at batch 1 an engine's per-GPU step shrinks with the weights each GPU
reads, and transformers' modules launch ~40 small kernels per layer (RMSNorm in six ops, rotary in ten,
separate q/k/v and gate/up projections), which hold the step at a few ms whatever the degree (issue 31: 7.98 ms
at TP1, 7.10 at TP4 on llama-8b). Here, as vLLM and TensorRT-LLM do: one fused QKV and one fused gate-up
projection per layer, RMSNorm as one op (F.rms_norm), rotary on q and k together, attention over a static KV
cache, and no collective at all at world size 1 (an engine skips the all-reduce there).

On a GPU each layer of a decode step runs as two compiled halves (torch.compile, inductor), split where the
all-reduces are: [residual add, RMSNorm, QKV, rotary, KV-cache write, attention, o] and [residual add, RMSNorm,
gate-up, SiLU x up, down], each compiled once for every layer (the weights are arguments, not guarded attributes),
so a residual add is fused into the norm after it and the elementwise ops into one kernel each; a decode step's
attention is two batched matmuls over each kv head's group of query heads (no kv copy per group) with the causal
mask as an additive bias; a prefill (once a request) runs eagerly, its attention by SDPA. At one sequence (batch
1) the halves' weight GEMVs are serve/gemv.py's fused Triton kernels instead of cuBLAS's split-K GEMMs: the residual
add and RMSNorm, or SiLU x up, in the GEMV's prologue, no reduce kernel (where triton is; fused=False turns it
off), each shape's tile timed on this GPU at build over the layers' own weights and cached (serve/gemv_tune.py;
CCBRIDGE_GEMV_TUNE=0: the fixed rule's tiles; gemv_tiles says which ran). One rank's llama-8b step outside its
collectives (bench/tp_step.py, one H200, 2026-11-26/27): 1264 kernels and 4.31x its HBM roofline at TP4 eagerly, 532
kernels and 2.41-2.47x compiled with cuBLAS. On the CPU (the tests) the same code runs eagerly.

The weights are random, the same function at every degree: each tensor is drawn in units that no degree
splits (one attention head, 32 MLP features, 4096 vocabulary rows), each unit from its own seeded generator,
and a rank draws only its own units. Column-parallel: q, k, v (whole heads, contiguous blocks; rank r's query
heads read its own kv heads, as grouped-query attention pairs them) and gate/up (contiguous feature blocks);
row-parallel: o and down, each followed by one all-reduce; embeddings, norms and lm_head replicated. So TP=1 and
TP=N compute the same function up to the order of bf16 sums (the bench compares logits across degrees within a
stated tolerance, tokens within one degree).
"""

from __future__ import annotations

import hashlib
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ccbridge.serve import gemv, gemv_tune

HEAD_UNIT = 1  # heads per drawn unit
MLP_UNIT = 32  # MLP features per drawn unit (divides every preset's width into units each degree splits)
VOCAB_UNIT = 4096  # vocabulary rows per drawn unit
RMS_EPS = 1e-5
BACKEND = "inductor"  # torch.compile's backend for the decode step's halves (the CPU tests use "eager")
MODE = None  # torch.compile's mode (bench/tp_step.py tries "max-autotune-no-cudagraphs": GEMMs tuned, minutes)
GEMVS = {"qkv": "norm", "o": "", "gate_up": "norm", "down": "silu"}  # each fused GEMV's weight -> its prologue


def _seed(*key) -> int:
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") & ((1 << 63) - 1)


def _draw(shape, std: float, dev, dtype, *key) -> torch.Tensor:
    """A unit of random weights: the same values for the same key, on any rank."""
    g = torch.Generator(device=dev).manual_seed(_seed(*key))
    return (torch.randn(shape, generator=g, device=dev, dtype=torch.float32) * std).to(dtype)


def _units(n_units: int, rank: int, n: int) -> range:
    per = n_units // n
    return range(rank * per, (rank + 1) * per)


class Cache:
    """A KV cache of this rank's kv heads: (layers, batch, kv heads, capacity, head dim) for k and v. fixed: a
    CUDA graph's (never grown: the graph holds its tensors); else used counts the positions written, on the host,
    so that an eager decode grows it without reading a device tensor back (a crossing under CC)."""

    def __init__(self, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int, dev, dtype,
                 fixed: bool = False):
        shape = (layers, batch, kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, device=dev, dtype=dtype)
        self.v = torch.zeros(shape, device=dev, dtype=dtype)
        self.capacity, self.fixed, self.used = capacity, fixed, 0


class ShardedDecoder(torch.nn.Module):
    """Rank `rank` of n of a Llama/Qwen2-shaped decoder (spec: a preset of decode.PRESETS), random weights.

    Called as transformers' causal LMs are by decode(): model(input_ids=, position_ids=, past_key_values=,
    cache_position=, use_cache=, logits_to_keep=) -> .logits, .past_key_values; static_cache(batch, length)
    gives the cache its CUDA-graph steps write into. all_reduce: the group's sum (None at n = 1: no collective).
    """

    def __init__(self, spec: dict, rank: int, n: int, dev, dtype, seed: int = 0, all_reduce=None,
                 compiled: bool | None = None, fused: bool | None = None):
        super().__init__()
        self.spec, self.rank, self.n, self.all_reduce = dict(spec), rank, n, all_reduce if n > 1 else None
        h, heads, kv = spec["hidden_size"], spec["num_attention_heads"], spec["num_key_value_heads"]
        inter, vocab, layers = spec["intermediate_size"], spec["vocab_size"], spec["num_hidden_layers"]
        for what, count in (("attention heads", heads), ("key-value heads", kv), ("MLP units", inter // MLP_UNIT)):
            if count % n:
                raise ValueError(f"{n} ranks cannot split {count} {what} evenly")
        self.d = h // heads
        self.hq, self.hk = heads // n, kv // n
        self.bias = spec.get("arch") == "qwen2"  # Qwen2's q/k/v projections carry a bias
        self.config = SimpleNamespace(**spec, head_dim=self.d)
        std, d = 1 / math.sqrt(h), self.d
        draw = lambda shape, s, *key: _draw(shape, s, dev, dtype, seed, *key)
        self.embed = torch.cat([draw((min(VOCAB_UNIT, vocab - u), h), 1.0, "embed", u)
                                for u in range(0, vocab, VOCAB_UNIT)])
        self.lm_head = self.embed if spec.get("tie_word_embeddings") else torch.cat(
            [draw((min(VOCAB_UNIT, vocab - u), h), std, "lm_head", u) for u in range(0, vocab, VOCAB_UNIT)])
        qs, ks = _units(heads, rank, n), _units(kv, rank, n)
        ms = _units(inter // MLP_UNIT, rank, n)
        self.layers = []
        for i in range(layers):
            qkv = [draw((d, h), std, i, "q", u) for u in qs] + [draw((d, h), std, i, "k", u) for u in ks] + \
                  [draw((d, h), std, i, "v", u) for u in ks]
            gate = [draw((MLP_UNIT, h), std, i, "gate", u) for u in ms]
            up = [draw((MLP_UNIT, h), std, i, "up", u) for u in ms]
            lay = SimpleNamespace(
                w_in=torch.ones(h, device=dev, dtype=dtype), w_post=torch.ones(h, device=dev, dtype=dtype),
                qkv=torch.cat(qkv), gate_up=torch.cat(gate + up),
                o=torch.cat([draw((h, d), 1 / math.sqrt(heads * d), i, "o", u) for u in qs], dim=1),
                down=torch.cat([draw((h, MLP_UNIT), 1 / math.sqrt(inter), i, "down", u) for u in ms], dim=1),
                qkv_bias=torch.cat([draw((d,), 0.02, i, kind + "b", u) for kind, us in (("q", qs), ("k", ks),
                                                                                         ("v", ks)) for u in us])
                if self.bias else None)
            self.layers.append(lay)
        self.w_final = torch.ones(h, device=dev, dtype=dtype)
        half = torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d
        self.inv_freq = 1.0 / (spec["rope_theta"] ** half)
        self._anchor = torch.nn.Parameter(torch.empty(0, device=dev, dtype=dtype), requires_grad=False)
        compiled = (dev.type == "cuda") if compiled is None else compiled
        self.fused = fuses(dev, compiled) if fused is None else fused
        self.gemv_tiles: dict[str, tuple[int, int, int]] = {}  # GEMVS' weight -> the tile its fused kernel runs
        if self.fused:
            gemv.prepare(dev)  # its custom op registered (and PDL decided) before torch.compile traces a call to it
            self.gemv_tiles = self._tune_gemvs(dev)
        # a decode step's halves (T = 1), and one sequence's with fused GEMVs
        halves = (self._attention_half, self._mlp_half, self._attention_half_fused, self._mlp_half_fused)
        if compiled:
            # dynamic=None: the first shape compiled as it is, a batch or cache size seen after it once more with
            # those sizes dynamic, so a bench of many batch sizes stays under dynamo's 8 entries per function
            opts = dict(dynamic=None, fullgraph=True, backend=BACKEND, mode=MODE)
            halves = tuple(torch.compile(f, **opts) for f in halves)
        self._pre, self._post, self._pre1, self._post1 = halves

    def _tune_gemvs(self, dev) -> dict[str, tuple[int, int, int]]:
        """Each fused GEMV's tile: on a GPU timed over this rank's own per-layer weights of its shape, each read
        cold in turn as a step reads them (serve/gemv_tune.py; cached; rank 0 says so where it takes a while);
        on a CPU (Triton's interpreter, no timing) the rule's."""
        shape = {name: (*getattr(self.layers[0], name).shape, pro) for name, pro in GEMVS.items()}
        if not gemv_tune.tunes(dev):
            return {name: gemv.tile(n, k) for name, (n, k, _) in shape.items()}
        if self.all_reduce and self.rank:  # one job, one tile a shape: rank 0 tunes, the others take its tiles
            tiles = {s: (0, 0, 0) for s in shape.values()}
        else:
            weights: dict = {}
            for name, s in shape.items():
                weights.setdefault(s, []).extend(getattr(lay, name) for lay in self.layers)
            tiles = gemv_tune.tune(shape.values(), dev, weights, progress=self.rank == 0)
        if self.all_reduce:  # rank 0's on every rank, and in each rank's cache
            tiles = gemv_tune.adopt(self._rank0s(tiles, dev), dev)
        return {name: tiles[s] for name, s in shape.items()}

    def _rank0s(self, tiles: dict, dev) -> dict:
        """Rank 0's tiles on every rank (a sum over the group of rank 0's and zeros): tunings of one shape on
        several GPUs can part by timing noise (o 4096x1024 chose 2/512/4, then 2/1024/4, on one H200), and ranks at
        other tiles would round their shards' sums apart and leave the cache to whichever wrote last; so the other
        ranks do not tune at all (their timing would be thrown away)."""
        shapes = list(tiles)
        mine = [v for s in shapes for v in tiles[s]] if self.rank == 0 else [0] * (3 * len(shapes))
        t = torch.tensor(mine, dtype=torch.int64, device=dev)
        self.all_reduce(t)
        got = t.tolist()
        return {s: tuple(got[3 * i:3 * i + 3]) for i, s in enumerate(shapes)}

    def tiles_used(self) -> dict[str, list[int]]:
        """The fused GEMVs' tiles for a record: 'qkv 1536x4096' -> [BLOCK_N, BLOCK_K, warps] ({} unfused)."""
        return {f"{name} {'x'.join(map(str, getattr(self.layers[0], name).shape))}": list(t)
                for name, t in self.gemv_tiles.items()}

    def weight_bytes(self, batch: int) -> int:
        """The weight bytes this rank reads per decode step: its shards, the replicated lm_head and norms, and
        one embedding row per sequence (the HBM roofline's numerator)."""
        per_layer = sum(t.numel() * t.element_size() for lay in self.layers[:1]
                        for t in (lay.qkv, lay.gate_up, lay.o, lay.down, lay.w_in, lay.w_post))
        head = self.lm_head.numel() * self.lm_head.element_size()
        return per_layer * len(self.layers) + head + batch * self.embed.shape[1] * self.embed.element_size()

    def static_cache(self, batch: int, capacity: int, fixed: bool = True) -> Cache:
        dev, dtype = self.embed.device, self.embed.dtype
        return Cache(len(self.layers), batch, self.hk, capacity, self.d, dev, dtype, fixed)

    def _rotary(self, pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's rotary factors, once per forward (not per layer): cos, and sin with the first half negated,
        each (B, T, 1, d) in the model's dtype, so that a layer rotates q and k in three kernels."""
        ang = pos[..., None].float() * self.inv_freq  # (B, T, d/2)
        cos, sin = ang.cos(), ang.sin()
        return torch.cat((cos, cos), -1)[:, :, None].to(dtype), torch.cat((-sin, sin), -1)[:, :, None].to(dtype)

    @staticmethod
    def _rope(qk: torch.Tensor, cos: torch.Tensor, nsin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of q and k together ((B, T, heads, d), rotate-half as Llama): x cos + swap(x) sin."""
        a, b = qk.chunk(2, dim=-1)
        return qk * cos + torch.cat((b, a), dim=-1) * nsin

    def _attend(self, q, ck, cv, attn):
        """attn: a prefill's causal mask (bool, (1, 1, T, capacity)): SDPA, which holds no T x capacity scores per
        head; a decode step's additive bias (float, (1, capacity)): two batched matmuls over each kv head's group of
        query heads (grouped-query attention pairs kv head j with query heads j*g .. j*g+g-1), no kv copy per group."""
        if attn.dtype == torch.bool:
            return F.scaled_dot_product_attention(q, ck, cv, attn_mask=attn, enable_gqa=self.hq != self.hk)
        B, hq, T, d = q.shape
        g = hq // self.hk
        s = torch.matmul(q.reshape(B, self.hk, g * T, d), ck.transpose(-1, -2)).float() * d ** -0.5 + attn.repeat(g, 1)
        return torch.matmul(s.softmax(-1).to(q.dtype), cv).reshape(B, hq, T, d)

    def _attention_half(self, x, y, w_in, qkv_w, qkv_b, o_w, ck, cv, pos, attn, cos, nsin):
        """The residual stream plus the last all-reduced output (y), then attention to this rank's share of o."""
        x = x + y
        qkv = F.linear(F.rms_norm(x, (x.shape[-1],), w_in, RMS_EPS), qkv_w, qkv_b)
        return x, self._attention(qkv, o_w, ck, cv, pos, attn, cos, nsin, F.linear)

    def _attention(self, qkv, o_w, ck, cv, pos, attn, cos, nsin, linear):
        """From the QKV projection (B, T, (hq + 2 hk) d): rotary, the KV-cache write, attention, and o by linear."""
        B, T, _ = qkv.shape
        d, hq, hk = self.d, self.hq, self.hk
        qk = self._rope(qkv[..., :(hq + hk) * d].view(B, T, hq + hk, d), cos, nsin)
        q, k = qk[:, :, :hq].transpose(1, 2), qk[:, :, hq:].transpose(1, 2)
        v = qkv[..., (hq + hk) * d:].view(B, T, hk, d).transpose(1, 2)
        slots = pos[0]  # every sequence of a batch is at the same positions (decode() steps them together)
        ck.index_copy_(2, slots, k)
        cv.index_copy_(2, slots, v)
        att = self._attend(q, ck, cv, attn)
        return linear(att.transpose(1, 2).reshape(B, T, hq * d), o_w)

    def _mlp_half(self, x, o, w_post, gate_up, down):
        x = x + o
        g, u = F.linear(F.rms_norm(x, (x.shape[-1],), w_post, RMS_EPS), gate_up).chunk(2, dim=-1)
        return x, F.linear(F.silu(g) * u, down)

    # One sequence's decode step (B = T = 1) with its weight GEMVs fused (serve/gemv.py): the residual add and
    # RMSNorm in the QKV and gate-up kernels' prologue, SiLU x up in down's; the same ops otherwise.
    # Each at its tile (gemv_tiles: read at tracing, a constant of the compiled half).
    def _o_gemv(self, a, w):
        return gemv.gemv(w, a, tile_nkw=self.gemv_tiles["o"])[0].view(1, 1, -1)

    def _attention_half_fused(self, x, y, w_in, qkv_w, qkv_b, o_w, ck, cv, pos, attn, cos, nsin):
        qkv, x1 = gemv.gemv(qkv_w, x, res=y, norm_w=w_in, bias=qkv_b, tile_nkw=self.gemv_tiles["qkv"])
        return x1.view(x.shape), self._attention(qkv.view(1, 1, -1), o_w, ck, cv, pos, attn, cos, nsin,
                                                 self._o_gemv)

    def _mlp_half_fused(self, x, o, w_post, gate_up, down):
        gu, x1 = gemv.gemv(gate_up, x, res=o, norm_w=w_post, tile_nkw=self.gemv_tiles["gate_up"])
        return x1.view(x.shape), gemv.gemv(down, gu, silu=True, tile_nkw=self.gemv_tiles["down"])[0].view(x.shape)

    def _layer(self, lay, i: int, x: torch.Tensor, y: torch.Tensor, pos: torch.Tensor, cache: Cache,
               attn: torch.Tensor, rot) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i on the residual stream x and the last layer's all-reduced MLP output y (added here, fused into
        the norm): the new stream and this layer's all-reduced MLP output. Decode steps run the compiled halves; a
        prefill, once a request, runs them eagerly."""
        if x.shape[1] > 1:
            pre, post = self._attention_half, self._mlp_half
        else:
            pre, post = (self._pre1, self._post1) if self.fused and x.shape[0] == 1 else (self._pre, self._post)
        x, o = pre(x, y, lay.w_in, lay.qkv, lay.qkv_bias, lay.o, cache.k[i], cache.v[i], pos, attn, *rot)
        if self.all_reduce:
            self.all_reduce(o)
        x, y = post(x, o, lay.w_post, lay.gate_up, lay.down)
        if self.all_reduce:
            self.all_reduce(y)
        return x, y

    def forward(self, input_ids, position_ids=None, past_key_values=None, cache_position=None, use_cache=False,
                logits_to_keep=None, **_):
        B, T = input_ids.shape
        start = cache_position[:1] if cache_position is not None else None
        if position_ids is None:
            base = start if start is not None else torch.zeros(1, dtype=torch.int64, device=input_ids.device)
            position_ids = (base + torch.arange(T, device=input_ids.device))[None].expand(B, T)
        cache = past_key_values if isinstance(past_key_values, Cache) else \
            self.static_cache(B, max(64, 2 * (T + 16)), fixed=False)
        if not cache.fixed:
            if cache.used + T > cache.capacity:
                cache = self._grown(cache, cache.used + T)
            cache.used += T
        keys = torch.arange(cache.capacity, device=input_ids.device)
        future = keys[None, :] > position_ids[0][:, None]  # (T, capacity): the causal mask, once per forward
        attn = (~future)[None, None] if T > 1 else \
            torch.zeros(future.shape, device=keys.device, dtype=torch.float32).masked_fill_(future, -1e30)
        x = F.embedding(input_ids, self.embed)
        y = torch.zeros_like(x)
        rot = self._rotary(position_ids, x.dtype)
        for i, lay in enumerate(self.layers):
            x, y = self._layer(lay, i, x, y, position_ids, cache, attn, rot)
        x = x + y
        x = F.rms_norm(x[:, -logits_to_keep:] if logits_to_keep else x, (x.shape[-1],), self.w_final, RMS_EPS)
        return SimpleNamespace(logits=F.linear(x, self.lm_head), past_key_values=cache if use_cache else None)

    def _grown(self, cache: Cache, need: int) -> Cache:
        """An eager decode past its cache's end: a cache of twice the room, holding what the old one held."""
        new = self.static_cache(cache.k.shape[1], max(need, 2 * cache.capacity), fixed=False)
        new.used = cache.used
        new.k[:, :, :, :cache.capacity].copy_(cache.k)
        new.v[:, :, :, :cache.capacity].copy_(cache.v)
        return new


def fuses(dev, compiled: bool | None = None) -> bool:
    """Whether a shard on dev runs one sequence's decode step with fused GEMVs by default: compiled (by default on
    a GPU), on a GPU, with triton."""
    dev = torch.device(dev)
    return (dev.type == "cuda" if compiled is None else compiled) and dev.type == "cuda" and gemv.available()


def build(spec: dict, rank: int, n: int, dev, dtype, seed: int = 0, all_reduce=None,
          compiled: bool | None = None, fused: bool | None = None) -> ShardedDecoder:
    """Rank `rank` of n's shard; compiled: its layers' halves by torch.compile (None: on a GPU); fused: one
    sequence's decode step with fused GEMVs (serve/gemv.py; None: where compiled on a GPU with triton), their tiles
    tuned on this GPU as it builds (serve/gemv_tune.py; CCBRIDGE_GEMV_TUNE=0: the rule's)."""
    with torch.no_grad():
        return ShardedDecoder(spec, rank, n, torch.device(dev), dtype, seed, all_reduce, compiled, fused).eval()
