"""Code that runs inside the ranks of the GPU all-reduce tests (spawned by
launch.run_ranks).  Every rank drives GPU rank % device_count, so one GPU
serves the whole simulated cluster.  Each section returns
{"failures": [...], ...}; digests let the test compare results across ranks."""
from __future__ import annotations

import copy
import os
import signal
import time
import traceback

import torch
import torch.distributed as dist

import refs
from refs import compare, digest, make_input, op_of, reference
from rank_all_reduce import Failures, _MLP, sec_half_range


def sec_half_range_cuda(rank, world, cfg):
    """float16 AVG past float16's largest sum, on CUDA tensors (rank_all_reduce)."""
    return sec_half_range(rank, world, dict(cfg, device=_device(rank)))


def _device(rank):
    d = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(d)
    return d


def _reduce_case(dev, rank, inputs, dtype, op, name, failures):
    """All-reduces this rank's input on `dev` and compares the result with the
    float64 reference; returns it on the CPU, or None if the op raised."""
    t = inputs[rank].to(dev)
    try:
        dist.all_reduce(t, op=op_of(op))
        got = t.cpu()  # syncs with the current stream, which the op ordered itself before
    except Exception as e:  # noqa: BLE001
        failures.add(f"{name}: raised {type(e).__name__}: {str(e)[:300]}")
        return None
    err = compare(got, inputs, reference(inputs, dtype, op), dtype, op)
    if err:
        failures.add(f"{name}: {err}")
    return got


def sec_correctness(rank, world, cfg):
    """Every dtype/op and several odd sizes: the CUDA result must match the
    reference, and be the same bits as Fairring's CPU all-reduce of the same
    inputs in the same group (same plan, same combine order)."""
    dev = _device(rank)
    failures, digests = Failures(), {}
    # The smoke run checks the large size on a few cases only: the float64
    # reference of the whole matrix at 4M elements is most of its time.
    large = {(refs.dtype_name(d), op) for d, op in cfg.get("large_cases", [])}
    for ci, (dtype, op) in enumerate(refs.matrix()):
        sizes = cfg["sizes"] + ([cfg["large_size"]] if (refs.dtype_name(dtype), op) in large else [])
        for n in sizes:
            seed = 50_000 + ci * 100 + n % 97
            inputs = [make_input(seed, r, n, dtype, op) for r in range(world)]
            name = f"{refs.dtype_name(dtype)}/{op}/n={n}"
            got = _reduce_case(dev, rank, inputs, dtype, op, name, failures)
            if got is None:
                continue
            c = inputs[rank].clone()
            dist.all_reduce(c, op=op_of(op))
            if digest(c) != digest(got):
                failures.add(f"{name}: CUDA result differs from the CPU all-reduce's bits")
            digests[name] = digest(got)
    return {"failures": failures, "digests": digests}


def sec_streams(rank, world, cfg):
    """Stream semantics: input produced on a side stream, async op, the result
    consumed through the future and through work.wait() with no host sync."""
    dev = _device(rank)
    failures = Failures()
    n = 1_000_003
    side = torch.cuda.Stream(device=dev)
    expected = float(sum(r + 1 for r in range(world)))
    for it in range(3):
        with torch.cuda.stream(side):
            # Slow enough producer that a missing wait would be seen.
            x = torch.ones(n, device=dev)
            for _ in range(20):
                x = x * 1.0
            x.mul_(rank + 1)
            work = dist.all_reduce(x, async_op=True)
            fut = work.get_future().then(lambda f: f.value()[0] * 2)
            work.wait()  # makes `side` wait for the op
            y = x + 0  # queued on `side` after the wait
            doubled = fut.wait()  # CUDA-aware future: the current stream waits for it
        side.synchronize()
        if not torch.all(y == expected):
            failures.add(f"iteration {it}: work.wait() result wrong: {y.unique()[:5].tolist()}")
        torch.cuda.current_stream(dev).wait_stream(side)
        if not torch.all(doubled == 2 * expected):
            failures.add(f"iteration {it}: future chain result wrong: {doubled.unique()[:5].tolist()}")
    # Many ops in flight back to back (DDP's buckets), waited at the end.
    ts = [torch.full((4099 * (i + 1),), float(rank + i), device=dev) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    for i, t in enumerate(ts):
        want = float(sum(r + i for r in range(world)))
        if not torch.all(t == want):
            failures.add(f"in-flight op {i}: got {t.unique()[:5].tolist()} expected {want}")
    # A non-contiguous tensor is reduced through a copy and copied back.
    m = torch.arange(12, dtype=torch.float32, device=dev).reshape(3, 4).t()
    dist.all_reduce(m)
    if not torch.equal(m.cpu(), torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * world):
        failures.add("non-contiguous tensor: wrong result")
    return {"failures": failures}


def sec_errors(rank, world, cfg):
    dev = _device(rank)
    failures = Failures()

    def expect(what, fn, *needles):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            msg = str(e)
            if not all(s in msg for s in needles):
                failures.add(f"{what}: message lacks {needles}: {msg[:300]}")
            return
        failures.add(f"{what}: no error")

    t = torch.ones(8, device=dev)
    expect("BAND on float32", lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND), "BAND", "float32")
    expect("AVG on int32", lambda: dist.all_reduce(torch.ones(8, dtype=torch.int32, device=dev), op=dist.ReduceOp.AVG),
           "AVG", "int32")
    if torch.cuda.device_count() > 1:
        other = torch.device("cuda", (dev.index + 1) % torch.cuda.device_count())
        expect("tensor on another device", lambda: dist.all_reduce(torch.ones(8, device=other)), "current CUDA device")
    _capture_is_refused(dev, failures)
    # The group still works afterwards (the errors were raised before anything was issued).
    x = torch.ones(8, device=dev)
    dist.all_reduce(x)
    if not torch.all(x.cpu() == world):
        failures.add("all_reduce after the rejected calls: wrong result")
    return {"failures": failures}


def _capture_is_refused(dev, failures):
    """An all_reduce issued while the current stream is captured into a CUDA
    graph is refused with a clear error, and the capture stays valid (the
    engine's threads must not invalidate it: they run in relaxed mode)."""
    t = torch.ones(1024, device=dev)
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    graph = torch.cuda.CUDAGraph()
    error = None
    with torch.cuda.stream(side):
        graph.capture_begin()
        try:
            dist.all_reduce(t)
        except Exception as e:  # noqa: BLE001
            error = e
        finally:
            try:
                graph.capture_end()
            except Exception as e:  # noqa: BLE001
                failures.add(f"graph capture: the capture was invalidated: {type(e).__name__}: {str(e)[:300]}")
    torch.cuda.current_stream(dev).wait_stream(side)
    if error is None:
        failures.add("graph capture: all_reduce during capture raised nothing")
    elif "CUDA graph" not in str(error):
        failures.add(f"graph capture: the error does not say why: {str(error)[:300]}")


def _sleep_on_device(dev, seconds):
    """Queues a kernel that spins for about `seconds` on the current stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    cycles_per_s = 20_000_000 / (start.elapsed_time(end) / 1000)
    torch.cuda._sleep(int(cycles_per_s * seconds))


def _poll_until_completed(work, limit_s):
    """Seconds until is_completed() turned true, or None past `limit_s`."""
    t0 = time.monotonic()
    while not work.is_completed():
        if time.monotonic() - t0 > limit_s:
            return None
        time.sleep(0.01)
    return time.monotonic() - t0


def device_stall(rank, world, timeout_s):
    """The watchdog: the last rank's device is busy for 3x the group timeout
    when it issues an all_reduce, so every rank's device work for it waits
    that long.  Its Work is done on the host at once (as with NCCL); the
    watchdog must turn it failed, naming the op, well before the kernel
    ends, and fail the group."""
    dev = _device(rank)
    failures = Failures()
    t = torch.full((1 << 16,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    stall_s = 3 * timeout_s
    if rank == world - 1:
        _sleep_on_device(dev, stall_s)
    work = dist.all_reduce(t, async_op=True)
    took = _poll_until_completed(work, stall_s - 2)
    error = work.exception() if took is not None else None
    if took is None:
        failures.add(f"is_completed() still false after {stall_s - 2} s: the stalled device work went unseen")
    elif error is None:
        failures.add(f"is_completed() after {took:.1f} s without an error, while the device was stalled for {stall_s} s")
    else:
        msg = str(error)
        if "all_reduce #" not in msg or "device work" not in msg:
            failures.add(f"the Work's error does not name the op and its device work: {msg[:400]}")
        try:
            work.wait()
            failures.add("wait() returned after the watchdog failed the op")
        except Exception:  # noqa: BLE001
            pass
    try:
        dist.all_reduce(torch.ones(4, device=dev))
        failures.add("an all_reduce after the watchdog fired succeeded: the group did not fail")
    except Exception:  # noqa: BLE001
        pass
    return {"failures": failures, "seconds": took, "error": str(error)[:500] if error else None}


def peer_killed_with_work_queued(rank, world, timeout_s):
    """A local peer is SIGKILLed with its part of an all_reduce queued on its
    device (behind a long kernel): the others' device work waits on it
    forever.  Their Work must fail, naming the dead rank, within the timeout,
    and the group must tear down without hanging."""
    dev = _device(rank)
    failures = Failures()
    t = torch.full((1 << 16,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    victim = world - 1
    if rank == victim:
        _sleep_on_device(dev, 60)
        work = dist.all_reduce(t, async_op=True)
        work.wait()  # enqueued: its records are promised to the peers
        os.kill(os.getpid(), signal.SIGKILL)
    work = dist.all_reduce(t, async_op=True)
    took = _poll_until_completed(work, timeout_s + 15)
    error = work.exception() if took is not None else None
    if took is None:
        failures.add(f"is_completed() still false {timeout_s + 15} s after the peer was killed")
    elif error is None:
        failures.add(f"is_completed() after {took:.1f} s without an error, though rank {victim} died before its part "
                     f"ran (result {t[:4].tolist()})")
    elif f"rank {victim}" not in str(error) and "Timed out" not in str(error):
        failures.add(f"the error names neither the dead rank nor a timeout: {str(error)[:400]}")
    return {"failures": failures, "seconds": took, "error": str(error)[:500] if error else None}


def sec_ddp(rank, world, cfg):
    """DDP on the GPU over Fairring trains like DDP on CPU over gloo."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = _device(rank)
    failures = Failures()
    torch.manual_seed(1234)
    base = _MLP()
    init_params = [p.detach().clone() for p in base.parameters()]
    gloo = dist.new_group(backend="gloo")
    m_f = copy.deepcopy(base).to(dev)
    m_g = copy.deepcopy(base)
    ddp_f = DDP(m_f, device_ids=[dev.index], bucket_cap_mb=0.01)
    ddp_g = DDP(m_g, bucket_cap_mb=0.01, process_group=gloo)
    opt_f = torch.optim.SGD(m_f.parameters(), lr=0.05, momentum=0.9)
    opt_g = torch.optim.SGD(m_g.parameters(), lr=0.05, momentum=0.9)
    for step in range(5):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(32, 16, generator=g)
        y = torch.randn(32, 4, generator=g)
        for ddp, opt, d in ((ddp_f, opt_f, dev), (ddp_g, opt_g, torch.device("cpu"))):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x.to(d)), y.to(d))
            loss.backward()
            opt.step()
    for (name, pf), pg_, p0 in zip(m_f.named_parameters(), m_g.parameters(), init_params):
        pf = pf.detach().cpu()
        if not torch.allclose(pf, pg_, rtol=1e-4, atol=1e-5):
            failures.add(f"param {name}: fairring(GPU) vs gloo(CPU) max diff {(pf - pg_).abs().max().item():.3g}")
        if torch.equal(pf, p0):
            failures.add(f"param {name}: unchanged by training (test is vacuous)")
    dig = digest(torch.cat([p.detach().reshape(-1).cpu() for p in m_f.parameters()]))
    return {"failures": failures, "digest": dig}


def sec_nccl_shared_gpu(rank, world, cfg):
    """FAIRRING_GPU_TRANSPORT=nccl with ranks sharing a GPU is a clear error on
    every rank, raised by the first CUDA all-reduce."""
    dev = _device(rank)
    failures = Failures()
    try:
        dist.all_reduce(torch.ones(8, device=dev))
        failures.add("no error")
    except Exception as e:  # noqa: BLE001
        if "needs the ranks of a rail" not in str(e):
            failures.add(f"unexpected error: {type(e).__name__}: {str(e)[:300]}")
    return {"failures": failures}


def sec_poll_then_launch(rank, world, cfg):
    """is_completed() polled until true, then a kernel launched on the same
    thread: a not-ready query must not leave cudaErrorNotReady as the
    thread's last error (ATen's launch check would raise it)."""
    dev = _device(rank)
    failures = Failures()
    not_ready = 0
    for it in range(3):
        t = torch.full((1 << 20,), float(rank + 1), device=dev)
        # The op's device work waits behind this, so the first polls see "not ready".
        torch.cuda._sleep(20_000_000)
        work = dist.all_reduce(t, async_op=True)
        while not work.is_completed():
            not_ready += 1
        try:
            y = t * 2  # a kernel launch on the polling thread
            ok = bool(torch.all(y == 2 * sum(r + 1 for r in range(world))).item())
        except Exception as e:  # noqa: BLE001
            failures.add(f"iteration {it}: launch after is_completed() raised {type(e).__name__}: {str(e)[:300]}")
            continue
        if not ok:
            failures.add(f"iteration {it}: wrong result {t.unique()[:5].tolist()}")
    if not_ready == 0:
        failures.add("is_completed() was never false: the check did not exercise a not-ready query")
    return {"failures": failures, "not_ready_polls": not_ready}


def sec_big_slices(rank, world, cfg):
    """Tensors of several slices, each of several chunks and shards (run with
    a small FAIRRING_SLICE_SIZE): every element lands where it belongs."""
    dev = _device(rank)
    failures, digests = Failures(), {}
    for dtype, op in [(torch.float32, "SUM"), (torch.float32, "AVG"), (torch.bfloat16, "SUM"), (torch.int64, "MAX")]:
        for n in cfg["sizes"]:
            inputs = [make_input(70_000 + n % 1009, r, n, dtype, op) for r in range(world)]
            name = f"{refs.dtype_name(dtype)}/{op}/n={n}"
            got = _reduce_case(dev, rank, inputs, dtype, op, name, failures)
            if got is not None:
                digests[name] = digest(got)
    return {"failures": failures, "digests": digests}


def sec_slow_producer(rank, world, cfg):
    """The input's last write is queued on a side stream behind a long
    device sleep: the all-reduce must start after it (the caller's stream at
    submit), deterministically, not after whatever happened to be done."""
    dev = _device(rank)
    failures = Failures()
    side = torch.cuda.Stream(device=dev)
    n = (4 << 20) // 4 + 3
    for it in range(3):
        with torch.cuda.stream(side):
            x = torch.zeros(n, device=dev)
            torch.cuda._sleep(50_000_000)  # tens of ms on an H200
            x.fill_(float(rank + 1))  # the last write, queued behind the sleep
            dist.all_reduce(x)
            y = x.clone()
        side.synchronize()
        want = float(sum(r + 1 for r in range(world)))
        if not torch.all(y == want):
            failures.add(f"iteration {it}: read the input before its producer finished: {y.unique()[:5].tolist()}")
    return {"failures": failures}


def sec_group_cycles(rank, world, cfg):
    """Create, use and destroy a fairring group three times in one process
    (each time a new CUDA engine, its IPC memory and events, its teardown)."""
    dev = _device(rank)
    failures = Failures()
    for cycle in range(3):
        g = dist.new_group(backend="fairring")
        t = torch.full((262147,), float(rank + cycle), device=dev)
        works = [dist.all_reduce(t, group=g, async_op=True) for _ in range(2)]
        for w in works:
            w.wait()
        want = float(sum(r + cycle for r in range(world))) * world
        if not torch.all(t == want):
            failures.add(f"cycle {cycle}: got {t.unique()[:5].tolist()} expected {want}")
        dist.destroy_process_group(g)
        del works, g  # the last references: the group's engines are torn down here, on every rank together
    # The default group still works.
    x = torch.ones(8, device=dev)
    dist.all_reduce(x)
    if not torch.all(x.cpu() == world):
        failures.add("default group after the cycles: wrong result")
    return {"failures": failures}


def sec_collectives(rank, world, cfg):
    """reduce_scatter, all_gather and broadcast of CUDA tensors, natively
    (dump_recent says "(CUDA)"): reduce_scatter within the dtype's tolerance
    of the float64 reference and the same bits as Fairring's CPU
    reduce_scatter in the same group; all_gather and broadcast exact; a
    non-contiguous output and an in-place all_gather (FSDP's form); a native
    barrier after them."""
    import io

    import fairring_py

    dev = _device(rank)
    failures = Failures()
    for ci, (dtype, op) in enumerate(refs.matrix()):
        if dtype not in (torch.float32, torch.bfloat16, torch.int64) or op not in ("SUM", "AVG", "MAX"):
            continue
        for n in cfg["sizes"]:
            name = f"reduce_scatter {refs.dtype_name(dtype)}/{op}/n={n}"
            inputs = [make_input(70_000 + ci * 100 + n % 97, r, n * world, dtype, op) for r in range(world)]
            out = torch.empty(n, dtype=dtype, device=dev)
            try:
                dist.reduce_scatter_tensor(out, inputs[rank].to(dev), op=op_of(op))
                got = out.cpu()
            except Exception as e:  # noqa: BLE001
                failures.add(f"{name}: raised {type(e).__name__}: {str(e)[:300]}")
                continue
            mine = slice(rank * n, (rank + 1) * n)
            err = compare(got, [i[mine] for i in inputs], reference(inputs, dtype, op)[mine], dtype, op)
            if err:
                failures.add(f"{name}: {err}")
            cpu = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(cpu, inputs[rank], op=op_of(op))
            if digest(cpu) != digest(got):
                failures.add(f"{name}: CUDA result differs from the CPU reduce_scatter's bits")
    for n in cfg["sizes"]:
        for dtype in (torch.float32, torch.uint8, torch.float64):
            mine = (torch.arange(n) * (rank + 1)).to(dtype)
            want = torch.cat([(torch.arange(n) * (r + 1)).to(dtype) for r in range(world)])
            out = torch.full((world * n,), 7, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, mine.to(dev))
            if not torch.equal(out.cpu(), want):
                failures.add(f"all_gather {refs.dtype_name(dtype)}/n={n}: wrong result")
            inplace = torch.zeros(world * n, dtype=dtype, device=dev)
            inplace[rank * n:(rank + 1) * n] = mine.to(dev)
            dist.all_gather_into_tensor(inplace, inplace[rank * n:(rank + 1) * n])
            if not torch.equal(inplace.cpu(), want):
                failures.add(f"in-place all_gather {refs.dtype_name(dtype)}/n={n}: wrong result")
            root = n % world
            t = (torch.arange(n) + 3).to(dtype).to(dev) if rank == root else torch.zeros(n, dtype=dtype, device=dev)
            dist.broadcast(t, src=root)
            if not torch.equal(t.cpu(), (torch.arange(n) + 3).to(dtype)):
                failures.add(f"broadcast {refs.dtype_name(dtype)}/n={n} from {root}: wrong result")
    strided = torch.zeros(world * 5, 3, device=dev)[:, 1]
    dist.all_gather_into_tensor(strided, torch.full((5,), float(rank), device=dev))
    if not torch.equal(strided.cpu(), torch.arange(world).repeat_interleave(5).float()):
        failures.add(f"all_gather into a non-contiguous output: {strided.cpu().tolist()}")
    # A barrier after CUDA collectives: native (on the CPU pipeline), after
    # the CUDA engine's work; the all-reduce before it is done and right.
    x = torch.full((1 << 20,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    dist.barrier()
    if not torch.equal(x.cpu(), torch.full((1 << 20,), float(world * (world + 1) // 2))):
        failures.add("all_reduce before a barrier: wrong result")
    kinds = {r["kind"] for r in fairring_py.dump_recent(file=io.StringIO())}
    for k in ("reduce_scatter (CUDA)", "all_gather (CUDA)", "broadcast (CUDA)", "barrier"):
        if k not in kinds:
            failures.add(f"no {k} in the group's recent collectives: {sorted(kinds)}")
    if "barrier (gloo)" in kinds:
        failures.add("a barrier on a group with CUDA collectives was delegated to gloo")
    return {"failures": failures}


def _blocks_of(rank, n, world, dtype):
    """Rank `rank`'s input of an exchange: block d (for rank d) of n values
    that name the sender, the receiver and the position."""
    i = torch.arange(n)
    return torch.cat([((rank * 7 + d * 3 + i) % 113).to(dtype) for d in range(world)])


def sec_exchanges(rank, world, cfg):
    """all_to_all_single (equal blocks), the list all_to_all, gather and scatter
    of CUDA tensors, natively (dump_recent says "(CUDA)"), exact: floating,
    integer and 1-byte dtypes, odd sizes, every rank as the root, a non-contiguous output, ops in flight mixed with
    all-reduces; unequal all_to_all splits natively too (the sizes shared on
    the CPU, the blocks as CUDA blocks of up to the largest), in one slice and
    in several, with an empty block and a strided input."""
    import io

    import fairring_py

    dev = _device(rank)
    failures = Failures()
    for n in cfg.get("exchange_sizes", cfg["sizes"]):
        for di, dtype in enumerate((torch.float32, torch.uint8, torch.float64, torch.bfloat16, torch.int64)):
            name = f"{refs.dtype_name(dtype)}/n={n}"
            inputs = [_blocks_of(r, n, world, dtype) for r in range(world)]
            want = torch.cat([inputs[s][rank * n:(rank + 1) * n] for s in range(world)])
            out = torch.full((world * n,), 5, dtype=dtype, device=dev)
            dist.all_to_all_single(out, inputs[rank].to(dev))
            if not torch.equal(out.cpu(), want):
                failures.add(f"all_to_all_single {name}: wrong result")
            outs = [torch.full((n,), 5, dtype=dtype, device=dev) for _ in range(world)]
            dist.all_to_all(outs, list(inputs[rank].to(dev).chunk(world)))
            if not torch.equal(torch.cat([o.cpu() for o in outs]), want):
                failures.add(f"all_to_all (list) {name}: wrong result")
            root = (n + di) % world  # every rank, local rank 0 included, is a root for some case
            mine = inputs[rank][:n]
            got = [torch.full((n,), 5, dtype=dtype, device=dev) for _ in range(world)] if rank == root else None
            dist.gather(mine.to(dev), got, dst=root)
            if rank == root and not torch.equal(torch.cat([g.cpu() for g in got]),
                                                torch.cat([inputs[r][:n] for r in range(world)])):
                failures.add(f"gather {name} to {root}: wrong result")
            piece = torch.full((n,), 5, dtype=dtype, device=dev)
            parts = list(inputs[root].to(dev).chunk(world)) if rank == root else None
            dist.scatter(piece, parts, src=root)
            if not torch.equal(piece.cpu(), inputs[root][rank * n:(rank + 1) * n]):
                failures.add(f"scatter {name} from {root}: wrong result")
    # A non-contiguous output (through a stand-in copied back).
    strided = torch.zeros(world * 5, 3, device=dev)[:, 1]
    dist.all_to_all_single(strided, torch.full((world * 5,), float(rank), device=dev))
    if not torch.equal(strided.cpu(), torch.arange(world).repeat_interleave(5).float()):
        failures.add(f"all_to_all_single into a non-contiguous output: {strided.cpu().tolist()}")
    # Several in flight, with all-reduces between them, each on its own tensors.
    n = 65537
    works, outs, sums = [], [], []
    for k in range(4):
        inp = _blocks_of(rank + k, n, world, torch.float32).to(dev)
        out = torch.empty_like(inp)
        works.append(dist.all_to_all_single(out, inp, async_op=True))
        outs.append(out)
        s = torch.full((4099,), float(rank + k), device=dev)
        works.append(dist.all_reduce(s, async_op=True))
        sums.append(s)
    for w in works:
        w.wait()
    for k in range(4):
        want = torch.cat([_blocks_of(r + k, n, world, torch.float32)[rank * n:(rank + 1) * n] for r in range(world)])
        if not torch.equal(outs[k].cpu(), want):
            failures.add(f"all_to_all_single #{k} in flight: wrong result")
        if not torch.equal(sums[k].cpu(), torch.full((4099,), float(sum(r + k for r in range(world))))):
            failures.add(f"all_reduce #{k} between all-to-alls: wrong result")
    # Unequal splits: rank r sends (r + d + 1) x scale rows to rank d, none
    # to rank r + 1; scale 40000 makes several slices.
    for scale in (1, 40000):
        def rows(s, d, scale=scale):
            return 0 if d == (s + 1) % world and world > 1 else (s + d + 1) * scale

        send = [rows(rank, d) for d in range(world)]
        recv = [rows(s, rank) for s in range(world)]
        flat = torch.cat([torch.full((c,), float(rank * 10 + d)) + torch.arange(c) % 7 for d, c in enumerate(send)])
        inp = torch.zeros(flat.numel(), 2, device=dev)
        inp[:, 1] = flat.to(dev)
        out = torch.full((sum(recv),), -1.0, device=dev)
        dist.all_to_all_single(out, inp[:, 1], output_split_sizes=recv, input_split_sizes=send)
        want = torch.cat([torch.full((c,), float(s * 10 + rank)) + torch.arange(c) % 7 for s, c in enumerate(recv)])
        if not torch.equal(out.cpu(), want):
            failures.add(f"all_to_all_single with unequal splits x{scale}: {out.cpu().tolist()[:20]}")
        outs = [torch.full((c,), -1.0, device=dev) for c in recv]
        dist.all_to_all(outs, list(flat.to(dev).split(send)))
        if not torch.equal(torch.cat([o.cpu() for o in outs]), want):
            failures.add(f"all_to_all (list of unequal sizes) x{scale}: wrong result")
    kinds = {r["kind"] for r in fairring_py.dump_recent(file=io.StringIO())}
    for k in ("all_to_all (CUDA)", "gather (CUDA)", "scatter (CUDA)", "all_to_all_sizes"):
        if k not in kinds:
            failures.add(f"no {k} in the group's recent collectives: {sorted(kinds)}")
    delegated = {k for k in kinds if k.startswith(("all_to_all", "alltoall", "gather", "scatter")) and "gloo" in k}
    if delegated:
        failures.add(f"no all_to_all, gather or scatter should go to gloo, but these did: {sorted(delegated)}")
    return {"failures": failures}


def sec_p2p(rank, world, cfg):
    """send / recv / isend / irecv / batch_isend_irecv / recv from any source of
    CUDA tensors, natively (through host memory; dump_recent has no
    "send (gloo)"): every size of cfg, several dtypes, tags, many in flight, a
    non-contiguous target, a send of what a kernel just wrote on the current
    stream, and a kernel that reads a received tensor right after wait()."""
    import io

    import fairring_py

    dev = _device(rank)
    failures = Failures()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for n in cfg.get("exchange_sizes", cfg["sizes"]):
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
            name = f"{refs.dtype_name(dtype)}/n={n}"
            # A ring: to the next rank, from the previous one, both in flight.
            mine = ((torch.arange(n, device=dev) + rank * 31) % 101).to(dtype)  # written on the current stream
            got = torch.full((n,), 7, dtype=dtype, device=dev)
            works = [dist.isend(mine, nxt, tag=n % 5), dist.irecv(got, prv, tag=n % 5)]
            for w in works:
                w.wait()
            want = ((torch.arange(n) + prv * 31) % 101).to(dtype)
            if not torch.equal(got.cpu(), want):
                failures.add(f"isend/irecv ring {name}: wrong result")
            doubled = (got.to(torch.float64) * 2).cpu()  # a kernel on the current stream, right after wait()
            if not torch.equal(doubled, want.to(torch.float64) * 2):
                failures.add(f"a kernel reading the received {name}: wrong result")
    # Blocking pairs, several tags in flight out of order, a strided target.
    if rank < 2 <= world:
        peer = 1 - rank
        if rank == 0:
            for tag in (3, 1, 2):
                dist.send(torch.full((1031,), float(tag), device=dev), peer, tag=tag)
            dist.send(torch.arange(12.0, device=dev), peer, tag=9)
        else:
            outs = {tag: torch.empty(1031, device=dev) for tag in (1, 2, 3)}
            ws = [dist.irecv(outs[tag], 0, tag=tag) for tag in (1, 2, 3)]
            for w in ws:
                w.wait()
            for tag, o in outs.items():
                if not torch.equal(o.cpu(), torch.full((1031,), float(tag))):
                    failures.add(f"tag {tag}: wrong result")
            strided = torch.zeros(12, 3, device=dev)[:, 1]
            dist.recv(strided, 0, tag=9)
            if not torch.equal(strided.cpu(), torch.arange(12.0)):
                failures.add(f"recv into a non-contiguous tensor: {strided.cpu().tolist()}")
        # From any source.
        if rank == 1:
            dist.send(torch.full((5,), 42.0, device=dev), 0, tag=4)
        else:
            t = torch.empty(5, device=dev)
            src = dist.recv(t, tag=4)
            if src != 1 or not torch.equal(t.cpu(), torch.full((5,), 42.0)):
                failures.add(f"recv from any source: src {src}, {t.cpu().tolist()}")
    # A receive posted while the caller's stream is still busy (a long
    # kernel queued before it), into a leaf that requires grad: it lands after
    # that work, and its Work completes only once the bytes are there.
    if rank < 2 <= world:
        if rank == 0:
            dist.send(torch.full((4099,), 9.0, device=dev), 1, tag=6)
        else:
            leaf = torch.zeros(4099, device=dev, requires_grad=True)
            _sleep_on_device(dev, 0.2)
            w = dist.irecv(leaf, 0, tag=6)
            w.wait()
            if not torch.equal(leaf.detach().cpu(), torch.full((4099,), 9.0)):
                failures.add(f"irecv behind a busy stream, into a leaf: {leaf.detach().cpu()[:4].tolist()}")
    # batch_isend_irecv: a ring, with all-reduces in flight beside it.
    ops = [dist.P2POp(dist.isend, torch.full((65537,), float(rank), device=dev), nxt),
           dist.P2POp(dist.irecv, torch.empty(65537, device=dev), prv)]
    s = torch.ones(4099, device=dev)
    ar = dist.all_reduce(s, async_op=True)
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    ar.wait()
    if not torch.equal(ops[1].tensor.cpu(), torch.full((65537,), float(prv))):
        failures.add("batch_isend_irecv ring: wrong result")
    if not torch.equal(s.cpu(), torch.full((4099,), float(world))):
        failures.add("all_reduce beside batch_isend_irecv: wrong result")
    kinds = {r["kind"] for r in fairring_py.dump_recent(file=io.StringIO())}
    if "send" not in kinds or "recv" not in kinds:
        failures.add(f"no native send/recv in the group's recent collectives: {sorted(kinds)}")
    delegated = sorted(k for k in kinds if "gloo" in k and k.startswith(("send", "recv")))
    if delegated:
        failures.add(f"CUDA sends or receives went to gloo: {delegated}")
    return {"failures": failures}


def sec_wire(rank, world, cfg):
    """Compressed rails (FAIRRING_WIRE_DTYPE, from the environment) on CUDA
    tensors, with either transport: float32/float64 SUM/AVG all-reduces and
    reduce-scatters within the compressed rails' bound, and the same bits as
    Fairring's CPU collectives in the same group (which round the same values
    with the CPU codec: the NCCL rail's CUDA codec must match it bit for
    bit).  Digests let the test compare ranks."""
    import test_wire_dtype as wire

    dev = _device(rank)
    failures, digests = Failures(), {}
    fmt = os.environ.get("FAIRRING_WIRE_DTYPE", "none")
    nodes = cfg["nodes"]
    seed = 90_000
    for dtype in (torch.float32, torch.float64):
        for op in ("SUM", "AVG"):
            for n in cfg["sizes"]:
                seed += 1
                ins = wire._inputs(world, seed, n, dtype)
                name = f"all_reduce {refs.dtype_name(dtype)}/{op}/n={n}"
                x = ins[rank].to(dev)
                try:
                    dist.all_reduce(x, op=op_of(op))
                    got = x.cpu()
                except Exception as e:  # noqa: BLE001
                    failures.add(f"{name}: raised {type(e).__name__}: {str(e)[:300]}")
                    continue
                digests[name] = digest(got)
                bad = wire.bound_failure(name, got, ins, op, nodes, fmt)
                if bad:
                    failures.add(bad)
                cpu = ins[rank].clone()
                dist.all_reduce(cpu, op=op_of(op))
                if digest(cpu) != digest(got):
                    failures.add(f"{name}: CUDA result differs from the CPU all-reduce's bits")
                if nodes > 1 and fmt == "bf16" and dtype == torch.float32 and op == "SUM":
                    if not torch.equal(got, got.to(torch.bfloat16).float()):
                        failures.add(f"{name}: result is not bf16-rounded (compression not applied?)")
        for per_rank in (7, 70_001):
            seed += 1
            ins = wire._inputs(world, seed, per_rank * world, dtype)
            name = f"reduce_scatter {refs.dtype_name(dtype)}/n={per_rank}"
            out = torch.empty(per_rank, dtype=dtype, device=dev)
            try:
                dist.reduce_scatter_tensor(out, ins[rank].to(dev))
                got = out.cpu()
            except Exception as e:  # noqa: BLE001
                failures.add(f"{name}: raised {type(e).__name__}: {str(e)[:300]}")
                continue
            mine = [t[rank * per_rank:(rank + 1) * per_rank] for t in ins]
            bad = wire.bound_failure(name, got, mine, "SUM", nodes, fmt, result_rounded=False)
            if bad:
                failures.add(bad)
            cpu = torch.empty(per_rank, dtype=dtype)
            dist.reduce_scatter_tensor(cpu, ins[rank].clone())
            if digest(cpu) != digest(got):
                failures.add(f"{name}: CUDA result differs from the CPU reduce_scatter's bits")
    # What is not compressed stays exact: ints, MAX.
    for dtype, op in ((torch.int64, "SUM"), (torch.float32, "MAX")):
        ins = [make_input(seed, r, 65537, dtype, op) for r in range(world)]
        got = _reduce_case(dev, rank, ins, dtype, op, f"all_reduce {refs.dtype_name(dtype)}/{op}", failures)
        if got is not None and not torch.equal(got, reference(ins, dtype, op).to(dtype)):
            failures.add(f"all_reduce {refs.dtype_name(dtype)}/{op}: not exact")
    return {"failures": failures, "digests": digests}


def sec_memory_budget(rank, world, cfg):
    """The CUDA engine's FAIRRING_TOTAL_MEMORY check counts the staged rail's
    wire buffers: run with a budget that fits the rails without them but not
    with them (cfg["fits"] says which this session expects)."""
    dev = _device(rank)
    failures = Failures()
    x = torch.ones(1031, device=dev)
    try:
        dist.all_reduce(x)
        if not cfg["fits"]:
            failures.add("the CUDA all-reduce ran: the budget check did not count the wire buffers")
        elif not torch.all(x.cpu() == world):
            failures.add("wrong result")
    except Exception as e:  # noqa: BLE001
        if cfg["fits"] or "FAIRRING_TOTAL_MEMORY" not in str(e):
            failures.add(f"raised {type(e).__name__}: {str(e)[:300]}")
    return {"failures": failures}


def sec_issue_order(rank, world, cfg):
    """The CPU suite's issue-order patterns (tests/rank_op_order.py) on CUDA tensors:
    async ops on views of one storage give what running them one by one gives."""
    import rank_op_order

    res = rank_op_order.session(rank, world, {"sizes": cfg.get("order_sizes", [1, 16385, 262144, 1 << 20]),
                                           "repeats": 2, "free_sizes": [100000], "device": "cuda"})
    return {"failures": res["failures"] + res["free_waits"]}


SECTIONS = {"issue_order": sec_issue_order, "exchanges": sec_exchanges, "p2p": sec_p2p, "wire": sec_wire, "memory_budget": sec_memory_budget, "collectives": sec_collectives, "poll_then_launch": sec_poll_then_launch, "big_slices": sec_big_slices,
            "slow_producer": sec_slow_producer, "group_cycles": sec_group_cycles,
            "nccl_shared_gpu": sec_nccl_shared_gpu, "correctness": sec_correctness, "half_range": sec_half_range_cuda, "streams": sec_streams, "errors": sec_errors, "ddp": sec_ddp}


def session(rank, world, sections, cfg):
    out = {}
    for name in sections:
        try:
            res = SECTIONS[name](rank, world, cfg)
        except Exception as e:  # noqa: BLE001
            res = {"failures": [f"section {name} raised {type(e).__name__}: {e}\n{traceback.format_exc()}"]}
        out[name] = res
    torch.cuda.synchronize()
    return out
