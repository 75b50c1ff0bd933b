"""Dedicated reduction servers (docs/REDUCTION_SERVERS.md): all-reduces
between nodes reduced by `python -m fairring_py.server` processes.

Each run starts the servers next to a run_ranks job on a known store port
and checks the results against the independent references of rank_all_reduce
and test_wire_dtype, that the servers really reduced (their exit report),
and that they leave when the job does."""
from __future__ import annotations

import re

import pytest

import launch
import rank_all_reduce
import rank_servers
from gpu_support import requires_gpu
from servers import Servers
import test_wire_dtype
from topologies import node_ids

FEW_SIZES = [1, 13, 1031, 4099, 65537, 262147]

# name: (topology in tests/topologies.py, servers, sections)
TOPOLOGIES = {
    # One node: no rails, so the servers get nothing (and nothing waits on them).
    "1x2+2": ("1x2", 2, ["correctness"]),
    # Two nodes: the servers would save no link bytes, so they are not used.
    "2x2+1": ("2x2", 1, ["correctness"]),
    # (all-gather and reduce-scatter, which do not use the servers, are left to their own tests)
    # (non-contiguous tensors become contiguous before the pipeline: their own test covers them)
    "3x2+2": ("3x2", 2, ["correctness", "async", "subgroups", "half_range"]),
    "3x1+3": ("3x1", 3, ["correctness", "async"]),
    # Unequal nodes (2+1+1): one rail, through the servers; the second rank of
    # node a carries no rail and reads its node's memory.
    "uneven+2": ("uneven-2+1+1", 2, ["correctness", "half_range"]),
}
# Groups of fewer nodes do not use servers (csrc/rails/server_link.h).
MIN_NODES = 3


def _run(ids, count, fn, args=(), env=None, **kw):
    port = launch.free_port()
    servers = Servers(port, count)
    try:
        res = launch.run_ranks(fn, ids, args=args, store_port=port, timeout_s=kw.pop("timeout_s", 180),
                               env={"FAIRRING_REDUCTION_SERVERS": str(count), **(env or {})}, **kw)
        # The job's store went with rank 0: the servers leave by themselves.
        codes = servers.wait_exit(20)
        return res, servers, codes
    except BaseException:
        print(servers.outputs())
        servers.close()
        raise


@pytest.mark.parametrize("topo", list(TOPOLOGIES))
def test_allreduce_through_servers(topo):
    layout, count, sections = TOPOLOGIES[topo]
    ids = node_ids(layout)
    nodes = len(set(ids))  # uneven nodes too (the all-reduce keeps them)
    # Where no server is used, a few sizes show it.
    cfg = {"sizes": FEW_SIZES if nodes >= MIN_NODES else [1, 13, 4099], "local_ranks": min(ids.count(n) for n in ids)}
    res, servers, codes = _run(ids, count, rank_all_reduce.session, args=(sections, cfg))
    with servers:
        problems = [f"rank {r.rank} {sec}: {f}" for r in res for sec, v in r.value.items() for f in v["failures"]]
        first = res[0].value["correctness"]["digests"]
        for r in res[1:]:
            diff = [k for k in first if r.value["correctness"]["digests"][k] != first[k]]
            if diff:
                problems.append(f"rank {r.rank}: bits differ from rank 0 in {diff[:5]}")
        assert not problems, "\n".join(problems[:40])
        served = servers.served()
        if nodes < MIN_NODES:
            # The job needs no server, so it may end before a server has even
            # reached its store (that one then waits out --connect-timeout):
            # those that joined left with it, and none reduced anything.
            joined = [i for i in range(count) if "listening on" in servers.output(i)]
            assert all(codes[i] == 0 for i in joined), f"servers did not exit with the job: {codes}"
            assert all(n == 0 for n in served.values()), f"{nodes} node(s), yet servers reduced: {served}"
        else:
            assert codes == [0] * count, f"servers did not exit with the job: {codes}\n{servers.outputs()}"
            assert sorted(served) == list(range(count)), servers.outputs()
            # Every server took part (pieces rotate over the servers).
            assert all(n > 0 for n in served.values()), f"some server reduced nothing: {served}"


@pytest.mark.parametrize("topo,fmt", [("3x1", "bf16"), ("3x1", "fp16")])
def test_compressed_rails_through_servers(topo, fmt):
    """Compression and servers together: contributions rounded once, the
    server's sum rounded once, every rank the same bits."""
    ids = node_ids(topo)
    count = 2
    res, servers, codes = _run(ids, count, test_wire_dtype.wire_session, args=(fmt, len(set(ids))),
                               env={"FAIRRING_WIRE_DTYPE": fmt})
    with servers:
        test_wire_dtype.assert_session_ok(res)
        assert all(n > 0 for n in servers.served().values()), servers.outputs()
        assert codes == [0] * count


@requires_gpu
@pytest.mark.parametrize("fmt", ["none", "bf16"])
def test_cuda_allreduce_through_servers(fmt):
    """CUDA tensors on the staged TCP rail (pinned host copies of the
    chunks) through the servers: rank_gpu_checks' references, every rank
    the same bits (benchmarks/gpu_check.sh runs it on a lent GPU)."""
    import rank_gpu_checks

    ids = node_ids("3x1")
    section = "correctness" if fmt == "none" else "wire"
    cfg = {"sizes": [1, 13, 1031, 65537, 300_007], "nodes": 3}
    res, servers, codes = _run(ids, 2, rank_gpu_checks.session, args=([section], cfg), timeout_s=60,
                               pg_timeout_s=20, env={"FAIRRING_WIRE_DTYPE": fmt})
    with servers:
        out = [r.value[section] for r in res]
        for rank, o in enumerate(out):
            assert not o["failures"], f"rank {rank}: " + "\n".join(o["failures"])
        first = out[0]["digests"]
        assert first and all(o["digests"] == first for o in out[1:])
        assert all(n > 0 for n in servers.served().values()), servers.outputs()


def test_rogue_client_is_refused():
    res, servers, codes = _run(node_ids("3x1"), 1, rank_servers.rogue_then_allreduce)
    with servers:
        assert res[0].value["refused"] is True
        assert all(r.value["ok"] for r in res)
        # A silent client is dropped after 5 s; the ranks did not wait behind it.
        assert max(r.value["new_group_s"] for r in res) < 4, [r.value for r in res]
        assert "refused a connection" in servers.output(0) and "not a rank of this job" in servers.output(0)


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_server_lost_mid_op(how):
    """A server killed (or stopped: SIGSTOP) while all-reduces run: every rank
    fails, and the error names the server."""
    port = launch.free_port()
    stopped = how == "stopped"
    with Servers(port, 2) as servers:
        # Server processes do not know their index before joining: take the
        # second process, whichever index it got; its name is in its log.
        victim = servers.procs[1].pid
        # Stopped: the ops' timeout is 3 s, set once the servers have joined.
        res = launch.run_ranks(rank_servers.killed_mid_op, node_ids("3x1"),
                               args=(victim, stopped, 3 if stopped else None),
                               store_port=port, env={"FAIRRING_REDUCTION_SERVERS": "2"}, pg_timeout_s=60,
                               timeout_s=120)
        if stopped:
            servers.procs[1].send_signal(18)  # SIGCONT, so that it can be killed and its log read
        log = servers.output(1)
        index = log.split("fairring server ", 1)[1].split(":", 1)[0]
        for r in res:
            err = r.value["error"]
            assert err, f"rank {r.rank} never failed"
            assert f"reduction server {index} (" in err, f"rank {r.rank}: {err}"
            if stopped:
                assert "Timed out" in err, f"rank {r.rank}: {err}"
            else:
                assert "DistNetworkError" in err or "closed" in err, f"rank {r.rank}: {err}"


def test_stalled_rank_behind_a_server_is_named():
    """A rank stopped while its rail's all-reduces go through a server: the
    server (alive) waits for it, and the others' timeout names the rank whose
    heartbeats stopped, not only the server."""
    port = launch.free_port()
    with Servers(port, 1):
        # The group's 3 s timeout starts once the server has joined (its
        # start-up on a busy machine is not what this test times).
        res = launch.run_ranks(rank_servers.stalled_rank_once_the_server_joined, node_ids("3x1"), args=(port,),
                               backend=None, env={"FAIRRING_REDUCTION_SERVERS": "1"}, timeout_s=90)
        for r in res[:2]:
            err = r.value["error"] or ""
            assert re.search(r"Timed out after [0-9.]+ s: reduction server 0", err) and "rank 2 has sent no heartbeat" in err, f"rank {r.rank}: {err}"
        assert res[2].value["error"], "the stopped rank's op did not fail once it resumed"


def test_mismatch_reported_by_the_server():
    """Ranks of three nodes all-reduce different sizes: the server sees it and
    every rank gets an error naming both ranks' ops, at once."""
    res, servers, codes = _run(node_ids("3x1"), 1, rank_servers.mismatched_sizes)
    with servers:
        for r in res:
            err = r.value["error"]
            assert err and "1000 elements" in err and "2000 elements" in err, f"rank {r.rank}: {err}"
            assert "reduction server 0" in err, f"rank {r.rank}: {err}"
            assert r.value["seconds"] < 30


def test_missing_server_fails_group_creation():
    """Two servers asked for, one started: group creation fails on every rank
    within the group's timeout, saying how many joined and how to start them."""
    port = launch.free_port()
    with Servers(port, 1) as servers:
        res = launch.run_ranks(rank_servers.create_once_one_server_joined, node_ids("3x1"), args=(port, 3),
                               backend=None, check=False, env={"FAIRRING_REDUCTION_SERVERS": "2"}, timeout_s=90)
        for r in res:
            assert not r.ok, f"rank {r.rank} created the group"
            msg = r.exc_msg or ""
            assert "uses 2 reduction servers" in msg and "1 joined" in msg, f"rank {r.rank}: {msg}\n{servers.outputs()}"
            assert "python -m fairring_py.server" in msg


def test_server_options_are_validated():
    import fairring_py
    from fairring_py import options

    assert options.resolve(fairring_py.Options(reduction_servers=3), environ={}).reduction_servers == 3
    assert options.resolve(None, environ={"FAIRRING_REDUCTION_SERVERS": "2"}).reduction_servers == 2
    assert options.resolve(None, environ={}).reduction_servers == 0
    with pytest.raises(ValueError, match="FAIRRING_REDUCTION_SERVERS"):
        options.resolve(None, environ={"FAIRRING_REDUCTION_SERVERS": "-1"})
    with pytest.raises(ValueError, match="Options.reduction_servers"):
        options.resolve(fairring_py.Options(reduction_servers="many"), environ={})
