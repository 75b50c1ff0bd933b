"""all_gather with a list of blocks of unequal sizes (rank r's input the size
of output r): Fairring against what a gloo user has to do (gloo refuses the
uneven list: pad every input to the largest, all_gather the padded blocks,
narrow each), in the same processes; results compared exactly.

    torchrun --nproc_per_node=2 benchmarks/ag_uneven.py          # 1 node x 2
    K=2 torchrun --nproc_per_node=4 benchmarks/ag_uneven.py      # 2 simulated nodes x 2
    MB=1 torchrun --nproc_per_node=2 benchmarks/ag_uneven.py     # 1 MiB per rank
    LARGE=1 torchrun --nproc_per_node=2 benchmarks/ag_uneven.py  # rank 0's block 4x the others'

MB is each rank's whole output; block r has about MB/world MiB, (r % 3 - 1) x
1000 elements off (LARGE=1: rank 0's block is four times the others').
FRESH=1 allocates the outputs anew for every op.  Time: the median of 10 ops
(after 2 warm-up), each after a barrier, slowest rank.
"""
import os

import torch
import torch.distributed as dist
from torchrun_common import init, slowest_median

r, w, gloo = init()
mb = float(os.environ.get("MB", "25"))
fresh = os.environ.get("FRESH") == "1"
if os.environ.get("LARGE") == "1":
    unit = int(mb * 1024 * 1024) // 4 // (w + 3)
    sizes = [4 * unit if j == 0 else unit for j in range(w)]
else:
    base = int(mb * 1024 * 1024) // 4 // w
    sizes = [base + (j % 3 - 1) * 1000 for j in range(w)]
mine = torch.randn(sizes[r], generator=torch.Generator().manual_seed(r))
largest = max(sizes)
outs = {"fairring": [torch.empty(n) for n in sizes], "gloo": [torch.empty(n) for n in sizes]}


def fairring_op():
    out = [torch.empty(n) for n in sizes] if fresh else outs["fairring"]
    dist.all_gather(out, mine)
    outs["fairring"] = out


def gloo_op():
    padded = torch.zeros(largest)
    padded[: sizes[r]] = mine
    blocks = [torch.empty(largest) for _ in range(w)]
    dist.all_gather(blocks, padded, group=gloo)
    out = [torch.empty(n) for n in sizes] if fresh else outs["gloo"]
    for o, b, n in zip(out, blocks, sizes):
        o.copy_(b[:n])
    outs["gloo"] = out


res = {"fairring": slowest_median(fairring_op, gloo), "gloo": slowest_median(gloo_op, gloo)}
for j in range(w):
    assert torch.equal(outs["fairring"][j], outs["gloo"][j]), f"block {j}: fairring and gloo disagree"
if r == 0:
    print(f"{mb:g} MiB/rank all_gather list, blocks of {sizes} elements, {w} ranks{', fresh outputs' if fresh else ''}: "
          f"fairring {res['fairring'] * 1e3:.2f} ms, gloo (padded) {res['gloo'] * 1e3:.2f} ms, "
          f"{res['gloo'] / res['fairring']:.2f}x (results agree)")
dist.destroy_process_group()
