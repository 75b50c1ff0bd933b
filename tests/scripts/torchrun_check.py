"""Run under torchrun: env:// init of a fairring group, an all_reduce check and
a subgroup check.  Prints one FAIRRING_TORCHRUN_OK line per rank on success."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist

import fairring_py  # noqa: F401  registers the "fairring" backend


def main():
    dist.init_process_group("fairring", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == int(os.environ["WORLD_SIZE"]), (world, os.environ["WORLD_SIZE"])

    # all_reduce on the default group, small and large, float and int
    for n in (1, 1031, 1_000_003):
        t = torch.arange(n, dtype=torch.float32) % 1000 * (rank + 1)
        dist.all_reduce(t)
        exp = torch.arange(n, dtype=torch.float32) % 1000 * sum(range(1, world + 1))
        assert torch.equal(t, exp), f"rank {rank}: wrong float sum for n={n}"
    t = torch.full((4099,), 1 << rank, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.BOR)
    assert torch.all(t == (1 << world) - 1), f"rank {rank}: wrong BOR"
    t = torch.full((77,), float(rank))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()
    assert torch.all(t == world - 1)

    # subgroups: even ranks, and everyone but rank 0
    even = [r for r in range(world) if r % 2 == 0]
    rest = list(range(1, world))
    g_even = dist.new_group(even, backend="fairring")
    g_rest = dist.new_group(rest, backend="fairring")
    if rank in even:
        t = torch.full((65537,), float(rank + 1))
        dist.all_reduce(t, group=g_even)
        assert torch.all(t == sum(r + 1 for r in even)), f"rank {rank}: wrong even-group sum"
    if rank in rest:
        t = torch.full((1031,), rank, dtype=torch.int32)
        dist.all_reduce(t, group=g_rest)
        assert torch.all(t == sum(rest)), f"rank {rank}: wrong rest-group sum"

    addr = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).listen_address()
    dist.barrier()
    print(f"FAIRRING_TORCHRUN_OK rank={rank} world={world} local_rank={os.environ['LOCAL_RANK']} "
          f"listen={addr!r}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
