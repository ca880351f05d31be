"""``task_name: short_answer``: word and number answers read where the reply ends, compared as text."""

import pytest
import torch

from rlplane.envs import create_env
from rlplane.envs.short_answer import ShortAnswerEnv
from tests.tiny import TINY_RUN


def _log(reply: str) -> list[dict]:
    return [{"role": "user", "content": "Which of these words names a fruit: knee, pear, saw?", "token_ids": [1]},
            {"role": "assistant", "content": reply, "token_ids": []}]


@pytest.mark.parametrize("reply, reference, reward", [
    ("The answer is pear.", "pear", 1.0),
    ("The answer is Pear", "pear", 1.0),          # case ignored
    ('The answer is "pear".', "pear", 1.0),       # quotes and the final period dropped
    ("pear", "Pear.", 1.0),                       # the reference is normalized the same way
    ("The answer is pears.", "pear", 0.0),        # text, not a substring: pears is not pear
    ("The answer is saw.", "pear", 0.0),
    ("Pear is a fruit.\nThe answer is knee.", "pear", 0.0),  # the last line counts
    ("There are 5 words.", "5", 1.0),             # no "answer is": the line's last number
    ("There are 5 words, not 6.", "5", 0.0),
    ("The answer is 5 words.", "5", 0.0),         # after "answer is" the whole rest is the answer
    ("", "pear", 0.0),
])
def test_reward(reply, reference, reward):
    out = ShortAnswerEnv().step([_log(reply)], [{"ground_truth": reference}])
    assert out.rewards.tolist() == [reward]
    assert out.terminateds.tolist() == [True]


def test_registered_and_batched():
    env = create_env("short_answer")
    out = env.step([_log("The answer is pear."), _log("knee")], [{"ground_truth": "pear"}, {"ground_truth": "pear"}])
    assert torch.equal(out.rewards, torch.tensor([1.0, 0.0]))
    assert out.answers == ["pear", "knee"]
    assert [o["content"] for o in out.observations] == ["Environment: correct", "Environment: incorrect"]


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="2 message logs for 1 metadata"):
        ShortAnswerEnv().step([_log("a"), _log("b")], [{"ground_truth": "a"}])


def test_jsonl_rows_route_to_it_in_a_run(tmp_path):
    """A JSONL run with ``task_name: short_answer`` rows trains and validates through this environment."""
    import json

    from rlplane.cli import main

    rows = [{"problem": f"{a}+{b}=", "answer": str(a + b), "task_name": "short_answer"}
            for a in range(4) for b in range(4)]
    for name in ("train", "val"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["train", "--quiet", *TINY_RUN, "data.dataset=jsonl", f"data.train.path={tmp_path / 'train.jsonl'}",
            f"data.validation.path={tmp_path / 'val.jsonl'}", f"run_dir={tmp_path / 'run'}", "grpo.max_num_steps=1",
            "grpo.val_at_start=true", "checkpointing.enabled=false"]
    assert main(argv) == 0
    metrics = [json.loads(line) for line in open(tmp_path / "run" / "logs" / "metrics.jsonl")]
    assert any("validation/env/short_answer/accuracy" in m for m in metrics), metrics[0].keys()
    assert any(m.get("train/env/short_answer/num_samples") == 4 for m in metrics)  # 2 prompts x 2 samples
