"""Data processors, per task (NeMo RL's ``PROCESSOR_REGISTRY``): a :class:`PromptFormat` (a template with
``{problem}``, applied to ``{problem, answer}`` rows) or a function with NeMo RL's signature
``fn(row, task_data_spec, tokenizer, max_seq_length, idx) -> DatumSpec``. ``data.prompt.processor`` and
``data.tasks.<task>.processor`` pick one by name or ``module:function``; ``auto`` is ``instruct`` (the chat
template's user message) when the tokenizer has a chat template, else ``base`` (Question/Answer text)."""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerBase

from rlplane.data.datum import DatumSpec, PromptFormat, make_prompt_datum
from rlplane.data.errors import DatasetError

if TYPE_CHECKING:
    from rlplane.data.task_spec import TaskDataSpec

# (raw row, its task's TaskDataSpec, tokenizer, max prompt tokens or None, index) -> DatumSpec
DataProcessor = Callable[[dict, "TaskDataSpec", PreTrainedTokenizerBase, "int | None", int], DatumSpec]

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


def prompt_data_processor(row: dict, spec: TaskDataSpec, tokenizer: PreTrainedTokenizerBase,
                          max_seq_length: int | None, idx: int) -> DatumSpec:
    """A ``{"problem", "answer", "task_name"[, "extra_env_info"]}`` row through its task's prompt format."""
    if "problem" not in row or "answer" not in row:
        where = f"line {row['line']}: " if "line" in row else ""
        raise DatasetError(f"{where}task {row.get('task_name', spec.task_name)!r}: the row has no problem/answer "
                           f"(has: {', '.join(sorted(map(str, row)))}); give its task a processor function "
                           "(data.tasks.<task>.processor) or add the fields")
    return make_prompt_datum(str(row["problem"]), str(row["answer"]), tokenizer, idx=idx,
                             task_name=row.get("task_name", spec.task_name), prompt_format=spec.prompt_format,
                             extra_env_info=row.get("extra_env_info"))


def math_hf_data_processor(row: dict, spec: TaskDataSpec, tokenizer: PreTrainedTokenizerBase,
                           max_seq_length: int | None, idx: int) -> DatumSpec:
    """NeMo RL's row shape ``{"messages": [{"content": problem}, {"content": ground truth}], "task_name"}``."""
    messages = row["messages"]
    return prompt_data_processor({"problem": messages[0]["content"], "answer": messages[1]["content"],
                                  "task_name": row.get("task_name", spec.task_name)},
                                 spec, tokenizer, max_seq_length, idx)


DATA_PROCESSORS: dict[str, DataProcessor] = {"math_hf_data_processor": math_hf_data_processor}


def register_processor(name: str, processor: PromptFormat | DataProcessor) -> None:
    """Make ``processor: NAME`` resolve to ``processor``: a :class:`PromptFormat` or a processor function."""
    if isinstance(processor, PromptFormat):
        PROCESSORS[name] = processor
        DATA_PROCESSORS.pop(name, None)
    elif callable(processor):
        DATA_PROCESSORS[name] = processor
        PROCESSORS.pop(name, None)
    else:
        raise DatasetError(f"register_processor({name!r}, {processor!r}): give a PromptFormat or a function "
                           "(row, task_data_spec, tokenizer, max_seq_length, idx) -> DatumSpec")


def known_processors() -> list[str]:
    return sorted({*PROCESSORS, *DATA_PROCESSORS, AUTO_PROCESSOR})


def resolve_processor(name: str, key: str = "data.prompt.processor") -> tuple[PromptFormat | None, DataProcessor]:
    """``(its prompt format or None, the function)`` of processor ``name`` (a registered name or ``module:fn``)."""
    if name == AUTO_PROCESSOR:  # the format follows the tokenizer: resolve_prompt_format
        return PROCESSORS["instruct"], prompt_data_processor
    if name in PROCESSORS:
        return PROCESSORS[name], prompt_data_processor
    if name in DATA_PROCESSORS:
        return None, DATA_PROCESSORS[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        fn: Any = getattr(_import_user_module(module, f"{key} = {name!r}"), attr, None)
        if fn is None:
            raise DatasetError(f"{key} = {name!r}: {module} has no {attr!r}; check the name")
        if not callable(fn):
            raise DatasetError(f"{key} = {name!r}: not a function")
        return None, fn
    raise DatasetError(f"{key} = {name!r}: unknown processor; known: {', '.join(known_processors())} "
                       "(or module:function)")


PROCESSOR_IMPORT_TIMEOUT_S = 120.0  # importing a `module:function` processor: user code that runs at import


def _import_user_module(module: str, head: str):
    """``module`` (the working directory importable, as for user tasks), imported in a helper thread within
    :data:`PROCESSOR_IMPORT_TIMEOUT_S`: whatever it raises or exits with, or a hang, is one line."""
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["module"] = importlib.import_module(module)
        except BaseException as e:  # noqa: BLE001 - SystemExit too: said in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name=f"import {module}"[:60], daemon=True)
    thread.start()
    thread.join(PROCESSOR_IMPORT_TIMEOUT_S)
    if thread.is_alive():  # left behind: an import cannot be interrupted
        raise DatasetError(f"{head}: importing {module} did not finish within {PROCESSOR_IMPORT_TIMEOUT_S:g} s "
                           f"(PROCESSOR_IMPORT_TIMEOUT_S); it waits on something when imported (a server, input): "
                           "do that in the function instead")
    if "error" in box:
        e = box["error"]
        raise DatasetError(f"{head}: cannot import it ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    return box["module"]


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def resolve_prompt_format(prompt_cfg, tokenizer: PreTrainedTokenizerBase, key: str = "data.prompt") -> PromptFormat:
    """The :class:`PromptFormat` that ``prompt_cfg`` (``data.prompt`` or a ``data.tasks`` entry) asks for."""
    name = prompt_cfg.processor
    if name == AUTO_PROCESSOR:
        name = "instruct" if has_chat_template(tokenizer) else "base"
    base, _ = resolve_processor(name, f"{key}.processor")
    if prompt_cfg.chat_template == "auto":
        use_chat = has_chat_template(tokenizer) and name not in PLAIN_TEXT_PROCESSORS
    else:
        use_chat = bool(prompt_cfg.chat_template)
    if use_chat and not has_chat_template(tokenizer):
        raise DatasetError(
            f"{key}.chat_template = true, but the tokenizer has no chat template; set it to auto or false"
        )
    fmt = replace(base or PromptFormat(), use_chat_template=use_chat)
    if prompt_cfg.template is not None:
        if "{problem}" not in prompt_cfg.template:
            raise DatasetError(
                f"{key}.template = {prompt_cfg.template!r}: needs a {{problem}} placeholder"
            )
        fmt = replace(fmt, template=prompt_cfg.template)
    if prompt_cfg.system_prompt is not None:
        fmt = replace(fmt, system_prompt=prompt_cfg.system_prompt)
    return fmt
