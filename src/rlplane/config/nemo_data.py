"""NeMo RL's ``data`` section read as rlplane's: datasets by registry name, hub id or local file.

A NeMo RL dataset entry (``data.train``, ``data.validation``, each filled in from ``data.default`` as NeMo RL
fills it) becomes an rlplane data source:

- a registry name (``OpenMathInstruct-2``, ``gsm8k``, ``AIME2024``, ...): ``data.dataset: registry``, the same
  hub copy, columns and answer extraction (``rlplane.data.registry``); ``data_path`` next to it names a local copy;
- ``ResponseDataset`` with ``data_path``: a JSONL file (``jsonl``), other files or a directory or a hub id (``hf``);
- a plain hub id as the name (``openai/gsm8k``): ``hf``, read through the Hugging Face cache;
- a multimodal or NeMo-Gym name, a dataset class by import path: refused in one line.

``processor``, ``prompt_file``, ``system_prompt_file`` and ``env_name`` become ``data.prompt`` and the rows'
task (the environment that scores them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlplane.config.nemo_translation import Translation
from rlplane.config.nemo_yaml import get_key
from rlplane.data.registry import ENTRIES, GYM, MULTIMODAL, RESPONSE_DATASET

# NeMo RL's keys of one dataset entry that rlplane reads itself; the rest are the registry dataset's options.
_GENERIC = ("dataset_name", "data_path", "input_key", "output_key", "subset", "split", "split_validation_size", "seed",
            "repeat", "prompt_file", "system_prompt_file", "processor", "env_name")
# The older flat layout (data.dataset_name, data.train_data_path, ...) and the per-entry sections.
_NEMO_KEYS = ("dataset_name", "train", "validation", "default", "prompt_file", "system_prompt_file", "train_data_path",
              "val_data_path", "input_key", "output_key", "split_validation_size", "train_split", "val_split",
              "add_system_prompt")
_MATH_PROCESSORS = ("math_hf_data_processor", "default")
_FILE_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".arrow", ".txt")


def _entries(data: dict) -> tuple[Any, Any, dict]:
    """(train entry or entries, validation entry or entries or None, default section) of either layout."""
    default = dict(data.get("default") or {})
    if "train" in data or "validation" in data:
        return data.get("train"), data.get("validation"), default
    flat = {k: data[k] for k in ("dataset_name", "input_key", "output_key", "split_validation_size", "prompt_file",
                                 "system_prompt_file") if k in data}
    train = {**flat, **({"data_path": data["train_data_path"]} if "train_data_path" in data else {})}
    val = {**flat, "data_path": data["val_data_path"]} if data.get("val_data_path") else None
    if "train_split" in data:
        train["split"] = data["train_split"]
    if val is not None and "val_split" in data:
        val["split"] = data["val_split"]
    return train or None, val, default


def _is_local(path: str) -> bool:
    return os.path.exists(path) or path.endswith(_FILE_SUFFIXES) or path.startswith(("/", "./", "../"))


def _source(t: Translation, where: str, cfg: dict) -> tuple[str, dict] | None:
    """(rlplane data kind, its ``data.train``-style section) of one NeMo RL dataset entry; None (refused) where
    rlplane cannot read it."""
    name, path = cfg.get("dataset_name"), cfg.get("data_path")
    task = {"default_task_name": cfg.get("env_name", "math")}
    held = {k: cfg[k] for k in ("split_validation_size", "seed", "repeat") if cfg.get(k) is not None}
    if name in MULTIMODAL or name in GYM:
        what = "a multimodal dataset (images, video or audio)" if name in MULTIMODAL else "NeMo-Gym's rows"
        t.refuse(f"{where}.dataset_name", name, f"{what}; rlplane trains text-only language models on its own "
                                                "environments: pick a text dataset or a JSONL file")
        return None
    if name in ENTRIES:
        options = {k: v for k, v in cfg.items() if k not in _GENERIC}
        out = {"name": name, **task, **held, **({"options": options} if options else {})}
        out.update({k: cfg[k] for k in ("subset", "split") if cfg.get(k) is not None})
        if path is not None:
            out["path"] = path  # a local copy of the hub dataset (or the file of a local-file entry)
        return "registry", out
    keys = {"problem_key": cfg.get("input_key", "input"), "answer_key": cfg.get("output_key", "output")}
    if name in (None, RESPONSE_DATASET) and path:
        split = {k: cfg[k] for k in ("subset", "split") if cfg.get(k) is not None}
        if str(path).endswith(".jsonl") and Path(path).is_file() and not split:
            return "jsonl", {"path": path, **keys, **task, **held}
        return "hf", {"path": path, **keys, **task, **held, **split}
    if isinstance(name, str) and "/" in name and "." not in name.split("/")[0]:  # a plain hub id: openai/gsm8k
        keys = {"problem_key": cfg.get("input_key", "problem"), "answer_key": cfg.get("output_key", "answer")}
        split = {k: cfg[k] for k in ("subset", "split") if cfg.get(k) is not None}
        return "hf", {"path": name, **keys, **task, **held, **split}
    if isinstance(name, str) and "." in name:
        t.refuse(f"{where}.dataset_name", name, "a NeMo RL dataset class by import path, which rlplane cannot run; "
                                                "save its rows as JSONL (data.dataset=jsonl) or register a processor "
                                                "function (data.prompt.processor=module:function)")
        return None
    t.refuse(f"{where}.dataset_name", name or path,
             f"not a NeMo RL dataset name rlplane knows ({', '.join(ENTRIES)}), a hub id (owner/name) or a "
             f"{RESPONSE_DATASET} with data_path; set one of them")
    return None


def _prompt(t: Translation, cfg: dict) -> None:
    """``processor``, ``prompt_file`` and ``system_prompt_file`` of NeMo RL's entry -> ``data.prompt``."""
    processor = cfg.get("processor", "math_hf_data_processor")
    # NeMo RL's math processor formats messages[0] with the prompt file: rlplane's `math` format with that template.
    t.put("data.prompt.processor", "math" if processor in _MATH_PROCESSORS else processor)
    if cfg.get("system_prompt_file"):
        t.put("data.prompt.system_prompt_file", cfg["system_prompt_file"])
    prompt = cfg.get("prompt_file")
    if prompt:
        if Path(prompt).is_file():
            t.put("data.prompt.prompt_file", prompt)  # NeMo RL's {} (and {{}} for a literal) read as such
        else:
            t.refuse("data.default.prompt_file", prompt, "no such file here (relative paths are relative to the "
                                                         "working directory, as in NeMo RL); give a path that exists "
                                                         "or set data.prompt.template")
    elif processor in _MATH_PROCESSORS:
        t.put("data.prompt.template", "{problem}")  # no prompt file: NeMo RL's processor keeps the problem as is


def translate_data(t: Translation) -> None:
    """NeMo RL's dataset keys -> ``data.dataset`` and its sources, or dropped with a note where rlplane's
    ``data.dataset`` is given."""
    data = get_key(t.tree, "data")
    if not isinstance(data, dict):
        return
    nemo_keys = [k for k in _NEMO_KEYS if k in data]
    nemo_keys = [k for k in nemo_keys if not (k in ("train", "validation") and isinstance(data[k], dict)
                                              and ("path" in data[k] or "name" in data[k]))]
    if not nemo_keys:
        return
    if "dataset" in data:
        for k in nemo_keys:
            data.pop(k)
        t.note(f"data.{{{', '.join(nemo_keys)}}}: NeMo RL's dataset keys, ignored: data.dataset = "
               f"{data['dataset']} is given")
        return
    if isinstance(get_key(t.tree, "env.sliding_puzzle_game"), dict):  # the game draws its own boards
        for k in nemo_keys:
            data.pop(k)
        t.put("data.dataset", "sliding_puzzle")
        t.note(f"data.{{{', '.join(nemo_keys)}}}: unused, as NeMo RL's run_grpo_sliding_puzzle.py leaves them: the "
               "boards are drawn by env.sliding_puzzle_game (data.dataset = sliding_puzzle; add_system_prompt, a "
               "chat-template argument, is not passed)")
        return
    train, val, default = _entries(data)
    for k in nemo_keys:
        data.pop(k)
    for where, entry in (("data.train", train), ("data.validation", val)):
        if isinstance(entry, list):
            t.refuse(where, [e.get("dataset_name") if isinstance(e, dict) else e for e in entry],
                     "rlplane reads one dataset per split; keep one entry (or merge the files into one JSONL)")
            return
    if not isinstance(train, dict):
        t.refuse("data.train", train, "NeMo RL's data.train names the training dataset; set data.train.dataset_name")
        return
    train = {**default, **train}  # NeMo RL fills each entry in from data.default
    got = _source(t, "data.train", train)
    val_got = _source(t, "data.validation", {**default, **val}) if isinstance(val, dict) else None
    if got is None or (isinstance(val, dict) and val_got is None):
        return
    kinds = {got[0]} | ({val_got[0]} if val_got else set())
    if kinds == {"jsonl", "hf"}:
        kinds = {"hf"}  # datasets reads JSONL too
    elif len(kinds) > 1:
        t.refuse("data.validation.dataset_name", val["dataset_name"] if "dataset_name" in val else val,
                 f"rlplane reads training and validation data the same way; the training set is a {got[0]} source, "
                 f"this is a {val_got[0]} one: use the same kind for both")
        return
    t.put("data.dataset", kinds.pop())
    t.put("data.train", got[1])
    if val_got:
        t.put("data.validation", val_got[1])
        for key in ("processor", "prompt_file", "system_prompt_file", "env_name"):
            if val.get(key, default.get(key)) != train.get(key):
                t.refuse(f"data.validation.{key}", val.get(key), f"differs from data.train.{key} = "
                                                                 f"{train.get(key)!r}; rlplane formats both the same "
                                                                 "way: make them equal (or set it in data.default)")
    _prompt(t, train)
