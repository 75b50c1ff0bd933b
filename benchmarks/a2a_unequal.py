"""all_to_all_single with unequal splits, Fairring (the sizes shared, then
the hierarchical all-to-all) against gloo, in the same processes; results
compared.

    torchrun --nproc_per_node=2 benchmarks/a2a_unequal.py          # 1 node x 2
    K=2 torchrun --nproc_per_node=4 benchmarks/a2a_unequal.py      # 2 simulated nodes x 2
    MB=1 torchrun --nproc_per_node=2 benchmarks/a2a_unequal.py     # 1 MiB per rank
    SKEW=1 torchrun --nproc_per_node=2 benchmarks/a2a_unequal.py   # blocks 1/3x to 5/3x

Rank r sends rank d about MB/world MiB, give or take 1000 elements
((r + d) % 3 - 1 thousand), so every split differs; with SKEW=1 the blocks
differ as a mixture-of-experts router's do: (1 + (3r + d) % 5) / 3 of the
average.  Time: the median of 10
ops (after 2 warm-up), each after a barrier, slowest rank.
"""
import os

import torch
import torch.distributed as dist
from torchrun_common import init, slowest_median

r, w, gloo = init()
mb = int(os.environ.get("MB", "25"))
base = mb * 1024 * 1024 // 4 // w
if os.environ.get("SKEW") == "1":
    def n(s, d):
        return base * (1 + (3 * s + d) % 5) // 3
else:
    def n(s, d):
        return base + (s + d) % 3 * 1000 - 1000
send = [n(r, d) for d in range(w)]
recv = [n(s, r) for s in range(w)]
x = torch.randn(sum(send))
outs = {"fairring": torch.empty(sum(recv)), "gloo": torch.empty(sum(recv))}
res = {}
for name, g in (("fairring", None), ("gloo", gloo)):
    res[name] = slowest_median(lambda: dist.all_to_all_single(outs[name], x, recv, send, group=g), gloo,
                               barrier_group=dist.group.WORLD)
assert torch.equal(outs["fairring"], outs["gloo"]), "fairring and gloo disagree"
if r == 0:
    print(f"{mb} MiB/rank{' skewed' if os.environ.get('SKEW') == '1' else ''} unequal all_to_all_single, {w} ranks: fairring {res['fairring'] * 1e3:.2f} ms, "
          f"gloo {res['gloo'] * 1e3:.2f} ms, {res['gloo'] / res['fairring']:.2f}x (results equal)")
dist.destroy_process_group()
