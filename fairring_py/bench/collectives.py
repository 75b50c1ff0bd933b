"""What the microbenchmark knows of each collective, one record each (as
nccl-tests' testColl): what a size means, the tensors and the exact
expectation of a size, the torch.distributed call and its OpenMPI twin,
the bus-bandwidth factor, the link bound and the words of the report.
worker.py, metrics.py, report.py and __main__.py look a collective up in
BY_NAME instead of switching on its name: adding a collective to the bench
is adding a record to TABLE.

The data is integer-valued float32, so every partial sum is exact in any
order and a result must equal its expectation bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch
import torch.distributed as dist

SEED = 1234

# torch 2.13 deprecates reduce_scatter_tensor / all_gather_into_tensor (a
# FutureWarning on every call site) for reduce_scatter_single / all_gather_single:
# the same backend operations.  Use the new names where torch has them.
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def make_input(rank: int, numel: int, device) -> torch.Tensor:
    """Rank r's data: a shared random base rolled by r positions plus r+1
    (distinct per rank and per position)."""
    g = torch.Generator().manual_seed(SEED + numel)
    base = torch.randint(-1000, 1001, (numel,), generator=g, dtype=torch.int32).to(torch.float32)
    return (torch.roll(base, rank * 97) + (rank + 1)).to(device)


def make_expected(world: int, numel: int, device) -> torch.Tensor:
    """The sum over ranks of make_input, computed without a collective."""
    g = torch.Generator().manual_seed(SEED + numel)
    base = torch.randint(-1000, 1001, (numel,), generator=g, dtype=torch.int32).to(torch.float32)
    out = torch.zeros(numel, dtype=torch.float32)
    for r in range(world):
        out += torch.roll(base, r * 97)
    out += world * (world + 1) // 2
    return out.to(device)


class Tensors(NamedTuple):
    """One rank's tensors for a size: its input, the length of an output,
    the output it must end with (None: nothing is promised on this rank)
    and the elements a size stands for once rounded to whole blocks."""
    inp: torch.Tensor
    out_numel: int
    expected: Optional[torch.Tensor]
    numel: int


@dataclass(frozen=True)
class Collective:
    name: str
    # The worker's job: "allreduce" is the timed sweep of sizes (every sized
    # collective), "barrier" its own loop.
    job: str = "allreduce"
    # (rank, world, numel, device) -> Tensors; None: no tensor, no sizes.
    tensors: Optional[Callable[..., Tensors]] = None
    # The output buffer is the input (reset copies the input in); else the
    # input is never written and an output is reset to NaN.
    in_place: bool = False
    # --fresh-buffers: the new tensor gets the input written in first, in the
    # timed region, as a trainer writes its gradients into new memory.
    fresh_input: bool = False
    # The output is this rank's 1/P of the full reduction (its magnitudes too).
    out_shard: bool = False
    # The torch.distributed call, bound to a backend (its .inp, .group,
    # .fresh_run): the op the timed loop calls as op(buffer, group=...,
    # [async_op=True]).  Bound once, so that an op costs what the call costs.
    call: Optional[Callable] = None
    # The OpenMPI twin, bound to an MpiBackend (.comm, .MPI, .inp): blocking,
    # op(array); and started, op(array) -> Request (None: one at a time only).
    mpi: Optional[Callable] = None
    mpi_start: Optional[Callable] = None
    # busbw = algbw x busbw(P) (nccl-tests), the fraction of the size each
    # rank must send (and receive) in an optimal algorithm.
    busbw: Optional[Callable[[int], float]] = None
    # The link bound: link_share(N, K) x bytes / rate crosses the busiest of
    # N nodes' links (K ranks per node).
    link_share: Optional[Callable[[int, int], float]] = None
    # The report's words: the table's title (a format of dtype, op and api),
    # its busbw and link-bound formulas, several ops in flight.
    title: str = ""
    busbw_text: str = ""
    link_text: str = ""
    plural: str = ""
    op: Optional[str] = None  # the reduction, for the run's metadata
    api: str = ""  # the torch function's name, for the run's metadata
    size_means: str = "bytes of each rank's tensor"
    # Why --inflight is refused ("": taken).
    one_at_a_time: str = ""
    # Options that apply to this collective only: compressed rails
    # (--wire-dtype) and dedicated reduction servers (--servers).
    wire_dtype: bool = False
    servers: bool = False

    @property
    def sized(self) -> bool:
        return self.tensors is not None


# ---------------------------------------------------------------- tensors

def _whole(expected):
    """A collective whose output is as long as its input: every rank's
    input is its whole buffer; ``expected(rank, world, numel, device)``."""
    def tensors(rank, world, numel, device):
        return Tensors(make_input(rank, numel, device), numel, expected(rank, world, numel, device), numel)
    return tensors


def _reduce_scatter(rank, world, numel, device):
    chunk = numel // world
    full = chunk * world
    return Tensors(make_input(rank, full, device), chunk,
                   make_expected(world, full, device)[rank * chunk:(rank + 1) * chunk].clone(), full)


def _all_gather(rank, world, numel, device):
    chunk = numel // world
    return Tensors(make_input(rank, chunk, device), chunk * world,
                   torch.cat([make_input(r, chunk, device) for r in range(world)]), chunk * world)


def _all_to_all(rank, world, numel, device):
    # Block d of every rank's input goes to rank d.
    chunk = numel // world
    full = chunk * world
    return Tensors(make_input(rank, full, device), full,
                   torch.cat([make_input(r, full, device)[rank * chunk:(rank + 1) * chunk] for r in range(world)]),
                   full)


def _gather(rank, world, numel, device):
    # Every rank's piece to rank 0's list (size: the root's whole list).
    chunk = numel // world
    return Tensors(make_input(rank, chunk, device), chunk * world,
                   torch.cat([make_input(r, chunk, device) for r in range(world)]) if rank == 0 else None,
                   chunk * world)


def _scatter(rank, world, numel, device):
    # Rank 0's list, a piece to every rank (size: the root's whole list).
    chunk = numel // world
    inp = make_input(0, chunk * world, device)
    return Tensors(inp, chunk, inp[rank * chunk:(rank + 1) * chunk].clone(), chunk * world)


def _sum_expected(rank, world, numel, device):
    return make_expected(world, numel, device)


def _root_expected(rank, world, numel, device):
    return make_input(0, numel, device)


def _reduce_expected(rank, world, numel, device):
    # c10d leaves a non-root's tensor unspecified (gloo uses it as scratch):
    # only the root's result is checked.
    return make_expected(world, numel, device) if rank == 0 else None


def _send_recv_expected(rank, world, numel, device):
    # Rank 0's message goes to rank 1 and back: rank 1 must end with it (its
    # own input differs); rank 0 gets its own data back; the others idle.
    return make_input(0, numel, device) if rank < 2 else None


# ---------------------------------------------------------------- calls

def _ping_pong(be):
    """Rank 0 sends its input to rank 1, which sends it back; each receives
    into b; other ranks idle.  Reused buffers: rank 0's b holds the input and
    goes both ways.  --fresh-buffers: b is a new tensor every op (as a
    pipeline stage receives its activations), so rank 0 sends the input
    itself."""
    def ping_pong(b, group=None):
        me = dist.get_rank(group)
        if me == 0:
            dist.send(be.inp if be.fresh_run else b, 1, group=group)
            dist.recv(b, 1, group=group)
        elif me == 1:
            dist.recv(b, 0, group=group)
            dist.send(b, 0, group=group)
    return ping_pong


def _mpi_ping_pong(be):
    def ping_pong(a):
        me = be.comm.Get_rank()
        if me == 0:
            be.comm.Send(a, dest=1)
            be.comm.Recv(a, source=1)
        elif me == 1:
            be.comm.Recv(a, source=0)
            be.comm.Send(a, dest=0)
    return ping_pong


def _mpi_reduce(be):
    def reduce(a):
        root = be.comm.Get_rank() == 0
        be.comm.Reduce(be.MPI.IN_PLACE if root else a, a if root else None, op=be.MPI.SUM, root=0)
    return reduce


def _mpi_ireduce(be):
    def ireduce(a):
        root = be.comm.Get_rank() == 0
        return be.comm.Ireduce(be.MPI.IN_PLACE if root else a, a if root else None, op=be.MPI.SUM, root=0)
    return ireduce


# ---------------------------------------------------------------- factors

def _twice_but_own(p):  # all_reduce: 2(P-1)/P
    return 2.0 * (p - 1) / p


def _but_own(p):  # all but one's own share crosses: (P-1)/P
    return (p - 1) / p


def _one(p):  # the whole size: broadcast, reduce
    return 1.0


# ---------------------------------------------------------------- the table

TABLE = (
    Collective(
        "all_reduce", tensors=_whole(_sum_expected),
        in_place=True, fresh_input=True,
        call=lambda be: dist.all_reduce,
        mpi=lambda be: lambda a: be.comm.Allreduce(be.MPI.IN_PLACE, a, op=be.MPI.SUM),
        mpi_start=lambda be: lambda a: be.comm.Iallreduce(be.MPI.IN_PLACE, a, op=be.MPI.SUM),
        # Each node sends (and receives) 2(N-1)/N of the data, whatever the algorithm.
        busbw=_twice_but_own, link_share=lambda n, k: _twice_but_own(n),
        title="all_reduce {dtype} {op}", busbw_text=" x 2(P-1)/P", link_text="2(N-1)/N x ", plural="all-reduces",
        op="SUM", api="all_reduce", wire_dtype=True, servers=True),
    Collective(
        # SUM; a size is each rank's full input (it gets size / P), as nccl-tests.
        "reduce_scatter", tensors=_reduce_scatter, out_shard=True,
        call=lambda be: lambda b, **kw: REDUCE_SCATTER(b, be.inp, **kw),
        mpi=lambda be: lambda a: be.comm.Reduce_scatter_block(be.inp, a, op=be.MPI.SUM),
        mpi_start=lambda be: lambda a: be.comm.Ireduce_scatter_block(be.inp, a, op=be.MPI.SUM),
        # A node's reduced input must leave it except its own share.
        busbw=_but_own, link_share=lambda n, k: _but_own(n),
        title="{api} {dtype} {op} (size: each rank's full input)", busbw_text=" x (P-1)/P",
        link_text="(N-1)/N x ", plural="reduce-scatters", op="SUM", api=REDUCE_SCATTER.__name__,
        size_means="bytes of each rank's full input (it gets size / P)"),
    Collective(
        # A size is each rank's full output (it sends size / P), as nccl-tests.
        "all_gather", tensors=_all_gather,
        call=lambda be: lambda b, **kw: ALL_GATHER(b, be.inp, **kw),
        mpi=lambda be: lambda a: be.comm.Allgather(be.inp, a),
        mpi_start=lambda be: lambda a: be.comm.Iallgather(be.inp, a),
        # A node must receive every other node's share.
        busbw=_but_own, link_share=lambda n, k: _but_own(n),
        title="{api} {dtype} (size: each rank's full output)", busbw_text=" x (P-1)/P", link_text="(N-1)/N x ",
        plural="all-gathers", api=ALL_GATHER.__name__,
        size_means="bytes of each rank's full output (it sends size / P)"),
    Collective(
        "broadcast", tensors=_whole(_root_expected),
        in_place=True, fresh_input=True,
        call=lambda be: lambda b, **kw: dist.broadcast(b, src=0, **kw),
        mpi=lambda be: lambda a: be.comm.Bcast(a, root=0),
        mpi_start=lambda be: lambda a: be.comm.Ibcast(a, root=0),
        # Every other node must receive every byte (and the root's node send it once).
        busbw=_one, link_share=lambda n, k: 1.0,
        title="broadcast {dtype} from rank 0", plural="broadcasts", api="broadcast"),
    Collective(
        "reduce", tensors=_whole(_reduce_expected), in_place=True, fresh_input=True,
        call=lambda be: lambda b, **kw: dist.reduce(b, dst=0, **kw),
        mpi=_mpi_reduce, mpi_start=_mpi_ireduce,
        # The root's node must receive, for every element, at least the other
        # nodes' combined contribution.
        busbw=_one, link_share=lambda n, k: 1.0,
        title="reduce {dtype} {op} to rank 0", plural="reduces", op="SUM", api="reduce"),
    Collective(
        # all_to_all_single with equal blocks; a size is each rank's input.
        "all_to_all", tensors=_all_to_all,
        call=lambda be: lambda b, **kw: dist.all_to_all_single(b, be.inp, **kw),
        mpi=lambda be: lambda a: be.comm.Alltoall(be.inp, a),
        mpi_start=lambda be: lambda a: be.comm.Ialltoall(be.inp, a),
        # All of a rank's input but its own block leaves it; off the node:
        # every rank's blocks for the other nodes, K x (N-1)/N of a size.
        busbw=_but_own, link_share=lambda n, k: k * (n - 1) / n,
        title="all_to_all_single {dtype}, equal blocks (size: each rank's input)", busbw_text=" x (P-1)/P",
        link_text="K x (N-1)/N x ", plural="all-to-alls", api="all_to_all",
        size_means="bytes of each rank's input (and output), a block of size / P per rank"),
    Collective(
        # To rank 0, into a list of views of its buffer.
        "gather", tensors=_gather,
        call=lambda be: lambda b, **kw: dist.gather(be.inp, list(b.chunk(dist.get_world_size(be.group)))
                                                     if dist.get_rank(be.group) == 0 else None, dst=0, **kw),
        mpi=lambda be: lambda a: be.comm.Gather(be.inp, a if be.comm.Get_rank() == 0 else None, root=0),
        mpi_start=lambda be: lambda a: be.comm.Igather(be.inp, a if be.comm.Get_rank() == 0 else None, root=0),
        # All of the root's list but its own piece crosses to it.
        busbw=_but_own, link_share=lambda n, k: _but_own(n),
        title="gather {dtype} to rank 0 (size: the root's whole list)", busbw_text=" x (P-1)/P",
        link_text="(N-1)/N x ", plural="gathers", api="gather",
        size_means="bytes of the root's whole list (each rank sends size / P)"),
    Collective(
        # From rank 0's list.
        "scatter", tensors=_scatter,
        call=lambda be: lambda b, **kw: dist.scatter(b, list(be.inp.chunk(dist.get_world_size(be.group)))
                                                      if dist.get_rank(be.group) == 0 else None, src=0, **kw),
        mpi=lambda be: lambda a: be.comm.Scatter(be.inp if be.comm.Get_rank() == 0 else None, a, root=0),
        mpi_start=lambda be: lambda a: be.comm.Iscatter(be.inp if be.comm.Get_rank() == 0 else None, a, root=0),
        # All of the root's list but its own piece crosses from it.
        busbw=_but_own, link_share=lambda n, k: _but_own(n),
        title="scatter {dtype} from rank 0 (size: the root's whole list)", busbw_text=" x (P-1)/P",
        link_text="(N-1)/N x ", plural="scatters", api="scatter",
        size_means="bytes of the root's whole list (each rank gets size / P)"),
    Collective(
        # In place: rank 1 receives into its buffer and sends it back.
        "send_recv", tensors=_whole(_send_recv_expected), in_place=True,
        call=_ping_pong, mpi=_mpi_ping_pong,
        # The message crosses once each way per op.
        busbw=lambda p: 2.0, link_share=lambda n, k: 2,
        title="send/recv {dtype} ping-pong between ranks 0 and 1 (time per op: a round trip; one way is half)",
        busbw_text=" x 2 (the message crosses each way)", link_text="2 x ", plural="round trips", api="send_recv",
        one_at_a_time="a ping-pong is one message at a time"),
    # Latency only: no tensor, no sizes (worker.run_barrier).
    Collective("barrier", job="barrier"),
)

BY_NAME = {c.name: c for c in TABLE}
NAMES = [c.name for c in TABLE]
