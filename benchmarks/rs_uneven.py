"""reduce_scatter with a list of blocks of unequal sizes (rank r's output the
size of input r): Fairring (each block padded to the largest, then its
blockwise reduce-scatter) against gloo, in the same processes; results
compared.

    torchrun --nproc_per_node=2 benchmarks/rs_uneven.py          # 1 node x 2
    K=2 torchrun --nproc_per_node=4 benchmarks/rs_uneven.py      # 2 simulated nodes x 2
    MB=1 torchrun --nproc_per_node=2 benchmarks/rs_uneven.py     # 1 MiB per rank

Block r has about MB/world MiB, rank r's block (r % 3 - 1) x 1000 elements
off, so the blocks differ.  Time: the median of 10 ops (after 2 warm-up),
each after a barrier, slowest rank.
"""
import os
import statistics
import time

import torch
import torch.distributed as dist

import fairring_py  # noqa: F401  registers "fairring"

if os.environ.get("K"):  # simulated nodes of K ranks
    os.environ["FAIRRING_NODE_ID"] = str(int(os.environ["RANK"]) // int(os.environ["K"]))
dist.init_process_group("fairring")
r, w = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
mb = float(os.environ.get("MB", "25"))
base = int(mb * 1024 * 1024) // 4 // w
sizes = [base + (j % 3 - 1) * 1000 for j in range(w)]
blocks = list(torch.randn(sum(sizes), generator=torch.Generator().manual_seed(r)).split(sizes))
outs = {"fairring": torch.empty(sizes[r]), "gloo": torch.empty(sizes[r])}
res = {}
for name, g in (("fairring", None), ("gloo", gloo)):
    ts = []
    for _ in range(12):
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        dist.reduce_scatter(outs[name], blocks, group=g)
        ts.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(ts[2:])])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    res[name] = t.item()
assert torch.allclose(outs["fairring"], outs["gloo"], rtol=1e-5, atol=1e-5), "fairring and gloo disagree"
if r == 0:
    print(f"{mb:g} MiB/rank reduce_scatter, blocks of {sizes} elements, {w} ranks: fairring "
          f"{res['fairring'] * 1e3:.2f} ms, gloo {res['gloo'] * 1e3:.2f} ms, {res['gloo'] / res['fairring']:.2f}x "
          f"(results agree)")
dist.destroy_process_group()
