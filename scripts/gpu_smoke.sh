#!/usr/bin/env bash
# GPU smoke test (issue 18): the default job and a short SmolLM2 job on one GPU, printing each step's
# time and train/token_mult_prob_error (how far the trainer's logprobs are from the generator's: 1.0
# is exact; a bf16/fp32 or device mismatch shows up here first).
#
# NEVER RUN ON A GPU YET: written on a CPU-only machine; the CUDA paths it exercises (policy.device,
# NCCL, pinned copies, CUDA autocast) are tested there only through the device audit
# (tests/unit/workers/test_device_audit.py). Expect to fix things the first time it runs.
#
# Two layouts per job:
#   split     runtime=ray: policy workers on the GPU (one Ray GPU each), the rollout actor on the CPU;
#             weights reach it as host tensors. Needs nothing beyond this branch.
#   colocated runtime=local: the generator samples from the policy's own CUDA module. Needs the
#             rollout worker's sampling generator on the model's device (workers/rollout.py and
#             generation/hf.py create CPU torch.Generators today; see runtime/devices.py
#             seeded_generator); until then this layout is expected to fail at the first sample.
#
# Usage: scripts/gpu_smoke.sh [STEPS]   (default 5; logs under ${OUT:-runs/gpu-smoke})
set -uo pipefail
STEPS=${1:-5}
OUT=${OUT:-runs/gpu-smoke}
RLPLANE=${RLPLANE:-rlplane}
export OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0

python -c "import torch; assert torch.cuda.is_available(), 'no GPU visible'; print('GPU:', torch.cuda.get_device_name(0))" || exit 1

summarize() {  # $1 = run dir: per-step time and token_mult_prob_error from logs/metrics.jsonl
  python - "$1" <<'PY'
import json, pathlib, statistics, sys
path = pathlib.Path(sys.argv[1]) / "logs" / "metrics.jsonl"
if not path.exists():
    sys.exit(f"  no metrics at {path}")
rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
rows = [r for r in rows if "timing/train/total_step_time" in r]
for r in rows:
    print(f"  step {r.get('step'):>3}  {r['timing/train/total_step_time']:7.2f} s  "
          f"token_mult_prob_error {r.get('train/token_mult_prob_error', float('nan')):.4f}")
if rows:
    t = [r["timing/train/total_step_time"] for r in rows[1:]] or [rows[0]["timing/train/total_step_time"]]
    print(f"  median step time (after the first) {statistics.median(t):.2f} s")
PY
}

run() {  # $1 = name, rest = rlplane train arguments
  local name=$1; shift
  echo "== $name"
  rm -rf "$OUT/$name"
  if "$RLPLANE" train "$@" run_dir="$OUT/$name" checkpointing.enabled=false > "$OUT/$name.log" 2>&1; then
    summarize "$OUT/$name"
  else
    echo "  FAILED (exit $?): last lines of $OUT/$name.log"; tail -n 5 "$OUT/$name.log" | sed 's/^/    /'
  fi
}

mkdir -p "$OUT"
RAY_GPU=(runtime=ray data_plane.backend=ray cluster.gpus_per_node=1 policy.device=cuda)
run default-split "${RAY_GPU[@]}" grpo.max_num_steps="$STEPS"
run default-colocated policy.device=cuda grpo.max_num_steps="$STEPS"
run smollm2-split --config grpo_smollm2_reasoning_gym "${RAY_GPU[@]}" grpo.max_num_steps="$STEPS"
run smollm2-colocated --config grpo_smollm2_reasoning_gym policy.device=cuda grpo.max_num_steps="$STEPS"

# vllm backend (when vllm imports): colocated in one process, so a refit hands the engine the policy's
# CUDA tensors (no host copy) and the engine sleeps while the policy trains (vllm_cfg.enable_sleep_mode);
# gpu_memory_utilization leaves the trainer room. The SmolLM2 run also captures CUDA graphs
# (enforce_eager=false, NeMo RL's default). Never run on a GPU yet either.
if python -c "import vllm" 2>/dev/null; then
  VLLM=(policy.device=cuda policy.generation.backend=vllm policy.generation.vllm_cfg.gpu_memory_utilization=0.3
        policy.generation.vllm_cfg.enable_sleep_mode=true)
  run default-vllm-colocated "${VLLM[@]}" grpo.max_num_steps="$STEPS"
  run smollm2-vllm-colocated --config grpo_smollm2_reasoning_gym "${VLLM[@]}" \
    policy.generation.vllm_cfg.enforce_eager=false grpo.max_num_steps="$STEPS"
else
  echo "== vllm runs skipped: vllm is not importable (pip install 'rlplane[vllm]')"
fi
