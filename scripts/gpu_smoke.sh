#!/usr/bin/env bash
# The GPU check lives in scripts/gpu_kit/ (docs/gpu.md): download.sh fetches the wheels a GPU machine
# without network lacks, check.sh runs the device checks into one report. This name runs check.sh.
#
# Usage: scripts/gpu_smoke.sh [STEPS]   (default 30; report under ${OUT:-runs/gpu-check})
set -euo pipefail
STEPS=${1:-${STEPS:-30}} exec "$(dirname "$0")/gpu_kit/check.sh"
