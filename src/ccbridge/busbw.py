"""nccl-tests' bus bandwidth: algorithm bandwidth (bytes / time) times a factor of the operation and the rank
count, so that every collective's figure compares with the links' own speed (nccl-tests, doc/PERFORMANCE.md).
The one definition for the collectives bench (secure/bench.py) and the peer family (probe/peer.py)."""

from __future__ import annotations

# op: (the factor as nccl-tests writes it, the factor for n ranks)
_FACTORS = {
    "all_reduce": ("2(n-1)/n", lambda n: 2 * (n - 1) / n),
    "all_gather": ("(n-1)/n", lambda n: (n - 1) / n),
    "reduce_scatter": ("(n-1)/n", lambda n: (n - 1) / n),
    "broadcast": ("1", lambda n: 1.0),
    "sendrecv": ("1", lambda n: 1.0),
}
OPS = tuple(_FACTORS)


def factor(op: str, n: int) -> float:
    """Bus bandwidth over algorithm bandwidth for `op` on n ranks."""
    return _FACTORS[op][1](n)


def formula(op: str) -> str:
    """The factor as nccl-tests writes it, e.g. "2(n-1)/n"."""
    return _FACTORS[op][0]
