"""The policy's per-call micro-batch sizes and eval_mode through runtime: ray (the ranks are Ray actors): an
injected policy wraps the run's own and, before each step's training, checks that reference logprobs and
eval-mode losses do not depend on the micro-batch size and that eval_mode leaves the weights as they were."""

from __future__ import annotations

import pytest

import rlplane
from rlplane.utils.metrics import merge_rank_metrics

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TINY = ["grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2", "policy.train_global_batch_size=4",
        "policy.train_micro_batch_size=4", "policy.logprob_batch_size=4", "grpo.max_num_steps=2",
        "grpo.val_period=0", "grpo.val_at_start=false", "grpo.max_val_samples=2", "grpo.val_batch_size=2",
        "warmup.enabled=false", "policy.generation.max_new_tokens=4", "logger.tensorboard_enabled=false",
        "checkpointing.enabled=false", "logger.progress_bar=false", "loss_fn.reference_policy_kl_penalty=0.05"]


class Checking:
    """The run's own policy, with per-call sizes and eval passes before each real training call."""

    def __init__(self, inner):
        self.inner, self.steps = inner, []

    def get_logprobs_from_meta(self, meta, micro_batch_size=None):
        return self.inner.get_logprobs_from_meta(meta, micro_batch_size)

    def get_reference_policy_logprobs_from_meta(self, meta, micro_batch_size=None):
        return self.inner.get_reference_policy_logprobs_from_meta(meta, micro_batch_size)

    def _eval(self, meta, loss_fn, **sizes):
        out = merge_rank_metrics(self.inner.train_from_meta(meta, loss_fn, eval_mode=True, **sizes))
        return {k: v for k, v in out.items() if k != "lr"}

    def train_from_meta(self, meta, loss_fn, eval_mode=False, gbs=None, mbs=None):
        self.inner.get_reference_policy_logprobs_from_meta(meta, micro_batch_size=1)  # one sample per forward
        one = self._eval(meta, loss_fn, mbs=1)
        self.inner.get_reference_policy_logprobs_from_meta(meta)
        default, again = self._eval(meta, loss_fn), self._eval(meta, loss_fn)
        trained = merge_rank_metrics(self.inner.train_from_meta(meta, loss_fn, eval_mode, gbs, mbs))
        self.steps.append((one, default, again, trained))
        return [trained]


def test_per_call_sizes_and_eval_mode_under_ray(ray_session, tmp_path):
    made = []
    rlplane.train(None, overrides=[*TINY, "runtime=ray", "data_plane.backend=ray", f"run_dir={tmp_path / 'run'}"],
                  quiet=True, policy=lambda built: made.append(Checking(built)) or made[-1])
    steps = made[0].steps
    assert len(steps) == 2
    for one, default, again, trained in steps:
        assert "grad_norm" not in default and "grad_norm" in trained
        assert default == again  # eval_mode took no step
        assert one.keys() == default.keys()
        for k in default:
            assert one[k] == pytest.approx(default[k], abs=1e-5), k
            assert trained[k] == pytest.approx(default[k], abs=1e-5), k  # the real pass, before its step
