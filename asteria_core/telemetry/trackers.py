"""Step records into the experiment trackers users already watch: TensorBoard, MLflow, W&B.

A tracker is a record listener (`tracker(record)`, then `close()`), opened by name from
`telemetry.trackers` ("tensorboard,mlflow"). Each logs a record's numeric figures as scalars at
the record's step, under the record's own names, sections joined by "/" (`loss`, `step_seconds`,
`refresh/staleness_max`, `energy/joules/rapl`): the names docs/metrics.md lists. Everything is
written under one folder, the run's `trackers/` unless `telemetry.trackers_dir` names another:
- tensorboard: event files (`torch.utils.tensorboard`), read by `tensorboard --logdir`;
- mlflow: the tracking server in MLFLOW_TRACKING_URI where set, else a local store,
  `sqlite:///<folder>/mlflow.db` (MLflow's own local store: its plain-file store refuses new
  runs unless told to), read by `mlflow ui --backend-store-uri` with that URI;
- wandb: offline unless WANDB_MODE says otherwise, under `<folder>/wandb` (`wandb sync` uploads).
Each library is imported only when its tracker is opened; a missing one is a ConfigError that
names the package to install.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from asteria_core.telemetry.records import StepRecord
from asteria_core.validation import ConfigError

TRACKERS = ("tensorboard", "mlflow", "wandb")
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow-skinny sqlalchemy alembic",
            "wandb": "wandb"}
"""What `pip install` needs for each tracker (MLflow's local store needs SQLAlchemy)."""
MAX_TRACKERS = len(TRACKERS)


class Tracker(Protocol):
    def __call__(self, record: StepRecord) -> None: ...

    def close(self) -> None: ...


def tracker_names(spec: str) -> tuple[str, ...]:
    """The names in "tensorboard, mlflow" (empty: none); ConfigError on an unknown one."""
    names = tuple(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"telemetry.trackers: got {name!r}; allowed: a comma-separated "
                              f"list of {' | '.join(TRACKERS)} (or empty for none)")
    return names


def scalars(record: StepRecord) -> dict[str, float]:
    """The record's numeric figures, finite ones only, by their "/"-joined names (the step
    and the time are the axes every tracker logs against, not figures)."""
    figures = record.to_dict()
    del figures["step"], figures["time"]
    return dict(_leaves(figures, ""))


def _leaves(value: Any, name: str) -> Iterator[tuple[str, float]]:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            yield from _leaves(inner, f"{name}/{key}" if name else str(key))
    elif isinstance(value, int | float) and not isinstance(value, bool) and \
            math.isfinite(value):
        yield name, float(value)


class TensorBoardTracker:
    def __init__(self, folder: Path, run_name: str) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
        self.log_dir = folder / "tensorboard" / run_name
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def __call__(self, record: StepRecord) -> None:
        for name, value in scalars(record).items():
            self._writer.add_scalar(name, value, global_step=record.step,
                                    walltime=record.time)

    def close(self) -> None:
        self._writer.close()


class MLflowTracker:
    def __init__(self, folder: Path, run_name: str) -> None:
        from mlflow.tracking import MlflowClient
        uri = os.environ.get("MLFLOW_TRACKING_URI") or \
            f"sqlite:///{(folder / 'mlflow.db').resolve()}"
        folder.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name("asteria")
        experiment_id = experiment.experiment_id if experiment is not None else \
            self._client.create_experiment("asteria")
        self.run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id

    def __call__(self, record: StepRecord) -> None:
        from mlflow.entities import Metric
        stamp = int(record.time * 1000)
        # MLflow keys allow "/" but not every other character: the record's names are safe.
        metrics = [Metric(name, value, stamp, record.step)
                   for name, value in scalars(record).items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


class WandbTracker:
    def __init__(self, folder: Path, run_name: str) -> None:
        import wandb
        folder.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project="asteria", name=run_name, dir=str(folder),
                               # WANDB_MODE as the user set it: wandb checks it against
                               # the modes its annotation lists.
                               mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
                               reinit="create_new")

    def __call__(self, record: StepRecord) -> None:
        self._run.log(scalars(record), step=record.step)

    def close(self) -> None:
        self._run.finish()


_OPENERS: dict[str, Callable[[Path, str], Tracker]] = {
    "tensorboard": TensorBoardTracker, "mlflow": MLflowTracker, "wandb": WandbTracker}


def open_trackers(spec: str, folder: Path, run_name: str) -> list[Tracker]:
    """The trackers `spec` names, each writing under `folder`; ConfigError naming the package
    to install when one is missing (those opened before it are closed again)."""
    opened: list[Tracker] = []
    for name in tracker_names(spec):
        try:
            opened.append(_OPENERS[name](folder, run_name))
        except ImportError as err:
            for tracker in opened:
                tracker.close()
            raise ConfigError(f"telemetry.trackers: {name} needs its package: "
                              f"pip install {PACKAGES[name]} ({err})") from err
    return opened
