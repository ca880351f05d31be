"""A run's datasets from the Hugging Face hub (``rlplane.datasets.build_datasets``), offline from local stand-ins of
the hub repos: a registry name, a plain hub id (``data.dataset=hf data.train.path=openai/gsm8k``, or NeMo RL's
``data.train.dataset_name: openai/gsm8k``), held-out validation rows drawn as NeMo RL draws them, ``repeat``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlplane.config.loading import load_config
from rlplane.data.errors import DatasetError
from rlplane.data.splits import held_out_split
from rlplane.datasets import build_datasets
from rlplane.models.tiny import build_char_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "nemo"))
from hub_standins import use_standins  # noqa: E402

ROWS = 40
UPSTREAM = Path(__file__).resolve().parents[2] / "fixtures" / "nemo" / "upstream"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    return use_standins(monkeypatch, tmp_path / "hf", ROWS, repos=["openai/gsm8k", "HuggingFaceH4/aime_2024"])


def datasets_of(*overrides):
    cfg = load_config(None, ["warmup.enabled=false", "grpo.max_val_samples=1000", "grpo.num_prompts_per_step=4",
                             "policy.max_total_sequence_length=256", "policy.train_global_batch_size=32", *overrides])
    loader, val, _ = build_datasets(cfg.dataset_options(), build_char_tokenizer())
    return loader, val


def answers(datums) -> list[str]:
    return [d.extra_env_info["ground_truth"] for d in datums]


def test_a_plain_hub_id_reads_its_columns(hub):
    loader, val = datasets_of("data.dataset=hf", "data.train.path=openai/gsm8k", "data.train.subset=main",
                              "data.train.problem_key=question", "data.train.answer_key=answer",
                              "data.train.default_task_name=math", "data.validation.path=openai/gsm8k",
                              "data.validation.subset=main", "data.validation.split=test",
                              "data.validation.problem_key=question", "data.validation.answer_key=answer",
                              "data.validation.default_task_name=math")
    assert len(loader.dataset) == ROWS and len(val) == ROWS
    assert all("\n#### " in a for a in answers(val))  # the answer column as is: a hub id has no extraction


def test_a_registry_name_holds_out_validation_rows_as_nemo_rl(hub):
    loader, val = datasets_of("data.dataset=registry", "data.train.name=gsm8k", "data.train.default_task_name=math",
                              "data.train.split_validation_size=0.25", "data.train.seed=7")
    train_idx, held_idx = held_out_split(ROWS, 0.25, 7)  # ceil(0.25 · 40) = 10 rows held out
    assert (len(loader.dataset), len(val)) == (30, 10)
    every = datasets_of("data.dataset=registry", "data.train.name=gsm8k", "data.train.default_task_name=math")[0]
    all_answers = answers(every.dataset.datums)
    assert answers(val) == [all_answers[i] for i in held_idx]
    assert answers(loader.dataset.datums) == [all_answers[i] for i in train_idx]


def test_repeat_and_a_validation_dataset_by_name(hub):
    _, val = datasets_of("data.dataset=registry", "data.train.name=gsm8k", "data.train.default_task_name=math",
                         "data.validation.name=AIME2024", "data.validation.repeat=3",
                         "data.validation.default_task_name=math")
    assert len(val) == 3 * ROWS and answers(val)[:ROWS] == answers(val)[ROWS:2 * ROWS]


def test_nemo_rl_names_a_plain_hub_id(hub, monkeypatch):
    monkeypatch.chdir(UPSTREAM)
    cfg = load_config("examples/configs/grpo_smoke.yaml", [
        "policy.model_name=embedded:tiny-llama", "data.train.dataset_name=openai/gsm8k", "data.train.subset=main",
        "data.train.input_key=question", "data.train.output_key=answer"])
    assert (cfg.data.dataset, cfg.data.train.path, cfg.data.train.problem_key) == ("hf", "openai/gsm8k", "question")


def test_an_uncached_hub_id_is_one_line(tmp_path, monkeypatch):
    use_standins(monkeypatch, tmp_path / "hf", ROWS, repos=[])
    with pytest.raises(DatasetError) as e:
        datasets_of("data.dataset=hf", "data.train.path=owner/missing")
    assert str(e.value) == (
        "data.train.path = 'owner/missing': owner/missing (split train) is not in the Hugging Face cache and the hub "
        "is offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE); fetch it with `hf download --repo-type dataset "
        "owner/missing`, or set data.train.path to a local copy")
