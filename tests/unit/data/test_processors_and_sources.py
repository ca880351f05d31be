"""Data processors (prompt templates, chat templates) and the other prompt sources: HF `datasets`
local files, reasoning-gym tasks, and JSONL rows routed to several environments in one run."""

from __future__ import annotations

import json

import pytest

from rlplane.config.loading import load_config
from rlplane.data.errors import DatasetError
from rlplane.data.processors import MATH_COT_TEMPLATE, resolve_prompt_format
from rlplane.data.reasoning_gym import reasoning_gym_rows
from rlplane.datasets import build_datasets
from rlplane.envs import UnknownEnvironmentError
from rlplane.models import build_char_tokenizer


class _ChatTok:
    """The char tokenizer plus a minimal chat template (the embedded one has none)."""

    def __new__(cls):
        tok = build_char_tokenizer()
        tok.chat_template = (
            "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}"
        )
        return tok


def test_math_processor_template_and_chat_template_auto():
    cfg = load_config(None, ["data.prompt.processor=math", "data.prompt.system_prompt=Be brief."])
    plain = resolve_prompt_format(cfg.data.prompt, build_char_tokenizer())
    assert not plain.use_chat_template and plain.template == MATH_COT_TEMPLATE
    assert "\\boxed{}" in plain.template.format(problem="1+1")
    chat = resolve_prompt_format(cfg.data.prompt, _ChatTok())
    assert chat.use_chat_template and chat.system_prompt == "Be brief."


def test_processor_errors_are_one_line():
    tok = build_char_tokenizer()
    for overrides, fragment in [
        (["data.prompt.processor=nope"], "data.prompt.processor = 'nope': unknown processor; known: auto, base, "
                                           "default, instruct, math"),
        (["data.prompt.template=Question"], "needs a {problem} placeholder"),
        (["data.prompt.chat_template=true"], "the tokenizer has no chat template"),
    ]:
        with pytest.raises(DatasetError) as e:
            resolve_prompt_format(load_config(None, overrides).data.prompt, tok)
        assert fragment in str(e.value) and "\n" not in str(e.value)


def _cfg(*overrides, prompts=1):
    """A config whose batch fits a handful of rows, with room for long prompts."""
    return load_config(None, [f"grpo.num_prompts_per_step={prompts}", f"policy.train_global_batch_size={8 * prompts}",
                              "policy.max_total_sequence_length=512", *overrides])


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_rows_route_to_several_environments(tmp_path):
    f = _write_jsonl(tmp_path / "mixed.jsonl", [
        {"problem": "1+1=", "answer": "2"},  # no task_name: data.train.default_task_name
        {"problem": "2+2=", "answer": "4", "task_name": "math"},
        {"problem": "3+3=", "answer": "6", "task_name": "arithmetic"},
    ])
    cfg = _cfg("data.dataset=jsonl", f"data.train.path={f}")
    loader, val, _ = build_datasets(cfg.dataset_options(), build_char_tokenizer())
    assert [d.task_name for d in val] == ["arithmetic", "math", "arithmetic"]


def test_unknown_task_name_is_one_line_error(tmp_path):
    f = _write_jsonl(tmp_path / "bad.jsonl", [{"problem": "1+1=", "answer": "2", "task_name": "chess"}])
    cfg = _cfg("data.dataset=jsonl", f"data.train.path={f}")
    with pytest.raises(UnknownEnvironmentError) as e:
        build_datasets(cfg.dataset_options(), build_char_tokenizer())
    assert "task_name 'chess' has no environment" in str(e.value) and str(f) in str(e.value)


def test_hf_local_files_json_csv_parquet(tmp_path):
    pytest.importorskip("datasets", reason="needs the hf extra: pip install 'rlplane[hf]'")
    import datasets

    rows = [{"question": f"{i}+1=", "solution": str(i + 1)} for i in range(4)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    (tmp_path / "val.csv").write_text("question,solution\n5+1=,6\n7+1=,8\n")
    keys = ["data.train.problem_key=question", "data.train.answer_key=solution"]
    cfg = _cfg("data.dataset=hf", f"data.train.path={tmp_path / 'train.parquet'}", *keys,
               f"data.validation.path={tmp_path / 'val.csv'}", "data.validation.problem_key=question",
               "data.validation.answer_key=solution", prompts=2)
    loader, val, _ = build_datasets(cfg.dataset_options(), build_char_tokenizer())
    assert len(loader.dataset) == 4 and [d.ground_truth for d in val] == ["6", "8"]

    cfg = _cfg("data.dataset=hf", f"data.train.path={tmp_path / 'train.parquet'}", prompts=2)
    with pytest.raises(DatasetError) as e:
        build_datasets(cfg.dataset_options(), build_char_tokenizer())
    assert "no column 'problem' (columns: question, solution); set data.train.problem_key" in str(e.value)


def test_reasoning_gym_rows_are_seeded_and_held_out_disjoint():
    pytest.importorskip("reasoning_gym", reason="needs the reasoning extra: pip install 'rlplane[reasoning]'")
    cfg = _cfg("data.dataset=reasoning_gym", "data.reasoning_gym.train_size=50", "data.reasoning_gym.val_size=10",
               prompts=4)
    loader, val, _ = build_datasets(cfg.dataset_options(), build_char_tokenizer())
    assert len(val) == 10 and all(d.task_name == "reasoning_gym" for d in val)
    entry = val[0].extra_env_info["entry"]
    assert entry["metadata"]["source_dataset"] == "basic_arithmetic" and val[0].ground_truth == str(entry["answer"])
    held_out = {d.extra_env_info["entry"]["question"] for d in val}
    assert not held_out & {d.extra_env_info["entry"]["question"] for d in loader.dataset.datums}
    _, again, _ = build_datasets(cfg.dataset_options(), build_char_tokenizer(), train=False)
    assert [d.ground_truth for d in again] == [d.ground_truth for d in val]  # same seed, same problems


def test_reasoning_gym_with_every_training_problem_held_out_is_one_line():
    """count_bits up to 31 has 31 questions: 100 held-out problems take them all, none is left to train on."""
    pytest.importorskip("reasoning_gym", reason="needs the reasoning extra: pip install 'rlplane[reasoning]'")
    cfg = _cfg("data.dataset=reasoning_gym", "data.reasoning_gym.tasks=[count_bits]",
               "data.reasoning_gym.config={max_n: 31}", "data.reasoning_gym.val_size=100", prompts=4)
    with pytest.raises(DatasetError) as e:
        build_datasets(cfg.dataset_options(), build_char_tokenizer())
    assert str(e.value) == (
        "data.reasoning_gym: all 10000 training problems of count_bits are held-out questions too (the task's config "
        "allows few distinct questions); widen data.reasoning_gym.config or lower data.reasoning_gym.val_size")


def test_reasoning_gym_config_names_enum_members_as_yaml_writes_them():
    """aiw's task_types is a list of TaskType: the YAML strings become members, by value or name, any case."""
    pytest.importorskip("reasoning_gym", reason="needs the reasoning extra: pip install 'rlplane[reasoning]'")
    cfg = _cfg("data.dataset=reasoning_gym", "data.reasoning_gym.tasks=[aiw]", "data.reasoning_gym.train_size=20",
               "data.reasoning_gym.val_size=5",
               "data.reasoning_gym.config={task_types: [SIBLINGS], task_type_weights: [1.0]}", prompts=4)
    loader, val, _ = build_datasets(cfg.dataset_options(), build_char_tokenizer())
    rows = list(val) + list(loader.dataset.datums)
    assert {d.extra_env_info["entry"]["metadata"]["task_type"] for d in rows} == {"siblings"}
    # a sibling question's answer is the sisters named plus the girl herself
    assert all("How many sisters does" in d.extra_env_info["entry"]["question"] for d in rows)


def test_reasoning_gym_config_scalar_enum_field_and_other_values_pass():
    """word_sorting's transformation is one TextTransformation (not a list); its other keys are no Enum."""
    pytest.importorskip("reasoning_gym", reason="needs the reasoning extra: pip install 'rlplane[reasoning]'")
    from reasoning_gym.algorithmic.word_sorting import TextTransformation

    from rlplane.data.reasoning_gym import _typed_config

    typed = _typed_config("word_sorting", {"transformation": "Uppercase", "min_words": 3})
    assert typed == {"transformation": TextTransformation.UPPERCASE, "min_words": 3}
    assert _typed_config("word_sorting", {"transformation": TextTransformation.ORIGINAL})["transformation"] is (
        TextTransformation.ORIGINAL)
    assert _typed_config("no_such_task", {"x": "y"}) == {"x": "y"}  # create_dataset names the unknown task
    rows = reasoning_gym_rows(["word_sorting"], 3, 1, {"transformation": "uppercase"})
    words = rows[0]["problem"].rsplit(":", 1)[1]
    assert words.strip() == words.strip().upper()


@pytest.mark.parametrize("config, message", [
    ("{task_types: [cousins], task_type_weights: [1.0]}",
     "data.reasoning_gym.config.task_types: 'cousins' is not one of aiw's siblings, friends, colleagues; "
     "write one of them"),
    # one type but the default three weights: the task accepts the config, then fails at its first problem
    ("{task_types: [siblings]}",
     "data.reasoning_gym: aiw could not make its problems from data.reasoning_gym.config {'task_types': ['siblings']}"
     ": ValueError: The number of weights does not match the population; check the config against "
     "AliceInWonderlandConfig in reasoning_gym"),
])
def test_reasoning_gym_config_the_task_cannot_use_is_one_line(config, message):
    pytest.importorskip("reasoning_gym", reason="needs the reasoning extra: pip install 'rlplane[reasoning]'")
    cfg = _cfg("data.dataset=reasoning_gym", "data.reasoning_gym.tasks=[aiw]", "data.reasoning_gym.val_size=5",
               f"data.reasoning_gym.config={config}", prompts=4)
    with pytest.raises(DatasetError) as e:
        build_datasets(cfg.dataset_options(), build_char_tokenizer())
    assert str(e.value) == message


def test_reasoning_gym_env_scores_with_task_verifier():
    pytest.importorskip("reasoning_gym", reason="needs the reasoning extra: pip install 'rlplane[reasoning]'")
    from rlplane.envs import create_env
    from rlplane.verifiers.reasoning_gym_answer import extract_answer

    assert extract_answer("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert extract_answer("<answer> 12 </answer>") == "12"
    assert extract_answer("work\n\n  -129 ") == "-129"
    assert extract_answer("steps\nSo, the final answer is 12.\nThanks") == "12"
    assert extract_answer("The answer is: $-3.5$.") == "-3.5"
    cfg = _cfg("data.dataset=reasoning_gym", "data.reasoning_gym.val_size=2")
    _, val, _ = build_datasets(cfg.dataset_options(), build_char_tokenizer(), train=False)
    env = create_env("reasoning_gym", **cfg.env.env_kwargs("reasoning_gym"))
    try:
        gts = [d.ground_truth for d in val]
        logs = [[{"role": "assistant", "content": r}] for r in (f"\\boxed{{{gts[0]}}}", "\\boxed{0.123}")]
        ret = env.step(logs, [d.extra_env_info for d in val])
        assert ret.rewards.tolist() == [1.0, 0.0] and ret.answers[0] == gts[0]
    finally:
        env.close()


@pytest.mark.parametrize("processor, chat_tok, chat, template", [
    ("auto", False, False, "Question: {problem}\nAnswer:"),  # a base model: plain question/answer text
    ("auto", True, True, "{problem}"),  # an instruct model: the problem as the user's message
    ("base", True, False, "Question: {problem}\nAnswer:"),  # base text even where a chat template exists
    ("instruct", True, True, "{problem}"),
    ("instruct", False, False, "{problem}"),
])
def test_base_and_instruct_processors_follow_the_chat_template(processor, chat_tok, chat, template):
    cfg = load_config(None, [f"data.prompt.processor={processor}"])
    tok = _ChatTok() if chat_tok else build_char_tokenizer()
    fmt = resolve_prompt_format(cfg.data.prompt, tok)
    assert (fmt.use_chat_template, fmt.template) == (chat, template)


def test_base_processor_with_chat_template_forced_on():
    cfg = load_config(None, ["data.prompt.processor=base", "data.prompt.chat_template=true"])
    assert resolve_prompt_format(cfg.data.prompt, _ChatTok()).use_chat_template

