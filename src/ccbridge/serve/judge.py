"""Do two greedy decodes of one model agree? Where a sequence parts, a near tie of the reference's logits is an
equally valid path; anything else is a wrong token."""

from __future__ import annotations

import torch

from ccbridge.serve.stepper import Stepper

# A different token at a near tie: the reference's logits for the two differ by at most this fraction of its
# largest logit. Random weights make near-flat logits, so ties are common; on a GPU two runs of the same
# bf16 decode can part at one (a kernel's reduction order is not fixed run to run at every batch size).
TIE_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}


class Judge:
    """Compares a run's tokens (batch, output) with the reference's. Each sequence that differs is judged
    where it first parts: the logits of a full prefill (no cache) of the prompt and the reference's tokens
    before that point. A different token within TIE_TOL of the reference's is a near tie (the two decodes
    follow different but equally valid paths from there); anything else is wrong. Judgements are cached:
    runs tend to part at the same ties."""

    def __init__(self, model, prompt: torch.Tensor):
        self.model, self.prompt, self.seen = model, prompt, {}
        self.dev = next(model.parameters()).device
        self.tol = TIE_TOL.get(next(model.parameters()).dtype, 2e-2)
        self.keep = Stepper(model).keep

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
