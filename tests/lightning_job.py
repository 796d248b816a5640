"""A 2-process CPU Lightning job for tests/test_lightning.py (Lightning re-runs this file for rank 1).

    python tests/lightning_job.py OUT plain|ring|ring-dense|ring-tail [RESUME_CKPT]
"""

import sys

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from ringps.integrations.lightning import RingTopkStrategy


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.big, self.out = nn.Linear(200, 500), nn.Linear(500, 4)  # 100k entries: above dense_below

    def training_step(self, batch, _):
        x, y = batch
        return F.cross_entropy(self.out(torch.relu(self.big(x))), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main(out: str, kind: str, resume: str | None) -> None:
    torch.manual_seed(0)
    x = torch.randn(96, 200)
    data = DataLoader(TensorDataset(x, x[:, :4].argmax(1)), batch_size=16)  # 3 steps per epoch and rank
    exchange = {"ring": "allgather", "ring-tail": "shared-index"}.get(kind, "auto")
    strategy = ("ddp" if kind == "plain" else
                RingTopkStrategy(density=1.0 if kind == "ring-dense" else 0.05, exchange=exchange, dense_below=10_000,
                                 exact_tail=0.5 if kind == "ring-tail" else 0.0))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=2, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=out,
                        callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=out, save_top_k=-1, every_n_epochs=1)])
    model = Net()
    trainer.fit(model, data, ckpt_path=resume)
    # every rank saves its own replica: the test compares them rank by rank
    torch.save({"params": [p.detach() for p in model.parameters()],
                "hook_steps": strategy.hook_state.iteration if kind != "plain" else None,
                "chosen": dict(strategy.hook_state.chosen) if kind != "plain" else None},
               f"{out}/final-rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
