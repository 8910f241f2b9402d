"""A causal LM's decode step as the benches drive it (decode, tensor-parallel decode, the KV bench): the keyword
arguments its transformers version takes, eager or replayed from one CUDA graph over a StaticCache."""

from __future__ import annotations

import inspect

import torch

from ccbridge.errors import UsageError


def transformers():
    """The Hugging Face transformers module, or a UsageError saying how to install it."""
    try:
        import transformers  # deferred: Hugging Face transformers, an optional dependency (seconds of import)
    except ImportError:
        raise UsageError("needs Hugging Face transformers (pip install transformers)") from None
    return transformers


class Stepper:
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


class GraphStepper(Stepper):
    """Decode steps over a transformers StaticCache, replayed from one CUDA graph per run: the step's ids,
    positions and cache position are copied into persistent buffers the graph reads (the inputs' own
    crossings stay outside the graph, as in an engine), then one replay. On the CPU the same buffers and
    cache run eagerly (no capture), so CPU tests check everything but the capture itself."""

    def __init__(self, model, batch: int, max_len: int):
        super().__init__(model)
        dev = next(model.parameters()).device
        # an engine-like model (serve/engine.py) brings its own static cache; transformers' models take theirs
        own = getattr(model, "static_cache", None)
        self.cache = own(batch, max_len) if own else \
            transformers().StaticCache(config=model.config, max_cache_len=max_len)
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
