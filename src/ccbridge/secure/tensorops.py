"""torch.distributed's collectives of one tensor, by the name this torch gives them, looked up at each call (a test
may patch torch.distributed): torch 2.13 names them *_single and warns on every call of the old names, which torch
2.11 has alone."""

from __future__ import annotations

import torch.distributed as dist


def all_gather(out, inp, **kw):
    """Every rank's inp, in rank order, into out (all_gather_single, or all_gather_into_tensor)."""
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, inp, **kw)


def reduce_scatter(out, inp, **kw):
    """inp summed over the ranks, this rank's slice into out (reduce_scatter_single, or reduce_scatter_tensor)."""
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, inp, **kw)


def reduce_op(op, what: str) -> str:
    """"sum" or "avg" for op given as either name or as dist.ReduceOp.SUM / AVG (a SecureGroup stands in for
    torch.distributed); NotImplementedError for any other reduction, naming it."""
    op = getattr(op, "op", op)  # dist.ReduceOp(dist.ReduceOp.SUM), which torch takes too, holds its RedOpType
    named = op if isinstance(op, str) else "sum" if op == dist.ReduceOp.SUM else "avg" if op == dist.ReduceOp.AVG \
        else None
    if named not in ("sum", "avg"):
        raise NotImplementedError(f"encrypted {what} supports sum and avg, not {op}")
    return named
