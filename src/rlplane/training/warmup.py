"""The session's warm-up: a short supervised stage (:mod:`rlplane.training.sft`) on the training prompts'
reference answers; ``rlplane sft`` runs it alone, distillation also for the teacher."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from rlplane.config.envs import EnvConfig
from rlplane.config.schema import WarmupConfig
from rlplane.envs.demonstrations import warmup_examples
from rlplane.models.configured import load_configured_policy
from rlplane.training.prompts import Prompts
from rlplane.training.sft import supervised_warmup
from rlplane.workers.environments import EnvBlock
from rlplane.workers.rollout import RolloutOptions, RolloutWorker


def warm_up(model_options: RolloutOptions, warmup: WarmupConfig, env: EnvConfig, prompts: Prompts,
            say: Callable[[str], None]) -> tuple[dict, dict[str, float]]:
    """``(state_dict, result)``: the warmed-up weights of ``model_options.policy`` (seeded by its ``seed``) and the
    warm-up's steps, accuracy and seconds; held-out accuracy is measured by rollouts as ``model_options`` runs
    them, through the ``env`` section's environments."""
    policy, seed = model_options.policy, model_options.seed
    # transformers' default attention: eager and SDPA round differently, moving where the warm-up stops.
    model, tok = load_configured_policy(policy.model_copy(update={"attn_implementation": None}), seed)
    # Sample from the trained module itself (hf), whatever backend the run uses.
    hf = policy.model_copy(update={"generation": policy.generation.model_copy(update={"backend": "hf"})})
    evaluator = RolloutWorker(dataclasses.replace(model_options, policy=hf), EnvBlock(env), None, model=model,
                              tokenizer=tok, seed=seed + 1)
    val = prompts.val_datums[: warmup.eval_samples]
    sft_rows = prompts.dataset
    rng = random.Random(seed + 2)

    def batches(n: int):
        # (prompt, answer + eos) per problem; an env with a demonstration gives one example per turn.
        picks = [sft_rows[rng.randrange(len(sft_rows))] for _ in range(n)]
        examples = [ex for d in picks for ex in warmup_examples(d, tok, evaluator.envs.get(d.task_name))]
        return [c for c, _ in examples], [t for _, t in examples]

    def evaluate() -> float:
        model.eval()
        _, carry, _ = evaluator.rollout(val, group_size=1, partition_id=None, greedy=True)
        return float(carry["rewards"].mean())

    say(f"supervised warm-up (target held-out accuracy {warmup.target_accuracy})")
    result = supervised_warmup(model, batches, warmup, evaluate, tok.pad_token_id, say)
    evaluator.close()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, result
