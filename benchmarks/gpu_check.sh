#!/usr/bin/env bash
# The device check: from a clean checkout, unattended, on one CUDA device. It installs what it
# needs, then runs its parts in order, each under a time limit, and stops at the first failure:
# the machine (GPU, torch, which energy meters measure), the gpu-marked tests, and the suites
# critical-path, staleness and tiers at their quick sizes (the ~100M-parameter GPT, bf16
# autocast, on the device). Each part's outcome goes to check.json as it ends, each suite's JSON
# as it finishes, and a summary table (summary.md, and on stdout) at the end.
#
#   bash benchmarks/gpu_check.sh                       # into $OUT, or docs/benchmarks-gpu
#   bash benchmarks/gpu_check.sh --offline             # no package index: the machine's own
#                                                      # packages (torch, pytest, ...) are used
#   bash benchmarks/gpu_check.sh --device cpu --size smoke --offline   # CI's smoke, on a CPU
#
# The install: a venv (in a temporary folder; CHECK_VENV names another) that also sees the packages of the python3 that runs this
# (so a GPU machine's own CUDA torch is used, never replaced by a download), then
# `pip install -e ".[dev]"` (pytest-xdist included: the pytest settings need it); --offline
# installs the project alone (--no-deps) and checks that what the parts import is there.
#
# Expected time of the full check on one H200 with 16 cores (estimates: the check has not yet
# run on a GPU; each part's limit, in device_check.py, is about twice its estimate except where
# the 8 minutes allow less):
#   install (pip, packages mostly present)   ~ 60 s   (--offline: ~ 10 s)
#   machine                                  ~ 10 s
#   gpu-tests (pytest -m gpu, -n 0)          ~ 35 s   (only the files that hold them, ~10 CUDA tests)
#   critical-path (5 configs x 30 steps)     ~ 90 s
#   staleness (3 bounds x 30 steps)          ~ 60 s
#   tiers (3 budgets, quick stack, dd)       ~ 60 s
#   total                                    ~ 5.4 min, under the 8-minute budget
set -euo pipefail

device=cuda
size=full
offline=0
out="${OUT:-docs/benchmarks-gpu}"
python=python3
while (($#)); do
    case "$1" in
        --device) device="$2"; shift 2 ;;
        --size) size="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --offline) offline=1; shift ;;
        --python) python="$2"; shift 2 ;;
        *) echo "gpu_check.sh: unknown argument $1; allowed: --device cuda|cpu, --size full|smoke, --out DIR, --offline, --python PY" >&2; exit 2 ;;
    esac
done
case "$device" in cuda|cpu) ;; *) echo "gpu_check.sh: --device: got $device; allowed: cuda | cpu" >&2; exit 2 ;; esac
case "$size" in full|smoke) ;; *) echo "gpu_check.sh: --size: got $size; allowed: full | smoke" >&2; exit 2 ;; esac

cd "$(dirname "$0")/.."
mkdir -p "$out"
out="$(cd "$out" && pwd)"
if [[ -n "${CHECK_VENV:-}" ]]; then
    venv="$CHECK_VENV"
else
    scratch="$(mktemp -d)"  # outside the checkout; removed at exit
    trap 'rm -rf "$scratch"' EXIT
    venv="$scratch/venv"
fi
t0=$SECONDS

echo "device check: install into $venv" >&2
"$python" -m venv --without-pip "$venv"  # pip (and setuptools) are the machine's
parent_site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
venv_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$parent_site" > "$venv_site/_check_parent.pth"  # the machine's packages, torch first
if ((offline)); then
    pip=("$python" -m pip --python "$venv/bin/python")
    "${pip[@]}" install -q --no-deps --no-build-isolation --no-index -e . \
        > "$out/install.log" 2>&1 || { tail -20 "$out/install.log" >&2; exit 1; }
    "$venv/bin/python" -c 'import torch, numpy, pytest, xdist, prometheus_client, yaml, tqdm, matplotlib, asteria_core, asteria_bench' \
        || { echo "device check: --offline: a package the check needs is missing (above)" >&2; exit 1; }
else
    "$python" -m pip --python "$venv/bin/python" install -q -e ".[dev]" > "$out/install.log" 2>&1 \
        || { tail -20 "$out/install.log" >&2; exit 1; }
fi
echo "device check: install done in $((SECONDS - t0)) s" >&2

"$venv/bin/python" benchmarks/device_check.py --device "$device" --size "$size" --out "$out"
echo "device check: all parts passed in $((SECONDS - t0)) s; results in $out" >&2
