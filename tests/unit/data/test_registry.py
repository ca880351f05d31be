"""NeMo RL's dataset registry by name (``rlplane.data.registry``), read offline from local stand-ins of the hub
copies (tests/fixtures/nemo/hub_standins.py: each repo as ``hf download`` leaves it in the hub cache, with its
real columns): the same hub id, subset, split, columns and answer extraction as NeMo RL's dataset classes."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from rlplane.data.errors import DatasetError
from rlplane.data.hub import load_rows
from rlplane.data.registry import ENTRIES, MULTIMODAL, Source, gsm8k_answer, registry_rows
from rlplane.data.splits import held_out_split, shuffled_indices

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "nemo"))
from hub_standins import use_standins  # noqa: E402

ROWS = 40


@pytest.fixture
def hub(tmp_path, monkeypatch):
    return use_standins(monkeypatch, tmp_path / "hf", ROWS)


def rows_of(name: str, **options) -> list[dict]:
    return registry_rows(Source(name, options), lambda c: load_rows(c, name, "data.train.path"), f"data.train.{name}")


def _sum(problem: str) -> str:
    a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", problem).groups())
    return str(a + b)


@pytest.mark.parametrize("name", ["OpenMathInstruct-2", "DAPOMath17K", "DAPOMathAIME2024", "DeepScaler", "GSM8K",
                                  "gsm8k", "AIME2024", "AIME2026", "OpenR1-Math-220k", "tulu3_sft_mixture"])
def test_math_entries_read_problem_and_answer_from_their_own_columns(hub, name):
    # Each stand-in row asks "What is a + b?" in the repo's problem column and holds a + b where NeMo RL reads the
    # answer: expected_answer, reward_model.ground_truth, `#### N` at the end of gsm8k's solution, an int column.
    rows = rows_of(name)
    assert len(rows) == ROWS
    for r in rows:
        assert r["answer"] == _sum(r["problem"]), r
        assert r["messages"] == [{"role": "user", "content": r["problem"]},
                                 {"role": "assistant", "content": r["answer"]}]


def test_gsm8k_answer_is_what_follows_the_hashes_or_all_of_it():
    assert gsm8k_answer("3 apples and 4 more\n#### 7") == "7"
    assert gsm8k_answer("no marker") is None
    assert gsm8k_answer("x #### 1,234 ") == "1,234"


def test_gsm8k_without_extraction_and_other_splits(hub):
    rows = rows_of("gsm8k", extract_answer=False, split="test", subset="socratic")
    assert rows[0]["answer"].endswith(f"#### {_sum(rows[0]['problem'])}")


def test_aime2025_reads_both_subsets_of_its_test_split(hub):
    rows = rows_of("AIME2025")
    assert len(rows) == 2 * ROWS  # AIME2025-I then AIME2025-II
    assert all(r["answer"] == _sum(r["problem"]) for r in rows)


def test_numina_keeps_verifiable_valid_rows(hub):
    # Stand-in row i: answer proof / notfound when i % 4 in (0, 1); a proof question when i % 5 == 0; problem marked
    # invalid when i % 7 == 3. Of i < 40 with i % 4 in (2, 3) (20 rows), 4 are proof questions (10, 15, 30, 35):
    # 16 verifiable; 3 of those are invalid (3, 31, 38): 13. Without require_valid 16; without verifiable_only the
    # 40 minus the 6 invalid (3, 10, 17, 24, 31, 38): 34.
    assert len(rows_of("NuminaMath-1.5")) == 13
    assert len(rows_of("NuminaMath-1.5", require_valid=False)) == 16
    assert len(rows_of("NuminaMath-1.5", verifiable_only=False)) == 34


def test_squad_is_system_context_user_question_assistant_answer(hub):
    r = rows_of("squad")[0]
    assert [m["role"] for m in r["messages"]] == ["system", "user", "assistant"]
    assert r["messages"][2]["content"] == _sum(r["messages"][1]["content"])
    assert r["problem"] == r["messages"][0]["content"]  # messages[0], as NeMo RL's math_hf_data_processor reads it


def test_open_assistant_threads_every_path_of_the_trees(hub):
    # Each stand-in tree: a prompt with two answers, the first with a follow-up and its answer: two threads.
    rows = rows_of("open_assistant")
    assert len(rows) == 2 * ROWS
    long, short = rows[0]["messages"], rows[1]["messages"]
    assert [m["role"] for m in long] == ["system", "user", "assistant", "user", "assistant"]
    assert [m["role"] for m in short] == ["system", "user", "assistant"]
    assert long[0]["content"].startswith("A chat between a curious user")


def test_helpsteer3_takes_the_preferred_response(hub):
    # Stand-in row i: response1 = a + b, response2 = a + b + 1, overall_preference = i % 3 - 1: -1 and 0 pick
    # response1, 1 picks response2.
    rows = rows_of("HelpSteer3")
    for i, r in enumerate(rows[:6]):
        right = _sum(r["problem"])
        assert r["answer"] == (right if i % 3 < 2 else str(int(right) + 1))


def test_multiple_choice_entries_letter_the_right_option(hub):
    for name in ("gpqa", "gpqa_diamond", "mmlu_pro"):
        for r in rows_of(name):
            assert r["options"][r["answer"]] == _sum(r["question"]), (name, r)
            assert r["problem"].startswith(f"Question: {r['question']}\nOptions:\nA) ")
    assert rows_of("gpqa") == rows_of("gpqa")  # the shuffled order is seeded


def test_max_samples_draws_after_a_seeded_shuffle(hub):
    every = rows_of("tulu3_sft_mixture")
    some = rows_of("tulu3_sft_mixture", max_samples=5, seed=3)
    assert some == [every[i] for i in shuffled_indices(ROWS, 3)[:5]]


def test_held_out_split_is_datasets_train_test_split():
    import datasets

    ds = datasets.Dataset.from_dict({"i": list(range(40))})
    for size, seed in ((0.05, 42), (0.25, 7), (3, 0), (3.0, 1)):
        want = ds.train_test_split(test_size=int(size) if size >= 1 else size, seed=seed)
        train, test = held_out_split(40, size, seed)
        assert (train, test) == (want["train"]["i"], want["test"]["i"])


def test_an_uncached_dataset_offline_is_one_line_with_the_fetch_command(tmp_path, monkeypatch):
    use_standins(monkeypatch, tmp_path / "hf", ROWS, repos=[])
    with pytest.raises(DatasetError) as e:
        registry_rows(Source("DeepScaler", {}), lambda c: load_rows(c, "data.train.name = 'DeepScaler'",
                                                                   "data.train.path"), "data.train")
    assert str(e.value) == (
        "data.train.name = 'DeepScaler': agentica-org/DeepScaleR-Preview-Dataset (split train) is not in the Hugging "
        "Face cache and the hub is offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE); fetch it with `hf download "
        "--repo-type dataset agentica-org/DeepScaleR-Preview-Dataset`, or set data.train.path to a local copy")


def test_a_local_copy_reads_with_the_entry_columns(hub, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    copy = tmp_path / "gsm8k_train.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "What is 1 + 2?", "answer": "1 and 2\n#### 3"}]), copy)
    rows = registry_rows(Source("gsm8k", {}, path=str(copy)), lambda c: load_rows(c, "x", "data.train.path"), "x")
    assert [(r["problem"], r["answer"]) for r in rows] == [("What is 1 + 2?", "3")]


@pytest.mark.parametrize("name", [*MULTIMODAL, "NemoGymDataset", "not-a-name"])
def test_multimodal_gym_and_unknown_names_are_one_line(name):
    with pytest.raises(DatasetError) as e:
        rows_of(name)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"data.train.{name} = {name!r}: ")


def test_options_a_dataset_does_not_take_and_splits_it_does_not_have():
    with pytest.raises(DatasetError, match=r"output_key: not an option of gsm8k \(its options: subset, split, "
                                           r"extract_answer\); remove it"):
        rows_of("gsm8k", output_key="x")
    with pytest.raises(DatasetError, match=r"split = 'test': OpenMathInstruct-2 has the splits train, train_1M"):
        rows_of("OpenMathInstruct-2", split="test")


def test_every_text_entry_of_nemo_rl_is_named():
    nemo = ["OpenMathInstruct-2", "DAPOMath17K", "DAPOMathAIME2024", "DeepScaler", "GSM8K", "gsm8k", "AIME2024",
            "AIME2025", "AIME2026", "NuminaMath-1.5", "OpenR1-Math-220k", "squad", "open_assistant",
            "tulu3_sft_mixture", "HelpSteer3", "openai_format", "general-conversation-jsonl", "arrow_text",
            "Nemotron-Cascade-2-SFT-Math", "math", "math500", "gpqa", "gpqa_diamond", "mmlu", "mmlu_pro"]
    assert not set(nemo) - set(ENTRIES)


def test_local_file_entries(tmp_path):
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    rows = registry_rows(Source("openai_format", {"system_prompt": "Be brief."}, path=str(chat)),
                         lambda c: load_rows(c, "x", "data.train.path"), "x")
    assert [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant"]
    conv = tmp_path / "conv.jsonl"
    conv.write_text('{"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]}\n')
    rows = registry_rows(Source("general-conversation-jsonl", {}, path=str(conv)),
                         lambda c: load_rows(c, "x", "data.train.path"), "x")
    assert (rows[0]["problem"], rows[0]["answer"]) == ("2+2?", "4")
    conv.write_text('{"conversations": [{"from": "human", "value": "<image> what?"}, {"from": "gpt", "value": "a"}]}\n')
    with pytest.raises(DatasetError, match="media tag"):
        registry_rows(Source("general-conversation-jsonl", {}, path=str(conv)),
                      lambda c: load_rows(c, "x", "data.train.path"), "x")
    text = tmp_path / "t.jsonl"
    text.write_text('{"text": "ab"}\n{"text": "cd"}\n{"text": "ef"}\n')
    rows = registry_rows(Source("arrow_text", {"characters_per_sample": 4}, path=str(text)),
                         lambda c: load_rows(c, "x", "data.train.path"), "x")
    assert [r["text"] for r in rows] == ["ab\ncd", "ef"]  # packed until 4 characters, then the rest
    with pytest.raises(DatasetError, match=r"openai_format reads a local file; set data.train.path=FILE"):
        registry_rows(Source("openai_format", {}), lambda c: [], "data.train")
