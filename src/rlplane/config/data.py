"""The ``data`` section: which dataset (arithmetic, JSONL/HF files, reasoning-gym), splits, prompt format."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from rlplane.config.base import StrictModel
from rlplane.config.envs import EnvConfig
from rlplane.data.errors import DatasetError
from rlplane.data.registry_sources import registry_source


class ArithmeticDataConfig(StrictModel):
    """Procedurally generated `a+b=` problems."""

    operators: list[Literal["+", "-", "*"]] = Field(["+"], min_length=1, description="Operators to draw from.")
    min_operand: int = Field(0, ge=0, description="Smallest operand.")
    max_operand: int = Field(99, ge=0, description="Largest operand.")
    by_digits_share: float = Field(
        0.0, ge=0.0, le=1.0, description="Share of training operands drawn by digit count (the count first, "
        "uniformly, then the operand), the rest uniform over min..max: with 0..99, 0.5 makes one-digit operands "
        "30% of draws instead of 10%. Held-out problems stay uniform.")
    pad_operands: bool = Field(
        False, description="Write operands with leading zeros to the largest one's width (`07+42=`): a digit's "
        "place is then the same in every prompt, training and held-out alike. Answers are not padded.")
    task_name: str = Field("arithmetic", description="Environment that scores them (e.g. `calculator`: tool use).")

    @model_validator(mode="after")
    def _range(self) -> "ArithmeticDataConfig":
        if self.min_operand > self.max_operand:
            raise ValueError(
                f"min_operand = {self.min_operand} > max_operand = {self.max_operand}; swap them"
            )
        return self


class JsonlDataConfig(StrictModel):
    """One data source: a JSONL file (``dataset: jsonl``); files, or a Hugging Face hub dataset by id, read by
    ``datasets`` (``dataset: hf``); or one of NeMo RL's registry datasets by name (``dataset: registry``:
    ``rlplane.data.registry``, docs/nemo.md lists the names)."""

    path: str | None = Field(None, description="jsonl: the file; hf: a file, glob or directory of files, or a hub id "
                                               "(`openai/gsm8k`); with `name` (registry): a local copy of the "
                                               "dataset's hub repo or file (null: the hub copy through the Hugging "
                                               "Face cache).")
    name: str | None = Field(None, description="NeMo RL's dataset name (`gsm8k`, `OpenMathInstruct-2`, ...): the "
                                               "source is that registry dataset, whatever kind of files data.dataset "
                                               "names for the other split.")
    subset: str | None = Field(None, description="hf hub id: its config (subset) name (null: its default).")
    problem_key: str = Field("problem", description="Field holding the prompt text (registry rows: `problem`).")
    answer_key: str = Field("answer", description="Field holding the reference answer (registry rows: `answer`).")
    task_name_key: str = Field("task_name", description="Field routing a row to an environment.")
    default_task_name: str = Field("arithmetic", description="Environment of rows without a task_name field.")
    format: Literal["auto", "json", "parquet", "csv"] = Field(
        "auto", description="`hf` files only: file format (auto: from the extension)."
    )
    split: str | None = Field(None, description="hf / registry: the split to read (null: `train`, or the registry "
                                                "dataset's own default, e.g. OpenMathInstruct-2's `train_1M`).")
    split_validation_size: float | None = Field(
        None, ge=0, description="Hold out this fraction (< 1) or number (>= 1) of the source's rows as the "
        "validation set when data.validation is null, drawn as NeMo RL's train_test_split draws them (null: 0, or "
        "the registry dataset's NeMo RL default, e.g. 0.05 for OpenMathInstruct-2)."
    )
    seed: int = Field(42, description="Seed of the held-out draw (and of a registry dataset's own sampling).")
    repeat: int = Field(1, ge=1, description="Each row this many times, in order (NeMo RL's AIME `repeat`).")
    options: dict = Field(default_factory=dict, description="registry: the dataset's own options (NeMo RL's keyword "
                          "arguments: output_key, extract_answer, verifiable_only, max_samples, ...; docs/nemo.md).")


class ReasoningGymDataConfig(StrictModel):
    """Procedural reasoning-gym tasks (``pip install 'rlplane[reasoning]'``); scored by the task's own verifier."""

    tasks: list[str] = Field(["basic_arithmetic"], min_length=1, description="reasoning-gym dataset "
                                                                             "names, mixed evenly.")
    train_size: int = Field(10_000, ge=1, description="Training problems per task.")
    train_seed: int = Field(0, description="Seed of the training problems.")
    val_size: int = Field(100, ge=1, description="Held-out problems per task.")
    val_seed: int = Field(7, description="Seed of the held-out problems (must differ from train_seed).")
    config: dict = Field(default_factory=dict, description="Extra keyword arguments for every task (e.g. difficulty); "
                         "a field the task types as an Enum takes its value as a string (aiw: task_types: [siblings]).")

    @model_validator(mode="after")
    def _distinct_seeds(self) -> "ReasoningGymDataConfig":
        if self.train_seed == self.val_seed:
            raise ValueError(
                f"train_seed = val_seed = {self.val_seed}: the held-out "
                "problems would be training problems; use different seeds"
            )
        return self


class PromptConfig(StrictModel):
    """How a problem becomes a prompt: a data processor and the task's prompt (NeMo RL's ``TaskDataSpec``:
    ``data.prompt`` for every task, ``data.tasks.<task>`` for one)."""

    processor: str = Field(
        "default", description="`default` / `instruct` (the problem as is), `math` (chain-of-thought, answer in "
        "\\boxed{}), `base` (`Question: ... Answer:` text, no chat template), `auto` (instruct with a chat "
        "template, else base), `math_hf_data_processor` (NeMo RL's messages rows), a registered name or a "
        "`module:function` processor."
    )
    template: str | None = Field(None, description="Override the processor's template "
                                                   "(a format string with {problem}).")
    prompt_file: str | None = Field(None, description="Read the template from this file (NeMo RL's prompt_file: "
                                                      "{} or {problem} for the problem).")
    system_prompt: str | None = Field(None, description="System message (chat templates "
                                                        "only; null: the model's default).")
    system_prompt_file: str | None = Field(None, description="Read the system message from this file.")
    chat_template: Literal["auto"] | bool = Field(
        "auto", description="Render with the tokenizer's chat template: true, false, or auto (when it has one)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> "PromptConfig":
        for inline, path in (("template", "prompt_file"), ("system_prompt", "system_prompt_file")):
            if getattr(self, inline) is not None and getattr(self, path) is not None:
                raise ValueError(f"{inline} and {path} are both set; keep one")
        return self


class DataConfig(StrictModel):
    """Where prompts come from."""

    dataset: Literal["arithmetic", "jsonl", "hf", "registry", "reasoning_gym", "guess_number", "sliding_puzzle"] = (
        Field("arithmetic", description="Which dataset kind (registry: NeMo RL's datasets by name; guess_number: "
              "games over env.guess_number's range; sliding_puzzle: boards of env.sliding_puzzle_game)."))
    arithmetic: ArithmeticDataConfig = Field(default_factory=ArithmeticDataConfig, description="Procedural task.")
    train: JsonlDataConfig | None = Field(None, description="Training source (dataset: jsonl, hf or registry; "
                                                            "with `name`: that registry dataset).")
    validation: JsonlDataConfig | None = Field(None, description="Validation source (dataset: jsonl, hf or "
                                                                 "registry; with `name`: that registry dataset; null: "
                                                                 "held out of the training source).")
    reasoning_gym: ReasoningGymDataConfig = Field(
        default_factory=ReasoningGymDataConfig, description="Procedural reasoning-gym tasks (dataset: reasoning_gym)."
    )
    prompt: PromptConfig = Field(default_factory=PromptConfig, description="Prompt template and chat template.")
    tasks: dict[str, PromptConfig] = Field(
        default_factory=dict, description="Per task_name: its own processor and prompt (rows of other tasks use "
        "data.prompt)."
    )
    num_train_samples: int = Field(100_000, ge=1, description="Size of the procedural training stream.")
    max_rows: int | None = Field(
        2_000_000, ge=1, description="Most rows a data source (train or validation: a `jsonl` or `hf` file, a hub "
        "id, a registry dataset) may hold: each is tokenized and kept in memory at start-up; a source with more is "
        "an error naming it (null: no limit)."
    )
    shuffle: bool = Field(True, description="Shuffle each epoch.")
    on_overlong_prompt: Literal["zero_loss", "skip", "error"] = Field(
        "zero_loss", description="A prompt longer than policy.max_total_sequence_length: keep it with loss_multiplier "
        "0 and its messages cut to a few tokens (NeMo RL), skip and count it, or fail."
    )

    @model_validator(mode="after")
    def _files_need_paths(self) -> "DataConfig":
        if self.dataset in ("jsonl", "hf") and self.train is None:
            raise ValueError(f"dataset = {self.dataset} needs data.train.path; set data.train.path=FILE")
        if self.dataset == "registry" and self.train is None:
            raise ValueError("dataset = registry needs data.train.name; set data.train.name=NAME (e.g. gsm8k)")
        for key, source in (("train", self.train), ("validation", self.validation)):
            if source is None:
                continue
            if self.dataset == "registry" and source.name is None:
                raise ValueError(f"dataset = registry: data.{key}.name is not set; name a NeMo RL dataset "
                                 "(docs/nemo.md lists them), or for files set data.dataset to their kind (jsonl, hf): "
                                 "a named source beside them is still read by its name")
            if self.dataset in ("jsonl", "hf") and source.path is None and source.name is None:
                raise ValueError(f"dataset = {self.dataset}: data.{key}.path is not set; set data.{key}.path=FILE")
            if self.dataset not in ("jsonl", "hf", "registry") and (source.name is not None or source.options):
                raise ValueError(f"data.{key}.name / options name a registry dataset, which data.dataset = "
                                 f"{self.dataset} does not read; remove them or set data.dataset=registry")
            if source.options and source.name is None:
                raise ValueError(f"data.{key}.options are a registry dataset's; set data.{key}.name or remove them")
            if source.name is not None:  # its name, options and split: with the config, before any import
                try:
                    registry_source(source, f"data.{key}")
                except DatasetError as e:
                    raise ValueError(str(e)) from None
        return self


def task_names_of(data: DataConfig) -> list[str]:
    """The task names a run's data routes to, as far as the config says (file rows may name others)."""
    if data.dataset == "arithmetic":
        return [data.arithmetic.task_name]
    if data.dataset in ("reasoning_gym", "guess_number"):
        return [data.dataset]
    if data.dataset == "sliding_puzzle":
        return ["sliding_puzzle_game"]
    return [j.default_task_name for j in (data.train, data.validation) if j is not None]  # jsonl, hf, registry


@dataclass(frozen=True)
class DatasetOptions:
    """What :func:`rlplane.datasets.build_datasets` reads, cut from the run config by ``RunConfig.dataset_options``."""

    data: DataConfig
    env: EnvConfig  # user tasks are registered from it; guess_number's range; the sliding puzzle's boards
    seed: int  # the loop's seed: procedural problems and the loader's shuffle
    prompts_per_batch: int  # the loader's batch: num_prompts_per_step × batch_multiplier
    max_val_samples: int  # held-out problems
    max_prompt_length: int  # max_total_sequence_length - 1: room for at least one generated token
