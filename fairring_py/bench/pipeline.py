"""Pipeline-parallel benchmark: samples/s of a small model split into one
stage per rank, trained with a 1F1B schedule over fairring vs gloo (nccl
with --device cuda), in the same processes, on a simulated cluster.

    python -m fairring_py.bench.pipeline                     # 2 nodes x 2 ranks = 4 stages, CPU
    python -m fairring_py.bench.pipeline --microbatches 16
    python -m fairring_py.bench.pipeline --netns --link-rate 1gbit    # root: namespaces

Each rank holds one stage (--depth Linear+GELU layers of --width) and runs
the 1F1B schedule Megatron and torch.distributed.pipelining use: warm-up
forwards, then one forward and one backward in turn, then the remaining
backwards.  Activations go to the next stage and their gradients back to
the previous one with isend (waited at the end of the step) and a
blocking recv, tag = the microbatch (gradients: microbatches + it), so
the step is bound by the sends and receives between neighbours.  The
last stage's loss is the mean squared error against a synthetic target.

Both backends train the same model (every stage from its rank's seed) on
the same batches, alternating which goes first at every step; a step is
timed between barriers as the slowest rank sees it; samples/s = the
batch (microbatches x microbatch size) / median step time.  Checks: the
last stage's losses of the two runs agree to --rtol relative.  A third
run over torch's "fake" group (sends and receives that move nothing)
times the compute alone, so "step minus compute only" is each backend's
communication per step.
A fourth, over a Fairring group whose exchanges move one element each
(bench/sync_only.py), keeps every wait of the step but moves no data: it
splits that communication into waiting and moving the bytes.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from . import launch, metrics, sync_only, training

SEED = 4242


class Stage(torch.nn.Module):
    def __init__(self, width: int, depth: int, rank: int):
        super().__init__()
        torch.manual_seed(SEED + 7919 * rank)
        self.layers = torch.nn.Sequential(*[m for _ in range(depth)
                                            for m in (torch.nn.Linear(width, width), torch.nn.GELU())])

    def forward(self, x):
        return self.layers(x)


def batch(cfg: dict, step: int, device):
    """Microbatches of inputs (stage 0) and targets (the last stage), alike on every rank."""
    g = torch.Generator().manual_seed(SEED + 1000003 * step)
    shape = (cfg["microbatches"], cfg["batch"], cfg["width"])
    return torch.randn(shape, generator=g).to(device), torch.randn(shape, generator=g).to(device)


def one_f_one_b(stage: Stage, group, rank: int, world: int, x, y, cfg: dict) -> float:
    """One training step's forwards and backwards; returns the loss (the last stage's, else 0)."""
    m, shape = cfg["microbatches"], (cfg["batch"], cfg["width"])
    prev, nxt = rank - 1, rank + 1
    kept, sends, total = {}, [], 0.0

    def forward(i):
        nonlocal total
        if rank == 0:
            inp = x[i]
        else:
            inp = torch.zeros(shape, device=x.device)  # (the compute-only group leaves it as it is)
            sync_only.recv(inp, prev, group=group, tag=i)
            inp.requires_grad_()
        out = stage(inp)
        if nxt == world:
            out = torch.nn.functional.mse_loss(out, y[i]) / m
            total += out.item()
        else:
            sends.append(sync_only.isend(out.detach(), nxt, group=group, tag=i))
        kept[i] = (inp, out)

    def backward(i):
        inp, out = kept.pop(i)
        if nxt == world:
            out.backward()
        else:
            grad = torch.zeros(shape, device=x.device)
            sync_only.recv(grad, nxt, group=group, tag=m + i)
            out.backward(grad)
        if rank > 0:
            sends.append(sync_only.isend(inp.grad, prev, group=group, tag=m + i))

    warm = min(world - rank - 1, m)
    f = b = 0
    for _ in range(warm):
        forward(f)
        f += 1
    while f < m:
        forward(f)
        f += 1
        backward(b)
        b += 1
    while b < m:
        backward(b)
        b += 1
    for w in sends:
        w.wait()
    return total


def rank_main(ranks: launch.Ranks, cfg: dict) -> int:
    dev = ranks.device
    names, groups = training.compared_groups(ranks, cfg)
    stages = [Stage(cfg["width"], cfg["depth"], ranks.rank).to(dev) for _ in groups]
    opts = [torch.optim.SGD(s.parameters(), lr=cfg["lr"]) for s in stages]
    seq0 = training.last_seq()
    times = [[] for _ in groups]
    losses = [[] for _ in groups]
    for step in range(cfg["warmup"] + cfg["steps"]):
        x, y = batch(cfg, step, dev)
        for j in range(len(groups)):
            i = (j + step) % len(groups)
            ranks.sync()
            ranks.barrier()
            t0 = time.perf_counter()
            opts[i].zero_grad(set_to_none=True)
            loss = one_f_one_b(stages[i], groups[i], ranks.rank, ranks.world, x, y, cfg)
            opts[i].step()
            ranks.sync()
            if step >= cfg["warmup"]:
                times[i].append(time.perf_counter() - t0)
            losses[i].append(loss)
    flat = ranks.max_over_ranks([t for ts in times for t in ts])
    n = cfg["steps"]
    times = [flat[i * n:(i + 1) * n] for i in range(len(groups))]
    kinds = training.fairring_kinds(seq0)
    loss_rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses[0], losses[1])) \
        if ranks.rank == ranks.world - 1 else 0.0
    (loss_rel,) = ranks.max_over_ranks([loss_rel])
    ok = loss_rel <= cfg["rtol"]
    samples = cfg["microbatches"] * cfg["batch"]
    rows = metrics.step_rows(names, times, samples, "samples_per_s")
    final = ranks.max_over_ranks([losses[0][-1], losses[1][-1]])  # the last stage's (others: 0)
    if ranks.rank == 0:
        summary = {
            "meta": launch.run_meta(
                ranks, cfg, model="pipeline", width=cfg["width"], depth=cfg["depth"], stages=ranks.world,
                microbatches=cfg["microbatches"], microbatch=cfg["batch"], steps=cfg["steps"],
                warmup=cfg["warmup"], baseline=names[1],
                activation_bytes=cfg["batch"] * cfg["width"] * 4),
            "rows": rows,
            "check": {"ok": ok, "loss_max_rel_diff": loss_rel, "rtol": cfg["rtol"],
                      "final_loss": dict(zip(names[:2], final))},
            "fairring_kinds": kinds,
            "sync_only_largest_op_bytes": sync_only.largest_op_bytes(groups),
        }
        launch.publish(summary, pipeline_table(summary), cfg.get("out"), "pipeline.json")
    return 0 if ok else 1


def pipeline_table(s: dict) -> str:
    m = s["meta"]
    heading = (f"pipeline parallel, 1F1B: {m['stages']} stages of {m['depth']} layers of width {m['width']}, "
               f"{m['microbatches']} microbatches of {m['microbatch']} samples (activations "
               f"{metrics.fmt_size(m['activation_bytes'])} per send), {m['world_size']} ranks, "
               f"fairring topology {m['fairring_topology']}")
    return "\n".join(training.throughput_table(s, heading, "samples/s", "samples_per_s", "the last stage's losses"))


def parser() -> argparse.ArgumentParser:
    # Defaults: on the 2-core test machine, 2 x 2, communication is about 40%
    # of gloo's step (docs/BENCHMARKS_HISTORY.md): neither a compute benchmark nor a
    # communication loop.
    p = training.parser("python -m fairring_py.bench.pipeline", __doc__, "pipeline.json", 64, "width", 4096,
                            10, 2)
    p.set_defaults(depth=1)
    p.add_argument("--microbatches", type=int, default=8, help="microbatches per step (default 8)")
    p.add_argument("--rtol", type=float, default=1e-5,
                   help="largest relative difference of the losses between the runs (default 1e-5)")
    p.add_argument("--no-compute-only", dest="compute_only", action="store_false",
                   help="skip the run over torch's fake group that times the step without communication")
    sync_only.add_option(p)
    return p


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    cfg = training.config(p, a, "pipeline")
    if a.microbatches < 1:
        p.error("--microbatches must be >= 1")
    if a.nodes * a.ranks_per_node < 2:
        p.error("a pipeline needs at least 2 ranks (stages)")
    cfg.update(microbatches=a.microbatches, rtol=a.rtol, compute_only=a.compute_only, sync_only=a.sync_only)
    return training.run(cfg, rank_main, a, "bench.pipeline")


if __name__ == "__main__":
    sys.exit(main())
