"""The default run, measured: validation loss after N AdamW steps, tokens/s and step time.

    .venv/bin/python benchmarks/bench_default.py --repeats 3 --steps 500

Each repeat is a fresh run with the same seed in this process; the table shows the median over
repeats of each run's median step time, and writes benchmarks/results/default.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

import torch

from asteria_core.cli import resolve_config
from asteria_core.train.trainer import Trainer


def one_run(steps: int, out_dir: str, overrides: list[str]) -> dict:
    config = resolve_config(None, ["--train.steps", str(steps), "--train.out_dir", out_dir,
                                   *overrides])
    trainer = Trainer(config, jsonl=False)
    records = []
    trainer.runtime.add_listener(records.append)
    result = trainer.train(progress=False)
    trainer.close()
    steady = [r.step_seconds for r in records[5:]]  # the first steps warm up allocators
    return {
        "params": trainer.model_params,
        "final_val_loss": result.eval_losses[max(result.eval_losses)],
        "median_step_s": statistics.median(steady),
        "tokens_per_s": records[0].tokens / statistics.median(steady),
        "phase_median_s": {k: statistics.median(r.phase_seconds[k] for r in records[5:])
                           for k in records[0].phase_seconds},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/default.json")
    args, overrides = parser.parse_known_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            runs.append(one_run(args.steps, tmp, overrides))
            print(f"run {i + 1}/{args.repeats}: val {runs[-1]['final_val_loss']:.4f}, "
                  f"step {runs[-1]['median_step_s'] * 1e3:.1f} ms", flush=True)
    summary = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, "
                   f"torch {torch.__version__}",
        "steps": args.steps,
        "params": runs[0]["params"],
        "final_val_loss": statistics.median(r["final_val_loss"] for r in runs),
        "median_step_ms": 1e3 * statistics.median(r["median_step_s"] for r in runs),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2))
    print(f"\n| params | steps | val loss | step ms (median) | tokens/s |\n|---|---|---|---|---|\n"
          f"| {summary['params'] / 1e6:.2f}M | {args.steps} | {summary['final_val_loss']:.4f} | "
          f"{summary['median_step_ms']:.1f} | {summary['tokens_per_s']:,.0f} |")


if __name__ == "__main__":
    main()
