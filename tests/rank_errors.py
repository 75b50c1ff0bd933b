"""Rank-side code of the error tests (spawned by launch.run_ranks)."""
from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import launch

R = dist.ReduceOp


def _attempt(fn):
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return {"raised": True, "type": type(e).__name__, "is_runtime": isinstance(e, RuntimeError),
                "msg": str(e)[:2000], "elapsed": time.monotonic() - t0}
    return {"raised": False, "elapsed": time.monotonic() - t0}


MISMATCH_KINDS = ["numel", "numel-small-vs-large", "dtype", "op", "barrier"]


def mismatch(rank, world, timeout_s):
    """One fresh fairring group per kind of mismatch; the odd rank out differs."""
    groups = {k: dist.new_group(list(range(world)), backend="fairring", timeout=timedelta(seconds=timeout_s))
              for k in MISMATCH_KINDS}
    sync = dist.new_group(list(range(world)), backend="gloo")
    out = {}
    for k in MISMATCH_KINDS:
        g = groups[k]
        if k != "numel":  # "numel" is the group's first collective; the others are warmed up
            t = torch.ones(1000)
            dist.all_reduce(t, group=g)
            out.setdefault("warmup_ok", []).append(bool(torch.all(t == world)))
            # An error aborts what is still in flight on every rank; let the
            # warm-up finish everywhere before the mismatch.
            dist.barrier(group=sync)
        n, dt, op = 1000, torch.float32, R.SUM
        if k == "numel" and rank == world - 1:
            n = 1001
        if k == "numel-small-vs-large":
            n = 1_000_003 if rank == 0 else 7
        if k == "dtype" and rank == 0:
            dt = torch.float64
        if k == "op" and rank == world - 1:
            op = R.MAX
        t = torch.ones(n, dtype=dt)
        if k == "barrier":
            # The same bytes as a barrier's (one uint8, MAX): only the kind differs.
            t = torch.ones(1, dtype=torch.uint8)
            if rank == world - 1:
                first = _attempt(lambda: dist.barrier(group=g))
            else:
                first = _attempt(lambda: dist.all_reduce(t, op=R.MAX, group=g))
        else:
            first = _attempt(lambda: dist.all_reduce(t, op=op, group=g))
        later = _attempt(lambda: dist.all_reduce(torch.ones(10), group=g))
        out[k] = {"first": first, "later": later}
    return out


def _skew(s, d, world):
    """How much rank s's block for rank d differs from the average: every
    rank's sends and receives still add up to world x the average."""
    return (s + d) % world - (s + d + 1) % world


def stall_or_die(rank, world, culprit, how, timeout_s, sync_dir=None):
    """Everyone does a correct all_reduce; then `culprit` stalls (sleeps past
    the timeout, staying alive until the others are done, as told by files in
    sync_dir) or dies (os._exit), the others all_reduce again (or, for
    "die-at-barrier", enter a barrier)."""
    t = torch.ones(65537)
    dist.all_reduce(t)
    warm = bool(torch.all(t == world))
    maps = [n for n, _ in launch.own_shm_mappings()]
    if how.startswith("die-mid-"):
        # everyone starts a large (many-slice) collective; the culprit dies
        # right after posting it, while data is in flight
        n = 16_000_057 // world
        work = {
            "die-mid-op": lambda: dist.all_reduce(torch.ones(16_000_057), async_op=True),
            "die-mid-reduce_scatter": lambda: dist.reduce_scatter_tensor(
                torch.empty(n), torch.ones(n * world), async_op=True),
            "die-mid-all_gather": lambda: dist.all_gather_into_tensor(
                torch.empty(n * world), torch.ones(n), async_op=True),
            "die-mid-broadcast": lambda: dist.broadcast(torch.ones(16_000_057), src=world - 1, async_op=True),
            "die-mid-all_to_all": lambda: dist.all_to_all_single(
                torch.empty(n * world), torch.ones(n * world), async_op=True),
            # (returns once the sizes are shared: the blocks are in flight)
            "die-mid-all_to_all-splits": lambda: dist.all_to_all_single(
                torch.empty(n * world), torch.ones(n * world), [n + _skew(s, rank, world) for s in range(world)],
                [n + _skew(rank, d, world) for d in range(world)], async_op=True),
        }[how]()
        if rank == culprit:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(launch.DELIBERATE_EXIT)
        first = _attempt(lambda: work.wait())
        later = _attempt(lambda: dist.all_reduce(torch.ones(10)))
        later_async = _attempt(lambda: dist.all_reduce(torch.ones(10), async_op=True).wait())
        return {"culprit": False, "warm": warm, "maps": maps, "first": first, "later": later,
                "later_async": later_async}
    if rank == culprit:
        if how in ("die", "die-at-barrier"):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(launch.DELIBERATE_EXIT)
        if how == "destroy":
            # Leaves while the others still issue collectives.
            dist.destroy_process_group()
        give_up = time.monotonic() + 2 * timeout_s + 15
        others = [r for r in range(world) if r != culprit]
        while time.monotonic() < give_up:
            if sync_dir and all(os.path.exists(os.path.join(sync_dir, f"done{r}")) for r in others):
                break
            time.sleep(0.2)
        time.sleep(1.0)
        return {"culprit": True, "warm": warm, "maps": maps}
    first = _attempt(lambda: dist.barrier() if how == "die-at-barrier" else dist.all_reduce(torch.ones(4099)))
    later = _attempt(lambda: dist.all_reduce(torch.ones(10)))
    later_async = _attempt(lambda: dist.all_reduce(torch.ones(10), async_op=True).wait())
    if sync_dir:
        open(os.path.join(sync_dir, f"done{rank}"), "w").close()
    return {"culprit": False, "warm": warm, "maps": maps, "first": first, "later": later, "later_async": later_async}


BAD_ENV = [
    ("FAIRRING_SLICE_SIZE", "abc"),
    ("FAIRRING_SLICE_SIZE", "0"),
    ("FAIRRING_SLICE_SIZE", "-4K"),
    ("FAIRRING_SLICE_SIZE", "12Q"),
    ("FAIRRING_PARALLELISM", "-1"),
    ("FAIRRING_PARALLELISM", "0"),
    ("FAIRRING_PARALLELISM", "two"),
    ("FAIRRING_TOTAL_MEMORY", "lots"),
    ("FAIRRING_TOTAL_MEMORY", "0"),
    ("FAIRRING_SOCKET_IFNAME", "nosuchif0"),
    # Sizes whose arithmetic used to overflow (2^62 bytes), or that no int64 holds.
    ("FAIRRING_SLICE_SIZE", "4294967296G"),
    ("FAIRRING_SLICE_SIZE", "99999999999999999999"),
    ("FAIRRING_SLICE_SIZE", "1e30"),
    ("FAIRRING_SLICE_SIZE", "2G"),
    ("FAIRRING_TOTAL_MEMORY", "99999999999999999999"),
    ("FAIRRING_PARALLELISM", "100000"),
    ("FAIRRING_PARALLELISM", "99999999999999999999"),
    ("FAIRRING_NODE_ID", "   "),
]

BAD_OPTIONS = [
    ("slice_size", {"slice_size": 0}),
    ("slice_size", {"slice_size": -1}),
    ("parallelism", {"parallelism": 0}),
    ("parallelism", {"parallelism": -1}),
    ("total_memory", {"total_memory": 0}),
    ("socket_ifname", {"socket_ifname": "nosuchif0"}),
    ("slice_size", {"slice_size": 2 ** 62}),
    ("total_memory", {"total_memory": 10 ** 20}),
    ("parallelism", {"parallelism": 10 ** 20}),
]


def validation(rank, world, store_dir):
    """Bad options raise ValueError naming the variable/field at init time;
    good ones (with size suffixes) work.  Uses a fresh FileStore per attempt."""
    import fairring_py

    out = {"env": [], "options": [], "good": None}
    i = 0

    def init(**kw):
        nonlocal i
        i += 1
        dist.init_process_group("fairring", rank=rank, world_size=world,
                                init_method=f"file://{store_dir}/store{i}", timeout=timedelta(seconds=20), **kw)

    def outcome(fn):
        try:
            fn()
        except ValueError as e:
            return ("ValueError", str(e)[:500])
        except Exception as e:  # noqa: BLE001
            return (type(e).__name__, str(e)[:500])
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        return ("no error", "")

    for var, val in BAD_ENV:
        saved = os.environ.get(var)
        os.environ[var] = val
        try:
            out["env"].append((var, val) + outcome(init))
        finally:
            if saved is None:
                del os.environ[var]
            else:
                os.environ[var] = saved
    for field, kw in BAD_OPTIONS:
        out["options"].append((field, repr(kw)) + outcome(lambda: init(pg_options=fairring_py.Options(**kw))))

    # valid settings, env and Options
    good_env = {"FAIRRING_SLICE_SIZE": "256K", "FAIRRING_PARALLELISM": "2",
                "FAIRRING_TOTAL_MEMORY": "8M", "FAIRRING_SOCKET_IFNAME": "lo"}
    os.environ.update(good_env)
    try:
        def good():
            init()
            t = torch.arange(300_007, dtype=torch.float32) * (rank + 1)
            dist.all_reduce(t)
            exp = torch.arange(300_007, dtype=torch.float32) * sum(range(1, world + 1))
            if not torch.equal(t, exp):
                raise AssertionError("wrong all_reduce result with FAIRRING_SLICE_SIZE=256K")
            addr = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).listen_address()
            out["good_addr"] = addr
        out["good"] = outcome(good)
    finally:
        for k in good_env:
            del os.environ[k]

    # Options that fix the shared layout and the slices must agree between
    # ranks: every rank is told which one differs.
    out["disagree"] = []
    # (None: unset.  A rank that leaves the slice size to the group's shape and
    # one that sets the default both say 1 MiB, but with many ranks between
    # nodes the first would use more: they disagree.)
    for var, vals in (("FAIRRING_SLICE_SIZE", ("64K", "128K")), ("FAIRRING_PARALLELISM", ("2", "3")),
                      ("FAIRRING_SLICE_SIZE", ("1M", None))):
        if vals[rank % 2] is not None:
            os.environ[var] = vals[rank % 2]
        try:
            out["disagree"].append((var,) + outcome(init))
        finally:
            os.environ.pop(var, None)

    def good_opts():
        init(pg_options=fairring_py.Options(slice_size=16 * 1024, total_memory=4 << 20, parallelism=4,
                                            socket_ifname="lo"))
        t = torch.full((100_003,), float(rank))
        dist.all_reduce(t)
        if not torch.all(t == sum(range(world))):
            raise AssertionError("wrong all_reduce result with Options")
    out["good_options"] = outcome(good_opts)
    return out


def init_failure(rank, world, store_dir, timeout_s):
    """Group creation with a setting that fails on one rank only (its env,
    set by the test): every rank must fail, promptly, with the first cause."""
    import fairring_py  # noqa: F401  registers the backend

    t0 = time.monotonic()
    try:
        dist.init_process_group("fairring", rank=rank, world_size=world, init_method=f"file://{store_dir}/store",
                                timeout=timedelta(seconds=timeout_s))
        res = {"raised": False}
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        res = {"raised": True, "type": type(e).__name__, "msg": str(e)[:2000]}
    res["elapsed"] = time.monotonic() - t0
    return res


def late_peer(rank, world, late_rank, late_s):
    """`late_rank` issues its all_reduce `late_s` after the others, still
    within the group's timeout: everyone must succeed, with the right sum."""
    dist.barrier()
    if rank == late_rank:
        time.sleep(late_s)
    t0 = time.monotonic()
    x = torch.full((1000,), float(rank + 1))
    out = _attempt(lambda: dist.all_reduce(x))
    out["elapsed"] = time.monotonic() - t0
    out["right"] = bool(torch.all(x == sum(range(1, world + 1))))
    # Still usable afterwards, on every rank.
    y = torch.ones(70_000)
    out["after"] = _attempt(lambda: dist.all_reduce(y))
    out["after_right"] = bool(torch.all(y == world))
    return out


def stop_mid_stream(rank, world, culprit, timeout_s):
    """A stream of large all_reduces; `culprit` stops itself (SIGSTOP) in the
    middle of it, and is woken long after the others gave up.  The others
    must name the culprit, not a node-mate blocked behind it."""
    import signal
    import subprocess

    t = torch.ones(65537)
    dist.all_reduce(t)
    warm = bool(torch.all(t == world))
    works = [dist.all_reduce(torch.ones(2_000_003), async_op=True) for _ in range(4)]
    if rank == culprit:
        # Someone must wake us: a sleeper outside this process.
        # Every survivor has given up by 1.35 x timeout (deadlines.h).
        subprocess.Popen(["sh", "-c", f"sleep {1.5 * timeout_s + 2}; kill -CONT {os.getpid()}"])
        os.kill(os.getpid(), signal.SIGSTOP)
        for w in works:
            _attempt(w.wait)
        return {"culprit": True, "warm": warm}

    def wait_all():
        for w in works:
            w.wait()
    first = _attempt(wait_all)
    later = _attempt(lambda: dist.all_reduce(torch.ones(10)))
    later_async = _attempt(lambda: dist.all_reduce(torch.ones(10), async_op=True).wait())
    return {"culprit": False, "warm": warm, "first": first, "later": later, "later_async": later_async}


def fork_after_init(rank, world):
    """fork() after init: the child's use of the inherited group is a clear
    error and touches nothing of the parent's; the child tears the group
    down and exits without hanging; the parents' group still works."""
    import fairring_py

    x = torch.ones(1000)
    dist.all_reduce(x)
    out = {"warm": bool(torch.all(x == world))}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        try:
            try:
                dist.all_reduce(torch.ones(10))
                msg = "no error"
            except RuntimeError as e:
                msg = "RuntimeError: " + str(e)
            try:
                dist.barrier()
                msg += "\nbarrier: no error"
            except RuntimeError as e:
                msg += "\nbarrier: RuntimeError: " + str(e)
            # What a normal exit runs: fairring's atexit hook, then the group's teardown.
            fairring_py._C._quiesce_all()
            dist.destroy_process_group()
            msg += "\ntorn down"
        except BaseException as e:  # noqa: BLE001
            msg = f"child raised {type(e).__name__}: {e}"
        os.write(w, msg.encode()[:8000])
        os.close(w)
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + 30
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        status = "hung"
    with os.fdopen(r) as f:
        out["child"] = f.read()
    out["child_status"] = status
    y = torch.full((100_000,), float(rank))
    out["after"] = _attempt(lambda: dist.all_reduce(y))
    out["after_right"] = bool(torch.all(y == sum(range(world))))
    return out


def hostile_peers(rank, world, flood):
    """Rank 0 attacks rank 1's rail listener while the job runs: a silent
    connection, garbage, a well-formed greeting with a wrong secret, one with
    an absurd rank, and `flood` connections at once.  Results stay right."""
    import socket
    import struct

    addr = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).listen_address()
    addrs = [None] * world
    dist.all_gather_object(addrs, addr)
    out = {"right": True}
    socks = []
    if rank == 0:
        host, _, port = addrs[1].rpartition(":")
        target = (host.strip("[]"), int(port))
        socks.append(socket.create_connection(target, timeout=10))  # silent
        g = socket.create_connection(target, timeout=10)
        g.sendall(os.urandom(48))
        socks.append(g)
        for claimed in (1, 2**31 - 1):
            h = socket.create_connection(target, timeout=10)
            h.sendall(b"FAIRRNG1" + struct.pack("<iI", claimed, 0) + os.urandom(32))
            socks.append(h)
        for _ in range(flood):
            try:
                socks.append(socket.create_connection(target, timeout=10))
            except OSError:
                break
    for i in range(5):
        x = torch.full((65537 + i,), float(rank + 1))
        dist.all_reduce(x)
        out["right"] &= bool(torch.all(x == sum(range(1, world + 1))))
    dist.barrier()
    for s in socks:
        s.close()
    time.sleep(0.5)
    y = torch.ones(4099)
    dist.all_reduce(y)
    out["right"] &= bool(torch.all(y == world))
    return out


def bad_tensors(rank, world):
    """Tensors users pass by accident: each gives the right result or a clear
    error (never a crash, never silently wrong numbers), and the group keeps
    working.  Returns {case: (outcome, detail)}."""
    out = {}
    want = float(sum(range(1, world + 1)))

    def case(name, fn):
        try:
            detail = fn()
            out[name] = ("ok" if detail is None else "wrong", detail)
        except (RuntimeError, ValueError, TypeError) as e:
            out[name] = ("error", f"{type(e).__name__}: {str(e)[:300]}")

    def conj():
        z = torch.full((33,), complex(rank + 1, rank + 1), dtype=torch.complex64).conj()
        dist.all_reduce(z)
        ref = complex(want, -want)
        return None if torch.all(z.resolve_conj() == ref) else f"got {z[:2].tolist()}, want {ref}"
    case("conj-bit", conj)

    # Not here: a tensor with the negative bit set (x._neg_view()).  torch's
    # dispatcher hands every backend a resolved copy and copies it back
    # before the collective has run, so it stays unchanged on gloo too.

    def expanded():
        x = torch.full((1,), float(rank + 1)).expand(1000)
        dist.all_reduce(x)
        return None if torch.all(x == want) else f"got {x[:2].tolist()}"
    case("expanded-stride0", expanded)

    def overlapping():
        base = torch.full((20,), float(rank + 1))
        x = base.as_strided((10, 4), (1, 1))  # rows overlap
        dist.all_reduce(x)
        return None if torch.all(x == want) else f"got {x.flatten()[:4].tolist()}"
    case("overlapping-view", overlapping)

    def zero_dim():
        x = torch.tensor(float(rank + 1))
        dist.all_reduce(x)
        return None if x.item() == want and x.dim() == 0 else f"got {x}"
    case("0-dim", zero_dim)

    def empty():
        x = torch.empty(0, 5)
        dist.all_reduce(x)
        return None if x.shape == (0, 5) else f"shape {tuple(x.shape)}"
    case("empty", empty)

    def leaf():
        x = torch.full((100,), float(rank + 1), requires_grad=True)
        dist.all_reduce(x)
        return None if torch.all(x.detach() == want) else f"got {x[:2].tolist()}"
    case("requires-grad-leaf", leaf)

    def meta():
        # torch's dispatcher treats a meta tensor's all_reduce as shape-only
        # and never reaches a backend: no data, nothing to get wrong.
        x = torch.empty(10, device="meta")
        dist.all_reduce(x)
        return None if x.shape == (10,) and x.is_meta else f"meta tensor became {x}"
    case("meta", meta)

    def rs_uneven_wrong_output():
        # Blocks of unequal sizes, every rank's output one element too long.
        dist.reduce_scatter(torch.empty(rank + 2), [torch.ones(j + 1) for j in range(world)])
        return "no error"
    case("rs-uneven-wrong-output", rs_uneven_wrong_output)

    x = torch.full((4099,), float(rank + 1))
    dist.all_reduce(x)
    out["after"] = ("ok" if torch.all(x == want) else "wrong", None)
    return out


def all_killed(rank, world, sync_dir):
    """Every rank of the job is SIGKILLed in the middle of an all_reduce
    stream; first each notes the segments it maps (for the test to check)."""
    import signal

    dist.all_reduce(torch.ones(65537))
    with open(os.path.join(sync_dir, f"maps{rank}"), "w") as f:
        f.write("\n".join(n for n, _ in launch.own_shm_mappings()))
    works = [dist.all_reduce(torch.ones(1_000_003), async_op=True) for _ in range(3)]
    del works
    os.kill(os.getpid(), signal.SIGKILL)


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def hostile_flood(rank, world, flood, hold_s):
    """Rank 0 opens `flood` connections to rank 1's rail port at once
    (non-blocking connects, all in flight together): a third stay silent, a
    third send garbage, a third a greeting with the right magic and a wrong
    secret.  It holds them `hold_s` seconds (past the 5 s greeting deadline)
    while every rank runs checked all-reduces, then closes them.  Rank 1
    samples its RSS and open fds before, during and after."""
    import select
    import socket
    import struct

    addr = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).listen_address()
    addrs = [None] * world
    dist.all_gather_object(addrs, addr)
    want = float(sum(range(1, world + 1)))
    out = {"right": True, "connected": 0}

    def checked_all_reduce(n):
        x = torch.full((n,), float(rank + 1))
        dist.all_reduce(x)
        out["right"] &= bool(torch.all(x == want))

    for _ in range(3):
        checked_all_reduce(1_000_003)
    dist.barrier()
    if rank == 1:
        out["rss_before"] = _rss_bytes()
        out["fds_before"] = _open_fds()
    dist.barrier()

    socks = []
    if rank == 0:
        host, _, port = addrs[1].rpartition(":")
        target = (host.strip("[]"), int(port))
        for _ in range(flood):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex(target)
            socks.append(s)
        # Wait for the connects to complete, all together.
        waiting = list(socks)
        deadline = time.monotonic() + 20
        connected = []
        while waiting and time.monotonic() < deadline:
            _, writable, _ = select.select([], waiting, [], 0.5)
            for s in writable:
                waiting.remove(s)
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    connected.append(s)
        out["connected"] = len(connected)
        for i, s in enumerate(connected):
            try:
                if i % 3 == 1:
                    s.send(os.urandom(48))
                elif i % 3 == 2:
                    s.send(b"FAIRRNG1" + struct.pack("<iI", 1 - rank, 0) + os.urandom(32))
            except OSError:
                pass
    rss_peak = 0
    t_end = time.monotonic() + hold_s
    ops = 0
    while True:
        checked_all_reduce(1_000_003)
        ops += 1
        if rank == 1:
            rss_peak = max(rss_peak, _rss_bytes())
        # Every rank runs the same number of ops: rank 0 decides when to stop.
        go_on = torch.tensor([1 if time.monotonic() < t_end else 0])
        dist.broadcast(go_on, src=0)
        if not go_on.item():
            break
    for s in socks:
        s.close()
    time.sleep(1.0)
    checked_all_reduce(4099)
    dist.barrier()
    if rank == 1:
        out["rss_peak"] = rss_peak
        out["rss_after"] = _rss_bytes()
        out["fds_after"] = _open_fds()
    out["ops"] = ops
    return out


def shm_modes(rank, world):
    """The permission bits and owner of every fairring segment this rank maps
    (stat through /proc/self/map_files: the names are gone once mapped)."""
    t = torch.ones(1000)
    dist.all_reduce(t)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.rstrip("\n").split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/dev/shm/fairring-"):
                st = os.stat(f"/proc/self/map_files/{parts[0]}")
                out.append((parts[5], st.st_mode & 0o777, st.st_uid))
    return {"ok": bool(torch.all(t == world)), "maps": out, "uid": os.getuid()}


def abort_and_shutdown(rank, world, culprit, timeout_s):
    """abort() and shutdown() of groups with ops in flight while `culprit` stalls
    (never issues them), each followed by a fresh group in the same processes.
    Returns what each step raised and how long it took."""
    import threading

    def group():
        return dist.new_group(list(range(world)), backend="fairring", timeout=timedelta(seconds=timeout_s))

    def fresh_group_works(tag):
        g = group()
        t = torch.full((1031,), float(rank + 1))
        dist.all_reduce(t, group=g)
        out[tag] = bool(torch.all(t == world * (world + 1) / 2))
        return g

    sync = dist.new_group(list(range(world)), backend="gloo")
    out = {}
    # 1. abort(), from another thread, while the main thread waits for ops a peer never joins.
    g = group()
    backend = g._get_backend(torch.device("cpu"))
    if rank != culprit:
        t = torch.ones(1 << 20)
        works = [dist.all_reduce(t, group=g, async_op=True) for _ in range(3)]
        timer = threading.Timer(0.5, dist.distributed_c10d._abort_process_group, args=(g,))
        t0 = time.monotonic()
        timer.start()
        out["abort_waits"] = [_attempt(w.wait) for w in works]
        out["abort_elapsed"] = time.monotonic() - t0
        timer.join()
        out["after_abort"] = _attempt(lambda: backend.allreduce([torch.ones(4)]).wait())
    dist.barrier(group=sync)
    if rank == culprit:
        dist.distributed_c10d._abort_process_group(g)
    g = backend = None  # drop the references (the lambdas above ran already)
    fresh_group_works("after_abort_fresh_group")

    # 2. shutdown() (destroy_process_group) with an op in flight that a peer never joins:
    # it drains for the group's timeout, then aborts what is left.
    g = group()
    if rank != culprit:
        work = dist.all_reduce(torch.ones(1 << 20), group=g, async_op=True)
        t0 = time.monotonic()
        dist.destroy_process_group(g)
        out["shutdown_elapsed"] = time.monotonic() - t0
        out["shutdown_wait"] = _attempt(work.wait)
    dist.barrier(group=sync)
    if rank == culprit:
        dist.destroy_process_group(g)

    # 3. a clean shutdown: what was issued completes; later ops fail at once.
    g = group()
    backend = g._get_backend(torch.device("cpu"))
    t = torch.full((100_003,), float(rank + 1))
    work = dist.all_reduce(t, group=g, async_op=True)
    dist.destroy_process_group(g)
    out["clean_shutdown_wait"] = _attempt(work.wait)
    out["clean_shutdown_result"] = bool(torch.all(t == world * (world + 1) / 2))
    out["after_shutdown"] = _attempt(lambda: backend.allreduce([torch.ones(4)]).wait())
    backend = None
    fresh_group_works("after_shutdown_fresh_group")
    dist.barrier(group=sync)
    return out


def interrupted_wait(rank, world, culprit, timeout_s):
    """Ctrl-C (SIGINT) on a rank blocked in all_reduce while `culprit` never
    arrives: KeyboardInterrupt within a second, and the group fails on every
    rank, naming the interrupted rank."""
    import signal
    import threading

    out = {}
    g = dist.new_group(list(range(world)), backend="fairring", timeout=timedelta(seconds=timeout_s))
    sync = dist.new_group(list(range(world)), backend="gloo")
    interrupted = culprit == 0 and 1 or 0
    if rank == interrupted:
        # Python turns SIGINT into KeyboardInterrupt only if it was not ignored
        # when the process started, and a suite started in the background of a
        # non-interactive shell inherits it ignored: set what a terminal gives.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Timer(1.0, os.kill, args=(os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1 << 20), group=g)
            out["raised"] = "nothing"
        except KeyboardInterrupt:
            out["raised"] = "KeyboardInterrupt"
        except Exception as e:  # noqa: BLE001
            out["raised"] = f"{type(e).__name__}: {e}"
        out["elapsed"] = time.monotonic() - t0
    dist.barrier(group=sync)
    # The group failed on every rank: the next op raises at once, naming the interrupted
    # rank (the others' first op is the interrupted one's op #0, of the same size).
    out["next"] = _attempt(lambda: dist.all_reduce(torch.ones(4 if rank == interrupted else 1 << 20), group=g))
    dist.barrier(group=sync)
    return out


def init_failure_store_host_exits(rank, world, port, out_dir, timeout_s):
    """Group creation that fails on rank 0, which hosts the TCP store and exits
    the moment its error reaches it (as a script does): the others must still
    get its cause, not a bare connection error.  Rank 0 writes what it raised
    to out_dir/rank0.json, then exits with launch.DELIBERATE_EXIT."""
    import json

    import fairring_py  # noqa: F401  registers the backend

    t0 = time.monotonic()
    try:
        dist.init_process_group("fairring", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                                timeout=timedelta(seconds=timeout_s))
        res = {"raised": False}
    except Exception as e:  # noqa: BLE001
        res = {"raised": True, "type": type(e).__name__, "msg": str(e)[:2000]}
    res["elapsed"] = time.monotonic() - t0
    if rank == 0:
        with open(os.path.join(out_dir, "rank0.json"), "w") as f:
            json.dump(res, f)
        os._exit(launch.DELIBERATE_EXIT)
    return res


def memory_after_failure(rank, world, slow_rank, delay_s, drop):
    """An all_reduce of 2x1 fails while ``slow_rank``'s rail thread sits
    (FAIRRING_TEST_RAIL_REDUCE_DELAY_MS) right before it reduces its shard
    into that rank's tensor.  Returns the error, when it came, and whether
    the tensor changed after the error had been raised (it must not, unless
    the error says the rail thread still holds it).  ``drop``: a 16 MiB
    tensor, dropped right after the error instead (its pages go back to the
    system unless Fairring still holds them: a late write would crash)."""
    x = torch.full((4 * 1024 * 1024 if drop else 65536,), float(rank + 1))
    t0 = time.monotonic()
    err = _attempt(lambda: dist.all_reduce(x))
    err["at"] = time.monotonic() - t0
    snap = None if drop else x.clone()
    if drop:
        del x
    # Past the point where the slow rail thread wakes up and writes.
    time.sleep(max(0.0, delay_s + 1.0 - (time.monotonic() - t0)))
    changed = 0 if drop else int((x != snap).sum())
    return {"error": err, "changed_after_error": changed}


def killed_during_init(rank, world, sync_dir, kill_after_s):
    """Creates the group itself (env://), while a thread SIGKILLs this rank
    ``kill_after_s`` into it; rank 0's thread first writes what /dev/shm
    holds of its segments then (rank 1 is still late: FAIRRING_TEST_ARENA_DELAY_MS)."""
    import signal
    import threading

    def killer():
        time.sleep(kill_after_s)
        if rank == 0:
            with open(os.path.join(sync_dir, "shm.tmp"), "w") as f:
                # Only what this rank created (its "-p<pid>" tag): tests beside
                # this one create segments of their own meanwhile.
                f.write("\n".join(sorted(n for n in launch.list_shm() if n.endswith(f"-p{os.getpid()}"))))
            os.replace(os.path.join(sync_dir, "shm.tmp"), os.path.join(sync_dir, "shm"))
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=killer, daemon=True).start()
    import fairring_py  # noqa: F401

    dist.init_process_group("fairring", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    time.sleep(60)  # never reached before the kill


def numbers_agree(rank, world, timeout_s):
    """The op number an error names is the one dump_recent and the logs give
    it: the group's count, delegated ops included (here gloo's monitored
    barrier, #0), not the engine's own (which would call the failing op #1)."""
    import io

    import fairring_py

    g = dist.new_group(list(range(world)), backend="fairring", timeout=timedelta(seconds=timeout_s))
    g.monitored_barrier()  # delegated: #0
    t = torch.ones(100)
    dist.all_reduce(t, group=g)  # #1
    n = 101 if rank == world - 1 else 100
    failed = _attempt(lambda: dist.all_reduce(torch.ones(n), group=g))  # #2
    recs = fairring_py.dump_recent(g, file=io.StringIO())
    return {"failed": failed, "recent": [(r["seq"], r["kind"], r["state"]) for r in recs],
            "sum_ok": bool(torch.all(t == world))}


def rejected_in_turn(rank, world, case):
    """Arguments a rank can only judge by its own place (its block of an
    uneven list, the root's list): the rank that rejects its own still takes
    the op's turn (FairringBackend::reject_in_turn).  "one": only rank 1's
    own block of the all_gather list is wrong (every rank passes the same
    list); "all": every rank's own block is wrong; "gather-root": the root's
    list is short; "scatter-list-off-root": rank 1, not the root, passes a
    list.  What each rank raised, how long it took, and whether an all_reduce
    after it gives the right sum."""
    t0 = time.monotonic()
    try:
        if case == "one":
            out = [torch.zeros(3) for _ in range(world)]
            out[1] = torch.zeros(4)
            dist.all_gather(out, torch.ones(3))
        elif case == "all":
            dist.all_gather([torch.zeros(4) for _ in range(world)], torch.ones(3))
        elif case == "gather-root":
            dist.gather(torch.ones(3), [torch.zeros(3) for _ in range(world - 1)] if rank == 0 else None, dst=0)
        elif case == "scatter-list-off-root":
            backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
            opts = dist.ScatterOptions()
            opts.rootRank = 0
            lists = [[torch.ones(3) for _ in range(world)]] if rank in (0, 1) else []
            backend.scatter([torch.zeros(3)], lists, opts).wait()
        error = None
    except Exception as e:  # noqa: BLE001
        error = f"{type(e).__name__}: {e}"
    took = time.monotonic() - t0
    try:
        t = torch.ones(5)
        dist.all_reduce(t)
        after = "ok" if t.tolist() == [float(world)] * 5 else f"wrong: {t.tolist()}"
    except Exception as e:  # noqa: BLE001
        after = f"{type(e).__name__}: {e}"
    return {"error": error, "took": took, "after": after}


def splits_past_int64_and_short_lists(rank, world):
    """Splits whose sum wraps around int64 to the row count (each one
    non-negative), and an all_gather list one tensor short: every rank's
    own clear error, the same on all, and the group goes on."""
    errors = {}
    big = [2**62 + 2] * 4 if world == 4 else [2**62, 2**62] + [2**63 - 1] * (world - 2)
    # On 4 ranks the sum wraps to exactly the rows (8); on 3 to -1.
    rows = 8 if world == 4 else 6
    cases = {
        "splits": lambda: dist.all_to_all_single(torch.zeros(rows), torch.ones(rows), big, big),
        "short-list": lambda: dist.all_gather([torch.zeros(3) for _ in range(world - 1)], torch.ones(3)),
    }
    for name, call in cases.items():
        try:
            call()
            errors[name] = None
        except Exception as e:  # noqa: BLE001
            errors[name] = f"{type(e).__name__}: {e}"
    t = torch.ones(5)
    dist.all_reduce(t)
    return {"errors": errors, "after": t.tolist() == [float(world)] * 5}
