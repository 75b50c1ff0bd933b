"""The rail walk (csrc/plan/rail_walk.h), written once and run by the TCP
rail, the NCCL rail and the staged CUDA rail: across all nodes of a rail,
every transfer node a posts to node b is exactly one transfer that node b
posts from node a, in the same round, of the same shard and size; the served
reductions and the sums that come back follow the pattern (all-reduce: every
node gets every sum, reduce-scatter: none, reduce: only the root's node, the
others an empty answer); for real slice plans (tiny and odd chunks, fewer
shards than nodes).  No processes."""

import collections

import pytest

from fairring_py import _C

BACK_TO = ["all", "none", "0", "1", "last"]


def walk(shards, node, n, pattern="reduce", back_to="all"):
    if back_to == "last":
        back_to = str(n - 1)
    return _C._rail_walk_for_test(pattern, back_to, [tuple(s) for s in shards], node, n)


def check_pairing(shards, n, pattern="reduce", back_to="all"):
    """Every transfer of the exchange matched with its other end; returns the walks."""
    w = [walk(shards, j, n, pattern, back_to) for j in range(n)]
    for rnd_send, rnd_recv in (("sends", "receives"), ("sum_sends", "sum_receives")):
        posted = collections.Counter()
        expected = collections.Counter()
        for a in range(n):
            for peer, shard, count in w[a][rnd_send]:
                assert peer != a
                posted[(a, peer, shard, count)] += 1
            for peer, shard, count in w[a][rnd_recv]:
                assert peer != a
                expected[(peer, a, shard, count)] += 1
        assert posted == expected, f"{pattern} back to {back_to}, {n} nodes, {shards}: {rnd_send} vs {rnd_recv}"
        assert max(posted.values(), default=1) == 1
    return w


def sizes(shards):
    return [c for _, c in shards]


@pytest.mark.parametrize("back_to", BACK_TO)
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("numel", [1, 7, 13, 1031, 4099, 8193, 24577, 262147])
@pytest.mark.parametrize("k", [1, 3])
def test_reductions_of_real_plans_pair_up(back_to, n, numel, k):
    saw_few = False
    for s in _C._plan_for_test(numel, 4, k, n):
        for shards in s["shards"]:
            assert 1 <= len(shards) <= n
            saw_few |= len(shards) < n
            w = check_pairing(shards, n, "reduce", back_to)
            root = n - 1 if back_to == "last" else int(back_to) if back_to.isdigit() else None
            for a in range(n):
                # Our pieces cover every other shard, once; we serve ours iff the plan has one for us.
                assert sorted(sh for _, sh, _ in w[a]["sends"]) == [j for j in range(len(shards)) if j != a]
                assert all(c == shards[sh][1] for _, sh, c in w[a]["sends"])
                assert w[a]["reduces"] == (a < len(shards))
                if w[a]["reduces"]:
                    assert w[a]["served"] == a and w[a]["served_count"] == shards[a][1]
                    assert sorted(p for p, _, _ in w[a]["receives"]) == [i for i in range(n) if i != a]
                else:
                    assert w[a]["receives"] == [] and w[a]["sum_sends"] == []
                # Where the sums go.
                got_sums = [sh for _, sh, c in w[a]["sum_receives"] if c > 0]
                gets_all = back_to == "all" or (root is not None and a == root)
                nonempty = [j for j in range(len(shards)) if j != a and shards[j][1] > 0]
                assert got_sums == (nonempty if gets_all else [])
                if root is not None and a != root:  # an empty answer from each server
                    assert sorted(p for p, _, c in w[a]["sum_receives"] if c == 0) == [
                        j for j in range(len(shards)) if j != a
                    ]
                if back_to == "none":
                    assert w[a]["sum_receives"] == [] and w[a]["sum_sends"] == []
                # What the chunk's memory sees.
                assert w[a]["shards_read"] == [j for j in range(len(shards)) if shards[j][1] > 0]
                written = set(got_sums) | ({a} if w[a]["reduces"] and shards[a][1] > 0 else set())
                assert w[a]["shards_written"] == sorted(written)
                assert w[a]["sends_sum_data"] == any(c > 0 for _, _, c in w[a]["sum_sends"])
    if numel <= 1031:  # a few KiB: a single shard, fewer than the nodes
        assert saw_few


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("numel", [1, 7, 1031, 262147])
def test_shared_chunks_pair_up(n, numel):
    for s in _C._plan_for_test(numel, 4, 2, n, collective="all_gather"):
        for shards in s["shards"]:
            if len(shards) != n:
                continue
            w = check_pairing(shards, n, "share")
            for a in range(n):
                assert [(p, sh) for p, sh, _ in w[a]["sends"]] == [(j, a) for j in range(n) if j != a]
                assert [(p, sh) for p, sh, _ in w[a]["receives"]] == [(j, j) for j in range(n) if j != a]
                assert not w[a]["reduces"] and w[a]["sum_sends"] == [] and w[a]["sum_receives"] == []
                assert w[a]["shards_written"] == [j for j in range(n) if j != a and shards[j][1] > 0]


def test_broadcast_like_share_sends_only_from_the_root_node():
    # Only node 1 has data: the others' messages are empty (they carry the key).
    shards = [(0, 0), (0, 5), (5, 0)]
    w = check_pairing(shards, 3, "share")
    assert [c for _, _, c in w[1]["sends"]] == [5, 5]
    assert [c for _, _, c in w[0]["sends"]] == [0, 0]
    assert w[0]["shards_read"] == [] and w[0]["shards_written"] == [1]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_fewer_shards_than_nodes(n):
    for m in range(1, n + 1):
        shards = [(i * 5, 5 if i < m - 1 else 3) for i in range(m)]
        for back_to in BACK_TO:
            check_pairing(shards, n, "reduce", back_to)
        w = walk(shards, n - 1, n)
        assert w["reduces"] == (m == n)
        assert [peer for peer, _, _ in w["sends"]] == [j for j in range(m) if j != n - 1]


def test_tiny_plan_has_one_shard_for_every_node_count():
    # 1 float: one chunk, one shard; only node 0 serves.
    for n in (2, 3, 4):
        (s,) = _C._plan_for_test(1, 4, 2, n)
        assert s["shards"] == [[(0, 1)]]
        assert [walk(s["shards"][0], j, n)["reduces"] for j in range(n)] == [True] + [False] * (n - 1)


@pytest.mark.parametrize(
    "pattern,back_to,shards,node,n",
    [
        ("reduce", "all", [], 0, 2),
        ("reduce", "all", [(0, 1)] * 3, 0, 2),
        ("reduce", "all", [(0, 1)], 2, 2),
        ("reduce", "all", [(0, 1)], -1, 2),
        ("reduce", "2", [(0, 1)], 0, 2),
        ("share", "all", [(0, 1)], 0, 2),
    ],
)
def test_bad_arguments_are_refused(pattern, back_to, shards, node, n):
    with pytest.raises(Exception, match="bad rail walk"):
        walk(shards, node, n, pattern, back_to)


@pytest.mark.parametrize("n,per_node", [(2, 1), (2, 3), (3, 2), (4, 1)])
def test_exchanges_pair_up_piece_by_piece(n, per_node):
    # Node a's p-th piece for node b has (a + 2b + p) % 4 elements (zeros too);
    # node b expects exactly that from a.  Every transfer a posts to b is
    # the one b posts from a, in the same place in the channel's order.
    def count(a, b, p):
        return (a + 2 * b + p) % 4

    walks = []
    for a in range(n):
        shards = [(0, count(a, b, p)) for b in range(n) for p in range(per_node)]
        received = [(0, count(b, a, p)) for b in range(n) for p in range(per_node)]
        walks.append(_C._rail_walk_for_test("exchange", "all", shards, a, n, received))
    for a in range(n):
        w = walks[a]
        assert not w["reduces"] and not w["sum_sends"] and not w["sum_receives"]
        for b in range(n):
            sent = [(shard, c) for peer, shard, c in w["sends"] if peer == b]
            got = [(shard, c) for peer, shard, c in walks[b]["receives"] if peer == a]
            if a == b:
                assert not sent, "a node's own pieces do not travel"
                continue
            assert [c for _, c in sent] == [count(a, b, p) for p in range(per_node)]
            assert [c for _, c in got] == [c for _, c in sent]
            # Each end indexes its own list: the destination's pieces when
            # sending, the source's when receiving.
            assert [s for s, _ in sent] == [b * per_node + p for p in range(per_node)]
            assert [s for s, _ in got] == [a * per_node + p for p in range(per_node)]


@pytest.mark.parametrize(
    "shards,received,n",
    [([(0, 1)], [(0, 1)], 2), ([(0, 1)] * 3, [(0, 1)] * 3, 2), ([(0, 1)] * 2, [(0, 1)], 2)],
    ids=["fewer-than-nodes", "not-a-multiple", "received-differs"],
)
def test_bad_exchanges_are_refused(shards, received, n):
    with pytest.raises(Exception, match="bad rail walk"):
        _C._rail_walk_for_test("exchange", "all", shards, 0, n, received)
