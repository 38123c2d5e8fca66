"""All-in-memory optimizer state that cannot fit is refused before training.

A SOAP run whose state is planned for memory, next to the model's parameters and gradients,
beyond the process's memory limit (its memory cgroup's, else MemAvailable) used to start and be
killed by the cgroup at its first step. Now the trainer refuses it while it builds, with a
ConfigError naming the shortfall and what to set instead (exit code 2 from the CLI).

The end-to-end test runs the CLI inside a real cgroup v1 memory cgroup (root only).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from asteria_bench.suites.scale_memory import cgroup_missing, joiner, memory_cgroup
from asteria_core.machine import MemoryLimit, _cgroup_limit, memory_shortfall
from tests.components import missing

GiB, MiB = 1 << 30, 1 << 20
REPO = Path(__file__).parents[2]


def test_the_shortfall_is_named_with_the_limit_and_its_source():
    why = memory_shortfall(int(7.9 * GiB), int(8.1 * GiB), MemoryLimit(12 * GiB, "cgroup"))
    assert why is not None
    assert why.startswith("optimizer state needs 7.9 GiB in memory, parameters and gradients "
                          "8.1 GiB, the memory limit is 12.0 GiB (cgroup): 4.0 GiB short; ")
    assert "--policy.host_budget_bytes" in why and "--policy.disk_dir" in why


def test_state_that_fits_is_not_refused():
    assert memory_shortfall(4 * GiB, 8 * GiB, MemoryLimit(12 * GiB, "cgroup")) is None
    assert memory_shortfall(300 * MiB, 100 * MiB, MemoryLimit(300 * MiB, "MemAvailable")) == (
        "optimizer state needs 300 MiB in memory, parameters and gradients 100 MiB, the memory "
        "limit is 300 MiB (MemAvailable): 100 MiB short; set a host budget and a disk tier "
        "(--policy.offload_mode disk --policy.device_budget_bytes N --policy.host_budget_bytes "
        "N --policy.disk_dir DIR; on a CPU the device tier is host memory too)")


def test_the_limit_is_the_own_cgroups_or_a_lower_one_above_it(tmp_path: Path):
    own = tmp_path / "memory" / "jobs" / "job1"
    own.mkdir(parents=True)
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "memory" / "jobs" / "memory.limit_in_bytes").write_text(f"{3 * GiB}\n")
    (own / "memory.limit_in_bytes").write_text(f"{5 * GiB}\n")
    v1 = "5:cpu:/\n4:memory:/jobs/job1\n0::/\n"
    assert _cgroup_limit(v1, tmp_path) == 3 * GiB  # the parent's limit binds the job
    (tmp_path / "memory" / "jobs" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert _cgroup_limit(v1, tmp_path) == 5 * GiB
    assert _cgroup_limit("4:memory:/\n", tmp_path) is None  # "no limit" is a huge number

    unified = tmp_path / "v2"
    (unified / "user" / "run").mkdir(parents=True)
    (unified / "memory.max").write_text("max\n")
    (unified / "user" / "run" / "memory.max").write_text(f"{2 * GiB}\n")
    assert _cgroup_limit("0::/user/run\n", unified) == 2 * GiB
    assert _cgroup_limit("0::/user\n", unified) is None


# ------------------------------------------------------------------ end to end, in a cgroup
MODEL = ["--model.n_layer", "4", "--model.n_embd", "768", "--model.block_size", "32",
         "--data.batch_size", "2", "--optim.name", "soap", "--train.device", "cpu",
         "--train.eval_interval", "1000", "--train.eval_batches", "1", "--policy.workers", "0"]
"""28.5M parameters: SOAP state 575 MiB planned in memory, parameters and gradients 218 MiB,
and 556 MiB of refresh work in flight (the first round's results, basis, rotation and
transport of every block, wait d steps for their swap); Python, torch and the built model take
~430 MB before step 1."""
LIMIT = 900 * MiB


@pytest.fixture
def cgroup():
    why = cgroup_missing()
    if why is not None:
        missing(why)
    with memory_cgroup(LIMIT, "asteria-test") as folder:
        yield folder


def _train_in(folder: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "asteria_core.cli", "train", *MODEL,
                             "--train.out_dir", str(out), *extra], cwd=REPO,
                            preexec_fn=joiner(folder), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_all_in_memory_soap_is_refused_in_a_cgroup_before_it_trains(cgroup, tmp_path):
    """Refused while it builds, exit 2, the shortfall named; nothing written. That the same run
    with tiered state then trains under such a cap is tests/bench/test_scale_memory.py (the
    scale-memory suite's quick run: 10 steps under an 800 MiB cgroup, killed there before the
    results in flight were planned)."""
    run = _train_in(cgroup, tmp_path / "runs", "--train.steps", "2")
    out, err = run.communicate(timeout=600)
    assert run.returncode == 2, (run.returncode, err[-2000:])
    assert "config error: optimizer state needs 1.1 GiB in memory (of which 556 MiB refresh " \
           "work in flight), parameters and gradients 218 MiB, the memory limit is 900 MiB " \
           "(cgroup): 449 MiB short" in err, err[-2000:]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.pt"))


def test_the_machines_memory_is_its_own_cgroups_limit(cgroup):
    """MACHINE.memory_bytes (the bound on what a config may ask for) reads the limit of the
    cgroup the process is in, not the root's (which has none)."""
    probe = subprocess.run([sys.executable, "-c", "from asteria_core.machine import MACHINE, "
                            "memory_limit; print(MACHINE.memory_bytes, memory_limit().bytes)"],
                           cwd=REPO, preexec_fn=joiner(cgroup), capture_output=True, text=True,
                           timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.split() == [str(LIMIT), str(LIMIT)]
