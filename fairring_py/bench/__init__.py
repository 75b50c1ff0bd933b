"""Fairring's benchmarks (see BENCHMARKS.md).

    python -m fairring_py.bench        all-reduce sweep, fairring vs gloo/nccl (and OpenMPI)
    python -m fairring_py.bench.ddp    DDP end to end, samples/s
    python -m fairring_py.bench.fsdp   FSDP2 / FSDP1 end to end, samples/s and loss agreement

__main__.py  the microbenchmark's command line (local, netns, scaling, torchrun, mpirun)
ddp.py       the DDP benchmark: command line and per-rank loop
fsdp.py      the FSDP benchmark (FSDP2 fully_shard, FSDP1), reusing ddp.py's model and batches
worker.py    one rank's entry point; the all-reduce job: the timed sweep, exact checks
launch.py    starts the ranks (subprocesses with torchrun's variables, or mpirun, through
             fairring_py._ranks, the launcher the tests share); a rank's start (Ranks:
             its place and process groups); the run metadata
netns.py     the cluster simulated with network namespaces, veth links and tc tbf
report.py    table, CSV, JSON and plots
metrics.py   pure helpers: sizes, rates, busbw, link bound, statistics

Imports go one way (no cycle), all at module top; only the optional mpi4py
and matplotlib are imported where they are used:

    __main__  imports worker, launch, netns, report, metrics
    worker    imports ddp, fsdp, launch, report, metrics
    fsdp      imports ddp, launch, netns, metrics
    ddp       imports launch, netns, metrics
    report    imports metrics
    launch imports only fairring_py._ranks (outside bench/)
    netns, metrics import nothing of the package
"""
