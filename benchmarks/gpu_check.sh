#!/usr/bin/env bash
# The GPU checks of issue #4 in one run, for a CUDA machine (the device tool's `run`, from the
# repository root): the CUDA-only tests, then the ~100M-parameter refresh benchmark.
#   bash benchmarks/gpu_check.sh          # writes into $OUT (the device tool's) or benchmarks/results
# Needs python3 with torch (CUDA), numpy, pyyaml, prometheus_client, tqdm, matplotlib, pytest:
# the device image has them all, so nothing is installed.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/asteria_core/refresh 2>&1 \
    | tee "$out/gpu_tests.log"
python3 benchmarks/bench_refresh.py --gpu --steps "${STEPS:-200}" --out "$out/refresh_gpu.json" \
    2>&1 | tee "$out/gpu_bench.log"
