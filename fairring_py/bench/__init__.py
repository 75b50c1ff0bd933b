"""Fairring's benchmarks (see BENCHMARKS.md).

    python -m fairring_py.bench        all-reduce sweep, fairring vs gloo/nccl (and OpenMPI)
    python -m fairring_py.bench.ddp    DDP end to end, samples/s

__main__.py  the microbenchmark's command line (local, netns, scaling, torchrun, mpirun)
ddp.py       the DDP benchmark: command line and per-rank loop
worker.py    one rank: process groups, the timed sweep, exact checks
launch.py    starts the ranks (subprocesses with torchrun's variables, or mpirun)
netns.py     the cluster simulated with network namespaces, veth links and tc tbf
report.py    table, CSV, JSON and plots
metrics.py   pure helpers: sizes, rates, busbw, link bound, statistics
"""
