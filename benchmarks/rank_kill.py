"""Kill one rank of a two-rank data-parallel run (SIGKILL, at random steps between checkpoints)
again and again, and check that every relaunch and every torchrun restart resumes, with the
losses after the resume equal to an unkilled run's from the step it resumed at.

    .venv/bin/python benchmarks/rank_kill.py --kills 10 --steps 100 --interval 10

Three runs of the built-in trainer under `torchrun --nproc-per-node 2` (gloo, a tiny SOAP
model): the unkilled one; one relaunched by this script after each kill (`--max-restarts 0`,
then the same command again, `train.resume = auto`); one restarted in place by torchrun
(`--max-restarts` as many as its kills). Half the kills go to each. Per kill the JSON records
the last step rank 0 recorded before the kill, the step the next attempt resumed from (its
"resumed ... at step" line), and whether every loss that attempt recorded equals the unkilled
run's at the same step, exactly; at the end, whether each killed run's whole record of losses
equals the unkilled one's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RESUMED = re.compile(r"resumed \S+ at step (\d+)")
HANG_GUARD_S = 600


def tiny(steps: int, interval: int) -> list[str]:
    return ["--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
            "--model.block_size", "32", "--data.batch_size", "4", "--train.steps", str(steps),
            "--train.eval_interval", str(steps), "--train.eval_batches", "3",
            "--train.threads", "1", "--train.checkpoint_interval", str(interval),
            "--optim.name", "soap", "--optim.lr", "3e-3", "--policy.refresh_interval", "5",
            "--policy.staleness_bound", "2", "--policy.workers", "1", "--telemetry.nvml",
            "false", "--telemetry.rapl", "false", "--no-progress", "--train.resume", "auto"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launch:
    """One torchrun of two ranks; its stdout read line by line as it comes."""

    def __init__(self, out: Path, args: list[str], restarts: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
             "--max-restarts", str(restarts), "--master-addr", "127.0.0.1", "--master-port",
             str(free_port()), "-m", "asteria_core.cli", "train", *args, "--train.out_dir",
             str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def resumed(self) -> list[int]:
        return [int(m.group(1)) for line in self.lines if (m := RESUMED.search(line))]

    def wait(self) -> int:
        code = self.proc.wait(timeout=HANG_GUARD_S)
        self._reader.join(timeout=10)
        return code


def records(out: Path) -> dict[int, float]:
    """Rank 0's step records: step -> loss (a line a kill cut short is skipped)."""
    found = list(out.glob("*/steps.jsonl"))
    losses: dict[int, float] = {}
    if not found:
        return losses
    for line in found[0].read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        losses[record["step"]] = record["loss"]
    return losses


def rank_pid(launcher: int, rank: int) -> int | None:
    """The process of `rank` among the launcher's descendants (the current attempt's)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if stat[0] != "Z":
                parents[int(entry.name)] = int(stat[1])
    below, frontier = set(), {launcher}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - below
        below |= frontier
    for pid in below:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and f"LOCAL_RANK={rank}".encode() in env and \
                _is_trainer(pid):
            return pid
    return None


def _is_trainer(pid: int) -> bool:
    try:
        return b"asteria_core.cli" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def kill_rank_1_at(launch: Launch, out: Path, step: int, after_resumes: int) -> tuple[int, dict]:
    """Once the attempt that follows `after_resumes` resumes has recorded `step`: SIGKILL
    rank 1. Returns the last step recorded then, and the records as they were."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        if launch.proc.poll() is not None:
            raise RuntimeError("the run ended before the kill:\n" + "".join(launch.lines[-30:]))
        if len(launch.resumed()) >= after_resumes:
            seen = records(out)
            if seen and max(seen) >= step:
                pid = rank_pid(launch.proc.pid, 1)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    return max(seen), seen
        time.sleep(0.005)
    raise RuntimeError("no kill within the hang guard")


def segment_matches(seen: dict[int, float], resumed: int, until: int | None,
                    straight: dict[int, float]) -> bool:
    steps = [s for s in seen if s > resumed and (until is None or s <= until)]
    return bool(steps) and all(seen[s] == straight[s] for s in steps)


def kill_steps(rng: random.Random, n: int, steps: int, interval: int) -> list[int]:
    """`n` increasing steps, none a checkpoint step, spread over the run."""
    between = [s for s in range(interval + 1, steps - 2) if s % interval]
    return sorted(rng.sample(between, n))


def run_relaunches(out: Path, args: list[str], targets: list[int],
                   straight: dict[int, float]) -> tuple[list[dict], bool]:
    """Kill, relaunch the same command, kill again...; the last launch runs to the end."""
    kills: list[dict] = []
    launch = Launch(out, args, restarts=0)
    for target in targets:
        killed, seen = kill_rank_1_at(launch, out, max(target, _floor(kills) + 1), 0)
        launch.wait()
        if kills:
            kills[-1]["losses_match"] = segment_matches(seen, kills[-1]["resumed_from"],
                                                        killed, straight)
        launch = Launch(out, args, restarts=0)
        _wait_for(lambda lc=launch: lc.resumed() or lc.proc.poll() is not None)
        resumed = launch.resumed()
        kills.append({"how": "relaunch", "killed_after_step": killed,
                      "resumed_from": resumed[0] if resumed else None})
    code = launch.wait()
    if kills:
        kills[-1]["losses_match"] = code == 0 and segment_matches(
            records(out), kills[-1]["resumed_from"] or 0, None, straight)
    return kills, code == 0


def run_restarts(out: Path, args: list[str], targets: list[int],
                 straight: dict[int, float]) -> tuple[list[dict], bool]:
    """One torchrun with `--max-restarts` len(targets): each kill is restarted in place."""
    kills: list[dict] = []
    launch = Launch(out, args, restarts=len(targets))
    for i, target in enumerate(targets):
        killed, seen = kill_rank_1_at(launch, out, max(target, _floor(kills) + 1), i)
        if kills:
            kills[-1]["losses_match"] = segment_matches(seen, kills[-1]["resumed_from"],
                                                        killed, straight)
        _wait_for(lambda n=i + 1: len(launch.resumed()) >= n or launch.proc.poll() is not None)
        resumed = launch.resumed()
        kills.append({"how": "torchrun restart", "killed_after_step": killed,
                      "resumed_from": resumed[i] if len(resumed) > i else None})
    code = launch.wait()
    if kills:
        kills[-1]["losses_match"] = code == 0 and segment_matches(
            records(out), kills[-1]["resumed_from"] or 0, None, straight)
    return kills, code == 0


def _floor(kills: list[dict]) -> int:
    """A kill must come after the step the run last resumed from."""
    return max((k["resumed_from"] or 0 for k in kills), default=0)


def _wait_for(done) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError("no resume within the hang guard")
        time.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10, choices=range(1, 41), metavar="1..40")
    parser.add_argument("--steps", type=int, default=100, choices=range(20, 2001),
                        metavar="20..2000")
    parser.add_argument("--interval", type=int, default=10, choices=range(2, 501),
                        metavar="2..500")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "rank_kill.json")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    train_args = tiny(args.steps, args.interval)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rank-kill-") as tmp:
        tmp = Path(tmp)
        if Launch(tmp / "straight", train_args, restarts=0).wait() != 0:
            raise SystemExit("the unkilled run failed")
        straight = records(tmp / "straight")
        by_relaunch = args.kills // 2
        kills, ends = [], {}
        for how, n, runner in (("relaunch", by_relaunch, run_relaunches),
                               ("restart", args.kills - by_relaunch, run_restarts)):
            if n == 0:
                continue
            targets = kill_steps(rng, n, args.steps, args.interval)
            got, finished = runner(tmp / how, train_args, targets, straight)
            kills += got
            ends[how] = {"finished": finished,
                         "all_losses_match": records(tmp / how) == straight}
    result = {
        "steps": args.steps, "checkpoint_interval": args.interval, "world": 2,
        "seed": args.seed, "kills": kills,
        "every_kill_resumed": all(k["resumed_from"] is not None for k in kills),
        "every_resume_matched": all(k.get("losses_match") for k in kills),
        "runs": ends, "seconds": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["every_kill_resumed"] and result["every_resume_matched"] and \
        all(e["finished"] and e["all_losses_match"] for e in ends.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
