"""GPU timings for benchmarks/gpu_check.sh.

  python3 benchmarks/gpu_bench.py [--quick] [--json OUT]

1. Kernels: the multi-input reduction (k inputs -> 1 output) for several dtypes
   and k, as bandwidth ((k+1) x bytes per call / time) and as a fraction of the
   device-to-device copy bandwidth (2 x bytes / time of a tensor copy) measured
   in the same run.  Target: >= 0.90 on large buffers.
2. All-reduce: Fairring's CUDA all-reduce on simulated clusters (ranks may share
   one GPU) and, where every rank has its own GPU, NCCL's on the same ranks.

On a machine without a GPU or with a CPU-only build it says so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _cuda_ready():
    if not torch.cuda.is_available():
        return "no CUDA device"
    from fairring_py import _C

    if not _C._built_with_cuda():
        return "fairring_py._C was built without CUDA"
    return None


def _time_ms(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def bench_kernels(quick):
    from fairring_py import _C

    nbytes = (64 if quick else 256) << 20
    iters = 10 if quick else 20
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = _time_ms(lambda: dst.copy_(src), iters)
    copy_gbs = 2 * nbytes / copy_ms / 1e6
    src = dst = None  # free them before the kernel timings
    rows = []
    print(f"device-to-device copy of {nbytes >> 20} MiB: {copy_ms:.3f} ms, {copy_gbs:.1f} GB/s (read + write)")
    print(f"{'dtype':>9} {'op':>4} {'k':>2} {'ms':>8} {'GB/s':>8} {'of copy':>8}")
    cases = [(torch.float32, "SUM"), (torch.bfloat16, "SUM"), (torch.float16, "SUM"), (torch.float64, "SUM"),
             (torch.int32, "SUM"), (torch.int64, "MAX"), (torch.float32, "AVG")]
    for dtype, op in cases:
        for k in (2, 4, 8):
            n = nbytes // torch.tensor([], dtype=dtype).element_size()
            ins = [torch.ones(n, dtype=dtype, device="cuda") for _ in range(k)]
            out = torch.empty_like(ins[0])
            div = k if op == "AVG" else 0
            ms = _time_ms(lambda: _C._reduce_cuda_for_test(out, ins, op, div), iters)
            gbs = (k + 1) * nbytes / ms / 1e6
            rows.append({"dtype": str(dtype).replace("torch.", ""), "op": op, "k": k, "ms": ms, "gbs": gbs,
                         "fraction_of_copy": gbs / copy_gbs})
            print(f"{rows[-1]['dtype']:>9} {op:>4} {k:>2} {ms:8.3f} {gbs:8.1f} {gbs / copy_gbs:8.2f}")
            ins = out = None
    torch.cuda.empty_cache()
    return {"copy_bytes": nbytes, "copy_ms": copy_ms, "copy_gbs": copy_gbs, "kernels": rows}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _allreduce_rank(rank, world, backend, node_ids, sizes, iters, port, q):
    try:
        os.environ["FAIRRING_NODE_ID"] = node_ids[rank]
        import torch.distributed as dist

        if backend == "fairring":
            import fairring_py  # noqa: F401
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        kw = {"device_id": dev} if backend == "nccl" else {}
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **kw)
        res = {}
        for nbytes in sizes:
            t = torch.ones(nbytes // 4, device=dev)
            for _ in range(3):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            times = []
            for _ in range(iters):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(t)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            res[nbytes] = statistics.median(times)
        dist.destroy_process_group()
        q.put((rank, res, None))
    except Exception as e:  # noqa: BLE001
        q.put((rank, None, f"{type(e).__name__}: {e}"))


def bench_allreduce(quick):
    import torch.multiprocessing as mp

    # 4 and 64 KiB: per-op latency (DDP's small buckets); the rest: bandwidth.
    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20] + ([] if quick else [128 << 20])
    iters = 5 if quick else 10
    ngpu = torch.cuda.device_count()
    layouts = {"1x2": ["a", "a"], "2x2": ["a", "a", "b", "b"]}
    if ngpu >= 4:
        layouts["1x4"] = ["a"] * 4
    results = []
    for name, nodes in layouts.items():
        world = len(nodes)
        backends = ["fairring"] + (["nccl"] if ngpu >= world else [])
        for backend in backends:
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            port = _free_port()
            procs = [ctx.Process(target=_allreduce_rank, args=(r, world, backend, nodes, sizes, iters, port, q))
                     for r in range(world)]
            for p in procs:
                p.start()
            got = {}
            try:
                for _ in range(world):
                    rank, res, err = q.get(timeout=180)
                    got[rank] = (res, err)
            except Exception as e:  # noqa: BLE001
                got[-1] = (None, f"timed out: {e}")
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
            errs = [e for _, e in got.values() if e]
            if errs or len(got) < world:
                print(f"{name} {backend}: FAILED: {errs[:2]}")
                results.append({"layout": name, "backend": backend, "error": str(errs[:2])})
                continue
            for nbytes in sizes:
                slowest = max(res[nbytes] for res, _ in got.values())
                busbw = 2 * (world - 1) / world * nbytes / slowest / 1e9
                results.append({"layout": name, "backend": backend, "bytes": nbytes, "ms": slowest * 1e3,
                                "busbw_gbs": busbw})
                print(f"{name:>4} {backend:>8} {nbytes >> 10:7d} KiB: {slowest * 1e3:8.3f} ms/op  busbw {busbw:7.2f} GB/s")
        if ngpu < world:
            print(f"{name}: NCCL not timed ({world} ranks on {ngpu} GPU(s); NCCL needs one GPU per rank)")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller buffers, fewer iterations")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--skip-allreduce", action="store_true")
    args = ap.parse_args()
    why = _cuda_ready()
    if why:
        print(f"gpu_bench: skipped ({why})")
        return 0
    print(f"device: {torch.cuda.get_device_name()} x{torch.cuda.device_count()}, torch {torch.__version__}")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    out.update(bench_kernels(args.quick))
    if not args.skip_allreduce:
        out["allreduce"] = bench_allreduce(args.quick)
    big = [r for r in out["kernels"] if r["op"] == "SUM"]
    worst = min(r["fraction_of_copy"] for r in big)
    print(f"multi-input reduction (SUM), worst fraction of copy bandwidth: {worst:.2f} (target >= 0.90)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
