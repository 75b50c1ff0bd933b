"""HeldOps (csrc/pipeline/held_ops.h), the device side of the CUDA engine's
watchdog, against a scripted device: ops whose device work finishes at given
times, never, or with a device error; a peer that dies; a group that fails
from elsewhere.  Runs on the CPU: HeldOps knows the device only through its
hooks, which the CUDA engine fills with CUDA event queries."""
from __future__ import annotations

from fairring_py import _C

NEVER = -1


def scenario(**kw):
    events = _C._held_ops_scenario_for_test(**kw)
    out = {"released": {}, "device_failed": {}, "faults": [], "stop": None}
    for ms, kind, seq, text in events:
        if kind == "released":
            out["released"][seq] = ms
        elif kind == "device_failed":
            assert seq not in out["device_failed"], f"op {seq} reported twice"
            out["device_failed"][seq] = (ms, text)
        elif kind == "fault":
            out["faults"].append((ms, text))
        elif kind == "stop":
            out["stop"] = ms
    return out


def test_ops_finishing_in_time_are_released_in_order_and_nothing_fails():
    r = scenario(timeout_ms=2000, finish_ms=[50, 100, 150], run_ms=400)
    assert sorted(r["released"]) == [0, 1, 2]
    assert r["released"][0] <= r["released"][1] <= r["released"][2]
    assert all(r["released"][i] < 400 for i in range(3)), r
    assert not r["faults"] and not r["device_failed"], r


def test_stalled_op_times_out_naming_it_and_every_pending_op_is_failed():
    r = scenario(timeout_ms=300, finish_ms=[50, NEVER, NEVER], run_ms=1500)
    assert len(r["faults"]) == 1, r
    ms, why = r["faults"][0]
    assert "Timed out" in why and "all_reduce #1's device work" in why and "300 ms" in why, why
    assert ms >= 300, f"timed out after {ms:.0f} ms, before the 300 ms timeout"
    assert r["released"].get(0, 1e9) < ms, "the finished op was not released before the timeout"
    # The stalled op and the one behind it: failed to their Works, kept (not freed under the device).
    assert set(r["device_failed"]) == {1, 2}, r
    for seq in (1, 2):
        assert f"all_reduce #{seq} did not complete" in r["device_failed"][seq][1]
        assert why in r["device_failed"][seq][1], "the Work's error does not carry the group's cause"
    assert 1 not in r["released"] and 2 not in r["released"], r


def test_an_op_gets_the_timeout_from_when_it_became_the_oldest():
    # Op 1 is held at 0 but waits behind op 0 until 300 ms: its deadline is
    # 300 + 400 = 700 ms, after it finishes (600 ms).  Counted from when it
    # was held it would have timed out at 400 ms.
    r = scenario(timeout_ms=400, finish_ms=[300, 600], run_ms=1000)
    assert not r["faults"], r
    assert sorted(r["released"]) == [0, 1], r


GRACE_MS = 2000  # PeerWatch::kGrace (held_ops.h)


def test_dead_peer_fails_the_op_after_a_grace_not_at_the_timeout():
    r = scenario(timeout_ms=20000, finish_ms=[NEVER], peer_dies_ms=100, run_ms=GRACE_MS + 1500)
    assert len(r["faults"]) == 1, r
    ms, why = r["faults"][0]
    assert "all_reduce #0's device work cannot finish" in why and "rank 1" in why, why
    assert 100 + GRACE_MS <= ms < GRACE_MS + 1400, f"the dead peer failed the op after {ms:.0f} ms"
    assert set(r["device_failed"]) == {0}


def test_work_that_finishes_after_a_peer_exits_is_no_failure():
    # A peer that has done its part may exit while ours still runs (copies
    # of what it wrote): within the grace that is no failure.
    r = scenario(timeout_ms=20000, finish_ms=[600], peer_dies_ms=100, run_ms=1000)
    assert not r["faults"] and not r["device_failed"], r
    assert 0 in r["released"], r


def test_device_error_fails_the_group_and_the_op():
    r = scenario(timeout_ms=10000, finish_ms=[100, 200], error_op=0, run_ms=800)
    assert len(r["faults"]) == 1, r
    assert "a device error in all_reduce #0" in r["faults"][0][1] and "illegal memory access" in r["faults"][0][1]
    assert set(r["device_failed"]) >= {0}, r
    assert 0 not in r["released"], "an op whose device work faulted was released to the allocator"


def test_after_a_failure_ops_that_finish_after_all_are_released():
    # The group fails at 100 ms (elsewhere) while ops 0 and 1 run: both are
    # reported failed; op 1 still finishes at 300 ms (as NCCL kernels do once
    # their communicator is aborted) and its memory goes back then; op 0
    # never does and is kept at teardown.
    r = scenario(timeout_ms=10000, finish_ms=[NEVER, 300], fail_ms=100, run_ms=800)
    assert not r["faults"], r
    assert set(r["device_failed"]) == {0, 1}, r
    for seq in (0, 1):
        ms, text = r["device_failed"][seq]
        assert 100 <= ms < 300, (seq, ms)
        assert "the group failed elsewhere" in text
    assert 300 <= r["released"].get(1, -1) < 800, r
    assert 0 not in r["released"], r


def test_teardown_waits_for_running_work_then_releases_it():
    # stop() at 100 ms; op 0 finishes at 300 ms, inside the timeout: released, not leaked.
    r = scenario(timeout_ms=2000, finish_ms=[300], run_ms=100)
    assert r["released"].get(0, -1) >= 300, r
    assert not r["faults"] and not r["device_failed"], r


def fence_scenario(fence):
    released, written_at_release, written, after_release, reported = _C._failed_op_fence_scenario_for_test(
        streams=3, writes_per_stream=4, step_ms=15, fence=fence)
    return {"released": released, "written_at_release": written_at_release, "written": written,
            "after_release": after_release, "reported": reported}


def test_failed_op_with_queued_device_work_is_held_until_it_has_run():
    # The engine's fence on failure (fence_failed_op): the tail waits for
    # every stream the op used, then records `done`; the op, failed to its
    # Work at once, goes back only after its queued writes have all landed.
    r = fence_scenario(fence=True)
    assert r["written"] == 12, r
    assert r["released"] and r["written_at_release"] == 12 and r["after_release"] == 0, r
    assert r["reported"] == 1, "the failed op's Work was not told while its device work was pending"


def test_without_the_fence_a_failed_op_goes_back_under_its_queued_work():
    # What the fence prevents: `done` never recorded reads as finished, so
    # the op is released while writes into its memory are still queued.
    r = fence_scenario(fence=False)
    assert r["released"] and r["written_at_release"] < 12 and r["after_release"] > 0, r
