#!/bin/sh
# run_torch_gpu_parity.sh PYTHON REFERENCE_DIR TEST_PROGRAM
# Writes the PyTorch-on-GPU references (torch_gpu_references.py) into REFERENCE_DIR, then runs the
# parity suite against them. A skip of either step (status 77: no PyTorch, or none that sees a
# CUDA device; no CUDA device for coltrain) is passed on, so CTest reports the test as skipped.
set -u
python=$1
dir=$2
program=$3
if [ -z "$python" ] || ! command -v "$python" > /dev/null 2>&1; then
  echo "skipped: no python3 to run PyTorch"
  exit 77
fi
"$python" "$(dirname "$0")/torch_gpu_references.py" --out "$dir" || exit $?
COLTRAIN_PARITY_DIR=$dir exec "$program"
