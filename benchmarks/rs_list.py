"""reduce_scatter's list form (`dist.reduce_scatter(out, [block per rank])`)
against its tensor form (`reduce_scatter_tensor`) on the same bytes, and
against gloo's list form, in the same processes, each sample into a freshly
allocated output (as a training step allocates it); results compared.

    torchrun --nproc_per_node=2 benchmarks/rs_list.py            # 1 node x 2
    K=2 torchrun --nproc_per_node=4 benchmarks/rs_list.py        # 2 simulated nodes x 2
    MB=4,8,16 ROUNDS=5 torchrun --nproc_per_node=2 benchmarks/rs_list.py

MB: each rank's input in MiB (the list's blocks together).  Each round
times the three, interleaved, the median of 10 ops (after 2 warm-up) each
after a barrier, slowest rank; ROUNDS rounds per size.
"""
import os

import torch
import torch.distributed as dist
from torchrun_common import init, slowest_median

r, w, gloo = init()
rounds = int(os.environ.get("ROUNDS", "5"))
for mb in [float(m) for m in os.environ.get("MB", "4,8,16").split(",")]:
    n = int(mb * 1024 * 1024) // 4 // w
    flat = torch.randn(n * w, generator=torch.Generator().manual_seed(r))
    blocks = list(flat.split(n))
    last = {}
    runs = {
        "list": lambda: last.__setitem__("list", _rs_list(None)),
        "tensor": lambda: last.__setitem__("tensor", _rs_tensor()),
        "gloo": lambda: last.__setitem__("gloo", _rs_list(gloo)),
    }

    def _rs_list(group):
        out = torch.empty(n)
        dist.reduce_scatter(out, blocks, group=group)
        return out

    def _rs_tensor():
        out = torch.empty(n)
        dist.reduce_scatter_tensor(out, flat)
        return out

    for k in range(rounds):
        t = {name: slowest_median(fn, gloo) for name, fn in runs.items()}
        assert torch.allclose(last["list"], last["gloo"], rtol=1e-5, atol=1e-5), "list form and gloo disagree"
        assert torch.equal(last["list"], last["tensor"]), "list and tensor forms disagree"
        if r == 0:
            print(f"{mb:g} MiB/rank, {w} ranks, round {k}: list {t['list'] * 1e3:.2f} ms, tensor "
                  f"{t['tensor'] * 1e3:.2f} ms, gloo {t['gloo'] * 1e3:.2f} ms; list/tensor "
                  f"{t['list'] / t['tensor']:.2f}, gloo/list {t['gloo'] / t['list']:.2f}x", flush=True)
dist.destroy_process_group()
