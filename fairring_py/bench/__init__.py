"""Fairring's benchmarks (see BENCHMARKS.md and docs/BENCH_GUIDE.md).

    python -m fairring_py.bench           collectives sweep, fairring vs gloo/nccl (and OpenMPI)
    python -m fairring_py.bench.ddp       DDP end to end, samples/s
    python -m fairring_py.bench.fsdp      FSDP2 / FSDP1 end to end, samples/s and loss agreement
    python -m fairring_py.bench.moe       expert-parallel MoE end to end, tokens/s
    python -m fairring_py.bench.pipeline  pipeline-parallel 1F1B end to end, samples/s

__main__.py    the microbenchmark's command line (local, netns, scaling, torchrun, mpirun)
collectives.py one record per collective the microbenchmark times (as nccl-tests' testColl):
               its tensors and exact expectation for a size, the torch call and its OpenMPI
               twin, busbw factor, link bound, the report's words, the options it takes
worker.py      one rank's entry point: runs the job the config names; the microbenchmark's
               sweep (the timed samples, exact checks) and barrier latency
ddp.py         the DDP benchmark: command line and per-rank loop
fsdp.py        the FSDP benchmark (FSDP2 fully_shard, FSDP1)
moe.py         the mixture-of-experts benchmark (all-to-alls of expert parallelism)
pipeline.py    the pipeline-parallel benchmark (1F1B, sends and receives between stages)
training.py    what the training benchmarks share: model, batches, timed steps, the groups
               compared (compute only, sync only), op kinds, throughput table, command line
sync_only.py   the "sync only" group of moe and pipeline: every exchange moves one element
launch.py      starts the ranks (subprocesses with torchrun's variables, or mpirun, through
               fairring_py._ranks, the launcher the tests share); a rank's start (Ranks:
               its place and process groups); the run metadata
netns.py       the cluster simulated with network namespaces, veth links and tc tbf
report.py      the microbenchmark's table, CSV, JSON and plots
metrics.py     pure helpers: sizes, rates, busbw, link bound (each collective's factors from
               collectives.py), statistics
model.py       the all-reduce's cost model (--model): the direct exchange, reduction servers,
               ring and halving-doubling as link, CPU and latency terms, fitted to the
               bench's netns results, checked on held-out points, extrapolated

Imports go one way (no cycle), all at module top; only the optional mpi4py,
matplotlib and torch's FSDP and fake process group are imported where they
are used:

    __main__     imports worker, launch, netns, report, model, metrics, collectives
    worker       imports ddp, fsdp, moe, pipeline, launch, report, metrics, collectives
    ddp          imports training, launch, metrics
    fsdp         imports training, launch, metrics
    moe          imports training, sync_only, launch, metrics
    pipeline     imports training, sync_only, launch, metrics
    training     imports sync_only, launch, metrics
    report       imports metrics, collectives
    model        imports metrics (and fairring_py._C for the slice rule)
    metrics      imports collectives
    launch       imports netns
    collectives, sync_only, netns import nothing of the package

Outside bench/: launch imports fairring_py (the backend) and fairring_py._ranks,
worker fairring_py.options, training and sync_only fairring_py (dump_recent).
"""
