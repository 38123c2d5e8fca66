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
refresh on one host worker thread, swap delay d = S = 10) at native SOAP's tuned lr, native
Shampoo and native KL-Shampoo (lr grids), and with `peers` each installed peer SOAP
(asteria_bench/peers.py; full run only) at native SOAP's tuned lr.

Tuning: each grid is run, and while the best lr sits at an edge of what has run, the grid grows
one step past that edge (the ratio of the two lrs there), at most `max_widen` times; a tuned lr
still at an edge is flagged in the grid table (`bracketed` false), never hidden. Seeds: every
tuned configuration (and every configuration of the refresh-interval axis) trains with `seeds`
seeds; the tables give the median and the spread (min, max) over them, the target is the median
of tuned AdamW's final losses, and the tuning itself reads the first seed. The refresh interval
is an axis for native and Asteria-SOAP (`intervals`, at their tuned lr). Rungs (`--rung`): the
default model, or a large one of 4x the parameters trained on 4x the tokens. A full pass takes
hours: a run cut short continues with `--resume` (asteria_bench/resume.py), keeping each
configuration it had trained.
Corpora: the default one (pydoc_data.topics, English), the built-in "python-source" one (Python
code; asteria_core/train/data.py), and a file the user names (`--corpus PATH`).

Arrangements (asteria_bench/turns.py ARRANGEMENTS): every run above trains in the "shared" one,
this machine as it is (training's threads and Asteria's worker on the same 2 cores). On the
first corpus, tuned AdamW, tuned native SOAP and Asteria-SOAP train once more in "device-host",
the stand-in for a GPU and its host (training on core 0 with one thread, Asteria's worker on
core 1, native SOAP refreshing inline on core 0): wall-clock to the target depends on where the
refresh runs, so every wall-clock figure names its arrangement.

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
import math
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
from asteria_core.cli import resolve_config
from asteria_core.machine import MACHINE
from asteria_core.policy import Policy
from asteria_core.telemetry.records import StepRecord
from asteria_core.train.data import encode, load_corpus, split_tokens
from asteria_core.train.trainer import Trainer

TITLE = "Optimization quality: steps, wall-clock and energy to tuned AdamW's final loss"
RESUMABLE = True  # hours of runs: --resume continues from the runs its JSON holds

MODEL_CPU_WATTS = 15.0
ENERGY_LABELS = {
    "nvml": "measured: NVML (GPU), evaluations included",
    "rapl": "measured: RAPL (CPU package), evaluations included",
    "model": f"estimate: process CPU seconds x {MODEL_CPU_WATTS:g} W (telemetry model meter), "
             "evaluations excluded",
}
ANCHORS = {"soap_paper": "SOAP paper (Vyas et al. 2024): 40% fewer iterations than AdamW at "
                         "360M and 660M parameters (0.60x the steps)",
           "independent": "independent tuned comparisons: about 1.4x fewer steps at 0.1B "
                          "parameters (about 0.71x the steps)"}


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
    device_host: tuple[str, ...] = ()
    """Families trained once more in the device-host arrangement, at their tuned lr, on the
    first corpus (Asteria-SOAP at native SOAP's tuned lr, as in the shared one)."""
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
             corpora=("default", "python-source"),
             device_host=("adamw", "muon", "soap", "asteria_soap"),
             seeds=3, intervals=(1, 2, 5, 10, 20), max_widen=2)
LARGE = replace(
    FULL, steps=1000, eval_interval=50, eval_batches=5, rung="large",
    # 4x the default's parameters (width 256: about 4.0M against 1.0M) on 4x its tokens (twice
    # the batch, twice the steps): about 14x a default run's compute, some 15 minutes a run on
    # this machine's two cores, so about eight runs fit in two hours.
    overrides=("--model.n_embd", "256", "--data.batch_size", "32"),
    adamw_lrs=(3e-3,), second_order_lrs=(1e-2,), muon_lrs=(2e-2,),
    configs=("adamw", "muon", "soap", "asteria_soap"), corpora=("default",), device_host=(),
    seeds=1, intervals=(1,), max_widen=0,
    notes=("large rung: width 256 (4x the parameters) and batch 32 for 1000 steps (4x the "
           "tokens); each optimizer at the default rung's tuned lr (not re-tuned: not "
           "bracketed), one seed unless --seeds, refresh interval 1 beside the default 10, the "
           "default corpus, the shared arrangement: six runs, to fit about two hours here",))
RUNGS = {"default": FULL, "large": LARGE}
SHARED, DEVICE_HOST = "shared", "device-host"

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
def reach(curve: list[dict[str, float]], target: float) -> dict[str, float] | None:
    """Where a validation curve first reaches `target` (loss <= target).

    `curve`: evaluations in step order, each {"step", "val_loss", "wall_s", "energy_j"}. Between
    the last evaluation above the target and the first at or below it, the step, seconds and
    joules are interpolated linearly in the loss. None when no evaluation reaches the target.
    """
    for i, point in enumerate(curve):
        if point["val_loss"] <= target:
            prev = curve[i - 1] if i else point  # above the target, so above this point
            frac = 1.0 if i == 0 else \
                (prev["val_loss"] - target) / (prev["val_loss"] - point["val_loss"])
            out = {}
            for key in ("step", "wall_s", "energy_j"):
                a, b = prev.get(key), point.get(key)
                out[key] = None if a is None or b is None else a + frac * (b - a)
            return out
    return None


def ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference, None when either is missing or the reference is not positive."""
    if value is None or reference is None or not reference > 0:
        return None
    return value / reference


def widen(lrs: list[float], best: float, limit: float = 10.0) -> float | None:
    """The next lr when the best of `lrs` sits at an edge of them: one step past that edge (the
    ratio of the two lrs there); None when it is inside, the grid has one lr, or the next would
    pass `limit` (the trainer's largest lr)."""
    lrs = sorted(lrs)
    if len(lrs) < 2 or lrs[0] < best < lrs[-1]:
        return None
    nxt = lrs[0] ** 2 / lrs[1] if best == lrs[0] else lrs[-1] ** 2 / lrs[-2]
    return float(f"{nxt:.3g}") if 0 < nxt <= limit else None


def bracketed(lrs: list[float], best: float) -> bool:
    """The tuned lr lies strictly inside what ran."""
    lrs = sorted(lrs)
    return len(lrs) >= 3 and lrs[0] < best < lrs[-1]


def spread(values: list[float | None]) -> dict[str, Any]:
    """Median, min and max of the values that exist, with how many there are and how many
    are missing (a run that never reached the target)."""
    got = [v for v in values if v is not None and math.isfinite(v)]
    if not got:
        return {"n": 0, "missing": len(values), "median": None, "min": None, "max": None}
    return {"n": len(got), "missing": len(values) - len(got),
            "median": statistics.median(got), "min": min(got), "max": max(got)}


def efficiency(l_init: float, l_final: float, energy: float | None,
               adamw_energy: float | None) -> float | None:
    """The paper's energy-normalised loss reduction: (L_init - L_final) / (E / E_AdamW)."""
    r = ratio(energy, adamw_energy)
    return None if r is None or not r > 0 else (l_init - l_final) / r


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
    bar = progress(sizes.steps, f"{spec['label']} lr {_lr(spec['lr'])} [{spec['corpus']}, "
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
        "step_ms_median": 1e3 * statistics.median(step_s),
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


def arrangement_of(run: dict[str, Any]) -> str:
    """Where a run trained (runs saved before arrangements were named trained shared)."""
    return run.get("arrangement", SHARED)


def tuning(run: dict[str, Any]) -> bool:
    """A run of the tuning itself: the first seed, at the runtime's refresh interval."""
    return not run.get("seed") and run.get("interval") is None


def best_of(runs: list[dict[str, Any]], family: str,
            arrangement: str = SHARED) -> dict[str, Any] | None:
    """The tuned run of a family in an arrangement: the lowest final validation loss over its lr
    grid, on the first seed (the device-host arrangement trains the tuned lr only)."""
    found = [r for r in runs if r["family"] == family and arrangement_of(r) == arrangement
             and tuning(r) and math.isfinite(r["final_val_loss"])]
    return min(found, key=lambda r: r["final_val_loss"]) if found else None


def pick_sizes(opts: BenchOptions) -> Sizes:
    """The rung's sizes (--quick: the quick ones, whatever the rung), with --seeds applied."""
    if opts.rung not in RUNGS:
        raise ValueError(f"--rung: got {opts.rung!r}; allowed: {' | '.join(RUNGS)}")
    sizes = QUICK if opts.quick else RUNGS[opts.rung]
    return sizes if opts.seeds is None else replace(sizes, seeds=opts.seeds)


def planned_runs(sizes: Sizes, corpora: int, peers: int = 0) -> dict[str, int]:
    """How many runs a full pass trains, before widening (`least`) and with every grid widened
    `max_widen` times (`most`): for an estimate of its time from one run's."""
    per = 0
    grids = 0
    for family in sizes.configs:
        if family == "asteria_soap":
            per += 1
            continue
        grid = {"adamw": sizes.adamw_lrs, "muon": sizes.muon_lrs}.get(family,
                                                                       sizes.second_order_lrs)
        per += len(grid)
        grids += 1
    tuned = len(sizes.configs) + peers
    per += peers + tuned * (sizes.seeds - 1)
    soaps = len([f for f in ("soap", "asteria_soap") if f in sizes.configs])
    default = Policy().refresh_interval
    per += soaps * sizes.seeds * len([i for i in sizes.intervals if i != default])
    first = len(sizes.device_host) * sizes.seeds
    least = per * corpora + first
    return {"least": least, "most": least + grids * sizes.max_widen * corpora}


def run(opts: BenchOptions) -> SuiteResult:
    sizes = pick_sizes(opts)
    user_corpus = check_corpus(opts.corpus) if opts.corpus else None
    name = "optimizers" if sizes.rung == "default" else f"optimizers-{sizes.rung}"
    result = SuiteResult(name, TITLE, opts.quick, opts.command, config={
        "rung": sizes.rung, "muon_lrs": list(sizes.muon_lrs), "seeds": sizes.seeds,
        "intervals": list(sizes.intervals), "max_widen": sizes.max_widen,
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
        "peers": {name: _peer_label(name) for name in _peer_names(opts)},  # with versions
        "device": opts.device, "measured_code": resume.code_digest(name)})
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        corpora = write_corpora(sizes, user_corpus, tmp, result)
        kept = {run_key(r): r for r in resume.previous_runs(result, opts.out_dir)} \
            if opts.resume else {}
        for i, (key, path) in enumerate(corpora):
            corpus_runs = train_corpus(key, path, sizes, opts, tmp, result, kept,
                                       device_host=sizes.device_host if i == 0 else ())
            report_corpus(result, key, corpus_runs, opts.out_dir)
            result.save(opts.out_dir)
    resume.settle(result)
    headline(result)
    result.save(opts.out_dir)
    return result


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
                 device_host: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every configuration on one corpus, saving the suite's JSON after each: the lr grids
    (widened past an edge their best sits at), the other seeds of every tuned configuration, the
    refresh-interval axis; then the `device_host` families again in that arrangement, at their
    tuned lr, with every seed. A configuration `kept` holds (a resumed run's) is not trained
    again: the choices that follow from it come out as they did."""
    runs: list[dict[str, Any]] = []

    def one(family: str, lr: float, label: str, peer: str | None = None,
            arrangement: str = SHARED, seed: int = 0, interval: int | None = None,
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

    def tune(family: str, grid: tuple[float, ...], extra: tuple[str, ...] = ()) -> None:
        label = FAMILIES[family][0]
        for lr in grid:
            one(family, lr, label, extra=extra)
        for _ in range(sizes.max_widen):
            tried = [r["lr"] for r in runs if r["family"] == family and tuning(r)]
            best = best_of(runs, family)
            nxt = None if best is None else widen(tried, best["lr"])
            if nxt is None or nxt in tried:
                break
            one(family, nxt, label, extra=extra)

    def extra_of(family: str) -> tuple[str, ...]:
        adamw = best_of(runs, "adamw")
        if family == "muon" and adamw is not None:
            return ("--optim.adamw_lr", str(adamw["lr"]))
        return ()

    for family in sizes.configs:
        if family == "asteria_soap":
            continue  # after native SOAP's grid, at its tuned lr
        grid = {"adamw": sizes.adamw_lrs, "muon": sizes.muon_lrs}.get(family,
                                                                       sizes.second_order_lrs)
        tune(family, grid, extra_of(family))
    soap = best_of(runs, "soap")
    soap_lr = soap["lr"] if soap else sizes.second_order_lrs[-1]
    if "asteria_soap" in sizes.configs:
        one("asteria_soap", soap_lr, FAMILIES["asteria_soap"][0])
    for name in _peer_names(opts):
        one(f"peer:{name}", soap_lr, _peer_label(name), peer=name)
    tuned = [r for r in (best_of(runs, f) for f in dict.fromkeys(r["family"] for r in runs))
             if r is not None]
    for r in tuned:
        for seed in range(1, sizes.seeds):
            one(r["family"], r["lr"], r["label"], peer=r["peer"], seed=seed,
                extra=tuple(r["extra"]))
    default = Policy().refresh_interval
    for r in tuned:
        if r["family"] not in ("soap", "asteria_soap"):
            continue
        for interval in sizes.intervals:
            if interval == default:  # the tuned run and its seeds are this point
                continue
            for seed in range(sizes.seeds):
                one(r["family"], r["lr"], r["label"], seed=seed, interval=interval)
    if device_host:
        try:
            turns.arrangement_args(DEVICE_HOST)
        except ValueError as err:  # a machine with one CPU
            result.config["device_host_skipped"] = str(err)
            device_host = ()
    for family in device_host:
        r = best_of(runs, family)
        if r is not None:
            for seed in range(sizes.seeds):
                one(family, r["lr"], r["label"], arrangement=DEVICE_HOST, seed=seed,
                    extra=tuple(r["extra"]))
    return runs


def _lr(value: float) -> str:
    """An lr as the grids write it: 3e-3, 1.5e-2."""
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report_corpus(result: SuiteResult, key: str, runs: list[dict[str, Any]],
                  out_dir: Path) -> None:
    """The corpus's targets, ratios, efficiency, table and plot; its findings."""
    adamw = best_of(runs, "adamw")
    if adamw is None:
        return
    target = statistics.median(r["final_val_loss"] for r in seeds_of(runs, adamw))
    bases = {}  # per arrangement: tuned AdamW's median step, seconds and joules to the target
    for arrangement in turns.ARRANGEMENTS:
        reference = best_of(runs, "adamw", arrangement)
        if reference is not None:
            got = [reach(r["curve"], target) for r in seeds_of(runs, reference)]
            bases[arrangement] = {k: spread([g[k] if g else None for g in got])["median"]
                                  for k in ("step", "wall_s", "energy_j")}
    for r in runs:
        # Ratios against tuned AdamW in the same arrangement; the target is the shared one's.
        reference = best_of(runs, "adamw", arrangement_of(r)) or adamw
        base = bases.get(arrangement_of(r)) or bases[SHARED]
        tuned = best_of(runs, r["family"], arrangement_of(r))
        r["tuned"] = tuned is not None and r in seeds_of(runs, tuned)
        r["target_loss"] = target
        r["to_target"] = reach(r["curve"], target)
        got = r["to_target"] or {}
        r["steps_ratio"] = ratio(got.get("step"), base and base["step"])
        r["wall_ratio"] = ratio(got.get("wall_s"), base and base["wall_s"])
        r["energy_to_target_ratio"] = ratio(got.get("energy_j"), base and base["energy_j"])
        r["energy_ratio"] = ratio(r["energy_j"], reference["energy_j"])
        r["efficiency"] = efficiency(r["l_init"], r["final_val_loss"], r["energy_j"],
                                     reference["energy_j"])
    every = runs
    arranged = [r for r in runs if arrangement_of(r) != SHARED and tuning(r)]
    runs = [r for r in runs if arrangement_of(r) == SHARED and tuning(r)]
    source = adamw["energy_label"]
    desc = result.config["corpora"][key]["description"]
    table = result.table(
        f"Optimizers on the {desc} corpus: {adamw['params'] / 1e6:.2f}M parameters, "
        f"{adamw['steps']} steps",
        ["optimizer", "lr", "tuned", "final val loss", "steps to AdamW's loss",
         "steps vs AdamW", "wall-clock to target s", "wall-clock vs AdamW", "train wall-clock s",
         "energy to target J", "energy to target vs AdamW", "energy J", "efficiency"],
        note=f"Target: tuned AdamW's final validation loss {target:.4f} (lr {_lr(adamw['lr'])}, "
             f"median of its seeds). First seed only here; the seeds' medians follow. "
             "Steps and seconds to it: the first evaluation at or below it, interpolated "
             "linearly with the evaluation before; '-' means never reached. 'vs AdamW': this "
             "run's figure over tuned AdamW's (below 1: fewer). Wall-clock: training steps only, "
             f"in the shared arrangement ({turns.ARRANGEMENTS[SHARED]}). Energy: {source}. "
             "Efficiency: (L_init - L_final) / "
             "(E / E_AdamW) with E the whole run's energy (every run trains the same steps), "
             "in loss units (AdamW's own is its loss reduction).")
    for r in runs:
        got = r["to_target"] or {}
        table.add(r["label"], _lr(r["lr"]), "yes" if r["tuned"] else "",
                  f"{r['final_val_loss']:.4f}", _fmt(got.get("step"), ".0f"),
                  _fmt(r["steps_ratio"], ".2f"), _fmt(got.get("wall_s"), ".1f"),
                  _fmt(r["wall_ratio"], ".2f"), f"{r['wall_s']:.1f}",
                  _fmt(got.get("energy_j"), ".0f"), _fmt(r["energy_to_target_ratio"], ".2f"),
                  _fmt(r["energy_j"], ".0f"), _fmt(r["efficiency"], ".3f"))
    result.plots.append(plot_corpus(runs, key, desc, target, out_dir))
    report_seeds(result, key, every, target)
    report_intervals(result, key, every, target)
    report_grids(result, key, every)
    findings_corpus(result, key, desc, runs, adamw)
    if arranged:
        report_arrangements(result, key, desc, runs + arranged)


def seeds_of(runs: list[dict[str, Any]], tuned: dict[str, Any]) -> list[dict[str, Any]]:
    """Every seed of a tuned configuration: its family, arrangement, lr and interval."""
    return [r for r in runs if r["family"] == tuned["family"] and r["lr"] == tuned["lr"]
            and arrangement_of(r) == arrangement_of(tuned)
            and r.get("interval") == tuned.get("interval")]


def _summary(result: SuiteResult, key: str) -> dict[str, Any]:
    return result.config.setdefault("summary", {}).setdefault(key, {})


def seed_figures(group: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Medians and spreads over the seeds of one configuration."""
    got = [reach(r["curve"], target) for r in group]
    return {"seeds": len(group),
            "final_val_loss": spread([r["final_val_loss"] for r in group]),
            "steps_to_target": spread([g["step"] if g else None for g in got]),
            "wall_s_to_target": spread([g["wall_s"] if g else None for g in got]),
            "energy_j_to_target": spread([g["energy_j"] if g else None for g in got]),
            "step_ms_median": spread([r["step_ms_median"] for r in group])}


def _cell(figure: dict[str, Any], spec: str) -> str:
    if figure["median"] is None:
        return "-"
    text = f"{format(figure['median'], spec)} [{format(figure['min'], spec)}, " \
           f"{format(figure['max'], spec)}]"
    return text + (f" ({figure['missing']} never)" if figure["missing"] else "")


def report_seeds(result: SuiteResult, key: str, runs: list[dict[str, Any]],
                 target: float) -> None:
    """Every tuned configuration over its seeds: median [min, max]."""
    table = result.table(
        f"Tuned configurations over seeds, {key} corpus: median [min, max]",
        ["optimizer", "arrangement", "lr", "seeds", "final val loss", "steps to target",
         "wall-clock to target s", "energy to target J", "median step ms"],
        note=f"Target {target:.4f}: the median of tuned AdamW's final losses over its seeds. "
             "'never': seeds that do not reach it.")
    out = _summary(result, key).setdefault("tuned", {})
    for family in dict.fromkeys(r["family"] for r in runs):
        for arrangement in turns.ARRANGEMENTS:
            tuned = best_of(runs, family, arrangement)
            if tuned is None:
                continue
            fig = seed_figures(seeds_of(runs, tuned), target)
            out[f"{family}/{arrangement}"] = {"lr": tuned["lr"], **fig}
            table.add(tuned["label"], arrangement, _lr(tuned["lr"]), fig["seeds"],
                      _cell(fig["final_val_loss"], ".4f"), _cell(fig["steps_to_target"], ".0f"),
                      _cell(fig["wall_s_to_target"], ".1f"),
                      _cell(fig["energy_j_to_target"], ".0f"),
                      _cell(fig["step_ms_median"], ".0f"))


def report_intervals(result: SuiteResult, key: str, runs: list[dict[str, Any]],
                     target: float) -> None:
    """Native and Asteria-SOAP at their tuned lr against the refresh interval."""
    default = Policy().refresh_interval
    found = [r for r in runs if r.get("interval") is not None]
    if not found:
        return
    table = result.table(
        f"SOAP against the refresh interval, {key} corpus: median [min, max] over seeds",
        ["optimizer", "refresh interval", "lr", "seeds", "final val loss", "steps to target",
         "wall-clock to target s", "energy to target J", "median step ms"],
        note=f"At each one's tuned lr; interval {default} is the tuned run itself (the "
             f"runtime's default). Target {target:.4f} as above; shared arrangement.")
    out = _summary(result, key).setdefault("intervals", {})
    for family in ("soap", "asteria_soap"):
        tuned = best_of(runs, family)
        if tuned is None:
            continue
        intervals = sorted({r["interval"] for r in found if r["family"] == family} | {default})
        for interval in intervals:
            group = [r for r in runs if r["family"] == family and r["lr"] == tuned["lr"]
                     and arrangement_of(r) == SHARED
                     and (r.get("interval") or default) == interval]
            if not group:
                continue
            fig = seed_figures(group, target)
            out[f"{family}/{interval}"] = {"lr": tuned["lr"], "interval": interval, **fig}
            table.add(tuned["label"], interval, _lr(tuned["lr"]), fig["seeds"],
                      _cell(fig["final_val_loss"], ".4f"), _cell(fig["steps_to_target"], ".0f"),
                      _cell(fig["wall_s_to_target"], ".1f"),
                      _cell(fig["energy_j_to_target"], ".0f"),
                      _cell(fig["step_ms_median"], ".0f"))


def report_grids(result: SuiteResult, key: str, runs: list[dict[str, Any]]) -> None:
    """Each family's lr grid as it ran, its tuned lr, and whether that lies inside it."""
    table = result.table(f"Learning-rate grids, {key} corpus",
                         ["optimizer", "lrs run", "tuned lr", "bracketed"],
                         note="Bracketed: the tuned lr lies strictly inside the lrs run; a grid "
                              "whose best sat at an edge grew past it (at most max_widen "
                              "times), so 'no' flags a tuned lr that may not be the best.")
    out = _summary(result, key).setdefault("grids", {})
    for family in dict.fromkeys(r["family"] for r in runs):
        best = best_of(runs, family)
        if best is None:
            continue
        lrs = sorted({r["lr"] for r in runs if r["family"] == family and tuning(r)
                      and arrangement_of(r) == SHARED})
        inside = bracketed(lrs, best["lr"])
        out[family] = {"lrs": lrs, "tuned_lr": best["lr"], "bracketed": inside}
        table.add(best["label"], ", ".join(map(_lr, lrs)), _lr(best["lr"]),
                  "yes" if inside else "no")


def plot_corpus(runs: list[dict[str, Any]], key: str, desc: str, target: float,
                out_dir: Path) -> dict[str, str]:
    """One PNG, two panels: validation loss against step and against training wall-clock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_wall) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in runs:
        if not r["tuned"]:
            continue
        label = f"{r['label']} (lr {_lr(r['lr'])})"
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
        ax.set_ylim(top=min(max(p["val_loss"] for r in runs for p in r["curve"][1:]) + 0.2,
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
    return {"file": name, "caption": f"Validation loss against step and against training "
                                     f"wall-clock, each optimizer at its tuned lr, on the {desc} "
                                     "corpus; the dashed line is the target"}


def findings_corpus(result: SuiteResult, key: str, desc: str, runs: list[dict[str, Any]],
                    adamw: dict[str, Any]) -> None:
    base = reach(adamw["curve"], adamw["final_val_loss"])
    result.findings.append(
        f"On the {desc} corpus, tuned AdamW (lr {_lr(adamw['lr'])}) ends at validation loss "
        f"{adamw['final_val_loss']:.4f} after {adamw['steps']} steps (first reached at step "
        f"{base['step']:.0f}, {base['wall_s']:.0f} s of training).")
    for family in dict.fromkeys(r["family"] for r in runs):
        if family == "adamw":
            continue
        r = best_of(runs, family)
        if r is None:
            continue
        got = r["to_target"]
        if got is None:
            result.findings.append(
                f"On the {key} corpus, {r['label']} (lr {_lr(r['lr'])}) never reaches tuned "
                f"AdamW's final loss within {r['steps']} steps (it ends at "
                f"{r['final_val_loss']:.4f}).")
            continue
        steps_ratio, wall_ratio = r["steps_ratio"], r["wall_ratio"]
        fewer = f"{1 / steps_ratio:.2f}x fewer steps" if steps_ratio else "-"
        result.findings.append(
            f"On the {key} corpus, {r['label']} (lr {_lr(r['lr'])}) reaches tuned AdamW's final "
            f"loss at step {got['step']:.0f}: {steps_ratio:.2f}x AdamW's steps ({fewer}), and "
            f"{got['wall_s']:.0f} s of training: {_fmt(wall_ratio, '.2f')}x AdamW's wall-clock "
            f"(median step {r['step_ms_median']:.0f} ms against AdamW's "
            f"{adamw['step_ms_median']:.0f} ms), {_fmt(got['energy_j'], '.0f')} J: "
            f"{_fmt(r['energy_to_target_ratio'], '.2f')}x AdamW's energy to the target; it ends "
            f"at {r['final_val_loss']:.4f}, "
            f"energy-normalised efficiency {_fmt(r['efficiency'], '.3f')} against AdamW's "
            f"{_fmt(adamw['efficiency'], '.3f')} ({r['energy_label']}).")
    grid_findings(result, key, runs)
    native, ours = best_of(runs, "soap"), best_of(runs, "asteria_soap")
    if native and ours:
        reached = [f"step {x['to_target']['step']:.0f}" if x["to_target"] else "never"
                   for x in (native, ours)]
        cores = len(os.sched_getaffinity(0))
        shares = "shares the training's cores" if \
            ours["torch_threads"] + ours["policy"]["workers"] > cores else \
            "has a core of its own"
        result.findings.append(
            f"On the {key} corpus, Asteria-SOAP (refresh on {ours['policy']['workers']} host "
            f"worker {ours['policy']['worker_kind']}, swap delay "
            f"{ours['policy']['swap_delay']}) against native SOAP at the same lr "
            f"{_lr(ours['lr'])}: final loss {ours['final_val_loss']:.4f} vs "
            f"{native['final_val_loss']:.4f}, AdamW's loss reached: {reached[1]} "
            f"vs {reached[0]}, median step {ours['step_ms_median']:.0f} vs "
            f"{native['step_ms_median']:.0f} ms, training wall-clock {ours['wall_s']:.0f} vs "
            f"{native['wall_s']:.0f} s (shared arrangement: {ours['torch_threads']} training "
            f"threads on {cores} cores, the worker {shares}).")


def report_arrangements(result: SuiteResult, key: str, desc: str,
                        runs: list[dict[str, Any]]) -> None:
    """Wall-clock to the target of the same tuned configurations in each arrangement: where the
    refresh runs decides it, so a user sees which figure comes from which."""
    families = list(dict.fromkeys(r["family"] for r in runs if arrangement_of(r) != SHARED))
    table = result.table(
        f"Wall-clock to tuned AdamW's loss by arrangement, {desc} corpus",
        ["optimizer", "arrangement", "lr", "final val loss", "steps to AdamW's loss",
         "wall-clock to target s", "wall-clock vs AdamW", "median step ms",
         "train wall-clock s"],
        note="The same tuned configurations trained in each arrangement (asteria_bench/turns.py)"
             ": " + "; ".join(f"{name}: {text}" for name, text in turns.ARRANGEMENTS.items())
             + ". 'vs AdamW': over tuned AdamW's wall-clock to the target in the same "
             "arrangement.")
    pairs: dict[str, dict[str, dict[str, Any]]] = {}
    for family in families:
        for arrangement in turns.ARRANGEMENTS:
            r = best_of(runs, family, arrangement)
            if r is None:
                continue
            pairs.setdefault(arrangement, {})[family] = r
            got = r["to_target"] or {}
            table.add(r["label"], arrangement, _lr(r["lr"]), f"{r['final_val_loss']:.4f}",
                      _fmt(got.get("step"), ".0f"), _fmt(got.get("wall_s"), ".1f"),
                      _fmt(r["wall_ratio"], ".2f"), f"{r['step_ms_median']:.0f}",
                      f"{r['wall_s']:.1f}")
    said = []
    for arrangement, by_family in pairs.items():
        native, ours = by_family.get("soap"), by_family.get("asteria_soap")
        if not (native and ours):
            continue
        seconds = [x["to_target"]["wall_s"] if x["to_target"] else None for x in (ours, native)]
        reached = "never reached" if None in seconds else \
            f"{seconds[0]:.0f} s against {seconds[1]:.0f} s ({seconds[0] / seconds[1]:.2f}x)"
        said.append(f"{arrangement}: {reached}, median step {ours['step_ms_median']:.0f} "
                    f"against {native['step_ms_median']:.0f} ms")
    if said:
        result.findings.append(
            f"On the {key} corpus, Asteria-SOAP's wall-clock to tuned AdamW's loss against "
            f"native SOAP's, by arrangement: {'; '.join(said)}. On shared cores Asteria's "
            "worker takes CPU from training; in the device-host arrangement it refreshes on a "
            "core training does not use, as a GPU's host would, while native SOAP refreshes "
            "inline on the training core.")


def grid_findings(result: SuiteResult, key: str, runs: list[dict[str, Any]]) -> None:
    """Whether each tuned lr lies inside its grid, or at an edge (where a wider grid might win)."""
    for family in dict.fromkeys(r["family"] for r in runs):
        lrs = sorted(r["lr"] for r in runs if r["family"] == family)
        best = best_of(runs, family)
        if len(lrs) < 2 or best is None:
            continue
        where = "inside the grid, so bracketed" if lrs[0] < best["lr"] < lrs[-1] else \
            "at the grid's edge, so a wider grid might find a better one"
        result.findings.append(
            f"On the {key} corpus, {best['label']}'s tuned lr {_lr(best['lr'])} of "
            f"{{{', '.join(map(_lr, lrs))}}} is {where}.")


def headline(result: SuiteResult) -> None:
    """The README's figures: SOAP's and KL-Shampoo's steps-to-AdamW-loss ratio per corpus, and
    the honest comparison to the published anchors."""
    measured = []
    for key in result.config["corpora"]:
        if key == "user":
            continue
        corpus_runs = [r for r in result.runs if r["corpus"] == key]
        slug = key.replace("-", "_")
        for family, name in (("soap", "SOAP"), ("kl_shampoo", "KL-Shampoo")):
            r = best_of(corpus_runs, family)
            if r is None or "steps_ratio" not in r:
                continue
            where = "the default corpus" if key == "default" else f"the {key} corpus"
            if r["steps_ratio"] is None:
                result.quote(f"{family}_steps_ratio_{slug}", None,
                             f"{name} does not reach tuned AdamW's final loss within "
                             f"{r['steps']} steps on {where}")
                if family == "soap":
                    measured.append(f"more than {r['steps']} steps (never reached) on {where}")
            else:
                result.quote(f"{family}_steps_ratio_{slug}", round(r["steps_ratio"], 3),
                             f"{name} reaches tuned AdamW's final validation loss in "
                             "{value:.2f}x AdamW's steps on " + where)
                if family == "soap":
                    measured.append(f"{r['steps_ratio']:.2f}x AdamW's steps "
                                    f"({1 / r['steps_ratio']:.2f}x fewer) on {where}")
    params = next((r["params"] for r in result.runs), None)
    if measured and params:
        steps = result.runs[0]["steps"]
        tokens = steps * (result.runs[0]["tokens_per_step"] or 0)
        lrs = result.config["adamw_lrs"]
        tuning = f"AdamW at lr {_lr(lrs[0])} only (the grid skipped)" if len(lrs) == 1 else \
            f"AdamW tuned over lr {', '.join(map(_lr, lrs))}"
        result.findings.append(
            f"Against the published anchors ({ANCHORS['soap_paper']}; {ANCHORS['independent']}):"
            f" SOAP needs {' and '.join(measured)} here. The setting differs: a "
            f"{params / 1e6:.2f}M-parameter byte-level GPT trained for {steps} steps (about "
            f"{tokens / 1e6:.1f}M tokens, one seed, {tuning}) against 100M-660M-parameter models "
            "trained for billions of tokens. So short a run ends far from convergence, where a "
            "preconditioner's early lead weighs most, and a coarse lr grid may leave AdamW "
            "under-tuned; neither number predicts the other, and ours is not evidence for the "
            "published gain at scale.")
