"""The session's parts take their own config section (or the values they need), never the whole run
config: each works from a section made by hand, and none of their modules names ``RunConfig``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rlplane
from rlplane.config.loading import load_config
from rlplane.config.logger import LoggerConfig
from rlplane.config.loops import GRPOConfig
from rlplane.config.schema import CheckpointingConfig
from rlplane.dataplane import KVBatchMeta
from rlplane.datasets import build_datasets
from rlplane.models import build_char_tokenizer
from rlplane.training.checkpoints import Checkpoints
from rlplane.training.rollouts import stamp_sample_mask, transform_rewards
from rlplane.training.runlog import RunLog
from rlplane.utils.run_dir import RunPaths

SRC = Path(rlplane.__file__).parent
# Below the recipes and the session: what remains with the whole config is the session itself, the
# warm-up and the worker groups (they build workers, which take it) and evaluate() (an entry point).
PARTS = ["datasets.py", "training/prompts.py", "training/runlog.py", "training/checkpoints.py", "training/loop.py",
         "training/rollouts.py", "training/advantages.py", "training/refit.py", "training/generators.py",
         "training/weight_check.py",
         "training/sft.py", "training/samples.py"]


@pytest.mark.parametrize("part", PARTS)
def test_a_part_never_names_the_run_config(part):
    assert "RunConfig" not in (SRC / part).read_text(encoding="utf-8")


def test_dataset_options_cut_the_loop_and_the_length_cap_from_the_run_config():
    cfg = load_config(None, ["grpo.num_prompts_per_step=4", "policy.train_global_batch_size=32",
                             "grpo.use_dynamic_sampling=true",
                             "grpo.batch_multiplier=3", "policy.max_total_sequence_length=20", "grpo.seed=7",
                             "grpo.max_val_samples=9"])
    o = cfg.dataset_options()
    assert (o.data, o.env, o.seed, o.prompts_per_batch, o.max_val_samples, o.max_prompt_length) == (
        cfg.data, cfg.env, 7, 12, 9, 19)  # 4 prompts x 3; 20 - 1 token left for the response
    loader, val, _ = build_datasets(o, build_char_tokenizer())
    assert len(next(iter(loader))) == 12 and len(val) == 9
    assert all(d.length <= 19 for d in val)


def test_checkpoints_are_due_every_save_period_and_at_the_last_step(tmp_path):
    def due(**section):
        ck = Checkpoints(CheckpointingConfig(**section), tmp_path, max_num_steps=7, config_yaml="a: 1\n", run_config={},
                         dp_size=1, fsdp=False)
        return [step for step in range(1, 8) if ck.due(step)]

    assert due(save_period=3) == [3, 6, 7]
    assert due(save_period=3, enabled=False) == []


def test_runlog_reads_its_logger_section(tmp_path):
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir=tmp_path / "checkpoints", log_dir=tmp_path / "logs")
    paths.log_dir.mkdir()
    log = RunLog(LoggerConfig(log_train_samples_every=2, tensorboard_enabled=False), paths, max_num_steps=4,
                 algorithm="grpo", run_config={"algorithm": "grpo"}, quiet=True)
    try:
        assert not log.train_samples_due()  # step 1 is run next
        log.log({"train/reward": 0.5}, step=1)
        assert log.train_samples_due()  # step 2 is run next: every 2nd
    finally:
        log.close()
    assert (paths.log_dir / "metrics.jsonl").is_file()


def test_transform_rewards_scales_then_shapes():
    loop = GRPOConfig(
        reward_scaling={"enabled": True, "source_min": 0.0, "source_max": 2.0, "target_min": 0.0, "target_max": 1.0},
        reward_shaping={"enabled": True, "overlong_buffer_length": 4, "overlong_buffer_penalty": 1.0,
                        "max_response_length": 16},
    )
    carry = {"rewards": torch.tensor([2.0, 2.0, 1.0]), "response_lengths": torch.tensor([10, 14, 16]),
             "truncated": torch.tensor([False, False, True])}
    scaled, shaped = transform_rewards(loop, 32, carry)  # the section's budget wins over the length cap
    # scaled: clamp(r, 0, 2) / 2 -> [1, 1, 0.5]
    assert scaled.tolist() == [1.0, 1.0, 0.5]
    # budget 16, buffer 4: no penalty up to 12 tokens, then -(L - 12)/4:
    # L = 10 -> 0; L = 14 -> -0.5; L = 16 -> -1  =>  [1, 0.5, -0.5]
    assert shaped.tolist() == [1.0, 0.5, -0.5]


def test_stamp_sample_mask_takes_the_overlong_filtering_flag():
    meta = KVBatchMeta(partition_id="train", task_name=None, sample_ids=("a", "b"), seq_lens=(3, 4))
    carry = {"loss_multiplier": torch.tensor([1.0, 1.0]), "truncated": torch.tensor([False, True])}
    _, kept = stamp_sample_mask(False, meta, carry)
    stamped, filtered = stamp_sample_mask(True, meta, carry)
    assert kept.tolist() == [1.0, 1.0] and filtered.tolist() == [1.0, 0.0]
    assert [t["sample_mask"] for t in stamped.tags] == [1.0, 0.0]
