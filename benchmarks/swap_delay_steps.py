"""Steps to tuned AdamW's loss for SOAP against the swap delay d (issue 27, item 4).

The optimizers suite's default-corpus setting (1.02M parameters, lr 1e-2, 500-step schedule),
trained to step STOP with an evaluation every EVERY steps; prints one JSON line: steps to
TARGET (tuned AdamW's final loss in docs/benchmarks/optimizers.json), val loss at 200 and at
STOP. Deterministic mode: the step count does not depend on timing.

    .venv/bin/python benchmarks/swap_delay_steps.py native|default|d0|d2|d5 [overrides...]
    RAMP=60 .venv/bin/python benchmarks/swap_delay_steps.py d0   # d = 0 until step 60, then auto
"""

import json
import os
import sys
import tempfile
import time

from asteria_bench.suites.optimizers import reach
from asteria_core.cli import resolve_config
from asteria_core.train.trainer import Trainer

TARGET = float(os.environ.get("TARGET", "1.7785"))
STOP = int(os.environ.get("STOP", "275"))
EVERY = int(os.environ.get("EVERY", "10"))
RAMP = int(os.environ.get("RAMP", "0"))
VARIANTS = {
    "native": ["--policy.workers", "0", "--policy.swap_delay", "0"],
    "default": [],  # the runtime's defaults: one worker, S = 10, d = auto = S
    **{f"d{d}": ["--policy.swap_delay", str(d)] for d in (0, 1, 2, 3, 5)},
}


def main() -> None:
    name, overrides = sys.argv[1], sys.argv[2:]
    args = ["--train.steps", "500", "--train.out_dir", tempfile.mkdtemp(),
            "--train.threads", "2", "--train.eval_interval", "25", "--train.eval_batches", "10",
            "--optim.name", "soap", "--optim.lr", "1e-2", *VARIANTS[name], *overrides]
    trainer = Trainer(resolve_config(None, args), jsonl=False)
    curve = [{"step": 0, "val_loss": trainer.evaluate(), "wall_s": 0.0, "energy_j": 0.0}]
    t0 = time.perf_counter()
    for step in range(1, STOP + 1):
        if RAMP and step == RAMP:
            trainer.policy.propose({"swap_delay": "auto"})
        trainer.train_step()
        trainer.runtime.end_step()
        if step % EVERY == 0:
            curve.append({"step": step, "val_loss": trainer.evaluate(), "wall_s": 0.0,
                          "energy_j": 0.0})
    engine = trainer.runtime.refresh
    window = engine._window(trainer.policy.current) if engine is not None else None
    trainer.close()
    reached = reach(curve, TARGET)
    at = {c["step"]: round(c["val_loss"], 4) for c in curve}
    print(json.dumps({"name": name, "overrides": overrides, "ramp": RAMP or None,
                      "swap_window": window,
                      "steps_to_target": reached and round(reached["step"], 1),
                      "val_loss_200": at.get(200), "val_loss_last": at[curve[-1]["step"]],
                      "seconds": round(time.perf_counter() - t0)}))


if __name__ == "__main__":
    main()
