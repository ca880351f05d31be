"""What a resume may change: every config key is classed, and the checkpoint's ``config.yaml`` is compared
with the resumed config before any worker starts.

Classes (:data:`RULES`; docs/resume.md explains each): ``free`` (takes effect from the resumed step),
``convertible`` (the checkpoint's state is carried over: the loader's position counts prompts; the replay
buffer is refitted), ``refused`` (one line: key, old and new values, the way out). The longest dotted
prefix rule wins (``{loop}``: each loop section); no rule: refused. Plain data, no torch, no pydantic.
"""

from __future__ import annotations

import dataclasses

FREE, CONVERTIBLE, REFUSED = "free", "convertible", "refused"
LOOP_SECTIONS = ("grpo", "ppo", "distillation")

# (dotted prefix, class, why). The longest matching prefix wins; no match: refused.
_TABLE: list[tuple[str, str, str]] = [
    ("algorithm", REFUSED, "another recipe's checkpoint holds other state"),
    ("runtime", FREE, "where the workers run, not what they compute"),
    ("run_dir", FREE, "where the run writes"),
    # policy: the model's identity and shape are refused; how it is computed is free.
    ("policy", FREE, "how the policy is computed and trained"),
    ("policy.model_name", REFUSED, "the checkpoint's weights are another model's"),
    ("policy.tiny", REFUSED, "the checkpoint's weights have the saved shape"),
    ("policy.lora", REFUSED, "the checkpoint holds adapters of the saved layout"),
    ("policy.lora.dropout", FREE, "a training-time setting of the same adapters"),
    ("policy.dtensor_cfg.enabled", REFUSED, "plain-DP and FSDP checkpoints hold the optimizer state differently"),
    ("policy.optimizer", FREE, "applied to the restored optimizer state"),
    ("policy.scheduler", FREE, "applied from the resumed step on"),
    # The rollout loop.
    ("{loop}", FREE, "a setting of the steps to come"),
    ("{loop}.num_prompts_per_step", CONVERTIBLE, "the loader's position is counted in prompts"),
    ("{loop}.batch_multiplier", CONVERTIBLE, "the loader's position is counted in prompts"),
    ("{loop}.seed", REFUSED, "it fixes the order of the prompts and every sample's random stream"),
    ("grpo.num_generations_per_prompt", CONVERTIBLE, "async GRPO's buffered groups of the saved size are left "
                                                     "out and their prompts drawn again at the new size"),
    ("grpo.async_grpo.max_trajectory_age_steps", CONVERTIBLE, "async GRPO's buffered groups keep their columns; "
                                                              "their token version counts are re-spanned"),
    ("grpo.async_grpo.enabled", FREE, "a synchronous checkpoint feeds an asynchronous run "
                                      "(asynchronous to synchronous is refused: see below)"),
    ("value", FREE, "the critic's training settings"),
    ("teacher", FREE, "the teacher's weights are in the checkpoint"),
    ("teacher.model_name", REFUSED, "the checkpoint's teacher is another model"),
    ("teacher.tiny", REFUSED, "the checkpoint's teacher has the saved shape"),
    ("loss_fn", FREE, "the loss of the steps to come"),
    ("warmup", FREE, "no effect: the warm-up ran before step 0 and is not run again"),
    # data: which prompts, in which order, worded how: all refused but the held-out set.
    ("data", REFUSED, "it changes the training prompts the saved position points into"),
    ("data.validation", FREE, "the held-out set only"),
    ("data.max_rows", FREE, "a bound checked as files are read: the rows read are the same"),
    ("data.reasoning_gym.val_size", FREE, "the held-out set only"),
    ("data.reasoning_gym.val_seed", FREE, "the held-out set only"),
    ("env", FREE, "how responses are scored"),
    ("env.guess_number", REFUSED, "it generates the training prompts"),
    ("env.sliding_puzzle_game", REFUSED, "it generates the training prompts"),
    ("data_plane", FREE, "where rollouts are kept within a step"),
    ("cluster", FREE, "the machines the run uses"),
    ("checkpointing", FREE, "when and where checkpoints are written"),
    ("logger", FREE, "where metrics go"),
    ("early_stop", FREE, "when the steps to come stop"),
    ("expected", FREE, "what is printed at the end, nothing the run computes"),
]

RULES: dict[str, tuple[str, str]] = {}
for _prefix, _cls, _why in _TABLE:
    for _section in LOOP_SECTIONS if _prefix.startswith("{loop}") else ("",):
        RULES[_prefix.replace("{loop}", _section)] = (_cls, _why)


def classify(key: str) -> tuple[str, str]:
    """``(class, why)`` of a dotted key by the longest rule that is a dotted prefix of it; refused if none."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        rule = RULES.get(".".join(parts[:n]))
        if rule is not None:
            return rule
    return REFUSED, "not classed for resume"


def rule_for(key: str) -> str | None:
    """The rule (a dotted prefix in :data:`RULES`) that classes ``key``, or None (the default: refused)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RULES:
            return ".".join(parts[:n])
    return None


_ABSENT = object()


def flatten(tree, prefix: str = "") -> dict[str, object]:
    """Dotted key -> leaf value of a nested dict (lists and ``None`` are leaves)."""
    if not isinstance(tree, dict) or (not tree and prefix):
        return {prefix: tree}
    out: dict[str, object] = {}
    for k, v in tree.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _show(value) -> str:
    if value is _ABSENT:
        return "absent"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _override(value) -> str:
    return "null" if value is None else _show(value).replace(" ", "")


@dataclasses.dataclass
class Change:
    key: str
    old: object
    new: object
    cls: str
    why: str

    def line(self) -> str:
        return f"{self.key}: {_show(self.old)} -> {_show(self.new)} ({self.cls})"


@dataclasses.dataclass
class ResumeCheck:
    """The keys that differ between a checkpoint's config and the run's, by class; ``refusals``: one-line errors."""

    changes: list[Change]
    refusals: list[str]

    def of_class(self, cls: str) -> list[Change]:
        return [c for c in self.changes if c.cls == cls]


def _loop_tree(tree: dict) -> dict:
    for section in LOOP_SECTIONS:
        if isinstance(tree.get(section), dict):
            return tree[section]
    return {}


def _needs_reference(tree: dict) -> bool:
    """Whether the policy worker keeps (and saves) a reference model."""
    kl = (tree.get("loss_fn") or {}).get("reference_policy_kl_penalty", 0)
    return kl != 0 and not _loop_tree(tree).get("skip_reference_policy_logprobs_calculation", False)


def _guards(old: dict, new: dict, where: str) -> list[str]:
    """Refusals that depend on the direction of a change of a key that is otherwise free."""
    out = []
    if _needs_reference(new) and not _needs_reference(old):
        out.append(f"{where}: loss_fn.reference_policy_kl_penalty: "
                   f"{_show((old.get('loss_fn') or {}).get('reference_policy_kl_penalty'))} there, "
                   f"{_show(new['loss_fn']['reference_policy_kl_penalty'])} now: the KL penalty needs the reference "
                   "model, which that run did not keep; keep it 0 to resume, or start a new run_dir")
    was = (_loop_tree(old).get("async_grpo") or {}).get("enabled", False)
    now = (_loop_tree(new).get("async_grpo") or {}).get("enabled", False)
    if was and not now:
        out.append(f"{where}: grpo.async_grpo.enabled: true there, false now: the asynchronous run's replay buffer "
                   "holds drawn prompts a synchronous run would never train; set grpo.async_grpo.enabled=true "
                   "to resume, or start a new run_dir")
    return out


def check_resume_config(old: dict, new: dict, where: str = "checkpoint") -> ResumeCheck:
    """Compare ``old`` (the checkpoint's ``config.yaml``) with ``new`` (``cfg.model_dump(mode="json")``);
    ``where`` starts each refusal."""
    a, b = flatten(old), flatten(new)
    changes, refusals = [], []
    for key in [*a, *(k for k in b if k not in a)]:
        was, now = a.get(key, _ABSENT), b.get(key, _ABSENT)
        if was == now:
            continue
        cls, why = classify(key)
        changes.append(Change(key, was, now, cls, why))
        if cls == REFUSED:
            fix = (f"set {key}={_override(was)} to resume" if was is not _ABSENT
                   else f"remove {key} to resume")
            refusals.append(f"{where}: {key}: {_show(was)} there, {_show(now)} now: a resumed run cannot change it "
                            f"({why}); {fix}, or start a new run_dir")
    refusals += _guards(old, new, where)
    return ResumeCheck(changes, refusals)


def loader_batch_size(tree: dict) -> int | None:
    """Prompts per loader batch of a resolved config (``num_prompts_per_step × batch_multiplier``)."""
    loop = _loop_tree(tree)
    if "num_prompts_per_step" not in loop:
        return None
    return int(loop["num_prompts_per_step"]) * int(loop.get("batch_multiplier", 1))


def check_checkpoint_config(checkpoint, new: dict, loader_state: dict) -> tuple[ResumeCheck, list[str]]:
    """Check ``new`` against ``checkpoint/config.yaml``; fill in ``loader_state`` the batch size a
    batch-counting state was saved at. Returns the check and the lines to say (changed keys, epoch position)."""
    from pathlib import Path

    from rlplane.config.yaml_limits import parse_config_yaml, read_config_text
    from rlplane.errors import ConfigError

    path = Path(checkpoint) / "config.yaml"
    try:
        old = parse_config_yaml(read_config_text(path), str(path), unique_keys=False)
    except ConfigError as e:
        detail = str(e).removeprefix(f"config {path}")[:200]  # ":LINE: what" or ": what"
        why = ("missing" if not path.is_file() else
               f"line {detail[1:]}" if detail[1:2].isdigit() else detail.lstrip(":, "))
        return ResumeCheck([], [f"checkpoint file {path} is missing or damaged ({why}); delete the "
                                "checkpoint it belongs to (resume then starts from the one before)"]), []
    check = check_resume_config(old if isinstance(old, dict) else {}, new, f"resume from {checkpoint}")
    old_batch, new_batch = loader_batch_size(old or {}), loader_batch_size(new)
    if old_batch is not None:
        loader_state.setdefault("num_prompts_per_batch", old_batch)
    # checkpointing.resume itself always differs: not news.
    lines = [f"resume: {c.line()}" for c in check.changes if c.key != "checkpointing.resume"]
    if check.of_class(CONVERTIBLE) and old_batch != new_batch and "epoch" in loader_state:
        done = loader_state.get("prompts_done_in_epoch",
                                int(loader_state.get("batches_done_in_epoch", 0)) * (old_batch or 0))
        of = f" of {loader_state['dataset_size']}" if "dataset_size" in loader_state else ""
        lines.append(f"resume: prompts per batch {old_batch} -> {new_batch}: epoch {loader_state['epoch']} continues "
                     f"at its prompt {done + 1}{of}")
    return check, lines
