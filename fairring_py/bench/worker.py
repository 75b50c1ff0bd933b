"""One rank of a benchmark: ``python -m fairring_py.bench.worker CONFIG.json``.

Reads the rank from the environment (torchrun's variables, or OpenMPI's under
mpirun), joins a "fairring" process group plus gloo groups on the same ranks
(launch.Ranks), and runs the job the config names: the all-reduce sweep
below, or the DDP, FSDP, MoE or pipeline benchmark (ddp.py, fsdp.py, moe.py, pipeline.py).  Rank 0 writes the report.

How a sample is timed: all ranks leave a barrier (on a separate gloo "control"
group), each times ``reps`` operations back to back (``reps`` per backend and
size, from a first timed operation, so that a sample lasts about --sample-ms) (with ``inflight`` > 1,
groups of that many async all-reduces, then a wait on all of them), and the
sample's time is the MAX over ranks of the per-rank time divided by ``reps``:
the completion time as seen by the slowest rank.  The backends take turns
within each sample, in an order that rotates from sample to sample, so machine
noise hits all of them alike.  Every result of every timed operation is
compared exactly with an expectation computed on each rank without any
collective.

``--collective reduce_scatter`` times ``reduce_scatter_single`` (SUM) and
``all_gather`` times ``all_gather_single`` (torch's ``reduce_scatter_tensor`` and
``all_gather_into_tensor`` before 2.13, the same backend operations); a size is the full buffer per
rank, as in nccl-tests: reduce_scatter's input (each rank gets size / P
bytes) and all_gather's output (each rank sends size / P bytes);
``all_to_all`` times ``all_to_all_single`` with equal blocks, a size being
each rank's input (a block of size / P to every rank); ``gather`` and
``scatter`` (root 0) take the root's whole list as their size.  A size that
is not a multiple of 4 x P bytes is rounded down to one (the report gives the
bytes actually moved).  The outputs are filled with NaN before every timed
group, so an operation that writes nothing fails the check.

With ``--servers M`` every fairring group is timed twice: as is and as
"<name>+srv", the same group with Options(reduction_servers=M) (the launcher
starts the servers).  Around each sample rank 0 also reads the servers' CPU
time and the machine's (OutsideCpu), so a CPU-bound run shows as such.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Dict, List

import torch
import torch.distributed as dist

from fairring_py.options import resolve

from . import collectives, ddp, fsdp, metrics, moe, pipeline, report
from .collectives import make_input
from .launch import Ranks, run_meta, run_rank

# A backend's name with dedicated reduction servers: "fairring+srv".
SERVERS_SUFFIX = "+srv"
# The machine's busy CPU is reported over at least this much sample time.
HOST_CPU_MIN_S = 0.5
# Memory-copy bandwidth probe: bytes per copy, copies per measurement.
MEMCPY_BYTES = 64 * metrics.MiB
MEMCPY_REPS = 5


# ---------------------------------------------------------------- data

class Workload:
    """What one size of a sized collective needs (its record in
    collectives.TABLE makes them): the fixed per-rank input, the output
    buffers' shape, the expected output (computed here, no collective), and
    how to reset an output before a timed group.

    In-place collectives (all_reduce, broadcast, ...) work on the buffer
    (reset copies the input in); the others read ``inp`` (never written) and
    write a separate output (reset fills it with NaN)."""

    def __init__(self, collective: str, rank: int, world: int, size: int, device):
        self.collective, self.rank, self.world = collective, rank, world
        coll = collectives.BY_NAME[collective]
        self.out_shard = coll.out_shard
        self.inp, self.out_numel, self.expected, numel = coll.tensors(rank, world, size // 4, device)
        self.size = numel * 4
        if self.out_numel == 0:
            raise SystemExit(f"fairring bench: size {size} bytes is too small for {collective} on {world} ranks "
                             f"(at least {4 * world} bytes)")
        self.in_place = coll.in_place
        self.inp_ref = None if self.in_place else self.inp.clone()
        self.fresh_holds_input = coll.fresh_input

    def magnitudes(self) -> torch.Tensor:
        """Per element of the expected output, the sum over ranks of |input|:
        what the error of compressed rails is relative to (docs/COMPRESSED_RAILS.md, "Compressed
        rails": the sum may cancel).  For the reducing collectives."""
        full = self.out_numel * (self.world if self.out_shard else 1)
        out = torch.zeros(full, dtype=torch.float64)
        for r in range(self.world):
            out += make_input(r, full, "cpu").double().abs()
        if self.out_shard:
            out = out[self.rank * self.out_numel:(self.rank + 1) * self.out_numel]
        return out.to(self.inp.device)

    def check_input(self, rank: int) -> str:
        """reduce_scatter / all_gather must leave their input as it was."""
        if self.inp_ref is None or torch.equal(self.inp, self.inp_ref):
            return ""
        bad = (self.inp != self.inp_ref).nonzero()[0].item()
        return f"{self.collective}: the input was modified on rank {rank} (element {bad})"

    def buffers(self, count: int):
        return [torch.empty(self.out_numel, dtype=torch.float32, device=self.inp.device) for _ in range(count)]

    def fresh_buffers(self, count: int):
        bufs = self.buffers(count)
        if self.fresh_holds_input:
            for b in bufs:
                b.copy_(self.inp)
        return bufs

    def reset(self, buf) -> None:
        if self.in_place:
            buf.copy_(self.inp)
        else:
            buf.fill_(float("nan"))


# ---------------------------------------------------------------- backends

class TorchBackend:
    def __init__(self, name, group, collective="all_reduce", exact=True, warm=False):
        self.name, self.group, self.collective = name, group, collective
        # --fresh-buffers: this one reuses its outputs all the same (the warm
        # twin that the fresh figures are compared with, in the same run).
        self.warm = warm
        # False for compressed rails: results are rounded, so their error is
        # measured instead of compared exactly.
        self.exact = exact
        self.inp = None  # the collectives that read an input: set per size (Workload.inp)
        self.fresh_run = False  # this sample's buffers are new (time_once sets it)
        self.op = collectives.BY_NAME[collective].call(self)

    def prepare(self, bufs, work=None):
        if work is not None:
            self.inp = work.inp
        return bufs

    def run(self, bufs, inflight):
        if inflight == 1:
            for b in bufs:
                self.op(b, group=self.group)
            return
        for i in range(0, len(bufs), inflight):
            works = [self.op(b, group=self.group, async_op=True) for b in bufs[i:i + inflight]]
            for w in works:
                w.wait()


class MpiBackend:
    name = "mpi"
    exact = True

    def __init__(self, comm, collective="all_reduce"):
        from mpi4py import MPI

        self.MPI, self.comm, self.collective = MPI, comm, collective
        self.inp = None
        coll = collectives.BY_NAME[collective]
        self.op = coll.mpi(self)
        self.start = coll.mpi_start(self) if coll.mpi_start else None

    def prepare(self, bufs, work=None):
        if work is not None:
            self.inp = work.inp.numpy()
        return [b.numpy() for b in bufs]  # views: MPI writes the tensors

    def run(self, arrays, inflight):
        if inflight == 1:
            for a in arrays:
                self.op(a)
            return
        if self.start is None:
            raise ValueError(f"{self.collective} runs one message at a time (no --inflight)")
        for i in range(0, len(arrays), inflight):
            self.MPI.Request.Waitall([self.start(a) for a in arrays[i:i + inflight]])


# ---------------------------------------------------------------- measurements

def memcpy_bandwidth(ranks: Ranks) -> Dict[str, float]:
    """Copy bandwidth (bytes copied per second; each byte is read once and
    written once) of a torch copy_ of 64 MiB: rank 0 alone, then every rank at
    once (per rank, slowest rank).  The busbw fractions use the concurrent
    figure: it is what each rank gets while all of them work."""
    src = torch.ones(MEMCPY_BYTES // 4, dtype=torch.float32, device=ranks.device)
    dst = torch.empty_like(src)
    dst.copy_(src)

    def timed():
        ranks.sync()
        t0 = time.perf_counter()
        for _ in range(MEMCPY_REPS):
            dst.copy_(src)
        ranks.sync()
        return (time.perf_counter() - t0) / MEMCPY_REPS

    alone = []
    for _ in range(3):
        ranks.barrier()
        alone.append(timed() if ranks.rank == 0 else 0.0)
    concurrent = []
    for _ in range(3):
        ranks.barrier()
        concurrent.append(timed())
    alone_s = ranks.max_over_ranks([min(alone)])[0]
    conc_s = ranks.max_over_ranks([min(concurrent)])[0]
    return {"bytes": MEMCPY_BYTES, "alone_Bps": MEMCPY_BYTES / alone_s,
            "concurrent_per_rank_Bps": MEMCPY_BYTES / conc_s}


def check(bufs, expected, name, rank) -> str:
    if expected is None:  # nothing is promised about this rank's buffers
        return ""
    for i, b in enumerate(bufs):
        if not torch.equal(b, expected):
            bad = (b != expected).nonzero()[0].item()
            return (f"{name}: wrong result on rank {rank} (buffer {i}, element {bad}): "
                    f"got {b[bad].item()}, expected {expected[bad].item()}")
    return ""


def max_rel_error(bufs, expected, mag) -> float:
    """max over elements of |result - exact| / sum_r |input_r| (the
    expectation is integer-valued float32, exact); nan if a result is NaN.
    0 where nothing is expected (a reduce's non-root)."""
    if expected is None:
        return 0.0
    e = expected.double()
    worst = 0.0
    for b in bufs:
        d = (b.double() - e).abs()
        if bool(torch.isnan(d).any()):
            return float("nan")
        worst = max(worst, float((d / mag).max()))
    return worst


def thp_setting() -> str:
    """The machine's transparent-huge-page mode (the word in brackets)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return "unknown"
    return text[text.find("[") + 1:text.find("]")] if "[" in text else text.strip()


def minor_faults() -> int:
    """This process's minor page faults so far (getrusage): a first write to
    fresh memory costs one per page, memory reused by malloc none."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class OutsideCpu:
    """CPU seconds spent outside the ranks, read by rank 0 around each timed
    sample: each reduction server's (all its threads, /proc/PID/stat; the
    launcher gives their pids) and the whole machine's busy time (/proc/stat:
    also the kernel's network work in softirq context, and anything else
    running on the machine).  NaN where a figure cannot be read."""

    TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

    def __init__(self, server_pids):
        self.pids = list(server_pids)

    def read(self) -> List[float]:
        """Seconds so far: one per server, then the machine's busy total."""
        return [self._process(pid) for pid in self.pids] + [self._machine()]

    def _process(self, pid: int) -> float:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return float("nan")
        return (int(fields[11]) + int(fields[12])) * self.TICK_S  # utime, stime

    def _machine(self) -> float:
        try:
            with open("/proc/stat") as f:
                ticks = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return float("nan")
        # user nice system idle iowait irq softirq steal (guest is in user)
        return (sum(ticks[:8]) - ticks[3] - ticks[4]) * self.TICK_S


def time_once(ranks, backend, bufs, prepared, work, inflight, fresh=False, outside=None):
    """Seconds for one sample, the minor page faults it took, this process's
    CPU seconds in it (every thread: the caller's and the backend's) and,
    with ``outside`` (an OutsideCpu), the CPU seconds of what it reads.
    ``fresh``: every op gets a new output (torch.empty inside the timed
    region, as a trainer allocates it each step); returns the outputs, to be
    checked."""
    if not fresh:
        for b in bufs:
            work.reset(b)
    backend.fresh_run = fresh
    ranks.sync()
    ranks.barrier()
    faults = minor_faults()
    o0 = outside.read() if outside else []
    c0 = time.process_time()
    t0 = time.perf_counter()
    if fresh:
        bufs = work.fresh_buffers(len(bufs))
        prepared = backend.prepare(bufs)
    backend.run(prepared, inflight)
    ranks.sync()
    t = time.perf_counter() - t0
    cpu = time.process_time() - c0
    o = [b - a for a, b in zip(o0, outside.read())] if outside else []
    return t, minor_faults() - faults, cpu, o, bufs


def sweep_size(ranks, backends, size, cfg) -> dict:
    """Time every backend at one size; returns per-backend samples (seconds per
    group of ``inflight`` operations, max over ranks) and the checks done."""
    inflight = cfg["inflight"]
    work = Workload(cfg.get("collective") or "all_reduce", ranks.rank, ranks.world, size, ranks.device)
    size, expected = work.size, work.expected  # bytes actually moved (rounded to 4 x P for rs/ag)

    # Warm-up, then calibration on the second group per backend (the first
    # may pay for first-touch memory and connections); both checked.
    bufs = work.buffers(inflight)
    errors = []
    rel_err = [0.0 for _ in backends]
    mag = None if all(be.exact for be in backends) else work.magnitudes()

    def verify(i, bufs_):
        if backends[i].exact:
            errors.append(check(bufs_, expected, backends[i].name, ranks.rank))
        else:
            rel_err[i] = max(rel_err[i], max_rel_error(bufs_, expected, mag))
        errors.append(work.check_input(ranks.rank) and f"{backends[i].name}: {work.check_input(ranks.rank)}")

    fresh_of = [cfg.get("fresh_buffers", False) and not getattr(be, "warm", False) for be in backends]
    for _ in range(2):
        first = []
        for i, be in enumerate(backends):
            t, _, _, _, out = time_once(ranks, be, bufs, be.prepare(bufs, work), work, inflight, fresh_of[i])
            first.append(t)
            verify(i, out)
    slowest = ranks.max_over_ranks(first)
    # Every rank derives the same counts from the same agreed numbers.  Each
    # backend gets its own reps, so a fast one is not timed over a few
    # operations only (the barrier's skew would dominate).
    reps = [metrics.choose_reps(t, cfg["sample_target_s"], cfg["max_reps"], size * inflight, cfg["buffer_budget"])
            for t in slowest]
    samples = metrics.choose_samples(sum(t * r for t, r in zip(slowest, reps)), cfg["time_per_size_s"],
                                     cfg["min_samples"], cfg["max_samples"])
    bufs = work.buffers(max(reps) * inflight)
    mine = [bufs[:r * inflight] for r in reps]
    prepared = [be.prepare(b, work) for be, b in zip(backends, mine)]
    times = [[] for _ in backends]
    faults = [0 for _ in backends]
    cpu = [0.0 for _ in backends]
    wall = [0.0 for _ in backends]  # this rank's, of the samples
    outside = OutsideCpu(cfg.get("server_pids") or []) if ranks.rank == 0 else None
    away = [[0.0] * (len(outside.pids) + 1) if outside else [] for _ in backends]
    checked = 2 * len(backends) * inflight
    for s in range(samples):
        for j in range(len(backends)):
            i = (j + s) % len(backends)  # rotate the order every sample
            t, f, c, o, out = time_once(ranks, backends[i], mine[i], prepared[i], work, inflight, fresh_of[i], outside)
            times[i].append(t / reps[i])
            faults[i] += f
            cpu[i] += c
            wall[i] += t
            away[i] = [a + b for a, b in zip(away[i], o)]
            verify(i, out)
            checked += len(out)
            del out  # a fresh sample's outputs go back before the next one
    flat = ranks.max_over_ranks([t for ts in times for t in ts])
    times = [flat[i * samples:(i + 1) * samples] for i in range(len(backends))]
    ops = [samples * reps[i] * inflight for i in range(len(backends))]
    # Minor page faults per op, the most of any rank.
    faults = ranks.max_over_ranks([f / ops[i] for i, f in enumerate(faults)])
    # CPU seconds per op (all of a rank's threads), the most of any rank: a
    # fast op that keeps the cores busy takes them from the trainer.
    cpu_max = ranks.max_over_ranks([c / ops[i] for i, c in enumerate(cpu)])
    error = next((e for e in errors if e), "")
    rel_err = ranks.max_over_ranks(rel_err)
    return {"size": size, "reps": reps, "samples": samples, "times": times, "error": error,
            "checked": checked, "faults_per_op": faults, "cpu_per_op_s": cpu_max,
            "max_rel_err": [None if be.exact else r for be, r in zip(backends, rel_err)],
            **cpu_load(ranks, cpu, wall, away, ops)}


def cpu_load(ranks, cpu, wall, away, ops) -> dict:
    """What the CPU did during each backend's samples: every rank's CPU
    seconds per op summed, the servers' (rank 0's OutsideCpu; all of them
    summed, and each), and how many cores were busy on average: all ranks
    and servers together, and the whole machine (/proc/stat).  On a machine
    of C cores, C busy says the CPU, not the network, was the limit."""
    total = ranks.sum_floats_over_ranks(cpu)
    out = {"cpu_ranks_per_op_s": [c / n for c, n in zip(total, ops)],
           "cpu_servers_per_op_s": [], "cpu_per_server_per_op_s": [], "busy_cores": [], "host_busy_cores": []}
    for i, n in enumerate(ops):
        servers, machine = away[i][:-1], away[i][-1] if away[i] else float("nan")
        out["cpu_servers_per_op_s"].append(sum(servers) / n if servers else None)
        out["cpu_per_server_per_op_s"].append([c / n for c in servers])
        out["busy_cores"].append((total[i] + sum(servers)) / wall[i] if wall[i] > 0 else float("nan"))
        # /proc/stat counts 10 ms ticks: over less than half a second it says little.
        out["host_busy_cores"].append(machine / wall[i] if wall[i] >= HOST_CPU_MIN_S else None)
    return out


def run_allreduce(ranks: Ranks, cfg: dict) -> int:
    collective = cfg.get("collective", "all_reduce")
    coll = collectives.BY_NAME[collective]
    plain_wire = resolve().wire_dtype  # FAIRRING_WIRE_DTYPE of the plain group
    backends = [TorchBackend("fairring", ranks.fairring, collective, exact=plain_wire == "none"),
                TorchBackend(ranks.baseline_name, ranks.baseline, collective)]
    # After the baseline (backends[1], the reference of every ratio).
    backends += [TorchBackend(f"fairring-{w}", g, collective, exact=False) for w, g in ranks.wire_groups]
    if cfg.get("fresh_buffers"):
        # The same group on reused outputs, timed in the same samples: fresh
        # against warm in one run.
        backends.append(TorchBackend("fairring-warm", ranks.fairring, collective,
                                     exact=plain_wire == "none", warm=True))
    # --servers: each fairring group above again, through the reduction
    # servers ("+srv"), in the same run as its workers-only twin.
    with_servers = {}
    for w, g in ranks.server_groups:
        twin = "fairring" if w is None else f"fairring-{w}"
        with_servers[twin + SERVERS_SUFFIX] = twin
        backends.append(TorchBackend(twin + SERVERS_SUFFIX, g, collective, exact=w is None and plain_wire == "none"))
    if ranks.mpi_comm is not None:
        if ranks.device.type != "cpu":
            raise SystemExit("fairring bench: --mpi measures CPU tensors only")
        backends.append(MpiBackend(ranks.mpi_comm, collective))
    is0 = ranks.rank == 0
    memcpy = memcpy_bandwidth(ranks)
    sizes = cfg["sizes"]
    results = []
    errors = []
    t_start = time.monotonic()
    for n, size in enumerate(sizes):
        res = sweep_size(ranks, backends, size, cfg)
        if res["error"]:
            print(f"rank {ranks.rank}: {res['error']}", file=sys.stderr, flush=True)
            errors.append(res["error"])
        results.append(res)
        if is0 and cfg.get("progress", True):
            med = {be.name: metrics.percentile(ts, 50) for be, ts in zip(backends, res["times"])}
            parts = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in med.items())
            print(f"[{n + 1}/{len(sizes)} {time.monotonic() - t_start:6.1f} s] {metrics.fmt_size(size)}: {parts} "
                  f"({res['samples']} samples; reps {'/'.join(map(str, res['reps']))})", file=sys.stderr, flush=True)
    failed = ranks.sum_over_ranks(1 if errors else 0)
    if is0:
        meta = run_meta(
            ranks, cfg,
            inflight=cfg["inflight"],
            collective=collective,
            dtype="float32",
            op=coll.op,
            api=coll.api,
            size_means=coll.size_means,
            fairring_env={k: v for k, v in os.environ.items() if k.startswith("FAIRRING_")
                          and k != "FAIRRING_NODE_ID"},
            timing="per sample: barrier, reps groups back to back, max over ranks of the per-rank time / reps",
            fresh_buffers=bool(cfg.get("fresh_buffers")),
            thp=thp_setting(),
            servers=int(cfg.get("servers") or 0),
            with_servers=with_servers,
            # The build's all-reduce rail between many nodes (plan/rail_levels.h): runs
            # without this key were measured before levels existed, the direct exchange.
            rail_levels="by node count",
        )
        summary = report.summarize_run(meta, memcpy, [be.name for be in backends], results,
                                       checks_failed_ranks=failed)
        report.emit(summary, cfg.get("out"))
    return 1 if failed else 0


def run_barrier(ranks: Ranks, cfg: dict) -> int:
    """``--collective barrier``: the latency of a barrier on each backend, in one
    run, backends alternating sample by sample."""
    names = ["fairring", ranks.baseline_name] + (["mpi"] if ranks.mpi_comm is not None else [])
    groups = {"fairring": ranks.fairring, ranks.baseline_name: ranks.baseline}

    def run(name, reps):
        if name == "mpi":
            for _ in range(reps):
                ranks.mpi_comm.Barrier()
        else:
            for _ in range(reps):
                dist.barrier(group=groups[name])
        ranks.sync()

    def timed(name, reps):
        ranks.barrier()
        t0 = time.perf_counter()
        run(name, reps)
        return (time.perf_counter() - t0) / reps

    for name in names:  # warm-up: connections, first-touch memory
        timed(name, 10)
    first = ranks.max_over_ranks([timed(name, 10) for name in names])
    reps = [max(1, min(cfg["max_reps"], int(cfg["sample_target_s"] / max(t, 1e-7)))) for t in first]
    samples = max(cfg["min_samples"], min(cfg["max_samples"], 20))
    times = [[] for _ in names]
    for s in range(samples):
        for j in range(len(names)):
            i = (j + s) % len(names)
            times[i].append(timed(names[i], reps[i]))
    flat = ranks.max_over_ranks([t for ts in times for t in ts])
    times = [flat[i * samples:(i + 1) * samples] for i in range(len(names))]
    if ranks.rank != 0:
        return 0
    med = {n: metrics.percentile(ts, 50) for n, ts in zip(names, times)}
    rows = [{"backend": n, "median_us": med[n] * 1e6, "p10_us": metrics.percentile(ts, 10) * 1e6,
             "p90_us": metrics.percentile(ts, 90) * 1e6, "reps": r, "samples": samples,
             "fairring_speedup": med[n] / med["fairring"]}
            for n, ts, r in zip(names, times, reps)]
    meta = run_meta(ranks, cfg, collective="barrier",
                    timing="per sample: control barrier, reps barriers back to back, max over ranks of time / reps")
    lines = [f"barrier, {ranks.world} ranks ({cfg.get('nodes')} node(s) x {cfg.get('ranks_per_node')}), "
             f"commit {meta['commit'] or '?'}",
             "| backend | median us (p10-p90) | fairring faster by |", "|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['backend']} | {r['median_us']:.1f} ({r['p10_us']:.1f}-{r['p90_us']:.1f}) | "
                     f"{r['fairring_speedup']:.2f}x |")
    print("\n".join(lines), flush=True)
    out = cfg.get("out")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "barrier.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


def job_of(cfg: dict):
    """The function a rank runs for the config's job."""
    return {"ddp": ddp.rank_main, "fsdp": fsdp.rank_main, "moe": moe.rank_main, "pipeline": pipeline.rank_main,
            "barrier": run_barrier}.get(
        cfg.get("job", "allreduce"), run_allreduce)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m fairring_py.bench.worker CONFIG.json (started by fairring_py.bench)",
              file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        cfg = json.load(f)
    return run_config(cfg)


def run_config(cfg: dict) -> int:
    """Run the job the config names: "ddp" (ddp.py), "fsdp" (fsdp.py), "moe" (moe.py), "pipeline" (pipeline.py), "barrier" or the sweep."""
    return run_rank(cfg, job_of(cfg))


if __name__ == "__main__":
    sys.exit(main())
