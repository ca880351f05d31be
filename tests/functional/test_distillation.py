"""On-policy distillation end to end on the embedded tiny model (a few steps, small batches): the sampled reverse KL
(``loss_fn.kl_type: sampled_reverse``) and NeMo RL's KL over the teacher's top-k logits (forward, reverse, mixed)."""

from __future__ import annotations

import math

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.recipes.distillation import ReverseKLLoss, distillation_loss, distillation_step, train
from rlplane.training import Session
from rlplane.utils.logging import read_metrics

SMALL = [
    "distillation.num_prompts_per_step=8", "distillation.num_generations_per_prompt=4", "distillation.max_num_steps=2",
    "distillation.val_period=2", "distillation.max_val_samples=32", "distillation.val_batch_size=32",
    "policy.train_global_batch_size=32", "policy.train_micro_batch_size=16", "policy.logprob_batch_size=32",
    "logger.progress_bar=false", "logger.tensorboard_enabled=false", "checkpointing.save_period=2",
    "loss_fn.kl_type=sampled_reverse",
]


def small_cfg(tmp_path, *extra):
    return load_config("distill_arithmetic", [*SMALL, f"run_dir={tmp_path}", *extra])


def test_teacher_equal_to_student_gives_zero_reverse_kl(tmp_path):
    # Same shape, no warm-up, same seed: the teacher's weights are the student's, so on the student's
    # own tokens log π_T = log π_θ and the first step's sampled reverse KL is 0 (any misalignment of
    # teacher_logprobs with the student's logprobs would show here).
    cfg = small_cfg(tmp_path, "warmup.enabled=false", "teacher.warmup.enabled=false", "checkpointing.enabled=false",
                    "teacher.tiny.hidden_size=128", "teacher.tiny.num_heads=4", "teacher.tiny.intermediate_size=256")
    with Session(cfg, quiet=True) as s:  # the plan's teacher role: distillation has one
        s.start()
        m = distillation_step(s, ReverseKLLoss(), 0)
    assert abs(m["train/reverse_kl"]) < 1e-5
    assert m["train/grad_norm"] < 1e-5


@pytest.mark.parametrize("kl_type", ["forward", "reverse", "mixed"])
def test_top_k_kl_is_zero_when_the_teacher_is_the_student(tmp_path, kl_type):
    # As above, over the teacher's top 5 logits: equal models give equal logits at the same positions, so every
    # renormalised top-k KL is 0 (a column one position off would not be).
    cfg = small_cfg(tmp_path, "warmup.enabled=false", "teacher.warmup.enabled=false", "checkpointing.enabled=false",
                    "teacher.tiny.hidden_size=128", "teacher.tiny.num_heads=4", "teacher.tiny.intermediate_size=256",
                    f"loss_fn.kl_type={kl_type}", "distillation.topk_logits_k=5")
    with Session(cfg, quiet=True) as s:
        s.start()
        m = distillation_step(s, distillation_loss(cfg), 0)
    assert abs(m["train/distillation_kl"]) < 1e-6
    assert m["train/grad_norm"] < 1e-5


def test_top_k_distillation_trains_two_optimizer_steps_per_rollout(tmp_path):
    # NeMo RL's distillation_math takes two optimizer steps per rollout (64 of 128 samples each): the top-k KL allows
    # it, the teacher's top-k columns are read by both global batches.
    summary = train(small_cfg(tmp_path, "loss_fn.kl_type=mixed", "loss_fn.zero_outside_topk=true",
                              "distillation.topk_logits_k=8", "policy.train_global_batch_size=16",
                              "policy.train_micro_batch_size=8", "warmup.num_steps=10", "warmup.target_accuracy=null",
                              "teacher.warmup.num_steps=10", "teacher.warmup.target_accuracy=null",
                              "teacher.warmup.eval_every=10", "checkpointing.enabled=false"), quiet=True)
    rows = [r for r in read_metrics(tmp_path / "logs") if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["train/distillation_kl"]) and r["train/grad_norm"] > 0 for r in rows)
    assert summary["accuracy_after"] is not None


def test_distillation_trains_the_student_only_and_checkpoints_the_teacher(tmp_path):
    summary = train(small_cfg(tmp_path, "warmup.num_steps=10", "warmup.target_accuracy=null",
                              "teacher.warmup.num_steps=10", "teacher.warmup.target_accuracy=null",
                              "teacher.warmup.eval_every=10"), quiet=True)
    rows = [r for r in read_metrics(tmp_path / "logs") if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["train/reverse_kl"]) and r["train/grad_norm"] > 0 for r in rows)
    assert summary["accuracy_after"] is not None and summary["teacher_warmup"]["steps"] == 10
    step = tmp_path / "checkpoints" / "step_2"
    assert (step / "teacher" / "weights" / "model.safetensors").is_file()
    assert (step / "policy" / "optimizer.pt").is_file()


def test_distillation_resume_equals_straight_run(tmp_path):
    extra = ["warmup.num_steps=10", "warmup.target_accuracy=null", "teacher.warmup.num_steps=10",
             "teacher.warmup.target_accuracy=null", "teacher.warmup.eval_every=10", "checkpointing.save_period=1",
             "distillation.val_period=1"]  # split at 1: both runs validate there
    train(small_cfg(tmp_path / "straight", *extra, "distillation.max_num_steps=3"), quiet=True)
    train(small_cfg(tmp_path / "split", *extra, "distillation.max_num_steps=1"), quiet=True)
    train(small_cfg(tmp_path / "split", *extra, "distillation.max_num_steps=3", "checkpointing.resume=true"),
          quiet=True)

    def rows(d):
        return [{k: v for k,
                 v in r.items() if not k.startswith("timing/")} for r in read_metrics(d / "logs") if r["step"] > 0]

    a, b = rows(tmp_path / "straight"), rows(tmp_path / "split")
    assert len(a) == 3 and a == b
    torch.testing.assert_close(torch.tensor(a[-1]["train/reverse_kl"]), torch.tensor(b[-1]["train/reverse_kl"]))


@pytest.mark.slow
@pytest.mark.ray
def test_distillation_on_the_ray_runtime_with_the_driver_index_matches_the_store_actor(tmp_path, ray_session):
    """data_plane.index: auto gives distillation the driver-held index (its driver owns every key): the
    teacher's and the student's write-backs reach the driver's index, and 2 steps log the store actor's metrics."""
    # NeMo RL's top-k KL: the teacher's (T, k) columns travel through Ray's object store too.
    extra = ["runtime=ray", "data_plane.backend=ray", "warmup.num_steps=10", "warmup.target_accuracy=null",
             "teacher.warmup.num_steps=10", "teacher.warmup.target_accuracy=null", "teacher.warmup.eval_every=10",
             "checkpointing.enabled=false", "loss_fn.kl_type=mixed", "distillation.topk_logits_k=8"]
    a = train(small_cfg(tmp_path / "store", *extra, "data_plane.index=store"), quiet=True)
    b = train(small_cfg(tmp_path / "auto", *extra), quiet=True)

    def rows(d):
        return [{k: v for k, v in r.items() if not k.startswith("timing/")} for r in read_metrics(d / "logs")]

    assert rows(tmp_path / "auto") == rows(tmp_path / "store")
    assert len([r for r in rows(tmp_path / "auto") if r["step"] > 0]) == 2
    assert a["accuracy_after"] == b["accuracy_after"] is not None
