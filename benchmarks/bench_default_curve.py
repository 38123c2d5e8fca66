"""The default run's loss curve (`asteria start`'s run: SOAP, lr 1e-2, refresh on one worker
thread, d = S = 10), as a plot: the first 100 steps of every curve in benchmarks/results/
default_curve_*.json, and each curve's largest step-to-step loss ratio.

    .venv/bin/python benchmarks/bench_default_curve.py --label after     # train 500 steps, plot
    .venv/bin/python benchmarks/bench_default_curve.py --plot-only       # re-plot the JSON files

A run trains the served default config with train.steps = --steps (the cosine schedule spans
them) and the trainer's seed, in this process; it writes default_curve_<label>.json (every
training loss, the evaluations, the largest ratio over the first 100 steps) and the plot
docs/default-run-loss.png. `before` is the curve measured before the first swap transported
the second moment (docs/optimizers.md, "The first swap"); that code is gone, so its JSON is kept.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PLOT = ROOT / "docs" / "default-run-loss.png"
FIRST = 100


def largest_jump(losses: list[float], first: int = FIRST) -> tuple[int, float]:
    """(step, ratio) of the largest loss over the previous step's loss within the first steps."""
    ratios = [(step, later / before) for step, (before, later)
              in enumerate(zip(losses[:first], losses[1:first], strict=False), start=2)]
    return max(ratios, key=lambda r: r[1])


def train(steps: int) -> dict:
    from asteria_core.train.config_io import config_from_dict
    from asteria_core.train.trainer import Trainer
    from backend.commands import SERVED_RUN

    config = copy.deepcopy(SERVED_RUN)
    config["train"].update(steps=steps, checkpoint_interval=0, out_dir=tempfile.mkdtemp())
    config["telemetry"] = {"model_cpu_watts": 0.0}
    trainer = Trainer(config_from_dict(config), jsonl=False)
    t0 = time.perf_counter()
    try:
        result = trainer.train(progress=False)
    finally:
        trainer.close()
    losses = result.train_losses
    step, ratio = largest_jump(losses)
    return {"config": config, "steps": steps, "seconds": round(time.perf_counter() - t0, 1),
            "train_losses": losses, "eval_losses": result.eval_losses,
            "final_train_loss": losses[-1], "final_eval_loss": result.eval_losses[steps],
            "largest_jump_first_100": {"step": step, "ratio": ratio}}


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=110)
    for path in sorted(RESULTS.glob("default_curve_*.json")):
        data = json.loads(path.read_text())
        label = path.stem.removeprefix("default_curve_")
        losses = data["train_losses"][:FIRST]
        step, ratio = largest_jump(data["train_losses"])
        ax.plot(range(1, len(losses) + 1), losses, marker=".", markersize=3, linewidth=1,
                label=f"{label}: largest step-to-step ratio {ratio:.2f} (step {step}); "
                      f"eval loss at {data['steps']}: {data['final_eval_loss']:.4f}")
        print(f"{label}: largest ratio over the first {FIRST} steps {ratio:.3f} at step {step};"
              f" final train loss {data['final_train_loss']:.4f}, eval loss "
              f"{data['final_eval_loss']:.4f} at step {data['steps']}")
    ax.axvline(11.5, color="grey", linestyle=":", linewidth=1)
    ax.text(12, ax.get_ylim()[1] * 0.97, "first basis swapped in (step 11)", fontsize=8,
            va="top", color="grey")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("Default run (SOAP, lr 1e-2, d = S = 10), first 100 steps")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(PLOT)
    print(f"wrote {PLOT.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="after", help="names the curve's JSON file")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    if not args.plot_only:
        data = train(args.steps)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"default_curve_{args.label}.json").write_text(json.dumps(data, indent=1))
    plot()


if __name__ == "__main__":
    main()
