"""Rank functions for test_status: a job with one rank that stalls before a
collective, looked at with the status view while the others wait in it."""

import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def stalled_rank(rank, world, store_url, stalled, flag_dir):
    """Every rank runs three all-reduces and a send/recv pair; then `stalled`
    waits (for the view to be taken) before its fourth all-reduce, which the
    others are already in.  The first other rank runs ``python -m fairring_py.status`` (a
    separate process, as a user would) while they wait, and in-process
    collect() too; returns the view's text and exit code."""
    import fairring_py.status as status

    t = torch.ones(1000)
    for _ in range(3):
        dist.all_reduce(t)
    if rank in (0, 1):
        other = 1 - rank
        if rank == 0:
            dist.send(torch.ones(10), other)
        else:
            dist.recv(torch.empty(10), other)
    flag = os.path.join(flag_dir, "view-taken")
    out = {}
    if rank == stalled:
        deadline = time.monotonic() + 90
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.05)
        dist.all_reduce(t)
    else:
        work = dist.all_reduce(t, async_op=True)
        if rank == (1 if stalled == 0 else 0):
            time.sleep(1.0)  # the others are in the all-reduce by then
            proc = subprocess.run([sys.executable, "-m", "fairring_py.status", "--store", store_url],
                                  capture_output=True, text=True, timeout=60)
            out["cli"] = (proc.returncode, proc.stdout, proc.stderr)
            out["in_process"] = status.format(status.collect())
            with open(flag, "w") as f:
                f.write("done")
        work.wait()
    expected = float(world ** 4)
    if not torch.all(t == expected):
        raise AssertionError(f"all_reduce gave {t[0].item()}, expected {expected}")
    return out


def in_step(rank, world, store_url, flag_dir):
    """Every rank in step (rank 1 issues nothing more until the view is
    taken): the view says so."""
    import fairring_py.status as status

    t = torch.ones(100)
    dist.all_reduce(t)
    dist.barrier()
    flag = os.path.join(flag_dir, "view-taken")
    text = ""
    if rank == 0:
        text = status.format(status.collect())
        with open(flag, "w") as f:
            f.write("done")
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.05)
    dist.barrier()
    return text


def killed_rank(rank, world, flag_dir):
    """Rank 2 leaves the job abruptly (os._exit) after one all-reduce; the view
    taken then on rank 0 says it does not answer, and still shows the others."""
    import fairring_py.status as status

    t = torch.ones(10)
    dist.all_reduce(t)
    gone = os.path.join(flag_dir, "gone")
    if rank == 2:
        with open(gone, "w") as f:
            f.write(str(os.getpid()))
        os._exit(0)
    deadline = time.monotonic() + 60
    while not os.path.exists(gone) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(open(gone).read() or 0)
    while pid and time.monotonic() < deadline:  # until the process is gone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    # Rank 1 stays (its listener with it) until rank 0 has taken the view.
    seen = os.path.join(flag_dir, "seen")
    if rank == 0:
        view = status.format(status.collect(timeout_s=2.0))
        open(seen, "w").close()
        return view
    while not os.path.exists(seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    return ""


def registered_keys(rank, world, store_url):
    """Which ranks wrote where they answer into the job's store."""
    dist.all_reduce(torch.ones(4))
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return [store.check([f"fairring-status/{r}"]) for r in range(world)]
