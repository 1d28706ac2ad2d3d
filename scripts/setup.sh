#!/usr/bin/env bash
# Create .venv with onetrip (editable) and its test dependencies. Safe to run again: it
# only installs when .venv is missing or pyproject.toml changed.
#
# PyTorch: on a machine without an NVIDIA GPU this installs the CPU build pinned below
# (an unpinned torch pulls several GB of CUDA wheels that a CPU machine cannot use);
# with a GPU, PyTorch's default build. Override with ONETRIP_TORCH="torch==X.Y.Z".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.onetrip-installed
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  exit 0
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    torch_spec=${ONETRIP_TORCH:-torch}
  else
    torch_spec=${ONETRIP_TORCH:-torch==2.13.0}
  fi
  echo "setup: installing $torch_spec"
  "${pip[@]}" "$torch_spec"
fi
echo "setup: installing onetrip and its test dependencies into .venv"
"${pip[@]}" -e ".[test]"
touch "$stamp"
