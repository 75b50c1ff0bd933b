"""One process of the reconfigure scenario (test_reconfigure.py; torch >= 2.14).

    python rank_reconfigure.py ROLE RANK STORE_PORT
    ROLE: "member" (one of the 4 first processes) or "replacement" (takes the
    place of rank 3 after it exits)

The processes meet on the test's TCPStore.  The scenario, phase by phase (a
phase's handles are published under its own keys):
  1  every member: ops before the first reconfigure raise; reconfigure(uuid 1)
     with the 4 handles in rank order; all_reduce, all_gather, broadcast
  2  reconfigure(uuid 2) with the handles as a set: ranks keep their order
  3  bad reconfigures (local errors), the group still works
  4  rank 3 exits; the 3 left reconfigure(uuid 3) among themselves
  5  a replacement process joins as rank 3: the 4 reconfigure(uuid 4)
  6  uuid 1 again: every rank fails at once (no hang)
  7  abort hooks: rank 0 aborts; every rank's hook ran
Prints one JSON line: what each phase saw ("" when right).
"""
from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import fairring_py  # noqa: F401  (registers the backend)
import refs

WORLD = 4
TIMEOUT = timedelta(seconds=30)


def check_all_reduce(pg, rank, world, seed) -> str:
    inputs = [refs.make_input(seed, r, 1031, torch.float32, "SUM") for r in range(world)]
    x = inputs[rank].clone()
    dist.all_reduce(x, group=pg)
    err = refs.compare(x, inputs, refs.reference(inputs, torch.float32, "SUM"), torch.float32, "SUM")
    ones = torch.ones(3)
    dist.all_reduce(ones, group=pg)
    if err:
        return f"all_reduce on {world} ranks: {err}"
    if ones.tolist() != [float(world)] * 3:
        return f"all_reduce of ones on {world} ranks gave {ones.tolist()}"
    return ""


def check_others(pg, rank, world) -> str:
    parts = [torch.full((13,), rank * 10 + 1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(parts, torch.full((13,), rank * 10 + 1, dtype=torch.int64), group=pg)
    got = [int(p[0]) for p in parts]
    if got != [r * 10 + 1 for r in range(world)]:
        return f"all_gather gave {got}"
    b = torch.full((7,), float(rank))
    dist.broadcast(b, src=world - 1, group=pg)
    if b.tolist() != [float(world - 1)] * 7:
        return f"broadcast gave {b.tolist()}"
    return ""


def exchange(store, phase, rank, handle, ranks):
    store.set(f"h{phase}/{rank}", handle)
    return [store.get(f"h{phase}/{r}").decode() for r in ranks]


def error_of(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return ""


def main() -> None:
    role, rank, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    dist.init_process_group("fairring", store=store, rank=rank, world_size=WORLD, timeout=TIMEOUT,
                            enable_reconfigure=True)
    pg = dist.distributed_c10d._get_default_group()
    out: dict = {"role": role, "rank": rank, "supports": dist.distributed_c10d._supports_reconfigure(pg)}
    everyone = list(range(WORLD))
    if role == "member":
        out["before"] = error_of(lambda: dist.all_reduce(torch.ones(2)))
        handles = exchange(store, 1, rank, dist.distributed_c10d._get_reconfigure_handle(), everyone)
        dist.distributed_c10d._reconfigure(uuid=1, handles=handles).wait()
        out["p1"] = check_all_reduce(pg, rank, WORLD, 11) or check_others(pg, rank, WORLD)

        handles = exchange(store, 2, rank, dist.distributed_c10d._get_reconfigure_handle(), everyone)
        dist.distributed_c10d._reconfigure(uuid=2, handles=set(handles)).wait()
        # The rank this process got: its own value back from the all_gather.
        parts = [torch.zeros(1, dtype=torch.int64) for _ in range(WORLD)]
        dist.all_gather(parts, torch.tensor([rank]), group=pg)
        out["p2_order"] = [int(p) for p in parts]
        out["p2"] = check_all_reduce(pg, rank, WORLD, 12)

        mine = dist.distributed_c10d._get_reconfigure_handle()
        fields = mine.split(":", 4)  # fairring, rank, uuid, token, host:port
        someone_else = ":".join(fields[:3] + ["0" * 16] + fields[4:])
        out["p3"] = {
            "reused": error_of(lambda: dist.distributed_c10d._reconfigure(uuid=2, handles=handles)),
            "garbage": error_of(lambda: dist.distributed_c10d._reconfigure(uuid=30, handles=["gloo:0:0:0:x"])),
            "other_job": error_of(lambda: dist.distributed_c10d._reconfigure(
                uuid=31, handles=[mine, "fairring:00000009:-1:feedfacefeedface:10.9.9.9:1"])),
            "not_mine": error_of(lambda: dist.distributed_c10d._reconfigure(uuid=32, handles=[someone_else])),
            "empty": error_of(lambda: dist.distributed_c10d._reconfigure(uuid=33, handles=[])),
            "twice": error_of(lambda: dist.distributed_c10d._reconfigure(uuid=34, handles=[mine, mine])),
        }
        out["p3_after"] = check_all_reduce(pg, rank, WORLD, 13)

        if rank == 3:
            print(json.dumps(out), flush=True)
            os._exit(0)  # this process is gone; a replacement takes its place
        survivors = [0, 1, 2]
        handles = exchange(store, 4, rank, dist.distributed_c10d._get_reconfigure_handle(), survivors)
        t0 = time.monotonic()
        dist.distributed_c10d._reconfigure(uuid=3, handles=handles).wait()
        out["p4_seconds"] = time.monotonic() - t0
        out["p4"] = check_all_reduce(pg, rank, 3, 14)
    else:
        out["before"] = error_of(lambda: dist.all_reduce(torch.ones(2)))
    handles = exchange(store, 5, rank, dist.distributed_c10d._get_reconfigure_handle(), everyone)
    dist.distributed_c10d._reconfigure(uuid=4, handles=handles).wait()
    out["p5"] = check_all_reduce(pg, rank, WORLD, 15) or check_others(pg, rank, WORLD)

    handles = exchange(store, 6, rank, dist.distributed_c10d._get_reconfigure_handle(), everyone)
    t0 = time.monotonic()
    out["p6"] = error_of(lambda: dist.distributed_c10d._reconfigure(uuid=1, handles=handles))
    out["p6_seconds"] = time.monotonic() - t0
    out["p6_after"] = check_all_reduce(pg, rank, WORLD, 16)

    def hook():
        store.set(f"hook/{rank}", "ran")

    pg.register_abort_hook(7, hook)
    store.set(f"hooked/{rank}", "1")
    store.wait([f"hooked/{r}" for r in everyone])
    if rank == 0:
        pg.abort()
        out["p7"] = ""
    else:
        out["p7"] = error_of(lambda: dist.all_reduce(torch.ones(5)))
    store.wait([f"hook/{rank}"], timedelta(seconds=10))
    out["p7_hook"] = store.get(f"hook/{rank}").decode()
    print(json.dumps(out), flush=True)
    store.set(f"done/{rank}/{role}", "1")
    store.wait([f"done/{r}/{'replacement' if r == 3 else 'member'}" for r in everyone])
    os._exit(0)  # the group was aborted: nothing to shut down


if __name__ == "__main__":
    main()
