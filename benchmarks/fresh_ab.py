"""A/B of FAIRRING_HUGE_PAGES in one run: two Fairring groups in the same
processes, one with huge_pages="off", one with "advise", timing
all_gather_into_tensor on 1 node x 2 ranks in alternating rounds.

    python3 benchmarks/fresh_ab.py 50 fresh   # a new 50 MiB output every op
    python3 benchmarks/fresh_ab.py 50 warm    # 4 reused outputs (each group its own)

Prints each rank's median ms per op (over rounds 2-8) for each setting.  In
"warm" the buffers are fresh at their first op, so under "advise" they are
backed by huge pages from then on: what a reused buffer gets from the advice.
"""
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..")]

import launch  # noqa: E402  (tests/launch.py: forks the ranks)


def body(rank, world, n_mib, fresh):
    import torch
    import torch.distributed as dist

    import fairring_py

    gs = {hp: dist.new_group(list(range(world)), backend="fairring", pg_options=fairring_py.Options(huge_pages=hp))
          for hp in ("off", "advise")}
    ctl = dist.new_group(list(range(world)), backend="gloo")
    numel = n_mib * (1 << 20) // 4
    inp = torch.randn(numel // world)
    bufs = {hp: [torch.empty(numel) for _ in range(4)] for hp in gs}
    res = {hp: [] for hp in gs}
    for rnd in range(8):
        for hp in (("off", "advise") if rnd % 2 else ("advise", "off")):
            dist.barrier(group=ctl)
            t0 = time.perf_counter()
            for _ in range(5):
                for b in bufs[hp]:
                    if fresh:
                        b = torch.empty(numel)
                    dist.all_gather_into_tensor(b, inp, group=gs[hp])
            res[hp].append((time.perf_counter() - t0) / 20)
    return {hp: round(statistics.median(v[1:]) * 1e3, 3) for hp, v in res.items()}


if __name__ == "__main__":
    import fresh_ab

    out = launch.run_ranks(fresh_ab.body, ["a", "a"], args=(int(sys.argv[1]), sys.argv[2] == "fresh"),
                           timeout_s=300, backend="gloo")
    for r in out:
        print(f"rank {r.rank}: ms per op {r.value}")
