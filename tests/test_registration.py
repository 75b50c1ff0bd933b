"""Importing fairring_py registers the backend; a one-rank job works."""
from __future__ import annotations

import torch
import torch.distributed as dist

import launch


def test_backend_registered():
    import fairring_py

    assert "fairring" in dist.Backend.backend_list
    assert dist.Backend("fairring") == "fairring"
    caps = dist.Backend.backend_capability["fairring"]
    assert set(caps) == {"cpu", "cuda"}, caps
    assert dist.Backend._plugins["FAIRRING"].extended_api is True
    opts = fairring_py.Options(slice_size="256K", total_memory=1 << 26, parallelism=2, node_id="n", socket_ifname="lo")
    assert opts.parallelism == 2 and opts.node_id == "n"


def test_import_fairring_registers_the_backend():
    """`import fairring` (what PARAM runs for --backend fairring), in a fresh
    interpreter with torch's autoload off, so that only the import registers."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    code = ("import torch.distributed as dist; assert 'fairring' not in dist.Backend.backend_list; "
            "import fairring; assert 'fairring' in dist.Backend.backend_list; print(fairring.BACKEND_NAME)")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=repo, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "fairring", out.stdout + out.stderr


def _solo(rank, world):
    out = {}
    t = torch.arange(1031, dtype=torch.float32)
    dist.all_reduce(t)
    out["sum"] = torch.equal(t, torch.arange(1031, dtype=torch.float32))
    t = torch.arange(17, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    out["avg"] = torch.equal(t, torch.arange(17, dtype=torch.float64))
    t = torch.arange(10, dtype=torch.int64).reshape(2, 5).t()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["noncontig"] = torch.equal(t, torch.arange(10, dtype=torch.int64).reshape(2, 5).t())
    be = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    out["listen"] = be.listen_address()
    dist.barrier()
    return out


def test_single_rank_job():
    (res,) = launch.run_ranks(_solo, ["solo"], timeout_s=60)
    assert res.value == {"sum": True, "avg": True, "noncontig": True, "listen": ""}, res.value
