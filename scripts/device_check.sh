#!/usr/bin/env bash
# The prepared GPU check of arbench: CUDA tests, the speed benchmark on CUDA (LLoPS p=2/4/6,
# BASED, Flatten, PolySketch, softmax, the gated and delta rules; n = 1k..16k; fp32 and bf16;
# memory) and a short paper-profile fit of BASED and LLoPS p=4, under 8 minutes, all written to
# results/gpu/<device>/ (summary.md first). Options: --dry-run (no GPU needed), --out DIR.
# The steps and their time limits: arbench/bench/device_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; fi
export PYTHONUNBUFFERED=1
exec "$PYTHON" -m arbench.bench.device_check "$@"
