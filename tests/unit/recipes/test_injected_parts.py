"""``rlplane.train(policy=, policy_generation=, checkpointer=)`` as NeMo RL's ``grpo_train`` takes them: each a
wrapper of the run's own part here (recording its calls), so the run trains exactly as without it; an
object lacking a needed method is one line."""

from __future__ import annotations

import math

import pytest

import rlplane
from rlplane.errors import ConfigError
from rlplane.utils.logging import read_metrics
from tests.tiny import TINY_RUN

TINY = [*TINY_RUN, "grpo.max_val_samples=2", "grpo.val_batch_size=2", "policy.generation.max_new_tokens=4",
        "loss_fn.reference_policy_kl_penalty=0.01"]


class Recorder:
    """Forwards everything to the wrapped part and records the names of the methods called."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        value = getattr(self.inner, name)
        if not callable(value) or name.startswith("_"):
            return value

        def call(*args, **kwargs):
            self.calls.append(name)
            return value(*args, **kwargs)

        return call


def _train_rows(tmp_path, name, **parts):
    rlplane.train(None, overrides=[*TINY, f"run_dir={tmp_path / name}"], quiet=True, **parts)
    return [{k: v for k, v in r.items() if not k.startswith("timing/") and "seconds" not in k and "time" not in k}
            for r in read_metrics(tmp_path / name / "logs")]


def test_injected_policy_generation_and_checkpointer_wrap_the_runs_own(tmp_path):
    made = {}

    def wrap(name):
        return lambda built: made.setdefault(name, Recorder(built))

    injected = _train_rows(tmp_path, "injected", policy=wrap("policy"), policy_generation=wrap("generation"),
                           checkpointer=wrap("checkpointer"))
    plain = _train_rows(tmp_path, "plain")
    assert len(plain) == len(injected) == 2
    for a, b in zip(plain, injected):
        assert a.keys() == b.keys()
        for k, v in a.items():
            assert v == b[k] or (isinstance(v, float) and math.isclose(v, b[k], rel_tol=1e-6)), k
    # On-policy (one optimizer step per step): prev logprobs come from the training forward, no call.
    assert made["policy"].calls == ["get_reference_policy_logprobs_from_meta", "train_from_meta"] * 2
    assert made["generation"].calls.count("rollout") >= 2  # no weight push: local hf shares the module
    assert made["checkpointer"].calls.count("save") == 2 and "attach" in made["checkpointer"].calls
    assert sorted(p.name for p in (tmp_path / "injected" / "checkpoints").iterdir() if p.name.startswith("step"))


class NoTrain:
    def get_logprobs_from_meta(self, meta, micro_batch_size=None):
        pass

    def get_reference_policy_logprobs_from_meta(self, meta, micro_batch_size=None):
        pass


@pytest.mark.parametrize("parts, said", [
    ({"policy": NoTrain()}, "rlplane.train(policy=...): NoTrain has no train_from_meta; give an object with "
                            "get_logprobs_from_meta, get_reference_policy_logprobs_from_meta, train_from_meta, or a "
                            "function of the run's own policy"),
    ({"checkpointer": object()}, "rlplane.train(checkpointer=...): object has no check_resume, attach, restore, due, "
                                 "save; give an object with check_resume, attach, restore, due, save, or a function "
                                 "of the run's own checkpointer"),
    ({"policy_generation": lambda built: object()},
     "rlplane.train(policy_generation=...): object has no rollout, set_weight_version, update_weights; give an "
     "object with rollout, set_weight_version, update_weights, or a function of the run's own policy_generation"),
])
def test_a_part_lacking_a_needed_method_is_one_line(tmp_path, parts, said):
    with pytest.raises(ConfigError) as e:
        rlplane.train(None, overrides=[*TINY, f"run_dir={tmp_path / 'r'}"], quiet=True, **parts)
    assert str(e.value).strip().splitlines()[-1].strip().lstrip("- ") == said


class Counting:
    """Reward 1 for an even-length response; counts the samples it scored."""

    def __init__(self):
        self.scored = 0

    def step(self, message_logs, metadata):
        import torch

        from rlplane.envs import EnvironmentReturn

        self.scored += len(message_logs)
        n = len(message_logs)
        rewards = torch.tensor([float(len(log[-1]["content"]) % 2 == 0) for log in message_logs])
        return EnvironmentReturn([None] * n, list(metadata), None, rewards, torch.ones(n, dtype=torch.bool), None)


def test_val_task_to_env_objects_score_validation_apart(tmp_path):
    from rlplane.data.tasks import AllTaskProcessedDataset, TaskDataSpec
    from rlplane.models import build_char_tokenizer

    rows = [{"problem": f"{i}+{i}=", "answer": str(2 * i), "task_name": "even"} for i in range(6)]
    dataset = AllTaskProcessedDataset(rows, build_char_tokenizer(), TaskDataSpec("even"))
    train_env, val_env = Counting(), Counting()
    rlplane.train(None, overrides=[*TINY, f"run_dir={tmp_path / 'run'}", "checkpointing.enabled=false",
                                   "grpo.val_period=2"], quiet=True,
                  dataset=dataset, task_to_env={"even": train_env}, val_task_to_env={"even": val_env})
    assert train_env.scored == 2 * 4 and val_env.scored == 2  # 2 steps x 4 samples; one validation of 2 prompts
