"""NeMo RL's YAML configs read as rlplane configs (``rlplane train --config a_nemo_rl_config.yaml``).

Reading (``defaults:`` chains, ``${...}`` interpolation, Hydra-style overrides) is in
:mod:`rlplane.config.nemo_yaml`, the tables of NeMo-only keys in :mod:`rlplane.config.nemo_keys`.
A file is read this way when its merged tree has NeMo RL's shape: an interpolation or a key only
NeMo RL has (:data:`NEMO_MARKERS`). The tree is then translated to rlplane's keys
(``docs/nemo.md`` has the table): most keys are the same names; some move or change form
(``policy.optimizer.kwargs`` -> ``policy.optimizer``, ``value_loss_fn`` -> ``value.loss_fn``);
NeMo-only features that are off are dropped with one line of note each; NeMo-only features that
are on (Megatron, tensor parallelism, sglang, ...) are refused, one line each naming the key and
rlplane's alternative. Keys neither NeMo RL nor rlplane knows stay errors of the rlplane schema.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlplane.config.nemo_data import translate_data
from rlplane.config.nemo_keys import FEATURES, GENERATION_BACKENDS, NO_EFFECT, PRECISION, is_off
from rlplane.config.nemo_translation import Translation
from rlplane.config.nemo_yaml import (
    apply_hydra_overrides,
    get_key,
    load_nemo_chain,
    looks_like_nemo,
    resolve_interpolations,
)
from rlplane.config.yaml_limits import ConfigTooLarge
from rlplane.config.yaml_tree import PRESET_DIR
from rlplane.errors import ConfigError
from rlplane.extras import vllm_available


def _optimizer(t: Translation, section: str) -> None:
    """NeMo RL's ``{name: torch.optim.AdamW, kwargs: {...}}`` -> rlplane's AdamW fields."""
    opt = t.pop(f"{section}.optimizer")
    if not isinstance(opt, dict) or "kwargs" not in opt and "name" not in opt:
        if opt is not None:
            t.put(f"{section}.optimizer", opt)  # already rlplane's shape
        return
    kwargs = dict(opt.get("kwargs") or {})
    name = opt.get("name", "torch.optim.AdamW")
    if name not in ("torch.optim.AdamW", "AdamW") and not (name in ("torch.optim.Adam", "Adam")
                                                           and not kwargs.get("weight_decay")):
        t.refuse(f"{section}.optimizer.name", name, "rlplane trains with AdamW; set torch.optim.AdamW")
    kwargs.pop("foreach", None), kwargs.pop("fused", None)
    kept = {k: kwargs.pop(k) for k in ("lr", "weight_decay", "betas", "eps") if k in kwargs}
    kept.update({k: v for k, v in opt.items() if k not in ("name", "kwargs")})  # rlplane keys set by an override
    for k, v in kwargs.items():
        t.refuse(f"{section}.optimizer.kwargs.{k}", v, "not an rlplane optimizer setting (lr, weight_decay, betas, "
                                                       "eps); remove it")
    t.put(f"{section}.optimizer", kept)


def _scheduler(t: Translation, section: str) -> None:
    """NeMo RL's ``[LinearLR warm-up, ConstantLR | CosineAnnealingLR | LinearLR fall, {milestones}]`` ->
    rlplane's warm-up then ``decay`` (constant / cosine / linear). Other shapes are refused."""
    sched = t.pop(f"{section}.scheduler")
    if sched is None or isinstance(sched, dict):
        if sched is not None:
            t.put(f"{section}.scheduler", sched)
        return
    stages = [s for s in sched if isinstance(s, dict) and "name" in s]
    names = [s["name"].rsplit(".", 1)[-1] for s in stages]
    kwargs = [dict(s.get("kwargs") or {}) for s in stages]
    milestones = next((list(s["milestones"]) for s in sched if isinstance(s, dict) and "milestones" in s), [])
    out = _schedule_of(names, kwargs, milestones, get_key(t.tree, f"{section}.optimizer.lr"))
    if out is None:
        t.refuse(f"{section}.scheduler", names, "rlplane's schedule is a linear warm-up, then constant, linear or "
                                                "cosine decay (NeMo RL's LinearLR, then ConstantLR, LinearLR or "
                                                "CosineAnnealingLR at the warm-up's milestone); set "
                                                f"{section}.scheduler.warmup_steps / decay / decay_steps / "
                                                "min_lr_factor")
    else:
        t.put(f"{section}.scheduler", out)


def _schedule_of(names: list[str], kwargs: list[dict], milestones: list, lr: float | None) -> dict | None:
    """rlplane's scheduler section for NeMo RL's stages, or None where it has no equal."""
    out: dict = {"warmup_steps": 0}
    first = kwargs[0] if kwargs else {}
    if names[:1] == ["LinearLR"] and float(first.get("end_factor", 1.0)) == 1.0:  # a warm-up stage
        out = {"warmup_steps": int(first.get("total_iters", 5)),
               "warmup_start_factor": float(first.get("start_factor", 1.0 / 3))}
        names, kwargs = names[1:], kwargs[1:]
        if names and milestones[:1] != [out["warmup_steps"]]:
            return None  # the next stage must start where the warm-up ends
    if not names or (names == ["ConstantLR"] and float(kwargs[0].get("factor", 1.0)) == 1.0):
        return out
    if len(names) != 1:
        return None
    name, kw = names[0], kwargs[0]
    if name == "CosineAnnealingLR" and "T_max" in kw:
        eta_min = float(kw.get("eta_min", 0.0))
        if eta_min and not lr:
            return None
        # torch's cosine rises again after T_max; rlplane's stays at the floor (runs end by then).
        return {**out, "decay": "cosine", "decay_steps": int(kw["T_max"]),
                "min_lr_factor": eta_min / lr if eta_min else 0.0}
    if name == "LinearLR" and float(kw.get("start_factor", 1.0 / 3)) == 1.0:
        return {**out, "decay": "linear", "decay_steps": int(kw.get("total_iters", 5)),
                "min_lr_factor": float(kw.get("end_factor", 1.0))}
    return None


def _model_section(t: Translation, section: str) -> None:
    """What policy, value and teacher share in NeMo RL: precision, tokenizer, parallelism, LoRA."""
    tok = t.pop(f"{section}.tokenizer.name")
    if tok is not None and tok != get_key(t.tree, f"{section}.model_name", tok):
        t.refuse(f"{section}.tokenizer.name", tok, f"rlplane uses the model's own tokenizer ({section}.model_name); "
                                                   "put the tokenizer files in the model directory")
    precision = t.pop(f"{section}.precision")
    if precision is not None:
        if precision in PRECISION:
            t.put(f"{section}.precision", PRECISION[precision])
        else:
            t.refuse(f"{section}.precision", precision, "rlplane runs bf16 autocast or fp32; set bfloat16 or float32")
    if t.has(f"{section}.dtensor_cfg.activation_checkpointing"):
        value = t.pop(f"{section}.dtensor_cfg.activation_checkpointing")
        if not t.has(f"{section}.activation_checkpointing"):  # rlplane's own key, where given, wins
            t.put(f"{section}.activation_checkpointing", value)
    lora = t.pop(f"{section}.dtensor_cfg.lora_cfg")
    if isinstance(lora, dict) and lora.get("enabled"):
        out = {"enabled": True, "rank": lora.get("dim", 8), "alpha": lora.get("alpha", 32),
               "dropout": lora.get("dropout", 0.0)}
        if lora.get("target_modules") and not lora.get("match_all_linear", True):
            out["target_modules"] = lora["target_modules"]
        if lora.get("exclude_modules"):
            t.refuse(f"{section}.dtensor_cfg.lora_cfg.exclude_modules", lora["exclude_modules"],
                     "rlplane names the adapted layers instead: set policy.lora.target_modules")
        t.put(f"{section}.lora", out)
    elif lora is not None:
        t.note(f"{section}.dtensor_cfg.lora_cfg: NeMo RL's LoRA, off here: ignored (rlplane: policy.lora)")
    _parallelism(t, section)


def _parallelism(t: Translation, section: str) -> None:
    """``dtensor_cfg``'s FSDP2 switch, tensor / context / sequence parallelism and CPU offload. rlplane shards by
    FSDP2 data parallelism only: TP and CP > 1 are read as that, over the same devices, with a note on what differs."""
    d = f"{section}.dtensor_cfg"
    enabled = t.pop(f"{d}.enabled") if t.has(f"{d}.enabled") else None
    sharded = section == "policy" and bool(get_key(t.tree, "policy.dp_size")) and bool(enabled)
    if sharded:
        t.put("policy.dtensor_cfg.enabled", True)  # the user asked for ranks: NeMo RL's FSDP2 over them
    elif enabled and section == "policy":
        t.note(f"{d}.enabled: NeMo RL's FSDP2 worker at its cluster's size; read as one unsharded rank (runtime: "
               "local); to shard set runtime=ray policy.dp_size=N policy.dtensor_cfg.enabled=true")
    tp, cp = t.pop(f"{d}.tensor_parallel_size") or 1, t.pop(f"{d}.context_parallel_size") or 1
    sp, offload = t.pop(f"{d}.sequence_parallel"), t.pop(f"{d}.cpu_offload")
    split = [f"tensor_parallel_size = {tp}"] * (tp > 1) + [f"context_parallel_size = {cp}"] * (cp > 1)
    if split:
        t.note(f"{d}.{{{', '.join(split)}}}: NeMo RL splits each layer's weights over TP ranks and each sequence "
               "over CP ranks; rlplane shards the same model by FSDP2 data parallelism over the same devices instead "
               "(runtime=ray policy.dp_size=N policy.dtensor_cfg.enabled=true): each rank holds 1/N of the weights, "
               "gradients and optimizer state but computes whole layers on whole sequences, so one sequence's "
               "activations sit on one device (policy.activation_checkpointing trims them)"
               + ("" if section == "policy" else f"; the {section} runs with the policy's settings"))
    if sp:
        t.note(f"{d}.sequence_parallel = true: NeMo RL's sequence parallelism splits activations within a tensor-"
               + ("parallel group, which does nothing with tensor_parallel_size = 1 there either" if tp == 1 else
                  "parallel group; with TP read as FSDP2 data parallelism there is none here") + ": ignored")
    if offload and sharded:
        t.put("policy.dtensor_cfg.cpu_offload", True)
    elif offload:
        t.note(f"{d}.cpu_offload = true: FSDP2's CPU offload of sharded ranks (policy.dtensor_cfg.cpu_offload); "
               + ("this run's one unsharded rank keeps its weights where it computes; with runtime=ray "
                  "policy.dp_size=N policy.dtensor_cfg.enabled=true it applies" if section == "policy" else
                  f"the {section} runs with the policy's settings"))


def _features(t: Translation) -> None:
    """The NeMo-only features: refused when on; when off, dropped with one note per section."""
    off: dict[str, list[str]] = {}
    for key, off_when, what, instead in FEATURES:
        # The policy's model settings exist in NeMo RL's value and teacher sections too.
        for where in [key] + ([key.replace("policy.", f"{m}.", 1) for m in ("value", "teacher")]
                              if key.startswith("policy.") and not key.startswith("policy.generation") else []):
            if not t.has(where):
                continue
            value = t.pop(where)
            if off_when(value):
                off.setdefault(where.rpartition(".")[0], []).append(f"{where.rpartition('.')[2]} ({what})")
                continue
            rule = f"NeMo RL's {what}, which rlplane does not have; {instead}"
            if isinstance(value, dict) and "enabled" in value:  # a section switched on: name its switch
                t.refuse(f"{where}.enabled", value["enabled"], rule)
            else:
                t.refuse(where, {k: v for k, v in value.items() if not is_off(v)} if isinstance(value, dict) else value,
                         rule)
    for section, items in off.items():
        t.note(f"{section + '.' if section else ''}{{{', '.join(items)}}}: NeMo RL features, off here: ignored")
    no_effect = [k.replace("policy.", f"{m}.", 1) for k in NO_EFFECT for m in ("policy", "value", "teacher")
                 if k.startswith("policy.") and not k.startswith("policy.generation")] + list(NO_EFFECT)
    dropped = [key for key in dict.fromkeys(no_effect) if t.has(key)]
    for key in dropped:
        t.pop(key)
    if dropped:
        t.note(f"ignored, no rlplane counterpart and no effect on what it computes: {', '.join(dropped)}")


def _generation(t: Translation) -> None:
    g = "policy.generation"
    backend = get_key(t.tree, f"{g}.backend")
    if backend is not None and backend not in GENERATION_BACKENDS:
        t.refuse(f"{g}.backend", backend, "rlplane generates with hf (transformers) or vllm; set one of them")
        t.pop(f"{g}.backend")
    elif backend == "vllm" and not vllm_available():  # NeMo RL's files all name vllm; a CPU venv has no vllm
        t.put(f"{g}.backend", "hf")
        t.note(f"{g}.backend = vllm: vllm is not installed in this Python: read as hf (transformers); for vLLM "
               "install the vllm extra (docs/vllm.md)")
    new, total = get_key(t.tree, f"{g}.max_new_tokens"), get_key(t.tree, "policy.max_total_sequence_length")
    if isinstance(new, int) and isinstance(total, int) and new >= total:
        t.put(f"{g}.max_new_tokens", max(1, total // 2))
        t.note(f"{g}.max_new_tokens = {new}: NeMo RL caps prompt + response at max_model_len; rlplane's "
               f"max_new_tokens must leave the prompt room: read as {max(1, total // 2)} (half of "
               "policy.max_total_sequence_length); set it to choose")
    extra = get_key(t.tree, f"{g}.vllm_kwargs")
    if get_key(t.tree, f"{g}.backend") != "vllm" and extra is not None:
        t.pop(f"{g}.vllm_kwargs")
        if extra:
            t.note(f"{g}.vllm_kwargs = {extra}: vLLM engine arguments, unused: generation runs on hf here")
    kv = t.pop(f"{g}.vllm_cfg.kv_cache_dtype")
    if kv not in (None, "auto"):
        t.refuse(f"{g}.vllm_cfg.kv_cache_dtype", kv, "rlplane's vLLM engine keeps the KV cache in the model dtype; "
                                                     "set auto")


def _grpo(t: Translation) -> None:
    for key in ("normalize_rewards", "use_leave_one_out_baseline"):
        if not t.has(f"grpo.{key}"):
            continue
        value = t.pop(f"grpo.{key}")
        est = f"grpo.adv_estimator.{key}"
        if not t.has(est):
            t.put(est, value)  # NeMo RL's older layout: the estimator reads the grpo-level key
        elif get_key(t.tree, est) != value:
            t.note(f"grpo.{key} = {value}: ignored; {est} = {get_key(t.tree, est)} is what the estimator reads")


def _batch_multiplier(t: Translation, loop: str) -> None:
    value = get_key(t.tree, f"{loop}.batch_multiplier")
    if isinstance(value, float):
        if value.is_integer():
            t.put(f"{loop}.batch_multiplier", int(value))
        else:
            t.pop(f"{loop}.batch_multiplier")
            t.refuse(f"{loop}.batch_multiplier", value, "rlplane's dataloader batch is prompts × a whole number; "
                                                        "set 1 (or an integer with use_dynamic_sampling)")


def _async_grpo(t: Translation) -> None:
    from rlplane.config.schema import AsyncGRPOConfig

    key = "grpo.async_grpo.max_generation_failures"
    if t.has(key) and "max_generation_failures" not in AsyncGRPOConfig.model_fields:
        value = t.pop(key)
        t.note(f"{key} = {value}: ignored; rlplane's collector stops the run on a failed generation batch")


def _value(t: Translation) -> None:
    if t.has("value_loss_fn"):
        t.put("value.loss_fn", t.pop("value_loss_fn"))
    if not isinstance(get_key(t.tree, "value"), dict):
        return
    model = t.pop("value.model_name")
    if model is not None and model != get_key(t.tree, "policy.model_name"):
        t.refuse("value.model_name", model, "rlplane's critic starts from the policy's weights "
                                            "(policy.model_name); remove it")
    _model_section(t, "value")
    _optimizer(t, "value")
    _scheduler(t, "value")
    rm = t.pop("value.reward_model_cfg")
    if isinstance(rm, dict) and rm.get("reward_model_type", "regression") != "regression":
        t.refuse("value.reward_model_cfg.reward_model_type", rm["reward_model_type"],
                 "rlplane's critic is a regression head (num_labels = 1); set regression")
    keep = ("optimizer", "scheduler", "max_grad_norm", "loss_fn")
    rest = sorted(k for k in t.tree["value"] if k not in keep)
    for k in rest:
        t.pop(f"value.{k}")
    if rest:
        t.note(f"value.{{{', '.join(rest)}}}: ignored; rlplane's critic has the policy's architecture, batch sizes, "
               "precision and device")


def _teacher(t: Translation) -> None:
    if not isinstance(get_key(t.tree, "teacher"), dict):
        return
    _model_section(t, "teacher")
    keep = {k: t.tree["teacher"].pop(k) for k in ("model_name", "tiny", "warmup") if k in t.tree["teacher"]}
    rest = sorted(t.tree.pop("teacher"))
    keep.setdefault("warmup", {"enabled": False})  # NeMo RL has no supervised warm-up stage, for either model
    t.tree["teacher"] = keep
    if rest:
        t.note(f"teacher.{{{', '.join(rest)}}}: ignored; rlplane's teacher is frozen and runs with the policy's "
               "batch sizes, precision and device")


def _envs(t: Translation) -> None:
    """NeMo RL's ``env.sliding_puzzle_game.cfg: {game_config: {size, shuffle_moves}, max_moves}`` -> rlplane's
    ``env.sliding_puzzle_game: {size, shuffle_moves, max_moves}``."""
    cfg = t.pop("env.sliding_puzzle_game.cfg")
    if isinstance(cfg, dict):
        game = dict(cfg.get("game_config") or {})
        t.put("env.sliding_puzzle_game", {**{k: game[k] for k in ("size", "shuffle_moves") if k in game},
                                          **({"max_moves": cfg["max_moves"]} if "max_moves" in cfg else {})})


def _data_plane(t: Translation) -> None:
    enabled = t.pop("data_plane.enabled")
    backend = t.pop("data_plane.backend") if get_key(t.tree, "data_plane.backend") not in ("memory", "ray") else None
    if backend not in (None, "simple"):
        t.refuse("data_plane.backend", backend, "rlplane's planes are memory (runtime: local) and ray (runtime: ray); "
                                                "set data_plane.backend=ray")
    if t.tree.get("runtime") == "ray" and not t.has("data_plane.backend"):
        t.put("data_plane.backend", "ray")  # workers in other processes: the plane they all reach
    if enabled:
        t.note("data_plane.enabled: rlplane's steps always run through its data plane; read as "
               f"data_plane.backend = {get_key(t.tree, 'data_plane.backend', 'memory')}")
    elif enabled is not None:
        t.note("data_plane.enabled = false: rlplane's steps always run through its data plane "
               f"(data_plane.backend = {get_key(t.tree, 'data_plane.backend', 'memory')})")


def translate(tree: dict) -> tuple[dict, list[str], list[str]]:
    """A resolved NeMo RL tree -> (rlplane tree, notes, refusals)."""
    t = Translation(tree)
    algorithm = t.tree.get("algorithm") or next((a for a in ("ppo", "distillation") if a in t.tree), "grpo")
    t.tree.setdefault("algorithm", algorithm)
    if "warmup" not in t.tree:  # NeMo RL has no supervised warm-up stage
        t.put("warmup.enabled", False)
    if not t.has("policy.device"):  # NeMo RL runs on GPUs; "auto" runs on one where the worker sees it
        t.put("policy.device", "auto")
    _grpo(t)
    _async_grpo(t)
    _batch_multiplier(t, algorithm)
    _model_section(t, "policy")
    _optimizer(t, "policy")
    _scheduler(t, "policy")
    _generation(t)
    translate_data(t)
    _envs(t)
    _data_plane(t)
    _features(t)
    _value(t)
    _teacher(t)
    return t.tree, t.notes, t.errors


def read_nemo_config(name: str | None, overrides: list[str], said: list[str] | None = None) -> dict | None:
    """The rlplane tree of a NeMo RL config file with ``overrides`` applied; None when ``name`` is not one
    (an rlplane preset, or a file of rlplane's own shape). Prints one line saying so, and its notes, on
    stderr (or adds them to ``said``, for the caller to print once the config is valid); raises
    :class:`ConfigError` with every refusal at once, without the notes."""
    if not name:
        return None
    path = Path(name)
    if not path.is_file() or path.resolve().parent == PRESET_DIR:
        return None
    try:
        tree = load_nemo_chain(path)
    except ConfigTooLarge:
        raise
    except ConfigError:
        return None  # a file rlplane's own loader cannot read either: its error says why
    if tree is None or not looks_like_nemo(tree):
        return None
    # A model named by an override brings its own tokenizer, as its files hold it (NeMo RL keeps the file's).
    given = {o.lstrip("+").split("=", 1)[0] for o in overrides}
    follow = [f"{m}.tokenizer.name=${{{m}.model_name}}" for m in ("policy", "value", "teacher")
              if f"{m}.model_name" in given and f"{m}.tokenizer.name" not in given and get_key(tree, f"{m}.tokenizer")]
    tree = resolve_interpolations(apply_hydra_overrides(tree, [*overrides, *follow]))
    out, notes, errors = translate(tree)
    out.setdefault("run_dir", f"runs/{path.stem}")  # NeMo RL has none; rlplane's default names its own preset
    log_dir = get_key(out, "logger.log_dir")
    if log_dir and "logger.log_dir" not in given:  # NeMo RL's files share `logs`; each NeMo run takes a new exp_NNN
        out["logger"]["log_dir"] = str(Path(log_dir) / path.stem)
        notes.append(f"logger.log_dir = {log_dir}: NeMo RL logs each run to a new {log_dir}/exp_NNN; read as "
                     f"{out['logger']['log_dir']} (another file's runs log beside it; this file's next run continues "
                     "there with checkpointing.resume=true or replaces it with --overwrite, as its run_dir)")
    if errors:  # the notes would only bury what to fix
        raise ConfigError(errors)
    lines = [f"rlplane: {name}: read as NeMo RL format ({len(notes)} notes); rlplane's keys: rlplane show-config "
             f"--config {name}", *(f"rlplane: note: {line}" for line in notes)]
    if said is None:
        print("\n".join(lines), file=sys.stderr)
    else:
        said.extend(lines)
    return out
