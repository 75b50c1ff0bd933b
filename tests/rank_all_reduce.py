"""Code that runs inside the ranks (spawned by launch.run_ranks).

`session(rank, world_size, sections, cfg)` runs several named checks in one
process group and returns {section: {"failures": [...], ...}}; an exception in
one section is recorded as a failure of that section and the next section
still runs, so one launch reports on many features.
"""
from __future__ import annotations

import copy
import datetime
import io
import os
import socket
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import launch
import refs
from refs import compare, digest, make_input, op_of, reference

MAX_FAILURES = 40


class Failures(list):
    def add(self, msg):
        if len(self) < MAX_FAILURES:
            self.append(msg)
        elif len(self) == MAX_FAILURES:
            self.append("... (more failures not shown)")


def _case_name(dtype, op, n, extra=""):
    return f"{refs.dtype_name(dtype)}/{op}/n={n}{extra}"


def _run_case(rank, world, seed, dtype, op, n, failures, digests, repeat=False, group=None, members=None):
    members = members if members is not None else list(range(world))
    inputs = [make_input(seed, r, n, dtype, op) for r in members]
    me = members.index(rank)
    t = inputs[me].clone()
    name = _case_name(dtype, op, n)
    try:
        dist.all_reduce(t, op=op_of(op), group=group)
    except Exception as e:  # noqa: BLE001
        failures.add(f"{name}: raised {type(e).__name__}: {str(e)[:300]}")
        return None
    ref = reference(inputs, dtype, op)
    err = compare(t, inputs, ref, dtype, op)
    if err:
        failures.add(f"{name}: {err}")
    d = digest(t)
    if digests is not None:
        digests[name] = d
    if repeat:
        t2 = inputs[me].clone()
        dist.all_reduce(t2, op=op_of(op), group=group)
        if digest(t2) != d:
            failures.add(f"{name}: repeated all_reduce of the same inputs gave different bits")
    return t


# --------------------------------------------------------------------------
# sections


def sec_correctness(rank, world, cfg):
    failures, digests = Failures(), {}
    sizes = cfg.get("sizes", refs.SIZES)
    seed = cfg.get("seed", 1)
    for ci, (dtype, op) in enumerate(refs.matrix()):
        for n in sizes:
            repeat = dtype in refs.FLOAT_DTYPES and op in ("SUM", "AVG", "PRODUCT") and n >= 1031
            _run_case(rank, world, seed * 100_000 + ci * 100 + n % 97, dtype, op, n, failures, digests, repeat)
    for dtype, op in cfg.get("big", [(torch.float32, "SUM")]):
        _run_case(rank, world, seed * 7 + 3, dtype, op, refs.BIG, failures, digests, repeat=True)
    return {"failures": failures, "digests": digests}


def sec_unsupported(rank, world, cfg):
    """Unsupported (op, dtype) pairs raise RuntimeError naming op and dtype;
    PREMUL_SUM on floats works."""
    failures = Failures()
    dtype_names = {
        torch.int32: ("int32", "int", "Int"),
        torch.float32: ("float32", "float", "Float"),
        torch.bool: ("bool", "Bool"),
        torch.int64: ("int64", "long", "Long"),
    }
    cases = [
        ("AVG", torch.int32, dist.ReduceOp.AVG, "AVG"),
        ("AVG", torch.int64, dist.ReduceOp.AVG, "AVG"),
        ("AVG", torch.bool, dist.ReduceOp.AVG, "AVG"),
        ("BAND", torch.float32, dist.ReduceOp.BAND, "BAND"),
        ("BXOR", torch.float32, dist.ReduceOp.BXOR, "BXOR"),
    ]
    try:
        premul = dist._make_nccl_premul_sum(2.0)
        cases.append(("PREMUL_SUM", torch.int32, premul, "PREMUL_SUM"))  # floating types only
    except Exception as e:  # noqa: BLE001
        failures.add(f"cannot build PREMUL_SUM op in this torch: {e}")
    for label, dtype, op, opname in cases:
        t = torch.ones(17, dtype=dtype)
        try:
            dist.all_reduce(t, op=op)
        except RuntimeError as e:
            msg = str(e)
            if opname.lower() not in msg.lower() and not (opname == "PREMUL_SUM" and "premul" in msg.lower()):
                failures.add(f"{label} on {dtype}: message does not name the op: {msg[:300]!r}")
            if opname != "PREMUL_SUM" and not any(n.lower() in msg.lower() for n in dtype_names[dtype]):
                failures.add(f"{label} on {dtype}: message does not name the dtype: {msg[:300]!r}")
            continue
        except Exception as e:  # noqa: BLE001
            failures.add(f"{label} on {dtype}: raised {type(e).__name__} (expected RuntimeError): {str(e)[:300]}")
            continue
        failures.add(f"{label} on {dtype}: did not raise")
    # PREMUL_SUM itself is supported: each rank's tensor times the factor, summed.
    t = torch.full((17,), float(rank + 1))
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
    if not torch.equal(t, torch.full((17,), float(world * (world + 1)))):
        failures.add(f"PREMUL_SUM(2.0) all_reduce of rank + 1: got {t[:3].tolist()}")
    return {"failures": failures}


def sec_noncontig(rank, world, cfg):
    failures, digests = Failures(), {}
    seed = cfg.get("seed", 1) + 555

    def check_view(label, make_base, make_view, dtype, op, seed_):
        # Build each rank's view contents deterministically, write them into a
        # base tensor filled with a sentinel, reduce the view, check the view
        # and that the rest of the base is untouched.
        views_in = []
        for r in range(world):
            base = make_base()
            v = make_view(base)
            views_in.append(make_input(seed_, r, v.numel(), dtype, op).reshape(v.shape))
        base = make_base()
        sentinel = base.clone()
        v = make_view(base)
        v.copy_(views_in[rank])
        before = base.clone()
        try:
            dist.all_reduce(v, op=op_of(op))
        except Exception as e:  # noqa: BLE001
            failures.add(f"{label}: raised {type(e).__name__}: {str(e)[:300]}")
            return
        flat_inputs = [x.reshape(-1) for x in views_in]
        ref = reference(flat_inputs, dtype, op)
        err = compare(v.reshape(-1).clone(), flat_inputs, ref, dtype, op)
        if err:
            failures.add(f"{label}: {err}")
        # elements outside the view are untouched
        mask = torch.ones_like(sentinel, dtype=torch.bool)
        make_view(mask).fill_(False)
        if not torch.equal(base[mask], before[mask]):
            failures.add(f"{label}: elements outside the view were modified")
        digests[label] = digest(v)

    f32, bf16, i32, f64 = torch.float32, torch.bfloat16, torch.int32, torch.float64
    cases = [
        ("strided[:, ::2] f32 SUM", lambda: torch.full((37, 106), -7.0, dtype=f32), lambda b: b[:, ::2], f32, "SUM"),
        ("strided[:, ::2] bf16 AVG", lambda: torch.full((37, 106), -7.0, dtype=bf16), lambda b: b[:, ::2], bf16, "AVG"),
        ("strided[:, ::2] i32 BXOR", lambda: torch.full((37, 106), -7, dtype=i32), lambda b: b[:, ::2], i32, "BXOR"),
        ("transposed f32 SUM", lambda: torch.full((53, 91), -7.0, dtype=f32), lambda b: b.t(), f32, "SUM"),
        ("transposed f64 MAX", lambda: torch.full((53, 91), -7.0, dtype=f64), lambda b: b.t(), f64, "MAX"),
        ("offset view f32 SUM", lambda: torch.full((5000,), -7.0, dtype=f32), lambda b: b[7:4007], f32, "SUM"),
        ("big strided f32 SUM", lambda: torch.full((1001, 1000), -7.0, dtype=f32), lambda b: b[::2, 1::3], f32, "SUM"),
        ("3-d permuted i32 SUM", lambda: torch.full((6, 7, 8), -7, dtype=i32), lambda b: b.permute(2, 0, 1), i32, "SUM"),
    ]
    for i, (label, mb, mv, dt, op) in enumerate(cases):
        check_view(label, mb, mv, dt, op, seed + i)

    # 0-dim tensor and contiguous 2-d tensor
    vals = [torch.tensor(float(r + 1) * 1.5, dtype=torch.float32) for r in range(world)]
    t = vals[rank].clone()
    try:
        dist.all_reduce(t)
        if t.item() != sum(float(v) for v in vals):
            failures.add(f"0-dim tensor: got {t.item()} expected {sum(float(v) for v in vals)}")
    except Exception as e:  # noqa: BLE001
        failures.add(f"0-dim tensor: raised {type(e).__name__}: {str(e)[:300]}")
    return {"failures": failures, "digests": digests}


def sec_empty(rank, world, cfg):
    """all_reduce of an empty tensor is a no-op that must not hang or break the
    group (run last: a hang here would poison later sections)."""
    failures = Failures()
    for dt in (torch.float32, torch.int64):
        e_t = torch.empty(0, dtype=dt)
        try:
            w = dist.all_reduce(e_t, async_op=True)
            w.wait(timeout=timedelta(seconds=20))
        except Exception as e:  # noqa: BLE001
            failures.add(f"empty {dt} tensor: raised {type(e).__name__}: {str(e)[:300]}")
            return {"failures": failures}
    f = Failures()
    _run_case(rank, world, 99, torch.float32, "SUM", 1031, f, None)
    for m in f:
        failures.add(f"all_reduce after empty tensors: {m}")
    return {"failures": failures}


def sec_half_range(rank, world, cfg):
    """float16 AVG where a sum is past float16's largest (65504) and the
    average is not: all_reduce, reduce to every root and reduce_scatter.
    Every rank holding 40000, a node's sum of two ranks is past it; then
    random values up to 60000 against the float64 average of every rank's
    (each rank makes every rank's input from its seed).  A node of several
    ranks divides its sum (in float) before it holds it in float16: by its
    rank count on equal nodes, then the rails by the node count; by the
    world on unequal ones, where a rank alone on its node divides its input
    (reduce_op.h, avg_divisors).  Rails in levels keep 16-bit floats direct.
    cfg["device"]: where the tensors live (the GPU checks pass theirs)."""
    failures = Failures()
    dev = cfg.get("device", "cpu")

    def inputs(numel, seed):
        if seed is None:
            return [torch.full((numel,), 40000.0, dtype=torch.float16) for _ in range(world)]
        gens = [torch.Generator().manual_seed(seed * 1000 + r) for r in range(world)]
        return [((torch.rand(numel, generator=g, dtype=torch.float64) * 2 - 1) * 60000).half() for g in gens]

    def check(what, got, xs):
        got = got.cpu()
        ref = torch.stack([x.double() for x in xs]).mean(0)
        # Rounded to float16 once per node and once at the end: a few units
        # in the last place of values up to 65504 (32 each).
        tol = 32.0 * (len(xs) + 2)
        err = (got.double() - ref).abs()
        bad = ~(err <= tol)  # inf and NaN are bad too
        if bad.any():
            i = int(bad.nonzero()[0])
            failures.add(f"{what}: {int(bad.sum())} of {got.numel()} wrong, e.g. [{i}] = {got[i].item()} "
                         f"for the average {ref[i].item():.1f}")

    for seed in (None, 7):
        for numel in (1, 1031, 65537, 262147):
            name = f"float16 AVG of {'40000 on every rank' if seed is None else 'random values'}, {numel} elements"
            xs = inputs(numel, seed)
            t = xs[rank].to(dev, copy=True)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            check(f"all_reduce {name}", t, xs)
            if numel > 65537:
                continue
            # (reduce is Fairring's own on CPU tensors; CUDA ones go to gloo, which takes none)
            for root in range(world if dev == "cpu" else 0):
                t = xs[rank].to(dev, copy=True)
                dist.reduce(t, dst=root, op=dist.ReduceOp.AVG)
                if rank == root:
                    check(f"reduce to {root} {name}", t, xs)
                elif not torch.equal(t.cpu(), xs[rank]):
                    failures.add(f"reduce to {root} {name}: rank {rank}'s input changed")
            # world blocks of numel each: rank r gets the average of block r.
            blocks = inputs(numel * world, seed)
            inp = blocks[rank].to(dev, copy=True)
            out = torch.empty(numel, dtype=torch.float16, device=dev)
            dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG)
            check(f"reduce_scatter {name}", out, [b[rank * numel:(rank + 1) * numel] for b in blocks])
            if not torch.equal(inp.cpu(), blocks[rank]):
                failures.add(f"reduce_scatter {name}: rank {rank}'s input changed")
    _half_avg_precision(rank, world, dev, failures)
    return {"failures": failures}


def _half_avg_bound_ulps(topo):
    """How far a float16 AVG of inputs in [2^-14, 2^-13) may stray from the
    exact average, in units of 2^-24 (the spacing there and among the
    subnormals below), by where it divides (reduce_op.h, avg_divisors).
    Divided once (one node, one rank a node): one rounding, half a unit.
    Equal nodes of several ranks: each node's average rounded (half a unit;
    the rails average those errors) and the rails' average rounded: one.
    Uneven nodes: each node's sum divided by the world is rounded among the
    subnormals (half a unit each), the rails add N of them and round: (N + 1)
    / 2.  Dividing every input by the world first (NCCL's way) reaches two
    units at 2 x 2; dividing by the world at equal nodes, 1.5 at 3 x 2 and
    two at 4 x 2."""
    if topo["num_nodes"] == 1 or (topo["ranks_per_node"] == 1 and not topo["uneven"]):
        return 0.5
    if not topo["uneven"]:
        return 1.0
    return (topo["num_nodes"] + 1) / 2


def _half_avg_precision(rank, world, dev, failures):
    """float16 AVG of small normal inputs against the float64 average, to the
    bound of the path the group takes (_half_avg_bound_ulps)."""
    bound = _half_avg_bound_ulps(dict(_cpu_backend().topology())) * 2.0 ** -24

    def inputs(numel, seed):
        gens = [torch.Generator().manual_seed(seed * 1000 + r) for r in range(world)]
        return [((torch.rand(numel, generator=g, dtype=torch.float64) + 1) * 2.0 ** -14).half() for g in gens]

    def check(what, got, xs):
        ref = torch.stack([x.double() for x in xs]).mean(0)
        err = (got.cpu().double() - ref).abs()
        worst = float(err.max())
        if not worst <= bound * (1 + 1e-6):
            failures.add(f"{what}: {int((err > bound).sum())} of {got.numel()} elements off the average by more "
                         f"than {bound / 2.0 ** -24} x 2^-24, the worst {worst / 2.0 ** -24:.2f} x 2^-24")

    for numel in (1, 1031, 65537):
        name = f"float16 AVG of values in [2^-14, 2^-13), {numel} elements"
        xs = inputs(numel, 11 + numel)
        t = xs[rank].to(dev, copy=True)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        check(f"all_reduce {name}", t, xs)
        for root in range(world if dev == "cpu" else 0):
            t = xs[rank].to(dev, copy=True)
            dist.reduce(t, dst=root, op=dist.ReduceOp.AVG)
            if rank == root:
                check(f"reduce to {root} {name}", t, xs)
        blocks = inputs(numel * world, 13 + numel)
        out = torch.empty(numel, dtype=torch.float16, device=dev)
        dist.reduce_scatter_tensor(out, blocks[rank].to(dev, copy=True), op=dist.ReduceOp.AVG)
        check(f"reduce_scatter {name}", out, [b[rank * numel:(rank + 1) * numel] for b in blocks])


def sec_shm(rank, world, cfg):
    failures = Failures()
    # make sure some traffic went through (also when run alone)
    t = torch.ones(100_003)
    dist.all_reduce(t)
    maps = launch.own_shm_mappings()
    names = [n for n, _ in maps]
    for name, deleted in maps:
        if not deleted:
            failures.add(f"/proc/self/maps maps /dev/shm/{name} which is not unlinked")
        if os.path.exists(os.path.join("/dev/shm", name)):
            failures.add(f"/dev/shm/{name} still exists while the job runs")
    # This rank's own node (uneven nodes keep their shared memory too).
    topo = dict(_cpu_backend().topology()) if hasattr(_cpu_backend(), "topology") else {}
    local = topo.get("ranks_per_node", cfg.get("local_ranks", 1))
    if local >= 2 and not maps:
        failures.add(
            f"rank {rank} shares a node with {local - 1} other rank(s) but maps no "
            f"'/dev/shm/fairring-*' segment (expected a '(deleted)' mapping)"
        )
    return {"failures": failures, "names": names}


def _cpu_backend(group=None):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return pg._get_backend(torch.device("cpu"))


def sec_listen(rank, world, cfg):
    failures = Failures()
    addr = None
    topo = None
    try:
        be = _cpu_backend()
        addr = be.listen_address()
        if hasattr(be, "topology"):  # introspection helper of this implementation
            topo = dict(be.topology())
    except Exception as e:  # noqa: BLE001
        failures.add(f"listen_address() raised {type(e).__name__}: {e}")
    return {"failures": failures, "addr": addr, "topology": topo}


def sec_async(rank, world, cfg):
    failures = Failures()
    dts = [torch.float32, torch.bfloat16, torch.int64, torch.float64, torch.float16, torch.int32, torch.uint8]
    sizes = [1, 7, 1000, 4099, 65537, 262147, 17, 3, 131]
    specs = []
    for i in range(64):
        dt = dts[i % len(dts)]
        ops = refs.ops_for(dt)
        specs.append((dt, ops[(i // len(dts)) % len(ops)], sizes[i % len(sizes)], 9000 + i))
    inputs, tensors, works = [], [], []
    for dt, op, n, seed in specs:
        ins = [make_input(seed, r, n, dt, op) for r in range(world)]
        t = ins[rank].clone()
        w = dist.all_reduce(t, op=op_of(op), async_op=True)
        inputs.append(ins)
        tensors.append(t)
        works.append(w)
    if len(works) != len(specs) or any(w is None for w in works):
        failures.add("all_reduce(async_op=True) did not return Work objects")
        return {"failures": failures}
    for i, (w, t, (dt, op, n, seed)) in enumerate(zip(works, tensors, specs)):
        name = f"async #{i} {_case_name(dt, op, n)}"
        try:
            if i % 3 == 0:
                w.wait()
            elif i % 3 == 1:
                ok = w.wait(timeout=timedelta(seconds=60))
                if ok is False:
                    failures.add(f"{name}: wait(timeout) returned False")
            else:
                v = w.get_future().wait()
                if not isinstance(v, list) or len(v) != 1 or not isinstance(v[0], torch.Tensor):
                    failures.add(f"{name}: get_future().wait() value is {type(v)} {v!r:.100}, expected [tensor]")
                elif not torch.equal(v[0], t):
                    failures.add(f"{name}: future value differs from the reduced tensor")
        except Exception as e:  # noqa: BLE001
            failures.add(f"{name}: raised {type(e).__name__}: {str(e)[:300]}")
            continue
        if not w.is_completed():
            failures.add(f"{name}: is_completed() False after wait")
        err = compare(t, inputs[i], reference(inputs[i], dt, op), dt, op)
        if err:
            failures.add(f"{name}: {err}")
    # wait() on an op the loop thread ran (several slices), its future not
    # taken before: the future is complete when wait() returns (it may be
    # completed on the loop thread itself, before the Work).
    # On one node such an op runs on the caller's thread once the peers are
    # in (its first slice); a late peer makes the others hand it, slices
    # and all, to their loop thread: each rank late once.
    for late in range(world):
        big = torch.full((3 * (1 << 20) // 4 + 7,), float(rank + 1))
        if rank == late:
            time.sleep(0.02)
        w = dist.all_reduce(big, async_op=True)
        w.wait()
        fut = w.get_future()
        if not fut.done():
            failures.add(f"3 MiB all_reduce, rank {late} late: get_future().done() False right after wait()")
        elif not torch.equal(fut.value()[0], torch.full_like(big, float(sum(range(1, world + 1))))):
            failures.add(f"3 MiB all_reduce, rank {late} late: future value is not the sum")
    # futures with callbacks, while others are pending
    ts = [torch.full((5000,), float(rank + i)) for i in range(8)]
    futs = [dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0].sum().item()) for t in ts]
    for i, f in enumerate(futs):
        got = f.wait()
        exp = 5000.0 * sum(float(r + i) for r in range(world))
        if got != exp:
            failures.add(f"future.then #{i}: got {got} expected {exp}")
    # A callback that issues a delegated collective (as a DDP comm hook may),
    # with and without further all_reduces queued behind its own: no deadlock.
    # The callback may run at then() (the op already done) or later on the
    # engine's completion thread, so the all_reduces are issued before it is
    # chained: then its broadcast comes after them on every rank.
    for queued_behind in (0, 3):
        b = torch.full((10,), float(rank))
        head = dist.all_reduce(torch.ones(1000), async_op=True)
        rest = [dist.all_reduce(torch.ones(1000), async_op=True) for _ in range(queued_behind)]
        chained = head.get_future().then(lambda f, b=b: dist.broadcast(b, src=0) or b.clone())
        try:
            got = chained.wait()
            for w in rest:
                w.wait()
            if not torch.equal(got, torch.zeros(10)):
                failures.add(f"broadcast inside a future callback ({queued_behind} queued): got {got}")
        except Exception as e:  # noqa: BLE001
            failures.add(f"broadcast inside a future callback ({queued_behind} queued) raised {e!r:.300}")
    # A non-contiguous leaf that requires grad is reduced in place too.
    leaf = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1)).t().requires_grad_()
    try:
        dist.all_reduce(leaf)
        exp = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * sum(range(1, world + 1))
        if not torch.equal(leaf.detach(), exp):
            failures.add(f"non-contiguous leaf requiring grad: got {leaf.detach()}")
    except Exception as e:  # noqa: BLE001
        failures.add(f"non-contiguous leaf requiring grad raised {e!r:.300}")
    return {"failures": failures}


def sec_late_peer(rank, world, cfg):
    """A small all_reduce must not wait for late peers inside the call.  Rank 0
    issues it, then serves a gloo broadcast that the others wait for before
    they join: if the call blocked until they joined, this would deadlock."""
    failures = Failures()
    gloo = dist.new_group(backend="gloo")
    for n in (1, 1000, 16387):
        t = torch.full((n,), float(rank + 1))
        flag = torch.zeros(1)
        try:
            if rank == 0:
                w = dist.all_reduce(t, async_op=True)
                flag.fill_(1.0)
                dist.broadcast(flag, src=0, group=gloo)
                w.wait()
            else:
                dist.broadcast(flag, src=0, group=gloo)
                time.sleep(0.05)  # well past the caller's spin: rank 0's op is on its engine thread now
                dist.all_reduce(t)
        except Exception as e:  # noqa: BLE001
            failures.add(f"n={n}: raised {type(e).__name__}: {str(e)[:300]}")
            continue
        want = float(sum(range(1, world + 1)))
        if flag.item() != 1.0 or not torch.equal(t, torch.full((n,), want)):
            failures.add(f"n={n}: got {t[:3].tolist()} (flag {flag.item()}), expected {want}")
    # The same late start, then back-to-back small ops (some may run on the
    # caller's thread, some behind the handed-over one): all in order.
    if rank != 0:
        time.sleep(0.05)
    ts = [torch.full((100 + i,), float(rank + i)) for i in range(20)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for i, (w, t) in enumerate(zip(works, ts)):
        w.wait()
        want = float(sum(r + i for r in range(world)))
        if not torch.equal(t, torch.full_like(t, want)):
            failures.add(f"back-to-back #{i}: got {t[:3].tolist()}, expected {want}")
    return {"failures": failures}


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.ReLU(),
            torch.nn.Linear(64, 64), torch.nn.ReLU(),
            torch.nn.Linear(64, 48), torch.nn.ReLU(),
            torch.nn.Linear(48, 32), torch.nn.ReLU(),
            torch.nn.Linear(32, 4),
        )

    def forward(self, x):
        return self.net(x)


def sec_ddp(rank, world, cfg):
    from torch.nn.parallel import DistributedDataParallel as DDP

    failures = Failures()
    torch.manual_seed(1234)  # identical init on every rank
    base = _MLP()
    init_params = [p.detach().clone() for p in base.parameters()]
    gloo = dist.new_group(backend="gloo")
    m_f, m_g = copy.deepcopy(base), copy.deepcopy(base)
    ddp_f = DDP(m_f, bucket_cap_mb=0.01)
    ddp_g = DDP(m_g, bucket_cap_mb=0.01, process_group=gloo)
    opt_f = torch.optim.SGD(m_f.parameters(), lr=0.05, momentum=0.9)
    opt_g = torch.optim.SGD(m_g.parameters(), lr=0.05, momentum=0.9)
    for step in range(5):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(32, 16, generator=g)
        y = torch.randn(32, 4, generator=g)
        for ddp, opt in ((ddp_f, opt_f), (ddp_g, opt_g)):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
    for (name, pf), pg_, p0 in zip(m_f.named_parameters(), m_g.parameters(), init_params):
        if not torch.allclose(pf, pg_, rtol=1e-5, atol=1e-6):
            failures.add(f"param {name}: fairring vs gloo max diff {(pf - pg_).abs().max().item():.3g}")
        if torch.equal(pf, p0):
            failures.add(f"param {name}: unchanged by training (test is vacuous)")
    dig = digest(torch.cat([p.detach().reshape(-1) for p in m_f.parameters()]))
    return {"failures": failures, "digest": dig}


def sec_subgroups(rank, world, cfg):
    failures = Failures()
    specs = [([0, 2], "fairring"), ([0, 1], "fairring"), ([1, 2, 3], "fairring"), ([0, 1, 2, 3], "fairring"), ([0, 3], None)]
    groups = []
    for ranks, backend in specs:
        kw = {"backend": backend} if backend else {}
        groups.append(dist.new_group(ranks, **kw))
    for gi, ((ranks, backend), g) in enumerate(zip(specs, groups)):
        if rank not in ranks:
            continue
        if dist.get_world_size(g) != len(ranks) or dist.get_rank(g) != ranks.index(rank):
            failures.add(f"group {ranks}: size/rank {dist.get_world_size(g)}/{dist.get_rank(g)}")
        for ci, (dt, op, n) in enumerate([(torch.float32, "SUM", 4099), (torch.int64, "BXOR", 1031),
                                           (torch.bfloat16, "AVG", 65537), (torch.float64, "MIN", 3)]):
            f = Failures()
            _run_case(rank, world, 777 + 10 * gi + ci, dt, op, n, f, None, group=g, members=ranks)
            for m in f:
                failures.add(f"group {ranks} (backend={backend}): {m}")
    # the default group still works after subgroup traffic
    f = Failures()
    _run_case(rank, world, 4242, torch.float32, "SUM", 10007, f, None)
    for m in f:
        failures.add(f"default group after subgroups: {m}")
    return {"failures": failures}


def sec_collectives(rank, world, cfg):
    failures = Failures()

    def check(name, fn):
        try:
            msg = fn()
            if msg:
                failures.add(f"{name}: {msg}")
        except Exception as e:  # noqa: BLE001
            failures.add(f"{name}: raised {type(e).__name__}: {str(e)[:300]}")

    def val(r, n=10, dtype=torch.float32):
        return torch.arange(n, dtype=dtype) + 100 * r

    def broadcast():
        t = val(rank)
        dist.broadcast(t, src=world - 1)
        return None if torch.equal(t, val(world - 1)) else f"got {t}"

    def all_gather():
        out = [torch.empty(10) for _ in range(world)]
        dist.all_gather(out, val(rank))
        return None if all(torch.equal(o, val(r)) for r, o in enumerate(out)) else f"got {out}"

    def all_gather_into_tensor():
        out = torch.empty(10 * world)
        dist.all_gather_into_tensor(out, val(rank))
        return None if torch.equal(out, torch.cat([val(r) for r in range(world)])) else f"got {out}"

    def reduce():
        t = val(rank)
        dist.reduce(t, dst=1 % world, op=dist.ReduceOp.SUM)
        if rank == 1 % world:
            exp = sum(val(r) for r in range(world))
            return None if torch.equal(t, exp) else f"got {t} expected {exp}"

    def reduce_scatter():
        out = torch.empty(10)
        dist.reduce_scatter(out, [val(rank) + j for j in range(world)])
        exp = sum(val(r) + rank for r in range(world))
        return None if torch.equal(out, exp) else f"got {out} expected {exp}"

    def reduce_scatter_tensor():
        out = torch.empty(10)
        dist.reduce_scatter_tensor(out, torch.cat([val(rank) + j for j in range(world)]))
        exp = sum(val(r) + rank for r in range(world))
        return None if torch.equal(out, exp) else f"got {out} expected {exp}"

    def gather():
        dst = world - 1
        out = [torch.empty(10) for _ in range(world)] if rank == dst else None
        dist.gather(val(rank), out, dst=dst)
        if rank == dst:
            return None if all(torch.equal(o, val(r)) for r, o in enumerate(out)) else f"got {out}"

    def scatter():
        src = 1 % world
        out = torch.empty(10)
        dist.scatter(out, [val(j) for j in range(world)] if rank == src else None, src=src)
        return None if torch.equal(out, val(rank)) else f"got {out}"

    def all_to_all():
        out = [torch.empty(10) for _ in range(world)]
        dist.all_to_all(out, [val(rank) + 1000 * j for j in range(world)])
        ok = all(torch.equal(out[j], val(j) + 1000 * rank) for j in range(world))
        return None if ok else f"got {out}"

    def all_to_all_single():
        out = torch.empty(10 * world)
        dist.all_to_all_single(out, torch.cat([val(rank) + 1000 * j for j in range(world)]))
        exp = torch.cat([val(j) + 1000 * rank for j in range(world)])
        return None if torch.equal(out, exp) else f"got {out}"

    def send_recv():
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        out = torch.empty(10)
        reqs = [dist.isend(val(rank), nxt), dist.irecv(out, prv)]
        for r in reqs:
            r.wait()
        if not torch.equal(out, val(prv)):
            return f"isend/irecv got {out}"
        # blocking send/recv, even ranks first
        out2 = torch.empty(10)
        if rank % 2 == 0:
            if rank + 1 < world:
                dist.send(val(rank), rank + 1)
                dist.recv(out2, rank + 1)
                if not torch.equal(out2, val(rank + 1)):
                    return f"recv got {out2}"
        else:
            dist.recv(out2, rank - 1)
            dist.send(val(rank), rank - 1)
            if not torch.equal(out2, val(rank - 1)):
                return f"recv got {out2}"

    def barrier():
        # Native on a CPU group: it waits for the last rank to arrive ...
        if rank == world - 1:
            time.sleep(0.3)
        t0 = time.monotonic()
        dist.barrier()
        waited = time.monotonic() - t0
        if rank != world - 1 and waited < 0.2:
            return f"barrier returned after {waited:.3f} s, before the last rank arrived (0.3 s late)"
        # ... and after every collective issued before it.
        w = dist.all_reduce(torch.ones(1 << 20), async_op=True)
        dist.barrier()
        if not w.is_completed():
            return "barrier returned before an all_reduce issued before it had completed"
        dist.barrier(async_op=True).wait()

    def objects():
        out = [None] * world
        dist.all_gather_object(out, {"rank": rank})
        if out != [{"rank": r} for r in range(world)]:
            return f"all_gather_object got {out}"
        lst = [rank * 10]
        dist.broadcast_object_list(lst, src=0)
        if lst != [0]:
            return f"broadcast_object_list got {lst}"

    for name, fn in [
        ("broadcast", broadcast), ("all_gather", all_gather), ("all_gather_into_tensor", all_gather_into_tensor),
        ("reduce", reduce), ("reduce_scatter", reduce_scatter), ("reduce_scatter_tensor", reduce_scatter_tensor),
        ("gather", gather), ("scatter", scatter), ("all_to_all", all_to_all), ("all_to_all_single", all_to_all_single),
        ("send_recv", send_recv), ("barrier", barrier), ("objects", objects),
    ]:
        check(name, fn)
    # all_reduce still works after the delegated collectives
    f = Failures()
    _run_case(rank, world, 31337, torch.float32, "SUM", 65537, f, None)
    for m in f:
        failures.add(f"all_reduce after other collectives: {m}")
    return {"failures": failures}


def sec_intruder(rank, world, cfg):
    """Connect to a peer's listener without the group secret: it must close the
    connection, and the job goes on."""
    failures = Failures()
    addr = _cpu_backend().listen_address()
    addrs = [None] * world
    dist.all_gather_object(addrs, addr)
    target = addrs[(rank + 1) % world]
    if not target:
        failures.add(f"listen_address() of rank {(rank + 1) % world} is empty in a multi-node job")
        return {"failures": failures}
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    results = {}
    # 1) garbage handshake -> closed
    s = socket.create_connection((host, int(port)), timeout=10)
    try:
        s.sendall(os.urandom(64))
        s.settimeout(10)
        t0 = time.monotonic()
        try:
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            results["garbage"] = ("eof", time.monotonic() - t0, len(data))
        except (ConnectionResetError, BrokenPipeError):
            results["garbage"] = ("reset", time.monotonic() - t0, 0)
        except socket.timeout:
            results["garbage"] = ("timeout", time.monotonic() - t0, 0)
            failures.add(f"listener {target} kept an intruder connection (garbage handshake) open for 10 s")
    finally:
        s.close()
    # 2) a silent intruder stays connected while the job runs an all_reduce
    s2 = socket.create_connection((host, int(port)), timeout=10)
    try:
        f = Failures()
        _run_case(rank, world, 2024, torch.float32, "SUM", 65537, f, None)
        _run_case(rank, world, 2025, torch.int32, "BXOR", 1031, f, None)
        for m in f:
            failures.add(f"all_reduce with an intruder connected: {m}")
    finally:
        s2.close()
    dist.barrier()
    f = Failures()
    _run_case(rank, world, 2026, torch.float64, "SUM", 4099, f, None)
    for m in f:
        failures.add(f"all_reduce after intruders: {m}")
    return {"failures": failures, "results": results}


def sec_broadcast(rank, world, cfg):
    """broadcast from every root: the root's exact bits on every rank (every dtype,
    odd sizes, NaN payloads and -0.0), the root's tensor unchanged, non-contiguous
    tensors, and a mismatched root reported on every rank."""
    failures = Failures()
    sizes = cfg.get("sizes", [1, 13, 1031, 65537, 262147])

    def data(r, n, dtype, seed):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        raw = torch.randint(0, 256, (n * torch.empty(0, dtype=dtype).element_size(),), dtype=torch.uint8, generator=g)
        return raw.view(dtype) if dtype != torch.bool else raw % 2 == 1

    for i, dtype in enumerate(refs.ALL_DTYPES):
        for j, n in enumerate(sizes):
            root = (i + j) % world
            seed = 17 * i + j
            t = data(rank, n, dtype, seed)
            want = data(root, n, dtype, seed)
            dist.broadcast(t, src=root)
            if not torch.equal(t.view(torch.uint8), want.view(torch.uint8)):
                failures.add(f"{refs.dtype_name(dtype)}/n={n}/root={root}: bytes differ from the root's")
    # Special floats keep their bits (an OR with zeros changes none).
    special = torch.tensor([-0.0, float("nan"), float("-inf"), 1e-45, -3.5], dtype=torch.float32)
    t = special.clone() if rank == 0 else torch.full((5,), 7.0)
    dist.broadcast(t, src=0)
    if not torch.equal(t.view(torch.int32), special.view(torch.int32)):
        failures.add(f"special floats: got {t.view(torch.int32).tolist()}, want {special.view(torch.int32).tolist()}")
    # Non-contiguous on every rank; async.
    base = torch.arange(40, dtype=torch.float64).reshape(5, 8) * (rank + 1)
    view = base[:, ::3]
    want = (torch.arange(40, dtype=torch.float64).reshape(5, 8) * world)[:, ::3]
    dist.broadcast(view, src=world - 1, async_op=True).wait()
    if not torch.equal(view, want):
        failures.add(f"non-contiguous: got {view.tolist()}")
    if rank != world - 1 and not torch.equal(base[:, 1], torch.arange(40, dtype=torch.float64).reshape(5, 8)[:, 1] * (rank + 1)):
        failures.add("non-contiguous: elements outside the view changed")
    # They run on Fairring, not on its gloo group, large ones too (several
    # slices: rank 0's 8 MiB, distinct per slice, must arrive in place).
    import fairring_py

    big = torch.arange(2 << 20, dtype=torch.float32) * (1 if rank == 0 else -1)
    dist.broadcast(big, src=0)  # 8 MiB
    if not torch.equal(big, torch.arange(2 << 20, dtype=torch.float32)):
        failures.add("8 MiB broadcast: wrong result")
    kinds = [r["kind"] for r in fairring_py.dump_recent(file=io.StringIO())[-3:]]
    want = ["broadcast", "broadcast", "broadcast"]
    if kinds != want:
        failures.add(f"last broadcasts ran as {kinds}, expected {want}")
    # A mismatched root, on a group of its own: an error that says so, everywhere.
    g = dist.new_group(list(range(world)), backend="fairring", timeout=datetime.timedelta(seconds=20))
    sync = dist.new_group(list(range(world)), backend="gloo")
    dist.all_reduce(torch.ones(1), group=g)
    # An error aborts what is still in flight everywhere: let the warm-up end first.
    dist.barrier(group=sync)
    try:
        dist.broadcast(torch.ones(100), src=0 if rank == 0 else world - 1, group=g)
        failures.add("mismatched roots: no error")
    except RuntimeError as e:
        if "broadcast" not in str(e) or "mismatch" not in str(e):
            failures.add(f"mismatched roots: error does not say it is a broadcast mismatch: {str(e)[:300]}")
    return {"failures": failures}


SECTIONS = {
    "broadcast": sec_broadcast,
    "correctness": sec_correctness,
    "noncontig": sec_noncontig,
    "shm": sec_shm,
    "listen": sec_listen,
    "async": sec_async,
    "ddp": sec_ddp,
    "subgroups": sec_subgroups,
    "collectives": sec_collectives,
    "unsupported": sec_unsupported,
    "intruder": sec_intruder,
    "empty": sec_empty,
    "half_range": sec_half_range,
    "late_peer": sec_late_peer,
}


def run_sections(table, rank, world, sections, cfg, **on_error):
    """Runs the named sections of `table` in order; a section that raises
    reports it as a failure (plus the `on_error` fields)."""
    out = {}
    for name in sections:
        t0 = time.monotonic()
        try:
            res = table[name](rank, world, cfg)
        except Exception as e:  # noqa: BLE001
            res = {"failures": [f"section {name} raised {type(e).__name__}: {e}\n{traceback.format_exc()}"],
                   **on_error}
        res["seconds"] = round(time.monotonic() - t0, 2)
        out[name] = res
    return out


def session(rank, world, sections, cfg):
    return run_sections(SECTIONS, rank, world, sections, cfg)


def options_by_rank(rank, world):
    """pg_options for the Options-configured topology: node id per rank."""
    import fairring_py

    return fairring_py.Options(node_id=f"opt-node-{rank}", slice_size=64 * 1024, parallelism=3)
