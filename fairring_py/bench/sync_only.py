"""The "sync only" run of the training benchmarks (bench.moe, bench.pipeline).

The run over torch's fake group times a step's compute with no communication
at all, so "step minus compute only" counts two things: moving the bytes, and
the ranks waiting for one another (a stage for its neighbour's activations,
every expert rank for the slowest one at each all-to-all).  The second is the
model's and the machine's, not the backend's.  The sync-only run separates
them: the same model over a Fairring group whose every exchange (all-to-all,
all-reduce, send, recv) moves one element instead of the tensor, between the
same ranks, in the same order, so every wait stays and almost no byte moves.
Its step is what a backend that moved the bytes for free, but synchronised as
Fairring does, would take; "step minus sync only" is the cost of moving them.

Models call the functions below with their group; for a ``SyncOnly`` group
they make the one-element exchange and leave the output as it is (as the fake
group does).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import fairring_py


class SyncOnly:
    """A process group (Fairring's) whose exchanges move one element each."""

    def __init__(self, group):
        self.group = group


def group_of(group):
    """The process group to pass to torch (SyncOnly's own, or ``group``)."""
    return group.group if isinstance(group, SyncOnly) else group


def _token(like: torch.Tensor, n: int = 1) -> torch.Tensor:
    return torch.zeros(n, dtype=like.dtype, device=like.device)


def all_to_all_single(out, inp, out_splits=None, in_splits=None, group=None):
    if isinstance(group, SyncOnly):
        world = dist.get_world_size(group.group)
        dist.all_to_all_single(_token(inp, world), _token(inp, world), group=group.group)
        return
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)


def all_reduce(t, group=None):
    dist.all_reduce(_token(t) if isinstance(group, SyncOnly) else t, group=group_of(group))


def isend(t, dst, group=None, tag=0):
    return dist.isend(_token(t) if isinstance(group, SyncOnly) else t, dst, group=group_of(group), tag=tag)


def recv(t, src, group=None, tag=0):
    dist.recv(_token(t) if isinstance(group, SyncOnly) else t, src, group=group_of(group), tag=tag)


def add_option(p) -> None:
    p.add_argument("--no-sync-only", dest="sync_only", action="store_false",
                   help="skip the run over a Fairring group whose exchanges move one element each (which splits "
                        "communication into waiting and moving bytes)")


def largest_op_bytes(groups) -> int | None:
    """The most bytes any op of the sync-only group moved (of the last 64 it
    keeps), so that a reader or a test can check that its exchanges are what
    it says; None without one."""
    for g in groups:
        if isinstance(g, SyncOnly):
            return max((r["bytes"] for r in fairring_py.dump_recent(g.group)), default=0)
    return None
