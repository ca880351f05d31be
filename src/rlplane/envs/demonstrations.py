"""Supervised warm-up examples from an environment's ``demonstration(prompt, metadata) -> [(response,
observation), ...]``: one (context, response) example per turn, eos only on the last; without one,
(prompt, ground truth + eos)."""

from __future__ import annotations

from rlplane.data.datum import DatumSpec


def warmup_examples(datum: DatumSpec, tokenizer, env) -> list[tuple[list[int], list[int]]]:
    eos = [tokenizer.eos_token_id]
    demo = getattr(env, "demonstration", None)
    turns = demo(datum.message_log[-1]["content"], datum.extra_env_info) if demo is not None else None
    if not turns:
        return [(datum.prompt_token_ids,
                 tokenizer(str(datum.ground_truth), add_special_tokens=False)["input_ids"] + eos)]
    examples, context = [], list(datum.prompt_token_ids)
    for k, (response, observation) in enumerate(turns):
        target = tokenizer(response, add_special_tokens=False)["input_ids"]
        if k == len(turns) - 1:
            target = target + eos
        examples.append((list(context), target))
        context += target
        if observation:
            context += tokenizer(observation, add_special_tokens=False)["input_ids"]
    return examples
