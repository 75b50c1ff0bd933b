"""What the torchrun scripts in this folder share: simulated nodes, the
groups, and the timing (each script imports it as `torchrun_common`: torchrun
puts the script's folder on sys.path)."""
import os
import statistics
import time

import torch
import torch.distributed as dist

import fairring_py  # noqa: F401  registers "fairring"


def init():
    """The Fairring default group, with `K=<ranks per node>` making simulated
    nodes of K ranks (FAIRRING_NODE_ID), and a gloo group on the same ranks.
    Returns (rank, world size, gloo group)."""
    if os.environ.get("K"):
        os.environ["FAIRRING_NODE_ID"] = str(int(os.environ["RANK"]) // int(os.environ["K"]))
    dist.init_process_group("fairring")
    return dist.get_rank(), dist.get_world_size(), dist.new_group(backend="gloo")


def slowest(seconds: float, gloo) -> float:
    """The largest of every rank's `seconds`."""
    t = torch.tensor([seconds])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    return t.item()


def slowest_median(fn, gloo, ops=10, warmup=2, barrier_group=None) -> float:
    """Seconds per call of `fn`: the median of `ops` calls after `warmup`,
    each after a barrier on `barrier_group` (default: `gloo`), slowest rank."""
    ts = []
    for _ in range(warmup + ops):
        dist.barrier(group=gloo if barrier_group is None else barrier_group)
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return slowest(statistics.median(ts[warmup:]), gloo)
