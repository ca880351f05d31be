"""The datasets of a run from ``data.*``: the training prompt loader and the held-out problems."""

from __future__ import annotations

from collections import defaultdict

from rlplane.config.data import DatasetOptions
from rlplane.data import (
    ArithmeticDataset,
    ArithmeticSpec,
    JsonlFields,
    PromptDataLoader,
    build_eval_set,
    read_jsonl_rows,
)
from rlplane.data.hf_files import read_hf_rows, read_registry_rows
from rlplane.data.processors import prompt_data_processor, resolve_processor, resolve_prompt_format
from rlplane.data.reasoning_gym import reasoning_gym_rows
from rlplane.data.registry import ENTRIES
from rlplane.data.splits import hold_out, repeated
from rlplane.data.tasks import AllTaskProcessedDataset, TaskDataSpec
from rlplane.envs import check_task_names
from rlplane.envs.user import register_user_tasks


def _task_spec(name: str, prompt_cfg, tokenizer, key: str):
    """(TaskDataSpec, processor) of one ``data.prompt`` / ``data.tasks.<name>`` entry."""
    _, fn = resolve_processor(prompt_cfg.processor, f"{key}.processor")
    return TaskDataSpec(name, prompt_file=prompt_cfg.prompt_file, system_prompt_file=prompt_cfg.system_prompt_file,
                        base_format=resolve_prompt_format(prompt_cfg, tokenizer, key)), fn


def task_processors(data, tokenizer):
    """(default TaskDataSpec, {task_name: (TaskDataSpec, processor)}) of ``data.prompt`` and ``data.tasks``."""
    default, default_fn = _task_spec("default", data.prompt, tokenizer, "data.prompt")
    table = {name: _task_spec(name, p, tokenizer, f"data.tasks.{name}") for name, p in data.tasks.items()}
    return default, defaultdict(lambda: (default, default_fn), table)


def held_out_size(data, source) -> float:
    """The source's ``split_validation_size``; null: the registry dataset's NeMo RL default, else 0."""
    if source.split_validation_size is not None:
        return source.split_validation_size
    entry = ENTRIES.get(source.name) if source.name is not None else None
    return entry.split_validation_size if entry is not None else 0.0


def build_datasets(options: DatasetOptions, tokenizer, *, train: bool = True):
    """(train loader or None with ``train=False``, held-out datums, stats) from ``data.*``; every task needs an env."""
    d = options.data
    register_user_tasks(options.env)  # user task names are known environments from here on
    max_prompt = options.max_prompt_length
    default_spec, processors = task_processors(d, tokenizer)
    # A processor function reads its rows' own fields: their problem/answer fields are then not required.
    reads_own_rows = any(resolve_processor(p.processor)[1] is not prompt_data_processor
                         for p in (d.prompt, *d.tasks.values()))
    fmt = default_spec.prompt_format
    stats: dict[str, int] = {"skipped_overlong": 0, "zero_loss_overlong": 0}
    train_ds = None

    def tokenized(rows, source):
        ds = AllTaskProcessedDataset(rows, tokenizer, default_spec, processors, max_seq_length=max_prompt,
                                     on_overlong=d.on_overlong_prompt, source=source)
        stats["skipped_overlong"] += ds.num_skipped_overlong
        stats["zero_loss_overlong"] += ds.num_zero_loss_overlong
        return ds

    if d.dataset == "arithmetic":
        a = d.arithmetic
        spec = ArithmeticSpec(operators=tuple(a.operators), operand_min=a.min_operand, operand_max=a.max_operand,
                             by_digits_share=a.by_digits_share, pad_operands=a.pad_operands)
        if train:
            train_ds = ArithmeticDataset(tokenizer, spec, num_problems=d.num_train_samples, seed=options.seed,
                                         max_prompt_length=max_prompt, prompt_format=fmt, task_name=a.task_name)
        val = build_eval_set(tokenizer, spec, num_problems=options.max_val_samples, prompt_format=fmt,
                             task_name=a.task_name)
    elif d.dataset == "reasoning_gym":
        r = d.reasoning_gym
        val_rows = reasoning_gym_rows(r.tasks, r.val_size, r.val_seed, r.config)
        val = list(tokenized(val_rows, "reasoning_gym held-out problems").datums)
        if train:
            held_out = {row["problem"] for row in val_rows}
            train_rows = reasoning_gym_rows(r.tasks, r.train_size, r.train_seed, r.config, exclude_questions=held_out)
            train_ds = tokenized(train_rows, "reasoning_gym training problems")
    elif d.dataset == "guess_number":
        from rlplane.envs.guess_number import GuessNumberDataset

        r = options.env.guess_number
        if train:
            train_ds = GuessNumberDataset(tokenizer, d.num_train_samples, low=r.low, high=r.high, seed=options.seed)
        val_ds = GuessNumberDataset(tokenizer, options.max_val_samples, low=r.low, high=r.high, seed=options.seed + 1)
        val = [val_ds[i] for i in range(len(val_ds))]
    elif d.dataset == "sliding_puzzle":
        from rlplane.envs.sliding_puzzle import SlidingPuzzleDataset

        game = options.env.sliding_puzzle_game.model_dump()
        if train:
            train_ds = SlidingPuzzleDataset(tokenizer, d.num_train_samples, seed=options.seed, prompt_format=fmt,
                                            **game)
        val_ds = SlidingPuzzleDataset(tokenizer, options.max_val_samples, seed=options.seed + 1, prompt_format=fmt,
                                      **game)
        val = [val_ds[i] for i in range(len(val_ds))]
    else:
        require = not reads_own_rows

        def rows(j, key: str) -> list[dict]:
            fields = JsonlFields(problem=j.problem_key, answer=j.answer_key, task_name=j.task_name_key,
                                 default_task_name=j.default_task_name)
            if j.name is not None:  # a registry dataset, beside files of the kind data.dataset names or alone
                return read_registry_rows(j, fields, key, require=require, max_rows=d.max_rows)
            if d.dataset == "hf":
                return read_hf_rows(j.path, fields, j.format, j.split or "train", subset=j.subset, key=key,
                                    max_rows=d.max_rows)
            return read_jsonl_rows(j.path, fields, require=require, max_rows=d.max_rows)

        # Validation: rows held out of the training source (NeMo RL's split_validation_size), then data.validation.
        size = held_out_size(d, d.train)
        train_rows, val_rows = None, []
        if train or size or d.validation is None:
            train_rows = rows(d.train, "data.train")
            if size:
                train_rows, val_rows = hold_out(train_rows, size, d.train.seed, "data.train.split_validation_size")
        if d.validation is not None:
            val_rows += repeated(rows(d.validation, "data.validation"), d.validation.repeat)
        train_source = f"dataset {d.train.name or d.train.path}"
        if train or not val_rows:
            train_ds = tokenized(repeated(train_rows, d.train.repeat), train_source)
            check_task_names((x.task_name for x in train_ds.datums), train_source)
        if val_rows:
            source = d.validation or d.train
            val_source = f"dataset {source.name or source.path}" + (" (held out)" if d.validation is None else "")
            val = list(tokenized(val_rows, val_source).datums)
            check_task_names((x.task_name for x in val), val_source)
        else:
            val = list(train_ds.datums[: options.max_val_samples])
        if not train:
            train_ds = None
    loader = None
    if train_ds is not None:
        loader = PromptDataLoader(train_ds, options.prompts_per_batch, seed=options.seed, shuffle=d.shuffle)
    return loader, val, stats
