"""nccl-tests' conventions: the bus bandwidth, algorithm bandwidth (bytes / time) times a factor of the operation
and the rank count, so that every collective's figure compares with the links' own speed (nccl-tests,
doc/PERFORMANCE.md), and the size sweep (-b, -e, -f). The one definition for the benches (secure/bench.py,
secure/netbench.py through the CLI) and the peer family (probe/peer.py). Needs no torch."""

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


def sizes(begin: int, end: int, factor: int) -> list[int]:
    """The sweep begin, begin x factor, ... up to end, as nccl-tests' -b/-e/-f: end itself only where it falls on
    a step."""
    out, s = [], begin
    while s <= end:
        out.append(s)
        s *= factor
    return out
