"""all_to_all_single / all_to_all with equal blocks, Fairring's own
(collectives/all_to_all.cpp: the node's pieces through shared memory, each
rail carrying what its rank receives from the other nodes): every dtype, odd
sizes, several slices, rows of 2-D tensors, strided and in-place tensors,
the list form, many in flight mixed with all-reduces on the same tensors, on
one node, between simulated nodes, uneven nodes and with the device-like
mover, against a reference built on every rank; unequal splits (one send
and one receive per pair of ranks) right, and a split one rank does not
expect an error there; mismatches an error on every rank; bad sizes a clear error."""
from __future__ import annotations

import pytest

import launch
import rank_all_to_all
from topologies import TOPOLOGIES


@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_all_to_all_moves_every_block_to_its_rank(name):
    ids, env = TOPOLOGIES[name]
    cfg = {"sizes": [1, 3, 13, 1031], "big": 100_003 if "slice4K" in name else 300_007}
    res = launch.run_ranks(rank_all_to_all.sec_all_to_all, ids, args=(cfg,), env=env, timeout_s=240,
                           pg_timeout_s=60)
    for r in res:
        assert not r.value["failures"], f"{name} rank {r.rank}:\n" + "\n".join(r.value["failures"][:20])


@pytest.mark.parametrize("ids", [["a", "a", "a"], ["a", "b"], ["a", "a", "b", "b"]], ids=["1x3", "2x1", "2x2"])
def test_unequal_splits_are_right(ids):
    res = launch.run_ranks(rank_all_to_all.uneven, ids, timeout_s=120)
    for r in res:
        assert not r.value["failures"], f"rank {r.rank}: " + "\n".join(r.value["failures"])


@pytest.mark.parametrize("ids", [["a", "a", "a"], ["a", "a", "b", "b"]], ids=["1x3", "2x2"])
def test_uneven_all_gather_is_pairwise_and_right(ids):
    res = launch.run_ranks(rank_all_to_all.uneven_all_gather, ids, timeout_s=120)
    for r in res:
        assert not r.value["failures"], f"rank {r.rank}: " + "\n".join(r.value["failures"])


@pytest.mark.parametrize("ids", [["a", "a"], ["a", "b"]], ids=["1x2", "2x1"])
def test_mismatched_unequal_splits_fail_where_they_do_not_fit(ids):
    res = launch.run_ranks(rank_all_to_all.mismatched_splits, ids, timeout_s=90, pg_timeout_s=30)
    err = res[0].value["error"]
    assert err and "block from rank 1 of a pairwise exchange" in err and "rank 1 sent 1 element(s) of float32" in err \
        and "holds 2 element(s)" in err, err
    assert res[1].value["error"] is None, res[1].value  # its blocks fit: it cannot tell
    assert all(r.value["after"] == [2.0, 2.0, 2.0] for r in res), [r.value for r in res]


@pytest.mark.parametrize("which", ["size", "all_reduce"])
@pytest.mark.parametrize("ids", [["a", "a"], ["a", "b"], ["a", "a", "b", "b"]], ids=["1x2", "2x1", "2x2"])
def test_mismatched_all_to_alls_fail_on_every_rank(which, ids):
    res = launch.run_ranks(rank_all_to_all.mismatch, ids, args=(which,), timeout_s=90, pg_timeout_s=20)
    for r in res:
        err = r.value["error"]
        assert err, f"rank {r.rank} raised nothing though the ranks issued different ops"
        assert "mismatch" in err and "all_to_all of" in err, f"rank {r.rank}: {err[:400]}"


def test_sizes_that_are_not_equal_blocks_are_a_clear_error():
    res = launch.run_ranks(rank_all_to_all.bad_sizes, ["a", "a"], timeout_s=60)
    for r in res:
        uneven, unequal, bad_sum, negative = r.value["errors"]
        # gloo would read past the tensor here: Fairring checks before it delegates.
        assert uneven and "equal blocks" in uneven and "give the splits" in uneven, r.value
        assert unequal and "equal size" in unequal, r.value
        assert bad_sum and "add up to" in bad_sum, r.value
        assert negative and "negative input split" in negative, r.value
        assert r.value["group_still_works"], r.value
