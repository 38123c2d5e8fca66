"""Refresh off the critical path: step-time smoothness and speed of Asteria vs native.

    .venv/bin/python benchmarks/bench_refresh.py --steps 120            # the comparison
    .venv/bin/python benchmarks/bench_refresh.py --steps 120 --sweep    # the staleness sweep
    .venv/bin/python benchmarks/bench_refresh.py --gpu --steps 200      # one CUDA device

Model: a 3.3M-parameter GPT (n_embd 256, 4 layers, batch 16 x 128 tokens) whose SOAP refresh
(every 10 steps) is a large share of a native step on a CPU. Each configuration trains the same
seed for the same steps; the table gives step-time p50/p99/max/mean (steps after the first 10,
which hold the initial eigendecompositions of every variant), and the final validation loss.

Round-robin: every configuration is built up front and they take turns, one refresh interval
each, so the drifting speed of a shared machine (this VM's step time moves by 10-40% over
minutes) falls on all of them alike and their ratios are measured side by side. The jobs that
pacing releases at a turn's last boundary are held and released when the run's next turn
starts, right before the step they would have run beside; a job released earlier and still
running is waited for, and the wait is charged to the run's next step. So no run's background
work lands in another's turn, and a paced run's jobs run beside its own steps. A turn opens at a
refresh point (steps 11, 21, ...), so a native refresh spike and a whole burst round fall
inside one turn, and every step after the first 10 is counted.
"Spike" is the median over turns of (slowest step / median step) within the turn: a refresh
spike shows in every turn, while the machine's slower drift, which p99/p50 over a whole run
also picks up (AdamW, with no refresh at all, is its floor), does not. Writes
benchmarks/results/refresh.json (refresh_sweep.json with --sweep), a table beside it and a
step-time trace plot (named after it).

--gpu: a ~100M-parameter GPT (n_embd 1024, 8 layers, batch 64 x 1024 tokens, bf16 autocast) on
the CUDA device, factor blocks of 1024 (120 of them), and host workers that own most of the CPU
cores; there host and device really run in parallel and the target is speed (issue #4). Writes
refresh_gpu.json. Untuned: no GPU was lent to the session that wrote it. The batch is sized so
that a refresh round (estimated 10-20 s of CPU, spread over the workers) fits in the 10 steps
between refreshes; if the table shows refresh waits or staleness at the bound, the workers cannot
keep up (background load > 1): give them more cores, or a larger batch or refresh interval.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from asteria_core.cli import resolve_config  # noqa: E402
from asteria_core.train.trainer import Trainer  # noqa: E402
from benchmarks.pausable import make_pausable  # noqa: E402

INTERVAL = 10  # steps between refreshes, and the length of one round-robin turn
MODEL = ["--model.n_embd", "256", "--model.n_head", "4", "--model.n_layer", "4",
         "--data.batch_size", "16", "--policy.refresh_interval", str(INTERVAL)]
GPU_MODEL = ["--model.n_embd", "1024", "--model.n_head", "16", "--model.n_layer", "8",
             "--model.block_size", "1024", "--data.batch_size", "64",
             "--policy.refresh_interval", str(INTERVAL), "--train.device", "cuda",
             "--optim.precond_block_size", "1024"]
ADAMW = ["--optim.name", "adamw", "--optim.lr", "3e-3"]
SOAP = ["--optim.name", "soap", "--optim.lr", "3e-3"]
KL = ["--optim.name", "kl_shampoo", "--optim.lr", "1e-3"]
NATIVE = ["--policy.workers", "0", "--policy.swap_delay", "0"]  # refresh inline at the step


def gpu_configs() -> list[tuple[str, list[str]]]:
    """On one CUDA device: the training thread keeps 2 CPU threads, the workers get the rest."""
    train = ["--train.threads", "2"]
    cores = os.cpu_count() or 4
    workers = max(1, (cores - 2) // 2)
    asteria = ["--policy.workers", str(workers), "--policy.worker_threads", "2",
               "--policy.staleness_bound", str(INTERVAL), "--policy.swap_delay", "auto", *train]
    return [("AdamW", ADAMW + train),
            ("native SOAP", SOAP + NATIVE + train),
            (f"Asteria-SOAP ({workers} host workers x 2 thr)", SOAP + asteria),
            ("native KL-Shampoo", KL + NATIVE + train),
            (f"Asteria-KL-Shampoo ({workers} host workers x 2 thr)", KL + asteria)]


def configs(sweep: bool) -> list[tuple[str, list[str]]]:
    def asteria(bound: int, train_threads: int = 2, kind: str = "thread", pace: bool = True
                ) -> list[str]:
        # d = S: a round's result is swapped in `bound` steps after its statistics, which
        # lets pacing spread the round over min(d, S, interval) steps.
        return ["--policy.workers", "1", "--policy.staleness_bound", str(bound),
                "--policy.swap_delay", str(bound), "--train.threads", str(train_threads),
                "--policy.worker_kind", kind, "--policy.pace", str(pace).lower()]

    if sweep:
        return [("native SOAP", SOAP + NATIVE)] + \
            [(f"Asteria-SOAP S={s}", SOAP + asteria(s)) for s in (1, 2, 3, 5, 10)]
    return [
        ("AdamW", ADAMW),
        ("native SOAP", SOAP + NATIVE),
        ("Asteria-SOAP (train 2 thr + 1 worker thread, paced)", SOAP + asteria(10)),
        ("Asteria-SOAP (train 2 thr + 1 worker thread, burst)", SOAP + asteria(10, pace=False)),
        ("Asteria-SOAP (train 2 thr + 1 worker process, paced)",
         SOAP + asteria(10, kind="process")),
        ("Asteria-SOAP (train 1 thr + 1 worker thread, paced)", SOAP + asteria(10, 1)),
        ("native KL-Shampoo", KL + NATIVE),
        ("Asteria-KL-Shampoo (train 2 thr + 1 worker thread, paced)", KL + asteria(10)),
    ]


@dataclass
class Contender:
    """One configuration's run, trained a turn at a time."""

    label: str
    args: list[str]
    trainer: Trainer
    threads: int
    records: list = field(default_factory=list)
    charge: float = 0.0
    """Seconds waited at the end of the last turn for refreshes already handed to the workers;
    added to the next step, where they would have run."""

    def turn(self, steps: int) -> None:
        torch.set_num_threads(self.threads)
        engine = self.trainer.runtime.refresh
        if engine is not None:
            engine.defer_releases(False)  # what the last turn's last boundary released goes now
        for i in range(steps):
            if engine is not None and i == steps - 1:
                engine.defer_releases(True)  # this turn's last boundary releases at the next
            self.trainer.train_step()
            record = self.trainer.runtime.end_step()  # telemetry adds the idle (wait) figures
            record.step_seconds += self.charge
            self.charge = 0.0
            self.records.append(record)
        if engine is not None:
            self.charge = engine.wait_released()


def build(label: str, args: list[str], steps: int, out_dir: Path, model: list[str]
          ) -> Contender:
    config = resolve_config(None, [*model, "--train.steps", str(steps), "--train.out_dir",
                                   str(out_dir), *args])
    threads = config.train.threads or 2
    torch.set_num_threads(threads)
    trainer = Trainer(config, jsonl=False)
    make_pausable(trainer.runtime)
    return Contender(label, args, trainer, threads)


def summary(c: Contender) -> dict:
    torch.set_num_threads(c.threads)
    val_loss = c.trainer.evaluate()
    c.trainer.close()
    records = c.records
    steady = [r.step_seconds for r in records[INTERVAL:]]
    ranked = sorted(steady)
    turns = [steady[i:i + INTERVAL] for i in range(0, len(steady), INTERVAL)]
    spike = statistics.median(max(t) / statistics.median(t) for t in turns)
    waits = [r.timing.idle_seconds["refresh_wait"] for r in records if r.timing is not None]
    return {
        "label": c.label, "args": c.args, "params": c.trainer.model_params,
        "train_s": sum(r.step_seconds for r in records),
        "p50_ms": 1e3 * ranked[len(ranked) // 2],
        "p99_ms": 1e3 * ranked[min(len(ranked) - 1, int(len(ranked) * 0.99))],
        "max_ms": 1e3 * ranked[-1], "mean_ms": 1e3 * statistics.fmean(steady),
        "spike": spike,
        "refresh_wait_s": sum(waits),
        "staleness_max": max((r.refresh.staleness_max for r in records if r.refresh), default=0),
        "final_val_loss": val_loss,
        "trace_ms": [1e3 * r.step_seconds for r in records],
    }


def round_robin(chosen: list[tuple[str, list[str]]], steps: int, out_dir: str,
                model: list[str] = MODEL) -> list[dict]:
    contenders = [build(label, args, steps, Path(out_dir) / f"config{i}", model)
                  for i, (label, args) in enumerate(chosen)]
    turns = -(-steps // INTERVAL)
    for k in range(turns):
        for c in contenders:
            c.turn(min(INTERVAL, steps - k * INTERVAL))
        print(f"turn {k + 1}/{turns} done", file=sys.stderr, flush=True)
    return [summary(c) for c in contenders]


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # SOAP and KL-Shampoo in two panels, each beside AdamW; the thread-budget variants are in
    # the table only (eight lines in one panel hide the spikes).
    shown = [r for r in results if "process" not in r["label"] and "1 thr" not in r["label"]]
    panels = [(name, lines) for name, lines in (
        ("SOAP", [r for r in shown if "KL" not in r["label"]]),
        ("KL-Shampoo", [r for r in shown if "KL" in r["label"] or r["label"] == "AdamW"]))
        if any(r["label"] != "AdamW" for r in lines)] or [("", shown or results)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 4 * len(panels)), sharex=True,
                             squeeze=False)
    for ax, (name, lines) in zip(axes[:, 0], panels, strict=True):
        for r in lines:
            ax.plot(r["trace_ms"], label=r["label"], linewidth=1)
        ax.set_ylabel("step time (ms, measured; log)")
        ax.set_yscale("log")
        ax.set_title(f"{name + ': ' if name else ''}step time per step, refresh every "
                     f"{INTERVAL} steps (round-robin)")
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results: list[dict], steps: int) -> str:
    native = {r["label"].split()[-1]: r for r in results if r["label"].startswith("native")}
    lines = [f"{results[0]['params'] / 1e6:.1f}M parameters, {steps} steps, refresh every "
             f"{INTERVAL} steps, round-robin turns of {INTERVAL} steps", "",
             "| config | p50 ms | p99 ms | max ms | mean ms | p99/p50 | spike | mean / native | "
             "refresh wait s | max staleness | val loss | train s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        base = native.get("KL-Shampoo" if "KL" in r["label"] else "SOAP")
        ratio = f"{r['mean_ms'] / base['mean_ms']:.2f}" if base and "AdamW" not in r["label"] \
            else "-"
        lines.append(f"| {r['label']} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | "
                     f"{r['max_ms']:.0f} | {r['mean_ms']:.0f} | {r['p99_ms'] / r['p50_ms']:.2f} | "
                     f"{r['spike']:.2f} | {ratio} | {r['refresh_wait_s']:.2f} | "
                     f"{r['staleness_max']} | {r['final_val_loss']:.4f} | {r['train_s']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--sweep", action="store_true",
                        help="the staleness sweep S in {1, 2, 3, 5, 10} beside native SOAP")
    parser.add_argument("--gpu", action="store_true",
                        help="the ~100M-parameter model on one CUDA device")
    parser.add_argument("--only", help="run only configurations whose label contains this")
    parser.add_argument("--out", help="results file (default benchmarks/results/refresh.json; "
                                      "refresh_sweep.json with --sweep, refresh_gpu.json "
                                      "with --gpu)")
    args = parser.parse_args()
    if args.gpu and not torch.cuda.is_available():
        parser.error("--gpu: no CUDA device is available")
    chosen = [(label, extra) for label, extra in (gpu_configs() if args.gpu
                                                  else configs(args.sweep))
              if not args.only or args.only in label]
    with tempfile.TemporaryDirectory() as tmp:
        results = round_robin(chosen, args.steps, tmp, GPU_MODEL if args.gpu else MODEL)
    default = "refresh_gpu" if args.gpu else "refresh_sweep" if args.sweep else "refresh"
    out = Path(args.out or f"benchmarks/results/{default}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": args.steps, "results": results}, indent=2))
    plot(results, out.with_name(out.stem + "_steps.png"))
    text = table(results, args.steps)
    out.with_name(out.stem + "_table.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
