#!/usr/bin/env bash
# Wheels the GPU machine lacks, for its Python 3.12 on manylinux x86-64, into .gpu-wheels/ (ignored by git).
#
# The machine brings torch (CUDA), transformers, accelerate, peft and their dependencies (numpy,
# pyyaml, safetensors, tokenizers, tqdm, packaging). rlplane also imports pydantic; the device tests
# need pytest. Ray is left out: its cp312 wheel (ray 2.60.0, 79.3 MB) does not fit the 64 MiB a
# device call may carry, so the GPU checks run with runtime=local only (CHECK_RAY=1 re-measures it).
# TensorBoard is left out too: the logger skips it when it does not import.
#
# Usage: scripts/gpu_kit/download.sh        (then scripts/gpu_kit/check.sh on the GPU machine)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-.gpu-wheels}
PY=${PYTHON:-python3}
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
rm -rf "$DEST" && mkdir -p "$DEST"
# pydantic with its own dependencies (pydantic-core, annotated-types, typing-inspection, typing-extensions);
# pytest and pytest-timeout with theirs (pluggy, iniconfig, pygments, packaging).
"$PY" -m pip download -q "${TARGET[@]}" -d "$DEST" "pydantic>=2.6" "pytest>=8" "pytest-timeout>=2.3" 2> >(grep -v "is ignored" >&2)
if [ "${CHECK_RAY:-0}" = 1 ]; then
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$tmp" "ray>=2.40"
  ls -l "$tmp"/ray-*.whl | awk '{printf "ray wheel: %s %.1f MB (limit per device call: 64 MiB incl. the working tree)\n", $9, $5/1e6}'
  rm -rf "$tmp"
fi
echo "wheels in $DEST:"
ls -l "$DEST" | awk 'NR>1 {printf "  %-80s %8.2f MB\n", $9, $5/1e6}'
du -sb "$DEST" | awk '{printf "total %.2f MB (%.2f MiB)\n", $1/1e6, $1/2^20}'
