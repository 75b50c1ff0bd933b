"""The all-reduce's rail in levels (csrc/plan/rail_levels.h), as pure
arithmetic: the levels a node count and radix give; every node of a level's
group sees the same group and parts; the staging bound holds; and the walk,
run by hand over random data on real slice plans (tiny and odd chunks, fewer
shards than nodes), leaves every node with every shard's sum, each node
reducing the shard the direct exchange gives it.  No processes: the multi-
process runs are the "-radix2" topologies (tests/topologies.py)."""

import math
import random

import numpy as np
import pytest

from fairring_py import _C


@pytest.mark.parametrize(
    "nodes, radix, dims",
    [
        (16, 4, [4, 4]),
        (16, 2, [2, 2, 2, 2]),
        (16, 8, [8, 2]),
        (16, 16, [16]),
        (16, 100, [16]),
        (12, 4, [4, 3]),
        (12, 2, [3, 2, 2]),
        (6, 2, [3, 2]),
        (7, 2, [7]),  # a prime: one level whatever the radix
        (14, 4, [7, 2]),  # a prime factor above the radix stands alone
        (1024, 32, [32, 32]),
        (2, 2, [2]),
        (1, 2, [1]),
    ],
)
def test_levels_of_a_node_count(nodes, radix, dims):
    got = _C._rail_levels_for_test(nodes, radix)
    assert got == dims
    assert math.prod(got) == nodes


def test_auto_radix_direct_below_16_nodes_then_levels_of_8():
    for n in range(1, 70):
        r = _C._auto_rail_radix_for_test(n)
        dims = _C._rail_levels_for_test(n, r)
        assert math.prod(dims) == n
        if n < 16:
            assert dims == [n]
        else:
            assert r == 8
    assert _C._rail_levels_for_test(16, _C._auto_rail_radix_for_test(16)) == [8, 2]
    assert _C._rail_levels_for_test(32, _C._auto_rail_radix_for_test(32)) == [8, 4]
    assert _C._rail_levels_for_test(1024, _C._auto_rail_radix_for_test(1024)) == [8, 8, 8, 2]


def levels_of_all(dims, shards, n):
    return [_C._walk_levels_for_test(dims, [tuple(s) for s in shards], j, n) for j in range(n)]


def check_groups(dims, shards, n):
    """Each level's group agrees on itself and its parts; a node's peers are
    exactly the nodes that differ from it in one digit."""
    walks = levels_of_all(dims, shards, n)
    for j in range(n):
        assert len(walks[j]) == len(dims)
        partners = set()
        for level, lv in enumerate(walks[j]):
            assert len(lv["group"]) == dims[level]
            assert lv["group"][lv["me"]] == j
            for v, peer in enumerate(lv["group"]):
                other = walks[peer][level]
                assert other["group"] == lv["group"] and other["parts"] == lv["parts"] and other["me"] == v
                if peer != j:
                    partners.add(peer)
                    assert _C._level_of_peer_for_test(dims, j, peer) == level
            # The parts tile what the level splits: the previous level's part of ours.
            region = walks[j][level - 1]["parts"][walks[j][level - 1]["me"]] if level else None
            offs = [p[0] for p in lv["parts"]]
            assert offs == sorted(offs)
            for a, b in zip(lv["parts"], lv["parts"][1:]):
                assert a[0] + a[1] == b[0]
            if region is not None:
                assert lv["parts"][0][0] == region[0]
                assert sum(p[1] for p in lv["parts"]) == region[1]
        assert len(partners) == sum(d - 1 for d in dims)
        for peer in set(range(n)) - partners - {j}:
            assert _C._level_of_peer_for_test(dims, j, peer) == -1
    return walks


def simulate(dims, shards, n, rng):
    """The levels run by hand (sum): what every node's chunk holds after."""
    walks = check_groups(dims, shards, n)
    total = shards[-1][0] + shards[-1][1]
    data = [rng.standard_normal(total) for _ in range(n)]
    want = np.sum(data, axis=0)
    chunks = [d.copy() for d in data]
    L = len(dims)
    for level in range(L):
        new = [c.copy() for c in chunks]
        for j in range(n):
            lv = walks[j][level]
            off, cnt = lv["parts"][lv["me"]]
            # The group's pieces of our part, as they were before this level.
            new[j][off:off + cnt] = sum(chunks[p][off:off + cnt] for p in lv["group"])
        chunks = new
    for level in reversed(range(L)):
        new = [c.copy() for c in chunks]
        for j in range(n):
            lv = walks[j][level]
            for v, p in enumerate(lv["group"]):
                off, cnt = lv["parts"][v]
                new[j][off:off + cnt] = chunks[p][off:off + cnt]
        chunks = new
    for j in range(n):
        # Our shard is the part of the last level, as in the direct exchange.
        last = walks[j][-1]
        mine = last["parts"][last["me"]]
        expect = tuple(shards[j]) if j < len(shards) else (total, 0)
        assert mine == expect
        np.testing.assert_allclose(chunks[j], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n, radix", [(4, 2), (6, 2), (8, 2), (8, 4), (12, 4), (16, 2), (16, 4), (9, 3)])
@pytest.mark.parametrize("numel", [1, 7, 1031, 4099, 65537, 262147])
def test_levels_of_real_plans_sum_everywhere(n, radix, numel):
    dims = _C._rail_levels_for_test(n, radix)
    assert len(dims) > 1
    rng = np.random.default_rng(numel * 31 + n)
    seen = 0
    for s in _C._plan_for_test(numel, 4, 1, n):
        for shards in s["shards"]:
            simulate(dims, shards, n, rng)
            seen += 1
    assert seen >= 1


def test_staging_bound_holds():
    """A level-l part is at most shards_per_part(l) of the plan's largest
    shard, and the parts a node receives add up to N - 1 shards' worth."""
    rng = random.Random(5)
    for n, radix in [(16, 4), (16, 2), (12, 4), (8, 2)]:
        dims = _C._rail_levels_for_test(n, radix)
        assert sum((d - 1) * _C._shards_per_part_for_test(dims, level) for level, d in enumerate(dims)) == n - 1
        for _ in range(20):
            numel = rng.randrange(1, 300000)
            for s in _C._plan_for_test(numel, 4, 1, n):
                for shards in s["shards"]:
                    largest = max(c for _, c in shards)
                    for j, walk in enumerate(levels_of_all(dims, shards, n)):
                        for level, lv in enumerate(walk):
                            assert lv["parts"][lv["me"]][1] <= largest * _C._shards_per_part_for_test(dims, level)


def test_which_chunks_go_in_levels():
    """A shard for every node, each at most N KiB (of this element size), contiguous."""
    def even(n, each):
        return [(i * each, each) for i in range(n)]
    assert _C._chunk_in_levels_for_test(even(16, 2048), 16, 4)  # 8 KiB shards
    assert _C._chunk_in_levels_for_test(even(16, 4096), 16, 4)  # 16 KiB: the largest that goes at 16 nodes
    assert not _C._chunk_in_levels_for_test(even(16, 4097), 16, 4)
    assert _C._chunk_in_levels_for_test(even(32, 8192), 32, 4)  # 32 KiB at 32 nodes
    assert not _C._chunk_in_levels_for_test(even(32, 8193), 32, 4)
    assert _C._chunk_in_levels_for_test(even(16, 8192), 16, 2)  # the bytes count, not the elements
    assert not _C._chunk_in_levels_for_test(even(15, 4096), 16, 4)  # fewer shards than nodes
    # A radix the user set: any chunk with a shard for every node.
    assert _C._chunk_in_levels_for_test(even(16, 1 << 20), 16, 4, by_node_count=False)
    assert not _C._chunk_in_levels_for_test(even(15, 4096), 16, 4, by_node_count=False)
    gap = even(4, 1024)
    gap[2] = (gap[2][0] + 64, 1024)
    assert not _C._chunk_in_levels_for_test(gap, 4, 4)
    # Real plans on 16 nodes: an all-reduce's chunks from 16 x 8 KiB to 16 x 16 KiB.
    seen = set()
    for numel in (1, 1031, 32 * 1024, 48 * 1024, 64 * 1024, 256 * 1024):
        for s in _C._plan_for_test(numel, 4, 1, 16):
            for shards in s["shards"]:
                chunk = sum(c for _, c in shards) * 4
                want = len(shards) == 16 and max(c for _, c in shards) * 4 <= 16 << 10
                got = _C._chunk_in_levels_for_test([tuple(x) for x in shards], 16, 4)
                assert got == want
                seen.add(got)
                if want:
                    assert (16 * 8 << 10) - 16 * 64 <= chunk <= 16 * 16 << 10
    assert seen == {True, False}


def test_bad_levels_refused():
    with pytest.raises(Exception, match="levels for 8 nodes on 16"):
        _C._walk_levels_for_test([4, 2], [(0, 4)] * 1, 0, 16)
    with pytest.raises(Exception, match="not contiguous"):
        _C._walk_levels_for_test([2, 2], [(0, 4), (8, 4)], 0, 4)


def test_radix_option():
    """FAIRRING_RAIL_RADIX / Options.rail_radix: 0 (by node count) or at least 2,
    Options over the environment, errors that name the setting."""
    from fairring_py.options import Options, resolve

    assert resolve(environ={}).rail_radix == 0
    assert resolve(environ={"FAIRRING_RAIL_RADIX": "4"}).rail_radix == 4
    assert resolve(Options(rail_radix=2), environ={"FAIRRING_RAIL_RADIX": "8"}).rail_radix == 2
    for bad, says in (("1", "FAIRRING_RAIL_RADIX must be 0 .by node count. or at least 2"),
                      ("-2", "FAIRRING_RAIL_RADIX must be between 0 and"),
                      ("four", "FAIRRING_RAIL_RADIX must be an integer")):
        with pytest.raises(ValueError, match=says):
            resolve(environ={"FAIRRING_RAIL_RADIX": bad})
    with pytest.raises(ValueError, match="Options.rail_radix must be 0"):
        resolve(Options(rail_radix=1), environ={})
