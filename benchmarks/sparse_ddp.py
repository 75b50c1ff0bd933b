"""DDP with a sparse embedding (nn.EmbeddingBag(sparse=True), its gradient
all-reduced as a sparse tensor every step) on Fairring and on gloo, in the
same processes: step time and whether both trained the same.

    torchrun --nproc_per_node=2 benchmarks/sparse_ddp.py
    K=2 torchrun --nproc_per_node=4 benchmarks/sparse_ddp.py     # 2 simulated nodes x 2

The model: an embedding table of ROWS x DIM looked up in bags of 8 (BATCH
bags per rank per step), then two dense layers.  Time: the median step of
STEPS after 3 warm-up steps, each after a barrier, slowest rank; the two runs
alternate step by step.
"""
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torchrun_common import init, slowest

r, w, gloo = init()
rows = int(os.environ.get("ROWS", "200000"))
dim = int(os.environ.get("DIM", "64"))
batch = int(os.environ.get("BATCH", "8192"))
steps = int(os.environ.get("STEPS", "10"))


def model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"emb": torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True),
                                "mlp": torch.nn.Sequential(torch.nn.Linear(dim, 256), torch.nn.ReLU(),
                                                           torch.nn.Linear(256, 1))})


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.m = model()

    def forward(self, idx):
        return self.m["mlp"](self.m["emb"](idx)).squeeze(1)


runs = {}
for name, group in (("fairring", None), ("gloo", gloo)):
    net = DDP(Net(), process_group=group)
    runs[name] = (net, torch.optim.SGD(net.parameters(), lr=0.01), [])
for step in range(3 + steps):
    g = torch.Generator().manual_seed(step * 1000 + r)
    idx = torch.randint(0, rows, (batch, 8), generator=g)
    y = torch.randn(batch, generator=g)
    for name in (("fairring", "gloo") if step % 2 == 0 else ("gloo", "fairring")):
        net, opt, ts = runs[name]
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(idx), y).backward()
        opt.step()
        if step >= 3:
            ts.append(time.perf_counter() - t0)
res = {}
for name, (net, _, ts) in runs.items():
    res[name] = slowest(statistics.median(ts), gloo)
a = runs["fairring"][0].module.m["emb"].weight
b = runs["gloo"][0].module.m["emb"].weight
diff = (a - b).abs().max().item()
if r == 0:
    print(f"DDP, sparse embedding {rows} x {dim} float32 (bags of 8, {batch} per rank), {w} ranks: step fairring "
          f"{res['fairring'] * 1e3:.2f} ms, gloo {res['gloo'] * 1e3:.2f} ms, {res['gloo'] / res['fairring']:.2f}x; "
          f"embedding weights differ by at most {diff:.2e} after {3 + steps} steps")
dist.destroy_process_group()
