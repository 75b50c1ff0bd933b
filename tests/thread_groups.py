"""Ranks as threads of one process: each thread builds its Fairring group
the way torchft builds its process groups (the backend from
fairring_py's creator, wrapped in a dist.ProcessGroup of its own, with no
default group), on one in-process store.  ``run_threads(fn, world)`` runs
``fn(pg, rank, world)`` on every rank's thread and returns what each
returned; an exception is re-raised, a thread still running at the deadline
fails the test (it cannot be killed: the caller's process is pytest's)."""
from __future__ import annotations

import itertools
import threading
import types
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

import fairring_py

_runs = itertools.count()


def make_group(store, rank: int, world: int, timeout_s: float = 30.0):
    """rank's ProcessGroup over a Fairring backend, on `store` (every rank
    calls it at once: creation is a rendezvous)."""
    opts = types.SimpleNamespace(store=store, group_rank=rank, group_size=world,
                                 timeout=timedelta(seconds=timeout_s))
    backend = fairring_py._create_backend(opts, None)
    pg = dist.ProcessGroup(store, rank, world)
    pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, backend)
    return pg


def run_threads(fn: Callable, world: int, *, timeout_s: float = 60.0, pg_timeout_s: float = 30.0,
                boxed: bool = False) -> list:
    """`boxed`: fn gets a one-element list holding the group instead, and
    may empty it to drop the last reference to the group."""
    store = dist.PrefixStore(f"threads-{next(_runs)}/", dist.HashStore())
    results: list = [None] * world
    errors: list = [None] * world

    def body(rank):
        box = []
        try:
            box.append(make_group(store, rank, world, pg_timeout_s))
            results[rank] = fn(box if boxed else box[0], rank, world)
        except BaseException as e:  # noqa: BLE001
            errors[rank] = e
        finally:
            if box:
                box.pop().shutdown()

    threads = [threading.Thread(target=body, args=(r,), name=f"rank-{r}", daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"ranks still running after {timeout_s} s: {stuck}"
    for rank, e in enumerate(errors):
        if e is not None:
            raise AssertionError(f"rank {rank} (a thread) raised {type(e).__name__}: {e}") from e
    return results
