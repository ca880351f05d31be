"""The SmolLM2 task preset: loads, reads answers leniently and scores exactly, one optimizer step per batch."""

from __future__ import annotations

from rlplane.config.loading import load_config


def test_smollm2_tasks_preset_loads_with_a_task_swapped_in():
    swap = ["data.reasoning_gym.tasks=[lcm]", "data.reasoning_gym.config={max_value: 12}"]
    cfg = load_config("grpo_smollm2_tasks", swap)
    assert cfg.data.reasoning_gym.tasks == ["lcm"] and cfg.data.reasoning_gym.config == {"max_value": 12}
    assert cfg.env.reasoning_gym.answer_format == "lenient" and not cfg.env.reasoning_gym.partial_credit
    samples = cfg.loop.num_prompts_per_step * cfg.loop.num_generations_per_prompt
    assert cfg.policy.train_global_batch_size == samples
    assert samples % cfg.policy.train_micro_batch_size == 0
