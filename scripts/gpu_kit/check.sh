#!/usr/bin/env bash
# The GPU check: installs the wheels from .gpu-wheels/ (scripts/gpu_kit/download.sh) that this Python
# lacks, then runs each part below in its own process under its own timeout, so a failure or hang in one
# still reports the others. Writes $OUT/gpu_report.md and $OUT/gpu_report.json (one entry per part:
# status ok|failed|timeout|skipped, seconds, the part's JSON result or the last lines of its output).
#
#   env          python, torch/CUDA, GPU name and memory, which packages are present
#   device_tests the tests that exercise devices (device audit, vLLM GPU paths, CUDA baseline/std)
#   default_job  `rlplane train` with policy.device=cuda for $STEPS steps: held-out accuracy before/after,
#                per-phase median step time, token_mult_prob_error
#   smollm2_step GRPO steps of a SmolLM2-135M-shaped model with random weights: per-phase step time and
#                peak GPU memory per phase
#   generation   tokens/s of rlplane's hf backend vs transformers' model.generate on that model
#   graph_decode tokens/s of the CUDA-graph decoder, the fused decoder and model.generate on that model, 64
#                and 256 sequences ($GRAPH_BATCHES)
#   smollm2_real SmolLM2-135M-Instruct's real weights (carried as two pieces: smollm2_real.py pack): greedy
#                decode graph vs fused vs model.generate, then $REAL_STEPS GRPO steps: held-out accuracy,
#                per-phase time and peak GPU memory; skipped (one line) while a piece is missing
#   fsdp         one train step of the policy sharded by FSDP2 at world size 1 over NCCL
#   ray          the default job under runtime=ray on the GPU: colocated (policy rank and generator share
#                it), with FSDP2, distillation (the teacher shares it too); split, async GRPO and PPO where
#                there are GPUs enough, else refused in one line (RAY_CASES="colocated async" picks cases)
#
# Ray travels as a repacked tarball in .gpu-ray (download.sh; docs/gpu.md). Without a GPU every
# part runs on the CPU with tiny sizes (a check of the kit itself), and the report says device: cpu.
#
# Usage: OUT=DIR scripts/gpu_kit/check.sh     (every part: more than one device call's 10 minutes:
#                                              run them in ONLY= groups, docs/gpu.md)
#        ONLY="generation fsdp" OUT=DIR scripts/gpu_kit/check.sh   (a rerun of some parts; env always runs)
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-runs/gpu-check}
STEPS=${STEPS:-30}
REAL_STEPS=${REAL_STEPS:-10}
GRAPH_BATCHES=${GRAPH_BATCHES:-64 256}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.gpu-wheels}
RAY_DIR=${RAY_DIR:-.gpu-ray}
SITE=${SITE:-$ROOT/.gpu-site}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rlplane-gpu-check.XXXXXX")
export OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1

# Install only the wheels whose distribution this Python lacks, into a folder of their own (no venv
# needed, the machine's packages untouched): a newer package the machine brings is never shadowed.
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  missing=$("$PY" - "$WHEELS" <<'PY'
import importlib.metadata as md, pathlib, sys
for whl in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name = whl.name.split("-")[0]
    try:
        md.version(name)
    except md.PackageNotFoundError:
        print(whl)
PY
)
  if [ -n "$missing" ]; then
    echo "installing into $SITE:" $missing
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" $missing || echo "wheel install FAILED"
  fi
else
  echo "no wheels in $WHEELS (run scripts/gpu_kit/download.sh first, where there is network); using this Python as is"
fi
# Ray travels as a tarball of the installed package (download.sh): unpacked into the same folder.
for tarball in "$RAY_DIR/ray.tar.xz" "$WHEELS/ray.tar.xz"; do
  if [ -f "$tarball" ] && ! "$PY" -c 'import ray' 2>/dev/null && [ ! -d "$SITE/ray" ]; then
    mkdir -p "$SITE" && tar -xJf "$tarball" -C "$SITE" && echo "unpacked ray into $SITE" \
      || echo "ray unpack FAILED"
  fi
done
export PYTHONPATH="$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"

ONLY=${ONLY:-}
part() {  # $1 name, $2 timeout (s), rest: command. Writes $OUT/part_NAME.json.
  local name=$1 limit=$2; shift 2
  if [ -n "$ONLY" ] && [ "$name" != env ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  local log="$OUT/$name.log" t0=$SECONDS rc status
  echo "== $name (timeout ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  case $rc in 0) status=ok ;; 124|137) status=timeout ;; 77) status=skipped ;; *) status=failed ;; esac
  "$PY" - "$log" "$OUT/part_$name.json" "$status" "$rc" "$((SECONDS - t0))" <<'PY'
import json, sys
log, dest, status, rc, seconds = sys.argv[1:]
lines = open(log, errors="replace").read().splitlines()
result = None
for line in reversed(lines):
    if line.startswith("{"):
        try:
            result = json.loads(line)
            break
        except ValueError:
            pass
entry = {"status": status, "rc": int(rc), "seconds": int(seconds), "result": result}
if status != "ok" or result is None:
    entry["tail"] = "\n".join(lines[-15:])
json.dump(entry, open(dest, "w"), default=str)
print(f"   {status} in {seconds} s" + ("" if result is None else ": " + json.dumps(result, default=str)[:600]))
if status != "ok":
    print("   " + "\n   ".join(lines[-5:]))
PY
}

PARTS="$ROOT/scripts/gpu_kit/parts.py"
part env 30 "$PY" "$PARTS" env
# The tests that touch devices: CUDA branches run where a GPU is visible, the CPU ones everywhere.
part device_tests 150 "$PY" -m pytest -q -p no:cacheprovider --timeout 60 \
  tests/unit/workers/test_device_audit.py tests/unit/generation/test_vllm_gpu_paths.py \
  tests/unit/algorithms/test_nemo_rl_cases_advantages.py tests/unit/fast/test_graph_decode.py
part default_job 150 "$PY" "$PARTS" default_job "$WORK/default" "$STEPS" 135
part smollm2_step 110 "$PY" "$PARTS" smollm2_step "$WORK" 6
part generation 60 "$PY" "$PARTS" generation "$WORK"
part graph_decode 200 "$PY" "$ROOT/scripts/gpu_kit/graph_decode.py" "$WORK" "$GRAPH_BATCHES"
part smollm2_real 300 "$PY" "$ROOT/scripts/gpu_kit/smollm2_real.py" run "$WORK/real" "$REAL_STEPS"
part fsdp 45 "$PY" "$PARTS" fsdp
part ray 360 "$PY" "$PARTS" ray "$WORK/ray" "$STEPS" "${RAY_CASES:-}"
"$PY" "$PARTS" report "$OUT"
rm -rf "$WORK"
