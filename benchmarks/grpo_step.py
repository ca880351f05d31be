"""rlplane's GRPO step against a minimal hand-written loop doing the same work (the floor).

Both start from the same weights and do, per step: draw 32 prompts, sample 8 responses each
(same decode loop, same sampling settings), score them, compute group baselines and advantages,
a no-grad forward for the old-policy logprobs, a forward+backward with the clipped loss, grad
clipping and one AdamW step. rlplane additionally moves every column through its data plane,
shards by DP rank, computes its loss diagnostics and per-phase timings; that is what the ratio
measures. Steps are interleaved (rlplane, floor, rlplane, ...) so machine noise hits both alike.

    python benchmarks/grpo_step.py [--steps 40] [--warmup-steps 5] [KEY=VALUE overrides...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from rlplane.config.loading import load_config  # noqa: E402
from rlplane.data.arithmetic import ArithmeticDataset, ArithmeticSpec  # noqa: E402
from rlplane.envs import create_env  # noqa: E402
from rlplane.generation.hf import HFGenerationBackend  # noqa: E402
from rlplane.models.configured import load_configured_policy  # noqa: E402
from rlplane.recipes.grpo import grpo_step  # noqa: E402
from rlplane.training import Session  # noqa: E402
from rlplane.workers.logprobs import token_logprobs  # noqa: E402
from rlplane.workers.policy import ClippedPGLoss  # noqa: E402


class FloorLoop:
    """The least code that does one GRPO step of the same shape."""

    def __init__(self, cfg, init_state):
        self.cfg = cfg
        self.model, self.tok = load_configured_policy(cfg.policy, cfg.loop.seed)
        self.model.load_state_dict(init_state)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.policy.optimizer.lr, weight_decay=0.0)
        self.gen = HFGenerationBackend(self.model, self.tok)
        self.rng = torch.Generator().manual_seed(cfg.grpo.seed)
        a = cfg.data.arithmetic
        spec = ArithmeticSpec(operators=tuple(a.operators), operand_min=a.min_operand, operand_max=a.max_operand)
        self.data = ArithmeticDataset(self.tok, spec, num_problems=cfg.data.num_train_samples, seed=cfg.grpo.seed)
        self.env = create_env("arithmetic")
        self.cursor = 0

    def step(self):
        cfg, g = self.cfg, self.cfg.grpo
        n, G = g.num_prompts_per_step, g.num_generations_per_prompt
        datums = [self.data[(self.cursor + i) % len(self.data)] for i in range(n)]
        self.cursor += n
        prompts = [d.prompt_token_ids for d in datums for _ in range(G)]
        out = self.gen.generate(prompts, max_new_tokens=cfg.policy.generation.max_new_tokens, temperature=1.0,
                                generator=self.rng)
        texts = self.tok.batch_decode(out.output_ids, skip_special_tokens=True)
        logs = [[*d.message_log, {"role": "assistant", "content": t}] for d,
                t in zip([d for d in datums for _ in range(G)], texts)]
        rewards = torch.as_tensor(self.env.step(logs, [d.extra_env_info for d in datums for _ in range(G)]).rewards,
                                  dtype=torch.float32).view(n, G)
        # Leave-one-out baseline and std, as in rlplane's default.
        base = (rewards.sum(1, keepdim=True) - rewards) / (G - 1)
        sq = (rewards**2).sum(1, keepdim=True) - rewards**2
        var = (sq - (G - 1) * base**2) / max(G - 2, 1)
        std = var.clamp_min(0).sqrt()
        adv = (rewards - base) / torch.where(std > 0, std + 1e-6, torch.ones_like(std))
        adv = adv.view(-1)
        seqs = [list(p) + list(o) for p, o in zip(prompts, out.output_ids)]
        T = max(map(len, seqs))
        ids = torch.zeros(len(seqs), T, dtype=torch.long)
        attn = torch.zeros_like(ids)
        mask = torch.zeros(len(seqs), T)
        for i, (p, s) in enumerate(zip(prompts, seqs)):
            ids[i, : len(s)] = torch.tensor(s)
            attn[i, : len(s)] = 1
            mask[i, len(p) : len(s)] = 1
        with torch.no_grad():
            self.model.eval()
            old = token_logprobs(self.model, ids, attn, 1.0)[:, 1:]
            self.model.train()
        cur = token_logprobs(self.model, ids, attn, 1.0)[:, 1:]
        m = mask[:, 1:]
        ratio = torch.exp(cur - old)
        loss = torch.max(-adv[:, None] * ratio, -adv[:, None] * ratio.clamp(0.8, 1.2))
        loss = (loss * m).sum() / m.sum()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="timed steps of each")
    ap.add_argument("--warmup-steps", type=int, default=5, help="untimed steps of each first")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, ["warmup.enabled=false", "checkpointing.enabled=false", "logger.progress_bar=false",
                                 "logger.tensorboard_enabled=false", f"run_dir={tmp}", *args.overrides])
        s = Session(cfg, quiet=True)
        s.start()
        loss = ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference)
        floor = FloorLoop(cfg, s.workers.policy.workers[0].get_weights())
        ours, base, phases = [], [], []
        for i in range(args.warmup_steps + args.steps):
            t0 = time.perf_counter()
            m = grpo_step(s, loss, i)
            t1 = time.perf_counter()
            floor.step()
            t2 = time.perf_counter()
            if i >= args.warmup_steps:
                ours.append(t1 - t0)
                base.append(t2 - t1)
                phases.append({k: v for k, v in m.items() if k.startswith("timing/train/")})
        s.close()
    mo, mb = statistics.median(ours), statistics.median(base)
    print(f"load average: {os.getloadavg()[0]:.2f}; {args.steps} timed steps each, interleaved; "
          f"{cfg.grpo.num_prompts_per_step}x{cfg.grpo.num_generations_per_prompt} samples/step")
    print(f"rlplane GRPO step (runtime local, data plane {cfg.data_plane.backend}): median {mo * 1e3:.1f} ms")
    print(f"hand-written floor loop:                                median {mb * 1e3:.1f} ms")
    print(f"ratio rlplane / floor: {mo / mb:.3f}")
    print("rlplane phase breakdown (median ms):")
    for k in phases[0]:
        print(f"  {k:40s} {statistics.median(p[k] for p in phases) * 1e3:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
