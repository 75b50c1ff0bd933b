"""A rank argument that is not a rank of the group (negative, the
any-source sentinel -1, the world size, past it, the largest int, this rank
for send and recv) is a ValueError naming the argument and its value, on
every public call that takes one, with ranks as processes and as threads;
no rank dies by a signal, and the group goes on working afterwards."""
from __future__ import annotations

import pytest

import launch
import rank_bad_ranks
import thread_groups
from topologies import params


def _check(results, world, who):
    assert results, who
    for name, value, kind, msg in results:
        where = f"{who}: {name} with {value}"
        assert kind is not None, f"{where} did not raise"
        # torch's own checks may come first (its Python API refuses this
        # rank as a peer, or an int too large for its bindings): a
        # ValueError or TypeError of torch's is as good, as long as it is no
        # bare OS error and names the value.
        assert kind in ("ValueError", "TypeError"), f"{where}: {kind}: {msg}"
        assert str(value) in msg, f"{where}: the message does not name the value: {msg}"
        # The group's own methods reach Fairring with no check of torch's first.
        assert not name.startswith("pg.") or msg.startswith("fairring:"), f"{where}: {kind}: {msg}"
        if msg.startswith("fairring:"):
            assert kind == "ValueError", f"{where}: {kind}: {msg}"
            assert f"={value}," in msg, f"{where}: {msg}"
            assert f"(0 to {world - 1})" in msg or "which is this rank" in msg, f"{where}: {msg}"


@pytest.mark.parametrize("ids", params("uneven-2+1", "2x1"))
def test_bad_ranks_on_processes(ids):
    res = launch.run_ranks(rank_bad_ranks.walk, ids, timeout_s=120, pg_timeout_s=30)
    for r in res:
        assert r.exitcode == 0, launch.describe_all(res)
        v = r.value
        assert not v["failures"], f"rank {r.rank}: {v['failures']}"
        _check(v["results"], len(ids), f"rank {r.rank}")
        names = {name for name, *_ in v["results"]}
        assert {"dist.isend", "batch_isend_irecv(isend)", "pg.gather", "dist.scatter"} <= names, names


def test_bad_ranks_on_threads():
    world = 3
    res = thread_groups.run_threads(rank_bad_ranks.walk_group, world, timeout_s=120)
    for rank, v in enumerate(res):
        assert not v["failures"], f"rank {rank}: {v['failures']}"
        _check(v["results"], world, f"rank {rank} (thread)")
