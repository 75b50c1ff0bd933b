"""Sparse all-reduce (nn.Embedding(sparse=True) gradients), Fairring's native
one (csrc/backend/sparse_all_reduce.cpp) against gloo's, in the same
processes; results compared.

    torchrun --nproc_per_node=2 benchmarks/sparse_allreduce.py
    K=2 torchrun --nproc_per_node=4 benchmarks/sparse_allreduce.py     # 2 simulated nodes x 2
    ROWS=100000 DIM=128 BATCH=4096 torchrun --nproc_per_node=2 benchmarks/sparse_allreduce.py

Each rank's gradient is that of an embedding table of ROWS x DIM float32 looked
up at BATCH x 32 random rows (uncoalesced, as autograd makes it).  Timed, the
median of 10 ops after 2 warm-ups, each after a barrier, slowest rank:

- gloo:      all_reduce of the sparse gradient on a gloo group;
- fairring:  the same on the Fairring group;
- merge:     the computation in gloo's op, run locally on the same data:
             coalescing this rank's gradient, then summing the ranks'
             gradients as sparse tensors and coalescing the sum (what no
             transport can speed up; Fairring merges with one coalesce);
- gather:    a Fairring all_gather of the bytes the native op moves (the
             largest rank's coalesced indices and values, one op).

The results of the two groups are compared (equal within float rounding:
the merges add duplicates in different orders).
"""
import os

import torch
import torch.distributed as dist
from torchrun_common import init, slowest_median

r, w, gloo = init()
rows = int(os.environ.get("ROWS", "1000000"))
dim = int(os.environ.get("DIM", "64"))
batch = int(os.environ.get("BATCH", "2048"))


def grad_of(rank):
    g = torch.Generator().manual_seed(1000 + rank)
    idx = torch.randint(0, rows, (batch * 32,), generator=g)
    vals = torch.randn(idx.numel(), dim, generator=g)
    return torch.sparse_coo_tensor(idx.unsqueeze(0), vals, (rows, dim))  # uncoalesced


grads = [grad_of(q) for q in range(w)]
mine = grads[r]


def timed(fn):
    return slowest_median(fn, gloo)


results = {}


def reduce_on(group, name):
    def run():
        t = mine.clone()
        dist.all_reduce(t, group=group)
        results[name] = t
    return run


def merge():
    mine.coalesce()
    out = grads[0].coalesce()
    for g in grads[1:]:
        out = out + g.coalesce()
    return out.coalesce()


coalesced = [g.coalesce() for g in grads]
most = max(c._nnz() for c in coalesced)
send = torch.zeros(most * (dim + 1))
recv = torch.empty(most * (dim + 1) * w)


def gather():
    dist.all_gather_into_tensor(recv, send)


t_gloo = timed(reduce_on(gloo, "gloo"))
t_fr = timed(reduce_on(None, "fairring"))
t_merge = timed(merge)
t_gather = timed(gather)
a, b = results["gloo"].coalesce(), results["fairring"].coalesce()
assert torch.equal(a.indices(), b.indices()) and torch.allclose(a.values(), b.values(), rtol=1e-5, atol=1e-5), \
    "fairring and gloo disagree"
if r == 0:
    nnz = sum(c._nnz() for c in coalesced)
    print(f"sparse all_reduce, {w} ranks, table {rows} x {dim} float32, {batch * 32} lookups per rank "
          f"({most} distinct rows at most, {most * (dim + 1) * 4 / 2**20:.2f} MiB of indices+values): "
          f"fairring {t_fr * 1e3:.2f} ms, gloo {t_gloo * 1e3:.2f} ms: {t_gloo / t_fr:.2f}x; gloo's merge "
          f"{t_merge * 1e3:.2f} ms ({t_merge / t_gloo:.0%} of gloo's op), the bytes alone {t_gather * 1e3:.2f} ms "
          f"(results agree; {nnz} rows summed)")
dist.destroy_process_group()
