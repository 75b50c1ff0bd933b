"""Rank-side code of the lifecycle tests: what a long-running job does to a
process group over its life (many groups created and destroyed, threads,
fork), and what must come back to where it started."""
from __future__ import annotations

import gc
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import launch


def _thread_names():
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                names.append(f"{f.read().strip()}:{t}")
        except OSError:  # ended meanwhile
            pass
    return names


def _counts():
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    return {
        "threads": len(os.listdir("/proc/self/task")),
        "names": sorted(_thread_names()),
        "fds": len(os.listdir("/proc/self/fd")),
        "rss_mb": rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20,
        # Only the names this process created (their "-p<pid>" tag): tests
        # running beside this one create segments of their own meanwhile.
        "shm": len([n for n in launch.list_shm() if n.endswith(f"-p{os.getpid()}")]),
    }


def _settled_counts():
    # A destroyed group's objects may wait for the cyclic GC (Python frames
    # and futures of its last ops); its threads and its completion workers
    # end shortly after it goes.
    gc.collect()
    time.sleep(0.5)
    return _counts()


def _use(group, world, n=70_001):
    x = torch.ones(n)
    dist.all_reduce(x, group=group)
    y = torch.ones(5)
    dist.all_reduce(y, group=group, async_op=True).get_future().then(lambda f: f.value()[0] * 2).wait()
    return bool(torch.all(x == world))


def init_destroy_cycles(rank, world, store_dir, cycles):
    """`cycles` times: init the default group, use it, destroy it."""
    import fairring_py  # noqa: F401

    ok = True

    def cycle(i):
        nonlocal ok
        dist.init_process_group("fairring", rank=rank, world_size=world, init_method=f"file://{store_dir}/s{i}",
                                timeout=timedelta(seconds=60))
        ok &= _use(None, world)
        dist.destroy_process_group()

    for i in range(2):  # warm-up: libraries, allocator pools
        cycle(i)
    before = _settled_counts()
    for i in range(2, 2 + cycles):
        cycle(i)
    return {"ok": ok, "before": before, "after": _settled_counts()}


def subgroup_cycles(rank, world, cycles):
    """`cycles` subgroups created, used and destroyed on a live default group."""
    ok = True
    for _ in range(2):
        g = dist.new_group(list(range(world)), backend="fairring")
        ok &= _use(g, world)
        dist.destroy_process_group(g)
    # A group's threads end when its last reference goes: destroy_process_group
    # drops torch's, and this is ours.
    del g
    before = _settled_counts()
    for _ in range(cycles):
        g = dist.new_group(list(range(world)), backend="fairring")
        ok &= _use(g, world)
        dist.destroy_process_group(g)
    del g
    return {"ok": ok, "before": before, "after": _settled_counts()}


def two_threads(rank, world, per_thread, n):
    """Two Python threads issue all_reduces on one group at once.  Which
    thread's op goes first differs between ranks (c10d matches collectives
    by issue order), so both use tensors of one shape and value: the result
    must be right whatever the pairing, with no crash and no hang.  Small and
    large tensors alternate between runs of the test, not within one."""
    errors = []
    wrong = [0]

    def run(tag):
        try:
            for _ in range(per_thread):
                t = torch.full((n,), 3.0)
                dist.all_reduce(t)
                if not torch.all(t == 3.0 * world):
                    wrong[0] += 1
        except Exception as e:  # noqa: BLE001
            errors.append(f"{tag}: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=run, args=(k,)) for k in ("a", "b")]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    x = torch.ones(10)
    dist.all_reduce(x)
    return {"errors": errors, "wrong": wrong[0], "after": bool(torch.all(x == world))}
