"""`asteria train`: one run from a resolved config, as the command line shows it.

It builds the `Trainer`, says what it trains (rank 0's lines in a data-parallel run), starts
what the run serves while it trains (`--metrics-port`; the `asteria` command's `--control-port`
adds the control plane, backend/commands.py), trains, and ends in one line and an exit status
for each way a run can end: done, stopped by a signal (the run checkpoints at its next step),
refused by its config (2), or failed to start or to go on (1), naming the rank where it
happened. The command table and the config it resolves are asteria_core/cli.py's.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from asteria_core.train.config import RESUME_AUTO, ConfigError, RunConfig


def _stop_on_signals(stop: Callable[[], object]) -> tuple[list[int], dict]:
    """SIGINT and SIGTERM (what orchestrators send first) call `stop`: the run stops at its next
    step boundary, which checkpoints; a second one ends the process at once (the last checkpoint
    stays). Installed explicitly: a run started in the background from a script inherits an
    ignored SIGINT. Returns the signals received and the handlers to restore."""
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        if received:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        received.append(signum)
        stop()

    return received, {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT,
                                                                     signal.SIGTERM)}


def _last_checkpoint(trainer: Any) -> str:
    path = trainer.checkpoint_path
    return f"the last checkpoint is {path}" if path.is_file() else "no checkpoint was written"


Serve = Callable[[Any], Callable[[], None] | None]
"""What a run serves while it trains: called with the built trainer, returns what stops it
(called after the trainer is closed); OSError or RuntimeError, saying what it could not serve,
when it can not."""


def serve_metrics(trainer: Any) -> Callable[[], None] | None:
    """`--metrics-port`: Prometheus /metrics of this process while it trains; in a
    data-parallel run rank r serves its own on PORT + r (`serve_rank_metrics`)."""
    config = trainer.config.telemetry
    host, port = config.metrics_host, config.metrics_port
    if not port or trainer.telemetry is None:
        return None
    try:
        if trainer.ranks.parallel:
            from asteria_core.distributed import serve_rank_metrics

            port = serve_rank_metrics(trainer.telemetry, trainer.ranks.rank, host=host,
                                      base_port=port)
        else:
            port = trainer.telemetry.serve(host, port)
    except OSError as err:
        where = port + trainer.ranks.rank
        raise OSError(f"cannot serve metrics on {host}:{where}: {err}") from err
    if trainer.ranks.main:  # for every rank: the others print nothing routine
        others = f"; rank r > 0 on port {port} + r" if trainer.ranks.parallel else ""
        print(f"asteria: metrics at http://{host}:{port}/metrics{others}", flush=True)
    return None


def _who(ranks: Any) -> str:
    """The rank a line of a data-parallel run is about ("" in a single-process run)."""
    return f"rank {ranks.rank}: " if ranks.parallel else ""


def train_command(config: RunConfig, args: argparse.Namespace,
                  serve: Serve = serve_metrics) -> int:
    """`asteria train`; `serve` starts what the run serves (the `asteria` command's
    `--control-port` adds the control plane on rank 0).

    The signals are ours from before the run is built until after it is closed: a signal
    while it starts stops it before its first step, and a second one while it closes ends the
    process at once (Python's own SIGINT handler would raise KeyboardInterrupt wherever close
    happened to be, a join or a lock)."""
    run: list[Any] = []  # the trainer, once built
    received, previous = _stop_on_signals(lambda: run and run[0].request_stop())
    try:
        return _train(config, args, run, received, serve)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _train(config: RunConfig, args: argparse.Namespace, run: list[Any],
           received: list[int], serve: Serve) -> int:
    from asteria_core.refresh import RefreshFailed
    from asteria_core.tiers import TierFileError
    from asteria_core.train import parallel
    from asteria_core.train.checkpoint import NonFiniteState
    from asteria_core.train.run_lock import RunFolderBusy
    from asteria_core.train.trainer import Trainer

    try:
        ranks = parallel.job_ranks()
        parallel.check(config, ranks)  # before any collective: every rank refuses alike
    except ConfigError as err:
        print(f"asteria: config error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"asteria: cannot start the run: {err}", file=sys.stderr)
        return 1
    who = _who(ranks)
    try:
        trainer = Trainer(config)
    except ConfigError as err:  # a run this machine cannot hold (its state, say)
        print(f"asteria: {who}config error: {err}", file=sys.stderr)
        return 2
    except (OSError, ValueError, TierFileError, RunFolderBusy) as err:  # unreadable,
        # unwritable, too full, or another process trains in its folder
        print(f"asteria: {who}cannot start the run: {err}", file=sys.stderr)
        return 1
    run.append(trainer)
    if received:  # a signal while the run was built
        trainer.request_stop()
    try:
        stop_serving = serve(trainer)
    except (OSError, RuntimeError) as err:
        trainer.close()
        print(f"asteria: {who}{err}", file=sys.stderr)
        return 1
    n = trainer.model_params
    if ranks.main:
        print(f"asteria: run {trainer.run_id}: {n / 1e6:.2f}M parameters, optimizer "
              f"{config.optim.name}, {config.train.steps} steps on {trainer.device}; "
              f"writing {trainer.run_dir}", flush=True)
        if trainer.runtime.telemetry is not None:
            print(f"asteria: {trainer.runtime.telemetry.energy_sources()}", flush=True)
        if ranks.parallel:
            print(f"asteria: data-parallel on {ranks.world} ranks ({ranks.local_world} per "
                  f"node), global batch {ranks.world} x {config.data.batch_size}; rank r > 0 "
                  f"checkpoints in {trainer.run_dir / 'rank<r>'}", flush=True)
        resumed = trainer.config.train.resume
        if resumed:
            print(f"asteria: resumed {resumed} at step {trainer.step}" if resumed != RESUME_AUTO
                  else f"asteria: train.resume = auto: no checkpoint in {config.train.out_dir}; "
                  "a fresh run", flush=True)
    failed = None
    try:
        result = trainer.train(progress=not args.no_progress)
    except (RefreshFailed, NonFiniteState) as err:  # its state is not one to keep
        print(f"asteria: {who}run stopped at step {trainer.step}: {err}; "
              f"{_last_checkpoint(trainer)}", file=sys.stderr)
        return 1
    except (OSError, TierFileError) as err:  # a full disk, a folder it may not write
        failed = err
        print(f"asteria: {who}run stopped at step {trainer.step}: {err}; "
              f"{_last_checkpoint(trainer)}", file=sys.stderr)
        return 1
    finally:
        try:
            trainer.close()
        except (OSError, TierFileError):
            if failed is None:
                raise  # else: the same failure, already reported in one line
        finally:
            if stop_serving is not None:
                stop_serving()
    if received:
        name = signal.Signals(received[0]).name
        print(f"\nasteria: {who}stopped by {name} at step {trainer.step}; checkpoint saved in "
              f"{trainer.rank_dir}", file=sys.stderr)
        return 128 + received[0]
    if not ranks.main:
        return 0
    if result.stopped_early and ranks.parallel:
        print(f"asteria: stopped at step {result.step} on every rank; checkpoints saved in "
              f"{trainer.run_dir}", file=sys.stderr)
    if result.eval_losses:
        last_step = max(result.eval_losses)
        print(f"asteria: done at step {result.step}; validation loss "
              f"{result.eval_losses[last_step]:.4f} (step {last_step}); checkpoint "
              f"{trainer.checkpoint_path}")
    return 0
