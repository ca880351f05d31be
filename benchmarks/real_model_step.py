"""rlplane's GRPO step on a real model (SmolLM2-135M-Instruct, Gemma 3 270M) beside a plain transformers loop
doing the same work, and the training phase's achieved FLOP/s against the machine's matmul limit.

One process per model, steps interleaved (rlplane, plain, rlplane, ...), both from the same weights
(``packaged:smollm2-135m-instruct`` / ``packaged:gemma3-270m``) on the same prompt batches (the run's
training loader, in order), with the small preset's settings: ``configs/grpo_smollm2.yaml`` where it
exists, else ``grpo_smollm2_reasoning_gym`` with 4 prompts x 4 samples x 64 new tokens (override with
KEY=VALUE). Gemma 3 (a base model, no chat template) gets ``data.prompt.processor=auto``: the
``Question: ... Answer:`` prompt.

FLOP/s of the training phase (advantages + forward/backward + optimizer step): the model FLOPs of the
step's forward and backward, 6 x (parameters of the decoder's linear layers) per token of every sequence
plus 6 x (the output projection's parameters) per trained token (rlplane projects only those onto the
vocabulary; attention's score matmuls are left out, a few % at these lengths), over its median seconds.
The limit: the best of a square 1024^3 matmul and a training-shaped (tokens of a micro-batch) x hidden x
MLP matmul in the compute dtype (bf16 where ``policy.precision`` resolves to it on this CPU, else fp32),
timed in the same run with the same threads. Under bf16 rlplane computes the lm_head in fp32, so a second
line weighs the two limits by the FLOPs in each: the best that split of the work could reach.

The plain loop, per step: ``model.generate`` (sampling at temperature 1, no top-k/top-p, stops at
eos) on the prompts repeated per group → rewards from the same environment → group-mean/std
advantages → a no-grad forward for the old-policy logprobs → forward+backward with the clipped loss
(token mean over the batch, micro-batches of ``policy.train_micro_batch_size``) → grad clip → one AdamW
step. Same precision choice as rlplane's ``policy.precision`` resolved on this machine: fp32 master
weights, and with bf16 one ``torch.autocast`` region around ``generate`` and around each forward (the
plain loop keeps transformers' own lm_head in that dtype over every position; rlplane computes its lm_head
in fp32, in training only at the tokens the loss reads).
Same ``policy.activation_checkpointing``.

Phases (median seconds): generation (sampling + scoring), logprobs (the old-policy forward; rlplane
skips it when the rollout gets one optimizer step, see ``rlplane.training.plan``), training
(advantages, forward+backward, clip, optimizer). Generated-token counts differ between the two
(different random draws, eos stops), so tokens/s is printed beside the times.

    python benchmarks/real_model_step.py [--models smollm2,gemma3] [--steps 3] [--warmup-steps 1] [--no-plain]
                                         [KEY=VALUE overrides...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from rlplane.config.loading import load_config  # noqa: E402
from rlplane.datasets import build_datasets  # noqa: E402
from rlplane.recipes.grpo import grpo_step  # noqa: E402
from rlplane.training import Session  # noqa: E402
from rlplane.training.plan import skips_prev_logprob_forward  # noqa: E402
from rlplane.workers.policy import ClippedPGLoss  # noqa: E402

SMALL = ["grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=16",
         "policy.generation.max_new_tokens=64"]
MODELS = {"smollm2": [], "gemma3": ["policy.model_name=packaged:gemma3-270m", "data.prompt.processor=auto",
                                     "data.prompt.template=null"]}
QUIET = ["checkpointing.enabled=false", "logger.progress_bar=false", "logger.tensorboard_enabled=false",
         "logger.jsonl_enabled=false", "grpo.val_at_start=false", "grpo.val_period=0"]


def preset() -> tuple[str, list[str]]:
    """``grpo_smollm2`` when this checkout ships it, else the reasoning-gym SmolLM2 config made small."""
    configs = Path(__file__).resolve().parents[1] / "src" / "rlplane" / "configs"
    if (configs / "grpo_smollm2.yaml").is_file():
        return "grpo_smollm2", []
    return "grpo_smollm2_reasoning_gym", SMALL


class PlainLoop:
    """The least transformers code that does one GRPO step of the same shape."""

    def __init__(self, cfg, model_dir: str, dtype: torch.dtype | None, env_for):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg, self.dtype, self.env_for = cfg, dtype, env_for
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        if cfg.policy.activation_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.model.config.use_cache = True
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.policy.optimizer.lr, weight_decay=0.0)
        loader, _, _ = build_datasets(cfg.dataset_options(), self.tok)
        self.batches = iter(loader)  # the same order as the rlplane session's loader (same seed)
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id

    def autocast(self):
        return torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype is not None)

    def logprobs(self, ids, attn):  # (B, T) -> (B, T-1): log π(token_t | tokens_<t)
        with self.autocast():
            logits = self.model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
        return torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:, None]).squeeze(2)

    def step(self) -> dict[str, float]:
        cfg, g, t = self.cfg, self.cfg.grpo, {}
        G, gen = g.num_generations_per_prompt, cfg.policy.generation
        t0 = time.perf_counter()
        datums = next(self.batches)
        prompts = [d.prompt_token_ids for d in datums for _ in range(G)]
        P = max(map(len, prompts))
        ids = torch.tensor([[self.pad] * (P - len(p)) + list(p) for p in prompts])  # left-padded (B, P)
        attn = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
        self.model.eval()
        with torch.no_grad(), self.autocast():
            out = self.model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=gen.temperature,
                                      top_k=0, top_p=1.0, max_new_tokens=gen.max_new_tokens, pad_token_id=self.pad)
        resp = out[:, P:]
        eos = self.tok.eos_token_id
        # Response mask: up to and including the first eos.
        is_eos = resp == eos
        after = (is_eos.cumsum(1) - is_eos.long()) > 0
        rmask = (~after).long()  # (B, R)
        texts = self.tok.batch_decode([r[m.bool()] for r, m in zip(resp, rmask)], skip_special_tokens=True)
        rewards = torch.tensor([float(self.env_for(d.task_name).step(
            [[*d.message_log, {"role": "assistant", "content": txt}]], [d.extra_env_info]).rewards[0])
            for d, txt in zip([d for d in datums for _ in range(G)], texts)]).view(-1, G)
        t["generation"] = time.perf_counter() - t0
        t["generated_tokens"] = float(rmask.sum())

        t1 = time.perf_counter()
        full_attn = torch.cat([attn, rmask], 1)  # (B, P+R)
        mask = torch.cat([torch.zeros_like(attn), rmask], 1)[:, 1:].float()  # (B, T-1): response tokens
        mbs, lbs = cfg.policy.train_micro_batch_size, cfg.policy.logprob_batch_size
        with torch.no_grad():
            old = torch.cat([self.logprobs(out[i:i + lbs], full_attn[i:i + lbs]) for i in range(0, len(out), lbs)])
        t["logprobs"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).view(-1)
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        n_tok = mask.sum()
        lo, hi = cfg.loss_fn.ratio_clip_min, cfg.loss_fn.ratio_clip_max
        for i in range(0, len(out), mbs):
            cur = self.logprobs(out[i:i + mbs], full_attn[i:i + mbs])
            ratio = torch.exp(cur - old[i:i + mbs])
            a = adv[i:i + mbs, None]
            loss = torch.maximum(-a * ratio, -a * ratio.clamp(1 - lo, 1 + hi))
            ((loss * mask[i:i + mbs]).sum() / n_tok).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.policy.max_grad_norm)
        self.opt.step()
        t["training"] = time.perf_counter() - t2
        t["total"] = time.perf_counter() - t0
        return t


def split(r: dict[str, float]) -> str:
    """One step's phases, printed with each step: a run cut short by a timeout still shows them."""
    return ", ".join(f"{k} {r[k]:.2f}" for k in ("generation", "logprobs", "training"))


def linear_params(model) -> tuple[int, int]:
    """(parameters of the decoder's linear layers, parameters of the output projection)."""
    head = model.get_output_embeddings()
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    return body, head.weight.numel()


def matmul_limit(dtype: torch.dtype, rows: int, hidden: int, inner: int, seconds: float = 1.0) -> float:
    """Best GFLOP/s of a square 1024^3 matmul and a training-shaped (rows x hidden) @ (hidden x inner) one."""
    best = 0.0
    for m, k, n in ((1024, 1024, 1024), (rows, hidden, inner)):
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        for _ in range(2):
            a @ b
        times, deadline = [], time.perf_counter() + seconds / 2
        while time.perf_counter() < deadline or len(times) < 3:
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        best = max(best, 2 * m * k * n / statistics.median(times) / 1e9)
    return best


def run_model(model_key: str, args) -> None:
    name, small = preset()
    overrides = [*small, *MODELS[model_key], *QUIET, *args.overrides]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(name, [*overrides, f"run_dir={tmp}"])
        s = Session(cfg, quiet=True)
        s.start()
        loss = ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference,
                             prev_from_forward=skips_prev_logprob_forward(cfg))  # as recipes.grpo.train builds it
        w = s.workers.policy.workers[0]
        dtype = getattr(w.model, "rlplane_autocast_dtype", None)
        plain = None
        if not args.no_plain:
            model_dir = os.path.join(tmp, "start")
            w.model.save_pretrained(model_dir, safe_serialization=True)  # the exact start weights, plain HF
            w.tokenizer.save_pretrained(model_dir)
            plain = PlainLoop(cfg, model_dir, dtype, s.workers.rollout.group.workers[0].env)
        body, head = linear_params(w.model)
        g = cfg.grpo
        print(f"{model_key}: config {name} {' '.join(small + MODELS[model_key] + args.overrides)}: "
              f"{g.num_prompts_per_step} prompts x "
              f"{g.num_generations_per_prompt} samples x {cfg.policy.generation.max_new_tokens} new tokens, "
              f"compute {dtype or 'fp32'}, activation checkpointing {cfg.policy.activation_checkpointing}, "
              f"{torch.get_num_threads()} threads; rlplane skips the prev-logprob forward: "
              f"{skips_prev_logprob_forward(cfg)}; linear parameters {body / 1e6:.1f}M + output "
              f"{head / 1e6:.1f}M; load average {os.getloadavg()[0]:.2f}", flush=True)
        ours, base = [], []
        for i in range(args.warmup_steps + args.steps):
            t0 = time.perf_counter()
            s.begin_step(i)
            m = grpo_step(s, loss, i)
            total = time.perf_counter() - t0
            tp = plain.step() if plain is not None else None
            if i < args.warmup_steps:
                continue
            tm = phases = {k.removeprefix("timing/train/"): v for k, v in m.items() if k.startswith("timing/train/")}
            gen_tokens = m["train/mean_gen_tokens_per_sample"] * m["train/num_samples"]
            training = tm.get("advantages", 0.0) + tm.get("policy_training", 0.0)
            body_flops, head_flops = 6.0 * body * m["train/total_num_tokens"], 6.0 * head * gen_tokens
            flops = body_flops + head_flops
            ours.append({"generation": tm.get("generation", 0.0), "logprobs": tm.get("logprobs", 0.0),
                         "training": training, "generated_tokens": gen_tokens, "total": total,
                         "training_gflops": flops / training / 1e9, "head_share": head_flops / flops,
                         "token_mult_prob_error": m.get("train/token_mult_prob_error", float("nan"))})
            line = f"step {i - args.warmup_steps + 1}: rlplane {total:.2f} s ({split(ours[-1])})"
            if tp is not None:
                base.append(tp)
                line += f", plain loop {tp['total']:.2f} s ({split(tp)})"
            print(f"{line}; training {ours[-1]['training_gflops']:.1f} GFLOP/s (load {os.getloadavg()[0]:.2f})",
                  flush=True)
        tokens_per_micro = cfg.policy.train_micro_batch_size * cfg.policy.max_total_sequence_length
        shape = (tokens_per_micro, w.model.config.hidden_size, w.model.config.intermediate_size)
        limit = matmul_limit(dtype or torch.float32, *shape)
        fp32_limit = matmul_limit(torch.float32, *shape) if dtype == torch.bfloat16 else limit
        s.close()
    report(model_key, args, ours, base, phases, limit, dtype, fp32_limit)


def report(model_key, args, ours, base, phases, limit, dtype, fp32_limit) -> None:
    def med(rows, k):
        return statistics.median(r[k] for r in rows)

    cols = "   rlplane    plain loop" if base else "   rlplane"
    print(f"{model_key}: median of {args.steps} steps (seconds){cols}")
    for k in ("generation", "logprobs", "training", "total"):
        print(f"  {k:28s} {med(ours, k):8.2f}" + (f"    {med(base, k):8.2f}" if base else ""))
    print(f"  generated tokens/step (median)  {med(ours, 'generated_tokens'):8.0f}"
          + (f"    {med(base, 'generated_tokens'):8.0f}" if base else ""))
    print("  generation tokens/s (median)    "
          f"{statistics.median(r['generated_tokens'] / r['generation'] for r in ours):8.1f}"
          + (f"    {statistics.median(r['generated_tokens'] / r['generation'] for r in base):8.1f}" if base else ""))
    print(f"  rlplane's timing/train/* (last step, s): {', '.join(f'{k} {v:.2f}' for k, v in phases.items())}; "
          f"rlplane token_mult_prob_error (median): {med(ours, 'token_mult_prob_error'):.4f}")
    achieved = med(ours, "training_gflops")
    print(f"  training phase: {achieved:.1f} GFLOP/s achieved (median) of a {limit:.1f} GFLOP/s "
          f"{'bf16' if dtype == torch.bfloat16 else 'fp32'} matmul limit measured now: {achieved / limit:.0%}")
    if dtype == torch.bfloat16:  # rlplane computes the lm_head in fp32: the limit of that mix of FLOPs
        share = med(ours, "head_share")
        mixed = 1.0 / ((1.0 - share) / limit + share / fp32_limit)
        print(f"  with the output projection's {share:.0%} of the FLOPs at the fp32 limit ({fp32_limit:.1f} GFLOP/s) "
              f"as rlplane runs it: a {mixed:.1f} GFLOP/s limit, {achieved / mixed:.0%} of it")
    if base:
        print(f"ratio rlplane / plain loop: {med(ours, 'total') / med(base, 'total'):.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2", help="comma list of: " + ", ".join(MODELS))
    ap.add_argument("--steps", type=int, default=3, help="timed steps of each (medians)")
    ap.add_argument("--warmup-steps", type=int, default=1, help="untimed steps of each first "
                                                                "(lazy AdamW state, caches)")
    ap.add_argument("--no-plain", action="store_true", help="time rlplane only (no plain transformers loop)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    for model_key in args.models.split(","):
        if model_key not in MODELS:
            ap.error(f"--models: {model_key!r} is not one of {', '.join(MODELS)}")
        run_model(model_key, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
