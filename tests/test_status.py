"""The live status view (fairring_py.status): pointed at a running job's
store, it names the rank the others wait for."""

import re

import pytest

import launch
import rank_status
from launch import free_port
from topologies import node_ids


@pytest.mark.parametrize("nodes,stalled", [(node_ids("1x3"), 2), (node_ids("2x2"), 2), (node_ids("2x2"), 0)],
                         ids=["1x3-rank2", "2x2-rank2", "2x2-rank0"])
def test_status_names_the_stalled_rank(nodes, stalled, tmp_path):
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    res = launch.run_ranks(rank_status.stalled_rank, nodes, args=(url, stalled, str(tmp_path)),
                           store_port=port, timeout_s=150)
    v = res[1 if stalled == 0 else 0].value
    code, text, err = v["cli"]
    assert code == 0, f"python -m fairring_py.status exited {code}: {err}"
    world = len(nodes)
    for view in (text, v["in_process"]):
        assert f"{world} of {world} rank(s) answered" in view, view
        # The stalled rank has issued 3 collectives (it is not yet in the
        # fourth all-reduce), the others 4: the view names it and what they wait in.
        others = [r for r in range(world) if r != stalled]
        assert re.search(rf"behind: rank {stalled} has issued 3 collective\(s\), rank\(s\) "
                         rf"\[{', '.join(map(str, others))}\] 4: rank {stalled} has not called collective #3 "
                         r"\(they wait in all_reduce, for \d+\.\d s\)", view), view
        assert view.count("behind:") == 1, view
        # Each rank's row: collectives issued/ended, and the p2p pair of ranks 0 and 1.
        rows = {int(m.group(1)): m.group(0) for m in re.finditer(r"^\s+(\d+)\s+\d+\s+\d+/\d+\s+\d+/\d+.*$",
                                                                  view, re.M)}
        assert sorted(rows) == list(range(world)), view
        assert re.search(rf"^\s+{stalled}\s+{stalled}\s+3/3\s+{1 if stalled < 2 else 0}/"
                         rf"{1 if stalled < 2 else 0}\s+-", rows[stalled]), rows[stalled]
        for r in others:
            assert re.search(rf"^\s+{r}\s+{r}\s+4/3\s+{1 if r < 2 else 0}/{1 if r < 2 else 0}\s+"
                             r"all_reduce #3 for \d+\.\d s", rows[r]), rows[r]


def test_status_of_a_job_in_step(tmp_path):
    port = free_port()
    res = launch.run_ranks(rank_status.in_step, node_ids("2x1"), args=(f"tcp://127.0.0.1:{port}", str(tmp_path)),
                           store_port=port)
    view = res[0].value
    assert "2 of 2 rank(s) answered" in view and "in step: every rank has issued the same collectives" in view, view
    assert "behind" not in view, view
    assert re.search(r"^\s+0\s+0\s+2/2\s+0/0\s+-$", view, re.M), view


def test_status_without_a_job_says_why():
    """A store nobody registered in: a clear message, exit code 2."""
    import subprocess
    import sys
    import torch.distributed as dist
    from datetime import timedelta
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    proc = subprocess.run([sys.executable, "-m", "fairring_py.status", "--store", f"tcp://127.0.0.1:{port}",
                           "--timeout", "1"], capture_output=True, text=True, timeout=60)
    del server
    assert proc.returncode == 2 and "no Fairring rank has registered in this store" in proc.stderr, proc
    bad = subprocess.run([sys.executable, "-m", "fairring_py.status", "--store", "http://x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected tcp://host:port or file:///path" in bad.stderr, bad


def test_status_names_a_rank_that_does_not_answer(tmp_path):
    res = launch.run_ranks(rank_status.killed_rank, node_ids("1x3"), args=(str(tmp_path),), check=False,
                           timeout_s=120)
    assert res[0].ok, launch.describe_all(res)
    view = res[0].value
    assert "2 of 3 rank(s) answered" in view and re.search(r"rank 2: no answer: 127\.0\.0\.1:\d+ \(pid \d+", view), view
    assert re.search(r"^\s+0\s+0\s+1/1\s+0/0\s+-$", view, re.M), view
    assert re.search(r"^\s+2\s+\?\s+\(no report: no op on this group yet, or no answer\)$", view, re.M), view


def test_status_off_writes_nothing(tmp_path):
    port = free_port()
    res = launch.run_ranks(rank_status.registered_keys, node_ids("2x1"), args=(f"tcp://127.0.0.1:{port}",),
                           store_port=port, env={"FAIRRING_STATUS": "off"})
    assert res[0].value == [False, False], res[0].value
