"""The datasets of a run from ``data.*``: the training prompt loader and the held-out problems."""

from __future__ import annotations

from rlplane.config.data import DatasetOptions
from rlplane.data import (
    ArithmeticDataset,
    ArithmeticSpec,
    JsonlFields,
    PromptDataLoader,
    PromptDataset,
    build_eval_set,
    read_jsonl_rows,
)
from rlplane.data.hf_files import read_hf_rows
from rlplane.data.processors import resolve_prompt_format
from rlplane.data.reasoning_gym import reasoning_gym_rows
from rlplane.envs import check_task_names
from rlplane.envs.user import register_user_tasks


def build_datasets(options: DatasetOptions, tokenizer, *, train: bool = True):
    """(train loader or None with ``train=False``, held-out datums, stats) from ``data.*``; every task needs an env."""
    d = options.data
    register_user_tasks(options.env)  # user task names are known environments from here on
    max_prompt = options.max_prompt_length
    fmt = resolve_prompt_format(d.prompt, tokenizer)
    stats: dict[str, int] = {"skipped_overlong": 0}
    train_ds = None

    def tokenized(rows, source):
        ds = PromptDataset(rows, tokenizer, max_prompt_length=max_prompt, on_overlong=d.on_overlong_prompt,
                           prompt_format=fmt, source=source)
        stats["skipped_overlong"] += ds.num_skipped_overlong
        return ds

    if d.dataset == "arithmetic":
        a = d.arithmetic
        spec = ArithmeticSpec(operators=tuple(a.operators), operand_min=a.min_operand, operand_max=a.max_operand)
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
    else:
        def rows(j):
            fields = JsonlFields(problem=j.problem_key, answer=j.answer_key, task_name=j.task_name_key,
                                 default_task_name=j.default_task_name)
            if d.dataset == "hf":
                return read_hf_rows(j.path, fields, j.format, j.split)
            return read_jsonl_rows(j.path, fields)

        train_source = f"dataset {d.train.path}"
        if train or d.validation is None:
            train_ds = tokenized(rows(d.train), train_source)
            check_task_names((x.task_name for x in train_ds.datums), train_source)
        if d.validation is not None:
            val_source = f"dataset {d.validation.path}"
            val = list(tokenized(rows(d.validation), val_source).datums)
            check_task_names((x.task_name for x in val), val_source)
        else:
            val = list(train_ds.datums[: options.max_val_samples])
        if not train:
            train_ds = None
    loader = None
    if train_ds is not None:
        loader = PromptDataLoader(train_ds, options.prompts_per_batch, seed=options.seed, shuffle=d.shuffle)
    return loader, val, stats
