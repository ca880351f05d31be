"""The parts of the GPU check (``check.sh`` runs each in its own process, with its own timeout).

Each part prints one JSON object on its last stdout line (``check.sh`` collects them into the
report). Every part runs on ``cuda`` when the process sees a GPU, else on ``cpu`` with tiny sizes
(so the kit itself is testable on a CPU-only machine); the report says which.

    python scripts/gpu_kit/parts.py env
    python scripts/gpu_kit/parts.py default_job RUN_DIR STEPS TIMEOUT_S
    python scripts/gpu_kit/parts.py smollm2_step WORK_DIR STEPS
    python scripts/gpu_kit/parts.py generation WORK_DIR [BATCH]
    python scripts/gpu_kit/parts.py fsdp
    python scripts/gpu_kit/parts.py ray WORK_DIR STEPS ["CASE ..."]
    python scripts/gpu_kit/parts.py report OUT_DIR
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# SmolLM2-135M's architecture (its config.json), built with random weights: nothing is downloaded.
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                    rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, hidden_act="silu")


def _emit(result: dict) -> None:
    print(json.dumps({"device": DEVICE, **result}, default=str))


def _peak_mib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if CUDA else None


def _metrics_rows(run_dir: str) -> list[dict]:
    path = Path(run_dir) / "logs" / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "timing/train/total_step_time" in r]


def _summarise_steps(rows: list[dict]) -> dict:
    """Median per-phase step times (first step left out: warm-up) and token_mult_prob_error."""
    if not rows:
        return {"steps": 0}
    later = rows[1:] or rows
    phases = sorted({k for r in later for k in r if k.startswith("timing/train/")})
    tmpe = [r["train/token_mult_prob_error"] for r in rows if "train/token_mult_prob_error" in r]
    return {"steps": len(rows),
            "first_step_s": round(rows[0]["timing/train/total_step_time"], 4),
            "median_s": {p.removeprefix("timing/train/"): round(statistics.median(r.get(p, 0.0) for r in later), 4)
                         for p in phases},
            "token_mult_prob_error": {"first": tmpe[0], "max": max(tmpe), "last": tmpe[-1]} if tmpe else None}


def env() -> None:
    import importlib.metadata as md

    versions = {}
    for name in ("torch", "transformers", "accelerate", "peft", "pydantic", "pytest", "ray", "gguf", "vllm",
                 "tensorboard"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    gpu = None
    if CUDA:
        p = torch.cuda.get_device_properties(0)
        gpu = {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1), "capability": f"{p.major}.{p.minor}",
               "count": torch.cuda.device_count(), "cuda": torch.version.cuda,
               "bf16": torch.cuda.is_bf16_supported(), "nccl": torch.distributed.is_nccl_available()}
    _emit({"python": sys.version.split()[0], "versions": versions, "gpu": gpu})


def _train(overrides: list[str], run_dir: str, timeout_s: float, config: str | None = None) -> dict:
    """``rlplane train`` in a subprocess: rc, wall time, printed accuracies, the last line of a failure."""
    cmd = [sys.executable, "-m", "rlplane.cli", "train", *(["-c", config] if config else []), *overrides,
           f"run_dir={run_dir}", "checkpointing.enabled=false", "logger.tensorboard_enabled=false",
           "logger.progress_bar=false", "--overwrite"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = f"{e.stdout or ''}{e.stderr or ''}\nstopped after {timeout_s} s", "timeout"
    acc = {}
    for line in out.splitlines():
        if line.startswith("held-out accuracy"):
            acc["before" if "before" in line else "after"] = line.rsplit(" ", 1)[-1]
    lines = out.strip().splitlines()
    return {"command": " ".join(cmd[1:]), "rc": rc, "wall_s": round(time.perf_counter() - t0, 1),
            "accuracy": acc, "tail": lines[-6:] if rc else [], "last_line": lines[-1] if lines else ""}


def default_job(run_dir: str, steps: str, timeout_s: str) -> None:
    """``rlplane train`` (the embedded arithmetic job) with policy.device; its printed accuracies and metrics.
    Stopped after ``timeout_s``, it still reports the steps it logged."""
    # CPU (a check of the kit): a short warm-up and validation so the part fits its timeout on a loaded machine.
    small = [] if CUDA else ["warmup.num_steps=100", "warmup.eval_every=50", "grpo.max_val_samples=100"]
    result = _train([f"policy.device={DEVICE}", f"grpo.max_num_steps={steps}", *small], run_dir, float(timeout_s))
    result.pop("last_line")
    _emit({**result, **_summarise_steps(_metrics_rows(run_dir))})


def ray(work: str, steps: str, only: str = "") -> None:
    """The default job under ``runtime: ray`` on the GPU: each layout runs where the GPUs suffice and is refused in
    one line where they do not (a layout Ray could never place would otherwise wait forever). Records where each
    actor ran (``logs/placement.json``: GPU ids Ray gave it). ``only``: space-separated case names."""
    gpus = torch.cuda.device_count() if CUDA else 0
    steps = int(steps) if CUDA else 2

    def base(loop: str) -> list[str]:
        keys = ["runtime=ray", "data_plane.backend=ray", f"policy.device={DEVICE}", f"{loop}.max_num_steps={steps}"]
        if not CUDA:  # a check of the kit: tiny warm-up and validation
            keys += ["warmup.num_steps=50", "warmup.eval_every=50", f"{loop}.max_val_samples=50"]
        return keys
    async_keys = ["grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"]
    # (name, config, its loop section, overrides, GPUs the layout needs: policy rank + generator share one
    # when colocated)
    cases = [("colocated", None, "grpo", [], 1),
             ("colocated_fsdp", None, "grpo", ["policy.dtensor_cfg.enabled=true"], 1),
             ("split", None, "grpo", ["policy.generation.colocated.enabled=false"], 2),
             # policy rank + validation generator share one GPU, the collector has its own
             ("async", None, "grpo", async_keys, 2),
             ("ppo_colocated", "ppo_arithmetic", "ppo", [], 2),  # the critic rank: a GPU of its own
             ("distill_colocated", "distill_arithmetic", "distillation", [], 1)]  # policy, teacher, generator share
    results, ok = {}, True
    for name, config, loop, over, need in cases:
        if only and name not in only.split():
            continue
        run_dir = str(Path(work) / name)
        fits = need <= gpus or not CUDA
        r = _train([*base(loop), *over], run_dir, 150.0 if fits else 60.0, config)
        if fits:
            rows = _metrics_rows(run_dir)
            r["steps"] = _summarise_steps(rows) if rows else None
            placement = Path(run_dir) / "logs" / "placement.json"
            if placement.exists():
                where = json.loads(placement.read_text())
                r["gpus"] = {group: [w.get("gpus") for w in ranks] for group, ranks in where.items()
                             if isinstance(ranks, list)}
            r["expected"], passed = "runs", r["rc"] == 0
        else:  # refused before any actor starts: rc 2 and one line naming the GPUs
            r["expected"], passed = f"refused (needs {need} GPUs, has {gpus})", r["rc"] == 2 and "GPU" in r["last_line"]
        r["passed"] = passed
        ok &= passed
        results[name] = r
        print(name, json.dumps(r, default=str)[:800], flush=True)
    _emit({"gpus": gpus, "cases": {n: {k: r[k] for k in ("expected", "passed", "rc", "wall_s", "accuracy", "last_line",
                                                        "gpus", "steps") if k in r} for n, r in results.items()}})
    if not ok:
        sys.exit(1)


def _smollm2_dir(work: str) -> str:
    """A SmolLM2-135M-shaped Llama with random weights and rlplane's char tokenizer, saved as an HF directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlplane.models.tiny import build_char_tokenizer

    path = Path(work) / "smollm2-135m-random"
    if not (path / "config.json").exists():
        tok = build_char_tokenizer()
        sizes = SMOLLM2_135M if CUDA else {**SMOLLM2_135M, "num_hidden_layers": 2}  # CPU: a 2-layer stand-in
        cfg = LlamaConfig(**sizes, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).save_pretrained(path)
        tok.save_pretrained(path)
    return str(path)


@contextmanager
def _phase_memory(peaks: dict[str, float]):
    """Wrap the recipes' phase timer so each timed phase also records the peak CUDA memory inside it."""
    from rlplane.training.loop import Timer

    plain = Timer.__call__

    @contextmanager
    def timed(self, name: str):
        if CUDA:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with plain(self, name):
            yield
        if CUDA:
            torch.cuda.synchronize()
            peaks[name] = max(peaks.get(name, 0.0), _peak_mib())

    Timer.__call__ = timed
    try:
        yield
    finally:
        Timer.__call__ = plain


def smollm2_step(work: str, steps: str) -> None:
    """GRPO steps of a SmolLM2-shaped random model: per-phase step time and peak memory (no warm-up: random)."""
    import rlplane

    model_dir = _smollm2_dir(work)
    steps = steps if CUDA else "2"  # CPU: a check that the part runs, not a timing
    run_dir = str(Path(work) / "run-smollm2")
    new = 64 if CUDA else 8
    overrides = [f"policy.model_name={model_dir}", f"policy.device={DEVICE}", "warmup.enabled=false",
                 f"grpo.max_num_steps={steps}", "grpo.num_prompts_per_step=8", "grpo.num_generations_per_prompt=8",
                 "policy.train_global_batch_size=64", "policy.train_micro_batch_size=16",
                 "policy.logprob_batch_size=32", f"policy.max_total_sequence_length={new + 32}",
                 f"policy.generation.max_new_tokens={new}", "policy.shared_prefix_forward=false",
                 "grpo.val_at_start=false", "grpo.val_at_end=false", "grpo.val_period=0",
                 "loss_fn.reference_policy_kl_penalty=0.01", f"run_dir={run_dir}", "checkpointing.enabled=false",
                 "logger.tensorboard_enabled=false", "logger.progress_bar=false"]
    peaks: dict[str, float] = {}
    t0 = time.perf_counter()
    with _phase_memory(peaks):
        rlplane.train(None, overrides=overrides, quiet=True)
    _emit({"model": "SmolLM2-135M shape, random weights" + ("" if CUDA else " (2 layers on CPU)"),
           "overrides": overrides, "wall_s": round(time.perf_counter() - t0, 1),
           **_summarise_steps(_metrics_rows(run_dir)), "peak_memory_mib_per_phase": peaks or None,
           "peak_memory_mib_run": _peak_mib()})


def generation(work: str, batch: str | None = None) -> None:
    """tokens/s of rlplane's hf backend vs transformers' model.generate, same weights, dtype and batch
    (``batch`` sequences, a multiple of 8; default 64 on a GPU)."""
    from transformers import AutoModelForCausalLM

    from rlplane.generation import HFGenerationBackend
    from rlplane.models.precision import apply_precision
    from rlplane.models.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(_smollm2_dir(work)).to(DEVICE).eval()
    batch, new = (int(batch or 64), 128) if CUDA else (int(batch or 8), 8)
    precision = apply_precision(model, "auto")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    prompts = [tok(f"{a}+{a + 7}=")["input_ids"] for a in range(batch // 8) for _ in range(8)]
    rl = HFGenerationBackend(model, tok)

    def ours(seed):
        return rl.generate(prompts, max_new_tokens=new, temperature=1.0, stop_token_ids=[], seed=seed).output_ids

    import copy

    from rlplane.models.precision import set_precision

    plain = copy.deepcopy(model)
    set_precision(plain, "fp32")
    plain = plain.to(dtype)
    pad = tok.pad_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=DEVICE)
    mask = (ids != pad).long()

    def theirs(seed):
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = plain.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=new, min_new_tokens=new, pad_token_id=pad)
        return out[:, width:].tolist()

    result = {"batch": batch, "max_new_tokens": new, "precision": precision}
    for name, fn in (("rlplane_hf", ours), ("model_generate", theirs)):
        try:
            times = []
            for rep in range(3):
                if CUDA:
                    torch.cuda.synchronize()
                t = time.perf_counter()
                out = fn(rep)
                if CUDA:
                    torch.cuda.synchronize()
                if rep:
                    times.append(time.perf_counter() - t)
            tokens = sum(len(o) for o in out)
            result[name] = {"tokens": tokens, "tokens_per_s": round(tokens / statistics.median(times), 1)}
            if name == "rlplane_hf":
                result[name]["decode"] = rl.last_decode  # fused, or the model's own forward
        except Exception as e:  # one contender failing still reports the other
            result[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
    result["peak_memory_mib"] = _peak_mib()
    _emit(result)


def fsdp() -> None:
    """One GRPO-shaped train step of a policy sharded with FSDP2 over world size 1 (NCCL on CUDA, gloo on CPU)."""
    import torch.distributed as dist

    from rlplane.config.loading import load_config
    from rlplane.dataplane import make_data_plane
    from rlplane.recipes.ppo import TRAIN_COLUMNS
    from rlplane.training.workers import policy_options
    from rlplane.workers.parallel import is_sharded
    from rlplane.workers.policy import ClippedPGLoss, PolicyWorker

    # dtensor_cfg needs runtime: ray in a run; the worker itself is built here directly, as the FSDP tests do.
    cfg = load_config(None, ["warmup.enabled=false", "policy.train_global_batch_size=8",
                             "policy.train_micro_batch_size=4", "policy.logprob_batch_size=4",
                             "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=4",
                             "loss_fn.reference_policy_kl_penalty=0.05", "runtime=ray", "data_plane.backend=ray",
                             "policy.dtensor_cfg.enabled=true", f"policy.device={DEVICE}"])
    client = make_data_plane("memory")
    worker = PolicyWorker(policy_options(cfg), client, rank=0, world_size=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker.setup_distributed(f"127.0.0.1:{port}")
    g = torch.Generator().manual_seed(0)
    n, lengths = 8, torch.randint(6, 14, (8,), generator=g).tolist()
    client.register_partition("train", TRAIN_COLUMNS, n)
    meta = client.put_samples([f"s{i}_g0" for i in range(n)], "train", {
        "input_ids": [torch.randint(4, 21, (L,), generator=g) for L in lengths],
        "token_mask": [torch.tensor([0] * 3 + [1] * (L - 3), dtype=torch.int8) for L in lengths],
        "generation_logprobs": [torch.zeros(L) for L in lengths],
        "advantages": [torch.full((L,), float(i % 2) - 0.5) for i, L in enumerate(lengths)]})
    loss = ClippedPGLoss(cfg.loss_fn.options(), reference=True)
    t0 = time.perf_counter()
    worker.compute_logprobs(meta, out_field="prev_logprobs")
    worker.compute_logprobs(meta, out_field="reference_policy_logprobs", reference=True)
    metrics = worker.train(meta, loss)
    if CUDA:
        torch.cuda.synchronize()
    step_s = round(time.perf_counter() - t0, 3)
    _emit({"backend": dist.get_backend(), "sharded": is_sharded(worker.model), "step_s": step_s,
           "loss": metrics.get("loss"), "grad_norm": metrics.get("grad_norm"), "peak_memory_mib": _peak_mib()})
    dist.destroy_process_group()


def report(out_dir: str) -> None:
    """gpu_report.json (every part's result) and gpu_report.md (a summary a reader can scan)."""
    out = Path(out_dir)
    parts = {}
    for f in sorted(out.glob("part_*.json")):
        parts[f.stem.removeprefix("part_")] = json.loads(f.read_text())
    (out / "gpu_report.json").write_text(json.dumps(parts, indent=1, default=str))
    lines = ["# rlplane GPU check", ""]
    for name, r in parts.items():
        lines.append(f"## {name}: {r.get('status')} ({r.get('seconds')} s)")
        body = r.get("result") or r.get("tail")
        lines += ["```", json.dumps(body, indent=1, default=str) if not isinstance(body, str) else body, "```", ""]
    (out / "gpu_report.md").write_text("\n".join(lines))
    print(f"report: {out / 'gpu_report.md'}")


if __name__ == "__main__":
    part, *args = sys.argv[1:]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    globals()[part](*args)
