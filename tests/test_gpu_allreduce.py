"""The CUDA all-reduce on simulated clusters (several ranks may share one
GPU): 1x2 and 2x2 (FAIRRING_NODE_ID), plus a 2x2 with tiny slices so that
many slices are pipelined through few slots.  Skipped without a GPU or a
CUDA build."""
from __future__ import annotations

import pytest
import torch

import launch
import rank_gpu_checks
from gpu_support import requires_gpu
from topologies import node_ids

SIZES = [1, 13, 1031, 4099, 65537, 262147]

# gpu_check.sh's first session: every dtype and op small, a few large (4M
# elements: several slices), on one rank, on one node (CUDA IPC) and on two
# (no IPC).
SMOKE = {"sizes": [1, 4099], "large_size": (4 << 20) + 3,
         "large_cases": [(torch.float32, "SUM"), (torch.bfloat16, "AVG"), (torch.int32, "MAX")]}
# session name: (topology in tests/topologies.py, more environment, sections, cfg)
SESSIONS = {
    "smoke-1x1": ("1x1", {}, ["correctness"], SMOKE),
    "smoke-1x2": ("1x2", {}, ["correctness"], SMOKE),
    "smoke-2x1": ("2x1", {}, ["correctness"], SMOKE),
    "1x1": ("1x1", {}, ["correctness", "streams", "collectives", "exchanges"], {"sizes": SIZES}),
    "1x2": ("1x2", {}, ["correctness", "streams", "errors", "ddp", "collectives", "exchanges", "p2p", "issue_order"],
            {"sizes": SIZES}),
    "2x1": ("2x1", {}, ["correctness", "streams", "collectives", "exchanges", "p2p", "issue_order"], {"sizes": SIZES}),
    "2x2": ("2x2", {}, ["correctness", "streams", "errors", "ddp", "collectives", "exchanges", "p2p", "issue_order",
                        "half_range"], {"sizes": SIZES}),
    # Nodes of 2 and 1: the CUDA engine runs them flat (one rank a node).
    "uneven-2+1": ("uneven-2+1", {}, ["half_range"], {}),
    # NCCL between nodes: every rank on its own GPU (skipped with fewer GPUs).
    "2x1-nccl": ("2x1", {"FAIRRING_GPU_TRANSPORT": "nccl"}, ["correctness", "streams", "collectives", "exchanges"],
                 {"sizes": SIZES}),
    "2x2-slice4K": ("2x2-slice4K", {}, ["correctness", "streams", "collectives", "exchanges"],
                    {"sizes": [1, 1031, 65537, 262147], "exchange_sizes": [1, 1031, 4099]}),
}

# Checks aimed at what a desk review found (issue 10), on their own sessions.
BIG = [(4 << 20) // 4 + 7, (8 << 20) // 4 - 5]  # 4 and 8 MB float32, odd
REVIEW_SECTIONS = ["poll_then_launch", "slow_producer", "group_cycles"]
SESSIONS.update({
    # 256 KiB slices: many slices, each of several chunks and shards.
    "2x2-slice256K": ("2x2", {"FAIRRING_SLICE_SIZE": "256K"}, ["big_slices"] + REVIEW_SECTIONS, {"sizes": BIG}),
    "1x2-slice256K": ("1x2", {"FAIRRING_SLICE_SIZE": "256K"}, ["big_slices"] + REVIEW_SECTIONS, {"sizes": BIG}),
    # Three nodes: small chunks have fewer shards than nodes.
    "3x1": ("3x1", {}, ["correctness", "exchanges"], {"sizes": [1, 13, 1031, 8193, 65537]}),
})

# Compressed rails (FAIRRING_WIRE_DTYPE) with both transports; small slices
# and two slots reuse every wire buffer while others are in flight.
WIRE_SIZES = [1, 13, 1031, 65537, 300_007]
SMALL_SLICES = {"FAIRRING_SLICE_SIZE": "64K", "FAIRRING_PARALLELISM": "2", "FAIRRING_TOTAL_MEMORY": "4M"}
WIRE = {
    "2x2-bf16": ("2x2", {"FAIRRING_WIRE_DTYPE": "bf16"}),
    "2x1-fp16": ("2x1", {"FAIRRING_WIRE_DTYPE": "fp16"}),
    "3x1-bf16-slice64K": ("3x1", {"FAIRRING_WIRE_DTYPE": "bf16", **SMALL_SLICES}),
    "2x1-bf16-nccl": ("2x1", {"FAIRRING_WIRE_DTYPE": "bf16", "FAIRRING_GPU_TRANSPORT": "nccl"}),
    "2x1-fp16-nccl": ("2x1", {"FAIRRING_WIRE_DTYPE": "fp16", "FAIRRING_GPU_TRANSPORT": "nccl"}),
    "3x1-fp16-slice64K-nccl": ("3x1",
                               {"FAIRRING_WIRE_DTYPE": "fp16", "FAIRRING_GPU_TRANSPORT": "nccl", **SMALL_SLICES}),
}
SESSIONS.update({name: (topo, env, ["wire"], {"sizes": WIRE_SIZES, "nodes": len(set(node_ids(topo)))})
                 for name, (topo, env) in WIRE.items()})

# 2x1, 1 MiB slices, 4 slots: the CPU engine needs about 2 MiB (6 with bf16
# rails), the CUDA engine about 6 MiB (10 with bf16 rails: the staged rail's
# wire buffers), so an 8 MiB budget fits all but the last.
SESSIONS.update({
    f"2x1-{fmt}-budget8M": ("2x1", {"FAIRRING_WIRE_DTYPE": fmt, "FAIRRING_TOTAL_MEMORY": "8M"},
                            ["memory_budget"], {"fits": fmt == "none"})
    for fmt in ("none", "bf16")})


def session(name):
    topo, extra_env, sections, cfg = SESSIONS[name]
    # Below gpu_check.sh's step caps (40-70 s): a hang fails the test,
    # with every rank's stacks, before the script gives up on the step.
    return launch.on(topo, rank_gpu_checks.session, args=(sections, cfg), env=extra_env, timeout_s=40,
                     pg_timeout_s=20, check=False)


def _section(name, section):
    res = session(name)
    bad = [r for r in res if not (r.ok and r.exitcode == 0)]
    assert not bad, launch.describe_all(res)
    out = [r.value[section] for r in res]
    for rank, o in enumerate(out):
        assert not o["failures"], f"rank {rank}: " + "\n".join(o["failures"])
    return out


def _skip_unless_gpus_for(name):
    topo, extra_env = SESSIONS[name][:2]
    nccl = extra_env.get("FAIRRING_GPU_TRANSPORT") == "nccl"
    if nccl and torch.cuda.device_count() < len(node_ids(topo)):
        pytest.skip(f"{name} needs one GPU per rank ({torch.cuda.device_count()} visible)")


def _same_digests_everywhere(out):
    first = out[0]["digests"]
    assert first, "no cases ran"
    for rank, o in enumerate(out[1:], 1):
        diff = [k for k in first if o["digests"].get(k) != first[k]]
        assert not diff, f"rank {rank} differs from rank 0 on {diff[:10]}"


@requires_gpu
@pytest.mark.parametrize("name", ["2x1-none-budget8M", "2x1-bf16-budget8M"])
def test_cuda_memory_budget_counts_the_wire_buffers(name):
    _section(name, "memory_budget")


@requires_gpu
@pytest.mark.parametrize("name", list(WIRE))
def test_compressed_rails_within_bound_and_identical(name):
    _skip_unless_gpus_for(name)
    _same_digests_everywhere(_section(name, "wire"))


def _with(section):
    """The sessions that run `section` (asking the others for it would fail
    with a KeyError, not a finding)."""
    return [n for n, t in SESSIONS.items() if section in t[2]]


@requires_gpu
@pytest.mark.parametrize("name", _with("correctness"))
def test_correct_and_bit_identical_across_ranks(name):
    _skip_unless_gpus_for(name)
    _same_digests_everywhere(_section(name, "correctness"))


@requires_gpu
@pytest.mark.parametrize("name", _with("half_range"))
def test_half_precision_avg_near_its_largest_value(name):
    """float16 AVG whose sums pass float16's largest value (reduce_op.h,
    avg_divisors), on the CUDA engine."""
    _skip_unless_gpus_for(name)
    _section(name, "half_range")


@requires_gpu
@pytest.mark.parametrize("name", _with("collectives"))
def test_reduce_scatter_all_gather_broadcast(name):
    _skip_unless_gpus_for(name)
    _section(name, "collectives")


@requires_gpu
@pytest.mark.parametrize("name", _with("exchanges"))
def test_all_to_all_gather_scatter(name):
    """The exchanges (RailPattern::kExchange) on CUDA: through peer memory on a
    node, the staged TCP rail's pinned memory or NCCL between nodes; three
    nodes need the staged rail's larger pinned area (exchange_staging_bytes)."""
    _skip_unless_gpus_for(name)
    _section(name, "exchanges")


@requires_gpu
@pytest.mark.parametrize("name", _with("p2p"))
def test_send_recv_of_cuda_tensors(name):
    """Sends and receives of CUDA tensors, staged through host memory on the
    CPU point-to-point engine (gloo's would read device memory as host memory)."""
    _section(name, "p2p")


@requires_gpu
@pytest.mark.parametrize("name", _with("issue_order"))
def test_overlapping_ops_take_effect_in_issue_order(name):
    """tests/test_op_order.py's patterns on CUDA tensors (the order rule on the
    CUDA engine: an op that must follow another starts after its done event)."""
    _skip_unless_gpus_for(name)
    _section(name, "issue_order")


@requires_gpu
@pytest.mark.parametrize("name", _with("streams"))
def test_stream_semantics(name):
    _skip_unless_gpus_for(name)
    _section(name, "streams")


@requires_gpu
@pytest.mark.parametrize("name", ["1x2", "2x2"])
def test_errors(name):
    _section(name, "errors")


@requires_gpu
@pytest.mark.parametrize("name", ["1x2", "2x2"])
def test_ddp_matches_gloo(name):
    out = _section(name, "ddp")
    assert len({o["digest"] for o in out}) == 1, "DDP replicas diverged"


@requires_gpu
def test_nccl_with_a_shared_gpu_is_a_clear_error():
    res = launch.run_ranks(rank_gpu_checks.session, node_ids("2x1"), args=(["nccl_shared_gpu"], {}),
                           env={"FAIRRING_GPU_TRANSPORT": "nccl", "CUDA_VISIBLE_DEVICES": "0"},
                           timeout_s=40, pg_timeout_s=20, check=False)
    bad = [r for r in res if not (r.ok and r.exitcode == 0)]
    assert not bad, launch.describe_all(res)
    for rank, r in enumerate(res):
        assert not r.value["nccl_shared_gpu"]["failures"], f"rank {rank}: {r.value['nccl_shared_gpu']['failures']}"


@requires_gpu
@pytest.mark.parametrize("name", ["1x2-slice256K", "2x2-slice256K"])
def test_many_slices_of_several_chunks(name):
    out = _section(name, "big_slices")
    assert out[0]["digests"], "no cases ran"
    assert all(o["digests"] == out[0]["digests"] for o in out), "ranks differ"


@requires_gpu
@pytest.mark.parametrize("name", ["1x2-slice256K", "2x2-slice256K"])
def test_launch_after_polling_is_completed(name):
    out = _section(name, "poll_then_launch")
    assert all(o["not_ready_polls"] > 0 for o in out)


@requires_gpu
@pytest.mark.parametrize("name", ["1x2-slice256K", "2x2-slice256K"])
def test_slow_producer_on_a_side_stream(name):
    _section(name, "slow_producer")


@requires_gpu
@pytest.mark.parametrize("name", ["1x2-slice256K", "2x2-slice256K"])
def test_groups_created_and_destroyed_three_times_exit_cleanly(name):
    _section(name, "group_cycles")  # also: every rank exited 0, in time (not hung at exit)


# The watchdog (one GPU serves both ranks).  Short group timeouts: the stall
# is 3x the timeout, the test's limit covers it and the teardown.
@requires_gpu
def test_watchdog_fails_stalled_device_work_naming_the_op():
    timeout_s = 3
    res = launch.run_ranks(rank_gpu_checks.device_stall, node_ids("1x2"), args=(timeout_s,), timeout_s=30,
                           pg_timeout_s=timeout_s, check=False)
    bad = [r for r in res if not (r.ok and r.exitcode == 0)]
    assert not bad, launch.describe_all(res)
    for r in res:
        assert not r.value["failures"], f"rank {r.rank}: " + "\n".join(r.value["failures"])


@requires_gpu
def test_local_peer_killed_with_device_work_queued():
    timeout_s = 3
    res = launch.run_ranks(rank_gpu_checks.peer_killed_with_work_queued, node_ids("1x2"), args=(timeout_s,),
                           timeout_s=30, pg_timeout_s=timeout_s, check=False)
    victim, survivor = res[1], res[0]
    assert victim.exitcode == -9, launch.describe_all(res)
    assert survivor.ok and survivor.exitcode == 0, launch.describe_all(res)
    assert not survivor.value["failures"], "\n".join(survivor.value["failures"])
