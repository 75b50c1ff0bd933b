"""How long creating a process group takes: a Fairring group against a gloo
group of the same ranks, created in turn in the same processes.

    torchrun --nproc_per_node=8 benchmarks/group_creation.py          # 1 node of 8 ranks
    K=1 torchrun --nproc_per_node=8 benchmarks/group_creation.py      # 8 simulated nodes of 1 rank
    K=2 torchrun --nproc_per_node=16 benchmarks/group_creation.py     # 8 simulated nodes x 2

Each round creates one group of each backend over every rank (`new_group`)
and runs one small all-reduce on it (a group is only of use once its first op
can run; for gloo that op finds its connections made, for Fairring too), then
destroys it.  Time: from the call to the end of that first op, slowest rank,
median of ROUNDS (default 5) rounds after one warm-up.  Run it with another
build's package first on PYTHONPATH to time that build the same way.
"""
import os
import statistics
import time

import torch
import torch.distributed as dist
from torchrun_common import init, slowest

r, w, gloo_world = init()
rounds = int(os.environ.get("ROUNDS", "5"))
ranks = list(range(w))
times = {"fairring": [], "gloo": []}
for i in range(rounds + 1):
    for backend in ("fairring", "gloo") if i % 2 == 0 else ("gloo", "fairring"):
        dist.barrier(group=gloo_world)
        t0 = time.perf_counter()
        g = dist.new_group(ranks, backend=backend)
        x = torch.ones(4)
        dist.all_reduce(x, group=g)
        took = slowest(time.perf_counter() - t0, gloo_world)
        assert x[0].item() == w
        dist.destroy_process_group(g)
        if i > 0:
            times[backend].append(took)
if r == 0:
    f, g = statistics.median(times["fairring"]), statistics.median(times["gloo"])
    k = os.environ.get("K", str(w))
    print(f"group creation + first all-reduce, {w} ranks ({k} per node): fairring {f * 1e3:.1f} ms "
          f"({min(times['fairring']) * 1e3:.1f}-{max(times['fairring']) * 1e3:.1f}), gloo {g * 1e3:.1f} ms "
          f"({min(times['gloo']) * 1e3:.1f}-{max(times['gloo']) * 1e3:.1f}); fairring/gloo {f / g:.2f}")
dist.destroy_process_group()
