"""One-way send/recv into a new receive tensor each time, as a pipeline stage
receives its activations: rank 0 sends 25 MiB, rank 1 receives it into a fresh
``torch.empty``; prints rank 1's time per receive and their median.

    torchrun --nproc_per_node=2 benchmarks/p2p_oneway.py          # fairring
    BACKEND=gloo torchrun --nproc_per_node=2 benchmarks/p2p_oneway.py
    FRESH=0 ...      # the same receive tensor every time
    MB=4 ITERS=50 ...

Each receive starts after a barrier, so both ranks start together.  Where the
memory a fresh tensor gets is new to the machine, its first touch is part of
the time: see docs/BENCHMARKS_HISTORY.md, "One record per op ... fresh
receive buffers", and benchmarks/touch_memory.py.
"""
import os
import statistics
import time

import torch
import torch.distributed as dist

import fairring_py  # noqa: F401  (registers the backend)


def main():
    backend = os.environ.get("BACKEND", "fairring")
    dist.init_process_group(backend)
    rank = dist.get_rank()
    n = int(float(os.environ.get("MB", "25")) * (1 << 20)) // 4
    fresh = os.environ.get("FRESH", "1") == "1"
    src = torch.randn(n)
    kept = None if fresh else torch.empty(n)
    times = []
    for _ in range(int(os.environ.get("ITERS", "30"))):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(src, 1)
        elif rank == 1:
            dist.recv(torch.empty(n) if fresh else kept, 0)
        times.append((time.perf_counter() - t0) * 1000)
    dist.barrier()
    if rank == 1:
        print(f"{backend}, {'fresh' if fresh else 'reused'} receive tensor, {n * 4 / (1 << 20):g} MiB: "
              f"ms per receive {[round(t, 1) for t in times]}")
        print(f"median {statistics.median(times):.2f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
