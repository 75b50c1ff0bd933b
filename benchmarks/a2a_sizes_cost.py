"""What the sizes exchange of an all-to-all with splits costs: Fairring's
all_to_all_single of equal blocks without splits (the blockwise path) and
with equal splits given (the sizes shared first, then the same blocks).

    torchrun --nproc_per_node=2 benchmarks/a2a_sizes_cost.py        # 1 node x 2
    K=2 torchrun --nproc_per_node=4 benchmarks/a2a_sizes_cost.py    # 2 simulated nodes x 2

Time: the median of 7 rounds of 200 ops (30 from 1 MiB), each round after a
barrier, slowest rank.
"""
import time

import torch
import torch.distributed as dist
from torchrun_common import init

r, w, gloo = init()
for size in (4096, 65536, 655360, 4 << 20):
    n = size // 4
    x = torch.randn(n)
    y = torch.empty(n)
    sp = [n // w] * w
    res = {}
    for name, kw in (("nosplits", {}), ("splits", dict(output_split_sizes=sp, input_split_sizes=sp))):
        for _ in range(20):
            dist.all_to_all_single(y, x, **kw)
        ts = []
        for _ in range(7):
            dist.barrier()
            k = 200 if size < 1 << 20 else 30
            t0 = time.perf_counter()
            for _ in range(k):
                dist.all_to_all_single(y, x, **kw)
            ts.append((time.perf_counter() - t0) / k)
        t = torch.tensor([sorted(ts)[3]])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        res[name] = t.item()
    if r == 0:
        print(f"{size} B: no splits {res['nosplits'] * 1e6:.1f} us, equal splits (sizes first) "
              f"{res['splits'] * 1e6:.1f} us, +{(res['splits'] / res['nosplits'] - 1) * 100:.0f}%", flush=True)
dist.destroy_process_group()
