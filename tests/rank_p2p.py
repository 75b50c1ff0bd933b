"""Code that runs inside the ranks of tests/test_p2p.py: send, recv,
isend/irecv, batch_isend_irecv and recv from any source on Fairring
(p2p/: shared memory within a node, TCP between nodes), against payloads
that both ends generate independently from (seed, sender, receiver, index),
compared bit for bit."""
from __future__ import annotations

import io
import os
import sys
import time

import torch
import torch.distributed as dist

import launch
import refs
from rank_all_to_all import _check
from rank_all_reduce import Failures


def payload(seed, src, dst, index, numel, dtype):
    """What `src` sends `dst` as its message number `index`: both ends make it."""
    return refs.make_input(seed * 1_000_003 + index * 1009 + dst, src, numel, dtype, "SUM")


def recent_kinds(since=-1):
    import fairring_py

    return [r["kind"] for r in fairring_py.dump_recent(file=io.StringIO()) if r["seq"] > since]


def ring_exchange(rank, world, cfg):
    """Every rank sends to every other rank, for every dtype and size, with
    isend/irecv posted in a shuffled order, several messages per pair and
    tag in flight at once (tag order), contiguous and strided tensors."""
    failures = Failures()
    seed = cfg.get("seed", 7)
    g = torch.Generator().manual_seed(seed + 1000 * rank)
    sizes = cfg["sizes"]
    index = 0
    for dtype in refs.ALL_DTYPES:
        for n in sizes:
            index += 1
            works, checks = [], []
            ops = []
            for peer in range(world):
                if peer == rank:
                    continue
                for k in range(2):  # two messages per pair and tag: their order matters
                    msg = index * 10 + k
                    out_data = payload(seed, rank, peer, msg, n, dtype)
                    want = payload(seed, peer, rank, msg, n, dtype)
                    strided = cfg["strided"] and (n + k) % 2 == 1 and n > 1
                    if strided:
                        # a strided view: every other element of a larger tensor
                        big = torch.zeros(2 * n, dtype=dtype)
                        big[::2] = out_data
                        send_t = big[::2]
                        holder = torch.zeros(2 * n, dtype=dtype)
                        recv_t = holder[1::2]
                    else:
                        send_t = out_data
                        recv_t = torch.zeros(n, dtype=dtype)
                    ops.append(("send", send_t, peer, 3))
                    ops.append(("recv", recv_t, peer, 3))
                    checks.append((f"{refs.dtype_name(dtype)}/n={n}/from {peer}/#{k}", recv_t, want))
            # Shuffle sends against receives, keeping each pair's sends (and
            # receives) in their order: the tag order is what is tested.
            order = torch.randperm(len(ops), generator=g).tolist()
            sends = [op for op in ops if op[0] == "send"]
            recvs = [op for op in ops if op[0] == "recv"]
            issued = []
            for i in order:
                pool = sends if ops[i][0] == "send" else recvs
                issued.append(pool.pop(0))
            for kind, t, peer, tag in issued:
                works.append(dist.isend(t, peer, tag=tag) if kind == "send" else dist.irecv(t, peer, tag=tag))
            for w in works:
                w.wait()
            for name, got, want in checks:
                _check(failures, name, got, want)
    return {"failures": list(failures), "kinds": sorted(set(recent_kinds()))}


def tags_and_any_source(rank, world):
    """Receives posted out of the order of their sends, by tag; recv from any
    source, whose work names the sender; a message sent long before its
    receive is posted (kept by the receiver), and one received before sent."""
    failures = Failures()
    dist.barrier()
    if rank == 0:
        a, b, c = torch.empty(1000), torch.empty(5), torch.empty(300_000)
        dist.recv(b, 1, tag=2)
        dist.recv(c, 1, tag=3)
        dist.recv(a, 1, tag=1)
        _check(failures, "tag 1", a, torch.full((1000,), 1.0))
        _check(failures, "tag 2", b, torch.full((5,), 2.0))
        _check(failures, "tag 3 (several cells)", c, torch.arange(300_000, dtype=torch.float32))
    elif rank == 1:
        # Blocking sends would do on Fairring (a send never waits for its
        # receive); gloo's do wait, so isend keeps this valid on both.
        ws = [dist.isend(torch.full((1000,), 1.0), 0, tag=1), dist.isend(torch.full((5,), 2.0), 0, tag=2),
              dist.isend(torch.arange(300_000, dtype=torch.float32), 0, tag=3)]
        for w in ws:
            w.wait()
    dist.barrier()
    # Any source: every other rank sends once; rank 0 takes them as they come.
    if rank == 0:
        seen = []
        for _ in range(world - 1):
            t = torch.empty(7, dtype=torch.int64)
            w = dist.irecv(t, tag=11)  # src=None: from any rank
            w.wait()
            src = w._source_rank()
            seen.append(src)
            _check(failures, f"any source (from {src})", t, torch.full((7,), 100 + src, dtype=torch.int64))
        if sorted(seen) != list(range(1, world)):
            failures.add(f"any-source receives named senders {seen}")
        # dist.recv without src returns the sender too
        t = torch.empty(2)
        src = dist.recv(t, tag=12)
        if src != world - 1 or not torch.equal(t, torch.full((2,), float(src))):
            failures.add(f"recv(src=None) returned {src}, data {t}")
    else:
        dist.send(torch.full((7,), 100 + rank, dtype=torch.int64), 0, tag=11)
        if rank == world - 1:
            dist.send(torch.full((2,), float(rank)), 0, tag=12)
    dist.barrier()
    # A message sent long before its receive is posted.
    early = dist.isend(torch.arange(50_000, dtype=torch.float64), 0, tag=5) if rank == 1 else None
    dist.barrier()
    if rank == 0:
        time.sleep(0.2)
        t = torch.empty(50_000, dtype=torch.float64)
        dist.recv(t, 1, tag=5)
        _check(failures, "sent before its receive", t, torch.arange(50_000, dtype=torch.float64))
    if early is not None:
        early.wait()
    # batch_isend_irecv: a ring
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = torch.empty(4099, dtype=torch.bfloat16)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((4099,), float(rank), dtype=torch.bfloat16), nxt),
                                   dist.P2POp(dist.irecv, out, prv)])
    for r in reqs:
        r.wait()
    _check(failures, "batch_isend_irecv", out, torch.full((4099,), float(prv), dtype=torch.bfloat16))
    dist.barrier()
    return {"failures": list(failures), "kinds": sorted(set(recent_kinds()))}


def waiting_modes(rank, world):
    """A caller that waits moves its node-mates' messages itself (poll) and
    holds back their wake-ups of the node thread; whatever the caller does,
    every message arrives.  Two ranks on one node (two ranks on two CPUs: the
    callers poll; with more ranks than CPUs they don't):
      - threads: rank 0's two threads ping-pong with rank 1 at once, on two
        tags (two callers polling the same rings), every message checked;
      - no waiter: rank 1's irecv is never waited on, only its future
        watched (no poll, no is_completed): the node thread must take it,
        small or several cells, soon after it is sent;
      - is_completed() alone moves a message along."""
    import threading

    failures = Failures()
    rounds = 300
    dist.barrier()

    def pingpong(tag, first):
        peer = 1 - rank
        for i in range(rounds):
            n = 1000 + i
            got = torch.empty(n)
            if first:
                dist.send(payload(tag, rank, peer, i, n, torch.float32), peer, tag=tag)
                dist.recv(got, peer, tag=tag)
            else:
                dist.recv(got, peer, tag=tag)
                dist.send(payload(tag, rank, peer, i, n, torch.float32), peer, tag=tag)
            _check(failures, f"ping-pong tag {tag} #{i}", got, payload(tag, peer, rank, i, n, torch.float32))

    threads = [threading.Thread(target=pingpong, args=(tag, rank == 0)) for tag in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dist.barrier()
    # No waiter: rank 0 sends right after rank 1 posts its receive (within
    # the receive's promise to look); rank 1 only watches the future.
    delays = {}
    for numel in (1024, 700_000):  # one cell; several (the node thread streams it)
        delays[numel] = []
        for i in range(8):
            t = torch.empty(numel)
            w = dist.irecv(t, 0, tag=40 + i) if rank == 1 else None
            fut = w.get_future() if w is not None else None
            dist.barrier()
            if rank == 0:
                dist.send(payload(5, 0, 1, i, numel, torch.float32), 1, tag=40 + i)
            else:
                posted = time.monotonic()
                while not fut.done() and time.monotonic() - posted < 20:
                    time.sleep(0.0002)
                delays[numel].append(time.monotonic() - posted)
                if not fut.done():
                    failures.add(f"an irecv of {numel} elements nobody waits on never completed")
                    break
                _check(failures, f"unwaited irecv {numel} #{i}", t, payload(5, 0, 1, i, numel, torch.float32))
            dist.barrier()
    # is_completed() alone
    if rank == 1:
        t = torch.empty(5000)
        w = dist.irecv(t, 0, tag=60)
        start = time.monotonic()
        while not w.is_completed() and time.monotonic() - start < 20:
            pass
        _check(failures, "is_completed() loop", t, payload(6, 0, 1, 0, 5000, torch.float32))
    else:
        dist.send(payload(6, 0, 1, 0, 5000, torch.float32), 1, tag=60)
    dist.barrier()
    return {"failures": list(failures), "delays": {k: sorted(v) for k, v in delays.items()}}


def issue_order(rank, world):
    """Sends and receives in flight among all-reduces on the same and on
    other tensors: each op sees the memory as the ops issued before it left
    it (the order rule), and nothing waits on an unrelated peer."""
    failures = Failures()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for trial in range(3):
        n = [1, 4099, 1_000_003][trial]
        t = torch.full((n,), float(rank + 1))
        # all_reduce then send of its result: the send carries the sum
        w1 = dist.all_reduce(t, async_op=True)
        s = dist.isend(t, nxt, tag=trial)
        r_buf = torch.empty(n)
        r = dist.irecv(r_buf, prv, tag=trial)
        # all_reduce of the receive's tensor after it: sums what arrived
        w2 = dist.all_reduce(r_buf, async_op=True)
        other = torch.ones(n)
        w3 = dist.all_reduce(other, async_op=True)
        for w in (w1, s, r, w2, w3):
            w.wait()
        total = world * (world + 1) / 2
        _check(failures, f"n={n}: all_reduce before send", t, torch.full((n,), total))
        _check(failures, f"n={n}: all_reduce after recv", r_buf, torch.full((n,), total * world))
        _check(failures, f"n={n}: unrelated all_reduce", other, torch.full((n,), float(world)))
    # a receive into a strided view, then an all_reduce of the whole tensor:
    # the all_reduce sums what arrived (the stand-in's copy-back included)
    n = 4099
    base = torch.zeros(n, 2)
    s = dist.isend(torch.full((n,), float(rank + 1)), nxt, tag=50)
    r = dist.irecv(base[:, 0], prv, tag=50)
    w = dist.all_reduce(base, async_op=True)
    for x in (s, r, w):
        x.wait()
    total = world * (world + 1) / 2
    _check(failures, "strided recv before all_reduce", base[:, 0].contiguous(), torch.full((n,), total))
    _check(failures, "strided recv before all_reduce (other column)", base[:, 1].contiguous(), torch.zeros(n))
    # receives into a leaf that requires grad, whole and through a strided
    # view (its copy-back runs on an engine thread, where grad mode is on)
    leaf = torch.zeros(n, 2, requires_grad=True)
    works = [dist.isend(torch.full((n,), float(rank + 7)), nxt, tag=51),
             dist.isend(torch.full((2 * n,), float(rank + 8)), nxt, tag=52),
             dist.irecv(leaf[:, 1], prv, tag=51)]
    whole = torch.zeros(n, 2, requires_grad=True)
    works.append(dist.irecv(whole, prv, tag=52))
    for x in works:
        x.wait()
    _check(failures, "strided recv into a leaf that requires grad", leaf.detach()[:, 1].contiguous(),
           torch.full((n,), float(prv + 7)))
    _check(failures, "recv into a leaf that requires grad", whole.detach().reshape(-1),
           torch.full((2 * n,), float(prv + 8)))
    # many in flight: 40 small messages each way with one tag, in order
    works, bufs = [], []
    for i in range(40):
        works.append(dist.isend(torch.full((i + 1,), float(i)), nxt, tag=99))
        b = torch.empty(i + 1)
        bufs.append(b)
        works.append(dist.irecv(b, prv, tag=99))
    for w in works:
        w.wait()
    for i, b in enumerate(bufs):
        _check(failures, f"in flight #{i}", b, torch.full((i + 1,), float(i)))
    return {"failures": list(failures)}


def bad_calls(rank, world):
    """Clear errors for a peer that is not one, and for a message that does
    not fit its receive (the receive fails, the ring goes on)."""
    errors = {}

    def attempt(name, fn):
        try:
            fn()
            errors[name] = None
        except Exception as e:  # noqa: BLE001
            errors[name] = f"{type(e).__name__}: {e}"

    pg = dist.distributed_c10d._get_default_group()
    attempt("self", lambda: pg.send([torch.ones(2)], rank, 0).wait())
    attempt("out of range", lambda: pg.recv([torch.ones(2)], world + 3, 0).wait())
    if rank == 0:
        attempt("size", lambda: dist.recv(torch.empty(3), 1, tag=1))
        attempt("dtype", lambda: dist.recv(torch.empty(4, dtype=torch.int32), 1, tag=2))
        after = torch.empty(4)
        dist.recv(after, 1, tag=3)
        errors["after"] = None if torch.equal(after, torch.full((4,), 3.0)) else f"then got {after}"
    elif rank == 1:
        dist.send(torch.ones(4), 0, tag=1)
        dist.send(torch.ones(4), 0, tag=2)
        dist.send(torch.full((4,), 3.0), 0, tag=3)
    dist.barrier()
    return errors


def peer_dies(rank, world, when):
    """Rank 1 exits: before sending (rank 0 waits in a recv from it) or
    in the middle of a large send; rank 0's recv fails naming it."""
    if rank == 1:
        sys.stdout.flush()
        sys.stderr.flush()
        if when == "mid-send":
            # FAIRRING_TEST_P2P_EXIT_AFTER: the engine exits 1 MiB into it
            dist.isend(torch.ones(64 * 1024 * 1024 // 4), 0, tag=1)
            time.sleep(30)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(launch.DELIBERATE_EXIT)
    if rank != 0:
        return {"error": None, "seconds": 0.0}
    t0 = time.monotonic()
    try:
        time.sleep(0.5 if when == "mid-send" else 0.0)
        dist.recv(torch.empty(64 * 1024 * 1024 // 4), 1, tag=1)
        err = None
    except Exception as e:  # noqa: BLE001
        err = f"{type(e).__name__}: {e}"
    later = None
    try:
        dist.recv(torch.empty(1), 1, tag=2)
    except Exception as e:  # noqa: BLE001
        later = f"{type(e).__name__}: {e}"
    return {"error": err, "later": later, "seconds": time.monotonic() - t0}


def any_source_after_death(rank, world):
    """Rank 1 dies in the middle of a large send to rank 0 (tag 0); rank 2
    then sends rank 0 a small message with tag 0: rank 0's receive from any
    source gets rank 2's, not the remains of rank 1's."""
    if rank == 1:
        sys.stdout.flush()
        sys.stderr.flush()
        dist.isend(torch.ones(64 * 1024 * 1024 // 4), 0, tag=0)  # the engine exits 1 MiB into it
        time.sleep(30)
        os._exit(launch.DELIBERATE_EXIT)
    if rank == 2:
        time.sleep(1.0)
        dist.send(torch.full((3,), 2.0), 0, tag=0)
        return {}
    time.sleep(0.6)
    t = torch.empty(3)
    try:
        src = dist.recv(t, tag=0)
        return {"src": src, "data": t.tolist(), "error": None}
    except Exception as e:  # noqa: BLE001
        return {"src": None, "data": None, "error": f"{type(e).__name__}: {e}"}


def recv_times_out(rank, world, timeout_s):
    """A receive no message reaches fails after the group's timeout, and
    the rank can go on (a later message still arrives)."""
    out = {}
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.recv(torch.empty(2), 1, tag=1)
            out["error"] = None
        except Exception as e:  # noqa: BLE001
            out["error"] = f"{type(e).__name__}: {e}"
        out["seconds"] = time.monotonic() - t0
        t = torch.empty(2)
        dist.recv(t, 1, tag=2)
        out["after"] = t.tolist()
    elif rank == 1:
        time.sleep(timeout_s + 2)
        dist.send(torch.full((2,), 5.0), 0, tag=2)
    return out


def early_message_block(rank, world):
    """Rank 0 sends 4 MiB twice, each time before rank 1 posts its receive:
    the message waits in a block of the process's host cache, which goes back
    to the cache once received (the cache grows by it), and the second
    message takes that warm block again (the cache shrinks by it)."""
    from fairring_py import _C

    store = dist.distributed_c10d._get_default_store()
    numel = 1 << 20  # 4 MiB of float32
    out = {}
    for i in range(2):
        if rank == 0:
            dist.send(torch.full((numel,), float(i + 1)), 1)  # done once the receiver holds it
            store.set(f"sent/{i}", "1")
        elif rank == 1:
            store.wait([f"sent/{i}"])
            held = _C._stand_in_cached_bytes_for_test()
            t = torch.empty(numel)
            dist.recv(t, 0)
            out[i] = {"held_before": held, "held_after": _C._stand_in_cached_bytes_for_test(),
                      "right": bool((t == i + 1).all())}
        dist.barrier()
    return out
