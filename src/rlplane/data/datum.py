"""``DatumSpec``: one prompt as the trainer sees it (NeMo RL's ``DatumSpec`` as a dataclass, ids as lists)."""

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

    message_log: the conversation so far; its messages' ``token_ids`` concatenated are the prompt.
    extra_env_info: what the environment needs to score it, e.g. ``{"ground_truth": "46"}``.
    task_name: routes the sample to an environment. idx: stable position in its dataset.
    length: total prompt tokens. loss_multiplier: 0 masks the sample out of the loss.
    stop_strings: extra per-sample stop strings (None: none).
    epoch: the pass that drew it; with ``idx`` it names the draw that seeds its samples.
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

    template: a format string with ``{problem}``. system_prompt: a system message with the chat template.
    use_chat_template: ``tokenizer.apply_chat_template`` (instruct models). add_special_tokens: the tokenizer's.
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
