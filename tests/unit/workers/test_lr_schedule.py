"""policy.scheduler: the lr factor per optimizer step, hand-computed, across the knobs' ranges, and the
LambdaLR the trainer builds from it."""

from __future__ import annotations

import math

import pytest
import torch

from rlplane.config.loading import ConfigError, load_config
from rlplane.config.policy import OptimizerConfig, SchedulerConfig
from rlplane.workers.trainer import build_optimizer, lr_factor


def _factors(n, **kw):
    sch = SchedulerConfig(**kw)
    return [lr_factor(s, sch) for s in range(n)]


def test_constant_and_warm_up_alone():
    assert _factors(3) == [1.0, 1.0, 1.0]
    # warm-up 4 from 0.2: 0.2 + 0.8·s/4 = 0.2, 0.4, 0.6, 0.8, then 1.
    assert _factors(6, warmup_steps=4, warmup_start_factor=0.2) == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])


def test_linear_decay_after_warm_up():
    # warm-up 2 from 0.5 (0.5, 0.75), then 1 → 0.2 over 4 steps: 1 - 0.8·t/4 = 1, 0.8, 0.6, 0.4, 0.2, flat 0.2.
    got = _factors(9, warmup_steps=2, warmup_start_factor=0.5, decay="linear", decay_steps=4, min_lr_factor=0.2)
    assert got == pytest.approx([0.5, 0.75, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2])


def test_cosine_decay():
    # 1 → 0 over 4 steps: 1 - (1 - cos(π t/4))/2 = 1, (1+√½)/2 = 0.853553, 0.5, (1-√½)/2 = 0.146447, 0, 0.
    got = _factors(6, decay="cosine", decay_steps=4)
    assert got == pytest.approx([1.0, 0.8535534, 0.5, 0.1464466, 0.0, 0.0])
    # With a floor of 0.1: 0.1 + 0.9·(the above).
    floor = _factors(6, decay="cosine", decay_steps=4, min_lr_factor=0.1)
    assert floor == pytest.approx([0.1 + 0.9 * f for f in got])


@pytest.mark.parametrize("decay", ["linear", "cosine"])
@pytest.mark.parametrize("warm", [0, 1, 3])
@pytest.mark.parametrize("steps", [1, 2, 7, 30])
@pytest.mark.parametrize("floor", [0.0, 0.1, 0.5, 1.0])
def test_decay_falls_monotonically_from_one_to_the_floor(decay, warm, steps, floor):
    f = _factors(warm + steps + 5, warmup_steps=warm, decay=decay, decay_steps=steps, min_lr_factor=floor)
    after = f[warm:]
    assert after[0] == pytest.approx(1.0)
    assert all(b <= a + 1e-12 for a, b in zip(after, after[1:]))
    assert after[steps:] == pytest.approx([floor] * (len(after) - steps))
    assert all(floor - 1e-12 <= x <= 1.0 + 1e-12 for x in after)


def test_the_trainer_schedule_follows_the_factor():
    sch = SchedulerConfig(warmup_steps=1, warmup_start_factor=0.5, decay="cosine", decay_steps=2, min_lr_factor=0.1)
    model = torch.nn.Linear(2, 1)
    opt, sched = build_optimizer(model, OptimizerConfig(lr=1e-3), sch)
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # 0.5, 1, then cosine over 2: 0.1 + 0.9·(1+cos(π/2))/2 = 0.55, 0.1, 0.1 (times lr 1e-3).
    assert lrs == pytest.approx([5e-4, 1e-3, 5.5e-4, 1e-4, 1e-4])
    assert math.isclose(lr_factor(2, sch), 0.55)


def test_a_decay_without_a_length_or_out_of_range_is_one_line():
    with pytest.raises(ConfigError, match=r"decay = cosine needs decay_steps"):
        load_config(None, ["policy.scheduler.decay=cosine", "policy.scheduler.decay_steps=null"])
    with pytest.raises(ConfigError, match=r"min_lr_factor"):
        load_config(None, ["policy.scheduler.decay=linear", "policy.scheduler.decay_steps=5",
                           "policy.scheduler.min_lr_factor=1.5"])
    with pytest.raises(ConfigError, match=r"decay"):
        load_config(None, ["policy.scheduler.decay=step"])
    cfg = load_config(None, ["policy.scheduler.decay=linear", "policy.scheduler.decay_steps=5"])
    assert (cfg.policy.scheduler.decay, cfg.policy.scheduler.decay_steps) == ("linear", 5)


def test_a_fall_of_zero_steps_is_one_line():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["policy.scheduler.decay=cosine", "policy.scheduler.decay_steps=0"])
    assert "policy.scheduler.decay_steps" in str(e.value) and "\n" not in str(e.value)


def test_the_critic_follows_its_own_schedule():
    """value.scheduler reaches the critic's optimizer: linear over 2 steps to 0.5 of 1e-3 (1, 0.75, 0.5, 0.5)."""
    from rlplane.dataplane import make_data_plane
    from rlplane.training.plan import value_options
    from rlplane.workers.value import ValueWorker

    cfg = load_config("ppo_arithmetic", ["warmup.enabled=false", "value.optimizer.lr=1e-3",
                                         "value.scheduler.decay=linear", "value.scheduler.decay_steps=2",
                                         "value.scheduler.min_lr_factor=0.5"])
    trainer = ValueWorker(value_options(cfg), make_data_plane("memory")).trainer
    lrs = []
    for _ in range(4):
        lrs.append(trainer.optimizer.param_groups[0]["lr"])
        trainer.optimizer.step()
        trainer.scheduler.step()
    assert lrs == pytest.approx([1e-3, 7.5e-4, 5e-4, 5e-4])
