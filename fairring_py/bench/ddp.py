"""DDP end-to-end benchmark: samples/s of a small model trained with
DistributedDataParallel over fairring vs gloo (nccl with --device cuda), in
the same processes, on a simulated cluster.

    python -m fairring_py.bench.ddp                         # 2 nodes x 2 ranks, MLP, CPU
    python -m fairring_py.bench.ddp --model transformer --steps 30
    python -m fairring_py.bench.ddp --netns --link-rate 1gbit   # root: namespaces
    python -m fairring_py.bench.ddp --netns --link-rate 1gbit --wire-dtype bf16  # + compressed rails
    python -m fairring_py.bench.ddp --netns --link-rate 1gbit --nodes 4 --ranks-per-node 1 --servers 4
                                                            # + dedicated reduction servers

With --wire-dtype, more replicas train in the same run: over a fairring group
with compressed rails (fairring-bf16, ...), and over the baseline with the
logic of DDP's bf16_compress_hook (gloo+hook; DDP refuses the hook itself on CPU); each reports its final loss (mean over
ranks) and its parameters' largest relative difference from the fp32 fairring
replica.  Only the fairring and baseline replicas are held to REPLICA_RTOL.

Each rank builds two identical replicas (same seed), wraps one in DDP over the
fairring group and one over the baseline group, and trains both on the same
synthetic batches, alternating which goes first at every step.  A step
(forward, backward with DDP's bucketed all-reduces, optimizer step) is timed
between barriers, as the slowest rank sees it; samples/s = global batch /
median step time.  Guards: within each replica the parameters are
bit-identical on every rank, and the two replicas stay equal up to the
rounding of a different reduction order.
"""
from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from . import launch, metrics, training

SEED = 4321
# Largest relative parameter difference between the fairring and baseline
# replicas that a different summation order can explain after a few SGD steps.
REPLICA_RTOL = 1e-4


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in model.parameters()])


def bf16_hook(pg, bucket):
    """torch's default_hooks.bf16_compress_hook, which DDP refuses on CPU
    (it asks for NCCL): the bucket, divided by the world size, all-reduced in
    bfloat16, written back."""
    buf = bucket.buffer()
    compressed = buf.to(torch.bfloat16).div_(dist.get_world_size(pg))
    fut = dist.all_reduce(compressed, group=pg, async_op=True).get_future()

    def decompress(f):
        buf.copy_(f.value()[0])
        return buf

    return fut.then(decompress)


def same_on_all_ranks(ranks, flat: torch.Tensor) -> bool:
    ref = flat.clone()
    dist.broadcast(ref, src=0, group=ranks.control)
    return ranks.sum_over_ranks(0 if torch.equal(ref, flat) else 1) == 0


def rank_main(ranks: launch.Ranks, cfg: dict) -> int:
    dev = ranks.device
    torch.manual_seed(SEED)
    model = training.make_model(cfg).to(dev)
    names = ["fairring", ranks.baseline_name]
    groups = [ranks.fairring, ranks.baseline]
    for w, g in ranks.wire_groups:  # --wire-dtype: compressed rails
        names.append(f"fairring-{w}")
        groups.append(g)
    for w, g in ranks.server_groups:  # --servers: the same groups through reduction servers
        names.append(f"fairring-{w}+srv" if w else "fairring+srv")
        groups.append(g)
    ids = [dev.index] if dev.type == "cuda" else None
    replicas = [DDP(copy.deepcopy(model), process_group=g, bucket_cap_mb=cfg["bucket_cap_mb"], device_ids=ids)
                for g in groups]
    if ranks.wire_groups:
        # DDP's own compression on the baseline, for comparison: every partial sum in bf16.
        names.append(f"{ranks.baseline_name}+hook")
        groups.append(ranks.baseline)
        replicas.append(DDP(copy.deepcopy(model), process_group=ranks.baseline, bucket_cap_mb=cfg["bucket_cap_mb"],
                            device_ids=ids))
        replicas[-1].register_comm_hook(ranks.baseline, bf16_hook)
    opts = [torch.optim.SGD(r.parameters(), lr=cfg["lr"]) for r in replicas]
    nparams = sum(p.numel() for p in model.parameters())
    times, losses = training.timed_steps(ranks, cfg, replicas, opts, dev)
    final_loss = [ls[-1] for ls in losses]

    params = [flat_params(r.module) for r in replicas]
    identical_across_ranks = [same_on_all_ranks(ranks, p) for p in params]
    scale = params[1].abs().max().item() or 1.0
    replica_rel_diff = (params[0] - params[1]).abs().max().item() / scale
    ok = all(identical_across_ranks) and replica_rel_diff <= REPLICA_RTOL
    # The loss of the last step, mean over ranks (each rank's own batch).
    loss_t = torch.tensor(final_loss, dtype=torch.float64)
    dist.all_reduce(loss_t, group=ranks.control)
    final_loss = (loss_t / ranks.world).tolist()
    param_diff = [(p - params[0]).abs().max().item() / scale for p in params]
    if ranks.rank == 0:
        global_batch = cfg["batch"] * ranks.world
        rows = metrics.step_rows(names, times, global_batch, "samples_per_s")
        for r, l, d in zip(rows, final_loss, param_diff):
            r["final_loss"] = l
            r["loss_rel_vs_fairring"] = abs(l - final_loss[0]) / abs(final_loss[0]) if final_loss[0] else None
            r["param_max_rel_diff_vs_fairring"] = d
        rate, nodes = cfg.get("link_rate_Bps"), cfg.get("nodes") or 1
        # Least time per step to all-reduce the gradients over the capped links
        # (compute and overlap aside): a floor, not a prediction.
        bound = metrics.link_bound_s(nparams * 4, nodes, rate) if rate else None

        summary = {
            "meta": launch.run_meta(
                ranks, cfg, model=cfg["model"], width=cfg["width"], depth=cfg["depth"], seq=cfg["seq"],
                params=nparams, grad_bytes=nparams * 4, batch_per_rank=cfg["batch"],
                bucket_cap_mb=cfg["bucket_cap_mb"], steps=cfg["steps"], warmup=cfg["warmup"], grad_link_bound_s=bound),
            "rows": rows,
            "check": {"ok": ok, "identical_across_ranks": dict(zip(names, identical_across_ranks)),
                      "replica_max_rel_diff": replica_rel_diff, "rtol": REPLICA_RTOL},
        }
        launch.publish(summary, ddp_table(summary), cfg.get("out"), "ddp.json")
    return 0 if ok else 1


def ddp_table(s: dict) -> str:
    m = s["meta"]
    out = [f"DDP {m['model']} ({m['params'] / 1e6:.2f} M params, {metrics.fmt_size(m['grad_bytes'])} of gradients, "
           f"bucket_cap_mb={m['bucket_cap_mb']}), batch {m['batch_per_rank']}/rank, {m['world_size']} ranks, "
           f"fairring topology {m['fairring_topology']}" + launch.steps_heading(m)
           + (f"; link bound of the gradient all-reduce {m['grad_link_bound_s'] * 1e3:.1f} ms/step"
              if m.get("grad_link_bound_s") else ""),
           f"{'backend':<15}{'step ms':>10}{'p10-p90 ms':>19}{'samples/s':>12}{'vs ' + s['rows'][1]['backend']:>10}"
           f"{'final loss':>12}{'vs fairring':>12}{'params vs fr':>13}"]
    for r in s["rows"]:
        spread = f"{r['p10_step_s'] * 1e3:.1f}-{r['p90_step_s'] * 1e3:.1f}"
        rel = r.get("loss_rel_vs_fairring")
        out.append(f"{r['backend']:<15}{r['median_step_s'] * 1e3:>10.1f}{spread:>19}{r['samples_per_s']:>12.1f}"
                   f"{r['speedup_vs_baseline']:>9.2f}x{r.get('final_loss', float('nan')):>12.6f}"
                   f"{(rel * 100 if rel is not None else float('nan')):>11.3f}%"
                   f"{r.get('param_max_rel_diff_vs_fairring', float('nan')):>13.1e}")
    c = s["check"]
    same = ", ".join(f"{k} {'bit-identical' if v else 'DIFFERENT'} across ranks"
                     for k, v in c["identical_across_ranks"].items())
    out.append(f"check: {'OK' if c['ok'] else 'FAILED'} ({same}; replicas differ by at most "
               f"{c['replica_max_rel_diff']:.1e} relative, limit {c['rtol']:.0e})")
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    p = training.parser("python -m fairring_py.bench.ddp", __doc__, "ddp.json", 1024, "hidden size", 32, 20, 3)
    p.add_argument("--model", choices=["mlp", "transformer"], default="mlp")
    p.add_argument("--bucket-cap-mb", type=float, default=2.0, help="DDP bucket size (default 2, so several buckets)")
    p.add_argument("--wire-dtype", help="also train over fairring with compressed rails ('bf16', 'fp16' or "
                                        "'bf16,fp16') and over the baseline with DDP's bf16_compress_hook")
    p.add_argument("--servers", type=int, default=0, metavar="M",
                   help="start M dedicated reduction servers next to the job (with --netns each in its own "
                        "namespace on a link like a node's) and also train over fairring+srv: the fairring group "
                        "(and each --wire-dtype one) with Options(reduction_servers=M); used from 3 nodes on")
    return p


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    cfg = training.config(p, a, "ddp")
    wire = [w.strip().lower() for w in a.wire_dtype.split(",")] if a.wire_dtype else []
    if any(w not in ("bf16", "fp16") for w in wire) or len(set(wire)) != len(wire):
        p.error(f"--wire-dtype takes bf16, fp16 or bf16,fp16, got {a.wire_dtype!r}")
    if a.servers < 0:
        p.error("--servers must be >= 0")
    cfg.update(model=a.model, bucket_cap_mb=a.bucket_cap_mb, wire_dtypes=wire, servers=a.servers)
    return training.run(cfg, rank_main, a, "bench.ddp")


if __name__ == "__main__":
    sys.exit(main())
