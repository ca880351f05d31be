"""The session's warm-up: a short supervised stage (:mod:`rlplane.training.sft`) on the training prompts'
reference answers; ``rlplane sft`` runs it alone, distillation also for the teacher."""

from __future__ import annotations

import random
from collections.abc import Callable

from rlplane.config.schema import RunConfig
from rlplane.envs.demonstrations import warmup_examples
from rlplane.models.configured import load_configured_policy
from rlplane.training.prompts import Prompts
from rlplane.training.sft import supervised_warmup
from rlplane.workers.rollout import RolloutWorker


def warm_up(cfg: RunConfig, prompts: Prompts, say: Callable[[str], None]) -> tuple[dict, dict[str, float]]:
    """``(state_dict, result)``: the warmed-up weights and the warm-up's steps, accuracy and seconds."""
    # transformers' default attention: eager and SDPA round differently, moving where the warm-up stops.
    model, tok = load_configured_policy(cfg.policy.model_copy(update={"attn_implementation": None}), cfg.loop.seed)
    # Sample from the trained module itself (hf), whatever backend the run uses.
    gen_cfg = cfg.policy.generation.model_copy(update={"backend": "hf"})
    eval_cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"generation": gen_cfg})})
    evaluator = RolloutWorker(eval_cfg, None, model=model, tokenizer=tok, seed=cfg.loop.seed + 1)
    val = prompts.val_datums[: cfg.warmup.eval_samples]
    sft_rows = prompts.dataset
    rng = random.Random(cfg.loop.seed + 2)

    def batches(n: int):
        # (prompt, answer + eos) per problem; an env with a demonstration gives one example per turn.
        picks = [sft_rows[rng.randrange(len(sft_rows))] for _ in range(n)]
        examples = [ex for d in picks for ex in warmup_examples(d, tok, evaluator.env(d.task_name))]
        return [c for c, _ in examples], [t for _, t in examples]

    def evaluate() -> float:
        model.eval()
        _, carry, _ = evaluator.rollout(val, group_size=1, partition_id=None, greedy=True)
        return float(carry["rewards"].mean())

    say(f"supervised warm-up (target held-out accuracy {cfg.warmup.target_accuracy})")
    result = supervised_warmup(model, batches, cfg.warmup, evaluate, tok.pad_token_id, say)
    evaluator.close()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, result
