"""Data processors: how a problem string becomes a prompt, per task (NeMo RL's ``PROCESSOR_REGISTRY``);
``data.prompt.processor`` picks one, ``template`` and ``system_prompt`` override its parts."""

from __future__ import annotations

from dataclasses import replace

from transformers import PreTrainedTokenizerBase

from rlplane.data.datum import PromptFormat
from rlplane.data.errors import DatasetError

# The math processor's chain-of-thought prompt: the answer in \boxed{}, which math-verify extracts first.
MATH_COT_TEMPLATE = (
    "Solve the following problem. Think step by step, then put your final answer within \\boxed{{}}.\n\n{problem}"
)

PROCESSORS: dict[str, PromptFormat] = {
    "default": PromptFormat(),
    "math": PromptFormat(template=MATH_COT_TEMPLATE),
}


def register_processor(name: str, prompt_format: PromptFormat) -> None:
    """Make ``data.prompt.processor: NAME`` resolve to ``prompt_format``."""
    PROCESSORS[name] = prompt_format


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def resolve_prompt_format(prompt_cfg, tokenizer: PreTrainedTokenizerBase) -> PromptFormat:
    """The :class:`PromptFormat` that ``data.prompt`` (a ``PromptConfig``) asks for, for ``tokenizer``."""
    base = PROCESSORS.get(prompt_cfg.processor)
    if base is None:
        raise DatasetError(
            f"data.prompt.processor = {prompt_cfg.processor!r}: unknown processor; known: "
            f"{', '.join(sorted(PROCESSORS))}"
        )
    use_chat = has_chat_template(tokenizer) if prompt_cfg.chat_template == "auto" else bool(prompt_cfg.chat_template)
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
