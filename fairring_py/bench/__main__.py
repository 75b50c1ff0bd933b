"""Fairring collectives microbenchmark (all-reduce by default): fairring vs gloo (CPU) or nccl (CUDA),
optionally OpenMPI, interleaved in the same processes, over a sweep of sizes.

    python -m fairring_py.bench                          # 2 nodes x 2 ranks simulated here
    python -m fairring_py.bench --nodes 1 --ranks-per-node 2 --sizes 4K,25M --mpi
    python -m fairring_py.bench --collective reduce_scatter --sizes 4K,1M,25M   # also all_gather, all_to_all
    python -m fairring_py.bench --netns --link-rate 1gbit --sizes 25M     # root: namespaces
    python -m fairring_py.bench --netns --link-rate 1gbit --sizes 25M --wire-dtype bf16  # + compressed rails
    python -m fairring_py.bench --netns --link-rate 1gbit --scaling 2,3,4
    python -m fairring_py.bench --netns --link-rate 1gbit --scaling 2,3,4 --ranks-per-node 1 --servers auto
                                                 # + dedicated reduction servers, one per node
    torchrun --nproc_per_node=8 ... -m fairring_py.bench --sizes 4K:256M:4  # real machines
    python -m fairring_py.bench --model bench_out   # the all-reduce's cost model, fitted to netns results

See BENCHMARKS.md for what is measured and how.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import collectives, launch, metrics, model, netns, report, worker


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fairring_py.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    t = p.add_argument_group("topology (ranks started here; under torchrun/mpirun the launcher decides)")
    t.add_argument("--nodes", type=int, help="simulated nodes (default 2)")
    t.add_argument("--ranks-per-node", type=int,
                   help="ranks per simulated node (default 2); under torchrun/mpirun: give rank r "
                        "FAIRRING_NODE_ID=r // K to simulate nodes")
    t.add_argument("--node-sizes",
                   help="nodes of unequal sizes instead of --nodes x --ranks-per-node, e.g. '2,1' or '3,2' "
                        "(ranks in order; local runs without --scaling, --servers or --mpi)")
    w = p.add_argument_group("workload")
    w.add_argument("--sizes", help="bytes per rank: list '4K,25M', range '4K:256M' (x2 steps) or '4K:256M:4' "
                                   "(x4 steps; default 4K:256M:4; scaling mode: 25M)")
    w.add_argument("--collective",
                   choices=collectives.NAMES,
                   default="all_reduce",
                   help="what to time (default all_reduce; reduce_scatter: reduce_scatter_single (was "
                        "reduce_scatter_tensor), SUM, size = each rank's full input; all_gather: all_gather_single "
                        "(was all_gather_into_tensor), size = each rank's full output (both as nccl-tests; busbw = algbw x (P-1)/P); broadcast: from rank 0; reduce: SUM to rank 0 (busbw = algbw); "
                        "all_to_all: all_to_all_single with equal blocks, size = each rank's input; gather / scatter: "
                        "to / from rank 0, size = the root's whole list; send_recv: ranks 0 and 1 ping-pong a "
                        "message of the size (time per op = a round trip: one way is half; busbw = algbw x 2); "
                        "barrier: latency per barrier, no sizes)")
    w.add_argument("--inflight", type=int, default=1,
                   help="operations issued async before waiting on them (DDP-like buckets; default 1)")
    w.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="tensor device (cuda: fairring vs nccl)")
    w.add_argument("--wire-dtype",
                   help="also time fairring with compressed rails: 'bf16', 'fp16' or 'bf16,fp16'; each is one more "
                        "backend (fairring-bf16, ...: a fairring group with Options(wire_dtype=...)) in the same run, "
                        "reported with its max relative error instead of the exact check (the plain 'fairring' "
                        "keeps FAIRRING_WIRE_DTYPE, default none)")
    w.add_argument("--fresh-buffers", action="store_true",
                   help="a new tensor (torch.empty) for every op, as FSDP and ZeRO allocate their outputs and a "
                        "pipeline stage its receive buffers: first-touch page faults included (all_reduce, broadcast, "
                        "reduce: the input is written into it first, in the timed region, as a trainer writes its "
                        "gradients; send_recv: both receives land in new tensors); 'fairring-warm' is the same group "
                        "on reused tensors, in the same run")
    w.add_argument("--mpi", action="store_true",
                   help="also time OpenMPI's MPI_Allreduce (mpi4py); launches the ranks with mpirun")
    c = p.add_argument_group("cluster simulation (root only)")
    c.add_argument("--netns", action="store_true", help="each node in its own network namespace, veth links")
    c.add_argument("--link-rate", help="cap each node's link with tc tbf, e.g. 1gbit (needs --netns)")
    c.add_argument("--scaling", help="node counts to run one after another, e.g. 2,3,4; plots time per byte")
    c.add_argument("--servers", metavar="M|auto",
                   help="start M dedicated reduction servers (python -m fairring_py.server, --threads = ranks per "
                        "node) next to the job (with --netns each in its own namespace, on a link like a node's; "
                        "else local processes on loopback) and also "
                        "time 'fairring+srv' (and 'fairring-<w>+srv' with --wire-dtype): the same group with "
                        "Options(reduction_servers=M), next to the workers-only 'fairring' in the same run; gloo is "
                        "unchanged. 'auto': one server per node (M = N, per --scaling run too). all_reduce only, "
                        "2 nodes or more (groups of 2 nodes do not use the servers: same time). Under torchrun: the groups use M servers you start yourself "
                        "(python -m fairring_py.server --store MASTER_ADDR:MASTER_PORT)")
    c.add_argument("--netns-cleanup", action="store_true",
                   help="delete namespaces (nodes', servers', switch) left by benchmarks whose launcher is gone, "
                        "then exit")
    m = p.add_argument_group("measurement")
    m.add_argument("--time-per-size", type=float, default=3.0,
                   help="seconds of timed samples per size, all backends together (default 3)")
    m.add_argument("--min-samples", type=int, default=5)
    m.add_argument("--max-samples", type=int, default=30)
    m.add_argument("--sample-ms", type=float, default=50.0,
                   help="small sizes: run operations back to back until a sample lasts this long (default 50)")
    m.add_argument("--max-reps", type=int, default=1000)
    m.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    d = p.add_argument_group("cost model")
    d.add_argument("--model", nargs="+", metavar="DIR",
                   help="fit the all-reduce's cost model (bench/model.py) to the results under DIRs (runs with "
                        "--netns --link-rate and --ranks-per-node 1), report each point's error, the held-out "
                        "ones apart, and extrapolate to 64-1,024 nodes against ring and halving-doubling; "
                        "writes model.md and model.png to --out; runs nothing")
    d.add_argument("--model-hold-out", default="8", metavar="NODES",
                   help="node counts whose points the fit does not see (default 8); servers' points are "
                        "always held out")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="bench_out", help="directory for results.json/.csv/busbw.png (default bench_out)")
    o.add_argument("--no-progress", action="store_true")
    o.add_argument("--timeout", type=float, default=3600, help="seconds before the whole run is killed")
    return p


def build_config(args, p) -> dict:
    """Validate the arguments (errors through argparse) and make the worker's config."""
    if args.link_rate and not args.netns:
        p.error("--link-rate needs --netns (the cap is a tc qdisc on the namespaces' links)")
    if args.mpi and args.netns:
        p.error("--mpi cannot be combined with --netns (mpirun starts the ranks itself)")
    if args.mpi and args.device != "cpu":
        p.error("--mpi measures CPU tensors only")
    for name in ("nodes", "ranks_per_node"):
        v = getattr(args, name)
        if v is not None and v < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    node_sizes = None
    if args.node_sizes:
        try:
            node_sizes = metrics.parse_int_list(args.node_sizes, "--node-sizes", lo=1)
        except ValueError as e:
            p.error(str(e))
        if args.nodes or args.ranks_per_node or args.scaling or args.servers or args.mpi:
            p.error("--node-sizes replaces --nodes and --ranks-per-node, and takes no --scaling, --servers or --mpi")
    if args.inflight < 1 or args.min_samples < 1 or args.max_samples < args.min_samples or args.max_reps < 1:
        p.error("--inflight, --min-samples, --max-reps must be >= 1 and --max-samples >= --min-samples")
    coll = collectives.BY_NAME[args.collective]
    if not coll.sized and (args.sizes or args.scaling or args.inflight != 1):
        p.error(f"--collective {coll.name} takes no --sizes, --scaling or --inflight")
    if coll.one_at_a_time and args.inflight != 1:
        p.error(f"--collective {coll.name} takes no --inflight ({coll.one_at_a_time})")
    if args.fresh_buffers and not coll.sized:
        p.error(f"--fresh-buffers applies to the collectives with a tensor, not to {coll.name}")
    wire = [w.strip().lower() for w in args.wire_dtype.split(",")] if args.wire_dtype else []
    if any(w not in ("bf16", "fp16") for w in wire) or len(set(wire)) != len(wire):
        p.error(f"--wire-dtype takes bf16, fp16 or bf16,fp16, got {args.wire_dtype!r}")
    if wire and not coll.wire_dtype:
        p.error(f"--wire-dtype applies to --collective {only('wire_dtype')} only")
    servers = parse_servers(args, p)
    try:
        default_sizes = "25M" if args.scaling else "4K:256M:4"
        sizes = metrics.parse_sizes(args.sizes or default_sizes)
        rate = metrics.parse_rate(args.link_rate) if args.link_rate else None
        scaling = metrics.parse_int_list(args.scaling, "--scaling", lo=2) if args.scaling else None
    except ValueError as e:
        p.error(str(e))
    return {
        "job": coll.job,
        "collective": args.collective,
        "sizes": sizes,
        "inflight": args.inflight,
        "fresh_buffers": args.fresh_buffers,
        "device": args.device,
        "mpi": args.mpi,
        "wire_dtypes": wire,
        "servers": servers,
        "netns": args.netns,
        "link_rate_Bps": rate,
        "scaling": scaling,
        "nodes": len(node_sizes) if node_sizes else args.nodes or 2,
        # Uneven nodes: the largest (for the report; node_sizes places the ranks).
        "ranks_per_node": max(node_sizes) if node_sizes else args.ranks_per_node or 2,
        "node_sizes": node_sizes,
        "time_per_size_s": args.time_per_size,
        "min_samples": args.min_samples,
        "max_samples": args.max_samples,
        "sample_target_s": args.sample_ms / 1e3,
        "max_reps": args.max_reps,
        "buffer_budget": 64 * metrics.MiB,
        "threads": args.threads,
        "out": args.out,
        "progress": not args.no_progress,
        "timeout_s": args.timeout,
    }


def only(option: str) -> str:
    """The collectives an option applies to (a flag of their records), for its error."""
    return " or ".join(c.name for c in collectives.TABLE if getattr(c, option))


def parse_servers(args, p):
    """--servers: None, a count, or "auto" (one per node)."""
    v = args.servers
    if v is None:
        return None
    v = v.strip().lower()
    if v != "auto" and not (v.isdigit() and int(v) >= 1):
        p.error(f"--servers takes a count >= 1 or 'auto', got {args.servers!r}")
    if not collectives.BY_NAME[args.collective].servers:
        p.error(f"--servers applies to --collective {only('servers')} only (the other collectives do not use the "
                "servers)")
    if args.mpi:
        p.error("--servers cannot be combined with --mpi (mpirun starts the ranks, not the servers)")
    if not args.scaling and (args.nodes or 2) < 2:
        p.error("--servers needs 2 nodes or more (all-reduces within one node use no servers)")
    return v if v == "auto" else int(v)


def run_local(cfg: dict) -> int:
    def once(c, nodes):
        # --servers auto: one server per node, in every run.
        servers = nodes if cfg["servers"] == "auto" else (cfg["servers"] or 0)
        c = dict(c, nodes=nodes, servers=servers)
        if cfg["mpi"]:
            c.update(launcher="mpirun", simulate_ranks_per_node=c["ranks_per_node"])
            launch.run_mpirun(c, nodes, c["ranks_per_node"], cfg["timeout_s"])
        elif cfg["netns"]:
            c["launcher"] = "local+netns"
            with netns.Cluster(nodes, cfg["link_rate_Bps"], servers=servers) as cluster:
                launch.run_ranks(c, nodes, c["ranks_per_node"], cfg["timeout_s"], cluster=cluster)
        else:
            c["launcher"] = "local"
            launch.run_ranks(c, nodes, c["ranks_per_node"], cfg["timeout_s"])

    try:
        if cfg["netns"]:
            netns.check_usable(link_rate=bool(cfg["link_rate_Bps"]))
        if not cfg["scaling"]:
            once(cfg, cfg["nodes"])
            return 0
        runs = []
        for n in cfg["scaling"]:
            print(f"== scaling: {n} nodes x {cfg['ranks_per_node']} ranks", file=sys.stderr, flush=True)
            out = os.path.join(cfg["out"], f"nodes{n}")
            once(dict(cfg, out=out), n)
            with open(os.path.join(out, "results.json")) as f:
                runs.append(json.load(f))
        report.emit_scaling(runs, cfg["out"])
        return 0
    except (launch.LaunchError, netns.NetnsError) as e:
        print(f"fairring bench: {e}", file=sys.stderr)
        return 1


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.netns_cleanup:
        try:
            netns.check_usable()
        except netns.NetnsError as e:
            p.error(str(e))
        removed = netns.cleanup_leftovers()
        print(f"removed {len(removed)} namespace(s){': ' + ', '.join(removed) if removed else ''}")
        return 0
    if args.model:
        return model.main(args.model, args.out, metrics.parse_int_list(args.model_hold_out, "--model-hold-out"))
    cfg = build_config(args, p)
    kind = launch.external_launcher()
    if kind is not None:
        if args.netns or args.scaling:
            p.error("--netns and --scaling start the ranks themselves; run without torchrun/mpirun")
        if args.mpi and kind != "mpi":
            p.error("--mpi under torchrun: start the ranks with mpirun instead (or let --mpi start them)")
        if cfg["servers"] == "auto":
            p.error("--servers auto needs the number of nodes: under torchrun give the count of servers you started")
        # This process is a rank started by torchrun or mpirun.
        launch.adopt_external(cfg, kind, args.ranks_per_node)
        return launch.run_rank(cfg, worker.job_of(cfg))
    launch.exit_on_signals()
    return run_local(cfg)


if __name__ == "__main__":
    sys.exit(main())
