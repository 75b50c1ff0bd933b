"""Lightning's DDP strategy on the "fairring" backend: a tiny 2-process training on CPU.

    python3 examples/lightning_ddp.py            # Lightning starts the second process itself
    BACKEND=gloo python3 examples/lightning_ddp.py   # the same on gloo, to compare

No `import fairring_py` is needed when the package is installed (torch registers the
backend at import); otherwise add it at the top of the script.
"""
import os

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

BACKEND = os.environ.get("BACKEND", "fairring")


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)  # an all_reduce as well
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main():
    torch.manual_seed(0)
    x = torch.randn(512, 32)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=32)
    model = Model()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend=BACKEND),
                        max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, data)

    be = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    ops = ""
    if dist.get_backend() == "fairring":
        import fairring_py  # for dump_recent only

        ops = f", fairring ops seen: {sorted({r['kind'] for r in fairring_py.dump_recent()})}"
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    rank0 = params.clone()
    dist.broadcast(rank0, src=0)
    print(f"rank {dist.get_rank()}: backend {dist.get_backend()} ({type(be).__name__}), "
          f"train_loss {trainer.callback_metrics['train_loss'].item():.6f}, "
          f"parameters equal to rank 0's: {torch.equal(params, rank0)}{ops}", flush=True)


if __name__ == "__main__":
    main()
