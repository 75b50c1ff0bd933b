"""c10d conformance checks that run inside the ranks (spawned by launch.run_ranks):
what torch.distributed and its users (DDP comm hooks, debug mode, sparse
gradients) expect of any backend.  Each function returns a list of failures
(empty when all is well), so that a test can show every rank's problems."""
from __future__ import annotations

import torch
import torch.distributed as dist


def _close(a, b, tol=1e-5):
    return torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)


def detail_mode(rank, world):
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL the group is wrapped by torch's
    ProcessGroupWrapper, which checks every collective's fingerprint and needs
    the backend's sequence numbers."""
    failures = []
    x = torch.full((1000,), float(rank + 1))
    dist.all_reduce(x)
    want = sum(range(1, world + 1))
    if not torch.all(x == want):
        failures.append(f"all_reduce under DETAIL gave {x[:3].tolist()}, want {want}")
    b = torch.full((7,), float(rank))
    dist.broadcast(b, src=world - 1)
    if not torch.all(b == world - 1):
        failures.append(f"broadcast under DETAIL gave {b.tolist()}")
    dist.barrier()
    # all_gather_object on a subgroup (every rank creates every subgroup).
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    odds = dist.new_group([r for r in range(world) if r % 2 == 1])
    mine = evens if rank % 2 == 0 else odds
    members = [r for r in range(world) if r % 2 == rank % 2]
    got = [None] * len(members)
    dist.all_gather_object(got, {"rank": rank}, group=mine)
    if got != [{"rank": r} for r in members]:
        failures.append(f"all_gather_object on a subgroup gave {got}")
    # The fingerprint check turns a mismatch into an error on every rank.
    try:
        bad = torch.ones(5 if rank == 0 else 6)
        dist.all_reduce(bad)
        failures.append("a mismatched all_reduce under DETAIL did not raise")
    except RuntimeError as e:
        if "mismatch" not in str(e).lower() and "detected" not in str(e).lower():
            failures.append(f"mismatched all_reduce under DETAIL raised an unclear error: {str(e)[:300]}")
    return failures


def sequence_numbers(rank, world):
    """Every collective (native or delegated) bumps the group's counter, the
    same on every rank; sends and receives, which only some ranks issue, do
    not (they are numbered apart), so a collective's number in messages and
    dumps is the same on every rank."""
    import fairring_py

    pg = dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu"))
    start = backend._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(3))
    if world > 1 and rank == 0:
        dist.send(torch.ones(3), 1)
        dist.send(torch.ones(3), 1)
    elif world > 1 and rank == 1:
        dist.recv(torch.ones(3), 0)
    dist.broadcast(torch.ones(3), src=0)
    if world > 1 and rank == 1:
        dist.recv(torch.ones(3), 0)
    dist.barrier()
    dist.all_reduce(torch.ones(100_000), async_op=True).wait()
    seq = backend._get_sequence_number_for_group()
    last = [(op["seq"], op["kind"]) for op in fairring_py.dump_recent() if not op["p2p"]][-1]
    got = [None] * world
    dist.all_gather_object(got, (start, seq, last))
    failures = []
    if seq - start < 4:
        failures.append(f"sequence number went from {start} to {seq} over 4 collectives")
    if len({g[1] for g in got}) != 1:
        failures.append(f"ranks disagree on the sequence number: {got}")
    if len({g[2] for g in got}) != 1:
        failures.append(f"ranks number their last collective differently: {got}")
    return failures


def _sparse_case(seed, rank, shape, sparse_dim, dtype, nnz):
    """Rank `rank`'s uncoalesced COO tensor for a case (duplicates included)."""
    g = torch.Generator().manual_seed(seed * 131 + rank)
    idx = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g) for d in range(sparse_dim)]) \
        if nnz else torch.zeros(sparse_dim, 0, dtype=torch.long)
    vshape = (nnz, *shape[sparse_dim:])
    if dtype.is_complex:
        vals = torch.randn(vshape, generator=g, dtype=torch.complex128).to(dtype)
    elif dtype.is_floating_point:
        vals = (torch.rand(vshape, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    else:
        vals = torch.randint(-1000, 1000, vshape, generator=g).to(dtype)
    return torch.sparse_coo_tensor(idx, vals, shape)


def _sparse_cases(world):
    """(seed, shape, sparse_dim, dtype, nnz per rank): 1-D, hybrid (dense
    rows) and 2 sparse dimensions; empty on some ranks; every rank empty."""
    cases = []
    # Not complex: torch's all_reduce hands a backend view_as_real() of the
    # tensor, which for a sparse one is a copy, so no backend's result
    # reaches the caller's tensor (gloo's neither).
    dtypes = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32]
    shapes = [((1009,), 1), ((997, 7), 1), ((31, 17, 3), 2)]
    for i, dt in enumerate(dtypes):
        for j, (shape, sd) in enumerate(shapes):
            seed = 100 * i + j
            nnz = [(seed * 7 + 13 * r) % 300 if (seed + r) % 4 else 0 for r in range(world)]
            cases.append((seed, shape, sd, dt, nnz))
    cases.append((999, (50, 4), 1, torch.float32, [0] * world))
    return cases


def _sparse_tol(dtype):
    return {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5, torch.complex64: 1e-5}.get(dtype, 0.0)


def sparse_allreduce(rank, world):
    """Sparse all-reduce (native for CPU COO tensors with SUM) against a
    float64 / exact reference and gloo, every rank's result the same bits;
    async and in flight with dense ops; the same tensor twice in a row;
    a shape that differs between ranks is a mismatch error everywhere and
    the group goes on; DDP with a sparse embedding trains the same on every
    rank."""
    failures = []
    gloo = dist.new_group(backend="gloo")
    for seed, shape, sd, dt, nnz in _sparse_cases(world):
        name = f"{dt} shape {shape} sparse_dim {sd} nnz {nnz}"
        ins = [_sparse_case(seed, r, shape, sd, dt, nnz[r]) for r in range(world)]
        wide = torch.complex128 if dt.is_complex else torch.float64 if dt.is_floating_point else torch.int64
        ref = sum(x.to_dense().to(wide) for x in ins)
        s = ins[rank].clone()
        try:
            dist.all_reduce(s)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: raised {type(e).__name__}: {str(e)[:300]}")
            continue
        if not s.is_sparse or s.dtype != dt or tuple(s.shape) != shape:
            failures.append(f"{name}: result is {s.layout} {s.dtype} {tuple(s.shape)}")
            continue
        got = s.to_dense().to(wide)
        tol = _sparse_tol(dt)
        mag = sum(x.to_dense().to(wide).abs() for x in ins)
        if not bool(((got - ref).abs() <= tol * mag + tol).all()):
            failures.append(f"{name}: off the reference by {float((got - ref).abs().max())}")
        digests = [None] * world
        dist.all_gather_object(digests, hash(s.coalesce().values().to(wide).numpy().tobytes()), group=gloo)
        if len(set(digests)) != 1:
            failures.append(f"{name}: ranks' results differ")
        if sd == 1 and dt == torch.float32:
            viag = ins[rank].clone()
            dist.all_reduce(viag, group=gloo)
            if not torch.allclose(viag.to_dense(), s.to_dense(), rtol=1e-5, atol=1e-5):
                failures.append(f"{name}: differs from gloo's result")

    # Async, with dense ops issued while it runs; then the same tensor twice.
    s = _sparse_case(7, rank, (513, 5), 1, torch.float32, 200)
    want = sum(_sparse_case(7, r, (513, 5), 1, torch.float32, 200).to_dense() for r in range(world))
    dense = torch.full((4099,), float(rank + 1))
    w = dist.all_reduce(s, async_op=True)
    dist.all_reduce(dense)
    w.wait()
    if not torch.allclose(s.to_dense(), want, rtol=1e-5, atol=1e-5):
        failures.append("async sparse all_reduce with a dense one in flight: wrong result")
    if not torch.all(dense == sum(range(1, world + 1))):
        failures.append("dense all_reduce issued during a sparse one: wrong result")
    dist.all_reduce(s)  # every rank holds `want`: the sum is world x want
    if not torch.allclose(s.to_dense(), want * world, rtol=1e-5, atol=1e-4):
        failures.append("a second sparse all_reduce of the same tensor did not start from the first's result")

    # A shape that differs on the last rank: every rank fails, the group goes on.
    bad = torch.sparse_coo_tensor([[0]], [1.0], (10 if rank == world - 1 else 11,))
    try:
        dist.all_reduce(bad)
        failures.append("sparse all_reduce of different shapes: no error")
    except RuntimeError as e:
        if "mismatch" not in str(e) or "sizes" not in str(e):
            failures.append(f"sparse all_reduce of different shapes: unclear error {str(e)[:300]}")
    after = torch.ones(100)
    dist.all_reduce(after)
    if not torch.all(after == world):
        failures.append("the group did not work after a sparse mismatch")

    i = torch.tensor([[rank, world + rank]])
    v = torch.tensor([1.0 + rank, 2.0])
    s = torch.sparse_coo_tensor(i, v, (2 * world + 1,))
    dist.all_reduce(s)
    dense = s.to_dense()
    want = torch.zeros(2 * world + 1)
    for r in range(world):
        want[r] += 1.0 + r
        want[world + r] += 2.0
    if not torch.equal(dense, want):
        failures.append(f"sparse all_reduce gave {dense.tolist()}, want {want.tolist()}")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8, sparse=True))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(3):
        idx = torch.randint(0, 50, (16,), generator=torch.Generator().manual_seed(step * 100 + rank))
        opt.zero_grad()
        ddp(idx).sum().backward()
        opt.step()
    w = model[0].weight.detach().clone()
    got = [torch.empty_like(w) for _ in range(world)]
    dist.all_gather(got, w)
    if not all(torch.equal(g, got[0]) for g in got):
        failures.append("DDP with a sparse embedding: ranks' weights differ after 3 steps")
    return failures


def monitored_barrier(rank, world):
    """group.monitored_barrier() reaches the backend, which hands it to gloo."""
    pg = dist.distributed_c10d._get_default_group()
    from datetime import timedelta

    pg.monitored_barrier(timedelta(seconds=30), True)
    x = torch.ones(10)
    dist.all_reduce(x)
    return [] if torch.all(x == world) else [f"all_reduce after monitored_barrier gave {x.tolist()}"]


def several_tensors(rank, world):
    """all_reduce_coalesced: several tensors (any shapes, non-contiguous too)
    in one native all-reduce, each reduced across ranks on its own; mixed
    dtypes are a clear error.  The old list form of all_reduce (one tensor
    per device, all added together) is a clear error, not a silent guess."""
    import warnings

    failures = []
    pg = dist.distributed_c10d._get_default_group()
    shapes = [(3,), (2, 5), (), (0,), (7, 1, 3)]
    ts = [torch.full(s, float(rank + 1 + i)) for i, s in enumerate(shapes)]
    nc = torch.full((4, 6), float(rank + 1)).t()  # not contiguous
    ts.append(nc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # all_reduce_coalesced is deprecated in torch, still used
        dist.all_reduce_coalesced(ts)
        for i, t in enumerate(ts[:-1]):
            want = sum(r + 1 + i for r in range(world))
            if t.shape != torch.Size(shapes[i]) or not torch.all(t == want):
                failures.append(f"tensor {i} of all_reduce_coalesced: shape {tuple(t.shape)}, "
                                f"values {t.flatten()[:3].tolist()}")
        if not torch.all(nc == sum(range(1, world + 1))) or nc.is_contiguous():
            failures.append("non-contiguous tensor of all_reduce_coalesced got a wrong result")
        c = [torch.full((5,), float(rank)), torch.full((3,), 2.0)]
        dist.all_reduce_coalesced(c, op=dist.ReduceOp.MAX)
        if not (torch.all(c[0] == world - 1) and torch.all(c[1] == 2.0)):
            failures.append(f"all_reduce_coalesced MAX gave {c[0].tolist()} {c[1].tolist()}")
        try:
            dist.all_reduce_coalesced([torch.ones(3), torch.ones(3, dtype=torch.float64)])
            failures.append("all_reduce_coalesced of mixed dtypes did not raise")
        except (RuntimeError, ValueError) as e:  # torch's own check may come first
            if "dtype" not in str(e):
                failures.append(f"mixed dtypes: unclear error {str(e)[:200]}")
    try:
        pg.allreduce([torch.ones(3), torch.ones(3)]).wait()
        failures.append("the list form of all_reduce did not raise")
    except RuntimeError as e:
        if "one tensor per call" not in str(e) or "all_reduce_coalesced" not in str(e):
            failures.append(f"list form: unclear error {str(e)[:200]}")
    # The group still works.
    x = torch.ones(9)
    dist.all_reduce(x)
    if not torch.all(x == world):
        failures.append("all_reduce after the coalesced calls is wrong")
    return failures


def powersgd(rank, world, batched):
    """DDP's PowerSGD hooks wait on an all_reduce's future inside a future
    callback; that must make progress (it deadlocked on a single completion
    thread).  The ranks end with identical weights."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2,
                               min_compression_rate=0.5, use_error_feedback=True, warm_start=True)
    ddp.register_comm_hook(state, psgd.batched_powerSGD_hook if batched else psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(6):
        x = torch.randn(32, 64, generator=gen)
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    got = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(got, flat)
    if not all(torch.equal(g, got[0]) for g in got):
        return ["PowerSGD: ranks' weights differ after 6 steps"]
    return []


def callback_waits_on_other_future(rank, world):
    """A then() callback that issues all_reduces and waits for their futures
    (the pattern of PowerSGD, stripped down), one of them through a callback
    chain of its own."""
    def cb(fut):
        t = fut.value()[0].clone()
        dist.all_reduce(t, async_op=True).get_future().wait()
        t2 = t.clone()
        f2 = dist.all_reduce(t2, async_op=True).get_future()
        f2.then(lambda f: f.value()[0] * 1).wait()
        return t2

    x = torch.ones(4)
    out = dist.all_reduce(x, async_op=True).get_future().then(cb).wait()
    if not torch.all(out == world ** 3):
        return [f"waits inside a callback gave {out.tolist()}, want {world ** 3}"]
    return []


def profiler_events(rank, world):
    """torch.profiler shows each Fairring all-reduce as its own event, with
    the input's shape and the op's real duration (as gloo's show)."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.ones(1 << 20)
    dist.all_reduce(x)  # warm-up, outside the trace
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(x)
        dist.all_reduce(torch.ones(4099), async_op=True).wait()
    events = [e for e in prof.events() if e.name == "fairring:all_reduce"]
    failures = []
    shapes = sorted(tuple(tuple(s) for s in e.input_shapes) for e in events)
    if shapes != [((4099,),), ((1 << 20,),)]:
        failures.append(f"fairring:all_reduce events with shapes {shapes}, want [[4099]] and [[1048576]]; "
                        f"events seen: {sorted({e.name for e in prof.events()})[:30]}")
    big = [e for e in events if e.input_shapes and tuple(e.input_shapes[0]) == (1 << 20,)]
    if big and big[0].cpu_time_total <= 0:
        failures.append("the 4 MiB all_reduce's event has no duration")
    return failures


def recent_ops(rank, world):
    """fairring_py.dump_recent lists the group's last collectives with their
    kind, size, state and timing, in issue order (collectives numbered apart
    from sends and receives)."""
    import io

    import fairring_py

    start = len(fairring_py.dump_recent())
    dist.all_reduce(torch.ones(1000))
    dist.broadcast(torch.ones(3), src=0)
    dist.all_gather([torch.empty(2) for _ in range(world)], torch.ones(2))
    # Point-to-point: every rank sends to its right.
    send = dist.isend(torch.ones(2), (rank + 1) % world)
    dist.recv(torch.empty(2), (rank - 1) % world)
    send.wait()
    # A delegated one.
    dist.group.WORLD.monitored_barrier()
    w = dist.all_reduce(torch.ones(5, dtype=torch.float64), op=dist.ReduceOp.MAX, async_op=True)
    w.wait()
    buf = io.StringIO()
    recs = fairring_py.dump_recent(file=buf)[start:]
    failures = []
    kinds = [r["kind"] for r in recs]
    if kinds[:3] != ["all_reduce", "broadcast", "all_gather"] or kinds[-1] != "all_reduce" or \
            sorted(kinds[3:5]) != ["recv", "send"] or kinds[5] != "monitoredBarrier (gloo)":
        failures.append(f"recorded kinds {kinds}")
    else:
        if recs[0]["bytes"] != 4000 or recs[0]["state"] != "done" or recs[0]["duration_ms"] is None:
            failures.append(f"first record {recs[0]}")
        if "12 bytes from rank 0" not in recs[1]["what"]:
            failures.append(f"second record {recs[1]}")
        if "2 elements of float32 per rank" not in recs[2]["what"]:
            failures.append(f"third record {recs[2]}")
        if "float64 with MAX" not in recs[-1]["what"]:
            failures.append(f"last record {recs[-1]}")
        # Collectives numbered in issue order, sends and receives apart.
        coll = [r["seq"] for r in recs if not r["p2p"]]
        p2p = [r["seq"] for r in recs if r["p2p"]]
        if coll != list(range(coll[0], coll[0] + 5)) or sorted(p2p) != [p2p[0], p2p[0] + 1] or \
                [r["p2p"] for r in recs] != [False, False, False, True, True, False, False]:
            failures.append(f"sequence numbers {[(r['kind'], r['seq']) for r in recs]}")
    if "monitoredBarrier (gloo)" not in buf.getvalue() or "send of tag 0" not in buf.getvalue():
        failures.append(f"printed dump: {buf.getvalue()[:300]!r}")
    # The ring keeps the last 64 once it has gone round (and each record is
    # its own op's, described from its key when read).
    for i in range(150):
        dist.all_reduce(torch.ones(1 + i % 7, dtype=torch.float64 if i % 2 else torch.float32))
    recs = fairring_py.dump_recent(file=io.StringIO())
    seqs = [r["seq"] for r in recs]
    if len(recs) != 64 or seqs != list(range(seqs[0], seqs[0] + 64)):
        failures.append(f"after 150 more ops: {len(recs)} records, sequence numbers {seqs}")
    else:
        for k, r in enumerate(recs):
            i = 150 - 64 + k
            want = f"{1 + i % 7} elements of {'float64' if i % 2 else 'float32'} with SUM"
            if r["kind"] != "all_reduce" or r["what"] != want or r["state"] != "done" or \
                    r["bytes"] != (1 + i % 7) * (8 if i % 2 else 4):
                failures.append(f"after the ring went round, record {k}: {r}, wanted {want!r}")
                break
    return failures


def a_few_ops(rank, world):
    dist.all_reduce(torch.ones(1000))
    dist.barrier()
    return []
