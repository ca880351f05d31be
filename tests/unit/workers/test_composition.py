"""The workers are compositions of building blocks: no base class, no inherited methods a worker cannot
use, model loading below the workers, and a trainer block whose global-batch loop is tested on its own."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rlplane
from rlplane.config.loading import load_config
from rlplane.training.plan import policy_options, teacher_plan, value_options
from rlplane.workers.packing import MicroBatch
from rlplane.workers.policy import PolicyWorker
from rlplane.workers.rank import DPRank
from rlplane.workers.teacher import TeacherWorker
from rlplane.workers.trainer import Trainer
from rlplane.workers.value import ValueWorker


@pytest.mark.parametrize("cls", [PolicyWorker, ValueWorker, TeacherWorker])
def test_workers_inherit_nothing(cls):
    assert cls.__bases__ == (object,)


def test_the_teacher_offers_only_what_a_frozen_scorer_can_do():
    for method in ("train", "get_weights", "set_weights", "setup_distributed", "shard_models"):
        assert not hasattr(TeacherWorker, method), method
    assert {"compute_logprobs", "save", "load", "ping", "placement"} <= set(dir(TeacherWorker))


@pytest.mark.parametrize("module", ["workers/policy.py", "workers/value.py", "workers/teacher.py", "workers/rank.py",
                                    "workers/trainer.py", "workers/scorer.py", "models/configured.py"])
def test_workers_and_model_loading_never_name_the_run_config(module):
    assert "RunConfig" not in (Path(rlplane.__file__).parent / module).read_text(encoding="utf-8")


def test_model_loading_does_not_import_the_workers():
    code = ("import sys, rlplane.models.lora, rlplane.models.configured; "
            "print([m for m in sys.modules if m.startswith('rlplane.workers')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_options_are_built_from_the_run_config():
    cfg = load_config(None, ["warmup.enabled=false", "loss_fn.reference_policy_kl_penalty=0.05"])
    o = policy_options(cfg)
    assert (o.policy, o.seed, o.reference) == (cfg.policy, cfg.loop.seed, True)
    assert not policy_options(load_config(None, ["loss_fn.reference_policy_kl_penalty=0"])).reference
    distill = load_config("distill_arithmetic", ["teacher.model_name=embedded:tiny-llama"])
    teacher = teacher_plan(distill).options.policy
    assert teacher.model_name == distill.teacher.model_name and teacher.tiny == distill.teacher.tiny
    assert teacher.model_copy(update={"model_name": "", "tiny": None}) == distill.policy.model_copy(
        update={"model_name": "", "tiny": None})  # otherwise the student's section
    ppo = load_config("ppo_arithmetic", [])
    assert value_options(ppo).value == ppo.value
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.seed = 1


def _trained_linear(micro_batch_size: int) -> dict[str, torch.Tensor]:
    """One Trainer step of a (T → T) linear 'model' on 4 rows, the loss a token mean over the global batch."""
    cfg = load_config(None, ["policy.max_grad_norm=null"])
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3)
    trainer = Trainer(model, cfg.policy.optimizer, cfg.policy.scheduler,
                      DPRank("test", cfg.policy, None, rank=0, world_size=1, shared_paths=None))
    x = torch.arange(12.0).reshape(4, 3) / 10  # (B, T)
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]])

    def loss(out, batch, sample_mask, global_toks, _global_seqs):
        value = (out.square() * batch["mask"]).sum() / global_toks
        return value, {}

    def plan(rows):
        return [MicroBatch(rows[i: i + micro_batch_size]) for i in range(0, len(rows), micro_batch_size)]

    metrics = trainer.train_global_batches(mask, torch.ones(4), 4, plan, None, lambda mb: model(x[mb.rows]), loss,
                                           {"mask": mask})
    assert metrics["global_valid_toks"] == 8.0 and metrics["grad_norm"] > 0
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_trainer_step_does_not_depend_on_the_micro_batch_cut():
    whole, halves, singles = _trained_linear(4), _trained_linear(2), _trained_linear(1)
    for k in whole:
        torch.testing.assert_close(halves[k], whole[k], rtol=0, atol=1e-6)
        torch.testing.assert_close(singles[k], whole[k], rtol=0, atol=1e-6)
