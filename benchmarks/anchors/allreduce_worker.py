"""One rank of benchmarks/anchors.py (issue 25): times one library's all-reduce.

    torchrun --nproc_per_node=2 benchmarks/anchors/allreduce_worker.py --lib fairring --sizes 4,4096
    torchrun --nproc_per_node=2 benchmarks/anchors/allreduce_worker.py --lib gloo --sizes 4096
    mpirun -np 2 python3 benchmarks/anchors/allreduce_worker.py --lib mpi --sizes 4096        # OpenMPI, mpi4py
    LOCAL_SIZE=2 DS_ACCELERATOR=cpu torchrun --nproc_per_node=2 .../allreduce_worker.py --lib deepspeed --sizes 4096

What each --lib times, float32 SUM, in place, blocking:
  fairring   dist.all_reduce on a "fairring" process group (the default group), as users call it;
  gloo       dist.all_reduce on a "gloo" default group;
  deepspeed  deepspeed.comm.inference_all_reduce (its shared-memory op, built just in time; the run
             stops with exit code 3 if DeepSpeed would fall back to the gloo all-reduce instead);
  mpi        mpi4py's Comm.Allreduce(IN_PLACE) over the MPI library mpi4py was built with (OpenMPI here).
The barrier and the max over ranks that frame the timed region go through a
separate gloo group (torch libraries) or MPI's own (mpi); never timed.

Timing (the same loop as oneccl_allreduce.cpp; the method of ``python -m
fairring_py.bench``): per size, two single operations (warm-up; the second
one's slowest-rank time gives a first estimate of the time per op), then four
warm-up samples (fewer if R reaches its cap) of R operations, R from the
estimate so far, each refining it (the least seen: noise only slows); R is chosen
so that a sample lasts about --sample-ms (R at most --max-reps, and R buffers
within 64 MiB); then samples: every buffer reset
to the input, a barrier, R back-to-back all-reduces on the R buffers; the
sample's time per op = the slowest rank's time / R (one MAX all-reduce of all
the samples' times after the size, outside the timed region); the number of
samples fills about --time-per-size seconds (--min-samples..--max-samples;
fewer if the size has taken 3 x --time-per-size, as under load);
the median over samples is reported.  Inputs are small integers in float32
(every sum exact): every buffer of every sample, warm-up included, is compared
with the expected sum.  Rank 0 prints one JSON line per size on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

BUDGET = 64 << 20  # bytes of buffers per rank and size, as the project's bench
CALIBRATION_SAMPLES = 4  # at most, per size
STOP_AFTER = 3  # samples stop early once a size has taken this many times --time-per-size


def input_values(rank: int, n: int) -> torch.Tensor:
    """Rank r's input: small integers, distinct per rank and position (the same as oneccl_allreduce.cpp)."""
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 7919 + rank * 97) % 2001 - 1000 + rank + 1).to(torch.float32)


def percentile(xs, q):
    xs = sorted(xs)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class TorchLib:
    """fairring, gloo or deepspeed: torch.distributed under torchrun."""

    def __init__(self, lib: str):
        import torch.distributed as dist

        self.dist = dist
        torch.set_num_threads(1)
        self.meta = {"lib": lib, "torch": torch.__version__}
        if lib == "deepspeed":
            import deepspeed
            import deepspeed.comm as dscomm
            from deepspeed.comm import comm as dscomm_state

            deepspeed.init_distributed(dist_backend="gloo", verbose=False)
            cdb = dscomm_state.cdb  # the backend object init_distributed made
            shm = (getattr(cdb, "shm_comm_op", None) is not None and hasattr(torch.ops, "deepspeed")
                   and hasattr(torch.ops.deepspeed, "inference_all_reduce_")
                   and getattr(cdb, "shm_vector_kernel_level", 0) >= 1)
            if not shm:
                # inference_all_reduce would fall back to gloo's all-reduce: not what is measured here.
                print(f"allreduce_worker: rank {dist.get_rank()}: DeepSpeed's shared-memory all-reduce is not in "
                      f"use (shm_comm_op={getattr(cdb, 'shm_comm_op', None)}, "
                      f"kernel level={getattr(cdb, 'shm_vector_kernel_level', None)}; LOCAL_SIZE must equal the "
                      f"world size)", file=sys.stderr, flush=True)
                raise SystemExit(3)
            self.meta.update(version=deepspeed.__version__, path="deepspeed.comm.inference_all_reduce (shm op)")
            self.op = dscomm.inference_all_reduce
        else:
            if lib == "fairring":
                import fairring_py  # registers the backend where torch's autoload did not

                self.meta["version"] = getattr(fairring_py, "__version__", "source tree")
            else:
                self.meta["version"] = torch.__version__
            dist.init_process_group(lib, init_method="env://")
            self.meta["path"] = f"torch.distributed.all_reduce on a {dist.get_backend()!r} group"
            self.op = dist.all_reduce
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.control = dist.new_group(backend="gloo")

    def barrier(self):
        self.dist.barrier(group=self.control)

    def max_over_ranks(self, values):
        t = torch.tensor(values, dtype=torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.control)
        return t.tolist()

    def close(self):
        self.dist.barrier(group=self.control)
        self.dist.destroy_process_group()


class MpiLib:
    """mpi4py under mpirun."""

    def __init__(self):
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
        torch.set_num_threads(1)
        self.meta = {"lib": "mpi", "version": MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip(),
                     "path": "mpi4py Comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)"}

    def op(self, buf):
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)

    def barrier(self):
        self.comm.Barrier()

    def max_over_ranks(self, values):
        import numpy as np

        a = np.array(values, dtype=np.float64)
        self.comm.Allreduce(self.MPI.IN_PLACE, a, op=self.MPI.MAX)
        return a.tolist()

    def close(self):
        self.comm.Barrier()


def sweep(lib, args) -> int:
    rank, world = lib.rank, lib.world
    failures = 0
    for size in [int(s) for s in args.sizes.split(",")]:
        n = size // 4
        inp = input_values(rank, n)
        expected = sum(input_values(r, n) for r in range(world))
        state = {"error": "", "checked": 0, "cpu": 0.0}
        bufs = []  # tensors; ``views`` what the op is given (numpy views for MPI)
        views = []

        def ensure(count):
            while len(bufs) < count:
                bufs.append(torch.empty(n, dtype=torch.float32))
                views.append(bufs[-1].numpy() if isinstance(lib, MpiLib) else bufs[-1])

        def run(count):
            ensure(count)
            for b in bufs[:count]:
                b.copy_(inp)
            lib.barrier()
            op = lib.op
            c0 = time.process_time()  # CPU time of all the process's threads
            t0 = time.perf_counter()
            for v in views[:count]:
                op(v)
            t = time.perf_counter() - t0
            state["cpu"] += time.process_time() - c0
            for k, b in enumerate(bufs[:count]):
                state["checked"] += 1
                if not state["error"] and not torch.equal(b, expected):
                    bad = (b != expected).nonzero()[0].item()
                    state["error"] = (f"{lib.meta['lib']}: wrong result on rank {rank} (buffer {k}, element {bad}): "
                                      f"got {b[bad].item()}, expected {expected[bad].item()}")
            return t

        def choose(t):
            want = int(args.sample_ms / 1e3 / t) if t > 0 else args.max_reps
            return max(1, min(want, args.max_reps, BUDGET // max(size, 1)))

        run(1)
        per_op = lib.max_over_ranks([run(1)])[0]
        for _ in range(CALIBRATION_SAMPLES):  # warm-up samples refine R (noise only slows: keep the least)
            reps = choose(per_op)
            per_op = min(per_op, lib.max_over_ranks([run(reps)])[0] / reps)
            if reps == choose(0.0):  # R at its cap already
                break
        reps = choose(per_op)
        samples = int(args.time_per_size / (per_op * reps)) if per_op > 0 else args.max_samples
        samples = max(args.min_samples, min(args.max_samples, samples))
        times = []
        state["cpu"] = 0.0  # the timed samples' only
        t_size = time.monotonic()
        for s in range(samples):
            times.append(run(reps) / reps)
            # A loaded machine makes samples slower than calibrated: stop once the size has
            # taken STOP_AFTER x --time-per-size (all ranks agree: a max over ranks, untimed).
            late = time.monotonic() - t_size > STOP_AFTER * args.time_per_size
            if s + 1 >= args.min_samples and lib.max_over_ranks([1.0 if late else 0.0])[0]:
                break
        times = lib.max_over_ranks(times)
        cpu_per_op = lib.max_over_ranks([state["cpu"] / (len(times) * reps)])[0]
        bad_ranks = lib.max_over_ranks([1.0 if state["error"] else 0.0])[0]
        if state["error"]:
            print(state["error"], file=sys.stderr, flush=True)
        if bad_ranks:
            failures += 1
        if rank == 0:
            err = state["error"] or ("wrong result on another rank (see its stderr)" if bad_ranks else "")
            print(json.dumps({"lib": lib.meta["lib"], "size": size, "reps": reps, "samples": samples,
                              "median_s": percentile(times, 50), "p10_s": percentile(times, 10),
                              "p90_s": percentile(times, 90), "cpu_s": cpu_per_op, "checked": state["checked"],
                              "error": err}),
                  flush=True)
        del bufs[:], views[:]
    return failures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", required=True, choices=["fairring", "gloo", "deepspeed", "mpi"])
    p.add_argument("--sizes", required=True, help="bytes per rank, comma-separated")
    p.add_argument("--time-per-size", type=float, default=1.5)
    p.add_argument("--sample-ms", type=float, default=10.0)
    p.add_argument("--max-reps", type=int, default=5000)
    p.add_argument("--min-samples", type=int, default=5)
    p.add_argument("--max-samples", type=int, default=300)
    args = p.parse_args()
    lib = MpiLib() if args.lib == "mpi" else TorchLib(args.lib)
    if lib.rank == 0:
        print(json.dumps(dict(lib.meta, ranks=lib.world, omp_num_threads=os.environ.get("OMP_NUM_THREADS"))),
              flush=True)
    failures = sweep(lib, args)
    lib.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
