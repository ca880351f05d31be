"""One task's prompt spec (NeMo RL's ``TaskDataSpec``): its template and system prompt, inline or from files."""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

from rlplane.data.datum import PromptFormat
from rlplane.data.errors import DatasetError


def nemo_template(text: str) -> str:
    """A template in NeMo RL's form (``{}`` for the problem, ``{{}}`` a literal ``{}``) in rlplane's
    (``{problem}``); a template that already names ``{problem}`` is returned as is."""
    if "{problem}" in text:
        return text
    return re.sub(r"(?<!\{)\{\}(?!\})", "{problem}", text)


MAX_PROMPT_FILE_BYTES = 1 << 20  # a prompt template or system prompt; a model's whole context is far less


def _read(path: str, key: str) -> str:
    if os.path.exists(path) and not os.path.isfile(path):  # a directory, a FIFO (open would wait), a device
        raise DatasetError(f"{key} = {path!r}: not a regular file; name the prompt file itself")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PROMPT_FILE_BYTES + 1)
        if len(data) > MAX_PROMPT_FILE_BYTES:
            raise DatasetError(f"{key} = {path!r}: more than {MAX_PROMPT_FILE_BYTES:,} bytes, over "
                               f"MAX_PROMPT_FILE_BYTES = {MAX_PROMPT_FILE_BYTES:,}; a prompt file holds a template "
                               "with {} for the problem: is this the right file?")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{key} = {path!r}: cannot read it ({type(e).__name__}: {e})") from None


@dataclass
class TaskDataSpec:
    """One task's prompt: ``prompt`` (or ``prompt_file``'s text) a template with ``{problem}`` (or NeMo RL's
    ``{}``), ``system_prompt`` (or ``system_prompt_file``); they override ``base_format``."""

    task_name: str = "default"
    prompt_file: str | None = None
    system_prompt_file: str | None = None
    prompt: str | None = None
    system_prompt: str | None = None
    base_format: PromptFormat = field(default_factory=PromptFormat)

    def __post_init__(self):
        if self.prompt_file:
            self.prompt = _read(self.prompt_file, f"task {self.task_name!r} prompt_file")
        if self.system_prompt_file:
            self.system_prompt = _read(self.system_prompt_file, f"task {self.task_name!r} system_prompt_file").strip()
        if self.prompt is not None:
            self.prompt = nemo_template(self.prompt)
            if "{problem}" not in self.prompt:
                raise DatasetError(f"task {self.task_name!r}: prompt {self.prompt!r} needs a {{problem}} (or {{}}) "
                                   "placeholder")

    @property
    def prompt_format(self) -> PromptFormat:
        fmt = self.base_format
        if self.prompt is not None:
            fmt = dataclasses.replace(fmt, template=self.prompt)
        if self.system_prompt is not None:
            fmt = dataclasses.replace(fmt, system_prompt=self.system_prompt)
        return fmt
