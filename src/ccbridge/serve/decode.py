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
import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ccbridge import choices, env, gputimer, marks
from ccbridge.emulate import trace as emu_trace  # (decode()'s own `trace` is its event list)
from ccbridge.errors import UsageError
from ccbridge.load import load_safetensors
from ccbridge.results import Result, Row
from ccbridge.serve import DrainWorker, StagedH2D, fits, layout
from ccbridge.serve.judge import Judge
from ccbridge.serve.stepper import GraphStepper, Stepper, transformers

MODES = choices.DECODE_MODES  # (in choices, which the CLI reads without importing torch; so PRESETS)
MAX_HOST_PREP_US = 1e6  # a second of host work per step is no engine's
MAX_BATCH = 4096  # sequences per step: beyond what a serving engine batches (and a host's memory at 2048 tokens)
DRAIN_LAG = 2  # drain mode: readbacks in flight before the scheduler thread takes the oldest

PRESETS = choices.DECODE_PRESETS  # shapes of published models; the weights are random


def check(model: str | None, batches: list[int], prompt: int, output: int, modes: list[str], device: str,
          graphs: bool, tp: bool = False) -> torch.device:
    """Every argument checked before a model is built; the torch device to run on. model None: a checkpoint
    (from_checkpoint checks its own length limit). tp: for the tensor-parallel bench (which builds shards)."""
    if model is not None and model not in PRESETS:
        raise UsageError(f"unknown model {model!r} (one of {', '.join(PRESETS)})")
    if model in choices.TP_ONLY and not tp:
        raise UsageError(f"{model} does not fit one GPU: run it tensor-parallel (bench decode --tp 2 4 ...)")
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
    if model is not None and not tp:  # (tp: its degrees' shards, checked by the tensor-parallel bench)
        fits.check(model, [1], dev, dtype_for(dev), tp=False)
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
    what = "a Hugging Face model folder: config.json, *.safetensors"
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
    tf = transformers()
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
    tf = transformers()
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


def memory_note(dev) -> str:
    """' (GPU memory allocated by PyTorch: X GiB)' on CUDA, for progress lines and out-of-memory errors."""
    if dev.type != "cuda":
        return ""
    return f" (GPU memory allocated by PyTorch: {torch.cuda.memory_allocated(dev) / 2**30:.2f} GiB)"


def _busy(seconds: float) -> None:
    """CPU work for seconds, holding the GIL (an engine's Python prep does; sleeping would free it)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _Loop:
    """One decode() call's steps: their crossings (counted in stats), launches (their GPU time on the compute
    stream by the run's GPU timer, in marks) and the tokens as they reach the host (toks, with the time of each in stamps),
    scheduled as the mode says by sync(), pipelined() (async, staged) or drained()."""

    def __init__(self, st: Stepper, dev, prompt: torch.Tensor, output: int, mode: str, stage, drain, log,
                 host_prep_us: float):
        self.st, self.dev, self.mode, self.output = st, dev, mode, output
        self.batch, self.plen = prompt.shape
        self.stage, self.drain, self.log, self.host_prep_us = stage, drain, log, host_prep_us
        self.cuda = dev.type == "cuda"
        self.stats = {"h2d": 0, "staged": 0, "readback": 0, "drained": 0}
        self.compute = torch.cuda.current_stream(dev) if self.cuda else None
        self.side = torch.cuda.Stream(dev) if self.cuda and mode in ("async", "staged") else None
        self.marks = gputimer.Intervals(torch, self.compute, output) if self.cuda else None
        self.toks: list[torch.Tensor] = [None] * output  # type: ignore[list-item]
        self.stamps: list[float] = []

    def to_dev(self, t: torch.Tensor) -> torch.Tensor:
        self.stats["h2d"] += 1
        if not self.cuda:
            return t.clone()
        return t.pin_memory().to(self.dev, non_blocking=True)

    def inputs_for(self, n: int) -> list[torch.Tensor]:  # step n feeds token n - 1 at position plen + n - 1
        host = self.st.host_inputs(self.batch, self.plen + n - 1)
        if self.mode in ("staged", "drain"):
            self.stats["staged"] += 1
            return self.stage.put(host)
        return [self.to_dev(t) for t in host]

    def launch(self, n: int, ids: torch.Tensor, cache):
        inputs = self.inputs_for(n)
        if self.host_prep_us:
            _busy(self.host_prep_us / 1e6)
        if self.cuda:
            self.marks.begin()
        nxt, cache = self.st.step(ids, inputs, cache)
        if self.cuda:
            self.marks.end()
        self.log(("launch", n))
        return nxt, cache

    def read(self, t: torch.Tensor, ready) -> torch.Tensor:  # async, staged: on the side stream, after `ready`
        self.stats["readback"] += 1
        if not self.cuda:
            return t.clone()
        if self.side is None:
            return t.cpu()
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        with torch.cuda.stream(self.side):
            self.side.wait_event(ready)
            host.copy_(t, non_blocking=True)
        self.side.synchronize()
        return host

    def event(self):
        if not self.cuda:
            return None
        e = torch.cuda.Event()
        e.record(self.compute)
        return e

    def got(self, n: int, t: torch.Tensor) -> None:
        self.toks[n] = t
        self.stamps.append(time.perf_counter())
        self.log(("read", n))

    def sync(self, first: torch.Tensor, cache) -> None:
        tok = first.cpu()
        self.stats["readback"] += 1
        self.got(0, tok)
        for n in range(1, self.output):
            nxt, cache = self.launch(n, self.to_dev(tok[:, None]), cache)
            tok = nxt.cpu()
            self.stats["readback"] += 1
            self.got(n, tok)

    def pipelined(self, first: torch.Tensor, cache) -> None:
        prev, ready = first, self.event()
        for n in range(1, self.output):
            nxt, cache = self.launch(n, prev[:, None], cache)  # N+1 enqueued from N's device-side argmax
            nxt_ready = self.event()
            self.got(n - 1, self.read(prev, ready))             # then N read back
            prev, ready = nxt, nxt_ready
        self.got(self.output - 1, self.read(prev, ready))

    def drained(self, first: torch.Tensor, cache) -> None:
        pending = [(0, self.drain.submit(first))]
        self.stats["drained"] += 1
        prev = first
        for n in range(1, self.output):
            nxt, cache = self.launch(n, prev[:, None], cache)
            pending.append((n, self.drain.submit(nxt)))
            self.stats["drained"] += 1
            prev = nxt
            while len(pending) > DRAIN_LAG:
                k, fut = pending.pop(0)
                self.got(k, fut.result())
        for k, fut in pending:
            self.got(k, fut.result())


@torch.no_grad()
def decode(model, prompt: torch.Tensor, output: int, mode: str, *, stage=None, drain=None,
           trace: list | None = None, graphs: bool = False, host_prep_us: float = 0.0) -> Run:
    """Greedy decode of output tokens per sequence after the host prompt (batch, length), scheduled as mode.

    stage (a StagedH2D) and drain (a DrainWorker) are made per call when not given.
    trace, when given, gets ("launch", n) as step n's forward is enqueued and ("read", n) as
    token n reaches the host (token 0 comes from prefill, step n makes token n).
    graphs: each step one CUDA-graph replay over a StaticCache, captured after prefill, before the timing (a
    model on the CPU runs the same static-cache steps eagerly: there is no CUDA graph to replay).
    host_prep_us: CPU work per step between its input crossings and its launch (an engine's host preparation).
    """
    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
    dev = next(model.parameters()).device
    cuda = dev.type == "cuda"
    batch, plen = prompt.shape
    st = GraphStepper(model, batch, plen + output) if graphs else Stepper(model)
    own_drain = own_stage = None
    if mode in ("staged", "drain") and stage is None:
        stage = own_stage = StagedH2D(capacity=layout(st.host_inputs(batch, 0))[1], device=dev)
    if mode == "drain" and drain is None:
        drain = own_drain = DrainWorker(max_pending=DRAIN_LAG + 2)
    loop = _Loop(st, dev, prompt, output, mode, stage, drain, trace.append if trace is not None else (lambda _: None),
                 host_prep_us)
    try:
        first, cache = st.prefill(prompt.to(dev))
        if graphs:
            st.capture(first[:, None], [t.to(dev) for t in st.host_inputs(batch, plen)])
        if cuda:
            torch.cuda.synchronize(dev)
        marks.mark("begin")  # the timed steps: account's steady-state window (a trace line where one is written)
        t0 = time.perf_counter()
        schedule = {"sync": loop.sync, "async": loop.pipelined, "staged": loop.pipelined, "drain": loop.drained}
        schedule[mode](first, cache)
        wall = time.perf_counter() - t0
        marks.mark("end")
    finally:
        if own_drain is not None:
            own_drain.close()
    busy = None
    if cuda and loop.marks.n and wall > 0:
        torch.cuda.synchronize(dev)
        busy = min(1.0, loop.marks.total_ms() / 1e3 / wall)
    del own_stage
    tokens = torch.stack([t.reshape(batch).to("cpu", torch.int64) for t in loop.toks], dim=1)
    return Run(tokens, wall, [b - a for a, b in zip(loop.stamps, loop.stamps[1:])], busy, loop.stats)


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


def verdict(judge: Judge, want: tuple[str, torch.Tensor], runs: list[Run], what: str) -> tuple[str | None, set]:
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
            "transformers": transformers().__version__, "drain_lag": DRAIN_LAG, "host_prep_us": host_prep_us,
            "timer": gputimer.choose() if torch.device(dev).type == "cuda" else None,
            "cudnn_attention": False}


def bench(model: str, batches: list[int], prompt: int, output: int, modes: list[str], device: str = "cuda",
          iters: int = 3, warmup: int = 1, graphs: bool = False, seed: int = 0,
          log: Callable[[str], None] = lambda _: None, checkpoint: str | None = None, host_prep_us: float = 0.0):
    """Every (batch, mode): warmup + iters runs; a Result of rows decode:tok_per_s and decode:step_ms.
    checkpoint: a local Hugging Face model folder whose weights ccbridge's loader reads (instead of a
    preset with random weights). host_prep_us: an engine's host work per step (see decode()).

    Tokens of every run are checked against the first run of the first mode at that batch size (see
    Judge: a sequence that parts at a near tie of the reference's logits is counted apart, in the row's
    extra near_ties); each real disagreement is an entry in Result.errors. Under `ccbridge run --record` only
    the timed runs write trace lines."""
    dev = check(None if checkpoint is not None else model, batches, prompt, output, modes, device, graphs)
    check_host_prep(host_prep_us)
    if checkpoint is not None:
        check_checkpoint(checkpoint)
    transformers()  # missing: said before the model is built
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
        res = Result(kind="decode", env=stamp, settings=settings)
        with deterministic_attention(), quiet_cache_rename():  # every mode's tokens comparable bit for bit
            for b in batches:
                ids = prompts(vocab, b, prompt, seed)
                want, judge = None, Judge(m, ids)
                for mode in modes:
                    log(f"batch {b}, {mode}: {warmup} warm-up + {iters} timed runs{memory_note(dev)}")
                    try:
                        runs = measure(m, ids, output, mode, warmup, iters, recording, graphs=graphs,
                                       host_prep_us=host_prep_us)
                    except torch.OutOfMemoryError as e:  # the rows so far stand; the result says where it stopped
                        first = str(e).split(". ")[0]
                        why = f"batch {b}, mode {mode}: {first}{memory_note(dev)}"
                        res.errors.append({"test": "decode", "error": f"{why}; the larger batches and later modes "
                                                                      "did not run"})
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


TIMING_HEADER = f"{'tok/s':>10} {'step ms':>9} {'gap50 ms':>8} {'gap90 ms':>8} {'gpu busy':>8}"


def timing_columns(res, keys: tuple[str, ...]):
    """(row, its timing columns as TIMING_HEADER heads them) for each tok_per_s row of res, in order; its step_ms
    and token_gap_ms rows are those with the same params `keys` (decode's: batch and mode; tp's: tp too)."""
    by = {(*(r.params[k] for k in keys), r.metric): r for r in res.rows}
    for r in res.rows:
        if r.metric != "tok_per_s":
            continue
        key = tuple(r.params[k] for k in keys)
        st, gap = by[(*key, "step_ms")], by[(*key, "token_gap_ms")]
        busy = r.extra.get("gpu_busy")
        yield r, (f"{r.median:>10.1f} {st.median:>9.3f} {gap.median:>8.3f} {gap.p90:>8.3f} "
                  f"{'-' if busy is None else f'{busy:.2f}':>8}")


def tokens_word(extra: dict) -> str:
    """The tokens column: same (with the near ties counted) or DIFFER, from a tok_per_s row's extra."""
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
    if banner := env.emulated_banner(res.env.get("emulation", {})):  # EMULATED, or a projected CC-off run
        head += f"\n# {banner}"
    lines = [head, f"{'batch':>6} {'mode':<7} {TIMING_HEADER}  tokens"]
    for r, timing in timing_columns(res, ("batch", "mode")):
        lines.append(f"{r.params['batch']:>6} {r.params['mode']:<7} {timing}  {tokens_word(r.extra)}")
    return "\n".join(lines)
