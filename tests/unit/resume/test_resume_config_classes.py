"""The resume config check: every config key is classed, and a changed key is free, converted or refused."""

import typing

import pytest
import yaml
from pydantic import BaseModel

from rlplane.config.loading import list_presets, load_config
from rlplane.config.resume import (
    CONVERTIBLE,
    FREE,
    LOOP_SECTIONS,
    REFUSED,
    RULES,
    check_checkpoint_config,
    check_resume_config,
    classify,
    flatten,
    rule_for,
)
from rlplane.config.schema import RunConfig


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation names (``X``, ``X | None``, ``dict[str, X]``, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def schema_keys(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the schema, optional sections included (a field holding models: their keys)."""
    keys = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        inner = _models_in(field.annotation)
        if inner:
            for m in inner:
                keys += schema_keys(m, key + ".")
        else:
            keys.append(key)
    return keys


def test_every_schema_key_is_classed_by_a_rule():
    keys = schema_keys()
    assert len(keys) > 150 and "ppo.ppo_epochs" in keys and "teacher.tiny.hidden_size" in keys
    unclassed = [k for k in keys if rule_for(k) is None]
    assert unclassed == [], f"add these keys (or their section) to config/resume.py's table: {unclassed}"
    # Each algorithm's resolved config too (show-config's tree: user tasks, dict-valued keys).
    for preset in list_presets():
        tree = load_config(preset).model_dump(mode="json")
        assert [k for k in flatten(tree) if rule_for(k) is None] == []


def test_rules_name_real_keys():
    # A rule for a key the schema does not have would class nothing (a typo in the table).
    keys = schema_keys()
    for rule in RULES:
        assert any(k == rule or k.startswith(rule + ".") for k in keys), rule


def test_unlisted_keys_are_refused():
    assert classify("something_new") == (REFUSED, "not classed for resume")
    assert classify("policy.model_name")[0] == REFUSED
    assert classify("policy.optimizer.lr")[0] == FREE
    assert classify("ppo.num_prompts_per_step")[0] == CONVERTIBLE
    assert classify("env.my_task.reward_fn")[0] == FREE  # a user task: a section rule
    assert classify("data.validation.path")[0] == FREE and classify("data.train.path")[0] == REFUSED


@pytest.fixture(scope="module")
def tree():
    return load_config().model_dump(mode="json")


def _with(tree, **changes):
    out = yaml.safe_load(yaml.safe_dump(tree))
    for key, value in changes.items():
        node = out
        *path, last = key.split("__")
        for p in path:
            node = node[p]
        node[last] = value
    return out


def test_free_and_convertible_changes_resume(tree):
    new = _with(tree, grpo__max_num_steps=4, policy__optimizer__lr=1e-5, grpo__num_prompts_per_step=8,
                checkpointing__save_period=1, logger__progress_bar=False)
    check = check_resume_config(tree, new)
    assert check.refusals == []
    assert {c.key: c.cls for c in check.changes} == {
        "grpo.max_num_steps": FREE, "policy.optimizer.lr": FREE, "grpo.num_prompts_per_step": CONVERTIBLE,
        "checkpointing.save_period": FREE, "logger.progress_bar": FREE}
    assert check.changes[0].line() == "policy.optimizer.lr: 0.0002 -> 1e-05 (free)"


def test_refused_changes_name_key_values_and_fix(tree):
    new = _with(tree, data__shuffle=False, grpo__seed=7, policy__model_name="other")
    check = check_resume_config(tree, new, "resume from ck/step_2")
    assert check.refusals == [
        "resume from ck/step_2: policy.model_name: embedded:tiny-llama there, other now: a resumed run cannot change "
        "it (the checkpoint's weights are another model's); set policy.model_name=embedded:tiny-llama to resume, "
        "or start a new run_dir",
        "resume from ck/step_2: grpo.seed: 42 there, 7 now: a resumed run cannot change it (it fixes the order of "
        "the prompts and every sample's random stream); set grpo.seed=42 to resume, or start a new run_dir",
        "resume from ck/step_2: data.shuffle: true there, false now: a resumed run cannot change it (it changes "
        "the training prompts the saved position points into); set data.shuffle=true to resume, or start a new "
        "run_dir",
    ]
    assert all("\n" not in r for r in check.refusals)


def test_direction_guards(tree):
    kl_on = _with(tree, loss_fn__reference_policy_kl_penalty=0.01)
    assert check_resume_config(tree, kl_on).refusals[0].startswith(
        "checkpoint: loss_fn.reference_policy_kl_penalty: 0.0 there, 0.01 now: the KL penalty needs the reference")
    assert check_resume_config(kl_on, _with(kl_on, loss_fn__reference_policy_kl_penalty=0.02)).refusals == []
    assert check_resume_config(kl_on, tree).refusals == []
    async_on = _with(tree, grpo__async_grpo={**tree["grpo"]["async_grpo"], "enabled": True})
    assert check_resume_config(tree, async_on).refusals == []  # a synchronous checkpoint feeds async GRPO
    assert "replay buffer" in check_resume_config(async_on, tree).refusals[0]


def test_checkpoint_config_fills_the_old_batch_size_and_says_where_the_epoch_continues(tree, tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(_with(tree, grpo__num_prompts_per_step=4)))
    new = _with(tree, grpo__num_prompts_per_step=8, checkpointing__resume=True)
    old_state = {"epoch": 0, "batches_done_in_epoch": 2, "seed": 42}  # a checkpoint that counted batches
    check, lines = check_checkpoint_config(tmp_path, new, old_state)
    assert check.refusals == [] and old_state["num_prompts_per_batch"] == 4
    assert lines == ["resume: grpo.num_prompts_per_step: 4 -> 8 (convertible)",
                     "resume: prompts per batch 4 -> 8: epoch 0 continues at its prompt 9"]
    (tmp_path / "config.yaml").write_text("{not yaml")
    check, _ = check_checkpoint_config(tmp_path, new, {})
    assert "config.yaml is missing or damaged" in check.refusals[0]


def test_optimizer_settings_of_the_resumed_run_apply():
    # torch's load_state_dict restores the saved lr (param groups and the scheduler's base_lrs): a free
    # change of policy.optimizer.lr must be applied after loading, at the schedule's restored step.
    import torch

    from rlplane.config.policy import OptimizerConfig, SchedulerConfig
    from rlplane.workers.trainer import Trainer, build_optimizer

    model = torch.nn.Linear(2, 1)
    sch = SchedulerConfig(warmup_steps=4, warmup_start_factor=0.5)
    opt, sched = build_optimizer(model, OptimizerConfig(lr=1e-3), sch)
    for _ in range(2):
        opt.step()
        sched.step()
    saved = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}
    w = Trainer.__new__(Trainer)
    w.optimizer, w.scheduler = build_optimizer(model, OptimizerConfig(lr=1e-5, weight_decay=0.1), sch)
    w.optimizer.load_state_dict(saved["optimizer"])
    w.scheduler.load_state_dict(saved["scheduler"])
    assert w.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.75)  # the saved lr: the change is lost
    w.apply_optimizer_settings(**OptimizerConfig(lr=1e-5, weight_decay=0.1).model_dump())
    assert w.optimizer.param_groups[0]["lr"] == pytest.approx(1e-5 * 0.75)  # step 2 of 4 of the warm-up
    assert w.optimizer.param_groups[0]["weight_decay"] == 0.1
    w.scheduler.step()
    assert w.optimizer.param_groups[0]["lr"] == pytest.approx(1e-5 * 0.875)


def test_docs_table_lists_every_rule_with_its_class():
    from pathlib import Path

    doc = (Path(__file__).parents[3] / "docs" / "resume.md").read_text()
    listed = {}
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            listed[cells[0].strip("`")] = cells[1]
    for rule, (cls, _) in RULES.items():
        section, dot, rest = rule.partition(".")
        as_loop = "{loop}" + dot + rest  # grpo.seed, ppo.seed, ... are one row: {loop}.seed
        key = as_loop if section in LOOP_SECTIONS and as_loop in listed else rule
        assert listed.get(key) == cls, f"docs/resume.md: {key} should be listed as {cls}"
