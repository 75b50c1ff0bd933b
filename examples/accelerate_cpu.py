"""HF accelerate on the "fairring" backend: a tiny 2-process training on CPU.

    torchrun --nproc_per_node=2 examples/accelerate_cpu.py            # the recipe
    torchrun --nproc_per_node=2 examples/accelerate_cpu.py refused    # what accelerate does with
                                                                      # InitProcessGroupKwargs(backend="fairring")

On CPU accelerate accepts only gloo (or mpi) as its backend. Creating the default group
first works: accelerate uses it, but still reports its backend as "gloo".
"""
import os
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from torch.utils.data import DataLoader, TensorDataset

backend = os.environ.get("BACKEND", "fairring")
if sys.argv[1:] == ["refused"]:
    # What a user tries first: accelerate's own way to pick the backend.
    Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend=backend)])
    raise SystemExit("accelerate accepted the backend")

# The recipe: create the default group first; accelerate then uses it as it is.
dist.init_process_group(backend)
accelerator = Accelerator(cpu=True)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(512, 32)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16, shuffle=True)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
for epoch in range(2):
    for xb, yb in data:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
loss = accelerator.reduce(loss.detach(), reduction="mean")
be = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
extra = ""
if dist.get_backend() == "fairring":
    import fairring_py  # only for dump_recent; the backend itself needs no import

    extra = f", fairring ops seen: {sorted({r['kind'] for r in fairring_py.dump_recent()})}"
print(f"rank {accelerator.process_index}: {type(model).__name__}, accelerate reports backend "
      f"{accelerator.state.backend!r} ({accelerator.distributed_type}); torch: {dist.get_backend()} "
      f"({type(be).__name__}); final mean loss {loss.item():.6f}{extra}", flush=True)
accelerator.end_training()
