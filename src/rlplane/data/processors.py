"""Data processors: how a problem string becomes a prompt, per task (NeMo RL's ``PROCESSOR_REGISTRY``);
``data.prompt.processor`` picks one, ``template`` and ``system_prompt`` override its parts. ``auto``: ``instruct``
(the chat template's user message) when the tokenizer has a chat template, else ``base`` (Question/Answer text)."""

from __future__ import annotations

from dataclasses import replace

from transformers import PreTrainedTokenizerBase

from rlplane.data.datum import PromptFormat
from rlplane.data.errors import DatasetError

# The math processor's chain-of-thought prompt: the answer in \boxed{}, which math-verify extracts first.
MATH_COT_TEMPLATE = (
    "Solve the following problem. Think step by step, then put your final answer within \\boxed{{}}.\n\n{problem}"
)

# A base model (no chat template) continues text: a question/answer frame it has seen in pretraining.
BASE_TEMPLATE = "Question: {problem}\nAnswer:"

PROCESSORS: dict[str, PromptFormat] = {
    "default": PromptFormat(),
    "math": PromptFormat(template=MATH_COT_TEMPLATE),
    "instruct": PromptFormat(),
    "base": PromptFormat(template=BASE_TEMPLATE),
}
# Processors whose text is written for a model without a chat template: chat_template auto means off.
PLAIN_TEXT_PROCESSORS = {"base"}
AUTO_PROCESSOR = "auto"


def register_processor(name: str, prompt_format: PromptFormat) -> None:
    """Make ``data.prompt.processor: NAME`` resolve to ``prompt_format``."""
    PROCESSORS[name] = prompt_format


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def resolve_prompt_format(prompt_cfg, tokenizer: PreTrainedTokenizerBase) -> PromptFormat:
    """The :class:`PromptFormat` that ``data.prompt`` (a ``PromptConfig``) asks for, for ``tokenizer``."""
    name = prompt_cfg.processor
    if name == AUTO_PROCESSOR:
        name = "instruct" if has_chat_template(tokenizer) else "base"
    base = PROCESSORS.get(name)
    if base is None:
        raise DatasetError(
            f"data.prompt.processor = {prompt_cfg.processor!r}: unknown processor; known: "
            f"{', '.join(sorted([*PROCESSORS, AUTO_PROCESSOR]))}"
        )
    if prompt_cfg.chat_template == "auto":
        use_chat = has_chat_template(tokenizer) and name not in PLAIN_TEXT_PROCESSORS
    else:
        use_chat = bool(prompt_cfg.chat_template)
    if use_chat and not has_chat_template(tokenizer):
        raise DatasetError(
            "data.prompt.chat_template = true, but the tokenizer has no chat template; set it to auto or false"
        )
    fmt = replace(base, use_chat_template=use_chat)
    if prompt_cfg.template is not None:
        if "{problem}" not in prompt_cfg.template:
            raise DatasetError(
                f"data.prompt.template = {prompt_cfg.template!r}: needs a {{problem}} placeholder"
            )
        fmt = replace(fmt, template=prompt_cfg.template)
    if prompt_cfg.system_prompt is not None:
        fmt = replace(fmt, system_prompt=prompt_cfg.system_prompt)
    return fmt
