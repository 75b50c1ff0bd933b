"""Rank-side code of the network-fault tests (spawned by launch.run_ranks,
each rank inside its simulated node's network namespace)."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def _touch(path):
    with open(path + ".tmp", "w") as f:
        f.write(str(time.monotonic()))
    os.replace(path + ".tmp", path)


def stream_until_error(rank, world, timeout_s, sync_dir, numel):
    """Large all-reduces back to back, each result checked, until one fails.
    After the third op the rank writes ``ready<rank>`` (the test then breaks
    the network); its pid is in ``pid<rank>``.  Returns what it saw: how many
    ops succeeded, how many were wrong, the first error and when (monotonic
    clock, comparable with the test's own), and whether the next all_reduce
    on the broken group failed at once."""
    with open(os.path.join(sync_dir, f"pid{rank}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(sync_dir, f"pid{rank}.tmp"), os.path.join(sync_dir, f"pid{rank}"))
    want = float(sum(range(1, world + 1)))
    x = torch.empty(numel)
    ok = wrong = 0
    error = None
    give_up = time.monotonic() + 3 * timeout_s + 30
    while time.monotonic() < give_up:
        x.fill_(float(rank + 1))
        try:
            dist.all_reduce(x)
        except Exception as e:  # noqa: BLE001
            error = {"type": type(e).__name__, "is_runtime": isinstance(e, RuntimeError), "msg": str(e)[:2000],
                     "at": time.monotonic()}
            break
        if bool(torch.all(x == want)):
            ok += 1
        else:
            wrong += 1
        if ok + wrong == 3:
            _touch(os.path.join(sync_dir, f"ready{rank}"))
    later = None
    if error is not None:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(10))
            later = {"raised": False}
        except Exception as e:  # noqa: BLE001
            later = {"raised": True, "elapsed": time.monotonic() - t0, "msg": str(e)[:500]}
    _touch(os.path.join(sync_dir, f"done{rank}"))
    return {"ok": ok, "wrong": wrong, "error": error, "later": later}
