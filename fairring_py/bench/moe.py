"""Mixture-of-experts benchmark: tokens/s of a small expert-parallel model
trained over fairring vs gloo (nccl with --device cuda), in the same
processes, on a simulated cluster.

    python -m fairring_py.bench.moe                          # 2 nodes x 2 ranks, CPU
    python -m fairring_py.bench.moe --nodes 1 --ranks-per-node 2
    python -m fairring_py.bench.moe --netns --link-rate 1gbit    # root: namespaces
    python -m fairring_py.bench.moe --dropless               # every token routed: splits

Expert parallelism as GShard, Switch and DeepSpeed-MoE do it: every rank
holds one expert (an MLP) per layer and a replica of the gate; each layer
routes every token to its top-1 expert, packs the tokens into a
[world, capacity, width] dispatch tensor (capacity = capacity factor x
tokens / experts slots per expert; tokens past it skip the layer), sends
each expert its slots with ``all_to_all_single``, runs the expert, and
sends the results back with a second one; backward does the same two the
other way.  Token
counts per expert are uneven (the gate decides); the all-to-alls are of
equal blocks (the capacity slots).  With --dropless no token is dropped, as
in Megatron's and torchtitan's dropless layers: the tokens go sorted by
expert with ``all_to_all_single`` splits, after an all-to-all of the
counts.  The gate's gradients are all-reduced (averaged) like
data-parallel ones.

Each rank builds the same model (the gate from one seed, its expert from
its rank's) once per backend, and trains both on the same synthetic batches
with SGD, alternating which goes first at every step; a step is timed
between barriers as the slowest rank sees it; tokens/s = global tokens per
step / median step time.  Checks: the losses of the two runs agree to
--rtol relative on every rank and step.  A third run over torch's "fake"
group (collectives that move nothing) times the compute alone, so "step
minus compute only" is each backend's communication per step.
A fourth, over a Fairring group whose exchanges move one element each
(bench/sync_only.py), keeps every wait of the step but moves no data: it
splits that communication into waiting and moving the bytes.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

from . import launch, metrics, sync_only, training

SEED = 9876


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with its gradient: the same exchange back, the
    splits (rows per rank; None: equal blocks) swapped."""

    @staticmethod
    def forward(ctx, x, group, out_splits=None, in_splits=None):
        ctx.group, ctx.out_splits, ctx.in_splits = group, out_splits, in_splits
        return _exchange(x, group, out_splits, in_splits)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.group, ctx.in_splits, ctx.out_splits), None, None, None


def _exchange(x, group, out_splits, in_splits):
    # (the compute-only group leaves the zeros as they are)
    out = torch.zeros_like(x) if out_splits is None else x.new_zeros(sum(out_splits), *x.shape[1:])
    sync_only.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class MoELayer(torch.nn.Module):
    """A top-1 mixture-of-experts layer over ``group``, one expert per rank."""

    def __init__(self, width: int, hidden: int, world: int, capacity_factor: float, seed: int, rank: int,
                 dropless: bool = False):
        super().__init__()
        torch.manual_seed(seed)
        self.norm = torch.nn.LayerNorm(width)
        self.gate = torch.nn.Linear(width, world)
        torch.manual_seed(seed + 7919 * (rank + 1))
        self.w1 = torch.nn.Linear(width, hidden)
        self.w2 = torch.nn.Linear(hidden, width)
        self.world, self.capacity_factor, self.dropless = world, capacity_factor, dropless
        self.group = None

    def shared(self):
        """The parameters every rank holds alike (data-parallel)."""
        return list(self.norm.parameters()) + list(self.gate.parameters())

    def forward(self, x):
        if self.dropless:
            return self.forward_dropless(x)
        tokens, width = x.shape
        world = self.world
        capacity = max(1, math.ceil(self.capacity_factor * tokens / world))
        h = self.norm(x)
        prob = torch.softmax(self.gate(h), dim=-1)
        top_p, expert = prob.max(dim=-1)
        onehot = torch.nn.functional.one_hot(expert, world)
        slot = ((onehot.cumsum(0) - 1) * onehot).sum(-1)  # place in its expert's queue
        kept = torch.nonzero(slot < capacity).squeeze(1)
        e, s = expert[kept], slot[kept]
        dispatch = h.new_zeros(world, capacity, width).index_put((e, s), h[kept])
        received = _AllToAll.apply(dispatch.reshape(world * capacity, width), self.group)
        done = self.w2(torch.nn.functional.gelu(self.w1(received)))
        back = _AllToAll.apply(done, self.group).reshape(world, capacity, width)
        out = x.new_zeros(tokens, width).index_put((kept,), back[e, s] * top_p[kept].unsqueeze(1))
        return x + out

    def forward_dropless(self, x):
        """Every token to its expert, none dropped: the tokens sorted by
        expert, the counts exchanged (an all-to-all of one count per rank),
        then the tokens with splits (as Megatron's and torchtitan's dropless
        layers do), and back."""
        h = self.norm(x)
        prob = torch.softmax(self.gate(h), dim=-1)
        top_p, expert = prob.max(dim=-1)
        order = torch.argsort(expert, stable=True)
        counts = torch.bincount(expert, minlength=self.world)
        # (over the fake group this stays our own counts: the compute-only
        # run then has as many tokens per expert as on average)
        got = counts.clone()
        sync_only.all_to_all_single(got, counts, group=self.group)
        send, recv = counts.tolist(), got.tolist()
        received = _AllToAll.apply(h[order], self.group, recv, send)
        done = self.w2(torch.nn.functional.gelu(self.w1(received)))
        back = _AllToAll.apply(done, self.group, send, recv)
        out = x.new_zeros(x.shape).index_put((order,), back * top_p[order].unsqueeze(1))
        return x + out


class MoEModel(torch.nn.Module):
    def __init__(self, cfg: dict, world: int, rank: int, group):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            MoELayer(cfg["width"], cfg["hidden"], world, cfg["capacity_factor"], SEED + 101 * i, rank,
                     cfg.get("dropless", False))
            for i in range(cfg["depth"]))
        for m in self.layers:
            m.group = group
        self.group, self.world = group, world

    def forward(self, x):
        batch, seq, width = x.shape
        h = x.reshape(batch * seq, width)
        for m in self.layers:
            h = m(h)
        return h.reshape(batch, seq, width)

    def average_shared_grads(self):
        """The gate's and norms' gradients, averaged over the group (one
        all-reduce of them flattened, as DDP's bucket would)."""
        grads = [p.grad for m in self.layers for p in m.shared() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        sync_only.all_reduce(flat, group=self.group)
        flat /= self.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


class _Stepper(torch.optim.SGD):
    """SGD that first averages the model's shared gradients (so that
    training.timed_steps times the whole data-parallel step)."""

    def __init__(self, model: MoEModel, lr: float):
        super().__init__(model.parameters(), lr=lr)
        self.model = model

    def step(self, closure=None):
        self.model.average_shared_grads()
        return super().step(closure)


def rank_main(ranks: launch.Ranks, cfg: dict) -> int:
    dev = ranks.device
    names, groups = training.compared_groups(ranks, cfg)
    cfg = dict(cfg, model="transformer")  # batches of [batch, seq, width]
    replicas = [MoEModel(cfg, ranks.world, ranks.rank, g).to(dev) for g in groups]
    opts = [_Stepper(m, cfg["lr"]) for m in replicas]
    seq0 = training.last_seq()
    times, losses = training.timed_steps(ranks, cfg, replicas, opts, dev)
    kinds = training.fairring_kinds(seq0)
    loss_rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses[0], losses[1]))
    (loss_rel,) = ranks.max_over_ranks([loss_rel])
    ok = loss_rel <= cfg["rtol"] and all(torch.isfinite(torch.tensor(ls)).all() for ls in losses[:2])
    tokens = cfg["batch"] * cfg["seq"] * ranks.world
    rows = metrics.step_rows(names, times, tokens, "tokens_per_s")
    if ranks.rank == 0:
        params = sum(p.numel() for p in replicas[0].parameters())
        summary = {
            "meta": launch.run_meta(
                ranks, cfg, model="moe", width=cfg["width"], hidden=cfg["hidden"], depth=cfg["depth"],
                seq=cfg["seq"], params_per_rank=params, batch_per_rank=cfg["batch"],
                capacity_factor=cfg["capacity_factor"], dropless=cfg["dropless"], steps=cfg["steps"],
                warmup=cfg["warmup"],
                baseline=names[1]),
            "rows": rows,
            "check": {"ok": ok, "loss_max_rel_diff": loss_rel, "rtol": cfg["rtol"],
                      "final_loss": {nm: ls[-1] for nm, ls in zip(names[:2], losses)}},
            "fairring_kinds": kinds,
            "sync_only_largest_op_bytes": sync_only.largest_op_bytes(groups),
        }
        launch.publish(summary, moe_table(summary), cfg.get("out"), "moe.json")
    return 0 if ok else 1


def moe_table(s: dict) -> str:
    m = s["meta"]
    routing = "dropless (splits)" if m.get("dropless") else f"capacity factor {m['capacity_factor']:g}"
    heading = (f"MoE, top-1 expert parallel ({m['depth']} layers, width {m['width']}, expert hidden {m['hidden']}, "
               f"{routing}; {m['params_per_rank'] / 1e6:.2f} M params per rank), "
               f"{m['batch_per_rank']} x {m['seq']} tokens/rank, {m['world_size']} ranks, "
               f"fairring topology {m['fairring_topology']}")
    return "\n".join(training.throughput_table(s, heading, "tokens/s", "tokens_per_s"))


def parser() -> argparse.ArgumentParser:
    p = training.parser("python -m fairring_py.bench.moe", __doc__, "moe.json", 256, "d_model", 16, 10, 2)
    # Default sizes: on the 2-core test machine, 2 x 2, communication is about
    # 45-50% of gloo's step (docs/BENCHMARKS_HISTORY.md).
    p.add_argument("--hidden", type=int, default=128, help="each expert's hidden size (default 128)")
    p.add_argument("--capacity-factor", type=float, default=1.25,
                   help="slots per expert = factor x tokens / experts (default 1.25)")
    p.add_argument("--dropless", action="store_true",
                   help="route every token (no capacity): the all-to-alls carry uneven splits, after an "
                        "all-to-all of the counts")
    p.add_argument("--rtol", type=float, default=1e-5,
                   help="largest relative difference of the losses between the runs (default 1e-5)")
    p.add_argument("--no-compute-only", dest="compute_only", action="store_false",
                   help="skip the run over torch's fake group that times the step without communication")
    sync_only.add_option(p)
    return p


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    cfg = training.config(p, a, "moe")
    if a.hidden < 1 or a.capacity_factor <= 0:
        p.error("--hidden must be >= 1 and --capacity-factor > 0")
    cfg.update(hidden=a.hidden, capacity_factor=a.capacity_factor, rtol=a.rtol, compute_only=a.compute_only,
               dropless=a.dropless, sync_only=a.sync_only)
    return training.run(cfg, rank_main, a, "bench.moe")


if __name__ == "__main__":
    sys.exit(main())
