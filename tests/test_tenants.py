"""Tenant placement on a node's partitions (ccbridge.tenants), against an exhaustive search."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from ccbridge import tenants
from ccbridge.errors import CCBridgeError, UsageError
from ccbridge.tenants import Partition, free_blocks, plan


def packings(n: int, busy: frozenset[int], size: int | None = None, offset: int = 0):
    """Every set of pairwise disjoint aligned blocks of the node clear of busy GPUs (677 on a free 8-GPU node)."""
    size = n if size is None else size
    block = Partition(n, size, offset)
    out = [[]] if block.gpus & busy else [[], [block]]
    if size == 1:
        return out
    halves = [packings(n, busy, size // 2, offset + h) for h in (0, size // 2)]
    return ([[block]] if not block.gpus & busy else []) + [a + b for a in halves[0] for b in halves[1]]


def best_by_counts(n: int, busy: frozenset[int]) -> dict[tuple[int, ...], tuple]:
    """For each count of blocks per size a packing can hold: the best free space it can leave."""
    best: dict[tuple[int, ...], tuple] = {}
    for p in packings(n, busy):
        counts = tuple(sum(b.size == s for b in p) for s in tenants.SIZES)
        taken = busy.union(*(b.gpus for b in p))
        best[counts] = max(best.get(counts, ()), free_blocks(n, taken))
    return best


def brute_force(n: int, busy: frozenset[int], requests: list[int], best: dict) -> tuple:
    """The objective's best value over every placement of these requests (tenants of one size are alike)."""
    asked = [requests.count(s) for s in tenants.SIZES]
    scores = []
    for counts, free in best.items():
        if all(c <= a for c, a in zip(counts, asked)):
            sizes = tuple(sorted((s for s, c in zip(tenants.SIZES, counts) for _ in range(c)), reverse=True))
            scores.append((sum(sizes), sizes, free))
    return max(scores)


def valid(p: tenants.Plan) -> None:
    seen = set(p.busy)
    for t in p.placed:
        part = t.partition
        assert part.size == t.size and part.offset % part.size == 0 and part.offset + part.size <= p.n
        assert not part.gpus & seen
        seen |= part.gpus
    assert all(t.why for t in p.tenants if not t.partition)


def mixes(most: dict[int, int]):
    """Every multiset of sizes with at most most[s] tenants of size s, as request lists (not empty)."""
    for counts in itertools.product(*(range(most[s] + 1) for s in tenants.SIZES)):
        if any(counts):
            yield [s for s, c in zip(tenants.SIZES, counts) for _ in range(c)]


def test_the_packing_search_is_complete():
    """The search counts what the buddy tree allows: 677 ways on 8 free GPUs, 26 on 4, 5 on 2."""
    assert [len(packings(n, frozenset())) for n in (2, 4, 8)] == [5, 26, 677]


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_every_busy_set_and_request_mix(n):
    """Every set of GPUs already taken, with every mix of sizes up to one tenant more of each size than the
    node's free aligned blocks can hold (so beyond its GPUs in total too): the plan is valid and scores
    what the exhaustive search finds best, whatever the order of the request."""
    rng = random.Random(26)
    checked = 0
    for k in range(n + 1):
        # a busy GPU rules out one aligned block of every size at least
        most = {s: (n // s + (k == 0) if s <= n else 1) for s in tenants.SIZES}
        requests_all = list(mixes(most))
        for busy in map(frozenset, itertools.combinations(range(n), k)):
            best = best_by_counts(n, busy)
            for requests in requests_all:
                requests = rng.sample(requests, len(requests))
                p = plan(n, requests, busy=busy)
                valid(p)
                assert p.score() == brute_force(n, busy, requests, best), (n, sorted(busy), requests)
                checked += 1
    if n == 8:
        assert checked == 719 + 255 * 269  # the free node's mixes (9/5/3/2 tenants of 1/2/4/8 at most), the busy ones' (8/4/2/1)


def test_best_fit_keeps_the_large_block():
    """GPU 0 busy: a 1-GPU tenant goes beside it (GPU 1), leaving 4-7 whole for a 4-GPU tenant."""
    p = plan(8, [1], busy=[0])
    assert p.placed[0].partition.gpus == {1} and p.largest_placeable == 4 and p.free == [2, 3, 4, 5, 6, 7]
    # first fit would also take GPU 1 here; with 0-1 busy the 1-GPU tenant must go to 2, not 4
    assert plan(8, [1], busy=[0, 1]).placed[0].partition.gpus == {2}
    assert plan(8, [1, 4], busy=[0, 1]).score()[0] == 5


def test_the_issue_example_and_what_does_not_fit():
    p = plan(8, [4, 2, 2, 1])
    assert [sorted(t.partition.gpus) for t in p.placed] == [[0, 1, 2, 3], [4, 5], [6, 7]]
    (left,) = [t for t in p.tenants if not t.partition]
    assert left.request == 4 and left.size == 1 and "no wholly free aligned block of 1 GPU" in left.why
    assert p.free == [] and p.largest_placeable == 0
    assert "larger than the 4-GPU node" in plan(4, [8]).tenants[0].why


def test_partition_ids_are_the_15_definitions():
    ids = {p.id: (p.size, p.offset) for p in tenants.partitions(8)}
    assert sorted(ids) == list(range(15))
    assert ids[0] == (8, 0) and ids[1] == (4, 0) and ids[2] == (4, 4) and ids[3] == (2, 0) and ids[14] == (1, 7)
    assert [sum(p.size == s for p in tenants.partitions(8)) for s in (8, 4, 2, 1)] == [1, 2, 4, 8]


def test_protected_pcie_gives_the_whole_complex_to_one_tenant():
    p = plan(8, [2, 4, 1], mode="protected-pcie")
    (t,) = p.placed
    assert t.request == 2 and t.partition.gpus == set(range(8)) and t.partition.id == 0
    assert all("whole GPU complex" in x.why for x in p.tenants if not x.partition)
    assert any("asked for 4 GPUs and holds all 8" in note for note in p.notes)
    assert p.largest_placeable == 0 and p.free == []
    held = plan(8, [1], mode="protected-pcie", busy=[3])  # another tenant holds the complex
    assert not held.placed and held.largest_placeable == 0
    assert plan(4, [8, 2], mode="protected-pcie").placed[0].request == 2


@pytest.mark.parametrize("args, message", [
    ((3, [1]), "3 GPUs: a node is partitioned in aligned halves"),
    ((16, [1]), "has 1, 2, 4 or 8 GPUs"),
    ((8, [3]), "tenant size 3: a fabric partition holds 1, 2, 4 or 8 GPUs"),
    ((8, [16]), "tenant size 16"),
    ((8, []), "no tenant requested"),
    ((8, [1] * 65), "65 tenants requested: at most 64"),
    ((8, [1], "nvlink"), "mode 'nvlink': expected one of nvle, protected-pcie"),
    ((8, [1], "nvle", [8]), "busy GPU 8: the node's GPUs are 0..7"),
    ((8, [1], "nvle", [1, 1]), "a GPU is given twice"),
])
def test_bad_input(args, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan(*args)


def _stamp(tmp_path, mode="nvle", cliques=((0, 1, 2, 3),), gpus=8, fabric=True, **nvml):
    doc = {"ccbridge": "0", "emulation": {"active": False},
           "nvml": {"available": True, "gpus": [{"index": i} for i in range(gpus)],
                    "cc": {"mode": "on", "multi_gpu_mode": mode}, **nvml}}
    if fabric:
        doc["nvml"]["fabric"] = {"cliques": [{"cluster_uuid": "u", "clique_id": i, "gpus": list(c)}
                                             for i, c in enumerate(cliques)]}
    if mode is None:
        del doc["nvml"]["cc"]["multi_gpu_mode"]
    path = tmp_path / "env.json"
    path.write_text(json.dumps(doc))
    return path


def test_the_live_state_from_an_env_stamp(tmp_path):
    assert tenants.from_stamp(_stamp(tmp_path, cliques=[(0, 1, 2, 3), (6,)])) == (8, "nvle", frozenset({0, 1, 2, 3, 6}))
    assert tenants.from_stamp(_stamp(tmp_path, mode="protected-pcie", cliques=[], gpus=4)) == (4, "protected-pcie",
                                                                                            frozenset())


def test_the_live_state_from_a_result(tmp_path):
    from conftest import DATA

    doc = json.loads((DATA / "h100-native-full.json").read_text())
    doc["env"]["nvml"]["cc"]["multi_gpu_mode"] = "nvle"
    doc["env"]["nvml"]["fabric"] = {"cliques": []}
    (tmp_path / "result.json").write_text(json.dumps(doc))
    n, mode, busy = tenants.from_stamp(tmp_path / "result.json")
    assert (n, mode, busy) == (len(doc["env"]["nvml"]["gpus"]), "nvle", frozenset())


@pytest.mark.parametrize("kw, message", [
    ({"fabric": False}, "no fabric state (nvml.fabric.cliques)"),
    ({"mode": None}, "the stamp has no multi-GPU CC mode"),
    ({"mode": "none"}, "multi-GPU CC mode is none"),
    ({"mode": "unknown(7)"}, "multi-GPU CC mode 'unknown(7)'"),
    ({"gpus": 3}, "the stamp sees 3 GPUs"),
    ({"gpus": 0}, "the stamp saw no GPU"),
    ({"cliques": [(2, 3, 4, 5)]}, "holds GPUs 2-5, not a fabric partition of 8"),
    ({"cliques": [(0, 1), (1,)]}, "cliques[1] lists a GPU that another clique holds"),
    ({"cliques": [(8,)]}, "cliques[0].gpus must list GPU indices 0..7"),
])
def test_a_stamp_that_cannot_be_planned_from(tmp_path, kw, message):
    with pytest.raises(CCBridgeError) as e:
        tenants.from_stamp(_stamp(tmp_path, **kw))
    assert message in str(e.value)


def test_render_fits_120_columns_and_says_activation_is_context():
    for p in (plan(8, [4, 2, 2, 1, 8], busy=[5]), plan(8, [1] * 64), plan(8, [2], mode="protected-pcie")):
        text = tenants.render(p)
        assert max(map(len, text.splitlines())) <= 120
        assert "10-20 s per tenant (Serialized Bridge paper): context, not measured here" in text
        assert ("1-2 = 4s" in text) == (p.mode == "nvle")  # no fabric partition legend for the whole complex
        assert ("rule: most GPUs placed" in text) == bool(p.unplaced and p.mode == "nvle")
    assert tenants.render(plan(1, [1])).startswith("# 1 GPU, ")
    doc = plan(8, [4, 2], busy=[0]).as_dict()
    assert doc["tenants"][0] == {"request": 1, "size": 4, "placed": True, "gpus": [4, 5, 6, 7], "partition_id": 2,
                                 "why": ""}
    assert doc["tenants"][1]["gpus"] == [2, 3] and doc["free_gpus"] == [1] and doc["largest_placeable"] == 1
    assert json.loads(json.dumps(doc)) == doc


def test_the_command(tmp_path, capsys):
    """plan-tenants prints the plan in 120 columns and writes the same plan as JSON; a stamp sets the node."""
    from ccbridge import cli

    out = tmp_path / "plan.json"
    # GPU 0 busy: the second tenant of 2 finds no aligned pair, so the answer is no (exit 1) and --json says so
    assert cli.main(["plan-tenants", "--request", "4", "2", "2", "1", "--busy", "0", "--json", str(out)]) == 1
    text = capsys.readouterr().out
    assert max(map(len, text.splitlines())) <= 120 and "#1" in text and "4-7" in text
    doc = json.loads(out.read_text())
    assert doc == plan(8, [4, 2, 2, 1], busy=[0]).as_dict()
    assert (doc["placed"], doc["unplaced"]) == (3, 1) and "not placed: #3 (2 GPUs)" in text
    out = tmp_path / "plan2.json"  # (an existing --json file is refused: the first plan is kept)
    assert cli.main(["plan-tenants", "--request", "4", "2", "1", "--busy", "0", "--json", str(out)]) == 0
    assert (json.loads(out.read_text())["placed"], json.loads(out.read_text())["unplaced"]) == (3, 0)
    capsys.readouterr()
    assert cli.main(["plan-tenants", "--request", "8", "--gpus", "4"]) == 1  # larger than the node: nothing placed
    assert "not placed: #1 (8 GPUs): larger than the 4-GPU node" in capsys.readouterr().out
    stamp = _stamp(tmp_path, mode="protected-pcie", cliques=[], gpus=4)
    assert cli.main(["plan-tenants", "--request", "2", "--from-stamp", str(stamp)]) == 0
    text = capsys.readouterr().out
    assert f"# 4 GPUs, protected PCIe (whole complex); busy before: - (from {stamp})" in text
    assert "asked for 2 GPUs and holds all 4" in text
