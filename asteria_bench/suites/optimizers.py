"""Optimization quality: AdamW and Muon against SOAP, Shampoo and KL-Shampoo, in steps, seconds
and joules.

Every configuration trains the default model (about 1M parameters) from the same seed on the
same batches with the trainer's defaults (warmup, cosine decay to the last step, grad clipping,
weight decay on matrices), evaluating the validation loss before the first step and every
`eval_interval` steps. AdamW is tuned over an lr grid; the tuned AdamW's final validation loss is
the target. Per configuration: the validation loss against step, training wall-clock (the sum of
the step records' step_seconds: evaluations excluded) and energy; the step, seconds and joules at
which the loss first reaches the target (linear interpolation between the two evaluations around
the crossing; None when it never does); their ratios to tuned AdamW's; and the paper's
energy-normalised loss-reduction efficiency (L_init - L_final) / (E / E_AdamW).

Configurations: AdamW (lr grid), Muon (lr grid; its AdamW part at tuned AdamW's lr), native
SOAP (refresh inline, swap delay 0: the reference), Asteria-SOAP (the runtime's defaults:
refresh on one host worker thread, swap delay "auto": the refresh interval, at most S = 10) at
native SOAP's tuned lr, native Shampoo and native KL-Shampoo (lr grids), and with `peers` each
installed peer SOAP (asteria_bench/peers.py; full run only) at native SOAP's tuned lr. The full
run trains all of them on the first corpus and the race (RACE: AdamW, Muon, native and
Asteria-SOAP) on the others (`later_configs`).

Tuning: each grid is run, and while the best lr sits at an edge of what has run, the grid grows
one step past that edge (the ratio of the two lrs there), at most `max_widen` times; a tuned lr
still at an edge is flagged in the grid table (`bracketed` false), never hidden. Seeds: every
tuned configuration trains with `seeds` seeds; the tables give the median and the spread (min,
max) over them, the target is the median of tuned AdamW's final losses, and the tuning itself
reads the first seed. The refresh interval is an axis for native and Asteria-SOAP (`intervals`,
at their tuned lr): every interval on the first seed, then the other seeds at each one's
quickest (`quickest`: the least wall-clock to the target). Rungs (`--rung`): the default model,
or a large one of 4x the parameters trained on 4x the tokens. A full pass takes hours: a run cut
short continues with `--resume` (asteria_bench/resume.py), keeping each configuration it had
trained. Tables, findings and the headline: asteria_bench/reports/optimizers.py.
Corpora: the default one (pydoc_data.topics, English), the built-in "python-source" one (Python
code; asteria_core/train/data.py), and a file the user names (`--corpus PATH`).

Arrangements (asteria_bench/turns.py ARRANGEMENTS): every configuration trains in the suite's
`arrangement`. The full run's is "device-host", the stand-in for a GPU and its host (training on
core 0 with one thread, Asteria's worker on core 1, native SOAP refreshing inline on core 0);
the race's quickest configurations train once more in "shared" (`beside`), this machine as it
is (training's threads and Asteria's worker on the same 2 cores). Wall-clock to the target
depends on where the refresh runs, so every wall-clock figure names its arrangement. The quick
run trains shared only, as does a machine with one CPU.

Energy comes from the step records' energy section, the device part and the host part summed
(`total_joules`; every optimizer is counted the same, wherever its refresh runs): the device is
the run's GPU (nvml) where there is one, the host RAPL where readable, otherwise the telemetry's
model estimate (CPU seconds of the run's processes, worker threads and processes included,
x 15 W, `--telemetry.model_cpu_watts 15`), labelled an estimate. `energy_source` names the
parts summed (e.g. nvml+rapl). For the estimate, the evaluations' CPU is taken out (measured
around each evaluation); a measured source includes it.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from asteria_bench import resume, turns
from asteria_bench.options import BenchOptions, progress
from asteria_bench.results import SuiteResult
from asteria_bench.selection import (
    DEVICE_HOST,
    RACE,
    SHARED,
    arrangement_of,
    best_of,
    lr_text,
    other_arrangement,
    quickest,
    seeds_of,
    target_of,
    tuning,
    widen,
)
from asteria_core.cli import resolve_config
from asteria_core.machine import MACHINE
from asteria_core.policy import Policy
from asteria_core.telemetry.records import StepRecord
from asteria_core.train.data import encode, load_corpus, split_tokens
from asteria_core.train.trainer import Trainer

TITLE = "Optimization quality: steps, wall-clock and energy to tuned AdamW's final loss"
RESUMABLE = True  # hours of runs: --resume continues from the runs its JSON holds

MODEL_CPU_WATTS = 15.0
ANCHORS = {"soap_paper": "SOAP paper (Vyas et al. 2024): 40% fewer iterations than AdamW at "
                         "360M and 660M parameters (0.60x the steps)",
           "independent": "independent tuned comparisons: about 1.4x fewer steps at 0.1B "
                          "parameters (about 0.71x the steps)"}
"""The published figures the report sets the measured steps against (saved in the file)."""
ENERGY_LABELS = {
    "nvml": "measured: NVML (GPU), evaluations included",
    "rapl": "measured: RAPL (CPU package), evaluations included",
    "model": f"estimate: process CPU seconds x {MODEL_CPU_WATTS:g} W (telemetry model meter), "
             "evaluations excluded",
}


@dataclass(frozen=True)
class Sizes:
    """What one run of the suite trains (monkeypatch QUICK or FULL for a smaller test)."""

    steps: int
    eval_interval: int
    eval_batches: int
    adamw_lrs: tuple[float, ...]
    second_order_lrs: tuple[float, ...]
    configs: tuple[str, ...]
    """Which of FAMILIES (in this order); peers are added by opts.peers."""
    corpora: tuple[str, ...]
    """Built-in corpora: "default" and/or "python-source"; a --corpus file is added to these."""
    overrides: tuple[str, ...] = ()
    """Extra trainer overrides (e.g. a smaller model for tests)."""
    arrangement: str = "shared"
    """Where every configuration trains (turns.ARRANGEMENTS); shared on a machine with one CPU."""
    beside: tuple[str, ...] = ()
    """Families trained once more in the other arrangement, at their quickest configuration
    (`quickest`), with `beside_seeds` seeds, on every corpus."""
    beside_seeds: int = 1
    later_configs: tuple[str, ...] | None = None
    """The families of every corpus after the first (None: `configs`); where set, the peers
    train on the first corpus only."""
    notes: tuple[str, ...] = field(default=())
    muon_lrs: tuple[float, ...] = ()
    """Muon's lr grid (its own lr, before the shape scaling; torch's "original" scaling)."""
    seeds: int = 1
    """Seeds of every tuned configuration (--seeds overrides it)."""
    intervals: tuple[int, ...] = ()
    """Refresh intervals trained by native and Asteria-SOAP at their tuned lr."""
    max_widen: int = 0
    """How many times a grid may grow past an edge its best lr sits at."""
    rung: str = "default"


QUICK = Sizes(steps=150, eval_interval=25, eval_batches=10, adamw_lrs=(3e-3,),
              second_order_lrs=(1e-2,), configs=("adamw", "muon", "soap", "kl_shampoo"),
              corpora=("default",), muon_lrs=(2e-2,),
              notes=("quick: AdamW's lr grid skipped (3e-3 only, the best of {1e-3, 3e-3, 1e-2} "
                     "in the full run); Muon at 2e-2 only; second-order lr 1e-2 only; grids "
                     "not widened (one lr can not be bracketed); one seed; no refresh-interval "
                     "axis; Asteria-SOAP and Shampoo left out; 150 steps; default corpus only "
                     "(plus --corpus if given); the shared arrangement only",))
FULL = Sizes(steps=500, eval_interval=25, eval_batches=10, adamw_lrs=(1e-3, 3e-3, 1e-2),
             second_order_lrs=(3e-3, 1e-2, 3e-2), muon_lrs=(1e-2, 2e-2, 5e-2),
             configs=("adamw", "muon", "soap", "asteria_soap", "shampoo", "kl_shampoo"),
             corpora=("default", "python-source"), arrangement="device-host", beside=RACE,
             later_configs=RACE, seeds=3, intervals=(1, 2, 5, 10, 20), max_widen=2,
             notes=("the race (AdamW, Muon, native and Asteria-SOAP) on both corpora; Shampoo, "
                    "KL-Shampoo and the peers on the first; every configuration in the "
                    "device-host arrangement, the race's quickest once more in the shared one "
                    "with one seed (an arrangement changes a run's numbers through rounding "
                    "only, in deterministic mode: its steps about the same, its time not)",))
LARGE = replace(
    FULL, steps=1000, eval_interval=50, eval_batches=5, rung="large",
    # 4x the default's parameters (width 256: about 4.0M against 1.0M) on 4x its tokens (twice
    # the batch, twice the steps): about 14x a default run's compute, some 15 minutes a run on
    # this machine's two cores, so about eight runs fit in two hours.
    overrides=("--model.n_embd", "256", "--data.batch_size", "32"),
    adamw_lrs=(3e-3,), second_order_lrs=(1e-2,), muon_lrs=(2e-2,),
    configs=RACE, corpora=("default",), arrangement="shared", beside=(), later_configs=None,
    seeds=1, intervals=(1,), max_widen=0,
    notes=("large rung: width 256 (4x the parameters) and batch 32 for 1000 steps (4x the "
           "tokens); each optimizer at the default rung's tuned lr (not re-tuned: not "
           "bracketed), one seed unless --seeds, refresh interval 1 beside the default 10, the "
           "default corpus, the shared arrangement: six runs, to fit about two hours here",))
RUNGS = {"default": FULL, "large": LARGE}

FAMILIES = {  # key: (label, optim.name, extra overrides)
    "adamw": ("AdamW", "adamw", ()),
    "muon": ("Muon", "muon", ()),  # its AdamW part at tuned AdamW's lr (train_corpus)
    "soap": ("SOAP (native)", "soap", ("--policy.workers", "0", "--policy.swap_delay", "0")),
    "asteria_soap": ("Asteria-SOAP", "soap", ()),  # the runtime's policy defaults
    "shampoo": ("Shampoo (native)", "shampoo", ("--policy.workers", "0",
                                                "--policy.swap_delay", "0")),
    "kl_shampoo": ("KL-Shampoo (native)", "kl_shampoo", ("--policy.workers", "0",
                                                         "--policy.swap_delay", "0")),
}
CORPUS_NAMES = {"default": "default (pydoc_data.topics: CPython's English documentation)",
                "python-source": "python-source (15 CPython stdlib modules' source)"}


# ------------------------------------------------------------------------------ pure parts
def check_corpus(path: str) -> Path:
    """A corpus the user names with --corpus: an existing, readable, non-empty text file."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"--corpus: {path!r} does not exist; allowed: a readable text file")
    if not p.is_file():
        raise ValueError(f"--corpus: {path!r} is not a file; allowed: a readable text file")
    try:
        with p.open("rb") as f:
            head = f.read(1 << 16)
    except OSError as err:
        raise ValueError(f"--corpus: {path!r} can not be read ({err.strerror}); allowed: a "
                         "readable text file") from None
    if not head:
        raise ValueError(f"--corpus: {path!r} is empty; allowed: a readable text file")
    if b"\0" in head:
        raise ValueError(f"--corpus: {path!r} looks binary (it has NUL bytes); allowed: a "
                         "readable text file")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 4:  # not just a character cut by the 64 KiB read
            raise ValueError(f"--corpus: {path!r} is not UTF-8 text (byte {err.start}); "
                             "allowed: a readable text file") from None
    return p


def check_split(text: str, sizes: Sizes) -> None:
    """The --corpus text is long enough for the model's training and validation splits."""
    probe = resolve_config(None, list(sizes.overrides))
    try:
        split_tokens(encode(text), probe.data.val_fraction, probe.model.block_size)
    except ValueError as err:
        raise ValueError(f"--corpus: {err}".replace("data.corpus: ", "")) from None


# ------------------------------------------------------------------------------ one run
def _energy(record: StepRecord) -> tuple[str | None, float | None]:
    """The sources summed ('+'-joined) and the device + host total of a record."""
    energy = record.energy
    if energy is None or energy.total_joules is None:
        return None, None
    return energy.parts, energy.total_joules


def step_parts(records: list[StepRecord]) -> dict[str, float]:
    """Where a step's time goes, in ms per step over the run: the compute of each phase (the
    optimizer's update, the boundary's swaps and snapshots, ...) and each cause of waiting."""
    total: dict[str, float] = {}
    for record in records:
        if record.timing is None:
            continue
        for part, seconds in (*record.timing.compute_seconds.items(),
                              *record.timing.idle_seconds.items()):
            total[part] = total.get(part, 0.0) + seconds
    return {part: 1e3 * seconds / len(records) for part, seconds in total.items()}


def energy_label(parts: str | None) -> str:
    return " + ".join(ENERGY_LABELS[s] for s in parts.split("+")) if parts else "not measured"


def peer_factory(name: str, config):
    from asteria_bench import peers

    return peers.factory_from_config(name, config)


def train_one(spec: dict[str, Any], corpus_path: str, sizes: Sizes, opts: BenchOptions,
              tmp: Path) -> dict[str, Any]:
    """Train one configuration in its arrangement; its curve (step, val loss, wall-clock,
    energy) and raw steps. The device-host arrangement pins the calling thread while it trains
    (train.cpus); it gets its CPUs back after."""
    with turns.main_thread_cpus():
        return _train_one(spec, corpus_path, sizes, opts, tmp)


def _train_one(spec: dict[str, Any], corpus_path: str, sizes: Sizes, opts: BenchOptions,
               tmp: Path) -> dict[str, Any]:
    # A peer runs with our SOAP's config (its factory reads the hyperparameters from it).
    _label, name, extra = FAMILIES["soap" if spec.get("peer") else spec["family"]]
    arrangement = spec.setdefault("arrangement", SHARED)
    threads = max(1, min(len(os.sched_getaffinity(0)), MACHINE.max_threads))
    args = ["--train.steps", str(sizes.steps), "--train.out_dir", str(tmp),
            "--train.threads", str(threads),
            "--train.eval_interval", str(sizes.eval_interval),
            "--train.eval_batches", str(sizes.eval_batches), "--train.device", opts.device,
            "--data.corpus", corpus_path, "--optim.name", name, "--optim.lr", str(spec["lr"]),
            "--telemetry.model_cpu_watts", str(MODEL_CPU_WATTS), *extra, *sizes.overrides,
            *spec.get("extra", ()), *turns.arrangement_args(arrangement)]
    if spec.get("seed"):  # the n-th seed after the first: the trainer's default seed + n
        args += ["--train.seed", str(resolve_config(None, []).train.seed + spec["seed"])]
    if spec.get("interval") is not None:
        args += ["--policy.refresh_interval", str(spec["interval"])]
    config = resolve_config(None, args)
    threads = config.train.threads
    factory = peer_factory(spec["peer"], config) if spec.get("peer") else None
    trainer = Trainer(config, jsonl=False, optimizer_factory=factory)
    records: list[StepRecord] = []
    trainer.runtime.add_listener(records.append)
    eval_cpu = 0.0  # process CPU seconds spent evaluating so far

    def evaluate() -> float:
        nonlocal eval_cpu
        c0 = time.process_time()
        loss = trainer.evaluate()
        eval_cpu += time.process_time() - c0
        return loss

    t0 = time.perf_counter()
    curve = [{"step": 0, "val_loss": evaluate(), "wall_s": 0.0, "energy_j": 0.0}]
    source, wall = None, 0.0
    bar = progress(sizes.steps, f"{spec['label']} lr {lr_text(spec['lr'])} [{spec['corpus']}, "
                                f"{arrangement}, seed {spec.get('seed', 0)}]", opts)
    try:
        for step in range(1, sizes.steps + 1):
            if trainer.runtime.stop_requested:  # e.g. refreshes failed past the limit
                break
            cpu_before = eval_cpu  # the evaluations before this step's record reads the meter
            trainer.train_step()
            due = step % sizes.eval_interval == 0 or step == sizes.steps
            loss = evaluate() if due else None
            if loss is not None:
                trainer.runtime.log(eval_loss=loss)
            record = trainer.runtime.end_step()
            wall += record.step_seconds
            bar.update(1)
            if loss is not None:
                source, joules = _energy(record)
                if source and "model" in source.split("+"):
                    joules -= cpu_before * MODEL_CPU_WATTS
                curve.append({"step": step, "val_loss": loss, "wall_s": wall,
                              "energy_j": joules})
                bar.set_postfix(val=f"{loss:.3f}", refresh=False)
    finally:
        bar.close()
        trainer.close()
    if source is None:
        for point in curve:
            point["energy_j"] = None
    step_s = [r.step_seconds for r in records]
    return {
        **spec, "optimizer": name, "params": trainer.model_params, "steps": sizes.steps,
        "tokens_per_step": records[0].tokens if records else None, "torch_threads": threads,
        "policy": {"workers": config.policy.workers, "worker_kind": config.policy.worker_kind,
                   "swap_delay": config.policy.delay,
                   "refresh_interval": config.policy.refresh_interval},
        "run_s": time.perf_counter() - t0, "eval_cpu_s": eval_cpu,
        "l_init": curve[0]["val_loss"], "final_val_loss": curve[-1]["val_loss"],
        "wall_s": wall, "energy_j": curve[-1]["energy_j"], "energy_source": source,
        "energy_label": energy_label(source),
        "stopped_at": trainer.step if trainer.step < sizes.steps else None,
        "curve": curve, "step_ms": [1e3 * s for s in step_s],
        "step_ms_median": 1e3 * statistics.median(step_s), "parts_ms": step_parts(records),
        "train_losses": [r.loss for r in records],
    }


# ------------------------------------------------------------------------------ the suite
def _peer_names(opts: BenchOptions) -> list[str]:
    # The quick run leaves them to the critical-path suite (heavyball's compilation alone would
    # take a minute of its budget).
    if not opts.peers or opts.quick:
        return []
    try:
        from asteria_bench import peers
    except ImportError:
        return []
    return list(peers.available_peers("soap"))


def _peer_label(name: str) -> str:
    from asteria_bench import peers

    return peers.peer_label(name)


def pick_sizes(opts: BenchOptions) -> Sizes:
    """The rung's sizes (--quick: the quick ones, whatever the rung), with --seeds applied."""
    if opts.rung not in RUNGS:
        raise ValueError(f"--rung: got {opts.rung!r}; allowed: {' | '.join(RUNGS)}")
    sizes = QUICK if opts.quick else RUNGS[opts.rung]
    return sizes if opts.seeds is None else replace(sizes, seeds=opts.seeds)


def pick_arrangement(sizes: Sizes, config: dict[str, Any]) -> Sizes:
    """`sizes` as this machine can run them: with one CPU there is no device-host arrangement,
    so everything trains shared and nothing beside it (said in `config`)."""
    if sizes.arrangement != DEVICE_HOST and not sizes.beside:
        return sizes
    try:
        turns.arrangement_args(DEVICE_HOST)
    except ValueError as err:
        config["device_host_skipped"] = str(err)
        return replace(sizes, arrangement=SHARED, beside=())
    return sizes


def planned_runs(sizes: Sizes, corpora: int, peers: int = 0) -> dict[str, int]:
    """How many runs a full pass trains, before widening (`least`) and with every grid widened
    `max_widen` times (`most`): for an estimate of its time from one run's."""
    default = Policy().refresh_interval
    axis = [i for i in sizes.intervals if i != default]
    least = most = 0
    for n in range(corpora):
        configs = sizes.configs if n == 0 or sizes.later_configs is None else \
            sizes.later_configs
        with_peers = peers if n == 0 or sizes.later_configs is None else 0
        per = grids = 0
        for family in configs:
            if family == "asteria_soap":
                per += 1
                continue
            grid = {"adamw": sizes.adamw_lrs, "muon": sizes.muon_lrs}.get(
                family, sizes.second_order_lrs)
            per += len(grid)
            grids += 1
        per += with_peers + (len(configs) + with_peers) * (sizes.seeds - 1)
        soaps = len([f for f in ("soap", "asteria_soap") if f in configs])
        # every interval on the first seed; the other seeds at the quickest, where it is not
        # the default (whose seeds ran already): at most one interval per SOAP
        per += soaps * len(axis) + (soaps * (sizes.seeds - 1) if axis else 0)
        per += len([f for f in sizes.beside if f in configs]) * sizes.beside_seeds
        least += per
        most += per + grids * sizes.max_widen
    return {"least": least, "most": most}


def run(opts: BenchOptions) -> SuiteResult:
    sizes = pick_sizes(opts)
    user_corpus = check_corpus(opts.corpus) if opts.corpus else None
    name = "optimizers" if sizes.rung == "default" else f"optimizers-{sizes.rung}"
    config: dict[str, Any] = {}
    sizes = pick_arrangement(sizes, config)
    result = SuiteResult(name, TITLE, opts.quick, opts.command, config={
        **config, "rung": sizes.rung, "muon_lrs": list(sizes.muon_lrs), "seeds": sizes.seeds,
        "intervals": list(sizes.intervals), "max_widen": sizes.max_widen,
        "arrangement": sizes.arrangement, "beside": list(sizes.beside),
        "beside_seeds": sizes.beside_seeds,
        "later_configs": None if sizes.later_configs is None else list(sizes.later_configs),
        "muon_adamw_lr": "tuned AdamW's lr (optim.adamw_lr), Muon's own lr tuned over its grid",
        "steps": sizes.steps, "eval_interval": sizes.eval_interval,
        "eval_batches": sizes.eval_batches, "adamw_lrs": list(sizes.adamw_lrs),
        "second_order_lrs": list(sizes.second_order_lrs), "configs": list(sizes.configs),
        "overrides": list(sizes.overrides), "notes": list(sizes.notes),
        "lr_grid_skipped": len(sizes.adamw_lrs) == 1,
        "target": "tuned AdamW's final validation loss (per corpus)",
        "to_target": "first evaluation at or below the target, interpolated linearly between "
                     f"it and the evaluation before (evaluations every {sizes.eval_interval} "
                     "steps and at step 0)",
        "wall_clock": "sum of the step records' step_seconds (evaluations excluded)",
        "energy_sources": ENERGY_LABELS, "model_cpu_watts": MODEL_CPU_WATTS,
        "asteria_soap_lr": "native SOAP's tuned lr", "anchors": ANCHORS, "corpora": {},
        "planned_runs": planned_runs(sizes, len(sizes.corpora) + bool(opts.corpus),
                                     len(_peer_names(opts))),
        "peers": {peer: _peer_label(peer) for peer in _peer_names(opts)},  # with versions
        "device": opts.device, "measured_code": resume.code_digest(name)})
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        corpora = write_corpora(sizes, user_corpus, tmp, result)
        kept = {run_key(r): r for r in resume.previous_runs(result, opts.out_dir)} \
            if opts.resume else {}
        for i, (key, path) in enumerate(corpora):
            corpus_runs = train_corpus(key, path, sizes, opts, tmp, result, kept, first=i == 0)
            result.plots.extend(plot_corpus(result, key, corpus_runs, opts.out_dir))
            result.save(opts.out_dir)
    resume.settle(result)
    result.save(opts.out_dir)
    return result


def config_text(run: dict[str, Any]) -> str:
    """lr, and the refresh interval where the run set one (the plot's and the report's label)."""
    text = f"lr {lr_text(run['lr'])}"
    return text if run.get("interval") is None else f"{text}, interval {run['interval']}"


def plot_corpus(result: SuiteResult, key: str, runs: list[dict[str, Any]],
                out_dir: Path) -> list[dict[str, str]]:
    """One PNG, two panels: validation loss against step and against training wall-clock, of
    each family's tuned run and each SOAP's quickest interval, first seed, in the suite's
    arrangement; none before tuned AdamW has trained."""
    here = result.config.get("arrangement", SHARED)
    target = target_of(runs, here)
    if target is None:
        return []
    desc = result.config["corpora"][key]["description"]
    tuned = {family: seeds_of(runs, best) for family in dict.fromkeys(r["family"] for r in runs)
             if (best := best_of(runs, family, here)) is not None}
    shown = [r for r in runs if arrangement_of(r) == here and tuning(r)
             and not r.get("seed") and r in tuned.get(r["family"], [])]
    shown += [q for f in ("soap", "asteria_soap")
              if (q := quickest(runs, f, target, here)) is not None and q not in shown]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_wall) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in shown:
        label = f"{r['label']} ({config_text(r)})"
        steps = [p["step"] for p in r["curve"]]
        walls = [p["wall_s"] for p in r["curve"]]
        losses = [p["val_loss"] for p in r["curve"]]
        by_step.plot(steps, losses, marker="o", markersize=3, label=label)
        by_wall.plot(walls, losses, marker="o", markersize=3, label=label)
    for ax, xlabel in ((by_step, "step"), (by_wall, "training wall-clock, s (measured)")):
        ax.axhline(target, color="grey", linestyle="--", linewidth=1,
                   label=f"tuned AdamW's final loss {target:.3f}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss")
        ax.set_ylim(top=min(max(p["val_loss"] for r in shown for p in r["curve"][1:]) + 0.2,
                            6.0))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    by_step.set_title(f"validation loss against step: {key}")
    by_wall.set_title(f"validation loss against wall-clock: {key}")
    fig.tight_layout()
    name = f"optimizers-{key}-loss.png"
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / name, dpi=100)
    plt.close(fig)
    return [{"file": name, "caption": "Validation loss against step and against training "
                                     "wall-clock, each optimizer at its tuned lr (each SOAP also "
                                     "at its quickest refresh interval), first seed, on the "
                                     f"{desc} corpus; the dashed line is the target"}]


def write_corpora(sizes: Sizes, user_corpus: Path | None, tmp: Path,
                  result: SuiteResult) -> list[tuple[str, str]]:
    """(key, trainer path) of every corpus, the built-in ones written out into `tmp` so that
    data.corpus is a path; each described in config["corpora"], with its digest."""
    corpora: list[tuple[str, str, str]] = []  # (key, trainer path, description)
    for key in sizes.corpora:
        if key == "default":
            corpora.append((key, "", CORPUS_NAMES[key]))
        else:
            path = tmp / f"{key}.txt"
            path.write_text(load_corpus(key), encoding="utf-8")
            corpora.append((key, str(path), CORPUS_NAMES.get(key, key)))
    if user_corpus is not None:
        corpora.append(("user", str(user_corpus), f"user ({user_corpus})"))
    for key, path, description in corpora:
        body = load_corpus(path)
        if key == "user":
            check_split(body, sizes)
        raw = body.encode()
        result.config["corpora"][key] = {"description": description, "bytes": len(raw),
                                         "sha256": hashlib.sha256(raw).hexdigest()[:16],
                                         "path": path or None}
    return [(key, path) for key, path, _text in corpora]


def run_key(run: dict[str, Any]) -> tuple[Any, ...]:
    """What makes a run the run it is: a kept run (--resume) stands in for the spec it matches."""
    return (run["corpus"], run["family"], run["lr"], run.get("peer"), arrangement_of(run),
            run.get("seed", 0), run.get("interval"), tuple(run.get("extra", ())))


def train_corpus(key: str, path: str, sizes: Sizes, opts: BenchOptions, tmp: Path,
                 result: SuiteResult, kept: dict[tuple[Any, ...], dict[str, Any]],
                 first: bool = True) -> list[dict[str, Any]]:
    """Every configuration on one corpus in the suite's arrangement, saving the suite's JSON
    after each: the lr grids (widened past an edge their best sits at), the other seeds of every
    tuned configuration, the refresh-interval axis on the first seed and the other seeds of each
    SOAP's quickest interval; then the `beside` families' quickest configurations in the other
    arrangement. A configuration `kept` holds (a resumed run's) is not trained again: the
    choices that follow from it come out as they did."""
    runs: list[dict[str, Any]] = []
    here = sizes.arrangement
    configs = sizes.configs if first or sizes.later_configs is None else sizes.later_configs

    def one(family: str, lr: float, label: str, peer: str | None = None,
            arrangement: str = here, seed: int = 0, interval: int | None = None,
            extra: tuple[str, ...] = ()) -> dict[str, Any]:
        spec = {"corpus": key, "family": family, "label": label, "lr": lr, "peer": peer,
                "arrangement": arrangement, "seed": seed, "interval": interval,
                "extra": list(extra)}
        out = kept.pop(run_key(spec), None)
        if out is None:
            out = train_one(spec, path, sizes, opts, tmp)
        else:  # a kept run: the file already holds it
            result.carried.remove(out)
        runs.append(out)
        result.runs.append(out)
        result.save(opts.out_dir)
        return out

    def again(r: dict[str, Any], **changes: Any) -> dict[str, Any]:
        """`r`'s configuration once more, with another seed or arrangement."""
        return one(r["family"], r["lr"], r["label"], peer=r["peer"],
                   **{"seed": r.get("seed", 0), "interval": r.get("interval"),
                      "arrangement": arrangement_of(r), **changes}, extra=tuple(r["extra"]))

    def tune(family: str, grid: tuple[float, ...], extra: tuple[str, ...] = ()) -> None:
        label = FAMILIES[family][0]
        for lr in grid:
            one(family, lr, label, extra=extra)
        for _ in range(sizes.max_widen):
            tried = [r["lr"] for r in runs if r["family"] == family and tuning(r)]
            best = best_of(runs, family, here)
            nxt = None if best is None else widen(tried, best["lr"])
            if nxt is None or nxt in tried:
                break
            one(family, nxt, label, extra=extra)

    def extra_of(family: str) -> tuple[str, ...]:
        adamw = best_of(runs, "adamw", here)
        if family == "muon" and adamw is not None:
            return ("--optim.adamw_lr", str(adamw["lr"]))
        return ()

    for family in configs:
        if family == "asteria_soap":
            continue  # after native SOAP's grid, at its tuned lr
        grid = {"adamw": sizes.adamw_lrs, "muon": sizes.muon_lrs}.get(family,
                                                                       sizes.second_order_lrs)
        tune(family, grid, extra_of(family))
    soap = best_of(runs, "soap", here)
    soap_lr = soap["lr"] if soap else sizes.second_order_lrs[-1]
    if "asteria_soap" in configs:
        one("asteria_soap", soap_lr, FAMILIES["asteria_soap"][0])
    for name in _peer_names(opts) if first or sizes.later_configs is None else ():
        one(f"peer:{name}", soap_lr, _peer_label(name), peer=name)
    tuned = [r for r in (best_of(runs, f, here) for f in dict.fromkeys(r["family"] for r in runs))
             if r is not None]
    for r in tuned:
        for seed in range(1, sizes.seeds):
            again(r, seed=seed)
    default = Policy().refresh_interval
    target = target_of(runs, here)
    for r in tuned:
        if r["family"] not in ("soap", "asteria_soap"):
            continue
        for interval in sizes.intervals:
            if interval != default:  # the tuned run and its seeds are that point
                again(r, interval=interval)
        best = quickest(runs, r["family"], target, here)
        if best is not None and best.get("interval") is not None:
            for seed in range(1, sizes.seeds):
                again(best, seed=seed)
    for family in sizes.beside:
        best = quickest(runs, family, target, here)
        if best is not None:
            for seed in range(sizes.beside_seeds):
                again(best, seed=seed, arrangement=other_arrangement(here))
    return runs
