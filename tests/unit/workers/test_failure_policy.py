"""rollout_failure_policy with an injected flaky environment: zero_reward scores failed samples 0,
retry re-runs their step on a fresh environment, drop_group's selection drops whole groups; and the
async collector does not buffer a group that holds a failed sample."""

from __future__ import annotations

import pytest
import torch

from rlplane.algorithms import failed_group_keep_mask
from rlplane.config.loading import load_config
from rlplane.datasets import build_datasets
from rlplane.envs import ENV_REGISTRY, EnvironmentReturn, register_env
from rlplane.models.configured import load_configured_policy
from rlplane.workers.failures import add_failure_counts, num_failed_groups
from tests.tiny import collector, rollout_worker

G = 2


class FlakyEnv:
    """Reward 1 for every sample; the first ``broken_instances`` instances made raise on every step,
    and every instance raises on prompts whose ground truth is in ``always_fail`` (a bad sample)."""

    made = 0
    broken_instances = 0
    always_fail: set[str] = set()

    def __init__(self):
        type(self).made += 1
        self.broken = type(self).made <= type(self).broken_instances

    def step(self, message_logs, metadata):
        if self.broken:
            raise ConnectionError("verifier pool is gone")
        if any(m.get("ground_truth") in self.always_fail for m in metadata):
            raise ValueError("cannot score this answer")
        n = len(message_logs)
        return EnvironmentReturn([{}] * n, [None] * n, [None] * n, torch.ones(n), torch.ones(n, dtype=torch.bool), None)


@pytest.fixture
def flaky():
    saved = dict(ENV_REGISTRY)
    register_env("arithmetic", FlakyEnv)
    FlakyEnv.made, FlakyEnv.broken_instances, FlakyEnv.always_fail = 0, 0, set()
    yield FlakyEnv
    ENV_REGISTRY.clear()
    ENV_REGISTRY.update(saved)


def worker_and_prompts(*extra):
    cfg = load_config(None, ["grpo.num_prompts_per_step=4", f"grpo.num_generations_per_prompt={G}",
                             "policy.train_global_batch_size=8", "data.num_train_samples=64",
                             "policy.generation.max_new_tokens=3", *extra])
    model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    return rollout_worker(cfg, None, model=model, tokenizer=tok), next(loader)


def test_failed_group_keep_mask_hand_computed():
    group = torch.tensor([0, 0, 1, 1, 2, 2])
    failed = torch.tensor([False, True, False, False, True, True])
    # Group 0 has one failed sample, group 2 two: both go whole; group 1 stays.
    assert failed_group_keep_mask(group, failed).tolist() == [False, False, True, True, False, False]
    assert num_failed_groups(group, failed) == 2
    assert failed_group_keep_mask(group, torch.zeros(6, dtype=torch.bool)).all()
    totals = add_failure_counts(dict.fromkeys(("rollout_failures", "rollout_retries", "dropped_groups"), 1.0),
                                {"rollout_failures": 3.0, "rollout_retries": 2.0},
                                {"group": group, "env_failed": failed}, drop_failed_groups=True)
    assert totals == {"rollout_failures": 4.0, "rollout_retries": 3.0, "dropped_groups": 3.0}


def test_zero_reward_scores_failed_samples_zero(flaky):
    flaky.broken_instances = 1  # the kept instance is broken; zero_reward never makes another
    worker, datums = worker_and_prompts("grpo.rollout_failure_policy=zero_reward")
    _, carry, metrics = worker.rollout(datums, group_size=G, partition_id=None)
    assert carry["rewards"].tolist() == [0.0] * 8 and carry["env_failed"].all()
    assert metrics["rollout_failures"] == 8 and metrics["rollout_retries"] == 0 and flaky.made == 1


def test_retry_reruns_on_a_fresh_environment(flaky):
    flaky.broken_instances = 1  # the first instance is broken, a fresh one works
    worker, datums = worker_and_prompts("grpo.rollout_failure_policy=retry", "grpo.rollout_max_retries=2")
    _, carry, metrics = worker.rollout(datums, group_size=G, partition_id=None)
    assert carry["rewards"].tolist() == [1.0] * 8 and not carry["env_failed"].any()
    assert metrics["rollout_failures"] == 0 and metrics["rollout_retries"] == 8 and flaky.made == 2
    # The fresh instance is kept: the next rollout does not fail at all.
    _, carry, metrics = worker.rollout(datums, group_size=G, partition_id=None)
    assert metrics["rollout_retries"] == 0 and flaky.made == 2


def test_retry_gives_up_after_max_retries(flaky):
    flaky.broken_instances = 10
    worker, datums = worker_and_prompts("grpo.rollout_failure_policy=retry", "grpo.rollout_max_retries=2")
    _, carry, metrics = worker.rollout(datums, group_size=G, partition_id=None)
    # 8 samples fail, are retried twice each (2 fresh instances), and score 0.
    assert carry["rewards"].tolist() == [0.0] * 8
    assert metrics["rollout_failures"] == 8 and metrics["rollout_retries"] == 16 and flaky.made == 3


def test_retry_only_reruns_the_failed_samples(flaky):
    worker, datums = worker_and_prompts("grpo.rollout_failure_policy=retry", "grpo.rollout_max_retries=1")
    flaky.always_fail = {datums[1].ground_truth}  # one prompt's 2 samples always fail
    _, carry, metrics = worker.rollout(datums, group_size=G, partition_id=None)
    assert carry["env_failed"].tolist() == [False, False, True, True, False, False, False, False]
    assert carry["rewards"].tolist() == [1, 1, 0, 0, 1, 1, 1, 1]
    assert metrics["rollout_failures"] == 2 and metrics["rollout_retries"] == 2


def generate_batch(collector, target: int, needed: int) -> None:
    """One generation batch of the collector's, in this thread, as its loop starts it."""
    with collector._cond:
        job = collector.schedule.start_batch(target, needed)
        datums = collector._take_prompts(needed)
    collector._run_batch(job, datums)


def test_async_collector_drops_groups_with_a_failed_sample(flaky):

    cfg = load_config(None, ["grpo.num_prompts_per_step=4", f"grpo.num_generations_per_prompt={G}",
                             "policy.train_global_batch_size=8", "data.num_train_samples=64",
                             "policy.generation.max_new_tokens=3", "grpo.async_grpo.enabled=true",
                             "loss_fn.use_importance_sampling_correction=true",
                             "grpo.rollout_failure_policy=drop_group"])
    _, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    from rlplane.dataplane import make_data_plane

    c = collector(cfg, loader, 0, data_plane=make_data_plane("memory"))
    first = next(build_datasets(cfg.dataset_options(), tok)[0])  # the collector's first batch of prompts
    flaky.always_fail = {first[0].ground_truth, first[2].ground_truth}
    generate_batch(c, target=0, needed=4)
    kept = [g.prompt_idx for g in c.buffer._groups]
    assert kept == [first[1].idx, first[3].idx] and c.counters["dropped_groups"] == 2
    # The dropped groups' keys are cleared from the data plane; the kept groups' stay.
    assert set(c.dp.list_samples("train")) == {k for g in c.buffer._groups for k in g.meta.sample_ids}
    assert c.buffer._groups[0].rollout_metrics["dropped_groups"] == 2
    # The collector's loop asks for the 2 groups still needed: they come from the next prompts.
    generate_batch(c, target=0, needed=2)
    assert len(c.buffer._groups) == 4 and c.buffer.count_for_target(0) == 4
