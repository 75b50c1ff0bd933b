"""Sharded training end to end inside the ranks (spawned by test_sharded_training.py):
FSDP2 (fully_shard on a DeviceMesh over the group), FSDP1 and
ZeroRedundancyOptimizer (with DDP), each trained a few steps twice from the same
seed, once over the default Fairring group and once over a gloo group, on the
same batches.  Returns per-variant losses, the largest relative differences
between the two runs, and which kinds the Fairring group ran (dump_recent)."""
from __future__ import annotations

import collections
import io
import traceback

import torch
import torch.distributed as dist

from fairring_py.bench import fsdp as fsdp_bench

STEPS = 4
WIDTH, DEPTH, SEQ, BATCH = 64, 2, 8, 4


def _model():
    torch.manual_seed(2024)
    layer = torch.nn.TransformerEncoderLayer(d_model=WIDTH, nhead=2, dim_feedforward=2 * WIDTH, dropout=0.0,
                                             batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=DEPTH, enable_nested_tensor=False)


def _batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, SEQ, WIDTH, generator=g), torch.randn(BATCH, SEQ, WIDTH, generator=g)


def _train(variant, group, rank):
    """Returns (losses, this rank's parameters flattened, initial ones)."""
    if variant in ("fsdp2", "fsdp1"):
        model = fsdp_bench.shard(variant, _model(), group, torch.device("cpu"))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    elif variant == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(_model(), process_group=group)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, process_group=group,
                                      lr=1e-3)
    else:
        raise ValueError(variant)
    before = fsdp_bench.local_shards(model).clone()
    losses = []
    for step in range(STEPS):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, fsdp_bench.local_shards(model), before


def _rel(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.numel() == 0:
        return 0.0
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def session(rank, world, variants):
    import fairring_py

    gloo = dist.new_group(backend="gloo")
    out = {}
    for variant in variants:
        try:
            seq0 = fairring_py.dump_recent(file=io.StringIO())[-1]["seq"] if fairring_py.dump_recent(
                file=io.StringIO()) else -1
            lf, pf, p0 = _train(variant, dist.group.WORLD, rank)
            kinds = collections.Counter(r["kind"] for r in fairring_py.dump_recent(file=io.StringIO())
                                        if r["seq"] > seq0)
            lg, pg, _ = _train(variant, gloo, rank)
            out[variant] = {
                "losses_fairring": lf, "losses_gloo": lg,
                "loss_rel": max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(lf, lg)),
                "param_rel": _rel(pf, pg),
                "changed": _rel(pf, p0) if p0.numel() else None,
                "finite": bool(torch.isfinite(pf).all()),
                "full_params": pf.tolist() if variant == "zero" else None,
                "kinds": dict(kinds),
            }
        except Exception as e:  # noqa: BLE001
            out[variant] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
    return out
