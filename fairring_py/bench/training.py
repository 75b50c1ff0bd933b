"""What the training benchmarks share (bench.ddp, bench.fsdp, bench.moe,
bench.pipeline): the model of DDP and FSDP, the synthetic batches and the
timed steps, the groups compared (Fairring, the baseline, compute only and
sync only), the kinds of the Fairring group's ops, the printed throughput
table, and the command line with its config and launch."""
from __future__ import annotations

import argparse
import collections
import io
import time

import torch
import torch.distributed as dist

import fairring_py

from . import launch, metrics, sync_only

# The synthetic batches' seed.
SEED = 4321


def make_model(cfg: dict) -> torch.nn.Module:
    width, depth = cfg["width"], cfg["depth"]
    if cfg["model"] == "transformer":
        layer = torch.nn.TransformerEncoderLayer(d_model=width, nhead=max(1, width // 64),
                                                 dim_feedforward=4 * width, dropout=0.0, batch_first=True)
        return torch.nn.TransformerEncoder(layer, num_layers=depth, enable_nested_tensor=False)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def timed_steps(ranks, cfg, replicas, opts, dev):
    """Trains the replicas in turn on the same batches (the order rotates every
    step, so machine noise hits them alike); returns, per replica, the times of
    the steps after warm-up as the slowest rank saw them, and every step's loss."""
    times = [[] for _ in replicas]
    losses = [[] for _ in replicas]
    for step in range(cfg["warmup"] + cfg["steps"]):
        x, y = make_batch(cfg, ranks.rank, step, dev)
        for j in range(len(replicas)):
            i = (j + step) % len(replicas)
            ranks.sync()
            ranks.barrier()
            t0 = time.perf_counter()
            loss = torch.nn.functional.mse_loss(replicas[i](x), y)
            opts[i].zero_grad(set_to_none=True)
            loss.backward()
            opts[i].step()
            ranks.sync()
            if step >= cfg["warmup"]:
                times[i].append(time.perf_counter() - t0)
            losses[i].append(loss.item())
    flat = ranks.max_over_ranks([t for ts in times for t in ts])
    n = cfg["steps"]
    return [flat[i * n:(i + 1) * n] for i in range(len(replicas))], losses


def make_batch(cfg: dict, rank: int, step: int, device):
    g = torch.Generator().manual_seed(SEED + 1000003 * step + rank)
    shape = (cfg["batch"], cfg["seq"], cfg["width"]) if cfg["model"] == "transformer" else (cfg["batch"], cfg["width"])
    x = torch.randn(shape, generator=g)
    y = torch.randn(shape, generator=g)
    return x.to(device), y.to(device)


def compute_only_group():
    """torch's "fake" process group (collectives that move nothing), or None
    where this torch lacks it.  Collective: every rank calls it."""
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  registers "fake"
    except Exception:
        return None
    return dist.new_group(backend="fake")


def compared_groups(ranks, cfg: dict):
    """The names and groups a training bench times: Fairring, the baseline,
    torch's fake group when ``cfg["compute_only"]`` (and torch has it), and
    a Fairring group of its own whose exchanges move one element when
    ``cfg.get("sync_only")`` (bench/sync_only.py; the models of bench.moe
    and bench.pipeline know it)."""
    names = ["fairring", ranks.baseline_name]
    groups = [ranks.fairring, ranks.baseline]
    fake = compute_only_group() if cfg["compute_only"] else None
    if fake is not None:
        names.append("compute only")
        groups.append(fake)
    if cfg.get("sync_only"):
        names.append("sync only")
        groups.append(sync_only.SyncOnly(dist.new_group(backend="fairring", timeout=ranks.timeout)))
    return names, groups


def _recent(group=None):
    return fairring_py.dump_recent(group, file=io.StringIO())


def last_seq(group=None) -> int:
    try:
        recs = _recent(group)
    except Exception:  # informational only
        return -1
    return recs[-1]["seq"] if recs else -1


def fairring_kinds(since: int, group=None) -> dict:
    """How many of the fairring group's collectives after sequence number
    ``since`` ran as each kind (of the last 64 it keeps)."""
    try:
        recs = _recent(group)
    except Exception as e:  # informational only
        return {f"unknown ({e})": 0}
    return dict(collections.Counter(r["kind"] for r in recs if r["seq"] > since))


def throughput_table(s: dict, heading: str, unit: str, key: str, losses: str = "losses") -> list:
    """The lines a training benchmark with a compute-only run prints (bench.moe,
    bench.pipeline): `heading`, one row per backend (`key` of each row in
    `unit`), the communication per step, the check of `losses`, the kinds of
    the fairring group's ops."""
    m = s["meta"]
    base = m["baseline"]
    out = [heading + launch.steps_heading(m),
           f"{'backend':<14}{'step ms':>10}{'p10-p90 ms':>19}{unit:>12}{'vs ' + base:>10}"]
    for r in s["rows"]:
        spread = f"{r['p10_step_s'] * 1e3:.1f}-{r['p90_step_s'] * 1e3:.1f}"
        out.append(f"{r['backend']:<14}{r['median_step_s'] * 1e3:>10.1f}{spread:>19}{r[key]:>12.0f}"
                   f"{r['speedup_vs_baseline']:>9.2f}x")
    step = {r["backend"]: r["median_step_s"] * 1e3 for r in s["rows"]}
    if "compute only" in step:
        comm = {b: step[b] - step["compute only"] for b in ("fairring", base)}
        ratio = f"{comm[base] / comm['fairring']:.2f}x" if comm["fairring"] > 0 else "n/a"
        out.append(f"communication per step (step minus compute only): fairring {comm['fairring']:.1f} ms, "
                   f"{base} {comm[base]:.1f} ms ({ratio}); compute only {step['compute only']:.1f} ms "
                   f"({100 * comm[base] / step[base]:.0f}% of {base}'s step is communication)")
    if "sync only" in step:
        # bench/sync_only.py: the same exchanges, one element each.
        line = (f"sync only (every exchange moves one element): {step['sync only']:.1f} ms; moving the bytes: "
                f"fairring {step['fairring'] - step['sync only']:.1f} ms (step minus sync only)")
        if "compute only" in step:
            line += f"; waiting: {step['sync only'] - step['compute only']:.1f} ms (sync only minus compute only)"
        out.append(line + f"; {base}'s step / sync only: {step[base] / step['sync only']:.2f}x (a backend that "
                   "moved the bytes for free, synchronising as fairring does)")
    c = s["check"]
    kinds = ", ".join(f"{k} x{n}" for k, n in sorted(s["fairring_kinds"].items()))
    out.append(f"check: {'OK' if c['ok'] else 'FAILED'} (fairring vs {base}: {losses} differ by at most "
               f"{c['loss_max_rel_diff']:.1e} relative; limit {c['rtol']:.0e})")
    out.append(f"fairring group's ops while training (of its last 64): {kinds}")
    return out


def parser(prog: str, doc: str, out_file: str, width: int, width_help: str, batch: int, steps: int,
           warmup: int) -> argparse.ArgumentParser:
    """The command line the training benchmarks share; each adds its own
    options."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc.split("\n\n", 1)[1])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--width", type=int, default=width, help=f"{width_help} (default {width})")
    p.add_argument("--depth", type=int, default=4, help="layers (default 4)")
    p.add_argument("--seq", type=int, default=32, help="transformer sequence length (default 32)")
    p.add_argument("--batch", type=int, default=batch, help=f"samples per rank per step (default {batch})")
    p.add_argument("--steps", type=int, default=steps, help=f"timed steps (default {steps})")
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--netns", action="store_true", help="root: each node in its own network namespace")
    p.add_argument("--link-rate", help="cap each node's link, e.g. 1gbit (needs --netns)")
    p.add_argument("--out", default="bench_out", help=f"directory for {out_file} (default bench_out)")
    p.add_argument("--timeout", type=float, default=1800)
    return p


def config(p: argparse.ArgumentParser, a: argparse.Namespace, job: str) -> dict:
    """The shared options, checked, as the job's config."""
    if a.link_rate and not a.netns:
        p.error("--link-rate needs --netns")
    if min(a.nodes, a.ranks_per_node, a.width, a.depth, a.seq, a.batch, a.steps) < 1 or a.warmup < 0:
        p.error("sizes and counts must be >= 1 (--warmup >= 0)")
    try:
        rate = metrics.parse_rate(a.link_rate) if a.link_rate else None
    except ValueError as e:
        p.error(str(e))
    return {"job": job, "device": a.device, "width": a.width, "depth": a.depth, "seq": a.seq, "batch": a.batch,
            "steps": a.steps, "warmup": a.warmup, "lr": a.lr, "threads": a.threads, "nodes": a.nodes,
            "ranks_per_node": a.ranks_per_node, "netns": a.netns, "link_rate_Bps": rate, "out": a.out}


def run(cfg: dict, rank_main, a: argparse.Namespace, name: str) -> int:
    return launch.run_job(cfg, rank_main, a.nodes, a.ranks_per_node, a.timeout, a.netns, cfg["link_rate_Bps"], name)
