"""The sweep's plan, bad options and its report's arithmetic (no runs)."""

from __future__ import annotations

import json

import pytest

from rlplane.errors import ConfigError
from rlplane.sweeps.plan import VARIANTS, parse_seeds, parse_variant, plan_runs
from rlplane.sweeps.report import RunResult, group_stats, markdown
from rlplane.sweeps.runner import claim_directory, identity


@pytest.mark.parametrize("text, seeds", [("42", [42]), ("11-13", [11, 12, 13]), ("4,1,9", [4, 1, 9]),
                                         (" 7 ", [7]), ("5-5", [5]), ("1-3,42", [1, 2, 3, 42])])
def test_seed_list_as_seed_range_or_list(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text, says", [("", "'' is not a seed"), ("1,2,1", "seed 1 given twice"),
                                        ("9-3", "ends before it starts"), ("a", "'a' is not a seed or a range"),
                                        ("1,,2", "'' is not a seed"), ("-1", "not a seed"),
                                        ("1-5000", "more than 1000"), ("1-99999999999999", "more than 1000")])
def test_bad_seed_lists_are_one_line(text, says):
    with pytest.raises(ConfigError, match=says) as e:
        parse_seeds(text)
    assert len(e.value.problems) == 1 and "\n" not in e.value.problems[0]


def test_plan_labels_overrides_and_controls():
    runs = plan_runs(algorithm="grpo", loop="grpo", seeds=[1, 2], variants=[VARIANTS["threads1"]],
                     control="permute", control_seeds=1)
    assert [r.label for r in runs] == ["seed1", "seed2", "seed1-threads1", "seed2-threads1", "seed1-control"]
    assert runs[2].overrides == ("grpo.seed=1", "policy.threads_per_worker=1")
    assert dict(runs[2].env) == {"OMP_NUM_THREADS": "1"}
    two = plan_runs(algorithm="grpo", loop="grpo", seeds=[1], variants=[VARIANTS["threads2"]], control=None,
                    control_seeds=1)
    assert two[1].label == "seed1-threads2" and dict(two[1].env) == {"OMP_NUM_THREADS": "2"}
    assert two[1].overrides == ("grpo.seed=1", "policy.threads_per_worker=2")
    assert runs[4].overrides == ("grpo.seed=1", "grpo.reward_control=permute") and runs[4].control == "rewards permuted"
    ppo = plan_runs(algorithm="ppo", loop="ppo", seeds=[3], variants=[], control="coin", control_seeds=1)
    assert ppo[-1].overrides == ("ppo.seed=3", "ppo.reward_control=coin")
    distill = plan_runs(algorithm="distillation", loop="distillation", seeds=[3], variants=[], control="permute",
                        control_seeds=1)
    assert distill[-1].overrides == ("distillation.seed=3", "teacher.warmup.enabled=false")
    assert distill[-1].control == "untrained teacher"


def test_bad_plans_are_one_line():
    with pytest.raises(ConfigError, match="distillation has no reward to replace"):
        plan_runs(algorithm="distillation", loop="distillation", seeds=[1], variants=[], control="coin",
                  control_seeds=1)
    with pytest.raises(ConfigError, match="--control-seeds 3: must be between 1 and the number of seeds"):
        plan_runs(algorithm="grpo", loop="grpo", seeds=[1, 2], variants=[], control="permute", control_seeds=3)
    with pytest.raises(ConfigError, match="--variant fp32 given twice"):
        plan_runs(algorithm="grpo", loop="grpo", seeds=[1], variants=[VARIANTS["fp32"]] * 2, control=None,
                  control_seeds=1)
    with pytest.raises(ConfigError, match="not a named variant"):
        parse_variant("faster")
    one = parse_variant("policy.optimizer.lr=1e-3")
    assert one.overrides == ("policy.optimizer.lr=1e-3",) and one.name == "policy.optimizer.lr=1e-3"
    two = parse_variant("grpo.num_prompts_per_step=16 grpo.num_generations_per_prompt=16")
    assert two.overrides == ("grpo.num_prompts_per_step=16", "grpo.num_generations_per_prompt=16")
    assert two.name == "grpo.num_prompts_per_step=16+grpo.num_generations_per_prompt=16"
    with pytest.raises(ConfigError, match="not a named variant"):
        parse_variant("lr=1e-3")


def test_stats_are_the_gains_in_points():
    def run(label, start, end, variant="", control=None):
        return RunResult(label, 1, variant, control, "done", start=start, end=end, wall_s=10.0)

    results = [run("seed1", 0.30, 0.70), run("seed2", 0.30, 0.50), run("seed3", 0.40, 0.70),
               run("seed1-control", 0.30, 0.32, control="rewards permuted"),
               RunResult("seed4", 4, "", None, "failed", error="rlplane: error: x")]
    stats = {g.group: g for g in group_stats(results)}
    g = stats["as configured"]
    # gains +40, +20, +30: mean 30, sd sqrt(((10)^2 + (-10)^2 + 0) / 2) = 10, worst +20, best +40
    assert (g.n, round(g.mean, 6), round(g.sd, 6), round(g.worst, 6), round(g.best, 6)) == (3, 30, 10, 20, 40)
    c = stats["control (rewards permuted)"]
    assert c.n == 1 and c.sd is None and round(c.mean, 6) == 2
    text = markdown("t", ["machine: m"], results, list(stats.values()))
    assert "| as configured | 3 | +30.0 ± 10.0 | +20.0 | +40.0 | 10 s |" in text
    assert "| seed4 | 4 | failed: rlplane: error: x |" in text


def test_a_directory_holds_one_sweep(tmp_path):
    ident = identity("grpo_arithmetic", ["grpo.max_num_steps=5"],
                     {"run_dir": "a", "grpo": {"seed": 1, "max_num_steps": 5}}, "grpo")
    assert ident["resolved"] == {"grpo": {"max_num_steps": 5}}  # what the sweep sets per run is not its identity
    claim_directory(tmp_path / "s", ident)
    claim_directory(tmp_path / "s", ident)  # the same sweep again: continues
    newer = identity("grpo_arithmetic", ["grpo.max_num_steps=5"],
                     {"run_dir": "a", "grpo": {"seed": 1, "max_num_steps": 5, "new_key": 0}}, "grpo")
    claim_directory(tmp_path / "s", newer)  # a setting rlplane added since, at its default: the same sweep
    other = identity(None, [], {"grpo": {"seed": 1, "max_num_steps": 6}}, "grpo")
    with pytest.raises(ConfigError, match=r"holds a sweep of another config \(it differs at grpo.max_num_steps\)"):
        claim_directory(tmp_path / "s", other)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("x: 1\n")
    with pytest.raises(ConfigError, match="holds a training run"):
        claim_directory(tmp_path / "run", ident)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not empty and holds no sweep"):
        claim_directory(tmp_path / "busy", ident)
    (tmp_path / "s" / "sweep.json").write_text("{not json")
    with pytest.raises(ConfigError, match="sweep.json is damaged"):
        claim_directory(tmp_path / "s", ident)
    assert json.loads(json.dumps(ident)) == ident


def test_one_sweep_writes_a_directory_at_a_time(tmp_path):
    import fcntl
    import os

    from rlplane.sweeps.runner import hold_directory

    (tmp_path / "s").mkdir()
    fd = os.open(tmp_path / "s" / ".rlplane.lock", os.O_RDWR | os.O_CREAT)
    os.write(fd, b'{"pid": 7, "host": "h", "started": "then"}')
    fcntl.flock(fd, fcntl.LOCK_EX)  # held by "another process": an open file description of its own
    try:
        with pytest.raises(ConfigError, match=r"--out .*/s: another rlplane sweep is using it \(pid 7 on host h"):
            hold_directory(tmp_path / "s")
    finally:
        os.close(fd)
    hold_directory(tmp_path / "s").release()
