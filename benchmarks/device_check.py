"""The device check's parts after the install (benchmarks/gpu_check.sh runs this): the machine,
the gpu-marked tests, then the suites, each part under its own time limit, stopping at the first
failure. Every part's outcome goes to check.json as soon as it ends (a suite's own JSON is
written by the suite as it finishes), and a summary table is printed at the end, also after a
failure.

    python benchmarks/device_check.py --device cuda --out DIR          # the full check
    python benchmarks/device_check.py --device cpu --size smoke --out DIR  # CI's smoke

`--size smoke` shrinks every suite to a few steps of a tiny model (the sizes are set here, on
the suites' own size constants), so CI runs the same parts, in the same order, in about a
minute on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITES = ("critical-path", "staleness", "tiers")


@dataclass(frozen=True)
class Part:
    name: str
    limit_s: int
    """Its time limit; the full check's estimates are in gpu_check.sh's header."""


PARTS = {  # (full, smoke) limits in seconds
    "machine": (60, 60),
    "gpu-tests": (150, 120),
    "critical-path": (150, 180),
    "staleness": (120, 180),
    "tiers": (90, 180),
}


@dataclass
class Outcome:
    part: str
    status: str  # passed | failed | timed out | none here (gpu tests on a CPU)
    seconds: float
    detail: str = ""
    files: list[str] = field(default_factory=list)


def tiny_sizes() -> None:
    """The smoke size, set on the suites' own constants (in the suite's own process)."""
    from asteria_bench.suites import critical_path, staleness, tiers

    tiny = ["--model.n_embd", "32", "--model.n_head", "2", "--model.n_layer", "1",
            "--data.batch_size", "4", "--policy.refresh_interval", "10"]
    critical_path.CPU_MODEL = staleness.CPU_MODEL = tiny
    critical_path.STEPS = {"quick": 20, "full": 20}  # two refresh intervals, one timed
    staleness.STEPS = {"quick": 20, "full": 20}
    staleness.BOUNDS = {"quick": (1, 5), "full": (1, 5)}
    tiers.QUICK = tiers.Sizes(layers=12, rows=1024, cols=256, block=32, batch=4, steps=2,
                              threads=1, refresh=2, repeats=1, dd_mib=8)


def run_suite(name: str, device: str, size: str, out: Path) -> int:
    """One suite in this process (the part's subprocess), at its quick size or the smoke."""
    import argparse as ap

    from asteria_bench.cli import add_arguments, run

    if size == "smoke":
        tiny_sizes()
        if name == "tiers":
            from asteria_bench.suites import tiers

            (out / "tiers-disk").mkdir(exist_ok=True)
            tiers.DISK_DIR = str(out / "tiers-disk")
    parser = ap.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([name, "--quick", "--device", device, "--no-peers",
                              "--no-progress", "--out", str(out),
                              "--report", str(out / "benchmarks.md"), "--readme", os.devnull])
    return run(args)


def gpu_test_files() -> list[str]:
    """The test files that hold gpu-marked tests, by a plain rule: the `test_*.py` files under
    tests/ whose text names the marker (`pytest.mark.gpu`, on a test or as a module's
    `pytestmark`). tests/bench/test_device_check.py checks that the rule finds exactly the
    files of the tests tests/conftest.py deselects as gpu-marked."""
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                  if "mark.gpu" in path.read_text())


def part_command(part: str, device: str, size: str, out: Path) -> list[str]:
    py = sys.executable
    if part == "machine":
        return [py, __file__, "--machine", "--device", device, "--out", str(out)]
    if part == "gpu-tests":
        # One process (-n 0): the gpu tests share the one device. Only the files that hold
        # them are collected: the whole suite's collection costs more than they take to run.
        return [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs",
                "-n", "0", "--junitxml", str(out / "gpu-tests.xml"), *gpu_test_files()]
    return [py, __file__, "--suite", part, "--device", device, "--size", size, "--out",
            str(out)]


def machine(device: str, out: Path) -> int:
    """What the check runs on, and which energy meters measure there, to machine.json."""
    import torch

    from asteria_core.telemetry.config import TelemetryConfig
    from asteria_core.telemetry.core import Telemetry

    info = {"python": sys.version.split()[0], "torch": torch.__version__,
            "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
            "cpus": os.cpu_count(), "device": device}
    if device == "cuda":
        if not torch.cuda.is_available():
            print("device check: --device cuda: torch sees no CUDA device", file=sys.stderr)
            return 1
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_bytes=props.total_memory)
    telemetry = Telemetry(TelemetryConfig(energy_poll_seconds=0.0, model_cpu_watts=15.0))
    telemetry.set_device(torch.device(device, 0) if device == "cuda" else torch.device("cpu"))
    info["energy"] = telemetry.energy_sources()
    telemetry.close()
    (out / "machine.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))
    return 0


def run_part(part: str, device: str, size: str, out: Path) -> Outcome:
    limit = PARTS[part][size == "smoke"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    log = out / f"{part}.log"
    with log.open("w") as f:
        try:
            rc = subprocess.run(part_command(part, device, size, out), cwd=ROOT, env=env,
                                stdout=f, stderr=subprocess.STDOUT, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = None
    seconds = round(time.perf_counter() - t0, 1)
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    if rc is None:
        return Outcome(part, "timed out", seconds, f"over {limit} s", [log.name])
    if part == "gpu-tests" and rc == 5 and device == "cpu":
        return Outcome(part, "none here", seconds, "no CUDA device: gpu tests deselected",
                       [log.name])
    files = [log.name] + ([f"{part}.json"] if part in SUITES else [])
    if rc != 0:
        return Outcome(part, "failed", seconds, tail[0][:160], files)
    if part == "machine":
        detail = json.loads((out / "machine.json").read_text())["energy"]
    elif part == "gpu-tests":
        detail = tail[0].strip("= ")
    else:
        detail = f"{part}.json"
    return Outcome(part, "passed", seconds, detail[:160], files)


def table(outcomes: list[Outcome]) -> str:
    rows = ["| part | status | seconds | detail |", "|---|---|---:|---|"]
    rows += [f"| {o.part} | {o.status} | {o.seconds:.0f} | {o.detail} |" for o in outcomes]
    return "\n".join(rows)


def check(device: str, size: str, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    ok = True
    for part in PARTS:
        print(f"device check: {part} (limit {PARTS[part][size == 'smoke']} s) ...", flush=True)
        outcome = run_part(part, device, size, out)
        outcomes.append(outcome)
        (out / "check.json").write_text(json.dumps(
            {"device": device, "size": size, "parts": [asdict(o) for o in outcomes]},
            indent=2) + "\n")
        print(f"device check: {part}: {outcome.status} in {outcome.seconds:.0f} s", flush=True)
        if outcome.status in ("failed", "timed out"):
            ok = False
            print(f"device check: stopped at {part}; its log: {out / (part + '.log')}",
                  file=sys.stderr)
            break
    summary = table(outcomes)
    (out / "summary.md").write_text(summary + "\n")
    print(summary)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", choices=("full", "smoke"), default="full")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--machine", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--suite", choices=SUITES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.machine:
        return machine(args.device, args.out)
    if args.suite:
        return run_suite(args.suite, args.device, args.size, args.out)
    return check(args.device, args.size, args.out)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
