"""How many file descriptors a process group adds to each rank: a Fairring
or a gloo group (BACKEND, default fairring) of every rank, after its first
all-reduce (every connection it makes at creation or on first use), counted
in /proc/self/fd.  One backend per run, so that one group's closing sockets
do not blur the other's count.

    BACKEND=fairring K=1 torchrun --nproc_per_node=16 benchmarks/group_fds.py   # 16 simulated nodes of 1 rank
    BACKEND=gloo K=1 torchrun --nproc_per_node=16 benchmarks/group_fds.py
"""
import os

import torch
import torch.distributed as dist
from torchrun_common import init

r, w, gloo_world = init()
backend = os.environ.get("BACKEND", "fairring")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


dist.barrier(group=gloo_world)
before = open_fds()
g = dist.new_group(list(range(w)), backend=backend)
x = torch.ones(4)
dist.all_reduce(x, group=g)
assert x[0].item() == w
dist.barrier(group=gloo_world)
added = torch.tensor([float(open_fds() - before)])
lo, hi = added.clone(), added.clone()
dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=gloo_world)
dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=gloo_world)
if r == 0:
    k = os.environ.get("K", str(w))
    print(f"{backend}: file descriptors a group adds per rank, {w} ranks ({k} per node): {lo.item():.0f}-{hi.item():.0f}")
dist.destroy_process_group()
