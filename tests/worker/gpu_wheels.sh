#!/usr/bin/env bash
# Wheels of the worker's non-torch packages, at the versions in this repo's venv, for a GPU
# machine that has torch but no package index (CPython 3.12, x86-64; set PYVER for another).
#
#   bash tests/worker/gpu_wheels.sh [DIR]    (default .whl; then: gpu_check.sh DIR)
set -euo pipefail
dir=${1:-.whl}
pyver=${PYVER:-3.12}
mapfile -t pins < <(.venv/bin/python - <<'PY'
from importlib.metadata import version
for name in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "prometheus-client"):
    print(f"{name}=={version(name)}")
PY
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$dir" "${pins[@]}"
ls "$dir"
