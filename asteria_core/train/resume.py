"""Which checkpoint a run resumes: the newest step whose checkpoint passes its checksum on
every rank.

Each rank keeps two checkpoints (the newest and the one before, `checkpoint.previous_path`).
Every rank saves at the same steps, and no rank can get a save ahead of another by more than
one (the next save needs the steps between, which need every rank), so when a rank dies while
the others save, the step before is still on every rank. Resolving to the newest step all
ranks hold, rather than refusing on a mismatch, is what lets a killed rank's job resume; a step
found on some ranks only, or a damaged file, is named in a warning and passed over.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from asteria_core.torchrun import Ranks
from asteria_core.train import checkpoint as ckpt
from asteria_core.train.parallel import rank_checkpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Choice:
    path: Path  # this rank's checkpoint file to load (its newest, once `settle_on` ran)
    step: int
    passed_over: list[str]  # what was not used, and why (empty: the newest, as written)


def choose(run_path: Path, ranks: Ranks) -> Choice:
    """This rank's checkpoint to resume beside rank 0's `run_path` (a collective in a
    data-parallel run: every rank calls it). ValueError naming what each rank holds when no
    step is good on every rank."""
    path = rank_checkpoint(Path(run_path), ranks)
    good, why = ckpt.good_checkpoints(path)
    held = [(sorted(good), why)]
    if ranks.parallel:
        gathered: list[Any] = [None] * ranks.world  # every rank's (steps, why), filled in
        dist.all_gather_object(gathered, (sorted(good), why))
        held = gathered
    common = set.intersection(*(set(steps) for steps, _ in held))
    if not common:
        raise ValueError(_refusal(run_path, path, held, ranks))
    step = max(common)
    passed_over = [w for _, whys in held for w in whys]
    newest = max(s for steps, _ in held for s in steps)
    if newest > step:
        passed_over.append(f"step {newest} is not on every rank (a rank stopped before or "
                           f"while saving it); resuming step {step}, the newest every rank has")
    for line in passed_over if ranks.main else why:
        log.warning("train.resume: %s", line)
    ckpt.settle_on(path, good[step])
    return Choice(path=path, step=step, passed_over=passed_over)


def _refusal(run_path: Path, path: Path, held: list, ranks: Ranks) -> str:
    lines = []
    for rank, (steps, whys) in enumerate(held):
        who = f"rank {rank}: " if ranks.parallel else ""
        has = f"good checkpoints of steps {', '.join(map(str, steps))}" if steps else \
            "no good checkpoint"
        lines.append(who + has + (f" ({'; '.join(whys)})" if whys else ""))
    if not any(steps for steps, _ in held) and not any(whys for _, whys in held):
        return (f"train.resume: {ranks.describe()} needs its checkpoint {path}, which does not "
                "exist; allowed: the run folder of a run launched the same way")
    if any(whys for _, whys in held):
        todo = ("restore the damaged file from a copy, or start the run afresh (train.resume "
                "empty, or another out_dir with auto)")
    else:
        todo = "allowed: checkpoints of runs launched the same way, with a step every rank has"
    if not ranks.parallel:
        return f"train.resume: {run_path} can not be resumed: {lines[0]}; {todo}"
    return (f"train.resume: no step of {run_path} has a good checkpoint on every rank: "
            f"{'; '.join(lines)}; {todo}")
