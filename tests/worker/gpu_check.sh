#!/usr/bin/env bash
# The GPU check: tests/worker/test_cuda.py on a machine with a CUDA GPU, run from the repo root.
#
#   bash tests/worker/gpu_check.sh [WHEELS_DIR]
#
# GPU_PY (default python3) must already have torch and pytest; the worker's other packages
# (pydantic and its three helpers, prometheus-client; numpy and pyyaml too, if missing) come from WHEELS_DIR
# when given: `bash tests/worker/gpu_wheels.sh` fills one on a machine with pip's index, for a
# GPU machine without it. `make gpu-check` runs this with the project's venv.
set -euo pipefail
py=${GPU_PY:-python3}
if [[ -n "${1:-}" ]]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/fsdp-site "$1"/*.whl
  export PYTHONPATH=/tmp/fsdp-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/worker:$PWD/tests/worker${PYTHONPATH:+:$PYTHONPATH}
"$py" - <<'PY'
import torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"
print(f"torch {torch.__version__}, {gpu}, NCCL {torch.cuda.nccl.version() if gpu != 'no CUDA GPU' else '-'}")
PY
args=(-q -rs -p no:cacheprovider -o addopts= tests/worker/test_cuda.py)
if [[ -n "${OUT:-}" ]]; then args+=("--junitxml=$OUT/gpu-check.xml"); fi
exec "$py" -m pytest "${args[@]}"
