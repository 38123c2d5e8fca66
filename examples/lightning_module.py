"""Asteria in Lightning: a tiny byte-level transformer learns Python's own pydoc topics with
SOAP, its refresh on a host worker; Asteria's figures (idle, staleness, energy) go to
Lightning's loggers and the step records to a JSONL file.

    pip install -e ".[lightning]"
    python examples/lightning_module.py --steps 100
"""

from __future__ import annotations

import argparse
import os

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F

import asteria_core as asteria
from asteria_core.integrations import lightning as asteria_pl


class ByteWindows(torch.utils.data.Dataset):
    """Consecutive windows of bytes: (input, the same shifted by one)."""

    def __init__(self, data: torch.Tensor, block: int) -> None:
        self.data, self.block = data, block

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.data[i * self.block:(i + 1) * self.block + 1]
        return window[:-1], window[1:]


def pydoc_bytes() -> torch.Tensor:
    from pydoc_data.topics import topics  # shipped with Python

    text = "\n".join(topics[name] for name in sorted(topics))
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


class ByteLM(pl.LightningModule):
    """Two causal transformer layers over bytes; forward returns (logits, loss)."""

    def __init__(self, opts: argparse.Namespace, block: int = 64, width: int = 32) -> None:
        super().__init__()
        self.opts = opts
        self.embed = nn.Embedding(256, width)
        self.position = nn.Embedding(block, width)
        layer = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=4 * width,
                                           dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 256)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None):
        t = x.shape[1]
        h = self.embed(x) + self.position(torch.arange(t, device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        logits = self.head(self.blocks(h, mask=mask, is_causal=True))
        loss = None if y is None else F.cross_entropy(logits.flatten(0, 1), y.flatten())
        return logits, loss  # the runtime reads the step's loss from this output

    def training_step(self, batch, batch_idx):
        return self(*batch)[1]

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self(*batch)[1])

    def configure_optimizers(self):
        o = self.opts
        policy = asteria.Policy(workers=o.workers, refresh_interval=o.refresh_interval,
                                staleness_bound=o.staleness_bound)
        return asteria_pl.configure_optimizers(
            self, o.optimizer, lr=o.lr, policy=policy, run_dir=o.out,
            records=os.path.join(o.out, "records.jsonl"),
            telemetry=asteria.TelemetryConfig(model_cpu_watts=o.cpu_watts),
            scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, o.steps))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--optimizer", default="soap", choices=asteria.OPTIMIZERS)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--eval-steps", type=int, default=50, help="0: no validation")
    p.add_argument("--refresh-interval", type=int, default=10)
    p.add_argument("--staleness-bound", type=int, default=5)
    p.add_argument("--workers", type=int, default=1, help="refresh workers (0: inline)")
    p.add_argument("--cpu-watts", type=float, default=15.0,
                   help="watts per busy CPU core of the modelled energy estimate, for machines "
                        "without a measured source (RAPL, NVML); 0: measured sources only")
    p.add_argument("--out", default="runs/lightning_module")
    return p.parse_args(argv)


def build(opts: argparse.Namespace, callbacks: list[pl.Callback] = ()
          ) -> tuple[pl.Trainer, ByteLM, dict[str, torch.utils.data.DataLoader]]:
    torch.manual_seed(1337)
    data = pydoc_bytes()
    split = len(data) * 9 // 10
    loaders = {
        "train_dataloaders": torch.utils.data.DataLoader(
            ByteWindows(data[:split], 64), batch_size=opts.batch_size, shuffle=True),
        "val_dataloaders": torch.utils.data.DataLoader(
            ByteWindows(data[split:split + 16 * 64 + 1], 64), batch_size=opts.batch_size)}
    trainer = pl.Trainer(
        max_steps=opts.steps, accumulate_grad_batches=opts.grad_accum, accelerator="auto",
        devices=1, num_sanity_val_steps=0, limit_val_batches=None if opts.eval_steps else 0,
        val_check_interval=opts.eval_steps * opts.grad_accum if opts.eval_steps else None,
        callbacks=[asteria_pl.AsteriaCallback(), *callbacks], default_root_dir=opts.out,
        logger=pl.loggers.CSVLogger(opts.out), log_every_n_steps=1, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False)
    return trainer, ByteLM(opts), loaders


def main(argv: list[str] | None = None, callbacks: list[pl.Callback] = ()) -> pl.Trainer:
    trainer, model, loaders = build(parse_args(argv), callbacks)
    trainer.fit(model, **loaders)
    return trainer


if __name__ == "__main__":
    metrics = main().logged_metrics
    print({k: round(float(v), 6) for k, v in metrics.items()
           if k.startswith(("asteria/idle", "asteria/energy"))})
