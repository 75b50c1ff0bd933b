"""The launcher itself (fairring_py._ranks, under tests/launch.py and the
benchmarks): results, the hard deadline with its stack dump, ranks that hang
at exit, the environment a rank gets, and the bench's kill of the rest after
a failure.  No process group: each run takes a second or two."""
from __future__ import annotations

import os
import sys
import time

import pytest

import launch
from fairring_py import _ranks


def echo_place(rank, world_size):
    return {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "FAIRRING_NODE_ID", "X_TEST", "OMP_NUM_THREADS")}


def sleep_forever(rank, world_size):
    print(f"rank {rank} going to sleep", flush=True)
    time.sleep(600)


def report_then_hang(rank, world_size):
    import threading

    # A non-daemon thread keeps the interpreter from exiting after the report.
    threading.Thread(target=time.sleep, args=(600,)).start()
    return rank


def test_results_and_environment():
    res = launch.run_ranks(echo_place, ["a", None], backend=None, env={"X_TEST": 1},
                           rank_env=[{"X_TEST": "r0"}, {}], timeout_s=60)
    assert launch.values(res) == [
        {"RANK": "0", "WORLD_SIZE": "2", "FAIRRING_NODE_ID": "a", "X_TEST": "r0", "OMP_NUM_THREADS": "1"},
        {"RANK": "1", "WORLD_SIZE": "2", "FAIRRING_NODE_ID": None, "X_TEST": "1", "OMP_NUM_THREADS": "1"},
    ]
    assert all(r.exitcode == 0 and not r.hung_at_exit for r in res)


def test_deadline_dumps_stacks_then_kills():
    t0 = time.monotonic()
    with pytest.raises(launch.RunFailed, match=r"did not finish within 3s .*\[0, 1\]\); all killed") as e:
        launch.run_ranks(sleep_forever, [None, None], backend=None, timeout_s=3)
    assert time.monotonic() - t0 < 20
    msg = str(e.value)
    assert "rank 1 going to sleep" in msg
    assert "in sleep_forever" in msg  # faulthandler's dump on SIGUSR1
    assert "exitcode=-9" in msg


def test_hung_at_exit_is_flagged():
    res = launch.run_ranks(report_then_hang, [None], backend=None, timeout_s=60, exit_grace_s=1, check=False)
    assert res[0].ok and res[0].value == 0 and res[0].hung_at_exit and res[0].exitcode == -9


def test_rank_procs_stop_the_rest_after_a_failure():
    procs = _ranks.RankProcs()
    procs.spawn([sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ))
    procs.spawn([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ))
    try:
        assert procs.wait(time.monotonic() + 60, failure_grace_s=0.5) == "failure"
        assert procs.running() == [1]
    finally:
        procs.stop()
    assert procs.exitcodes() == [3, -9]


def test_environment_and_place():
    env = _ranks.environment({"A": 1, "B": None}, {"C": "x"}, base={"B": "b", "D": "d"})
    assert env == {"A": "1", "C": "x", "D": "d"}
    place = _ranks.rank_env(5, 6, 2, ranks_per_node=2, master=("10.0.0.1", 1234))
    assert set(place) == set(_ranks.PLACE_VARS) and place["LOCAL_RANK"] == "1" and place["MASTER_PORT"] == "1234"
