"""A decode harness on a real transformer: one model, four ways to schedule its steps.

A Hugging Face causal LM (Llama or Qwen2 shapes) is built from a config with
seeded random weights (bf16 on CUDA, fp32 on the CPU), given seeded random
prompts, and decoded greedily. Each mode produces the same tokens; only the
order of host work and crossings differs:

- sync: read step N's tokens back to the host, then build and copy step N+1's
  inputs (ids and positions) and launch it. Every step waits for the GPU.
- async: launch N+1 before reading N. N+1's input ids are N's device-side
  argmax; its positions are copied from pinned host memory on the compute
  stream (non_blocking); N's tokens are read back on a side stream after N+1
  is enqueued. Today's engines' default.
- staged: async, with the per-step host inputs (positions, and cache_position
  where the model takes one) packed through ccbridge.serve.StagedH2D on an
  idle stream instead of copied on the busy compute stream.
- drain: staged, with the readbacks submitted to a ccbridge.serve.DrainWorker
  as each step's argmax is enqueued; the scheduler thread takes step N's
  tokens only after launching N+2 (two readbacks in flight), so it never holds
  a crossing itself.

An engine does far more host work per step than this harness (scheduling,
block tables, sampling metadata: milliseconds at high batch in Python
engines). host_prep_us models it: that much CPU work (the thread busy, the
GIL held, as an engine's Python is) between a step's first input crossing and
its launch. Natively async hides it behind the running forward; under CC the
first crossing holds the thread until the forward is done, so the work runs
with the GPU idle (the head-of-line loss the published vLLM accounting
found), unless the crossing is staged on an idle stream.

With graphs, each step is one replay of a CUDA graph captured over a
transformers StaticCache (the inputs cross into persistent buffers first):
one launch toll per step instead of one per kernel.

Under GPU-CC (or the emulator: `ccbridge run --profile b300 -- ...`) a copy
holds the thread that issues it until its stream reaches it (bridge law,
property 2), which is what separates the modes. On the CPU the modes are the
same loops without streams; their tokens must still agree.

Timing: a run is a prefill (not timed) and output - 1 decode steps; its wall
time runs from the end of prefill to the last token on the host. tok/s is
batch x (output - 1) / wall; step_ms is wall / (output - 1), one value per run,
the same measure in every mode; token_gap_ms is the interval between
successive steps' tokens reaching the host (what a streaming client sees: the
drain mode takes tokens in bursts, so its gaps are short and uneven); gpu_busy (CUDA) is the summed time between
each step's start and end event on the compute stream over the wall time
(launch gaps inside a step count as busy, gaps between steps do not).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ccbridge import choices
from ccbridge.emulate import trace as emu_trace  # (decode()'s own `trace` is its event list)
from ccbridge.errors import UsageError

MODES = choices.DECODE_MODES  # (in choices, which the CLI reads without importing torch; so PRESETS)
MAX_HOST_PREP_US = 1e6  # a second of host work per step is no engine's
MAX_BATCH = 4096  # sequences per step: beyond what a serving engine batches (and a host's memory at 2048 tokens)
DRAIN_LAG = 2  # drain mode: readbacks in flight before the scheduler thread takes the oldest

PRESETS = choices.DECODE_PRESETS  # shapes of published models; the weights are random


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UsageError("needs Hugging Face transformers (pip install transformers)") from None
    return transformers


def check(model: str | None, batches: list[int], prompt: int, output: int, modes: list[str], device: str,
          graphs: bool) -> torch.device:
    """Every argument checked before a model is built; the torch device to run on. model None: a checkpoint
    (from_checkpoint checks its own length limit)."""
    if model is not None and model not in PRESETS:
        raise UsageError(f"unknown model {model!r} (one of {', '.join(PRESETS)})")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise UsageError(f"unknown mode {bad[0]!r} (one of {', '.join(MODES)})")
    if not batches or min(batches) < 1 or max(batches) > MAX_BATCH:
        raise UsageError(f"batch sizes must be 1 to {MAX_BATCH}")
    if prompt < 1 or output < 2:
        raise UsageError("prompt needs at least 1 token and output at least 2 (the first comes from prefill)")
    if model is not None:
        _fits(model, PRESETS[model]["max_position_embeddings"], prompt + output)
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {device}: torch sees no GPU (give --device cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"--device {device}: torch sees {torch.cuda.device_count()} GPU(s)")
    if graphs and dev.type != "cuda":
        raise UsageError("--graphs captures CUDA graphs: it needs a CUDA device")
    return dev


def check_host_prep(host_prep_us: float) -> None:
    if not (0 <= host_prep_us <= MAX_HOST_PREP_US):
        raise UsageError(f"--host-prep-us {host_prep_us:g}: expected 0 to {MAX_HOST_PREP_US:g} us of host work "
                         "per step")


def _fits(name: str, limit: int | None, tokens: int) -> None:
    if limit is not None and tokens > limit:
        raise UsageError(f"prompt + output = {tokens} tokens, {name} holds {limit}")


def check_checkpoint(path: str) -> Path:
    """The folder as a Path, if it looks like a Hugging Face model folder; UsageError otherwise."""
    p = Path(path)
    what = "a Hugging Face model folder holds config.json and *.safetensors"
    if not path or not p.is_dir():  # "" would be the current folder
        raise UsageError(f"--checkpoint {path}: not a folder ({what})")
    if not (p / "config.json").is_file() or not any(p.glob("*.safetensors")):
        raise UsageError(f"--checkpoint {path}: no config.json or no *.safetensors in it")
    return p


_CAUSAL = ("ForCausalLM", "LMHeadModel")  # class-name endings of causal LMs in a config's "architectures"


def from_checkpoint(path: str, device, tokens: int) -> tuple[torch.nn.Module, str, int]:
    """A Hugging Face causal LM from a local model folder (config.json and *.safetensors), its weights read
    by ccbridge's loader onto the device: (model in eval mode, its label, its vocabulary size). Every defect
    of the folder is a UsageError naming it; nothing is fetched from the network."""
    tf = _transformers()
    p = check_checkpoint(path)
    where = f"--checkpoint {path}"
    try:
        cfg = tf.AutoConfig.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"{where}: its config.json is not one transformers reads: {str(e).splitlines()[0]}") from None
    archs = getattr(cfg, "architectures", None) or []
    if archs and not any(a.endswith(_CAUSAL) for a in archs) or getattr(cfg, "is_encoder_decoder", False):
        raise UsageError(f"{where}: a {', '.join(archs) or cfg.model_type} model, not a causal LM "
                         f"(decode runs *ForCausalLM / *LMHeadModel checkpoints)")
    _fits(p.name, getattr(cfg, "max_position_embeddings", None), tokens)
    dev = torch.device(device)
    dtype = dtype_for(dev)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with dev:
            m = tf.AutoModelForCausalLM.from_config(cfg)
    except (ValueError, KeyError, TypeError) as e:  # a config class AutoModelForCausalLM has no model for
        raise UsageError(f"{where}: transformers builds no causal LM from its config.json: "
                         f"{str(e).splitlines()[0][:200]}") from None
    except (RuntimeError, MemoryError) as e:  # its config asks for more memory than the device has
        raise UsageError(f"{where}: the model its config.json describes does not fit on {dev}: "
                         f"{str(e).splitlines()[0][:200]}") from None
    finally:
        torch.set_default_dtype(old)
    from ccbridge.load import load_safetensors

    weights = load_safetensors(str(p), device=str(dev))
    params = dict(m.named_parameters(remove_duplicate=False))
    state = m.state_dict()
    wrong = [f"{k} is {tuple(t.shape)}, its config makes it {tuple(state[k].shape)}" for k, t in weights.items()
             if k in state and t.shape != state[k].shape]
    if wrong:
        raise UsageError(f"{where}: its weights do not fit its config.json: {wrong[0]}"
                         + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""))
    got = m.load_state_dict(weights, strict=False)
    loaded = {id(t) for k, t in params.items() if k in weights}
    missing = [k for k in got.missing_keys if not (k in params and id(params[k]) in loaded)]  # tied: not missing
    if missing or got.unexpected_keys:
        bad = missing or got.unexpected_keys
        raise UsageError(f"{where}: its weights do not fit its config.json: "
                         f"{'missing' if missing else 'unexpected'} {', '.join(bad[:3])}"
                         + (f" and {len(bad) - 3} more" if len(bad) > 3 else ""))
    return m.to(dtype=dtype).eval(), f"checkpoint {p.name}", int(cfg.vocab_size)


def dtype_for(dev: torch.device) -> torch.dtype:
    """The models' dtype: bf16 on CUDA (as served), fp32 on the CPU (bf16 matmuls there are slow and inexact)."""
    return torch.bfloat16 if dev.type == "cuda" else torch.float32


def build(model: str, device, seed: int = 0) -> torch.nn.Module:
    """The preset's causal LM with seeded random weights, in eval mode (bf16 on CUDA, fp32 on the CPU)."""
    tf = _transformers()
    spec = dict(PRESETS[model])
    arch = spec.pop("arch")
    cfg_cls, model_cls = ((tf.LlamaConfig, tf.LlamaForCausalLM) if arch == "llama"
                          else (tf.Qwen2Config, tf.Qwen2ForCausalLM))
    cfg = cfg_cls(**spec, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    dev = torch.device(device)
    dtype = dtype_for(dev)
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with dev:
            m = model_cls(cfg)
    finally:
        torch.set_default_dtype(old)
    return m.to(device=dev, dtype=dtype).eval()


def prompts(vocab: int, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Seeded random prompt ids on the host, (batch, length); the same for every mode."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g, dtype=torch.int64)


@dataclass
class Run:
    tokens: torch.Tensor              # (batch, output) on the host
    wall_s: float
    step_s: list[float]
    gpu_busy: float | None = None
    stats: dict = field(default_factory=dict)  # what crossed how: h2d, staged, readback, drained counts


class _Stepper:
    """One model's forward with the keyword arguments its transformers version takes."""

    def __init__(self, model):
        inner = getattr(model, "model", model)
        self.model = model
        self.cache_position = "cache_position" in inspect.signature(inner.forward).parameters
        params = inspect.signature(model.forward).parameters
        self.keep = ({"logits_to_keep": 1} if "logits_to_keep" in params else
                     {"num_logits_to_keep": 1} if "num_logits_to_keep" in params else {})

    def host_inputs(self, batch: int, p: int) -> list[torch.Tensor]:
        pos = torch.full((batch, 1), p, dtype=torch.int64)
        return [pos, torch.tensor([p], dtype=torch.int64)] if self.cache_position else [pos]

    def prefill(self, ids: torch.Tensor):
        out = self.model(input_ids=ids, use_cache=True, **self.keep)
        return out.logits[:, -1].argmax(-1), out.past_key_values

    def step(self, ids: torch.Tensor, inputs: list[torch.Tensor], cache):
        kw = {"cache_position": inputs[1]} if self.cache_position else {}
        out = self.model(input_ids=ids, position_ids=inputs[0], past_key_values=cache, use_cache=True, **kw,
                         **self.keep)
        return out.logits[:, -1].argmax(-1), out.past_key_values


class _GraphStepper(_Stepper):
    """Decode steps over a transformers StaticCache, replayed from one CUDA graph per run: the step's ids,
    positions and cache position are copied into persistent buffers the graph reads (the inputs' own
    crossings stay outside the graph, as in an engine), then one replay. On the CPU the same buffers and
    cache run eagerly (no capture), so CPU tests check everything but the capture itself."""

    def __init__(self, model, batch: int, max_len: int):
        super().__init__(model)
        dev = next(model.parameters()).device
        self.cache = _transformers().StaticCache(config=model.config, max_cache_len=max_len)
        self.ids = torch.zeros((batch, 1), dtype=torch.int64, device=dev)
        self.pos = torch.zeros((batch, 1), dtype=torch.int64, device=dev)
        self.cp = torch.zeros((1,), dtype=torch.int64, device=dev)
        self.graph = self.out = None

    def host_inputs(self, batch: int, p: int) -> list[torch.Tensor]:
        # cache_position always: older transformers index the static cache by it (newer ones take and ignore it)
        return [torch.full((batch, 1), p, dtype=torch.int64), torch.tensor([p], dtype=torch.int64)]

    def prefill(self, ids: torch.Tensor):
        cp = torch.arange(ids.shape[1], device=ids.device)
        out = self.model(input_ids=ids, past_key_values=self.cache, cache_position=cp, use_cache=True, **self.keep)
        return out.logits[:, -1].argmax(-1), self.cache

    def _forward(self) -> torch.Tensor:
        out = self.model(input_ids=self.ids, position_ids=self.pos, past_key_values=self.cache,
                         cache_position=self.cp, use_cache=True, **self.keep)
        return out.logits[:, -1].argmax(-1)

    def _load(self, ids: torch.Tensor, inputs: list[torch.Tensor]) -> None:
        for buf, t in ((self.ids, ids), (self.pos, inputs[0]), (self.cp, inputs[1])):
            buf.copy_(t, non_blocking=True)

    def capture(self, ids: torch.Tensor, inputs: list[torch.Tensor]) -> None:
        """Capture the step from step 1's device inputs. The warm-up forwards (cuBLAS workspaces, lazy kernel
        loads must not happen inside a capture) write step 1's own KV at its position, which step 1 rewrites."""
        if self.ids.device.type != "cuda":
            return
        self._load(ids, inputs)
        # Newer transformers keep the static cache's write position in small device tensors that each
        # forward advances (cache_position is then ignored): the warm-up must leave them as prefill did.
        counters = [t for layer in getattr(self.cache, "layers", []) for t in vars(layer).values()
                    if isinstance(t, torch.Tensor) and t.numel() <= 16]
        saved = [t.clone() for t in counters]
        side, main = torch.cuda.Stream(self.ids.device), torch.cuda.current_stream(self.ids.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward()
            for t, v in zip(counters, saved):
                t.copy_(v)
        main.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: under tensor parallelism (serve/tp.py) NCCL's watchdog thread queries events while this
        # thread captures the step's all-reduces; one GPU has no other thread on CUDA then, so nothing changes
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.out = self._forward()

    def step(self, ids: torch.Tensor, inputs: list[torch.Tensor], cache):
        self._load(ids, inputs)
        if self.graph is None:
            return self._forward(), cache
        self.graph.replay()
        return self.out.clone(), cache  # the next replay overwrites self.out while this step's tokens are read


@contextlib.contextmanager
def deterministic_attention():
    """cuDNN's attention kernels off (PyTorch picks flash, memory-efficient or math instead), restored after.
    With them on, two bf16 decodes of llama-1b on an H100 (torch 2.11) parted run to run from batch 8, eager
    and graphs alike, prefill logits equal; with them off every run agreed bit for bit (diag, 2026-11-22).
    The benches compare tokens across modes and runs, so they need the deterministic kernels."""
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


@contextlib.contextmanager
def quiet_cache_rename():
    """transformers 5 renames `past_key_values` to `cache` and says so twice: a FutureWarning at a model's first
    call, and a log line (utils.generic) where an output's `.past_key_values` is read. The benches use the old
    name, which every transformers version they support reads, so that one deprecation is silenced while they
    run; every other warning still shows."""
    def not_the_rename(record) -> bool:
        return "past_key_values" not in record.getMessage()

    log = logging.getLogger("transformers.utils.generic")
    log.addFilter(not_the_rename)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)
            yield
    finally:
        log.removeFilter(not_the_rename)


def _memory(dev) -> str:
    """' (GPU memory allocated by PyTorch: X GiB)' on CUDA, for progress lines and out-of-memory errors."""
    if dev.type != "cuda":
        return ""
    return f" (GPU memory allocated by PyTorch: {torch.cuda.memory_allocated(dev) / 2**30:.2f} GiB)"


def _busy(seconds: float) -> None:
    """CPU work for seconds, holding the GIL (an engine's Python prep does; sleeping would free it)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@torch.no_grad()
def decode(model, prompt: torch.Tensor, output: int, mode: str, *, stage=None, drain=None,
           trace: list | None = None, graphs: bool = False, host_prep_us: float = 0.0) -> Run:
    """Greedy decode of output tokens per sequence after the host prompt (batch, length), scheduled as mode.

    stage (a StagedH2D) and drain (a DrainWorker) are made per call when not given.
    trace, when given, gets ("launch", n) as step n's forward is enqueued and ("read", n) as
    token n reaches the host (token 0 comes from prefill, step n makes token n).
    graphs: each step one CUDA-graph replay over a StaticCache, captured after prefill, before the timing.
    host_prep_us: CPU work per step between its input crossings and its launch (an engine's host preparation).
    """
    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
    from ccbridge.serve import DrainWorker, StagedH2D, layout

    dev = next(model.parameters()).device
    cuda = dev.type == "cuda"
    batch, plen = prompt.shape
    st = _GraphStepper(model, batch, plen + output) if graphs else _Stepper(model)
    steps = output - 1
    log = trace.append if trace is not None else (lambda _: None)
    stats = {"h2d": 0, "staged": 0, "readback": 0, "drained": 0}
    own_drain = own_stage = None
    if mode in ("staged", "drain") and stage is None:
        stage = own_stage = StagedH2D(capacity=layout(st.host_inputs(batch, 0))[1], device=dev)
    if mode == "drain" and drain is None:
        drain = own_drain = DrainWorker(max_pending=DRAIN_LAG + 2)
    compute = torch.cuda.current_stream(dev) if cuda else None
    side = torch.cuda.Stream(dev) if cuda and mode in ("async", "staged") else None
    marks: list = []

    def to_dev(t: torch.Tensor) -> torch.Tensor:
        stats["h2d"] += 1
        if not cuda:
            return t.clone()
        return t.pin_memory().to(dev, non_blocking=True)

    def inputs_for(n: int) -> list[torch.Tensor]:  # step n feeds token n - 1 at position plen + n - 1
        host = st.host_inputs(batch, plen + n - 1)
        if mode in ("staged", "drain"):
            stats["staged"] += 1
            return stage.put(host)
        return [to_dev(t) for t in host]

    def launch(n: int, ids: torch.Tensor, cache):
        inputs = inputs_for(n)
        if host_prep_us:
            _busy(host_prep_us / 1e6)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(compute)
        nxt, cache = st.step(ids, inputs, cache)
        if cuda:
            end.record(compute)
            marks.append((start, end))
        log(("launch", n))
        return nxt, cache

    def read(t: torch.Tensor, ready) -> torch.Tensor:  # async, staged: on the side stream, after `ready`
        stats["readback"] += 1
        if not cuda:
            return t.clone()
        if side is None:
            return t.cpu()
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        with torch.cuda.stream(side):
            side.wait_event(ready)
            host.copy_(t, non_blocking=True)
        side.synchronize()
        return host

    def event():
        if not cuda:
            return None
        e = torch.cuda.Event()
        e.record(compute)
        return e

    toks: list[torch.Tensor] = [None] * output  # type: ignore[list-item]
    stamps: list[float] = []

    def got(n: int, t: torch.Tensor) -> None:
        toks[n] = t
        stamps.append(time.perf_counter())
        log(("read", n))

    try:
        first, cache = st.prefill(prompt.to(dev))
        if graphs:
            st.capture(first[:, None], [t.to(dev) for t in st.host_inputs(batch, plen)])
        if cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        if mode == "sync":
            tok = first.cpu()
            stats["readback"] += 1
            got(0, tok)
            for n in range(1, output):
                nxt, cache = launch(n, to_dev(tok[:, None]), cache)
                tok = nxt.cpu()
                stats["readback"] += 1
                got(n, tok)
        elif mode in ("async", "staged"):
            prev, ready = first, event()
            for n in range(1, output):
                nxt, cache = launch(n, prev[:, None], cache)  # N+1 enqueued from N's device-side argmax
                nxt_ready = event()
                got(n - 1, read(prev, ready))                 # then N read back
                prev, ready = nxt, nxt_ready
            got(steps, read(prev, ready))
        else:  # drain
            pending = [(0, drain.submit(first))]
            stats["drained"] += 1
            prev = first
            for n in range(1, output):
                nxt, cache = launch(n, prev[:, None], cache)
                pending.append((n, drain.submit(nxt)))
                stats["drained"] += 1
                prev = nxt
                while len(pending) > DRAIN_LAG:
                    k, fut = pending.pop(0)
                    got(k, fut.result())
            for k, fut in pending:
                got(k, fut.result())
        wall = time.perf_counter() - t0
    finally:
        if own_drain is not None:
            own_drain.close()
    busy = None
    if cuda and marks and wall > 0:
        torch.cuda.synchronize(dev)
        busy = min(1.0, sum(s.elapsed_time(e) for s, e in marks) / 1e3 / wall)
    del own_stage
    tokens = torch.stack([t.reshape(batch).to("cpu", torch.int64) for t in toks], dim=1)
    return Run(tokens, wall, [b - a for a, b in zip(stamps, stamps[1:])], busy, stats)


# A different token at a near tie: the reference's logits for the two differ by at most this fraction of its
# largest logit. Random weights make near-flat logits, so ties are common; on a GPU two runs of the same
# bf16 decode can part at one (a kernel's reduction order is not fixed run to run at every batch size).
TIE_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}


class _Judge:
    """Compares a run's tokens (batch, output) with the reference's. Each sequence that differs is judged
    where it first parts: the logits of a full prefill (no cache) of the prompt and the reference's tokens
    before that point. A different token within TIE_TOL of the reference's is a near tie (the two decodes
    follow different but equally valid paths from there); anything else is wrong. Judgements are cached:
    runs tend to part at the same ties."""

    def __init__(self, model, prompt: torch.Tensor):
        self.model, self.prompt, self.seen = model, prompt, {}
        self.dev = next(model.parameters()).device
        self.tol = TIE_TOL.get(next(model.parameters()).dtype, 2e-2)
        self.keep = _Stepper(model).keep

    @torch.no_grad()
    def _tie(self, want: torch.Tensor, seq: int, k: int, other: int) -> bool:
        key = (seq, tuple(want[seq, :k + 1].tolist()), other)
        if key not in self.seen:
            ctx = torch.cat([self.prompt[seq], want[seq, :k]])[None].to(self.dev)
            lg = self.model(input_ids=ctx, use_cache=False, **self.keep).logits[0, -1].float().cpu()
            self.seen[key] = float(lg[int(want[seq, k])] - lg[other]) <= self.tol * float(lg.abs().max())
        return self.seen[key]

    def __call__(self, want: torch.Tensor, got: torch.Tensor) -> tuple[bool, set]:
        """(any sequence wrong, the near ties (sequence, step) where sequences parted)."""
        wrong, ties = False, set()
        for seq in (want != got).any(dim=1).nonzero().flatten().tolist():
            k = int((want[seq] != got[seq]).nonzero()[0])
            if self._tie(want, seq, k, int(got[seq, k])):
                ties.add((seq, k))
            else:
                wrong = True
        return wrong, ties


def _mismatch(a: torch.Tensor, b: torch.Tensor) -> str:
    diff = (a != b).nonzero()
    seq, step = diff[0].tolist()
    return f"{len(diff)} of {a.numel()} tokens (first: sequence {seq}, token {step})"


def measure(m, ids: torch.Tensor, output: int, mode: str, warmup: int, iters: int, recording: bool,
            **kw) -> list[Run]:
    """warmup runs, then iters timed runs of decode() (kw: its graphs, host_prep_us). Called inside
    emu_trace.paused(): only the timed runs are traced where `ccbridge run --record` is recording."""
    runs = [decode(m, ids, output, mode, **kw) for _ in range(warmup)]
    with emu_trace.resumed(recording):
        runs += [decode(m, ids, output, mode, **kw) for _ in range(iters)]
    return runs


def verdict(judge: _Judge, want: tuple[str, torch.Tensor], runs: list[Run], what: str) -> tuple[str | None, set]:
    """Every run's tokens judged against want (its label, its tokens): the first real disagreement as an
    error line starting with what (None if none), and the near ties where sequences parted."""
    bad, ties = None, set()
    for r in runs:
        wrong, tied = judge(want[1], r.tokens)
        ties |= tied
        if wrong and bad is None:
            bad = f"{what}: tokens differ from {want[0]}'s in " + _mismatch(r.tokens, want[1])
    return bad, ties


def rows_of(test: str, timed: list[Run], output: int, extra: dict, **params) -> list:
    """The rows of one (batch, mode)'s timed runs: tok_per_s (with extra, the median GPU busy and the last
    run's crossing counts), step_ms and token_gap_ms."""
    from ccbridge.results import Row

    b = timed[0].tokens.shape[0]
    busy = [r.gpu_busy for r in timed if r.gpu_busy is not None]
    tok = Row.of(test, "tok_per_s", "tok/s", [b * (output - 1) / r.wall_s for r in timed], **params)
    tok.extra = {"gpu_busy": sorted(busy)[len(busy) // 2] if busy else None, **extra, **timed[-1].stats}
    return [tok, Row.of(test, "step_ms", "ms", [r.wall_s / (output - 1) * 1e3 for r in timed], **params),
            Row.of(test, "token_gap_ms", "ms", [s * 1e3 for r in timed for s in r.step_s], **params)]


def settings_of(model: str, dev, dtype, prompt: int, output: int, batches: list[int], modes: list[str], iters: int,
                warmup: int, graphs: bool, seed: int, host_prep_us: float, checkpoint: str | None = None) -> dict:
    """What a decode result says it ran (its settings["decode"]; the tensor-parallel bench adds its own)."""
    return {"model": model, "device": str(dev),
            "checkpoint": None if checkpoint is None else str(Path(checkpoint).resolve()),
            "dtype": str(dtype).split(".")[-1],
            "prompt": prompt, "output": output, "batches": list(batches), "modes": list(modes),
            "iters": iters, "warmup": warmup, "graphs": graphs, "seed": seed,
            "transformers": _transformers().__version__, "drain_lag": DRAIN_LAG, "host_prep_us": host_prep_us,
            "cudnn_attention": False}


def bench(model: str, batches: list[int], prompt: int, output: int, modes: list[str], device: str = "cuda",
          iters: int = 3, warmup: int = 1, graphs: bool = False, seed: int = 0,
          log: Callable[[str], None] = lambda _: None, checkpoint: str | None = None, host_prep_us: float = 0.0):
    """Every (batch, mode): warmup + iters runs; a Result of rows decode:tok_per_s and decode:step_ms.
    checkpoint: a local Hugging Face model folder whose weights ccbridge's loader reads (instead of a
    preset with random weights). host_prep_us: an engine's host work per step (see decode()).

    Tokens of every run are checked against the first run of the first mode at that batch size (see
    _Judge: a sequence that parts at a near tie of the reference's logits is counted apart, in the row's
    extra near_ties); each real disagreement is an entry in Result.errors. Under `ccbridge run --record` only
    the timed runs write trace lines."""
    from ccbridge import env
    from ccbridge.results import Result

    dev = check(None if checkpoint is not None else model, batches, prompt, output, modes, device, graphs)
    check_host_prep(host_prep_us)
    if checkpoint is not None:
        check_checkpoint(checkpoint)
    _transformers()  # missing: said before the model is built
    stamp = env.stamp()
    t_start = time.monotonic()
    # under `ccbridge run --record` (and so `ccbridge account`) only the timed runs are traced: the model build,
    # the reference forwards and the warm-up runs are not what the account of a decode loop is about
    with emu_trace.paused(required=False) as recording:
        if checkpoint is not None:
            log(f"loading {checkpoint} onto {dev} (ccbridge's loader)")
            m, model, vocab = from_checkpoint(checkpoint, dev, prompt + output)
        else:
            log(f"building {model} (random weights, seed {seed}) on {dev}")
            m, vocab = build(model, dev, seed), PRESETS[model]["vocab_size"]
        settings = {"decode": settings_of(model, dev, next(m.parameters()).dtype, prompt, output, batches, modes, iters,
                                          warmup, graphs, seed, host_prep_us, checkpoint)}
        res = Result(env=stamp, settings=settings)
        with deterministic_attention(), quiet_cache_rename():  # every mode's tokens comparable bit for bit
            for b in batches:
                ids = prompts(vocab, b, prompt, seed)
                want, judge = None, _Judge(m, ids)
                for mode in modes:
                    log(f"batch {b}, {mode}: {warmup} warm-up + {iters} timed runs{_memory(dev)}")
                    try:
                        runs = measure(m, ids, output, mode, warmup, iters, recording, graphs=graphs,
                                       host_prep_us=host_prep_us)
                    except torch.OutOfMemoryError as e:  # the rows so far stand; the result says where it stopped
                        first = str(e).split(". ")[0]
                        res.errors.append({"test": "decode", "error": f"batch {b}, mode {mode}: {first}{_memory(dev)}; "
                                                                      "the larger batches and later modes did not run"})
                        break
                    if want is None:
                        want = (mode, runs[0].tokens)
                    bad, ties = verdict(judge, want, runs, f"batch {b}, mode {mode}")
                    if bad:
                        res.errors.append({"test": "decode", "error": bad})
                    res.rows += rows_of("decode", runs[warmup:], output, {"tokens_match": bad is None,
                                                                          "near_ties": len(ties)},
                                        model=model, batch=b, mode=mode, graphs=graphs)
                else:
                    continue
                break  # out of memory: no larger batch will fit
        res.duration_s = time.monotonic() - t_start
        return res


def _tokens_word(extra: dict) -> str:
    if not extra["tokens_match"]:
        return "DIFFER"
    n = extra.get("near_ties", 0)
    return f"same ({n} near tie{'s' if n > 1 else ''})" if n else "same"


def render(res) -> str:
    """A table: one line per (batch, mode). tokens: same as the reference (near ties counted apart)."""
    s = res.settings["decode"]
    weights = "its weights" if s.get("checkpoint") else "random weights"
    head = (f"# ccbridge bench decode: {s['model']} ({weights}), {s['dtype']} on {s['device']}, prompt "
            f"{s['prompt']}, output {s['output']}, {'CUDA graphs' if s['graphs'] else 'eager'}, {s['iters']} timed runs")
    if s.get("host_prep_us"):
        head += f", {s['host_prep_us']:g} us of host preparation per step (modelled engine work)"
    if res.emulated:
        from ccbridge import env

        head += f"\n# {env.emulated_banner(res.env['emulation'])}"
    lines = [head, f"{'batch':>6} {'mode':<7} {'tok/s':>10} {'step ms':>9} {'gap p50':>8} {'gap p90':>8} "
                   f"{'gpu busy':>8}  tokens"]
    by = {(r.params["batch"], r.params["mode"], r.metric): r for r in res.rows}
    for r in res.rows:
        if r.metric != "tok_per_s":
            continue
        st, gap = (by[(r.params["batch"], r.params["mode"], m)] for m in ("step_ms", "token_gap_ms"))
        busy = r.extra.get("gpu_busy")
        lines.append(f"{r.params['batch']:>6} {r.params['mode']:<7} {r.median:>10.1f} {st.median:>9.3f} "
                     f"{gap.median:>8.3f} {gap.p90:>8.3f} {'-' if busy is None else f'{busy:.2f}':>8}  "
                     f"{_tokens_word(r.extra)}")
    return "\n".join(lines)
