"""Per-task data processing (NeMo RL's TaskDataSpec / AllTaskProcessedDataset): processors chosen by
task_name, over-long prompts kept with loss_multiplier 0, and a zero multiplier taking a sample out of
the loss and of its token-mean count."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import torch

from rlplane.algorithms.losses import clipped_pg_loss
from rlplane.config.loading import load_config
from rlplane.data import DatasetError, DatumSpec
from rlplane.data.processors import register_processor
from rlplane.data.task_spec import nemo_template
from rlplane.data.tasks import AllTaskProcessedDataset, TaskDataSpec
from rlplane.datasets import build_datasets
from rlplane.models import build_char_tokenizer
from rlplane.workers.packing import MicroBatch
from rlplane.workers.rank import DPRank
from rlplane.workers.trainer import Trainer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def two_turn_processor(row, spec, tokenizer, max_seq_length, idx):
    """A processor of its own: a system and a user message, the row's weight as loss multiplier."""
    log = [{"role": role, "content": text, "token_ids": tokenizer(text, add_special_tokens=False)["input_ids"]}
           for role, text in (("system", spec.system_prompt or ""), ("user", spec.prompt_format.template.format(
               problem=row["question"])))]
    return DatumSpec(message_log=log, extra_env_info={"ground_truth": row["gold"], "unit": row["unit"]},
                     task_name=row["task_name"], idx=idx, length=sum(len(m["token_ids"]) for m in log),
                     loss_multiplier=float(row["weight"]))


def test_rows_dispatch_to_their_tasks_processor(tok):
    default = TaskDataSpec("arithmetic")
    physics = TaskDataSpec("physics", prompt="Q: {} A:", system_prompt="S")
    table = defaultdict(lambda: (default, _default_fn()), {"physics": (physics, two_turn_processor)})
    rows = [{"problem": "1+1=", "answer": "2", "task_name": "arithmetic"},
            {"question": "g?", "gold": "9.8", "unit": "m/s2", "weight": 0.5, "task_name": "physics"},
            {"messages": [{"content": "2+2="}, {"content": "4"}], "task_name": "math"}]
    table["math"] = (TaskDataSpec("math", prompt="Solve {}"), _math_fn())
    ds = AllTaskProcessedDataset(rows, tok, default, table)
    a, p, m = ds
    assert (a.task_name, a.ground_truth, a.loss_multiplier) == ("arithmetic", "2", 1.0)
    assert [x["role"] for x in p.message_log] == ["system", "user"] and p.message_log[1]["content"] == "Q: g? A:"
    assert p.loss_multiplier == 0.5 and p.extra_env_info == {"ground_truth": "9.8", "unit": "m/s2"}
    assert m.message_log[0]["content"] == "Solve 2+2=" and m.ground_truth == "4"
    assert [d.idx for d in ds] == [0, 1, 2]


def _default_fn():
    from rlplane.data.processors import prompt_data_processor

    return prompt_data_processor


def _math_fn():
    from rlplane.data.processors import math_hf_data_processor

    return math_hf_data_processor


def test_overlong_prompts_zero_loss_by_default_skip_or_error(tok):
    rows = [{"problem": "1+1=", "answer": "2", "task_name": "arithmetic"},
            {"problem": "123456+1=", "answer": "123457", "task_name": "arithmetic", "line": 2}]
    ds = AllTaskProcessedDataset(rows, tok, TaskDataSpec(), max_seq_length=8)
    short, long = ds
    assert short.loss_multiplier == 1.0 and short.length == 5
    # NeMo RL: kept, each message cut to min(4, max // messages) tokens, out of the loss.
    assert long.loss_multiplier == 0.0 and long.length == 4 and long.message_log[0]["token_ids"] == \
        tok("123456+1=")["input_ids"][:4]
    assert ds.num_zero_loss_overlong == 1 and ds.num_skipped_overlong == 0
    skipped = AllTaskProcessedDataset(rows, tok, TaskDataSpec(), max_seq_length=8, on_overlong="skip")
    assert len(skipped) == 1 and skipped.num_skipped_overlong == 1
    with pytest.raises(DatasetError, match=r"no prompts left \(1 of 1 longer than max_prompt_length = 8\)"):
        AllTaskProcessedDataset(rows[1:], tok, TaskDataSpec(), max_seq_length=8)  # only zero-loss ones: an error
    with pytest.raises(DatasetError, match=r"dataset, line 2: prompt is 10 tokens, over max_prompt_length = 8"):
        AllTaskProcessedDataset(rows, tok, TaskDataSpec(), max_seq_length=8, on_overlong="error")


def test_nemo_prompt_files_keep_their_literal_braces(tmp_path):
    cot = tmp_path / "cot.txt"
    cot.write_text("Output your answer inside of \\boxed{{}} tags.:\n{}\n\nLet's think step-by-step")
    spec = TaskDataSpec("math", prompt_file=str(cot))
    assert spec.prompt_format.template.format(problem="1+1") == (
        "Output your answer inside of \\boxed{} tags.:\n1+1\n\nLet's think step-by-step")
    assert nemo_template("{problem} {{}}") == "{problem} {{}}"
    with pytest.raises(DatasetError, match="needs a {problem}"):
        TaskDataSpec("t", prompt="no placeholder")


def test_config_tasks_pick_processors_and_prompts_per_task(tmp_path, monkeypatch):
    from rlplane.data import processors

    monkeypatch.setattr(processors, "DATA_PROCESSORS", dict(processors.DATA_PROCESSORS))
    register_processor("two_turn", two_turn_processor)
    rows = [{"problem": "1+1=", "answer": "2"},
            {"problem": "?", "answer": "x", "question": "g?", "gold": "9.8", "unit": "m/s2", "weight": 0,
             "task_name": "arithmetic_b"},
            {"problem": "9" * 600, "answer": "9"}]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    system = tmp_path / "sys.txt"
    system.write_text("Be exact.\n")
    cfg = load_config(None, ["grpo.num_prompts_per_step=1", "policy.train_global_batch_size=8",
                             "data.dataset=jsonl", f"data.train.path={data}", "data.prompt.template=Q {problem}",
                             "env.arithmetic_b.reward_fn=tests.unit.data.test_task_processing:exact",
                             "data.tasks.arithmetic_b.processor=two_turn",
                             f"data.tasks.arithmetic_b.system_prompt_file={system}"])
    assert cfg.data.on_overlong_prompt == "zero_loss"
    loader, val, stats = build_datasets(cfg.dataset_options(), build_char_tokenizer())
    plain, own, long = loader.dataset.datums
    assert plain.message_log[0]["content"] == "Q 1+1=" and plain.loss_multiplier == 1.0
    assert own.message_log[0]["content"] == "Be exact." and own.loss_multiplier == 0.0
    # the row's other fields reach the processor under extra_env_info (rlplane's reader keeps problem/answer)
    assert long.loss_multiplier == 0.0 and stats == {"skipped_overlong": 0, "zero_loss_overlong": 1}


def exact(prompt, completion, extra):
    return float(completion.strip() == extra["ground_truth"])


def test_a_zero_multiplier_sample_is_out_of_the_loss_and_its_count():
    """Hand-computed: token mean over the weighted samples only (NeMo RL's global_valid_toks =
    Σ token_mask·sample_mask), and the step equals the one without that sample."""
    tm = torch.tensor([[1.0, 1, 0], [1, 1, 1], [1, 1, 1]])
    adv = torch.tensor([1.0, 5.0, -1.5])[:, None].expand(3, 3)
    sm = torch.tensor([1.0, 0.0, 1.0])
    curr = torch.zeros(3, 3, requires_grad=True)
    loss, m = clipped_pg_loss(curr_logprobs=curr, advantages=adv, token_mask=tm, sample_mask=sm,
                              global_valid_tokens=(tm * sm[:, None]).sum(), global_valid_seqs=sm.sum(),
                              prev_logprobs=curr.detach(), generation_logprobs=curr.detach(),
                              reference_logprobs=curr.detach())
    assert loss.item() == pytest.approx(-(1 * 2 + -1.5 * 3) / 5)  # ratio 1: -Σ A·m / Σ m = 0.5
    loss.backward()
    assert torch.all(curr.grad[1] == 0) and float(m["num_valid_samples"]) == 2
    with_zero, tok_count = _trained(torch.tensor([0, 1, 2]), sm, tm)
    without, _ = _trained(torch.tensor([0, 2]), torch.ones(2), tm[[0, 2]])
    assert tok_count == 5.0
    for k in with_zero:
        torch.testing.assert_close(with_zero[k], without[k], rtol=0, atol=1e-7)


def _trained(rows, sample_mask, token_mask):
    cfg = load_config(None, ["policy.max_grad_norm=null"])
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3)
    trainer = Trainer(model, cfg.policy.optimizer, cfg.policy.scheduler,
                      DPRank("test", cfg.policy, None, rank=0, world_size=1, shared_paths=None))
    x = torch.arange(9.0).reshape(3, 3)[rows] / 10
    adv = torch.tensor([1.0, 5.0, -1.5])[rows][:, None].expand(-1, 3)

    def loss(out, batch, sm, toks, seqs):
        return clipped_pg_loss(curr_logprobs=out, advantages=batch["adv"], token_mask=batch["tm"], sample_mask=sm,
                               global_valid_tokens=toks, global_valid_seqs=seqs, prev_logprobs=out.detach(),
                               generation_logprobs=out.detach(), reference_logprobs=out.detach())

    metrics = trainer.train_global_batches(token_mask, sample_mask, len(rows), lambda r: [MicroBatch(r)], None,
                                           lambda mb: model(x[mb.rows]), loss, {"adv": adv, "tm": token_mask})
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics["global_valid_toks"]


def test_nemo_messages_rows_from_a_jsonl_file_through_math_hf_data_processor(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "2+2="}, {"role": "assistant",
                                                                                  "content": "4"}]}) + "\n")
    cfg = load_config(None, ["grpo.num_prompts_per_step=1", "policy.train_global_batch_size=8",
                             "data.dataset=jsonl", f"data.train.path={data}",
                             "data.prompt.processor=math_hf_data_processor", "data.prompt.template=Q {problem}"])
    loader, val, _ = build_datasets(cfg.dataset_options(), build_char_tokenizer())
    (d,) = loader.dataset.datums
    assert d.message_log[0]["content"] == "Q 2+2=" and d.ground_truth == "4" and d.task_name == "arithmetic"
    # the default processor on such a row: one line naming it
    with pytest.raises(DatasetError, match=r"line 1: task 'arithmetic': the row has no problem/answer"):
        AllTaskProcessedDataset([{"messages": [], "task_name": "arithmetic", "line": 1}], build_char_tokenizer(),
                                TaskDataSpec())
