#!/usr/bin/env bash
# The single-GPU check (device_check.py): calibrate compute on the GPU, run compute-bound cases, predict
# them from that profile. On a machine with a GPU, from the repo root:
#   here, once:  echo /.whl/ >> .git/info/exclude
#                python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#                    --platform manylinux2014_x86_64 --platform any -d .whl simpy==4.1.1
#   device run:  carry [".whl"], command "bash validation/gpu/device_check.sh", timeout_s 540
# The device image has torch, numpy, pandas, networkx, pyarrow, matplotlib and pyyaml; simpy travels as a wheel.
# Results land in $OUT (device_check.py writes profile.yaml, gpu-validation.md, runs/, sims/).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 validation/gpu/device_check.py --out "${OUT:-out/device-check}" --quick --steps 6
