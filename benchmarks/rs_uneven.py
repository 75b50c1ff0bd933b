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

import torch
import torch.distributed as dist
from torchrun_common import init, slowest_median

r, w, gloo = init()
mb = float(os.environ.get("MB", "25"))
base = int(mb * 1024 * 1024) // 4 // w
sizes = [base + (j % 3 - 1) * 1000 for j in range(w)]
blocks = list(torch.randn(sum(sizes), generator=torch.Generator().manual_seed(r)).split(sizes))
outs = {"fairring": torch.empty(sizes[r]), "gloo": torch.empty(sizes[r])}
res = {}
for name, g in (("fairring", None), ("gloo", gloo)):
    res[name] = slowest_median(lambda: dist.reduce_scatter(outs[name], blocks, group=g), gloo)
assert torch.allclose(outs["fairring"], outs["gloo"], rtol=1e-5, atol=1e-5), "fairring and gloo disagree"
if r == 0:
    print(f"{mb:g} MiB/rank reduce_scatter, blocks of {sizes} elements, {w} ranks: fairring "
          f"{res['fairring'] * 1e3:.2f} ms, gloo {res['gloo'] * 1e3:.2f} ms, {res['gloo'] / res['fairring']:.2f}x "
          f"(results agree)")
dist.destroy_process_group()
