"""send / recv / isend / irecv / batch_isend_irecv / recv from any source,
Fairring's own (p2p/): within a node through shared-memory rings, one per
ordered pair of local ranks; between nodes over TCP connections.  Every dtype, odd and
multi-cell sizes, strided tensors, tag order, any-source receives, messages
sent before their receives, many in flight mixed with all-reduces on the
same tensors (the order rule), mismatches and bad peers a clear error, a
peer that dies named, a receive that nothing reaches timed out."""
from __future__ import annotations

import pytest

import launch
import rank_p2p
from topologies import node_ids, params

TOPOLOGIES = ["1x2", "1x3", "2x1", "2x2", "uneven-2+1"]


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_every_pair_exchanges_every_dtype(name):
    ids = node_ids(name)
    # 1 element, primes, one cell (128 KiB) and several (300_007 int64 = 2.3 MiB)
    cfg = {"sizes": [0, 1, 13, 1031, 32_749] + ([300_007] if len(ids) <= 3 else []), "strided": True}
    res = launch.run_ranks(rank_p2p.ring_exchange, ids, args=(cfg,), timeout_s=300, pg_timeout_s=60)
    for r in res:
        assert not r.value["failures"], f"{name} rank {r.rank}:\n" + "\n".join(r.value["failures"][:20])
        kinds = r.value["kinds"]
        assert "send" in kinds and "recv" in kinds and not any("gloo" in k for k in kinds), kinds


@pytest.mark.parametrize("name", ["1x2", "1x3", "2x1", "2x2"])
def test_tags_any_source_and_batches(name):
    ids = node_ids(name)
    res = launch.run_ranks(rank_p2p.tags_and_any_source, ids, timeout_s=120)
    for r in res:
        assert not r.value["failures"], f"{name} rank {r.rank}:\n" + "\n".join(r.value["failures"])
    assert "recv_any_source" in res[0].value["kinds"], res[0].value["kinds"]


@pytest.mark.parametrize("name", ["1x2", "1x3", "2x1", "2x2"])
def test_in_issue_order_with_collectives(name):
    res = launch.run_ranks(rank_p2p.issue_order, node_ids(name), timeout_s=120)
    for r in res:
        assert not r.value["failures"], f"{name} rank {r.rank}:\n" + "\n".join(r.value["failures"])


@pytest.mark.parametrize("ids", params("1x3", "3x1"))
def test_bad_peers_and_mismatched_messages_are_clear_errors(ids):
    res = launch.run_ranks(rank_p2p.bad_calls, ids, timeout_s=60)
    for r in res:
        e = r.value
        assert e["self"] and "ValueError" in e["self"] and "itself" in e["self"], e["self"]
        assert e["out of range"] and "ValueError" in e["out of range"] and "has 3 ranks" in e["out of range"], e
    e = res[0].value
    assert e["size"] and "rank 1 sent 4 element(s) of float32" in e["size"] and "holds 3 element(s)" in e["size"], e
    assert e["dtype"] and "4 element(s) of int32" in e["dtype"], e
    assert e["after"] is None, e["after"]


@pytest.mark.parametrize("ids", [node_ids("1x3"), node_ids("uneven-1+2")], ids=["same-node", "other-node"])
@pytest.mark.parametrize("when", ["before-send", "mid-send"])
def test_dead_peer_is_named(when, ids):
    rank_env = [{}, {"FAIRRING_TEST_P2P_EXIT_AFTER": str(1 << 20)}, {}]
    res = launch.run_ranks(rank_p2p.peer_dies, ids, args=(when,), timeout_s=120, pg_timeout_s=60,
                           check=False, rank_env=rank_env)
    assert res[1].exitcode == launch.DELIBERATE_EXIT, launch.describe_all(res)
    v = res[0].value
    assert v, launch.describe_all(res)
    assert v["error"] and "rank 1" in v["error"] and ("exited" in v["error"] or "did it exit" in v["error"]), v
    assert "DistNetworkError" in v["error"], v["error"]
    assert v["seconds"] < 20, f"took {v['seconds']:.1f} s with a 60 s timeout"
    assert v["later"] and "rank 1" in v["later"], v["later"]


@pytest.mark.parametrize("ids", [node_ids("1x3"), node_ids("uneven-2+1-aba")], ids=["same-node", "other-node"])
def test_any_source_after_a_sender_died_mid_message(ids):
    rank_env = [{}, {"FAIRRING_TEST_P2P_EXIT_AFTER": str(1 << 20)}, {}]
    res = launch.run_ranks(rank_p2p.any_source_after_death, ids, timeout_s=120, pg_timeout_s=60, check=False,
                           rank_env=rank_env)
    assert res[1].exitcode == launch.DELIBERATE_EXIT, launch.describe_all(res)
    assert res[0].value == {"src": 2, "data": [2.0, 2.0, 2.0], "error": None}, launch.describe_all(res)


@pytest.mark.parametrize("ids", params("1x2", "2x1"))
def test_receive_nothing_reaches_times_out(ids):
    timeout_s = 3
    res = launch.run_ranks(rank_p2p.recv_times_out, ids, args=(timeout_s,), timeout_s=60,
                           pg_timeout_s=timeout_s)
    v = res[0].value
    assert v["error"] and "Timed out" in v["error"] and "recv from rank 1" in v["error"], v
    assert timeout_s - 0.5 <= v["seconds"] <= timeout_s + 5, v["seconds"]
    assert v["after"] == [5.0, 5.0], v


def test_waiting_callers_polling_threads_and_unwaited_receives():
    """Callers that wait move their messages themselves (P2pEngine::poll);
    two threads doing so at once, and receives nobody waits on, all arrive.
    The node thread looks within the 0.5 ms a receive promises, or at its
    next ring: a lost wake-up would show as its 100 ms check period."""
    res = launch.run_ranks(rank_p2p.waiting_modes, node_ids("1x2"), timeout_s=120, pg_timeout_s=60)
    for r in res:
        assert not r.value["failures"], f"rank {r.rank}:\n" + "\n".join(r.value["failures"][:20])
    for numel, delays in res[1].value["delays"].items():
        assert len(delays) == 8, delays
        median = delays[len(delays) // 2]
        assert median < 0.05, f"an unwaited irecv of {numel} elements completed {median * 1e3:.1f} ms after its send"


def test_a_message_before_its_receive_waits_in_a_warm_cached_block():
    res = launch.run_ranks(rank_p2p.early_message_block, node_ids("1x2"), timeout_s=90)
    v = {int(k): x for k, x in res[1].value.items()}
    block = 4 << 20
    assert v[0]["right"] and v[1]["right"], v
    # Received: its block goes back to the cache.
    assert v[0]["held_after"] - v[0]["held_before"] == block, v
    # The next early message took that block again, and gave it back once received.
    assert v[1]["held_before"] == v[0]["held_after"] - block and v[1]["held_after"] == v[0]["held_after"], v
