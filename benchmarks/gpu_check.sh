#!/usr/bin/env bash
# `asteria bench --quick` on one CUDA device, for whoever has one (the device tool's `run`, from
# the repository root): the CUDA-only tests, then the training suites on the ~85M-parameter GPT
# (n_embd 768, 12 layers, 512 tokens, batch 32) in bf16 autocast, energy from NVML. Budget: under
# 8 minutes on one H200 (the suites stop at their quick sizes; `timeout` guards each part).
#   bash benchmarks/gpu_check.sh     # writes into $OUT (the device tool's) or docs/benchmarks-gpu
# Needs python3 with torch (CUDA), numpy, pyyaml, prometheus_client, tqdm, matplotlib, pytest and
# nvidia-ml-py; the peers (heavyball, pytorch-optimizer) are used where installed.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
out="${OUT:-docs/benchmarks-gpu}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' \
    | tee -a "$out/gpu.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/asteria_core/refresh \
    2>&1 | tee "$out/gpu_tests.log"
timeout 360 python3 -m asteria_bench critical-path staleness tiers --quick --device cuda \
    --no-progress --out "$out" --report "$out/benchmarks.md" --readme /dev/null \
    2>&1 | tee "$out/gpu_bench.log"
