"""Supervised examples from an environment's demonstration, for the warm-up that teaches a format.

An environment may define ``demonstration(prompt_text, metadata) -> [(response, observation), ...]``:
the conversation it wants, one pair per turn (the last observation is None). Each turn becomes one
(context ids, target ids) example: the context is the prompt and every earlier response and
observation, the target is that turn's response. Only the last response ends with eos: earlier
ones end where generation stops at a stop string (the tool call's closing tag). Environments
without a demonstration give the single-turn example (prompt, ground truth + eos).
"""

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
