"""all_to_all_single / all_to_all with equal blocks, Fairring's own
(collectives/all_to_all.cpp: the node's pieces through shared memory, each
rail carrying what its rank receives from the other nodes): every dtype, odd
sizes, several slices, rows of 2-D tensors, strided and in-place tensors,
the list form, many in flight mixed with all-reduces on the same tensors, on
one node, between simulated nodes, uneven nodes and with the device-like
mover, against a reference built on every rank; unequal splits (the sizes
shared first, then the same hierarchical all-to-all) right on every
topology, and sizes that do not match an error on every rank; mismatches an
error on every rank; bad sizes a clear error."""
from __future__ import annotations

import pytest

import launch
import rank_all_to_all
from topologies import SWEEP, env, node_ids, params


@pytest.mark.parametrize("name", SWEEP)
def test_all_to_all_moves_every_block_to_its_rank(name):
    cfg = {"sizes": [1, 3, 13, 1031], "big": 100_003 if "slice4K" in name else 300_007}
    res = launch.run_ranks(rank_all_to_all.sec_all_to_all, node_ids(name), args=(cfg,), env=env(name), timeout_s=240,
                           pg_timeout_s=60)
    for r in res:
        assert not r.value["failures"], f"{name} rank {r.rank}:\n" + "\n".join(r.value["failures"][:20])


def test_all_to_all_where_landings_outnumber_the_ranks():
    """3+3+1: one rail; each node of three has two passive ranks, each
    receiving four pieces from the other nodes through the rail's landing
    room, eight in all for seven ranks: the slice is cut for eight pieces
    (plan.h, blockwise_slice_pieces).  4 KiB slices: many in flight."""
    res = launch.run_ranks(rank_all_to_all.sec_all_to_all, node_ids("uneven-3+3+1-slice4K"),
                           args=({"sizes": [1, 13, 1031], "big": 20_011},), env=env("uneven-3+3+1-slice4K"),
                           timeout_s=240, pg_timeout_s=60)
    for r in res:
        assert not r.value["failures"], f"rank {r.rank}:\n" + "\n".join(r.value["failures"][:20])


@pytest.mark.parametrize("name", SWEEP)
def test_unequal_splits_are_right(name):
    res = launch.run_ranks(rank_all_to_all.uneven, node_ids(name), args=(20_011 if "slice4K" in name else 100_003,),
                           env=env(name), timeout_s=240, pg_timeout_s=60)
    for r in res:
        assert not r.value["failures"], f"{name} rank {r.rank}: " + "\n".join(r.value["failures"][:20])


@pytest.mark.parametrize("ids", params("1x3", "2x2", "uneven-2+1", "3x1"))
def test_uneven_all_gather_is_native_and_right(ids):
    res = launch.run_ranks(rank_all_to_all.uneven_all_gather, ids, timeout_s=120)
    for r in res:
        assert not r.value["failures"], f"rank {r.rank}: " + "\n".join(r.value["failures"])


@pytest.mark.parametrize("ids", params("1x2", "2x1", "2x2"))
def test_uneven_all_gather_lists_that_disagree_fail_on_every_rank(ids):
    """Rank 1's block is one element longer than rank 0's list says: a
    mismatch on every rank (the sizes' hash is in the op's key), never a
    block cut short or written past; a rank's input unlike its own block is
    a ValueError before anything is issued."""
    res = launch.run_ranks(rank_all_to_all.mismatched_uneven_all_gather, ids, timeout_s=90, pg_timeout_s=30)
    for r in res:
        v = r.value
        assert v["error"] and "all_gatherv mismatch" in v["error"], f"rank {r.rank}: {v}"
        assert v["elapsed"] < 15, f"rank {r.rank}: failed only after {v['elapsed']:.1f} s: {v['error']}"
        assert v["local"] and v["local"].startswith("ValueError") and "input has" in v["local"], f"rank {r.rank}: {v}"
        assert v["wrong_dtype"] and "float64" in v["wrong_dtype"] and "float32" in v["wrong_dtype"], \
            f"rank {r.rank}: {v}"


@pytest.mark.parametrize("ids", params("1x2", "2x1", "uneven-2+1"))
def test_mismatched_unequal_splits_fail_on_every_rank(ids):
    res = launch.run_ranks(rank_all_to_all.mismatched_splits, ids, timeout_s=90, pg_timeout_s=30)
    for r in res:
        err = r.value["error"]
        # The same words on every rank: each checked the whole matrix of sizes.
        assert err and err.startswith("ValueError") and "rank 1 sends 1 element(s) to rank 0, but rank 0 expects 2" \
            in err and "nothing was sent" in err, f"rank {r.rank}: {err}"
    assert all(r.value["after"] == [len(ids)] * 3 for r in res), [r.value for r in res]


@pytest.mark.parametrize("ids", params("1x2", "2x2"))
def test_bad_arguments_on_one_rank_fail_every_rank_at_once(ids):
    # A group timeout far past the test's: an error only after it would fail the test.
    res = launch.run_ranks(rank_all_to_all.bad_arguments_on_one_rank, ids, timeout_s=60, pg_timeout_s=300)
    for r in res:
        splits, dtypes = r.value["errors"]
        if r.rank == 0:
            assert splits and "negative input split" in splits, splits
            assert dtypes and "one dtype and device" in dtypes and "input 1 is float64" in dtypes, dtypes
        else:
            for err in (splits, dtypes):
                assert err and err.startswith("ValueError") and "rank 0 rejected its own arguments" in err, err
        assert r.value["after"] == [len(ids)] * 3, r.value


@pytest.mark.parametrize("ids", params("1x2", "uneven-1+2"))
def test_splits_on_some_ranks_only_fail_on_every_rank(ids):
    res = launch.run_ranks(rank_all_to_all.splits_on_some_ranks, ids, timeout_s=90, pg_timeout_s=20)
    for r in res:
        err = r.value["error"]
        assert err and "mismatch" in err and "all_to_all_sizes" in err, f"rank {r.rank}: {err}"
        assert "needs its splits passed on every rank or on none" in err, f"rank {r.rank}: {err}"


@pytest.mark.parametrize("which", ["size", "all_reduce"])
@pytest.mark.parametrize("ids", params("1x2", "2x1", "2x2", "uneven-2+1"))
def test_mismatched_all_to_alls_fail_on_every_rank(which, ids):
    res = launch.run_ranks(rank_all_to_all.mismatch, ids, args=(which,), timeout_s=90, pg_timeout_s=20)
    for r in res:
        err = r.value["error"]
        assert err, f"rank {r.rank} raised nothing though the ranks issued different ops"
        assert "mismatch" in err and "all_to_all of" in err, f"rank {r.rank}: {err[:400]}"
        assert "splits passed on every rank" not in err, f"rank {r.rank}: a hint about splits, none passed: {err}"


def test_profiler_shows_both_steps_of_an_all_to_all_with_splits():
    res = launch.run_ranks(rank_all_to_all.profiler_events, node_ids("1x2"), timeout_s=60)
    for r in res:
        assert r.value == [], f"rank {r.rank}: {r.value}"


def test_sizes_that_are_not_equal_blocks_are_a_clear_error():
    res = launch.run_ranks(rank_all_to_all.bad_sizes, node_ids("1x2"), timeout_s=60)
    for r in res:
        uneven, unequal, bad_sum, negative = r.value["errors"]
        # gloo would read past the tensor here: Fairring checks before it delegates.
        assert uneven and "equal blocks" in uneven and "give the splits" in uneven, r.value
        assert unequal and "equal size" in unequal, r.value
        assert bad_sum and "add up to" in bad_sum, r.value
        assert negative and "negative input split" in negative, r.value
        assert r.value["group_still_works"], r.value
