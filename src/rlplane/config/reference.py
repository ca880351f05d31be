"""The config reference (``docs/config.md``), generated from the schema: every key with its default, range, what it
does and the NeMo RL key it maps.

    python -m rlplane.config.reference > docs/config.md

A test holds the checked-in page against this module's output, so the page cannot drift from the schema. Keys are
NeMo RL's where the feature is the same (:data:`NEMO_RENAMED` lists the ones that move or change form in
:mod:`rlplane.config.nemo`, :data:`RLPLANE_ONLY` those NeMo RL has no counterpart of).
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from rlplane.config.schema import RunConfig

# rlplane key (or section, ending in ".") -> the NeMo RL key it is read from (config/nemo.py translates).
NEMO_RENAMED: dict[str, str] = {
    "policy.optimizer.": "policy.optimizer.kwargs.",
    "value.optimizer.": "value.optimizer.kwargs.",
    "policy.scheduler.": "policy.scheduler (LinearLR warm-up, then ConstantLR / CosineAnnealingLR / LinearLR)",
    "value.scheduler.": "value.scheduler (as policy.scheduler)",
    "value.loss_fn.": "value_loss_fn.",
    "policy.lora.enabled": "policy.dtensor_cfg.lora_cfg.enabled",
    "policy.lora.rank": "policy.dtensor_cfg.lora_cfg.dim",
    "policy.lora.alpha": "policy.dtensor_cfg.lora_cfg.alpha",
    "policy.lora.dropout": "policy.dtensor_cfg.lora_cfg.dropout",
    "policy.lora.target_modules": "policy.dtensor_cfg.lora_cfg.target_modules (with match_all_linear: false)",
    "policy.activation_checkpointing": "policy.dtensor_cfg.activation_checkpointing",
    "data.dataset": "data.train.dataset_name (ResponseDataset: jsonl)",
    "data.train.path": "data.train.data_path",
    "data.train.problem_key": "data.train.input_key",
    "data.train.answer_key": "data.train.output_key",
    "data.train.default_task_name": "data.default.env_name",
    "data.validation.path": "data.validation.data_path",
    "data.validation.problem_key": "data.train.input_key",
    "data.validation.answer_key": "data.train.output_key",
    "data.validation.default_task_name": "data.default.env_name",
    "data.prompt.processor": "data.default.processor",
    "data.prompt.prompt_file": "data.default.prompt_file",
    "data.prompt.system_prompt_file": "data.default.system_prompt_file",
}
# Keys (or sections, ending in ".") NeMo RL has no counterpart of.
RLPLANE_ONLY: tuple[str, ...] = (
    "algorithm", "runtime", "run_dir", "warmup.", "teacher.warmup.", "teacher.tiny.", "policy.tiny.",
    "policy.attn_implementation", "policy.shared_prefix_forward", "policy.device", "policy.dp_size",
    "policy.threads_per_worker", "policy.sequence_packing.row_tokens", "policy.generation.hf_decode",
    "policy.generation.num_generators", "policy.generation.timeout_s", "policy.generation.vllm_cfg.enable_sleep_mode",
    "policy.generation.verify_weights", "policy.generation.verify_probe_every", "data.", "env.", "data_plane.index",
    "cluster.num_cpus", "cluster.address", "cluster.connect_timeout_s", "checkpointing.resume", "logger.jsonl_enabled",
    "logger.wandb.entity", "logger.wandb.dir", "logger.connect_timeout_s", "logger.progress_bar",
    "logger.log_every_n_steps", "logger.log_train_samples_every", "early_stop.", "expected.",
    "grpo.async_grpo.max_concurrent_scoring", "grpo.async_grpo.collector_process",
)
# Loop keys of rlplane's own, in every loop section.
RLPLANE_LOOP_KEYS = ("dynamic_sampling_shortfall", "rollout_failure_policy", "rollout_max_retries", "watchdog_s",
                     "reward_control")
# Loop keys NeMo RL's GRPO loop has and its PPO and distillation loops lack (rlplane's loops share them).
NEMO_GRPO_ONLY = ("val_num_generations_per_prompt", "overlong_filtering", "use_dynamic_sampling",
                  "dynamic_sampling_max_gen_batches", "batch_multiplier", "seq_logprob_error_threshold",
                  "skip_reference_policy_logprobs_calculation", "reward_shaping", "reward_scaling",
                  "stop_at_validation_metric", "stop_at_validation_threshold")
REQUIRED = object()  # a key with no default (given whenever its section is)


@dataclass(frozen=True)
class KeyDoc:
    key: str
    default: str
    range: str
    description: str
    nemo: str


def _sections(annotation) -> list[type[BaseModel]]:
    """The config models ``annotation`` names (``Model`` or ``Model | None``)."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (
        annotation,)
    return [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]


def _range(annotation, info: FieldInfo) -> str:
    """The choices of a ``Literal`` (``null`` too where it is admitted), else the type and its bounds."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (
        annotation,)
    choices = [a for arg in args if typing.get_origin(arg) is typing.Literal for a in typing.get_args(arg)]
    if choices:
        return " \\| ".join([f"`{c}`" for c in choices] + ["`null`"] * (type(None) in args))
    signs = {annotated_types.Ge: ">=", annotated_types.Gt: ">", annotated_types.Le: "<=", annotated_types.Lt: "<"}
    bounds = [f"{signs[type(m)]} {getattr(m, type(m).__name__.lower())}" for m in info.metadata if type(m) in signs]
    return ", ".join([_type(annotation), *bounds])


def _type(annotation) -> str:
    """``int``, ``float or null``, ``list[str]``: the type a key takes, as a YAML reader says it."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is typing.Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def _value(value) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return f"`{json.dumps(value)}`"


def _nemo(key: str) -> str:
    for prefix, name in NEMO_RENAMED.items():
        if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
            return f"`{name + key[len(prefix):] if name.endswith('.') else name}`"
    if any(key == k or (k.endswith(".") and key.startswith(k)) for k in RLPLANE_ONLY):
        return "—"
    loop, _, rest = key.partition(".")
    if loop in ("grpo", "ppo", "distillation") and rest.split(".")[0] in RLPLANE_LOOP_KEYS:
        return "—"
    if loop in ("ppo", "distillation") and rest.split(".")[0] in NEMO_GRPO_ONLY:
        return f"`grpo.{rest}` (NeMo RL's GRPO loop)"
    return "same"


def config_keys(model: type[BaseModel] = RunConfig, instance: BaseModel | None = None,
                prefix: str = "") -> list[KeyDoc]:
    """Every leaf key under ``model``, depth first in the schema's order; defaults read off ``instance`` where there
    is one (a section's own default), else off the field (a section that is null unless its recipe runs)."""
    out: list[KeyDoc] = []
    for name, info in model.model_fields.items():
        key = prefix + name
        if instance is not None:
            value = getattr(instance, name)
        else:
            value = REQUIRED if info.is_required() else info.get_default(call_default_factory=True)
        sub = _sections(info.annotation)
        if sub:
            out += config_keys(sub[0], value if isinstance(value, sub[0]) else None, f"{key}.")
            continue
        description = " ".join((info.description or "").split()).replace("|", "\\|")
        out.append(KeyDoc(key, "(required)" if value is REQUIRED else _value(value),
                          _range(info.annotation, info), description, _nemo(key)))
    return out


def _section_doc(model: type[BaseModel], info: FieldInfo | None) -> str:
    text = (info.description if info is not None and info.description else None) or (model.__doc__ or "")
    return " ".join(text.strip().split("\n\n")[0].split())


def reference_markdown() -> str:
    """``docs/config.md``: one table per top-level section."""
    lines = [
        "# Config reference",
        "",
        "Every key of a run's config, generated from the schema (`src/rlplane/config/`) by",
        "`python -m rlplane.config.reference > docs/config.md`; a test keeps the two equal. `rlplane show-config`",
        "prints a run's resolved values. **NeMo RL**: `same` = the same key in NeMo RL's YAML, a key = where",
        "`rlplane train --config a_nemo_rl_file.yaml` reads it from (`docs/nemo.md`), — = rlplane's own.",
        "The loop keys (`grpo.*`, `ppo.*`, `distillation.*`) are shared by every recipe; NeMo RL has some in one",
        "loop only.",
        "",
    ]
    defaults = RunConfig()
    lines += ["## Top level", "", *_table([k for k in config_keys() if "." not in k.key]), ""]
    for name, info in RunConfig.model_fields.items():
        sub = _sections(info.annotation)
        if not sub:
            continue
        value = getattr(defaults, name)
        keys = config_keys(sub[0], value, f"{name}.")
        when = "" if value is not None else " (null unless its recipe runs)"
        lines += [f"## `{name}`{when}", "", _section_doc(sub[0], info), "", *_table(keys), ""]
    return "\n".join(lines).rstrip() + "\n"


def _table(keys: list[KeyDoc]) -> list[str]:
    rows = ["| key | default | range | what it does | NeMo RL |", "|---|---|---|---|---|"]
    rows += [f"| `{k.key}` | {k.default} | {k.range} | {k.description} | {k.nemo} |" for k in keys]
    return rows


if __name__ == "__main__":
    print(reference_markdown(), end="")
