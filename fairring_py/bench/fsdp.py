"""Sharded-training benchmark: samples/s of a small transformer trained with
FSDP2 (``fully_shard`` on a DeviceMesh over the group) and FSDP1
(``FullyShardedDataParallel``), over fairring vs gloo (nccl with --device cuda),
in the same processes, on a simulated cluster.

    python -m fairring_py.bench.fsdp                          # 2 nodes x 2 ranks, FSDP2 and FSDP1, CPU
    python -m fairring_py.bench.fsdp --fsdp 2 --width 512 --depth 6 --steps 30
    python -m fairring_py.bench.fsdp --nodes 1 --ranks-per-node 2
    python -m fairring_py.bench.fsdp --netns --link-rate 1gbit   # root: namespaces

Each rank builds the same model (same seed) once per backend and variant,
shards it over the fairring group or the baseline group (each encoder layer
its own FSDP unit, then the root), and trains both on the same synthetic
batches with SGD, alternating which goes first at every step.  FSDP's traffic
is all-gathers of parameters (forward and backward) and reduce-scatters of
gradients: ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` on CPU.
A step (forward, backward, optimizer step) is timed between barriers of a
separate gloo group, as the slowest rank sees it; samples/s = global batch /
median step time.  Checks: the losses of the two runs (every rank, every step)
and their local parameter shards agree to --rtol relative (a different
reduction order may change the last bits only).  The report also lists how
the fairring group ran its last collectives (fairring_py.dump_recent: native
kinds, or "... (gloo)" where delegated).

A third run trains the same model over torch's "fake" process group, whose
collectives move nothing (its parameters and losses are meaningless): its step
time is the step's compute and FSDP's own work alone, so "step minus compute
only" estimates each backend's communication per step.  That says how much of
a step a faster backend can win back: on a machine where compute dominates,
the step's speedup stays well below the collectives'.  (--no-compute-only
skips it; it is skipped where torch lacks the fake group.)
"""
from __future__ import annotations

import argparse
import sys

import torch

from . import launch, metrics, training

SEED = 8765
VARIANTS = ("fsdp2", "fsdp1")


def _layer_types(model):
    return {type(m) for m in model.modules() if isinstance(m, torch.nn.TransformerEncoderLayer)} or {torch.nn.Linear}


def shard(variant: str, model: torch.nn.Module, group, device) -> torch.nn.Module:
    """Wrap ``model`` for FSDP over ``group``: each layer a unit, then the root."""
    if variant == "fsdp2":
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(group, device.type)
        units = [m for m in model.modules() if type(m) in _layer_types(model)]
        for m in units:
            fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if variant == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FSDP(model, process_group=group, auto_wrap_policy=ModuleWrapPolicy(_layer_types(model)),
                    device_id=device, use_orig_params=True)
    raise ValueError(f"unknown FSDP variant {variant!r}")


def local_shards(model) -> torch.Tensor:
    """This rank's part of the parameters, flattened (a DTensor's local shard for
    FSDP2, the flat-parameter view for FSDP1; identical layouts over both groups)."""
    parts = []
    for p in model.parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        parts.append(t.detach().reshape(-1).float().cpu())
    return torch.cat(parts) if parts else torch.zeros(0)


def rank_main(ranks: launch.Ranks, cfg: dict) -> int:
    dev = ranks.device
    names, groups = training.compared_groups(ranks, cfg)
    cfg = dict(cfg, model="transformer")
    summary_rows, checks, kinds = [], {}, {}
    all_ok = True
    for variant in cfg["variants"]:
        replicas, opts = [], []
        for g in groups:
            torch.manual_seed(SEED)
            m = shard(variant, training.make_model(cfg).to(dev), g, dev)
            replicas.append(m)
            opts.append(torch.optim.SGD(m.parameters(), lr=cfg["lr"]))
        nparams = sum(p.numel() for p in training.make_model(cfg).parameters())
        seq0 = training.last_seq()
        times, losses = training.timed_steps(ranks, cfg, replicas, opts, dev)
        kinds[variant] = training.fairring_kinds(seq0)
        # The compute-only run (if any) is last; its losses are meaningless.
        loss_rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses[0], losses[1]))
        shards = [local_shards(r) for r in replicas]
        scale = ranks.max_over_ranks([shards[1].abs().max().item() if shards[1].numel() else 0.0])[0] or 1.0
        diff = (shards[0] - shards[1]).abs().max().item() if shards[0].numel() else 0.0
        loss_rel, param_rel = ranks.max_over_ranks([loss_rel, diff / scale])
        ok = loss_rel <= cfg["rtol"] and param_rel <= cfg["rtol"] and all(
            torch.isfinite(torch.tensor(ls)).all() for ls in losses[:2])
        all_ok = all_ok and ok
        checks[variant] = {"ok": ok, "loss_max_rel_diff": loss_rel, "param_max_rel_diff": param_rel,
                           "rtol": cfg["rtol"], "final_loss": {nm: ls[-1] for nm, ls in zip(names[:2], losses)}}
        global_batch = cfg["batch"] * ranks.world
        rows = metrics.step_rows(names, times, global_batch, "samples_per_s", variant=variant)
        summary_rows += rows
        del replicas, opts
    if ranks.rank == 0:
        summary = {
            "meta": launch.run_meta(
                ranks, cfg, model="transformer", width=cfg["width"], depth=cfg["depth"], seq=cfg["seq"],
                params=nparams, batch_per_rank=cfg["batch"], steps=cfg["steps"], warmup=cfg["warmup"],
                variants=list(cfg["variants"]), baseline=names[1]),
            "rows": summary_rows,
            "check": {"ok": all_ok, **checks},
            "fairring_kinds": kinds,
        }
        launch.publish(summary, fsdp_table(summary), cfg.get("out"), "fsdp.json")
    return 0 if all_ok else 1


def fsdp_table(s: dict) -> str:
    m = s["meta"]
    base = m["baseline"]
    out = [f"FSDP, transformer ({m['params'] / 1e6:.2f} M params: width {m['width']}, depth {m['depth']}, "
           f"seq {m['seq']}), batch {m['batch_per_rank']}/rank, {m['world_size']} ranks, "
           f"fairring topology {m['fairring_topology']}" + launch.steps_heading(m),
           f"{'variant':<8}{'backend':<14}{'step ms':>10}{'p10-p90 ms':>19}{'samples/s':>12}{'vs ' + base:>10}"]
    for r in s["rows"]:
        spread = f"{r['p10_step_s'] * 1e3:.1f}-{r['p90_step_s'] * 1e3:.1f}"
        out.append(f"{r['variant']:<8}{r['backend']:<14}{r['median_step_s'] * 1e3:>10.1f}{spread:>19}"
                   f"{r['samples_per_s']:>12.1f}{r['speedup_vs_baseline']:>9.2f}x")
    for v in m["variants"]:
        step = {r["backend"]: r["median_step_s"] * 1e3 for r in s["rows"] if r["variant"] == v}
        if "compute only" in step:
            comm = {b: step[b] - step["compute only"] for b in ("fairring", base)}
            ratio = f"{comm[base] / comm['fairring']:.2f}x" if comm["fairring"] > 0 else "n/a"
            out.append(f"{v} communication per step (step minus compute only): fairring {comm['fairring']:.1f} ms, "
                       f"{base} {comm[base]:.1f} ms ({ratio}); compute only {step['compute only']:.1f} ms")
        c = s["check"][v]
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(s["fairring_kinds"].get(v, {}).items()))
        out.append(f"{v} check: {'OK' if c['ok'] else 'FAILED'} (fairring vs {base}: losses differ by at most "
                   f"{c['loss_max_rel_diff']:.1e} relative, parameter shards by {c['param_max_rel_diff']:.1e}; "
                   f"limit {c['rtol']:.0e})")
        out.append(f"{v} fairring group's collectives while training (of its last 64): {kinds}")
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    p = training.parser("python -m fairring_py.bench.fsdp", __doc__, "fsdp.json", 256, "d_model", 8, 10, 2)
    p.add_argument("--fsdp", default="2,1", help="variants, comma-separated: 2 (fully_shard), 1 "
                                                 "(FullyShardedDataParallel); default 2,1")
    p.add_argument("--rtol", type=float, default=1e-5,
                   help="largest relative difference of losses and parameter shards between the runs (default 1e-5)")
    p.add_argument("--no-compute-only", dest="compute_only", action="store_false",
                   help="skip the run over torch's fake group that times the step without communication")
    return p


def parse_variants(text: str) -> list:
    out = []
    for v in str(text).split(","):
        v = v.strip().lower().removeprefix("fsdp")
        if v not in ("1", "2"):
            raise ValueError(f"--fsdp takes 1 and/or 2 (e.g. 2,1), got {text!r}")
        if f"fsdp{v}" not in out:
            out.append(f"fsdp{v}")
    return out


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    cfg = training.config(p, a, "fsdp")
    if a.width % 64 and a.width > 64:
        p.error("--width must be a multiple of 64 (one attention head per 64)")
    try:
        variants = parse_variants(a.fsdp)
    except ValueError as e:
        p.error(str(e))
    cfg.update(variants=variants, rtol=a.rtol, compute_only=a.compute_only)
    return training.run(cfg, rank_main, a, "bench.fsdp")


if __name__ == "__main__":
    sys.exit(main())
