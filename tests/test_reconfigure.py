"""Reconfigure (torch >= 2.14): a group created with enable_reconfigure=True
gets its members from dist._reconfigure(uuid, handles), loses one, takes in a
replacement process, refuses bad handles and reused uuids on every rank at
once, and runs its abort hooks.  The scenario is rank_reconfigure.py's; this
runs 4 processes on 2 simulated nodes of 2 and the replacement, on a
TCPStore of its own.  Skips on a torch without the API (the main suite's
2.13); CI runs it in its torch 2.14.1 environment."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

import fairring_py
from topologies import node_ids

pytestmark = pytest.mark.skipif(
    not (hasattr(dist.distributed_c10d, "_reconfigure") and fairring_py._C.HAS_RECONFIGURE),
    reason="needs torch >= 2.14 (the reconfigure API) and a fairring_py built against it",
)

HERE = os.path.dirname(os.path.abspath(__file__))
NODES = node_ids("2x2")


def _start(role, rank, port):
    env = dict(os.environ, FAIRRING_NODE_ID=NODES[rank], OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, os.path.join(HERE, "rank_reconfigure.py"), role, str(rank), str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _result(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"rc {proc.returncode}\n{out[-3000:]}\n{err[-6000:]}"
    return json.loads(lines[-1])


def test_reconfigure_lose_a_rank_and_take_in_a_replacement():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    procs = [_start("member", r, store.port) for r in range(4)]
    try:
        first3 = _result(procs[3])  # rank 3 exits after phase 3
        replacement = _start("replacement", 3, store.port)
        results = [_result(p) for p in procs[:3]] + [first3, _result(replacement)]
    finally:
        for p in procs:
            p.kill()
        time.sleep(0)
    members, repl = results[:4], results[4]
    for r, res in enumerate(members):
        where = f"rank {r}: {res}"
        assert res["supports"], where
        assert "no members yet" in res["before"], where
        assert res["p1"] == "" and res["p2"] == "" and res["p3_after"] == "", where
        assert res["p2_order"] == [0, 1, 2, 3], where  # a set of handles keeps the ranks' order
        p3 = res["p3"]
        assert "ValueError" in p3["reused"] and "was used before" in p3["reused"], where
        assert "not a Fairring reconfigure handle" in p3["garbage"], where
        assert "of another job" in p3["other_job"], where
        assert "not among the handles" in p3["not_mine"], where
        assert "at least one member" in p3["empty"], where
        assert "listed twice" in p3["twice"], where
    for r, res in enumerate(members[:3]):
        where = f"rank {r}: {res}"
        assert res["p4"] == "", where
        print(f"rank {r}: reconfigure of the 3 left took {res['p4_seconds'] * 1e3:.0f} ms")
    assert "no members yet" in repl["before"], repl
    for res in members[:3] + [repl]:
        where = f"{res['role']} {res['rank']}: {res}"
        assert res["p5"] == "" and res["p6_after"] == "", where
        # uuid 1 again: the old members know it, the replacement learns it from the store
        assert "uuid 1 was" in res["p6"] and res["p6_seconds"] < 10, where
        assert res["p7_hook"] == "ran", where
        if res["rank"] != 0:
            assert "rank 0" in res["p7"], where
    assert "already used by another reconfigure" in repl["p6"], repl


def test_abort_hooks_run_once_before_the_group_aborts():
    import launch
    import rank_changing_groups as rcg

    res = launch.run_ranks(rcg.abort_hooks, node_ids("uneven-2+1"), timeout_s=90)
    for r in res:
        assert r.value["ran"] == ["kept"], f"rank {r.rank}: {r.value}"
        if r.rank:
            assert "rank 0" in r.value["op"], f"rank {r.rank}: {r.value}"


def test_ephemeral_timeout_lasts_until_the_first_op_after_it_ends():
    import launch
    import rank_changing_groups as rcg

    res = launch.run_ranks(rcg.ephemeral_timeout, node_ids("1x2"), timeout_s=90)
    v = res[0].value
    assert v["a"]["error"] is None and v["a"]["seconds"] > 2.5, v  # waited past the 2 s timeout
    assert v["b"]["error"] and "Timed out after 2" in v["b"]["error"] and v["b"]["seconds"] < 4.5, v


@pytest.mark.parametrize("env,fine", [
    ({"FAIRRING_WIRE_DTYPE": "bf16"}, {"all": [4.0], "three": [3.0]}),  # rounded by the bf16 rails
    ({"FAIRRING_REDUCTION_SERVERS": "3"}, {"all": [4 * (1 + 2.0**-10)], "three": [3 * (1 + 2.0**-10)]}),
], ids=["bf16-rails", "3-servers"])
def test_reconfigure_keeps_the_options(env, fine):
    """A reconfigurable group on 4 nodes of 1, with compressed rails or
    reduction servers: its members after reconfigure(uuid 1), and the 3 left
    after rank 3 exits and reconfigure(uuid 2), reduce exactly and with the
    options in force (bf16 rails round 1 + 2^-10; servers keep it whole and
    reduce something)."""
    from servers import Servers

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    servers = Servers(store.port, int(env.get("FAIRRING_REDUCTION_SERVERS", 0)))
    procs = []
    with servers:
        for r in range(4):
            child = dict(os.environ, FAIRRING_NODE_ID=f"n{r}", OMP_NUM_THREADS="1", **env,
                         PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
            procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "rank_reconfigure_options.py"), str(r),
                                           str(store.port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=child))
        try:
            results = [_result(p) for p in procs]
        finally:
            for p in procs:
                p.kill()
        for res in results:
            where = f"rank {res['rank']}: {res}"
            assert res["all"]["exact"] and res["all"]["nodes"] == 4 and res["all"]["fine"] == fine["all"], where
            if res["rank"] != 3:
                assert res["three"]["exact"] and res["three"]["nodes"] == 3, where
                assert res["three"]["fine"] == fine["three"], where
        if servers.procs:
            del store  # the servers leave with the job's store
            servers.wait_exit(20)
            assert sum(servers.served().values()) > 0, servers.outputs()
