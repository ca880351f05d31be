#!/usr/bin/env bash
# Wheels the GPU machine lacks, for its Python 3.12 on manylinux x86-64, into .gpu-wheels/ (ignored by git).
#
# The machine brings torch (CUDA), transformers, accelerate, peft and their dependencies (numpy,
# pyyaml, safetensors, tokenizers, tqdm, packaging). rlplane also imports pydantic; the device tests
# need pytest; reading SmolLM2's GGUF needs gguf (pure Python; its numpy, pyyaml and tqdm are there).
# Ray's cp312 wheel (79.3 MB for 2.60.0) does not fit the 64 MiB a device call may carry:
# it travels as .gpu-ray/ray.tar.xz, the installed package without its Java jars and the dashboard's web
# client (nothing `include_dashboard=False` imports), about 26 MB, in a folder of its own so that a call that
# does not run Ray need not carry it; its dependencies travel as wheels. RAY=0 skips it.
# TensorBoard is left out: the logger skips it when it does not import.
#
# Usage: scripts/gpu_kit/download.sh        (then scripts/gpu_kit/check.sh on the GPU machine)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-.gpu-wheels}
RAY_DEST=${RAY_DEST:-.gpu-ray}
PY=${PYTHON:-python3}
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
rm -rf "$DEST" && mkdir -p "$DEST"
# pydantic with its own dependencies (pydantic-core, annotated-types, typing-inspection, typing-extensions);
# pytest and pytest-timeout with theirs (pluggy, iniconfig, pygments, packaging).
"$PY" -m pip download -q "${TARGET[@]}" -d "$DEST" "pydantic>=2.6" "pytest>=8" "pytest-timeout>=2.3" 2> >(grep -v "is ignored" >&2)
"$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$DEST" "gguf>=0.10" 2> >(grep -v "is ignored" >&2)
if [ "${RAY:-1}" = 1 ]; then
  ray_spec=${RAY_SPEC:-ray==$("$PY" -c 'import ray; print(ray.__version__)' 2>/dev/null || echo 2.60.0)}
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$tmp" "$ray_spec"
  "$PY" -m pip download -q "${TARGET[@]}" -d "$DEST" "click>=7" filelock jsonschema "msgpack>=1,<2" \
    "protobuf>=3.20.3" requests 2> >(grep -v "is ignored" >&2)
  ls -l "$tmp"/ray-*.whl | awk '{printf "ray wheel: %s %.1f MB (too big for a device call: repacked)\n", $9, $5/1e6}'
  (cd "$tmp" && unzip -q ray-*.whl -x 'ray/jars/*' 'ray/dashboard/client/build/*' \
     && tar -cf - ray ray-*.dist-info | xz -9 -T0 > ray.tar.xz)
  rm -rf "$RAY_DEST" && mkdir -p "$RAY_DEST" && mv "$tmp/ray.tar.xz" "$RAY_DEST/"
  rm -rf "$tmp"
  ls -l "$RAY_DEST/ray.tar.xz" | awk '{printf "%s %.2f MB\n", $9, $5/1e6}'
fi
echo "wheels in $DEST:"
ls -l "$DEST" | awk 'NR>1 {printf "  %-80s %8.2f MB\n", $9, $5/1e6}'
du -sb "$DEST" | awk '{printf "total %.2f MB (%.2f MiB)\n", $1/1e6, $1/2^20}'
