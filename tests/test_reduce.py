"""dist.reduce, Fairring's own (collectives/reduce.cpp: the all-reduce's cut
and first steps, the sums to the root's node only, the root gathers): every
dtype and op against the float64 / exact reference, odd sizes, every root,
several slices, non-contiguous tensors, PREMUL_SUM, many in flight, on one
node, between simulated nodes and with the device-like mover; non-root
tensors unchanged; mismatches between ranks an error on every rank."""
from __future__ import annotations

import pytest

import launch
import rank_reduce
from topologies import SWEEP, env, node_ids, params

SIZES = [1, 3, 13, 1031, 4099]


@pytest.mark.parametrize("name", [n for n in SWEEP if n != "1x1"])
def test_reduce_matches_the_reference_and_leaves_non_roots_unchanged(name):
    cfg = {"sizes": SIZES, "big": 300_000 if "slice4K" in name else 1 << 20}
    res = launch.run_ranks(rank_reduce.sec_reduce, node_ids(name), args=(cfg,), env=env(name),
                           timeout_s=240, pg_timeout_s=60)
    for r in res:
        assert not r.value["failures"], f"{name} rank {r.rank}:\n" + "\n".join(r.value["failures"][:20])


def test_reduce_to_a_root_outside_the_group_is_a_clear_error():
    res = launch.run_ranks(rank_reduce.bad_root, node_ids("1x2"), timeout_s=60)
    for r in res:
        assert r.value["error"] and "not a rank of this group" in r.value["error"], r.value
        assert r.value["group_still_works"], r.value


@pytest.mark.parametrize("which", ["root", "all_reduce"])
@pytest.mark.parametrize("ids", params("1x2", "2x1"))
def test_mismatched_reduces_fail_on_every_rank(which, ids):
    res = launch.run_ranks(rank_reduce.mismatch, ids, args=(which,), timeout_s=90, pg_timeout_s=20)
    for r in res:
        err = r.value["error"]
        assert err, f"rank {r.rank} raised nothing though the ranks issued different ops"
        # The error names both ops (the mismatch words of op_key.cpp).
        others = ["reduce of 1031 elements of float32 with SUM to rank 1"] if which == "root" else ["all_reduce of"]
        for needle in ["mismatch", "reduce of 1031 elements of float32 with SUM to rank 0"] + others:
            assert needle in err, f"rank {r.rank}: the error lacks {needle!r}: {err[:400]}"


@pytest.mark.parametrize("ids", params("2x1", "2x2", "3x1"))
def test_reduce_on_compressed_rails_rounds_within_the_wire_bound(ids):
    res = launch.run_ranks(rank_reduce.wire_case, ids, env={"FAIRRING_WIRE_DTYPE": "bf16"}, timeout_s=120)
    for r in res:
        assert not r.value["failures"], f"rank {r.rank}: " + "\n".join(r.value["failures"])
