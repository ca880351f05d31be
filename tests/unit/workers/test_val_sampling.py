"""``policy.generation.val_temperature`` (NeMo RL's ``val_temperature``/``val_top_p``/``val_top_k``): validation
rollouts sample at it, as NeMo RL's validation does, instead of decoding greedily; unset, validation stays greedy."""

from __future__ import annotations

from rlplane.config.loading import load_config
from rlplane.dataplane import make_data_plane
from rlplane.datasets import build_datasets
from rlplane.models.configured import load_configured_policy
from tests.tiny import rollout_worker

COMMON = ["grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=2", "policy.train_global_batch_size=8",
          "data.num_train_samples=8", "policy.generation.max_new_tokens=6", "warmup.enabled=false"]


def responses(*overrides, greedy: bool):
    cfg = load_config(None, [*COMMON, *overrides])
    model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    dp = make_data_plane("memory")
    dp.register_partition("v", ["input_ids", "generation_logprobs", "token_mask"], 4)
    meta, _, _ = rollout_worker(cfg, dp, model=model, tokenizer=tok, seed=0).rollout(
        next(loader), group_size=1, partition_id="v", greedy=greedy, heldout=True)
    ids = dp.get_samples(meta, "v", ["input_ids"])["input_ids"]
    return [ids[r, : meta.seq_lens[r]].tolist() for r in range(len(ids))]


def test_validation_samples_at_val_temperature():
    greedy = responses(greedy=True)
    sampled = responses("policy.generation.val_temperature=2.0", greedy=True)  # validation asks for greedy answers
    # ... and gets samples at 2.0 from the held-out stream: those of a sampled held-out rollout at that temperature.
    assert sampled == responses("policy.generation.temperature=2.0", greedy=False)
    assert sampled != greedy
    assert responses(greedy=True) == greedy  # unset: greedy, every time
