"""reduce_scatter with a list of blocks of unequal sizes (block r is rank r's
result): Fairring (through the hierarchy, each block as long as it is)
against gloo, in the same processes; results compared (float32 sums, to
rounding).

    torchrun --nproc_per_node=2 benchmarks/rs_uneven.py            # 1 node x 2
    K=2 torchrun --nproc_per_node=4 benchmarks/rs_uneven.py        # 2 simulated nodes x 2
    ONE=1 torchrun --nproc_per_node=2 benchmarks/rs_uneven.py      # one large block, the others 1000 elements

MB is the whole list's size; its blocks have about MB/world MiB each,
(r % 3 - 1) x 1000 elements off (ONE=1: block 0 holds nearly all of it).
FRESH=1 allocates the output anew for every op.  Time: the median of 10 ops
(after 2 warm-up), each after a barrier, slowest rank.  Run it with another
build's package first on PYTHONPATH to time that build the same way.
"""
import os

import torch
import torch.distributed as dist
from torchrun_common import init, slowest_median

r, w, gloo = init()
mb = float(os.environ.get("MB", "25"))
fresh = os.environ.get("FRESH") == "1"
total = int(mb * 1024 * 1024) // 4
if os.environ.get("ONE") == "1":
    sizes = [1000] * w
    sizes[0] = total - 1000 * (w - 1)
else:
    sizes = [total // w + (j % 3 - 1) * 1000 for j in range(w)]
whole = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(r))
blocks = list(whole.split(sizes))
outs = {"fairring": torch.empty(sizes[r]), "gloo": torch.empty(sizes[r])}


def fairring_op():
    out = torch.empty(sizes[r]) if fresh else outs["fairring"]
    dist.reduce_scatter(out, blocks)
    outs["fairring"] = out


def gloo_op():
    out = torch.empty(sizes[r]) if fresh else outs["gloo"]
    dist.reduce_scatter(out, blocks, group=gloo)
    outs["gloo"] = out


res = {"fairring": slowest_median(fairring_op, gloo), "gloo": slowest_median(gloo_op, gloo)}
assert torch.allclose(outs["fairring"], outs["gloo"], rtol=1e-5, atol=1e-5), "fairring and gloo disagree"
if r == 0:
    shown = sizes if len(set(sizes)) > 2 or w <= 4 else f"{sizes[0]}, then {sizes[1]} x {w - 1}"
    print(f"{mb:g} MiB reduce_scatter list, blocks of {shown} elements, {w} ranks"
          f"{', fresh outputs' if fresh else ''}: fairring {res['fairring'] * 1e3:.2f} ms, "
          f"gloo {res['gloo'] * 1e3:.2f} ms, {res['gloo'] / res['fairring']:.2f}x (results agree)")
dist.destroy_process_group()
