"""``DatumSpec``: one prompt as the trainer sees it, with its message log and environment info.

Mirrors NeMo RL's ``DatumSpec`` (``reference/nemo_rl_notes.md`` §8) as a dataclass. Token ids are
plain ``list[int]`` (cheap to pickle, to ship through Ray and to pass to a generation backend).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

# A message: {"role": "system"|"user"|"assistant"|"environment", "content": str, "token_ids": list[int]};
# generation appends an assistant message that also carries "generation_logprobs".
Message = dict[str, Any]


@dataclass
class DatumSpec:
    """One prompt.

    message_log: the conversation so far; concatenating every message's ``token_ids`` gives the prompt.
    extra_env_info: what the environment needs to score it, e.g. ``{"ground_truth": "46"}``.
    task_name: routes the sample to an environment (``rlplane.envs.registry``).
    idx: position in its dataset (stable; used for grouping and debugging).
    length: total prompt tokens, ``sum(len(m["token_ids"]) for m in message_log)``.
    loss_multiplier: 0 masks the sample out of the loss, 1 keeps it.
    stop_strings: extra per-sample stop strings for generation (None: none).
    epoch: the pass over the training prompts that drew it (set by the loader; 0 elsewhere): with
        ``idx`` it names the draw, which seeds its samples (``rlplane.workers.rollout.sample_keys``).
    """

    message_log: list[Message]
    extra_env_info: dict[str, Any]
    task_name: str
    idx: int
    length: int
    loss_multiplier: float = 1.0
    stop_strings: list[str] | None = None
    epoch: int = 0

    @property
    def prompt_token_ids(self) -> list[int]:
        """All message token ids, concatenated in order: what the generator is fed."""
        return [t for m in self.message_log for t in m["token_ids"]]

    @property
    def ground_truth(self) -> Any:
        return self.extra_env_info.get("ground_truth")


@dataclass(frozen=True)
class PromptFormat:
    """How a problem string becomes prompt text and tokens.

    template: a format string with ``{problem}``; the default feeds the problem as is.
    system_prompt: prepended as a system message when ``use_chat_template`` is on.
    use_chat_template: render with ``tokenizer.apply_chat_template`` (instruct models); the
        embedded char-level tokenizer has no template and uses raw text.
    add_special_tokens: let the tokenizer add its special tokens (the embedded one adds ``<bos>``).
    """

    template: str = "{problem}"
    system_prompt: str | None = None
    use_chat_template: bool = False
    add_special_tokens: bool = True


def make_prompt_datum(
    problem: str,
    answer: str,
    tokenizer: PreTrainedTokenizerBase,
    *,
    idx: int,
    task_name: str,
    prompt_format: PromptFormat = PromptFormat(),
    extra_env_info: dict[str, Any] | None = None,
) -> DatumSpec:
    """Tokenize ``problem`` into a single-message ``DatumSpec`` whose ground truth is ``answer``."""
    text = prompt_format.template.format(problem=problem)
    if prompt_format.use_chat_template:
        messages = ([{"role": "system", "content": prompt_format.system_prompt}] if prompt_format.system_prompt else [])
        messages.append({"role": "user", "content": text})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # The template already holds the special tokens (bos, role markers): do not add them twice.
        token_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        token_ids = tokenizer(text, add_special_tokens=prompt_format.add_special_tokens)["input_ids"]
    info = {"ground_truth": answer}
    if extra_env_info:
        info.update(extra_env_info)
    return DatumSpec(
        message_log=[{"role": "user", "content": text, "token_ids": list(token_ids)}],
        extra_env_info=info,
        task_name=task_name,
        idx=idx,
        length=len(token_ids),
    )
