"""The rail exchange's plan walk (csrc/plan/rail_plan.h), shared by the
TCP and NCCL rails: across all nodes of a rail, what node a sends to node b is
exactly what node b expects from node a, with the same size, for real slice
plans (tiny and odd chunks, fewer shards than nodes).  No processes."""

import pytest

from fairring_py import _C


def walk(shards, node, n):
    return _C._rail_walk_for_test([tuple(s) for s in shards], node, n)


def check_pairing(shards, n):
    """Every transfer of the exchange, matched between its two ends."""
    w = [walk(shards, j, n) for j in range(n)]
    chunk = sum(c for _, c in shards)
    for a in range(n):
        # Sends from a (its pieces of remote shards) and a's served shard cover the chunk once.
        covered = sorted([(o, c) for _, o, c in w[a]["remote"]] + ([tuple(w[a]["served"])] if w[a]["serves"] else []))
        assert covered == sorted(tuple(s) for s in shards), f"node {a} of {n}: covers {covered}, chunk {shards}"
        assert sum(c for _, c in covered) == chunk
        for b in range(n):
            if a == b:
                continue
            to_b = [(o, c) for peer, o, c in w[a]["remote"] if peer == b]
            # b serves a shard iff a sends it one piece (contribution) and waits for one result.
            expects = a in w[b]["contributors"]
            assert len(to_b) == (1 if expects else 0), f"{n} nodes, {shards}: node {a} -> node {b}: {to_b}, expected={expects}"
            if expects:
                assert w[b]["serves"]
                # Same size both ways: the piece a sends, the result b returns.
                assert to_b[0][1] == w[b]["served"][1]
                assert to_b[0] == tuple(w[b]["served"])
    # Nodes past the shard list serve nothing and hear from nobody.
    for j in range(len(shards), n):
        assert not w[j]["serves"] and w[j]["contributors"] == []
    for j in range(len(shards)):
        assert w[j]["serves"] and w[j]["contributors"] == [i for i in range(n) if i != j]


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("numel", [1, 7, 13, 1031, 4099, 8191, 8193, 16384, 24577, 65537, 262147])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_real_plans_pair_up(n, numel, k):
    saw_few = False
    for s in _C._plan_for_test(numel, 4, k, n):
        for shards in s["shards"]:
            assert 1 <= len(shards) <= n
            saw_few |= len(shards) < n
            check_pairing(shards, n)
    if numel <= 1031:  # a few KiB: a single shard, fewer than the nodes
        assert saw_few


@pytest.mark.parametrize("n", [2, 3, 4])
def test_fewer_shards_than_nodes(n):
    for m in range(1, n + 1):
        shards = [(i * 5, 5 if i < m - 1 else 3) for i in range(m)]
        check_pairing(shards, n)
        w = walk(shards, n - 1, n)
        assert w["serves"] == (m == n)
        assert [peer for peer, _, _ in w["remote"]] == [j for j in range(m) if j != n - 1]


def test_tiny_plan_has_one_shard_for_every_node_count():
    # 1 float: one chunk, one shard; only node 0 serves.
    for n in (2, 3, 4):
        (s,) = _C._plan_for_test(1, 4, 2, n)
        assert s["shards"] == [[(0, 1)]]
        assert [walk(s["shards"][0], j, n)["serves"] for j in range(n)] == [True] + [False] * (n - 1)


@pytest.mark.parametrize("shards,node,n", [([], 0, 2), ([(0, 1)] * 3, 0, 2), ([(0, 1)], 2, 2), ([(0, 1)], -1, 2)])
def test_bad_arguments_are_refused(shards, node, n):
    with pytest.raises(Exception, match="bad rail plan"):
        walk(shards, node, n)
