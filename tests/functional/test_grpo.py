"""GRPO end to end on the embedded tiny model: a few steps, in both runtimes, resume, parity."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.recipes.grpo import train
from rlplane.utils.logging import read_metrics

SMALL = [
    "grpo.num_prompts_per_step=8",
    "grpo.num_generations_per_prompt=4",
    "policy.train_global_batch_size=32",
    "policy.train_micro_batch_size=16",
    "policy.logprob_batch_size=32",
    "grpo.max_num_steps=3",
    "grpo.val_period=2",
    "grpo.max_val_samples=32",
    "grpo.val_batch_size=32",
    "warmup.num_steps=30",
    "warmup.target_accuracy=null",
    "warmup.eval_every=30",
    "warmup.eval_samples=16",
    "logger.progress_bar=false",
    "logger.tensorboard_enabled=false",
    "checkpointing.save_period=2",
]


def small_cfg(tmp_path, *extra):
    return load_config(None, [*SMALL, f"run_dir={tmp_path}", *extra])


def _timings_free(rows):
    return [{k: v for k, v in r.items() if not k.startswith("timing/")} for r in rows]


def test_grpo_local_runs_and_logs_finite_metrics(tmp_path):
    summary = train(small_cfg(tmp_path), quiet=True)
    rows = read_metrics(tmp_path / "logs")
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        for key in ("train/loss", "train/reward", "train/token_mult_prob_error", "train/approx_entropy",
                    "train/grad_norm", "timing/train/generation", "timing/train/policy_training"):
            assert key in r and math.isfinite(r[key]), key
        # On-policy, fresh weights: generation and training logprobs agree.
        assert abs(r["train/token_mult_prob_error"] - 1.0) < 0.02
        # The sequence logprob-error statistics, without seq_logprob_error_threshold (from the loss).
        lo, mean, hi = (r[f"train/{k}_seq_mult_prob_error"] for k in ("min", "mean", "max"))
        assert 1.0 <= lo <= mean <= hi < 1.1
    assert "validation/accuracy" in steps[1] and summary["accuracy_after"] is not None
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["step_2", "step_3"]
    # The checkpoint is a plain HF model directory.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "step_3" / "policy" / "weights")
    assert model.num_parameters() > 0


def test_grpo_changes_every_parameter(tmp_path, first_digit_env):
    from rlplane.recipes.grpo import grpo_step
    from rlplane.training import Session
    from rlplane.workers.policy import ClippedPGLoss

    s = Session(small_cfg(tmp_path, "warmup.enabled=false"), quiet=True)
    try:
        s.start()
        loss = ClippedPGLoss(s.cfg.loss_fn.options(), reference=s.plan.needs_reference)
        before = {k: v.clone() for k, v in s.workers.policy.workers[0].model.named_parameters()}
        for step in range(2):
            grpo_step(s, loss, step)
        after = dict(s.workers.policy.workers[0].model.named_parameters())
        unchanged = [k for k in before if torch.equal(before[k], after[k])]
        assert unchanged == []
        # The step's keys were cleared.
        assert s.data_plane.list_samples("train") == []
    finally:
        s.close()


def test_memory_and_ray_data_planes_give_identical_metrics(tmp_path, ray_session):
    a = train(small_cfg(tmp_path / "mem", "data_plane.backend=memory"), quiet=True)
    b = train(small_cfg(tmp_path / "ray", "data_plane.backend=ray"), quiet=True)
    assert (_timings_free(read_metrics(tmp_path / "mem" / "logs"))
            == _timings_free(read_metrics(tmp_path / "ray" / "logs")))
    assert a["accuracy_after"] == b["accuracy_after"]


def test_split_run_equals_straight_run(tmp_path):
    straight = small_cfg(tmp_path / "straight", "grpo.max_num_steps=4", "checkpointing.save_period=2")
    train(straight, quiet=True)
    first = small_cfg(tmp_path / "split", "grpo.max_num_steps=2", "checkpointing.save_period=2")
    train(first, quiet=True)
    second = small_cfg(tmp_path / "split", "grpo.max_num_steps=4", "checkpointing.save_period=2",
                       "checkpointing.resume=true")
    train(second, quiet=True)
    rows_a = [r for r in _timings_free(read_metrics(tmp_path / "straight" / "logs")) if r["step"] > 0]
    rows_b = [r for r in _timings_free(read_metrics(tmp_path / "split" / "logs")) if r["step"] > 0]
    assert rows_a == rows_b


KILL_DURING_CHECKPOINT = textwrap.dedent(
    """
    import os, signal, sys
    from rlplane.utils import checkpoint
    from rlplane.config.loading import load_config
    from rlplane.recipes.grpo import train

    real_save = checkpoint.CheckpointManager.save

    def save(self, step, info, write):
        if step == int(os.environ["KILL_AT"]):
            def dying_write(tmp):
                write(tmp)                      # the weights are on disk, the rename has not happened
                os.kill(os.getpid(), signal.SIGKILL)
            return real_save(self, step, info, dying_write)
        return real_save(self, step, info, write)

    checkpoint.CheckpointManager.save = save
    train(load_config(None, sys.argv[1:]), quiet=True)
    """
)


def test_sigkill_during_checkpoint_write_resumes_from_last_complete(tmp_path):
    args = [*SMALL, f"run_dir={tmp_path}", "grpo.max_num_steps=4", "checkpointing.save_period=2"]
    env = {**os.environ, "KILL_AT": "4"}
    proc = subprocess.run([sys.executable, "-c", KILL_DURING_CHECKPOINT, *args], env=env, capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_2", "tmp_step_4"]
    summary = train(load_config(None, [*args, "checkpointing.resume=true"]), quiet=True)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_2", "step_4"]
    info = json.loads((tmp_path / "checkpoints" / "step_4" / "training_info.json").read_text())
    assert info["step"] == 4 and summary["accuracy_after"] is not None


@pytest.mark.slow
@pytest.mark.ray
def test_grpo_ray_runtime_two_policy_workers(tmp_path, ray_session):
    summary = train(
        small_cfg(tmp_path, "runtime=ray", "data_plane.backend=ray", "policy.dp_size=2", "grpo.max_num_steps=2"),
        quiet=True,
    )
    rows = [r for r in read_metrics(tmp_path / "logs") if r["step"] > 0]
    assert len(rows) == 2 and all(math.isfinite(r["train/loss"]) for r in rows)
    assert abs(rows[0]["train/token_mult_prob_error"] - 1.0) < 0.02
    assert summary["accuracy_after"] is not None


@pytest.mark.ray
def test_the_default_ray_grpo_session_keeps_the_data_plane_index_in_the_driver(tmp_path, ray_session, capsys):
    """data_plane.index: auto (the default) gives sync GRPO on the ray runtime the driver-held index
    (no store actor), and says so at start-up; `store` still gives the store actor."""
    from rlplane.dataplane.ray_index import DriverIndex, StoreIndex
    from rlplane.training import Session

    with Session(small_cfg(tmp_path / "auto", "runtime=ray", "data_plane.backend=ray")) as s:
        assert type(s.data_plane.placement) is DriverIndex
    said = capsys.readouterr().out  # the run plan's table
    assert re.search(r"\n  data plane +ray, index driver \(recipe grpo: the driver owns every key", said)
    with Session(small_cfg(tmp_path / "store", "runtime=ray", "data_plane.backend=ray", "data_plane.index=store"),
                 quiet=True) as s:
        assert type(s.data_plane.placement) is StoreIndex


@pytest.mark.slow
@pytest.mark.ray
def test_grpo_ray_runtime_with_the_data_plane_index_in_the_driver(tmp_path, ray_session):
    """data_plane.index: auto (here the driver's): the policy ranks read from the metas they are sent and
    return their logprob write-backs, which the driver's index takes; a 2-step run matches the store actor's."""
    args = ["runtime=ray", "data_plane.backend=ray", "policy.dp_size=2", "grpo.max_num_steps=2",
            "loss_fn.reference_policy_kl_penalty=0.01"]  # (reference logprobs: a second write-back per step)
    a = train(small_cfg(tmp_path / "store", *args, "data_plane.index=store"), quiet=True)
    b = train(small_cfg(tmp_path / "driver", *args), quiet=True)
    rows = _timings_free(read_metrics(tmp_path / "driver" / "logs"))
    assert rows == _timings_free(read_metrics(tmp_path / "store" / "logs"))
    assert len([r for r in rows if r["step"] > 0]) == 2 and a["accuracy_after"] == b["accuracy_after"]


def test_grpo_with_dapo_options_kl_and_masks(tmp_path, first_digit_env):
    """Dynamic sampling (refill from one-step batches, overflow slice), overlong filter, shaping, seq
    masking and a KL term together."""
    cfg = small_cfg(
        tmp_path, "warmup.enabled=false", "checkpointing.enabled=false", "grpo.max_num_steps=2",
        "grpo.val_at_start=false", "grpo.use_dynamic_sampling=true", "grpo.batch_multiplier=1",
        "grpo.overlong_filtering=true", "grpo.seq_logprob_error_threshold=2.0",
        "grpo.reward_shaping.enabled=true", "grpo.reward_shaping.stop_properly_penalty_coef=0.5",
        "loss_fn.reference_policy_kl_penalty=0.01", "loss_fn.ratio_clip_c=3",
    )
    train(cfg, quiet=True)
    rows = [r for r in read_metrics(tmp_path / "logs") if r["step"] > 0]
    assert len(rows) == 2
    for r in rows:
        assert r["train/dynamic_sampling_num_gen_batches"] >= 1
        assert r["train/num_samples"] == 32  # exactly the target after refills and the overflow slice
        assert r["train/global_valid_seqs"] <= 32  # truncated ones masked
        for key in ("train/kl_penalty", "train/max_seq_mult_prob_error", "train/loss"):
            assert math.isfinite(r[key]), key
