"""gather and scatter, Fairring's own (collectives/gather.cpp, scatter.cpp:
each rank's piece moves once, through the node's memory inside a node and on
one rail between nodes): every dtype, odd sizes, every root, several slices,
strided tensors, the object forms, many in flight mixed with all-reduces, on
one node, between simulated nodes, uneven nodes and with the device-like
mover; bad arguments a clear error; mismatches an error on every rank."""
from __future__ import annotations

import pytest

import launch
import rank_gather_scatter
from topologies import SWEEP, env, node_ids, params


@pytest.mark.parametrize("name", SWEEP)
def test_gather_and_scatter_match_the_reference(name):
    cfg = {"sizes": [1, 3, 13, 1031], "big": 100_003 if "slice4K" in name else 300_007}
    res = launch.run_ranks(rank_gather_scatter.sec_gather_scatter, node_ids(name), args=(cfg,),
                           env=env(name), timeout_s=240, pg_timeout_s=60)
    for r in res:
        assert not r.value["failures"], f"{name} rank {r.rank}:\n" + "\n".join(r.value["failures"][:20])


def test_bad_arguments_are_a_clear_error():
    res = launch.run_ranks(rank_gather_scatter.bad_args, node_ids("1x2"), timeout_s=60)
    for r in res:
        errs = r.value["errors"]
        assert "not a rank of this group" in errs.get("root", ""), errs
        if r.rank == 0:
            assert "one tensor per rank" in errs.get("length", ""), errs
            assert "like its own" in errs.get("size", ""), errs
        else:
            for case in ("length", "size"):
                assert "rank 0 has " in errs.get(case, "") and "whose arguments that rank rejected" in errs[case], errs
        assert r.value["group_still_works"], r.value


@pytest.mark.parametrize("which", ["root", "kind"])
@pytest.mark.parametrize("ids", params("1x2", "2x1", "2x2", "uneven-2+1"))
def test_mismatched_gathers_fail_on_every_rank(which, ids):
    res = launch.run_ranks(rank_gather_scatter.mismatch, ids, args=(which,), timeout_s=90, pg_timeout_s=20)
    for r in res:
        err = r.value["error"]
        assert err, f"rank {r.rank} raised nothing though the ranks issued different ops"
        assert "mismatch" in err and "gather of 1031 elements" in err, f"rank {r.rank}: {err[:400]}"
