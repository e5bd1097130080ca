"""A tiny LightningModule on random tensors, trained the way Lightning's examples are: no hermetic in it.

`--logger csv` trains with Lightning's CSVLogger instead of the default logger (TensorBoard's, since
tensorboard is installed). Nothing is seeded here: hermetic seeds torch at start-up from the run's seed.
"""

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class TinyRegressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--logger", choices=["default", "csv"], default="default")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    x = torch.randn(64, 8)
    y = x.sum(dim=1, keepdim=True) * 0.5 + 0.1 * torch.randn(64, 1)
    train = DataLoader(TensorDataset(x[:48], y[:48]), batch_size=12)
    val = DataLoader(TensorDataset(x[48:], y[48:]), batch_size=16)
    logger = L.pytorch.loggers.CSVLogger(".") if args.logger == "csv" else True
    trainer = L.Trainer(max_epochs=args.epochs, logger=logger, log_every_n_steps=1, accelerator="cpu",
                        enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    trainer.fit(TinyRegressor(), train, val)


if __name__ == "__main__":
    main()
