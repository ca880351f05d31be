"""Many generators and placement (issue 18), end to end on the embedded tiny model.

- A GRPO step's rollouts with 1 and with 2 generators are the same samples (tokens, generation
  logprobs, rewards, groups) for the same seed, in this process and as Ray actors.
- Under Ray every worker group runs in a placement group: colocated (a policy rank and a generator
  share a bundle; the generator holds no weights while the policy trains) or split (their own
  bundles, weights kept); checked from inside the actors against Ray's placement-group table.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlplane.config.loading import ConfigError, load_config
from rlplane.dataplane.columns import GENERATION_LOGPROBS, INPUT_IDS, TOKEN_MASK
from rlplane.recipes.grpo import TRAIN_COLUMNS, grpo_step
from rlplane.training.loop import Timer
from rlplane.training.rollouts import TRAIN_PARTITION, collect_rollouts
from rlplane.training.session import Session
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker
from rlplane.workers.rollout import RolloutWorker

SMALL = [
    "grpo.num_prompts_per_step=5",  # odd: the two generators get 3 and 2 groups
    "grpo.num_generations_per_prompt=4",
    "policy.train_global_batch_size=20",
    "policy.train_micro_batch_size=10",
    "policy.logprob_batch_size=20",
    "policy.generation.max_new_tokens=6",
    "grpo.max_num_steps=2",
    "grpo.val_at_start=false",
    "grpo.val_period=0",
    "grpo.max_val_samples=8",
    "warmup.enabled=false",
    "checkpointing.enabled=false",
    "logger.progress_bar=false",
    "logger.tensorboard_enabled=false",
]
RAY = ["runtime=ray", "data_plane.backend=ray"]


def first_step_samples(tmp_path, *extra) -> dict:
    """Step 0's rollouts of a fresh session: per row its tokens, generation logprobs, reward, group."""
    cfg = load_config(None, [*SMALL, f"run_dir={tmp_path}", *extra])
    with Session(cfg, quiet=True) as s:
        s.start()
        s.begin_step(0)
        s.refit.if_stale()
        s.data_plane.register_partition(TRAIN_PARTITION, TRAIN_COLUMNS, 5 * 4)  # prompts x generations
        metrics: dict[str, float] = {}
        meta, carry = collect_rollouts(s, Timer(), metrics)
        cols = s.data_plane.get_samples(meta, TRAIN_PARTITION, [INPUT_IDS, GENERATION_LOGPROBS, TOKEN_MASK])
        n = len(s.workers.rollout)
    lens = meta.seq_lens
    return {
        "generators": n,
        "tokens": [cols[INPUT_IDS][r, : lens[r]].tolist() for r in range(len(lens))],
        "logprobs": [cols[GENERATION_LOGPROBS][r, : lens[r]] for r in range(len(lens))],
        "rewards": carry["rewards"],
        "group": carry["group"],
        "metrics": metrics,
    }


def assert_same_samples(one: dict, two: dict) -> None:
    assert (one["generators"], two["generators"]) == (1, 2)
    assert one["tokens"] == two["tokens"]
    for a, b in zip(one["logprobs"], two["logprobs"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert torch.equal(one["rewards"], two["rewards"]) and torch.equal(one["group"], two["group"])
    # The merged rollout metrics are one generator's (means weighted by rows, counts summed).
    assert one["metrics"].keys() == two["metrics"].keys()
    for k, v in one["metrics"].items():
        tol = 1e-6 if k.startswith("env/") else 1e-9  # environments' metrics are float32 means, merged per generator
        assert math.isclose(v, two["metrics"][k], rel_tol=tol, abs_tol=tol), (k, v, two["metrics"][k])
    # Not trivially equal: the group's samples differ from each other.
    assert len({tuple(t) for t in one["tokens"]}) > len(set(one["group"].tolist()))


def test_one_and_two_generators_give_the_same_samples_local(tmp_path):
    one = first_step_samples(tmp_path / "one")
    two = first_step_samples(tmp_path / "two", "policy.generation.num_generators=2")
    assert_same_samples(one, two)


@pytest.mark.slow
@pytest.mark.ray
def test_one_and_two_generators_give_the_same_samples_ray(tmp_path, ray_session):
    one = first_step_samples(tmp_path / "one", *RAY)
    two = first_step_samples(tmp_path / "two", *RAY, "policy.generation.num_generators=2")
    assert_same_samples(one, two)


def run_steps_and_placements(tmp_path, *extra) -> tuple[list[dict], dict, dict, list[int]]:
    """Two GRPO steps under Ray; returns each step's metrics, where each actor runs, the placement
    groups' table entries and the generators' held weight elements after the last step."""
    import ray

    cfg = load_config(None, [*SMALL, *RAY, f"run_dir={tmp_path}", "policy.generation.num_generators=2", *extra])
    with Session(cfg, quiet=True) as s:
        loss = ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference)
        rows = []
        for step in range(s.start(), s.last_step()):
            s.begin_step(step)
            rows.append(grpo_step(s, loss, step))
        where = {"policy": s.workers.policy.run(PolicyWorker.placement), "generators": s.workers.rollout.placement()}
        held = s.workers.rollout.group.run(RolloutWorker.num_weights_held)
        table = {name: ray.util.placement_group_table(pg) for name, pg in s.workers.placement_groups.items()}
    return rows, where, table, held


def check_steps(rows):
    assert len(rows) == 2 and all(math.isfinite(r["train/loss"]) for r in rows)
    # The generators sampled with the policy's weights (refit, after waking when colocated).
    assert all(abs(r["train/token_mult_prob_error"] - 1.0) < 0.02 for r in rows)


@pytest.mark.slow
@pytest.mark.ray
def test_colocated_generators_share_the_policy_bundle_and_sleep(tmp_path, ray_session):
    rows, where, table, held = run_steps_and_placements(tmp_path, "policy.generation.colocated.enabled=true")
    check_steps(rows)
    assert list(table) == ["colocated"]
    pg = table["colocated"]
    assert len(pg["bundles"]) == 2  # max(dp_size 1, 2 generators)
    (policy,), generators = where["policy"], where["generators"]
    assert policy["placement_group_id"] == pg["placement_group_id"] and policy["bundles"] == [0]
    assert [g["placement_group_id"] for g in generators] == [pg["placement_group_id"]] * 2
    assert [g["bundles"] for g in generators] == [[0], [1]]  # generator 0 shares policy rank 0's bundle
    assert [g["node_id"] for g in generators] == [pg["bundles_to_node_id"][0], pg["bundles_to_node_id"][1]]
    assert held == [0, 0]  # asleep while the policy trained; the next refit wakes them


@pytest.mark.slow
@pytest.mark.ray
def test_split_generators_have_their_own_bundles(tmp_path, ray_session):
    rows, where, table, held = run_steps_and_placements(tmp_path, "policy.generation.colocated.enabled=false")
    check_steps(rows)
    assert sorted(table) == ["generation", "train"]
    train, gen = table["train"], table["generation"]
    (policy,), generators = where["policy"], where["generators"]
    assert policy["placement_group_id"] == train["placement_group_id"] and policy["bundles"] == [0]
    assert [g["placement_group_id"] for g in generators] == [gen["placement_group_id"]] * 2
    assert [g["bundles"] for g in generators] == [[0], [1]]
    assert policy["node_id"] == train["bundles_to_node_id"][0]
    assert all(h > 0 for h in held)  # split generators keep their weights


@pytest.mark.ray
def test_bundles_that_cannot_fit_are_a_one_line_error(tmp_path, ray_session):
    cfg = load_config(None, [*SMALL, *RAY, f"run_dir={tmp_path}", "cluster.num_nodes=3"])
    with pytest.raises(ConfigError) as e:
        Session(cfg, quiet=True)
    assert "\n" not in str(e.value) and "cluster.num_nodes = 3" in str(e.value)


def test_every_generator_gets_the_trained_weights(tmp_path, first_digit_env):
    """After a step the refit reaches both generators (local: their models are inspectable; the
    first-digit reward varies from random weights, so the step changes them)."""
    cfg = load_config(None, [*SMALL, f"run_dir={tmp_path}", "policy.generation.num_generators=2"])
    with Session(cfg, quiet=True) as s:
        loss = ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference)
        s.start()
        before = {k: v.clone() for k, v in s.workers.policy.workers[0].model.state_dict().items()}
        s.begin_step(0)
        grpo_step(s, loss, 0)
        assert s.refit.stale
        s.refit.if_stale()
        trained = s.workers.policy.workers[0].model.state_dict()
        assert any(not torch.equal(before[k], trained[k]) for k in trained)
        for gen in s.workers.rollout.group.workers:
            held = gen.backend.model.state_dict()
            assert all(torch.equal(held[k], trained[k]) for k in trained)
