"""One process of the reconfigure-keeps-options scenario (test_reconfigure.py;
torch >= 2.14).

    python rank_reconfigure_options.py RANK STORE_PORT

Four processes on four simulated nodes of one rank, with Fairring's options in
the environment (FAIRRING_WIRE_DTYPE or FAIRRING_REDUCTION_SERVERS): a group
created with enable_reconfigure=True gets all four by reconfigure(uuid 1),
then rank 3 exits and the three left reconfigure(uuid 2) among themselves.
After each, an all_reduce of values exact in bf16 must match the reference,
and ``fine`` (1 + 2^-10 on every rank, below bf16's resolution) shows whether
the rails rounded it.  Prints one JSON line.
"""
from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import fairring_py  # noqa: F401  (registers the backend)

WORLD = 4


def reduce_checks(pg, world) -> dict:
    exact = torch.full((65537,), float(pg.rank() + 1))
    dist.all_reduce(exact, group=pg)
    fine = torch.full((4099,), 1 + 2.0**-10)
    dist.all_reduce(fine, group=pg)
    backend = pg._get_backend(torch.device("cpu")).current()
    return {"exact": bool((exact == world * (world + 1) / 2).all()), "fine": sorted(set(fine.tolist())),
            "nodes": backend.topology()["num_nodes"]}


def main() -> None:
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("fairring", store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=30),
                            enable_reconfigure=True)
    pg = dist.distributed_c10d._get_default_group()

    def reconfigure(uuid, ranks):
        store.set(f"opt-h{uuid}/{rank}", dist.distributed_c10d._get_reconfigure_handle())
        handles = [store.get(f"opt-h{uuid}/{r}").decode() for r in ranks]
        dist.distributed_c10d._reconfigure(uuid=uuid, handles=handles).wait()

    out = {"rank": rank}
    reconfigure(1, range(WORLD))
    out["all"] = reduce_checks(pg, WORLD)
    if rank == 3:
        print(json.dumps(out), flush=True)
        os._exit(0)
    reconfigure(2, range(3))
    out["three"] = reduce_checks(pg, 3)
    print(json.dumps(out), flush=True)
    store.set(f"opt-done/{rank}", "1")
    store.wait([f"opt-done/{r}" for r in range(3)])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
