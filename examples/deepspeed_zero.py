"""DeepSpeed on the "fairring" backend: a tiny 2-process training on CPU, ZeRO stage from argv.

    DS_ACCELERATOR=cpu torchrun --nproc_per_node=2 examples/deepspeed_zero.py 3
    BACKEND=gloo DS_ACCELERATOR=cpu torchrun --nproc_per_node=2 examples/deepspeed_zero.py 3   # to compare

DeepSpeed JIT-compiles its CPU communication op (deepspeed_shm_comm_op) at the first run
(a C++ compiler is needed; about a minute). No `import fairring_py` is needed when the
package is installed; otherwise add it before init_distributed.
"""
import os
import sys

import torch
import torch.distributed as dist
import deepspeed

stage = int(sys.argv[1])
backend = os.environ.get("BACKEND", "fairring")
deepspeed.init_distributed(dist_backend=backend)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
config = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": stage},
    "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
    "steps_per_print": 1000,
    "zero_allow_untested_optimizer": True,  # torch.optim.SGD under ZeRO
}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
g = torch.Generator().manual_seed(1 + dist.get_rank())
losses = []
for step in range(100):
    x = torch.randn(16, 32, generator=g)
    loss = torch.nn.functional.mse_loss(engine(x), x.sum(1, keepdim=True))
    engine.backward(loss)
    engine.step()
    losses.append(loss.detach())
first_last = torch.stack([sum(losses[:10]) / 10, sum(losses[-10:]) / 10])
dist.all_reduce(first_last, op=dist.ReduceOp.AVG)
be = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
extra = ""
if dist.get_backend() == "fairring":
    import fairring_py  # only for dump_recent; the backend itself needs no import

    kinds = sorted({r["kind"] for r in fairring_py.dump_recent()})
    extra = f", fairring ops seen: {kinds}"
print(f"rank {dist.get_rank()} zero={stage}: backend {dist.get_backend()} ({type(be).__name__}), "
      f"mean loss of the first 10 steps {first_last[0].item():.6f}, of the last 10 {first_last[1].item():.6f}{extra}", flush=True)
