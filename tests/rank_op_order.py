"""Issue order on shared memory, checked inside the ranks (tests/test_op_order.py).

Each pattern is a short list of collectives on views of one storage per rank,
issued with async_op=True back to back and waited on at the end.  The group
must give what running them one after the other gives: the reference replays
the list in float64 over every rank's seeded storage (random small integers,
so that float32 sums and maxima are exact), with no communication.

Also counted (FairringBackend.order_waits): ops that only read the same
memory, or touch disjoint memory, must never wait for each other.
"""
from __future__ import annotations

import hashlib
import traceback

import torch
import torch.distributed as dist

R = dist.ReduceOp
RED = {"sum": R.SUM, "max": R.MAX}
DELEGATED = ("reduce-bcast-sum", "a2a-sum-a2a")
# Above cfg["all_patterns_up_to"] elements, only these run (the others' storage is
# several times the size: ag-rs (W + 2) n, a2a 2 W n).
BIG_PATTERNS = ("3xsum", "sum-max-sum", "bcast-sum", "views")


def _patterns(n: int, w: int) -> dict:
    """name -> (storage length, [op]); an op is
    ("ar", red, view) | ("bc", root, view) | ("ag", in_view, out_view) | ("rs", red, in_view, out_view),
    a view being (start, stop, step) of the storage."""
    h = n // 2
    return {
        "3xsum": (n, [("ar", "sum", (0, n, 1))] * 3),
        "sum-max-sum": (n, [("ar", "sum", (0, n, 1)), ("ar", "max", (0, n, 1)), ("ar", "sum", (0, n, 1))]),
        "bcast-sum": (n, [("bc", 0, (0, n, 1)), ("ar", "sum", (0, n, 1))]),
        "bcast-last-sum": (n, [("bc", w - 1, (0, n, 1)), ("ar", "sum", (0, n, 1)), ("bc", 0, (0, n, 1))]),
        # The all-gather writes what the reduce-scatter reads, which the last
        # all-reduce writes (after the reduce-scatter has read it).
        "ag-rs": ((w + 2) * n, [("ag", (0, n, 1), (n, n + w * n, 1)),
                                ("rs", "sum", (n, n + w * n, 1), (n + w * n, (w + 2) * n, 1)),
                                ("ar", "sum", (n, n + w * n, 1))]),
        # Overlapping slices of one storage.
        "views": (h + n, [("ar", "sum", (0, n, 1)), ("ar", "max", (h, h + n, 1)), ("ar", "sum", (0, n, 1))]),
        # Strided views: staged through a contiguous copy (read when the op starts).
        "strided": (2 * n, [("ar", "sum", (0, 2 * n, 2)), ("ar", "max", (0, 2 * n, 1)), ("ar", "sum", (1, 2 * n, 2))]),
        # Delegated collectives (gloo) between native ones.
        "reduce-bcast-sum": (n, [("rd", 0, (0, n, 1)), ("bc", 0, (0, n, 1)), ("ar", "sum", (0, n, 1))]),
        "a2a-sum-a2a": (2 * w * n, [("a2a", (0, w * n, 1), (w * n, 2 * w * n, 1)), ("ar", "max", (w * n, 2 * w * n, 1)),
                                    ("a2a", (w * n, 2 * w * n, 1), (0, w * n, 1))]),
    }


# Ops that must overlap: only reads of shared memory, or disjoint memory.
def _free_patterns(n: int, w: int) -> dict:
    return {
        "two-all-gathers-of-one-input": ((2 * w + 1) * n, [("ag", (0, n, 1), (n, n + w * n, 1)),
                                                           ("ag", (0, n, 1), (n + w * n, (2 * w + 1) * n, 1))]),
        "two-reduce-scatters-of-one-input": ((w + 2) * n, [("rs", "sum", (0, w * n, 1), (w * n, (w + 1) * n, 1)),
                                                           ("rs", "sum", (0, w * n, 1), ((w + 1) * n, (w + 2) * n, 1))]),
        "adjacent-buckets": (3 * n, [("ar", "sum", (0, n, 1)), ("ar", "sum", (n, 2 * n, 1)),
                                     ("ar", "sum", (2 * n, 3 * n, 1))]),
        # A delegated (gloo) collective and a native one on other memory.
        "all-to-all-then-disjoint-sum": ((2 * w + 1) * n, [("a2a", (0, w * n, 1), (w * n, 2 * w * n, 1)),
                                                          ("ar", "sum", (2 * w * n, (2 * w + 1) * n, 1))]),
    }


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:6], "little")


def _storage(seed: int, rank: int, length: int) -> torch.Tensor:
    g = torch.Generator()
    g.manual_seed((seed * 7919 + rank) & 0x7FFF_FFFF_FFFF)
    return torch.randint(-4, 5, (length,), generator=g, dtype=torch.int64).to(torch.float64)


def _view(t: torch.Tensor, v) -> torch.Tensor:
    return t[v[0]:v[1]:v[2]]


def replay(ops, storages):
    """The result of running `ops` one after the other on every rank's storage (float64)."""
    w = len(storages)
    for op in ops:
        kind = op[0]
        if kind == "ar":
            vals = torch.stack([_view(s, op[2]) for s in storages])
            res = vals.sum(0) if op[1] == "sum" else vals.max(0).values
            for s in storages:
                _view(s, op[2]).copy_(res)
        elif kind == "bc":
            src = _view(storages[op[1]], op[2]).clone()
            for s in storages:
                _view(s, op[2]).copy_(src)
        elif kind == "ag":
            res = torch.cat([_view(s, op[1]).clone() for s in storages])
            for s in storages:
                _view(s, op[2]).copy_(res)
        elif kind == "rd":  # the sum at the root; the others' tensors are left unspecified by torch
            total = torch.stack([_view(s, op[2]) for s in storages]).sum(0)
            _view(storages[op[1]], op[2]).copy_(total)
        elif kind == "a2a":
            ins = [_view(s, op[1]).clone() for s in storages]
            m = ins[0].numel() // w
            for r, s in enumerate(storages):
                _view(s, op[2]).copy_(torch.cat([x[r * m:(r + 1) * m] for x in ins]))
        elif kind == "rs":
            total = torch.stack([_view(s, op[2]) for s in storages]).sum(0)
            m = total.numel() // w
            for r, s in enumerate(storages):
                _view(s, op[3]).copy_(total[r * m:(r + 1) * m])
        else:
            raise ValueError(kind)
    return storages


def issue(op, t, group=None):
    kind = op[0]
    if kind == "ar":
        return dist.all_reduce(_view(t, op[2]), op=RED[op[1]], group=group, async_op=True)
    if kind == "bc":
        return dist.broadcast(_view(t, op[2]), src=op[1], group=group, async_op=True)
    if kind == "ag":
        return dist.all_gather_into_tensor(_view(t, op[2]), _view(t, op[1]), group=group, async_op=True)
    if kind == "rs":
        return dist.reduce_scatter_tensor(_view(t, op[3]), _view(t, op[2]), op=RED[op[1]], group=group,
                                          async_op=True)
    if kind == "rd":
        return dist.reduce(_view(t, op[2]), dst=op[1], group=group, async_op=True)
    if kind == "a2a":
        return dist.all_to_all_single(_view(t, op[2]), _view(t, op[1]), group=group, async_op=True)
    raise ValueError(kind)


def order_waits() -> int:
    import fairring_py

    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    if not isinstance(backend, fairring_py._C.FairringBackend):
        return 0
    return backend.order_waits()


def run_case(rank, world, name, length, ops, seed, dtype, device="cpu"):
    storages = [_storage(seed, r, length) for r in range(world)]
    t = storages[rank].to(dtype).to(device)
    works = [issue(op, t) for op in ops]
    for wk in works:
        wk.wait()
    want = replay(ops, storages)[rank]
    got = t.to(torch.float64).cpu()  # on CUDA: after the current stream, which wait() ordered after the ops
    if torch.equal(got, want):
        return None
    bad = (got != want).nonzero().reshape(-1)
    i = int(bad[0])
    return (f"{name} {dtype} n={length}: {bad.numel()} of {length} elements wrong, first at {i}: "
            f"got {got[i].item()}, want {want[i].item()}")


def session(rank, world, cfg):
    failures, free_waits = [], []
    cases = 0
    dtypes = [getattr(torch, d) for d in cfg.get("dtypes", ["float32"])]
    device = cfg.get("device", "cpu")
    if device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    for n in cfg["sizes"]:
        repeats = cfg["repeats"] if n <= cfg.get("repeat_below", 1 << 20) else 1
        for name, (length, ops) in _patterns(n, world).items():
            if n > cfg.get("all_patterns_up_to", 1 << 30) and name not in BIG_PATTERNS:
                continue
            for dtype in dtypes:
                if name in DELEGATED and (dtype != torch.float32 or device != "cpu"):
                    continue  # gloo's reduce and all-to-all take fewer dtypes, and CPU tensors here
                for rep in range(repeats):
                    try:
                        why = run_case(rank, world, name, length, ops, _seed(name, n, rep, str(dtype)), dtype, device)
                    except Exception as e:  # noqa: BLE001
                        why = f"{name} n={n}: raised {type(e).__name__}: {e}\n{traceback.format_exc()}"
                    cases += 1
                    # Every rank runs every case (the collectives must match); the first 40 are kept.
                    if why and len(failures) < 40:
                        failures.append(why)
    for n in cfg.get("free_sizes", []):
        for name, (length, ops) in _free_patterns(n, world).items():
            if any(op[0] in ("a2a", "rd") for op in ops) and device != "cpu":
                continue  # gloo's all-to-all: CPU tensors here
            before = order_waits()
            why = run_case(rank, world, name, length, ops, _seed(name, n), torch.float32, device)
            waited = order_waits() - before
            cases += 1
            if why:
                failures.append(why)
            if waited:
                free_waits.append(f"{name} n={n}: {waited} op(s) waited for an earlier op")
    dist.barrier()
    return {"failures": failures, "free_waits": free_waits, "cases": cases}
