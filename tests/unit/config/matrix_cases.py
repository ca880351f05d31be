"""The bad-input matrix's cases: the world a hostile-but-ordinary user has (files, a finished run, a model
directory) and the commands and Python API calls they try on it, by surface (the case id's first part).
Run and judged by ``test_bad_input_matrix.py``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

from rlplane.cli import main
from tests.tiny import TINY_RUN

# Tiny and fast: a run that does start trains 2 steps of a 1-layer model in well under a second.
TINY = list(TINY_RUN)
GOOD_ROW = '{"problem": "1+1=", "answer": "2"}\n'
USER_MODULE = """
import sys

def exits(prompt, completion, extra):
    sys.exit(0)

def raises(prompt, completion, extra):
    raise KeyError("ground_truth")

def score(prompt, completion, extra):
    return 1.0

class BrokenEnv:
    def __init__(self):
        raise ValueError("no judge configured")

    def step(self, message_logs, metadata):
        raise AssertionError

class ExitingEnv:
    def __init__(self):
        sys.exit(3)

    def step(self, message_logs, metadata):
        raise AssertionError
"""


# ---- the world a user has: files, a finished run, a model directory ----------------------------------
def build_world(w: Path) -> None:
    """A finished run, its exported model, and the user's files (good and bad) under ``w``."""
    assert main(["train", "--quiet", *TINY, f"run_dir={w / 'run'}"]) == 0
    assert main(["export", "--checkpoint", str(w / "run"), "-o", str(w / "model")]) == 0
    (w / "afile").write_text("a file the user keeps\n")
    (w / "emptydir").mkdir()
    (w / "full").mkdir()
    (w / "full" / "keep.txt").write_text("keep me\n")
    (w / "good.jsonl").write_text(GOOD_ROW * 4)
    (w / "latin1.jsonl").write_bytes(b'{"problem": "caf\xe9 1+1=", "answer": "2"}\n')
    (w / "latin1_line3.jsonl").write_bytes(GOOD_ROW.encode() * 2 + b'{"problem": "\xff", "answer": "2"}\n')
    (w / "notjson.jsonl").write_text(GOOD_ROW + "{problem: 1+1=}\n")
    (w / "list.jsonl").write_text("[1, 2]\n")
    (w / "nofield.jsonl").write_text('{"question": "1+1=", "answer": "2"}\n')
    (w / "empty.jsonl").write_text("")
    (w / "blank.jsonl").write_text("\n\n  \n")
    (w / "long.jsonl").write_text(GOOD_ROW + '{"problem": "' + "1" * 40 + '+1=", "answer": "2"}\n')
    (w / "alllong.jsonl").write_text(('{"problem": "' + "1" * 40 + '+1=", "answer": "2"}\n') * 2)
    (w / "badtask.jsonl").write_text('{"problem": "1+1=", "answer": "2", "task_name": "no_such_env"}\n')
    (w / "nocol.csv").write_text("question,answer\n1+1=,2\n")
    (w / "latin1.csv").write_bytes(b"problem,answer\n1+1=\xe9,2\n")
    (w / "garbage.parquet").write_bytes(b"PAR1 not really parquet")
    (w / "broken.json").write_text('{"problem": "1+1=", "answer": 2\n')
    (w / "bad_yaml.yaml").write_text("policy:\n  model_name: [unclosed\n")
    (w / "list.yaml").write_text("- a\n- b\n")
    (w / "latin1.yaml").write_bytes(b"run_dir: caf\xe9\n")
    (w / "cycle_a.yaml").write_text("defaults: cycle_b.yaml\n")
    (w / "cycle_b.yaml").write_text("defaults: cycle_a.yaml\n")
    (w / "orphan.yaml").write_text("defaults: no_such_parent.yaml\n")
    (w / "unknown_key.yaml").write_text("defaults: grpo_arithmetic\npolicyy: {}\n")
    model_bad_config = w / "model_bad_config"
    shutil.copytree(w / "model", model_bad_config)
    (model_bad_config / "config.json").write_text("{not json")
    model_trunc = w / "model_trunc"
    shutil.copytree(w / "model", model_trunc)
    _truncate(model_trunc / "model.safetensors")
    for name, answer in [("null", "null"), ("object", '{"x": 1}'), ("list", "[2]"), ("bool", "true"),
                         ("empty", '""'), ("blank", '" "')]:
        (w / f"answer_{name}.jsonl").write_text(GOOD_ROW + f'{{"problem": "2+2=", "answer": {answer}}}\n')
    (w / "dup_key.yaml").write_text("defaults: grpo_arithmetic\ngrpo:\n  max_num_steps: 5\n  max_num_steps: 7\n")
    (w / "dup_section.yaml").write_text("defaults: grpo_arithmetic\npolicy: {}\npolicy: {}\n")
    (w / "matrix_user.py").write_text(USER_MODULE)
    row = json.dumps({"step": 1, "train/reward": 0.5})
    for name, body in [("plot_not_utf8", row.encode() + b'\n{"step": 2, "x": "\xff"}\n' + row.encode()),
                       ("plot_garbage", b"{oops\n" + row.encode()), ("plot_list", b"[1, 2]\n" + row.encode()),
                       ("plot_no_step", b'{"train/reward": 1}\n' + row.encode()), ("plot_ok", row.encode())]:
        (w / name / "logs").mkdir(parents=True)
        (w / name / "logs" / "metrics.jsonl").write_bytes(body)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _run_copy(world: Path, t: Path) -> Path:
    """A private copy of the world's finished run (cases that damage it)."""
    run = t / "run"
    shutil.copytree(world / "run", run)
    return run


def _latest(run: Path) -> Path:
    return max((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))


def _damage(rel: str, how: str = "truncate"):
    def setup(world, t):
        run = _run_copy(world, t)
        target = _latest(run) / rel
        if how == "truncate":
            _truncate(target)
        elif how == "garbage":
            target.write_bytes(b"\x00garbage" * 8)
        elif how == "remove":
            target.unlink()
        elif how == "shard":  # a sharded save whose second shard is gone
            weights = target
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(weights)
            (weights / "model.safetensors").unlink()
            model.save_pretrained(weights, max_shard_size="2KB")
            shards = sorted(weights.glob("model-*.safetensors"))
            shards[1].unlink()
    return setup


def _existing_run(world, t):
    _run_copy(world, t)


def _checkpoints_in(t):
    def setup(world, t2):
        (t2 / "ck").mkdir()
        shutil.copytree(_latest(world / "run"), t2 / "ck" / "step_2")
    return setup


# ---- the cases ----------------------------------------------------------------------------------------
# (id, argv with {w} = world dir and {t} = the case's own dir, setup(world, t) or None)
T = ["--quiet", *TINY, "run_dir={t}/r"]  # a train command that would otherwise start a run
CASES: list[tuple[str, list[str], object]] = []


def case(cid: str, argv: list[str], setup=None) -> None:
    CASES.append((cid, argv, setup))


# config
for cid, ov in [
    ("config/unknown-key", "grpo.num_prompt_per_step=3"), ("config/lr-not-number", "policy.optimizer.lr=abc"),
    ("config/lr-negative", "policy.optimizer.lr=-1"), ("config/betas-above-1", "policy.optimizer.betas=[0.9,1.5]"),
    ("config/betas-negative", "policy.optimizer.betas=[-0.1,0.9]"),
    ("config/betas-one-value", "policy.optimizer.betas=[0.9]"),
    ("config/betas-equal-1", "policy.optimizer.betas=[1.0,0.999]"), ("config/eps-zero", "policy.optimizer.eps=0"),
    ("config/max-new-tokens-above-total", "policy.generation.max_new_tokens=40"),
    ("config/max-new-tokens-equal-total", "policy.generation.max_new_tokens=16"),
    ("config/max-new-tokens-zero", "policy.generation.max_new_tokens=0"),
    ("config/temperature-zero", "policy.generation.temperature=0"),
    ("config/top-p-above-1", "policy.generation.top_p=1.5"),
    ("config/top-k-negative", "policy.generation.top_k=-1"), ("config/vllm-missing", "policy.generation.backend=vllm"),
    ("config/total-length-1", "policy.max_total_sequence_length=1"), ("config/dp2-local", "policy.dp_size=2"),
    ("config/gbs-not-divisor", "policy.train_global_batch_size=3"),
    ("config/mbs-not-divisor", "policy.train_micro_batch_size=3"),
    ("config/heads-not-dividing", "policy.tiny.num_heads=3"), ("config/hidden-too-small", "policy.tiny.hidden_size=4"),
    ("config/precision-fp16", "policy.precision=fp16"), ("config/ray-memory-plane", "runtime=ray"),
    ("config/runtime-unknown", "runtime=cloud"), ("config/algorithm-unknown", "algorithm=dpo"),
    ("config/generations-zero", "grpo.num_generations_per_prompt=0"),
    ("config/steps-negative", "grpo.max_num_steps=-1"),
    ("config/ppo-keys-under-grpo", "ppo.ppo_epochs=2"),
    ("config/metric-no-prefix", "checkpointing.metric_name=accuracy"),
    ("config/keep-top-k-zero", "checkpointing.keep_top_k=0"),
    ("config/save-period-zero", "checkpointing.save_period=0"),
    ("config/dual-clip-below-1", "loss_fn.ratio_clip_c=0.5"),
    ("config/async-without-is", "grpo.async_grpo.enabled=true"),
    ("config/dataset-unknown", "data.dataset=nope"), ("config/on-overlong-unknown", "data.on_overlong_prompt=truncate"),
    ("config/no-equals", "grpo.max_num_steps"), ("config/section-not-mapping", "policy=5"),
    ("config/seed-not-int", "grpo.seed=abc"), ("config/bool-not-bool", "logger.progress_bar=maybe"),
    ("config/num-cpus-zero", "cluster.num_cpus=0"), ("config/adv-estimator-unknown", "grpo.adv_estimator.name=nope"),
    ("config/operands-reversed", "data.arithmetic.min_operand=50"),
    ("config/operator-unknown", "data.arithmetic.operators=[/]"),
    ("config/by-digits-share-above-1", "data.arithmetic.by_digits_share=1.5"),
    ("config/rg-seeds-equal", "data.reasoning_gym.val_seed=0"),
    ("config/vllm-gpu-mem-zero", "policy.generation.vllm_cfg.gpu_memory_utilization=0"),
    ("config/vllm-gpu-mem-above-1", "policy.generation.vllm_cfg.gpu_memory_utilization=1.5"),
    ("config/vllm-tp-zero", "policy.generation.vllm_cfg.tensor_parallel_size=0"),
]:
    extra = ["data.arithmetic.max_operand=10"] if cid == "config/operands-reversed" else []
    extra += ["data.dataset=reasoning_gym"] if cid == "config/rg-seeds-equal" else []
    case(cid, ["train", *T, ov, *extra])
for cid, cfg in [("config/no-such-preset", "nope"), ("config/yaml-syntax", "{w}/bad_yaml.yaml"),
                 ("config/yaml-not-mapping", "{w}/list.yaml"), ("config/yaml-not-utf8", "{w}/latin1.yaml"),
                 ("config/yaml-cycle", "{w}/cycle_a.yaml"), ("config/yaml-missing-parent", "{w}/orphan.yaml"),
                 ("config/yaml-unknown-key", "{w}/unknown_key.yaml"), ("config/yaml-is-directory", "{w}/emptydir")]:
    case(cid, ["train", "-c", cfg, *T])
case("config/show-config-unknown-key", ["show-config", "grpo.nope=1"])
case("config/show-config-no-preset", ["show-config", "-c", "nope"])

# data
J = ["data.dataset=jsonl"]
for cid, path in [("data/missing-file", "{t}/missing.jsonl"), ("data/directory", "{w}/emptydir"),
                  ("data/not-utf8", "{w}/latin1.jsonl"), ("data/not-utf8-line3", "{w}/latin1_line3.jsonl"),
                  ("data/not-json", "{w}/notjson.jsonl"), ("data/not-object", "{w}/list.jsonl"),
                  ("data/missing-field", "{w}/nofield.jsonl"), ("data/empty", "{w}/empty.jsonl"),
                  ("data/blank-lines", "{w}/blank.jsonl"), ("data/all-overlong", "{w}/alllong.jsonl"),
                  ("data/unknown-task", "{w}/badtask.jsonl")]:
    case(cid, ["train", *T, *J, f"data.train.path={path}"])
case("data/overlong-error", ["train", *T, *J, "data.train.path={w}/long.jsonl", "data.on_overlong_prompt=error"])
case("data/validation-not-utf8",
     ["train", *T, *J, "data.train.path={w}/good.jsonl", "data.validation.path={w}/latin1.jsonl"])
case("data/validation-missing",
     ["train", *T, *J, "data.train.path={w}/good.jsonl", "data.validation.path={t}/nope.jsonl"])
case("data/problem-key-wrong", ["train", *T, *J, "data.train.path={w}/good.jsonl", "data.train.problem_key=question"])
case("data/jsonl-no-path", ["train", *T, *J])
H = ["data.dataset=hf"]
for cid, path in [("data/hf-missing-column", "{w}/nocol.csv"), ("data/hf-not-utf8", "{w}/latin1.csv"),
                  ("data/hf-garbage-parquet", "{w}/garbage.parquet"), ("data/hf-glob-nothing", "{t}/*.parquet"),
                  ("data/hf-broken-json", "{w}/broken.json"), ("data/hf-unknown-extension", "{w}/afile")]:
    case(cid, ["train", *T, *H, f"data.train.path={path}"])
case("data/hf-format-unknown", ["train", *T, *H, "data.train.path={w}/nocol.csv", "data.train.format=xml"])
case("data/rg-unknown-task", ["train", *T, "data.dataset=reasoning_gym", "data.reasoning_gym.tasks=[no_such_task]"])

# models
for cid, name in [("model/embedded-unknown", "embedded:nope"), ("model/no-such-dir", "/nonexistent/model"),
                  ("model/is-a-file", "{w}/afile"), ("model/no-config-json", "{w}/emptydir"),
                  ("model/hub-offline", "someorg/somemodel"), ("model/config-json-broken", "{w}/model_bad_config"),
                  ("model/weights-truncated", "{w}/model_trunc"), ("model/packaged-unknown", "packaged:nope")]:
    case(cid, ["train", *T, f"policy.model_name={name}"])

# checkpoints: resuming a damaged or different run
R = ["--quiet", *TINY, "run_dir={t}/run", "grpo.max_num_steps=3", "checkpointing.resume=true"]
case("ckpt/weights-truncated", ["train", *R], _damage("policy/weights/model.safetensors"))
case("ckpt/weights-garbage", ["train", *R], _damage("policy/weights/model.safetensors", "garbage"))
case("ckpt/weights-missing", ["train", *R], _damage("policy/weights/model.safetensors", "remove"))
case("ckpt/shard-missing", ["train", *R], _damage("policy/weights", "shard"))
case("ckpt/optimizer-missing", ["train", *R], _damage("policy/optimizer.pt", "remove"))
case("ckpt/optimizer-garbage", ["train", *R], _damage("policy/optimizer.pt", "garbage"))
case("ckpt/dataloader-garbage", ["train", *R], _damage("dataloader.pt", "garbage"))
case("ckpt/rng-truncated", ["train", *R], _damage("rng.pt"))
case("ckpt/info-garbage", ["train", *R], _damage("training_info.json", "garbage"))
case("ckpt/other-hidden-size", ["train", *R, "policy.tiny.hidden_size=32"], _existing_run)
case("ckpt/other-num-layers", ["train", *R, "policy.tiny.num_layers=2"], _existing_run)
case("ckpt/other-model", ["train", *R, "policy.model_name={w}/model_bad_config"], _existing_run)
case("ckpt/new-run-over-old", ["train", "--quiet", *TINY, "run_dir={t}/run"], _existing_run)
case("ckpt/new-run-over-checkpoint-dir", ["train", *T, "checkpointing.checkpoint_dir={t}/ck"], _checkpoints_in("ck"))
case("ckpt/sft-over-old", ["sft", "--quiet", *TINY, "run_dir={t}/run", "warmup.enabled=true", "warmup.num_steps=1"],
     _existing_run)

# eval
E = ["eval", "--model", "embedded:tiny-llama", "--quiet", "policy.tiny.hidden_size=16",
     "policy.tiny.intermediate_size=16",
     "policy.tiny.num_layers=1"]
for cid, extra in [("eval/batch-size-0", ["--batch-size", "0"]), ("eval/batch-size-negative", ["--batch-size", "-2"]),
                   ("eval/n-0", ["-n", "0"]), ("eval/n-negative", ["-n", "-3"]), ("eval/n-not-int", ["-n", "abc"]),
                   ("eval/k-0", ["-k", "0"]), ("eval/k-negative", ["-k", "-1"]),
                   ("eval/max-new-tokens-0", ["--max-new-tokens", "0"]), ("eval/seed-negative", ["--seed", "-1"]),
                   ("eval/dataset-missing", ["--dataset", "{t}/missing.jsonl"]),
                   ("eval/dataset-not-utf8", ["--dataset", "{w}/latin1.jsonl"]),
                   ("eval/dataset-csv-not-utf8", ["--dataset", "{w}/latin1.csv"]),
                   ("eval/dataset-not-json", ["--dataset", "{w}/notjson.jsonl"]),
                   ("eval/dataset-empty", ["--dataset", "{w}/empty.jsonl"]),
                   ("eval/dataset-rg-unknown", ["--dataset", "reasoning_gym:no_such_task"]),
                   ("eval/output-proc", ["-o", "/proc/nope/out.json"]), ("eval/output-is-dir", ["-o", "{w}/full"]),
                   ("eval/output-under-file", ["-o", "{w}/afile/out.json"]), ("eval/unknown-flag", ["--bogus"]),
                   ("eval/unknown-key", ["grpo.nope=1"]), ("eval/betas", ["policy.optimizer.betas=[0.9,1.5]"])]:
    case(cid, [*E, *extra])
case("eval/checkpoint-and-model", ["eval", "--checkpoint", "{w}/run", "--model", "embedded:tiny-llama"])
case("eval/neither", ["eval", "--quiet"])
case("eval/checkpoint-missing", ["eval", "--checkpoint", "{t}/nope"])
case("eval/checkpoint-file", ["eval", "--checkpoint", "{w}/afile"])
case("eval/checkpoint-empty-dir", ["eval", "--checkpoint", "{w}/emptydir"])
case("eval/checkpoint-truncated", ["eval", "--quiet", "--checkpoint", "{t}/run"],
     _damage("policy/weights/model.safetensors"))
case("eval/checkpoint-garbage-weights", ["eval", "--quiet", "--checkpoint", "{t}/run"],
     _damage("policy/weights/model.safetensors", "garbage"))
case("eval/model-truncated", ["eval", "--quiet", "--model", "{w}/model_trunc"])
case("eval/model-missing", ["eval", "--quiet", "--model", "/nonexistent/model"])

# export
for cid, out in [("export/output-is-file", "{w}/afile"), ("export/output-not-empty", "{w}/full"),
                 ("export/output-proc", "/proc/nope/model"), ("export/output-under-file", "{w}/afile/model"),
                 ("export/output-inside-checkpoint", "{w}/model/sub")]:
    case(cid, ["export", "--checkpoint", "{w}/run" if "inside" not in cid else "{w}/model", "-o", out])
for cid, ck in [("export/checkpoint-missing", "{t}/nope"), ("export/checkpoint-file", "{w}/afile"),
                ("export/checkpoint-empty-dir", "{w}/emptydir")]:
    case(cid, ["export", "--checkpoint", ck, "-o", "{t}/out"])
case("export/checkpoint-truncated", ["export", "--checkpoint", "{t}/run", "-o", "{t}/out"],
     _damage("policy/weights/model.safetensors"))
case("export/no-output", ["export", "--checkpoint", "{w}/run"])

# paths
for cid, ov in [("path/run-dir-proc", "run_dir=/proc/nope/run"), ("path/run-dir-is-file", "run_dir={w}/afile"),
                ("path/run-dir-under-file", "run_dir={w}/afile/run"),
                ("path/checkpoint-dir-proc", "checkpointing.checkpoint_dir=/proc/nope/ck"),
                ("path/checkpoint-dir-is-file", "checkpointing.checkpoint_dir={w}/afile"),
                ("path/log-dir-proc", "logger.log_dir=/proc/nope/logs"),
                ("path/log-dir-is-file", "logger.log_dir={w}/afile"),
                ("path/log-dir-under-file", "logger.log_dir={w}/afile/logs")]:
    case(cid, ["train", *T, ov])
case("path/sft-run-dir-proc", ["sft", "--quiet", *TINY, "run_dir=/proc/nope/run"])
case("path/resume-run-dir-is-file", ["train", *T, "run_dir={w}/afile", "checkpointing.resume=true"])

# config rules that used to pass and do harm
for cid, ov in [("config/max-grad-norm-negative", "policy.max_grad_norm=-1"),
                ("config/max-grad-norm-zero", "policy.max_grad_norm=0"),
                ("config/max-grad-norm-small-negative", "policy.max_grad_norm=-0.5"),
                ("config/seed-beyond-64-bits", f"grpo.seed={2**64}"),
                ("config/seed-below-64-bits", f"grpo.seed={-(2**63) - 1}"),
                ("config/one-generation-per-prompt", "grpo.num_generations_per_prompt=1"),
                ("config/env-max-error-rate-above-1", "env.max_error_rate=1.5"),
                ("config/env-error-window-zero", "env.error_window_steps=0")]:
    sizes = ["policy.train_global_batch_size=2", "policy.train_micro_batch_size=2", "policy.logprob_batch_size=2"]
    case(cid, ["train", *T, ov, *(sizes if cid == "config/one-generation-per-prompt" else [])])
case("config/ppo-value-max-grad-norm-negative", ["train", "-c", "ppo_arithmetic", "--quiet", "run_dir={t}/r",
                                                 "value.max_grad_norm=-1"])
case("config/yaml-duplicate-key", ["train", "-c", "{w}/dup_key.yaml", *T])
case("config/yaml-duplicate-section", ["train", "-c", "{w}/dup_section.yaml", *T])

# data: reference answers that are not text or numbers
for name in ("null", "object", "list", "bool", "empty", "blank"):
    case(f"data/answer-{name}", ["train", *T, *J, f"data.train.path={{w}}/answer_{name}.jsonl"])
case("eval/dataset-answer-null", [*E, "--dataset", "{w}/answer_null.jsonl"])
for name in ("null", "empty", "blank"):  # the hf loader reads the same rows through datasets
    case(f"data/hf-answer-{name}", ["train", *T, *H, f"data.train.path={{w}}/answer_{name}.jsonl"])

# user code: reward functions and environment classes named in the config
for cid, ov in [("user/reward-sys-exit", "env.arithmetic.reward_fn=matrix_user:exits"),
                ("user/reward-raises", "env.arithmetic.reward_fn=matrix_user:raises"),
                ("user/env-init-raises", "env.arithmetic.class=matrix_user:BrokenEnv"),
                ("user/env-init-sys-exit", "env.arithmetic.class=matrix_user:ExitingEnv"),
                ("user/reward-misspelt-task", "env.arithmetc.reward_fn=matrix_user:score"),
                ("user/env-misspelt-task", "env.arithmetc.class=matrix_user:BrokenEnv"),
                ("user/reward-no-such-function", "env.arithmetic.reward_fn=matrix_user:nope"),
                ("user/reward-no-such-module", "env.arithmetic.reward_fn=no_such_module_x:score")]:
    case(cid, ["train", *T, ov])


# run directories: a run in use, and what --overwrite may delete
def _locked(world, t):
    """Another run holds t/r: an flock on its lock file from a separate open (as another process would)."""
    import fcntl

    (t / "r").mkdir()
    fd = os.open(t / "r" / ".rlplane.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": 4242, "host": "elsewhere", "started": "today"}).encode())
    _HELD_FDS.append(fd)


def _users_config(world, t):
    (t / "r").mkdir()
    (t / "r" / "config.yaml").write_text("my: own config\n")


def _users_metrics(world, t):
    (t / "logs").mkdir()
    (t / "logs" / "metrics.jsonl").write_text("my own numbers\n")


_HELD_FDS: list[int] = []
case("run_dir/in-use", ["train", *T], _locked)
case("run_dir/in-use-overwrite", ["train", "--overwrite", *T], _locked)
case("run_dir/in-use-sft", ["sft", "--quiet", *TINY, "run_dir={t}/r"], _locked)
case("run_dir/users-config-yaml", ["train", *T], _users_config)
case("run_dir/users-config-yaml-overwrite", ["train", "--overwrite", *T], _users_config)
case("run_dir/users-log-dir-overwrite", ["train", "--overwrite", *T, "logger.log_dir={t}/logs"], _users_metrics)
case("run_dir/other-runs-checkpoints-overwrite",
     ["train", "--overwrite", *T, "checkpointing.checkpoint_dir={t}/run/checkpoints"], _existing_run)

# plot
for cid, argv in [("plot/missing", ["{t}/nope"]), ("plot/file-as-run-dir", ["{w}/afile"]),
                  ("plot/empty-dir", ["{w}/emptydir"]), ("plot/not-utf8", ["{w}/plot_not_utf8"]),
                  ("plot/garbage-line", ["{w}/plot_garbage"]), ("plot/row-not-object", ["{w}/plot_list"]),
                  ("plot/row-without-step", ["{w}/plot_no_step"]),
                  ("plot/output-unknown-extension", ["{w}/plot_ok", "-o", "{t}/p.xyz"]),
                  ("plot/output-proc", ["{w}/plot_ok", "-o", "/proc/nope/p.png"]),
                  ("plot/output-is-dir", ["{w}/plot_ok", "-o", "{t}"]),
                  ("plot/output-under-file", ["{w}/plot_ok", "-o", "{w}/afile/p.png"])]:
    case(cid, ["plot", *argv])

# usage
case("usage/no-command", [])
case("usage/unknown-command", ["fly"])
case("usage/train-unknown-flag", ["train", "--bogus"])
case("usage/export-unknown-flag", ["export", "--checkpoint", "{w}/run", "-o", "{t}/x", "--force"])
case("usage/show-config-flag-typo", ["show-config", "--lsit"])

# trackers: paths and servers a tracker cannot use, said before any training
M = ["logger.mlflow_enabled=true"]
for cid, ov in [("trackers/mlflow-server-refused", [*M, "logger.mlflow.tracking_uri=http://127.0.0.1:1"]),
                ("trackers/mlflow-uri-no-host", [*M, "logger.mlflow.tracking_uri=http://:5000"]),
                ("trackers/mlflow-sqlite-under-file", [*M, "logger.mlflow.tracking_uri=sqlite:///{w}/afile/m.db"]),
                ("trackers/mlflow-file-store-proc", [*M, "logger.mlflow.tracking_uri=file:/proc/nope/mlruns"]),
                ("trackers/wandb-dir-proc", ["logger.wandb_enabled=true", "logger.wandb.dir=/proc/nope/wandb"]),
                ("trackers/wandb-dir-is-file", ["logger.wandb_enabled=true", "logger.wandb.dir={w}/afile"])]:
    case(cid, ["train", *T, *ov])


# disk full: a small tmpfs where the run writes (skipped where it cannot be mounted)
MOUNTS: list[str] = []


def _small_disk(kib: int, fill: bool = False):
    def setup(world, t):
        import subprocess

        (t / "disk").mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(t / "disk")],
                          capture_output=True).returncode != 0:
            import pytest

            pytest.skip("cannot mount a tmpfs here (not root, or no mount namespace)")
        MOUNTS.append(str(t / "disk"))
        if fill:  # full to the last block
            with contextlib.suppress(OSError), open(t / "disk" / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
    return setup


FULL = _small_disk(64, fill=True)
case("disk/checkpoint-dir-full", ["train", *T, "checkpointing.checkpoint_dir={t}/disk/ck"], FULL)
case("disk/run-dir-full", ["train", "--quiet", *TINY, "run_dir={t}/disk/r"], FULL)
case("disk/log-dir-full", ["train", *T, "logger.log_dir={t}/disk/logs"], FULL)
case("disk/export-output-full", ["export", "--checkpoint", "{w}/run", "-o", "{t}/disk/model"], FULL)
case("disk/eval-output-full", [*E, "-n", "2", "-o", "{t}/disk/out.json"], FULL)
