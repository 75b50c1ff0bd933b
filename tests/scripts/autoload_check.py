"""Run under torchrun, without `import fairring_py`: torch's device-backend
autoload must have registered "fairring" at `import torch`.  Prints one
FAIRRING_AUTOLOAD_OK line per rank on success."""
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    # The entry point registers the name only; the package loads with the first group.
    assert hasattr(dist.Backend, "FAIRRING"), "import torch did not register the backend"
    assert "fairring_py" not in sys.modules, "the autoload imported fairring_py at `import torch`"
    creator = dist.Backend._plugins["FAIRRING"].creator_fn
    assert creator.__module__ == "_fairring_autoload", creator.__module__

    dist.init_process_group("fairring", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert "fairring_py" in sys.modules
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    assert type(backend).__name__ == "FairringBackend", type(backend)
    t = torch.arange(100_003, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(100_003, dtype=torch.float32) * sum(range(1, world + 1)))

    # An explicit import afterwards changes nothing, and a second group works.
    import fairring_py

    assert dist.Backend._plugins["FAIRRING"].creator_fn is creator
    g = dist.new_group(list(range(world)), backend="fairring")
    t = torch.full((4099,), rank, dtype=torch.int64)
    dist.all_reduce(t, group=g, op=dist.ReduceOp.MAX)
    assert torch.all(t == world - 1)
    kinds = [r["kind"] for r in fairring_py.dump_recent(g)]
    dist.barrier()
    print(f"FAIRRING_AUTOLOAD_OK rank={rank} world={world} recent={kinds}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
