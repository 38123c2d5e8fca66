"""Asteria in a Hugging Face Trainer: a tiny GPT-2 built from a config (nothing is downloaded)
learns the bytes of Python's own pydoc topics with SOAP, its refresh on a host worker; the step
records go to a JSONL file and Asteria's figures (idle, staleness, energy) to HF's logs, which
HF prints every --logging-steps steps (default: ten times a run).

    pip install -e ".[hf]"
    python examples/hf_trainer.py --steps 100
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a model from a config and bytes: no hub at all
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import asteria_core as asteria  # noqa: E402
from asteria_core.integrations import hf  # noqa: E402


class ByteWindows(torch.utils.data.Dataset):
    """Consecutive windows of bytes; GPT-2 shifts the labels itself."""

    def __init__(self, data: torch.Tensor, block: int) -> None:
        self.data, self.block = data, block

    def __len__(self) -> int:
        return len(self.data) // self.block

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        window = self.data[i * self.block:(i + 1) * self.block]
        return {"input_ids": window, "labels": window}


def pydoc_bytes() -> torch.Tensor:
    from pydoc_data.topics import topics  # shipped with Python

    text = "\n".join(topics[name] for name in sorted(topics))
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--optimizer", default="soap", choices=asteria.OPTIMIZERS)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--eval-steps", type=int, default=50, help="0: no evaluation")
    p.add_argument("--refresh-interval", type=int, default=10)
    p.add_argument("--staleness-bound", type=int, default=5)
    p.add_argument("--workers", type=int, default=1, help="refresh workers (0: inline)")
    p.add_argument("--logging-steps", type=int, default=None,
                   help="HF logs (and prints) its figures and Asteria's every N steps "
                        "(default: steps / 10)")
    p.add_argument("--cpu-watts", type=float, default=15.0,
                   help="watts per busy CPU core of the modelled energy estimate, for machines "
                        "without a measured source (RAPL, NVML); 0: measured sources only")
    p.add_argument("--out", default="runs/hf_trainer")
    opts = p.parse_args(argv)
    if opts.logging_steps is None:
        opts.logging_steps = max(1, opts.steps // 10)
    return opts


def build_trainer(opts: argparse.Namespace) -> transformers.Trainer:
    torch.manual_seed(1337)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=256,
                                      n_positions=64, bos_token_id=0, eos_token_id=0,
                                      loss_type="ForCausalLM")
    model = transformers.GPT2LMHeadModel(config)
    # The causal-LM loss, named where every transformers version looks: some read the config's
    # loss_type, newer ones the model's own, which they derive from the class name and which
    # matches no loss for GPT2LMHeadModel (then they warn and fall back to this same loss).
    model.loss_type = "ForCausalLM"
    data = pydoc_bytes()
    split = len(data) * 9 // 10
    args = transformers.TrainingArguments(
        output_dir=opts.out, max_steps=opts.steps, per_device_train_batch_size=opts.batch_size,
        per_device_eval_batch_size=opts.batch_size, gradient_accumulation_steps=opts.grad_accum,
        eval_strategy="steps" if opts.eval_steps else "no", eval_steps=opts.eval_steps or None,
        logging_steps=opts.logging_steps, save_strategy="no", report_to=[], disable_tqdm=True,
        seed=1337,
        dataloader_pin_memory=torch.cuda.is_available())
    policy = asteria.Policy(workers=opts.workers, refresh_interval=opts.refresh_interval,
                            staleness_bound=opts.staleness_bound)
    opt, scheduler = hf.optimizers(
        model, opts.optimizer, lr=opts.lr, policy=policy, num_training_steps=opts.steps,
        device=args.device, run_dir=opts.out, records=os.path.join(opts.out, "records.jsonl"),
        telemetry=asteria.TelemetryConfig(model_cpu_watts=opts.cpu_watts))
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=ByteWindows(data[:split], config.n_positions),
        eval_dataset=ByteWindows(data[split:split + 16 * config.n_positions], config.n_positions),
        optimizers=(opt, scheduler))
    hf.attach(trainer)  # reports records, honours stop requests, closes the runtime at the end
    return trainer


def main(argv: list[str] | None = None) -> transformers.Trainer:
    trainer = build_trainer(parse_args(argv))
    trainer.train()
    return trainer


if __name__ == "__main__":
    last = [log for log in main().state.log_history if "loss" in log][-1]
    print({k: v for k, v in last.items() if k.startswith(("loss", "asteria/"))})
