"""Fairring vs gloo all_reduce on a cluster simulated on this machine.

    python -m fairring_py.demo [--nodes 2] [--ranks-per-node 2] [--size-mib 25]
                               [--iters 10] [--warmup 3]

Spawns nodes x ranks-per-node processes; rank r gets FAIRRING_NODE_ID=r // K, so
Fairring sees that many nodes.  Each rank joins a "fairring" process group and a
gloo group over the same ranks, and all-reduces the same float32 tensor with each,
interleaved (the order alternates per iteration, so machine noise hits both).
Every result is checked exactly against a float64 sum computed locally.  Rank 0
prints medians (slowest rank per iteration), algbw = bytes / time and
busbw = algbw * 2(P-1)/P, as in nccl-tests.  Exit code 1 if any check fails.
"""
import argparse
import os
import socket
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SEED = 1234
BACKENDS = ("fairring", "gloo")


def make_input(rank, numel):
    # Integers of modest size: every float32 partial sum is exact, whatever the
    # reduction order, so the result must equal the float64 sum bit for bit.
    g = torch.Generator().manual_seed(SEED + rank)
    return (torch.randint(-1000, 1001, (numel,), generator=g) + rank + 1).to(torch.float32)


def describe_topology():
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        t = backend.topology()
        flat = ", flat fallback" if t["flattened"] else ""
        return f"{t['num_nodes']} node(s) x {t['ranks_per_node']} rank(s){flat}"
    except Exception as e:  # informational only
        return f"unknown ({e})"


def rank_main(rank, world, node, port, args):
    os.environ["FAIRRING_NODE_ID"] = str(node)
    import fairring_py  # noqa: F401  registers the "fairring" backend

    torch.set_num_threads(1)  # more ranks than cores: keep the check from oversubscribing
    dist.init_process_group("fairring", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    groups = {"fairring": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    topology = describe_topology()

    numel = args.size_mib * 2**20 // 4
    inp = make_input(rank, numel)
    expected = sum(make_input(r, numel).double() for r in range(world))
    buf = torch.empty_like(inp)
    times = {b: [] for b in BACKENDS}
    error = ""
    for it in range(args.warmup + args.iters):
        for name in (BACKENDS if it % 2 == 0 else BACKENDS[::-1]):
            buf.copy_(inp)
            dist.barrier(group=groups["gloo"])
            t0 = time.perf_counter()
            try:
                dist.all_reduce(buf, group=groups[name])
                elapsed = time.perf_counter() - t0
            except Exception as e:
                error = error or f"{name}: all_reduce raised on rank {rank}: {e}"
                elapsed = float("nan")
            if it >= args.warmup:
                times[name].append(elapsed)
            if not error and not torch.equal(buf.double(), expected):
                bad = (buf.double() != expected).nonzero()[0].item()
                error = (f"{name}: wrong result on rank {rank} at element {bad}: "
                         f"got {buf[bad].item()}, expected {expected[bad].item()}")

    # Slowest rank per iteration, and whether any rank saw an error.
    ms = torch.tensor([times[b] for b in BACKENDS], dtype=torch.float64) * 1e3
    failed = torch.tensor([1 if error else 0])
    dist.all_reduce(ms, op=dist.ReduceOp.MAX, group=groups["gloo"])
    dist.all_reduce(failed, group=groups["gloo"])
    if error:
        print(f"rank {rank}: {error}", file=sys.stderr, flush=True)
    if rank == 0:
        nbytes = numel * 4
        print(f"all_reduce of {args.size_mib} MiB float32 (SUM), {args.nodes} node(s) x "
              f"{args.ranks_per_node} rank(s) = {world} ranks; fairring topology: {topology}")
        print(f"{args.iters} timed iterations after {args.warmup} warm-up, median of the slowest rank")
        print(f"{'backend':<10}{'time ms':>10}{'algbw GB/s':>12}{'busbw GB/s':>12}")
        median = {}
        for i, b in enumerate(BACKENDS):
            median[b] = statistics.median(ms[i].tolist()) if args.iters else float("nan")
            algbw = nbytes / (median[b] / 1e3) / 1e9
            busbw = algbw * 2 * (world - 1) / world
            print(f"{b:<10}{median[b]:>10.2f}{algbw:>12.3f}{busbw:>12.3f}")
        print(f"speedup fairring/gloo: {median['gloo'] / median['fairring']:.2f}x")
        print("check: OK" if failed.item() == 0 else f"check: FAILED on {failed.item()} rank(s)",
              flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failed.item() else 0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--size-mib", type=int, default=25)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300, help="seconds before the run is killed")
    args = p.parse_args()
    if args.nodes < 1 or args.ranks_per_node < 1 or args.size_mib < 1 or args.iters < 1:
        p.error("--nodes, --ranks-per-node, --size-mib and --iters must be >= 1")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = args.nodes * args.ranks_per_node
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, world, r // args.ranks_per_node, port, args))
             for r in range(world)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + args.timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            print(f"demo: rank process {proc.pid} still running after {args.timeout} s; killing it",
                  file=sys.stderr)
            proc.kill()
            proc.join()
    codes = [proc.exitcode for proc in procs]
    if any(codes):
        print(f"demo: FAILED (rank exit codes {codes})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
