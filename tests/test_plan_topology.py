"""The pure logic behind the schedule: topology grouping and slice planning.
No processes: these call the C++ functions directly."""

import re

import pytest

from fairring_py import _C


def topo(keys, rank):
    return _C._topology_for_test(keys, rank)


def test_contiguous_nodes():
    keys = ["a", "a", "b", "b"]
    t = [topo(keys, r) for r in range(4)]
    assert [x["node"] for x in t] == [0, 0, 1, 1]
    assert [x["local_rank"] for x in t] == [0, 1, 0, 1]
    assert t[0]["node_ranks"] == [[0, 1], [2, 3]]
    assert t[1]["rail"] == [1, 3]
    assert not any(x["flattened"] for x in t)


def test_interleaved_nodes_ordered_by_lowest_rank():
    keys = ["y", "x", "y", "x", "y", "x"]
    t = topo(keys, 3)
    assert t["node_ranks"] == [[0, 2, 4], [1, 3, 5]]
    assert (t["node"], t["local_rank"]) == (1, 1)
    assert t["rail"] == [2, 3]
    # Every rank computes the same grouping.
    assert all(topo(keys, r)["node_ranks"] == t["node_ranks"] for r in range(6))


def test_single_node_and_single_rank_nodes():
    t = topo(["h"] * 3, 2)
    assert (t["num_nodes"], t["ranks_per_node"], t["local_rank"]) == (1, 3, 2)
    t = topo(["a", "b", "c"], 1)
    assert (t["num_nodes"], t["ranks_per_node"], t["node"]) == (3, 1, 1)
    assert t["rail"] == [0, 1, 2]


def test_uneven_nodes_keep_their_nodes_with_one_rail_per_rank_of_the_smallest():
    keys = ["a", "a", "b", "a", "b"]  # 3 + 2
    t = [topo(keys, r) for r in range(5)]
    assert all(x["uneven"] and not x["flattened"] for x in t)
    assert t[0]["node_ranks"] == [[0, 1, 3], [2, 4]]
    assert [x["rails"] for x in t] == [2] * 5
    assert [x["ranks_per_node"] for x in t] == [3, 3, 2, 3, 2]
    assert [(x["node"], x["local_rank"]) for x in t] == [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1)]
    # Local ranks 0 and 1 of both nodes carry the two rails; rank 3 (local
    # rank 2 of the larger node) is passive.
    assert (t[0]["rail"], t[1]["rail"], t[4]["rail"]) == ([0, 2], [1, 4], [1, 4])
    assert t[3]["rail"] == []
    t = topo(["a", "a", "b"], 2)
    assert (t["num_nodes"], t["ranks_per_node"], t["rails"], t["node"]) == (2, 1, 1, 1)
    assert t["rail"] == [0, 2]


def test_even_nodes_are_not_uneven():
    t = topo(["a", "a", "b", "b"], 3)
    assert not t["uneven"] and t["rails"] == t["ranks_per_node"] == 2


def test_bad_rank_rejected():
    with pytest.raises(Exception):
        topo(["a"], 1)


@pytest.mark.parametrize("count", [0, 1, 5, 63, 64, 65, 1000, 4099])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7])
def test_split_even_covers_exactly(count, parts):
    ranges = _C._split_even_for_test(count, parts, 16)
    assert len(ranges) == parts
    offset = 0
    for i, (o, n) in enumerate(ranges):
        assert o == offset and n >= 0
        if i < parts - 1:
            assert o % 16 == 0 and n % 16 == 0  # aligned boundaries
        offset += n
    assert offset == count
    sizes = [n for _, n in ranges[:-1]]
    if sizes:
        assert max(sizes) - min(sizes) <= 16  # even


def check_plan(numel, elem, k, n, **kw):
    slices = _C._plan_for_test(numel, elem, k, n, **kw)
    assert len(slices) >= 1
    covered = 0
    for s in slices:
        off, cnt = s["slice"]
        assert off == covered
        covered += cnt
        c_cov = 0
        assert 1 <= len(s["chunks"]) <= k
        for ci, (co, cc) in enumerate(s["chunks"]):
            assert co == c_cov
            c_cov += cc
            shards = s["shards"][ci]
            assert 1 <= len(shards) <= n
            assert sum(x[1] for x in shards) == cc
        assert c_cov == cnt
    assert covered == numel
    return slices


@pytest.mark.parametrize("numel", [0, 1, 2, 13, 1031, 65537, 3_000_017])
@pytest.mark.parametrize("k,n", [(1, 1), (2, 1), (1, 2), (2, 2), (4, 3)])
def test_plan_covers_tensor(numel, k, n):
    check_plan(numel, 4, k, n, slice_bytes=64 << 10)


def test_large_slices_use_every_rank_and_node():
    s = check_plan(1 << 20, 4, 4, 3, slice_bytes=1 << 20)
    assert len(s) == 4
    assert all(len(x["chunks"]) == 4 and len(x["shards"][0]) == 3 for x in s)


def test_small_message_uses_fewer_pieces():
    # 4 KiB on 4 ranks x 3 nodes: one chunk, one shard (one server per rail).
    s = check_plan(1024, 4, 4, 3)
    assert len(s) == 1 and len(s[0]["chunks"]) == 1 and len(s[0]["shards"][0]) == 1
    # 128 KiB: two chunks of 64 KiB, each on every node (three shards of more than 8 KiB).
    s = check_plan(32 * 1024, 4, 4, 3)
    assert len(s[0]["chunks"]) == 2 and len(s[0]["shards"][0]) == 3


def test_small_slices_spread_over_the_nodes_in_shards_of_8_kib():
    # One rank on each of 8 nodes: a shard's server receives 7 pieces however
    # many shards there are, so a 64 KiB slice goes to all 8 (8 KiB each),
    # not to two servers of 32 KiB whose links would carry four times the bytes.
    for kib, shards in ((4, 1), (8, 1), (16, 2), (24, 3), (64, 8), (256, 8)):
        s = check_plan(kib * 256, 4, 1, 8)
        assert [len(x["shards"][0]) for x in s] == [shards], (kib, s)


def test_replicated_only_for_one_chunk_on_one_node():
    # One node: a slice too small to split is reduced by every local rank.
    assert [x["replicated"] for x in check_plan(1024, 4, 4, 1)] == [True]
    # Large enough for two chunks, or several nodes, or a rank alone: not replicated.
    assert [x["replicated"] for x in check_plan(32 * 1024, 4, 4, 1)] == [False]
    assert [x["replicated"] for x in check_plan(1024, 4, 4, 3)] == [False]
    assert [x["replicated"] for x in check_plan(1024, 4, 1, 1)] == [False]


def test_slices_are_balanced():
    s = check_plan(1_000_003, 4, 2, 2, slice_bytes=1 << 20)
    counts = [x["slice"][1] for x in s]
    assert max(counts) - min(counts) <= 16 + 3


@pytest.mark.parametrize("k,n", [(1, 2), (2, 2), (4, 3), (8, 16), (1, 7)])
@pytest.mark.parametrize("elem", [1, 2, 4, 8])
def test_shard_bound_holds_for_every_plan(k, n, elem):
    # The reduction servers' staging buffers are sized by this bound.
    kw = dict(slice_bytes=256 << 10, min_chunk_bytes=16 << 10, min_shard_bytes=4 << 10)
    bound = _C._max_shard_bytes_for_test(k, n, kw["slice_bytes"], kw["min_chunk_bytes"], kw["min_shard_bytes"])
    numels = [1, 63, 1000, 4097, 9999, 40_000, 70_001, 300_007, 1_000_003]
    numels += [x // elem for x in (kw["min_chunk_bytes"] * j + d for j in range(1, 2 * k + 2) for d in (-64, 0, 64))]
    for numel in numels:
        for s in _C._plan_for_test(numel, elem, k, n, **kw):
            for shards in s["shards"]:
                assert max(c for _, c in shards) * elem <= bound, (numel, elem, k, n)


def test_allreduce_phase_list():
    """The all-reduce is reduce-scatter phases then all-gather phases of the one
    slice schedule (csrc/pipeline/slice_schedule.h); the pipeline splits them
    after the exchange, so several slices overlap their rail traffic."""
    phases, front = _C._phases_for_test("all_reduce", 4)
    assert phases == ["acquire", "publish-input", "reduce-chunk", "exchange", "gather", "release"]
    assert phases[front - 1] == "exchange" and phases[front] == "gather"
    # A node of one rank has no node protocol: its slice goes to the rails as it is.
    phases, front = _C._phases_for_test("all_reduce", 1)
    assert phases == ["exchange", "gather"] and front == 1
    # A barrier is an all-reduce of one byte, under its own kind.
    assert _C._phases_for_test("barrier", 2) == _C._phases_for_test("all_reduce", 2)
    with pytest.raises(ValueError, match="no collective named"):
        _C._phases_for_test("alltoall", 2)


def test_every_collective_is_listed_once():
    """FAIRRING_COLLECTIVES (csrc/common/op_key.h) is the one list of the
    collectives: each kind has one number and one name, a definition of its
    own kind, words for messages, and a shape that agrees with its cut; the
    front of every script ends where the slice goes to the rails."""
    listed = _C._collectives_for_test()
    names = [c["name"] for c in listed]
    numbers = [c["number"] for c in listed]
    assert len(set(names)) == len(names) and len(set(numbers)) == len(numbers), listed
    assert {"all_reduce", "barrier", "broadcast", "reduce", "reduce_scatter", "all_gather", "all_to_all",
            "gather", "scatter", "all_to_all_sizes", "all_gatherv"} <= set(names)
    for c in listed:
        assert re.fullmatch(r"[a-z_]+", c["name"]), c
        assert c["def_kind"] == c["number"] == c["named"], c
        assert c["describe"].startswith(c["name"]) and "collective " not in c["describe"], c
        assert c["blockwise"] == (c["input_per_rank"] or c["output_per_rank"]), c
        for script in (c["node_script"], c["alone_script"]):
            front, back = script
            assert front and back, c
            assert front[-1].startswith("exchange"), c
    # A kind outside the list (a peer's newer build) is named by its number.
    unknown = max(numbers) + 1
    assert _C._describe_kind_for_test(unknown).startswith(f"collective {unknown}")


def test_blockwise_phase_lists():
    """Reduce-scatter stops at the rails (no all-gather half: the result stays
    with the rank it belongs to, or, on uneven nodes, with its carrier until it
    takes it); all-gather has no reduction, and a rail waits for its passive
    ranks' pieces before it shares them."""
    phases, front = _C._phases_for_test("reduce_scatter", 2)
    assert phases == ["acquire", "stage-blocks", "reduce-blocks", "exchange-blocks", "take-piece", "release"]
    assert phases[front - 1] == "exchange-blocks"
    phases, front = _C._phases_for_test("all_gather", 3)
    assert phases == ["acquire", "publish-block", "await-carried", "exchange-blocks", "gather-blocks", "release"]
    assert phases[front - 1] == "exchange-blocks"
    for name in ("reduce_scatter", "all_gather", "all_to_all"):
        assert _C._phases_for_test(name, 1) == (["exchange-blocks", "await-own"], 1)
    # All-to-all: the node's pieces through shared memory after the rail post,
    # so the local copies overlap the rail traffic.
    phases, front = _C._phases_for_test("all_to_all", 2)
    assert phases == ["acquire", "publish-blocks", "exchange-blocks", "local-blocks", "take-landed", "await-own",
                      "release"]
    assert phases[front - 1] == "exchange-blocks"
    # Gather and scatter: the rail post ends the front half; the root's copies follow.
    assert _C._phases_for_test("gather", 2) == (
        ["acquire", "publish-piece", "exchange", "to-root", "await-own", "release"], 3)
    assert _C._phases_for_test("scatter", 2) == (
        ["acquire", "publish-blocks", "exchange", "from-root", "await-own", "release"], 3)


@pytest.mark.parametrize("numel,elem,k,n,slice_bytes", [
    (0, 4, 2, 2, 1 << 20), (1, 4, 2, 2, 1 << 20), (1031, 2, 3, 1, 4096), (262147, 4, 2, 2, 65536),
    (65537, 8, 1, 3, 4096), (100003, 1, 4, 2, 1 << 20),
])
def test_blockwise_plan(numel, elem, k, n, slice_bytes):
    """Slice i is the same piece of every rank's block: the pieces cover a
    block exactly once, in order; chunk x holds every node's piece of local
    rank x; the W pieces fit in a slot area (a slice)."""
    plans = _C._plan_for_test(numel, elem, k, n, slice_bytes=slice_bytes, collective="reduce_scatter")
    assert plans == _C._plan_for_test(numel, elem, k, n, slice_bytes=slice_bytes, collective="all_gather")
    at = 0
    for p in plans:
        off, c = p["slice"]
        assert off == at
        at += c
        assert k * n * c * elem <= slice_bytes
        assert p["chunks"] == [(x * n * c, n * c) for x in range(k)]
        assert p["shards"] == [[(j * c, c) for j in range(n)]] * k
        assert not p["replicated"]
    assert at == numel
    assert len(plans) >= 1  # an empty block still has a slice, so ranks match it


@pytest.mark.parametrize("numel,elem,k,n,slice_bytes", [
    (1, 4, 2, 2, 1 << 20), (262147, 4, 2, 2, 65536), (65537, 8, 1, 3, 4096), (100003, 1, 4, 2, 1 << 20),
    (300007, 2, 2, 3, 65536), (1 << 20, 4, 1, 5, 1 << 20), (99991, 4, 3, 4, 4096), (12345, 8, 2, 8, 1 << 16),
])
def test_exchange_fits_the_staged_rails_pinned_memory(numel, elem, k, n, slice_bytes):
    """The staged CUDA rail puts a rank's sent and received pieces of an
    exchange side by side in one slot's pinned memory, sized by
    exchange_staging_bytes: for every slice of every blockwise op, the
    all-to-all's walk (the largest exchange: K pieces to and from every
    other node) and the gather's and scatter's must fit."""
    area = -(-slice_bytes // 256) * 256  # the CUDA engine's slot area
    room = _C._exchange_staging_bytes_for_test(area, n)
    assert room >= area
    assert room < 2 * area
    for p in _C._plan_for_test(numel, elem, k, n, slice_bytes=slice_bytes, collective="all_to_all"):
        c = p["slice"][1]
        for node in range(n):
            mine = [(0, 0 if j // k == node else c) for j in range(n * k)]
            w = _C._rail_walk_for_test("exchange", "all", mine, node, n, mine)
            moved = sum(t[2] for t in w["sends"]) + sum(t[2] for t in w["receives"])
            assert moved == 2 * (n - 1) * k * c
            assert moved * elem <= room, (node, c, moved * elem, room)
        # Gather and scatter: one piece out, or N - 1 in.
        assert max(c, (n - 1) * c) * elem <= room


def test_blockwise_fits():
    # A slice holds at least one aligned unit (64 bytes) per rank, and then some.
    assert _C._blockwise_fits_for_test(4, 8, 4096)
    assert not _C._blockwise_fits_for_test(4, 64, 4096)
    assert _C._blockwise_fits_for_test(4, 64, 1 << 20)


@pytest.mark.parametrize("text,expected", [
    ("32768K", 32 << 20), ("1M\n", 1 << 20), ("2G", 2 << 30), ("512", 512), ("48K ", 48 << 10),
    ("", 0), ("K", 0), ("12X", 0), ("-1K", 0), ("1.5M", 0), ("99999999999999999999K", 0),
])
def test_cache_size_as_sysfs_writes_it(text, expected):
    assert _C._parse_cache_size_for_test(text) == expected


def test_shared_cache_is_the_largest_sysfs_lists():
    import glob

    sizes = [_C._parse_cache_size_for_test(open(p).read())
             for p in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size")]
    assert _C._shared_cache_bytes() == max(sizes, default=0)


def test_waits_spin_only_when_every_rank_has_a_cpu():
    # Spinning on a peer that needs our core to get there only delays it.
    assert _C._wait_spin_us_for_test(2, 2) > 0
    assert _C._wait_spin_us_for_test(8, 96) > 0
    assert _C._wait_spin_us_for_test(3, 2) == 0
    assert _C._wait_spin_us_for_test(4, 2) == 0


@pytest.mark.parametrize("sizes", [(2, 2), (2, 1), (1, 2), (3, 2), (3, 2, 2), (4, 1, 2), (5, 3)])
@pytest.mark.parametrize("numel", [0, 1, 13, 1031, 65537])
def test_blockwise_plan_on_uneven_nodes(sizes, numel):
    """A blockwise slice's W pieces, staged by rail (plan.h): chunk r holds rail
    r's pieces, shard j of it node j's local ranks r, r + R, ...; every piece
    has its own place, inside its rail's shard; equal nodes keep the layout
    (x * N + j) * c."""
    rails, n, world = min(sizes), len(sizes), sum(sizes)
    slices = _C._plan_for_test(numel, 4, 0, 0, slice_bytes=64 << 10, collective="all_gather", node_sizes=list(sizes))
    assert sum(s["slice"][1] for s in slices) == numel
    for s in slices:
        c = s["slice"][1]
        assert len(s["chunks"]) == rails
        assert s["chunks"][0][0] == 0 and sum(cc for _, cc in s["chunks"]) == world * c
        for r, ((co, cc), shards) in enumerate(zip(s["chunks"], s["shards"])):
            assert len(shards) == n
            assert [sh[1] for sh in shards] == [len(range(r, k, rails)) * c for k in sizes]
            assert shards[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in zip(shards, shards[1:]))
        places = set()
        for (j, x), at in s["staged_at"].items():
            co, _ = s["chunks"][x % rails]
            so, sc = s["shards"][x % rails][j]
            assert co + so <= at and at + c <= co + so + sc, (sizes, j, x, at)
            if len(set(sizes)) == 1:
                assert at == (x * n + j) * c
            places.add(at)
        assert len(places) == world or c == 0


@pytest.mark.parametrize("sizes", [(2, 1), (3, 2), (4, 1), (8, 1, 3), (3, 1, 1, 1)])
@pytest.mark.parametrize("elem", [1, 2, 4, 8])
def test_shard_bound_holds_on_uneven_nodes(sizes, elem):
    # A larger node's blockwise shard holds several pieces: the rail stage's
    # buffers are sized for it (max_shard_bytes with the largest node).
    kw = dict(slice_bytes=256 << 10, min_chunk_bytes=16 << 10, min_shard_bytes=4 << 10)
    rails, n = min(sizes), len(sizes)
    bound = _C._max_shard_bytes_for_test(rails, n, kw["slice_bytes"], kw["min_chunk_bytes"], kw["min_shard_bytes"],
                                         largest_node=max(sizes))
    for numel in [1, 63, 1000, 4097, 9999, 40_000, 70_001, 300_007, 1_000_003]:
        for coll in ("all_reduce", "reduce_scatter"):
            for s in _C._plan_for_test(numel, elem, 0, 0, **kw, collective=coll, node_sizes=list(sizes)):
                for shards in s["shards"]:
                    assert max(cnt for _, cnt in shards) * elem <= bound, (numel, elem, sizes, coll)


def test_blockwise_slice_pieces():
    """A blockwise slice is cut into a piece per rank, or, where an all-to-all's
    passive ranks receive more pieces than that through their carrier's landing
    room ((K - R) passive ranks x (W - K) pieces), into as many as those."""
    pieces = _C._blockwise_slice_pieces_for_test
    assert pieces([2, 2]) == 4 and pieces([1]) == 1 and pieces([3]) == 3
    assert pieces([2, 1]) == 3 and pieces([3, 2]) == 5 and pieces([4, 1]) == 5
    assert pieces([3, 3, 1]) == 2 * 4 and pieces([4, 4, 2]) == 2 * 6


def test_default_slice_grows_with_the_ranks_between_nodes():
    """Unset, the slice is 256 KiB per rank of a group of several nodes when
    that is more than the default, up to 4 MiB: a rail message stays hundreds
    of KiB with many ranks.  One node, and a size the user set, are left alone."""
    f = _C._auto_slice_size_for_test
    mib = 1 << 20
    assert f(mib, 8, 1) == mib  # one node: no rails
    assert f(mib, 4, 2) == mib  # 2 x 2
    assert f(mib, 4, 4) == mib  # 4 x 1
    assert f(mib, 6, 3) == 3 * mib // 2  # 3 x 2
    assert f(mib, 8, 8) == 2 * mib  # 8 x 1
    assert f(mib, 16, 16) == 4 * mib  # 16 x 1
    assert f(mib, 64, 64) == 4 * mib  # at most 4 MiB
    assert f(8 * mib, 16, 16) == 8 * mib  # never below what it starts from
