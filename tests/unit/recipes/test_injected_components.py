"""``rlplane.train`` with parts given as objects (NeMo RL's grpo_train arguments): a loss, an
environment object, a per-task dataset and a logger; two GRPO steps run with them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import rlplane
from rlplane.config.loading import ConfigError
from rlplane.data.tasks import AllTaskProcessedDataset, TaskDataSpec
from rlplane.envs import Environment, EnvironmentReturn
from rlplane.models import build_char_tokenizer
from rlplane.utils.logging import read_metrics
from rlplane.workers.policy import ClippedPGLoss
from tests.tiny import TINY_RUN

TINY = [*TINY_RUN, "grpo.max_val_samples=2", "grpo.val_batch_size=2", "checkpointing.enabled=false",
        "policy.generation.max_new_tokens=4"]


class EvenLength(Environment):
    """Reward 1 for a response of even length; counts the samples it scored."""

    def __init__(self):
        self.scored = 0

    def step(self, message_logs, metadata):
        self.scored += len(message_logs)
        rewards = torch.tensor([float(len(log[-1]["content"]) % 2 == 0) for log in message_logs])
        n = len(message_logs)
        return EnvironmentReturn([None] * n, list(metadata), None, rewards, torch.ones(n, dtype=torch.bool), None)


@dataclass(frozen=True)
class CountingLoss:
    """The recipe's clipped PG loss, counting its micro-batch calls (only the loss protocol: columns, call)."""

    inner: ClippedPGLoss
    calls: list

    def columns(self):
        return self.inner.columns()

    def __call__(self, *args):
        self.calls.append(1)
        return self.inner(*args)


class Logger:
    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step, prefix=""):
        self.rows.append((step, dict(metrics)))


def test_two_steps_with_an_injected_loss_environment_dataset_and_logger(tmp_path):
    from rlplane.algorithms.loss_options import ClippedPGOptions

    tok = build_char_tokenizer()
    rows = [{"problem": f"{i}+{i}=", "answer": str(2 * i), "task_name": "even"} for i in range(6)]
    dataset = AllTaskProcessedDataset(rows, tok, TaskDataSpec("even"))
    env, logger, calls = EvenLength(), Logger(), []
    loss = CountingLoss(ClippedPGLoss(ClippedPGOptions(reference_policy_kl_penalty=0.0), reference=False), calls)
    overrides = [*TINY, f"run_dir={tmp_path / 'run'}", "loss_fn.reference_policy_kl_penalty=0"]
    summary = rlplane.train(None, overrides=overrides, quiet=True, loss_fn=loss, task_to_env={"even": env},
                            dataset=dataset, logger=logger)
    assert env.scored == 2 * 4 + 2  # the very object scored 2 steps x 4 samples, then validation's 2 prompts
    assert len(calls) == 2  # one micro-batch per step
    steps = [r["step"] for r in read_metrics(tmp_path / "run" / "logs")]
    assert [s for s, _ in logger.rows] == steps and "train/reward" in logger.rows[0][1]
    assert summary["run_dir"] == str(tmp_path / "run")


def test_environment_objects_need_runtime_local_and_one_data_source():
    with pytest.raises(ConfigError, match=r"task_to_env\['even'\]: an environment object lives in this process"):
        rlplane.train(None, overrides=["runtime=ray", "data_plane.backend=ray"], task_to_env={"even": EvenLength()})
    with pytest.raises(ConfigError, match="give dataset or dataloader, not both"):
        rlplane.train(None, dataset=[], dataloader=object())
