"""Failures must surface as errors on every rank, in time, never as hangs."""
from __future__ import annotations

import json
import os
import re
import tempfile
import time

import pytest

import launch
import rank_errors
from topologies import env, node_ids, params

MARGIN_S = 5.0  # slack over the process-group timeout for detection + teardown


def _fmt(results):
    return "\n".join(f"rank {r.rank}: {r.value!r:.3000}" for r in results)


@pytest.mark.parametrize("nodes", params("2x2", "1x2"))
def test_mismatch_raises_everywhere(nodes):
    timeout_s = 10
    res = launch.run_ranks(rank_errors.mismatch, nodes, args=(timeout_s,), timeout_s=4 * (timeout_s + 10) + 60)
    # Every error path ends without std::terminate (a thread destroyed while
    # joinable, or an exception escaping a thread).
    problems = [f"rank {r.rank} printed 'terminate called':\n{r.output[-3000:]}"
                for r in res if "terminate called" in r.output]
    # The first failure of a group dumps its last collectives (RecentOps).
    problems += [f"rank {r.rank} did not log the group's last collectives at its first failure"
                 for r in res if "this group's last collectives" not in r.output]
    for r in res:
        v = r.value
        if not all(v.get("warmup_ok", [])):
            problems.append(f"rank {r.rank}: a warm-up all_reduce was wrong")
        for kind in rank_errors.MISMATCH_KINDS:
            first, later = v[kind]["first"], v[kind]["later"]
            if not first["raised"]:
                problems.append(f"rank {r.rank} [{kind}]: mismatched all_reduce did not raise")
            else:
                if not first["is_runtime"]:
                    problems.append(f"rank {r.rank} [{kind}]: raised {first['type']}, expected RuntimeError")
                if "mismatch" not in first["msg"].lower():
                    problems.append(f"rank {r.rank} [{kind}]: message lacks 'mismatch': {first['msg'][:300]!r}")
            if first["elapsed"] > timeout_s + MARGIN_S:
                problems.append(f"rank {r.rank} [{kind}]: took {first['elapsed']:.1f}s (timeout {timeout_s}s)")
            if not later["raised"]:
                problems.append(f"rank {r.rank} [{kind}]: next all_reduce on the broken group did not raise")
            elif not later["is_runtime"]:
                problems.append(f"rank {r.rank} [{kind}]: next all_reduce raised {later['type']}, expected RuntimeError")
            if later["elapsed"] > timeout_s + MARGIN_S:
                problems.append(f"rank {r.rank} [{kind}]: next all_reduce took {later['elapsed']:.1f}s")
    assert not problems, "\n".join(problems) + "\n" + _fmt(res)


def _check_culprit_named(res, culprit, timeout_s, how, timed_out=False, error_type=None):
    """timed_out: the error must say "Timed out", as gloo's and NCCL's do (PyTorch's
    own test_barrier_timeout_full_group and users' scripts look for it).
    error_type: the name of the torch.distributed error type every error must be."""
    problems = []
    for r in res:
        if r.rank == culprit:
            continue
        v = r.value
        if v is None:
            problems.append(f"rank {r.rank}: returned nothing ({r.exc_type}: {r.exc_msg})")
            continue
        if not v["warm"]:
            problems.append(f"rank {r.rank}: warm-up all_reduce was wrong")
        for key in ("first", "later", "later_async"):
            a = v[key]
            if not a["raised"]:
                problems.append(f"rank {r.rank}: {key} all_reduce did not raise after rank {culprit} {how}")
                continue
            if not a["is_runtime"]:
                problems.append(f"rank {r.rank}: {key} raised {a['type']}, expected RuntimeError")
            if error_type and a["type"] != error_type:
                problems.append(f"rank {r.rank}: {key} raised {a['type']}, expected torch.distributed."
                                f"{error_type}: {a['msg'][:300]!r}")
            if a["elapsed"] > timeout_s + MARGIN_S:
                problems.append(f"rank {r.rank}: {key} raised after {a['elapsed']:.1f}s (timeout {timeout_s}s)")
        a = v["first"]
        if a["raised"] and not re.search(rf"\brank {culprit}\b", a["msg"]):
            problems.append(f"rank {r.rank}: error does not name 'rank {culprit}': {a['msg'][:400]!r}")
        if timed_out and a["raised"] and "Timed out" not in a["msg"]:
            problems.append(f"rank {r.rank}: error does not say 'Timed out': {a['msg'][:400]!r}")
    return problems


STALL_CASES = [(node_ids("2x2"), 3, "stall"), (node_ids("2x2"), 0, "stall"), (node_ids("1x2"), 1, "stall"),
               (node_ids("2x1"), 1, "stall")]


# 2x1-rank1: no node-mate can name the stalled rank; its rail peer does, though
# the stalled rank's rail thread still runs (and says so).
@pytest.mark.parametrize("nodes,culprit,how", STALL_CASES,
                         ids=["2x2-rank3", "2x2-rank0", "1x2-rank1", "2x1-rank1"])
def test_stalled_rank_named_within_timeout(nodes, culprit, how):
    """A rank that stops issuing collectives is named by every other rank
    within the timeout."""
    timeout_s = 5
    with tempfile.TemporaryDirectory(prefix="fairring-test-sync-") as sync_dir:
        res = launch.run_ranks(rank_errors.stall_or_die, nodes, args=(culprit, how, timeout_s, sync_dir),
                               pg_timeout_s=timeout_s, timeout_s=90)
    problems = _check_culprit_named(res, culprit, timeout_s, "stalled", timed_out=True,
                                    error_type="DistBackendError")
    assert not problems, "\n".join(problems) + "\n" + _fmt(res)


@pytest.mark.parametrize("nodes,culprit", [(node_ids("2x2"), 1), (node_ids("1x2"), 0)], ids=["2x2-rank1", "1x2-rank0"])
def test_destroyed_group_named_as_departure(nodes, culprit):
    """A rank that destroys its group while the others go on has left it: the
    others fail at once (not after the timeout) with the conventional network
    error, naming the rank and saying it left."""
    timeout_s = 20
    with tempfile.TemporaryDirectory(prefix="fairring-test-sync-") as sync_dir:
        res = launch.run_ranks(rank_errors.stall_or_die, nodes, args=(culprit, "destroy", timeout_s, sync_dir),
                               pg_timeout_s=timeout_s, timeout_s=90)
    # Bound: no timeout, plus MARGIN_S of slack for a loaded machine; far below
    # the group's timeout.
    problems = _check_culprit_named(res, culprit, 0, "left", error_type="DistNetworkError")
    for r in res:
        if r.rank != culprit and r.value and r.value["first"]["raised"]:
            msg = r.value["first"]["msg"]
            if f"rank {culprit} left the group" not in msg or "Connection closed by peer" not in msg:
                problems.append(f"rank {r.rank}: not named as a departure: {msg[:300]!r}")
    assert not problems, "\n".join(problems) + "\n" + _fmt(res)


DEAD_CASES = [(node_ids("2x2"), 1, "die"), (node_ids("2x1"), 1, "die"), (node_ids("1x2"), 0, "die"),
              (node_ids("2x2"), 2, "die-mid-op"), (node_ids("2x2"), 3, "die-mid-op"),
              (node_ids("1x2"), 1, "die-mid-op"), (node_ids("2x2"), 2, "die-mid-reduce_scatter"),
              (node_ids("2x2"), 1, "die-mid-all_gather"), (node_ids("2x2"), 0, "die-mid-broadcast"),
              (node_ids("1x3"), 1, "die-mid-all_gather"), (node_ids("2x2"), 3, "die-at-barrier"),
              (node_ids("2x2"), 3, "die-mid-all_to_all"), (node_ids("1x3"), 2, "die-mid-all_to_all"),
              (node_ids("2x2"), 1, "die-mid-all_to_all-splits")]


@pytest.mark.parametrize("nodes,culprit,how", DEAD_CASES,
                         ids=["2x2-rank1", "2x1-rank1", "1x2-rank0", "2x2-leader-mid-op", "2x2-non-leader-mid-op",
                              "1x2-non-leader-mid-op", "2x2-mid-reduce_scatter", "2x2-mid-all_gather",
                              "2x2-mid-broadcast", "1x3-mid-all_gather", "2x2-at-barrier", "2x2-mid-all_to_all",
                              "1x3-mid-all_to_all", "2x2-mid-all_to_all-splits"])
def test_dead_rank_named_within_timeout(nodes, culprit, how):
    _dead_rank_named(nodes, culprit, how)


@pytest.mark.parametrize("culprit,how", [(2, "die-mid-op"), (1, "die-mid-all_gather")],
                         ids=["2x2-leader-mid-op", "2x2-mid-all_gather"])
def test_dead_rank_named_on_deferred_mover(culprit, how):
    """The same on the device-like mover (CUDA's ordering on CPU): its rail
    fence (the CUDA staged rail's feeder) must not hold the survivors."""
    _dead_rank_named(node_ids("2x2-deferred"), culprit, how, env=env("2x2-deferred"))


def _dead_rank_named(nodes, culprit, how, env=None):
    timeout_s = 8
    shm_before = launch.list_shm()
    res = launch.run_ranks(rank_errors.stall_or_die, nodes, args=(culprit, how, timeout_s),
                           pg_timeout_s=timeout_s, timeout_s=90, check=False, env=env)
    problems = []
    for r in res:
        if r.rank == culprit:
            if r.exitcode != launch.DELIBERATE_EXIT:
                problems.append(f"culprit rank {r.rank} exit code {r.exitcode} (expected {launch.DELIBERATE_EXIT})")
        elif not (r.ok and r.exitcode == 0):
            problems.append(f"surviving rank {r.rank} did not finish cleanly:\n{r.describe()}")
    if not problems:
        problems += _check_culprit_named(res, culprit, timeout_s, "died", error_type="DistNetworkError")
    # shared memory of the job is gone, also after a crash
    names = {n for r in res if r.value for n in r.value["maps"]}
    left = sorted(n for n in names if n in launch.list_shm())
    if left:
        problems.append(f"segments of the job left in /dev/shm after a rank crashed: {left}")
    new = launch.shm_left_behind(launch.list_shm() - shm_before)
    if new:
        problems.append(f"fairring-* files created during the job remain in /dev/shm: {sorted(new)}")
    assert not problems, "\n".join(problems) + "\n" + launch.describe_all(res)


@pytest.mark.parametrize("nodes,culprit", [(node_ids("1x2"), 1), (node_ids("2x2"), 3)], ids=["1x2", "2x2"])
def test_abort_and_shutdown_with_ops_in_flight(nodes, culprit):
    """abort() (torch's _abort_process_group) fails every pending op at once,
    wakes the waits, and later ops fail; shutdown() (destroy_process_group)
    drains within the timeout, then aborts what a stalled peer holds; a clean
    shutdown completes what was issued; a fresh group works after each."""
    timeout_s = 3
    res = launch.run_ranks(rank_errors.abort_and_shutdown, nodes, args=(culprit, timeout_s), pg_timeout_s=30,
                           timeout_s=120)
    problems = []
    for r in res:
        v = r.value
        for key in ("after_abort_fresh_group", "after_shutdown_fresh_group", "clean_shutdown_result"):
            if not v[key]:
                problems.append(f"rank {r.rank}: {key}: wrong all_reduce result")
        if v["clean_shutdown_wait"]["raised"]:
            problems.append(f"rank {r.rank}: an op issued before a clean shutdown failed: "
                            f"{v['clean_shutdown_wait']['msg'][:300]}")
        a = v["after_shutdown"]
        if not (a["raised"] and "shut down" in a["msg"] and a["type"] == "DistBackendError"):
            problems.append(f"rank {r.rank}: an op after shutdown: {a}")
        if r.rank == culprit:
            continue
        for i, w in enumerate(v["abort_waits"]):
            if not (w["raised"] and "aborted" in w["msg"] and w["type"] == "DistBackendError"):
                problems.append(f"rank {r.rank}: wait on op {i} in flight at abort(): {w}")
        if v["abort_elapsed"] > 3:
            problems.append(f"rank {r.rank}: the waits woke {v['abort_elapsed']:.1f}s after the wait began "
                            "(abort() came after 0.5 s)")
        a = v["after_abort"]
        if not (a["raised"] and "aborted" in a["msg"]):
            problems.append(f"rank {r.rank}: an op after abort(): {a}")
        if not timeout_s - 0.5 < v["shutdown_elapsed"] < timeout_s + 3:
            problems.append(f"rank {r.rank}: destroy_process_group with a stalled peer took "
                            f"{v['shutdown_elapsed']:.1f}s (timeout {timeout_s}s)")
        # The drain and the op's own wait both end at the group's timeout:
        # whichever comes first fails the op, with the shutdown or with the
        # timeout naming the stalled rank; either way it fails, and in time.
        w = v["shutdown_wait"]
        names_culprit = "Timed out" in w["msg"] and f"rank {culprit} " in w["msg"]
        if not (w["raised"] and ("shut down" in w["msg"] or names_culprit)):
            problems.append(f"rank {r.rank}: the op in flight at shutdown: {w}")
    assert not problems, "\n".join(problems) + "\n" + _fmt(res)


@pytest.mark.parametrize("nodes", params("1x2", "2x2"))
def test_ctrl_c_in_a_blocked_all_reduce(nodes):
    """SIGINT on a rank blocked in all_reduce (its peer never arrives) raises
    KeyboardInterrupt within a second, not at the group's timeout (20 s), and
    every rank's next op fails naming the interrupted rank."""
    timeout_s = 20
    res = launch.run_ranks(rank_errors.interrupted_wait, nodes, args=(len(nodes) - 1, timeout_s), timeout_s=90)
    problems = []
    for r in res:
        v = r.value
        if r.rank == 0:
            if v["raised"] != "KeyboardInterrupt" or v["elapsed"] > 3:
                problems.append(f"rank 0: raised {v['raised']!r} after {v['elapsed']:.1f}s")
        n = v["next"]
        if not (n["raised"] and re.search(r"\brank 0\b", n["msg"]) and "interrupted" in n["msg"]):
            problems.append(f"rank {r.rank}: the next op: {n}")
        elif n["elapsed"] > 5:
            problems.append(f"rank {r.rank}: the next op failed only after {n['elapsed']:.1f}s")
    assert not problems, "\n".join(problems) + "\n" + _fmt(res)


def test_option_validation():
    with tempfile.TemporaryDirectory(prefix="fairring-test-store-") as d:
        res = launch.run_ranks(rank_errors.validation, node_ids("2x1"), backend=None, args=(d,), timeout_s=180)
    problems = []
    for r in res:
        v = r.value
        for var, val, kind, msg in v["env"]:
            if kind != "ValueError":
                problems.append(f"rank {r.rank}: {var}={val!r}: {kind} (expected ValueError) {msg[:200]!r}")
            elif var not in msg:
                problems.append(f"rank {r.rank}: {var}={val!r}: ValueError does not name {var}: {msg[:200]!r}")
        for field, kw, kind, msg in v["options"]:
            if kind != "ValueError":
                problems.append(f"rank {r.rank}: Options({kw}): {kind} (expected ValueError) {msg[:200]!r}")
            elif field.lower() not in msg.lower():
                problems.append(f"rank {r.rank}: Options({kw}): ValueError does not name {field}: {msg[:200]!r}")
        if v["good"] != ("no error", ""):
            problems.append(f"rank {r.rank}: valid env settings (256K, ...) failed: {v['good']}")
        elif not str(v.get("good_addr", "")).startswith("127."):
            problems.append(f"rank {r.rank}: FAIRRING_SOCKET_IFNAME=lo but listen_address() = {v.get('good_addr')!r}")
        for var, kind, msg in v["disagree"]:
            if kind != "ValueError" or var not in msg:
                problems.append(f"rank {r.rank}: ranks with different {var}: {kind} {msg[:200]!r} "
                                f"(expected a ValueError naming {var})")
        if v["good_options"] != ("no error", ""):
            problems.append(f"rank {r.rank}: valid Options failed: {v['good_options']}")
    assert not problems, "\n".join(problems)


def _init_fails_everywhere(nodes, bad, var, value, bad_type=None, others_type="DistBackendError"):
    """Group creation with `var`=`value` on rank `bad` only: every rank must
    fail within half the timeout, naming `var`, the others naming rank `bad`."""
    timeout_s = 30
    rank_env = [{var: value} if r == bad else {} for r in range(len(nodes))]
    with tempfile.TemporaryDirectory(prefix="fairring-test-store-") as d:
        res = launch.run_ranks(rank_errors.init_failure, nodes, backend=None, args=(d, timeout_s),
                               rank_env=rank_env, timeout_s=120)
    problems = []
    for r in res:
        v = r.value
        if not v["raised"]:
            problems.append(f"rank {r.rank}: group creation succeeded")
            continue
        if var not in v["msg"]:
            problems.append(f"rank {r.rank}: error does not name {var}: {v['msg'][:400]!r}")
        if r.rank == bad and bad_type and v["type"] != bad_type:
            problems.append(f"rank {r.rank}: raised {v['type']}, expected {bad_type}")
        if r.rank != bad and v["type"] != others_type:
            problems.append(f"rank {r.rank}: raised {v['type']}, expected {others_type}")
        if r.rank != bad and not re.search(rf"\brank {bad}\b", v["msg"]):
            problems.append(f"rank {r.rank}: error does not name rank {bad}: {v['msg'][:400]!r}")
        if v["elapsed"] > timeout_s / 2:
            problems.append(f"rank {r.rank}: failed after {v['elapsed']:.1f}s (group timeout {timeout_s}s): "
                            f"{v['msg'][:400]!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("nodes,bad", [(node_ids("1x2"), 1), (node_ids("2x2"), 0), (node_ids("2x1"), 1)],
                         ids=["1x2-rank1", "2x2-rank0", "2x1-rank1"])
def test_init_failure_reaches_every_rank(nodes, bad):
    """One rank's FAIRRING_TOTAL_MEMORY is too small: every rank fails group
    creation at once, and names the failing rank and the variable."""
    _init_fails_everywhere(nodes, bad, "FAIRRING_TOTAL_MEMORY", "64K", bad_type="ValueError")


@pytest.mark.parametrize("step", ["arena", "rail", "movers", "start"])
def test_failure_at_each_construction_step_unwinds(step):
    """A failure injected at each step of rank 1's engine construction
    (FAIRRING_TEST_FAIL_AT, 2x2: shared memory, TCP rails and their threads
    exist from "rail" on): every rank fails group creation naming rank 1 and
    the cause, every process exits cleanly (no crash, no hang in what the
    steps before built), and nothing is left in /dev/shm."""
    before = launch.list_shm()
    _init_fails_everywhere(node_ids("2x2"), 1, "FAIRRING_TEST_FAIL_AT", step)
    # Other tests of the suite create segments meanwhile: only one that stays counts.
    left = launch.shm_left_behind(launch.list_shm() - before)
    assert not left, f"segments left after a failure at step {step!r}: {sorted(left)}"


@pytest.mark.parametrize("value", ["1", "512K"])
def test_init_failure_of_the_store_host_reaches_the_others(value):
    """Rank 0 of 1 x 2 hosts the TCP store and fails group creation on its own
    FAIRRING_TOTAL_MEMORY, then exits at once: rank 1 still gets the cause
    (rank 0 waits for it to read it first), not 'Connection reset by peer'."""
    timeout_s = 30
    with tempfile.TemporaryDirectory(prefix="fairring-test-init-") as d:
        res = launch.run_ranks(rank_errors.init_failure_store_host_exits, node_ids("1x2"), backend=None,
                               args=(launch.free_port(), d, timeout_s),
                               rank_env=[{"FAIRRING_TOTAL_MEMORY": value}, {}], timeout_s=120, check=False)
        with open(os.path.join(d, "rank0.json")) as f:
            rank0 = json.load(f)
    problems = []
    if not (rank0["raised"] and "FAIRRING_TOTAL_MEMORY" in rank0["msg"]):
        problems.append(f"rank 0: {rank0}")
    v = res[1].value
    if not (res[1].ok and v["raised"] and "FAIRRING_TOTAL_MEMORY" in v["msg"] and re.search(r"\brank 0\b", v["msg"])):
        problems.append(f"rank 1: {v}\n{res[1].describe()}")
    elif v["elapsed"] > timeout_s / 2:
        problems.append(f"rank 1: failed after {v['elapsed']:.1f}s")
    assert not problems, "\n".join(problems)


def test_late_but_live_peer_is_waited_for():
    """A peer that comes 0.92 x timeout late (4.6 s of 5 s) is not a failure
    (it used to be named as stalled at 0.9 x timeout, on one rank only)."""
    timeout_s, late_s = 5, 4.6
    res = launch.run_ranks(rank_errors.late_peer, node_ids("1x2"), args=(1, late_s), pg_timeout_s=timeout_s,
                           timeout_s=90)
    problems = []
    for r in res:
        v = r.value
        if v["raised"] or not v["right"]:
            problems.append(f"rank {r.rank}: the late all_reduce failed or was wrong: {v}")
        if v["after"]["raised"] or not v["after_right"]:
            problems.append(f"rank {r.rank}: the next all_reduce failed or was wrong: {v['after']}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("culprit", [1, 0], ids=["non-leader", "leader"])
def test_rank_stopped_mid_stream_is_named(culprit):
    """SIGSTOP of a rank in the middle of a stream of large all_reduces on
    2x2: its node-mate blocks behind it and goes silent on its rail, yet every
    survivor names the stopped rank, within 1.5 x the timeout."""
    timeout_s = 6
    res = launch.run_ranks(rank_errors.stop_mid_stream, node_ids("2x2"), args=(culprit, timeout_s),
                           pg_timeout_s=timeout_s, timeout_s=120)
    problems = _check_culprit_named(res, culprit, timeout_s * 1.5 - MARGIN_S, "stopped")
    assert not problems, "\n".join(problems) + "\n" + _fmt(res)


@pytest.mark.parametrize("delay_s,held", [(3.5, False), (6.0, True)], ids=["lets-go-in-time", "still-held"])
def test_failed_op_memory_is_not_touched_after_its_error(delay_s, held):
    """Rank 0's rail thread stalls (an injected sleep) right before it reduces
    its shard into rank 0's tensor, while the group fails around it (timeout
    2 s: rank 1 gives up on rank 0 at 2.5 s, rank 0 on the network at 2.7 s).
    The op's error must not reach rank 0's caller while that thread may still
    write the tensor: it comes once the thread let go (3.5 s), and the tensor
    stays as it was after it.  A thread that does not let go within the
    timeout (6 s) gets the error at failure + timeout, and the error says the
    tensor is still held: the rank drops its 16 MiB tensor then, and must not
    crash when the thread writes at 6 s (Fairring keeps it allocated).  Before
    the fix the error came at 2.7 s and the tensor changed at 3.5 s, or, once
    dropped (unmapped), the write crashed the rank with SIGSEGV: what
    test_netfaults.py::test_peer_stops_reading saw once, at exit."""
    timeout_s = 2
    res = launch.run_ranks(rank_errors.memory_after_failure, node_ids("2x1"), args=(0, delay_s, held),
                           rank_env=[{"FAIRRING_TEST_RAIL_REDUCE_DELAY_MS": int(delay_s * 1000)}, {}],
                           pg_timeout_s=timeout_s, timeout_s=90, check=False)
    problems = [f"rank {r.rank} did not finish cleanly:\n{r.describe()}" for r in res
                if not (r.ok and r.exitcode == 0)]
    assert not problems, "\n".join(problems)
    for r in res:
        e = r.value["error"]
        if not (e["raised"] and e["is_runtime"]):
            problems.append(f"rank {r.rank}: no RuntimeError: {e}")
        elif not re.search(r"\brank 0\b", e["msg"]):
            problems.append(f"rank {r.rank}: the error does not name rank 0: {e['msg'][:400]!r}")
    e0, changed = res[0].value["error"], res[0].value["changed_after_error"]
    says_held = "may still change" in e0.get("msg", "")
    if held:
        if not says_held:
            problems.append(f"rank 0: the error does not say the tensor is still held: {e0}")
        if not 2 * timeout_s + 0.3 <= e0["elapsed"] <= delay_s:
            problems.append(f"rank 0: error after {e0['elapsed']:.1f}s, expected at failure + timeout")
    else:
        if changed:
            problems.append(f"rank 0: {changed} elements of the failed op's tensor changed after its error")
        if says_held:
            problems.append(f"rank 0: the thread let go in time, yet the error says it holds the tensor: {e0}")
        if e0["elapsed"] < delay_s - 0.2:
            problems.append(f"rank 0: error after {e0['elapsed']:.1f}s, before the rail thread let go")
    assert not problems, "\n".join(problems) + "\n" + _fmt(res)


@pytest.mark.parametrize("nodes", params("1x2", "2x2"))
def test_fork_after_init(nodes):
    res = launch.run_ranks(rank_errors.fork_after_init, nodes, timeout_s=120)
    problems = []
    for r in res:
        v = r.value
        child = v["child"]
        if v["child_status"] != 0:
            problems.append(f"rank {r.rank}: forked child ended with status {v['child_status']}: {child!r}")
        if not child.startswith("RuntimeError") or "fork" not in child.split("\n")[0]:
            problems.append(f"rank {r.rank}: child's all_reduce did not raise a clear error: {child!r}")
        if "barrier: RuntimeError" not in child or "torn down" not in child:
            problems.append(f"rank {r.rank}: child's barrier/teardown: {child!r}")
        if v["after"]["raised"] or not v["after_right"]:
            problems.append(f"rank {r.rank}: parent's all_reduce after the fork failed or was wrong: {v['after']}")
    assert not problems, "\n".join(problems)


def test_hostile_connections_on_rail_port():
    """Rogue connections are rejected without disturbing the job, and logged
    once (the rest at debug level), not once each."""
    res = launch.run_ranks(rank_errors.hostile_peers, node_ids("2x1"), args=(500,), timeout_s=120)
    problems = [f"rank {r.rank}: wrong all_reduce result with rogue connections" for r in res if not r.value["right"]]
    for r in res:
        lines = [ln for ln in r.output.splitlines() if "rejected a connection" in ln]
        if len(lines) > 1:
            problems.append(f"rank {r.rank}: {len(lines)} rejection lines logged: {lines[:3]}")
    assert not problems, "\n".join(problems)


def test_flood_of_500_connections_at_once():
    """500 connections reach rank 1's rail port together (silent, garbage,
    wrong secret) and stay open past the greeting deadline while the job
    runs: results stay right, rank 1's memory and open fds stay bounded,
    and with FAIRRING_DEBUG=1 each rejection is logged once, at a bounded
    rate, the rest counted in summary lines."""
    flood, hold_s = 500, 7
    res = launch.run_ranks(rank_errors.hostile_flood, node_ids("2x1"), args=(flood, hold_s), timeout_s=120,
                           rank_env=[{}, {"FAIRRING_DEBUG": "1"}])
    v0, v1 = res[0].value, res[1].value
    problems = [f"rank {r.rank}: wrong all_reduce result under the flood" for r in res if not r.value["right"]]
    if v0["connected"] < flood * 0.9:
        problems.append(f"only {v0['connected']} of {flood} connections were established (nothing much was tested)")
    grew = v1["rss_peak"] - v1["rss_before"]
    if grew > 64 << 20:
        problems.append(f"rank 1's RSS grew by {grew / 2**20:.0f} MiB under the flood")
    if v1["fds_after"] > v1["fds_before"] + 2:
        problems.append(f"rank 1 holds {v1['fds_after'] - v1['fds_before']} more fds after the flood")
    out = res[1].output
    logged = re.findall(r"rejected a connection from (\S+):", out)
    summed = sum(int(n) for n in re.findall(r"rejected (\d+) more connection", out))
    dupes = sorted({a for a in logged if logged.count(a) > 1})
    if dupes:
        problems.append(f"connections logged more than once: {dupes[:5]}")
    if len(logged) + summed != v0["connected"]:
        problems.append(f"{len(logged)} rejections logged and {summed} summed up, for {v0['connected']} connections")
    if len(logged) > 10 * (hold_s + 6) + 1:
        problems.append(f"{len(logged)} rejection lines: the debug log is not rate-limited")
    assert not problems, "\n".join(problems) + f"\nrank 1: {v1}\nrank 1 log tail:\n{out[-3000:]}"


def test_stale_segment_of_a_crashed_creator_is_swept():
    """A segment left in /dev/shm by a creator that died during group creation
    (before every rank mapped it) is removed at the next group's creation."""
    import os
    import subprocess

    # A process that exits at once gives a pid that is gone.
    p = subprocess.Popen(["true"])
    p.wait()
    name = f"fairring-deadbeefdeadbeef-node0-p{p.pid}"
    path = os.path.join("/dev/shm", name)
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    old = time.time() - 3600
    os.utime(path, (old, old))
    young = f"fairring-feedfacefeedface-node0-p{p.pid}"
    with open(os.path.join("/dev/shm", young), "wb") as f:
        f.write(b"\0" * 4096)
    try:
        launch.run_ranks(rank_errors.late_peer, node_ids("1x2"), args=(1, 0.0), timeout_s=60)
        assert not os.path.exists(path), "the stale segment of a dead creator was not removed"
        # A young one may belong to a group being created in another pid namespace.
        assert os.path.exists(os.path.join("/dev/shm", young)), "a segment younger than a minute was removed"
    finally:
        for n in (name, young):
            if os.path.exists(os.path.join("/dev/shm", n)):
                os.unlink(os.path.join("/dev/shm", n))


def test_bad_tensors_give_right_results_or_clear_errors():
    res = launch.run_ranks(rank_errors.bad_tensors, node_ids("2x2"), timeout_s=120)
    problems = []
    for r in res:
        v = r.value
        for case, (outcome, detail) in v.items():
            if outcome == "wrong":
                problems.append(f"rank {r.rank} [{case}]: silently wrong: {detail}")
        for case in ("overlapping-view", "0-dim", "empty", "requires-grad-leaf", "meta", "after"):
            if v[case][0] != "ok":
                problems.append(f"rank {r.rank} [{case}]: expected a right result, got {v[case]}")
        outcome, detail = v["rs-uneven-wrong-output"]
        if outcome != "error" or "its block of the input list" not in detail:
            problems.append(f"rank {r.rank} [rs-uneven-wrong-output]: expected fairring's clear error, got {detail}")
        outcome, detail = v["expanded-stride0"]
        if outcome != "error" or "share memory" not in detail or "fairring" not in detail:
            problems.append(f"rank {r.rank} [expanded-stride0]: expected fairring's clear error, got {v['expanded-stride0']}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("case", ["one", "all", "gather-root", "scatter-list-off-root"])
@pytest.mark.parametrize("ids", params("2x2", "uneven-2+1"))
def test_a_rank_that_rejects_its_own_arguments_still_takes_the_turn(ids, case):
    """Checks that only the rank itself can make (its own block of an uneven
    all_gather list, the root's list of a gather, a list passed off the
    root): the rank raises its own error and its peers fail at once with one
    that names it, where they used to wait out the group's timeout (300 s
    here, past the test's).  When every rank rejects alike, their stand-ins
    match and the group goes on."""
    culprit = {"one": 1, "all": None, "gather-root": 0, "scatter-list-off-root": 1}[case]
    res = launch.run_ranks(rank_errors.rejected_in_turn, ids, args=(case,), timeout_s=90, pg_timeout_s=300)
    own = {"one": "its block of the output list (tensor 1) has 4", "all": "its block of the output list",
           "gather-root": "needs one tensor per rank", "scatter-list-off-root": "takes a list of tensors on the root"}
    for r in res:
        v = r.value
        assert v["took"] < 30, f"rank {r.rank}: {v}"
        if culprit is None or r.rank == culprit:
            assert v["error"] and v["error"].startswith(("ValueError", "RuntimeError")) and own[case] in v["error"], v
        if culprit is None:
            assert v["after"] == "ok", f"rank {r.rank}: the group did not go on: {v}"
            continue
        # A mismatch fails the group on every rank, as any other does; a
        # peer whose part of the op needed nothing of the culprit's (a
        # scatter's other ranks) completes it and meets the failure next.
        told = (v["error"] or "") + " " + v["after"]
        assert f"rank {culprit} has " in told and "whose arguments that rank rejected" in told, f"rank {r.rank}: {v}"
        assert v["after"].startswith("DistBackendError") and "mismatch" in v["after"], f"rank {r.rank}: {v}"
        if r.rank != culprit and v["error"]:
            assert v["error"].startswith("DistBackendError"), f"rank {r.rank}: {v}"


@pytest.mark.parametrize("ids", params("2x2", "uneven-2+1"))
def test_splits_past_int64_and_short_lists_are_clear_errors(ids):
    res = launch.run_ranks(rank_errors.splits_past_int64_and_short_lists, ids, timeout_s=60, pg_timeout_s=300)
    for r in res:
        errors = r.value["errors"]
        assert errors["splits"] and "splits add up to more than the" in errors["splits"], errors
        assert errors["short-list"] and errors["short-list"].startswith("ValueError") and \
            f"needs one output tensor per rank ({len(ids)}), but the output list holds {len(ids) - 1}" \
            in errors["short-list"], errors
        assert r.value["after"], r.value


def test_whole_job_killed_leaves_no_segment():
    with tempfile.TemporaryDirectory(prefix="fairring-test-sync-") as d:
        launch.run_ranks(rank_errors.all_killed, node_ids("2x2"), args=(d,), timeout_s=60, check=False)
        import os

        names = set()
        for f in os.listdir(d):
            with open(os.path.join(d, f)) as fh:
                names |= {n for n in fh.read().split("\n") if n}
    assert names, "the ranks mapped no shared memory segment (nothing was tested)"
    left = sorted(n for n in names if n in launch.list_shm())
    assert not left, f"segments of a job whose ranks were all killed remain in /dev/shm: {left}"


def test_job_killed_while_a_rank_is_late_leaves_no_segment():
    """Rank 1 of 1x2 is 4 s late to the node's shared memory; both ranks are
    SIGKILLed 2.5 s into group creation.  The segment is created only once
    every local rank is there to open it (and unlinked by the last one), so
    nothing of the job is in /dev/shm while rank 1 is late, nor after the
    kill.  Before, rank 0 created it at once and the kill left it behind
    (12 MiB with the default options) until a later import swept it."""
    before = launch.list_shm()
    with tempfile.TemporaryDirectory(prefix="fairring-test-sync-") as d:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(launch.free_port())}
        res = launch.run_ranks(rank_errors.killed_during_init, node_ids("1x2"), args=(d, 2.5), backend=None, env=env,
                               rank_env=[{}, {"FAIRRING_TEST_ARENA_DELAY_MS": 4000}], timeout_s=60, check=False)
        assert all(r.exitcode == -9 for r in res), launch.describe_all(res)
        with open(os.path.join(d, "shm")) as f:
            during = {n for n in f.read().split("\n") if n} - before
    after = launch.shm_left_behind(launch.list_shm() - before)  # not a neighbour test's segment
    assert not during, f"segments in /dev/shm while a local rank was late: {sorted(during)}"
    assert not after, f"segments left in /dev/shm by a job killed during group creation: {sorted(after)}"


@pytest.mark.parametrize("nodes,bad", [(node_ids("1x2"), 1), (node_ids("2x2"), 2)], ids=["1x2", "2x2"])
def test_bad_option_on_one_rank_fails_every_rank(nodes, bad):
    """A value only one rank's environment has wrong: that rank raises
    ValueError naming it, the others fail at once with the same cause
    (they used to wait the whole timeout in the gloo rendezvous)."""
    _init_fails_everywhere(nodes, bad, "FAIRRING_PARALLELISM", "0", bad_type="ValueError")


@pytest.mark.skipif(not os.path.isdir("/proc/self/map_files") or os.geteuid() != 0,
                    reason="reads /proc/self/map_files (root)")
def test_shared_memory_is_private_to_the_user():
    """Segments are created 0600, so another user cannot map the node's data."""
    res = launch.run_ranks(rank_errors.shm_modes, node_ids("1x2"), timeout_s=90)
    for r in res:
        v = r.value
        assert v["ok"] and v["maps"], f"rank {r.rank}: {v}"
        for name, mode, uid in v["maps"]:
            assert mode == 0o600 and uid == v["uid"], f"rank {r.rank}: {name} has mode {oct(mode)}, owner {uid}"


@pytest.mark.parametrize("nodes", params("1x2", "2x1"))
def test_errors_name_the_op_by_its_number_in_the_group(nodes):
    res = launch.run_ranks(rank_errors.numbers_agree, nodes, args=(10,), timeout_s=90)
    for r in res:
        v = r.value
        assert v["sum_ok"]
        assert v["failed"]["raised"] and "mismatch" in v["failed"]["msg"], v["failed"]
        assert "#2" in v["failed"]["msg"] and "#1" not in v["failed"]["msg"], v["failed"]["msg"]
        assert (2, "all_reduce", "failed") in v["recent"], v["recent"]
        assert v["recent"][0][0] == 0 and v["recent"][0][1].endswith("(gloo)"), v["recent"]
