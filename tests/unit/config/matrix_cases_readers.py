"""Bad-input matrix, the readers: NeMo RL files, config limits (bombs, sizes, depth), per-task data specs
(``data.tasks.*``) and data-file limits. Each case: (id, argv, setup or None, expected: "one-line" | "runs").
Run and judged by ``test_bad_input_matrix.py``, in-process like the first cases."""

from __future__ import annotations

import json
import os
from pathlib import Path

import matrix_cases as C

T, TINY, GOOD_ROW = C.T, C.TINY, C.GOOD_ROW
NEMO_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nemo"
# A NeMo RL file that otherwise loads and trains: the tiny recipe on the embedded model and rlplane's arithmetic.
# (Its checkpoint and log directories are relative paths: kept in the case's own directory.)
NEMO_OK = ["policy.model_name=embedded:tiny-llama", "data.dataset=arithmetic", *TINY, "run_dir={t}/r",
           "policy.max_total_sequence_length=16", "policy.generation.max_new_tokens=4", "env.math.num_workers=1",
           "checkpointing.checkpoint_dir={t}/ck", "logger.log_dir={t}/logs"]
NEMO_HEAD = "defaults: {fixture}\n"  # a NeMo-format child of the tiny fixture

PROCESSOR_MODULES = {
    "proc_raises": "raise RuntimeError('no tokenizer configured')\n",
    "proc_exits": "import sys\nsys.exit(4)\n",
    "proc_syntax": "def f(:\n",
    "proc_ok": "CONSTANT = 3\n",
}


def nemo(body: str) -> str:
    return NEMO_HEAD.format(fixture=NEMO_FIXTURES / "grpo_math_tiny.yaml") + body


def laughs(nemo_format: bool) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    lines.append("policy: {model_name: *a8}")
    return ("grpo: {normalize_rewards: true}\n" if nemo_format else "defaults: grpo_arithmetic\n") + "\n".join(lines)


def build_world(w: Path) -> None:
    """The readers' files under ``w`` (beside the first cases' world)."""
    files = {
        "nemo_bomb.yaml": laughs(True), "rl_bomb.yaml": laughs(False),
        "nemo_self_alias.yaml": nemo("grpo: &g {inner: *g}\n"),
        "nemo_deep.yaml": nemo("policy: {x: " + "[" * 5000 + "]" * 5000 + "}\n"),
        "nemo_values.yaml": nemo("grpo: {x: [" + ", ".join(["1"] * 20_000) + "]}\n"),
        "nemo_doubling.yaml": nemo("s0: abcdefgh\n" + "".join(f"s{i}: ${{s{i - 1}}}${{s{i - 1}}}\n"
                                                              for i in range(1, 41))),
        "nemo_chain.yaml": nemo("r0: 1\n" + "".join(f"r{i}: ${{r{i - 1}}}\n" for i in range(1, 100))),
        "nemo_no_key.yaml": nemo("grpo: {seed: '${grpo.no_such_key}'}\n"),
        "nemo_interp_cycle.yaml": nemo("grpo: {seed: '${grpo.max_rollout_turns}', max_rollout_turns: "
                                       "'${grpo.seed}'}\n"),
        "nemo_oc_env.yaml": nemo("grpo: {seed: '${oc.env:HOME}'}\n"),
        "nemo_mul_words.yaml": nemo("grpo: {seed: '${mul:two,3}'}\n"),  # (a key the cases do not override)
        "nemo_mul_one.yaml": nemo("grpo: {seed: '${mul:3}'}\n"),
        "nemo_div_zero.yaml": nemo("grpo: {seed: '${div:6,0}'}\n"),
        "nemo_mul_huge.yaml": nemo("grpo: {seed: '${mul:18446744073709551615,18446744073709551615}'}\n"),
        "nemo_syntax.yaml": nemo("grpo: [unclosed\n"),
        "nemo_dup.yaml": nemo("grpo:\n  max_num_steps: 3\n  max_num_steps: 4\n"),
        "nemo_megatron.yaml": nemo("policy: {megatron_cfg: {enabled: true}}\n"),
        "nemo_tp2.yaml": nemo("policy: {dtensor_cfg: {enabled: true, tensor_parallel_size: 2}}\n"),
        "nemo_sgd.yaml": nemo("policy: {optimizer: {name: torch.optim.SGD, kwargs: {lr: 0.1}}}\n"),
        "nemo_sched.yaml": nemo("policy: {scheduler: [{name: torch.optim.lr_scheduler.StepLR, kwargs: {step_size: "
                                "3}}]}\n"),
        "nemo_fp16.yaml": nemo("policy: {precision: float16}\n"),
        "nemo_kv_fp8.yaml": nemo("policy: {generation: {vllm_cfg: {kv_cache_dtype: fp8}}}\n"),
        "nemo_sglang.yaml": nemo("policy: {generation: {backend: sglang}}\n"),
        "nemo_batch_mult.yaml": nemo("grpo: {batch_multiplier: 1.5}\n"),
        "nemo_optimizer_kwarg.yaml": nemo("policy: {optimizer: {name: torch.optim.AdamW, kwargs: {lr: 1.0e-6, "
                                          "amsgrad: true}}}\n"),
        "nemo_list_defaults_missing.yaml": "defaults: [no_such_parent.yaml]\ngrpo: {normalize_rewards: true}\n",
        "rl_defaults_list.yaml": "defaults: [grpo_arithmetic, ppo_arithmetic]\ngrpo: {max_num_steps: 2}\n",
        "rl_deep_key.yaml": "defaults: grpo_arithmetic\na:\n" + "".join("  " * i + f"a{i}:\n" for i in range(1, 40))
                            + "  " * 40 + "x: 1\n",
        "prompt_ok.txt": "Compute: {}\n", "prompt_no_slot.txt": "Compute it.\n",
        "data_deep.jsonl": GOOD_ROW + '{"problem": "1+1=", "answer": "2", "x": ' + "[" * 40 + "]" * 40 + "}\n",
        "data_past_parser.jsonl": GOOD_ROW + '{"problem": "1+1=", "answer": "2", "x": ' + "[" * 100_000
                                  + "]" * 100_000 + "}\n",
        "data_csv.csv": "problem,answer\n" + "1+1=,2\n" * 4,
    }
    for name, text in files.items():
        (w / name).write_text(text)
    for name, text in PROCESSOR_MODULES.items():
        (w / f"{name}.py").write_text(text)
    (w / "prompt_big.txt").write_text("{}" + "x" * (2 << 20))
    (w / "prompt_latin1.txt").write_bytes(b"Caf\xe9: {}\n")
    (w / "data_no_newline.jsonl").write_bytes(GOOD_ROW.encode() + b"x" * (17 << 20))
    os.mkfifo(w / "fifo.jsonl")
    os.mkfifo(w / "prompt.fifo")
    with open(w / "sparse_big.yaml", "wb") as f:
        f.truncate(3 << 30)
    chain = w / "chain"
    chain.mkdir()
    for i in range(20):
        (chain / f"c{i}.yaml").write_text(f"defaults: c{i + 1}.yaml\n" if i < 19 else "defaults: grpo_arithmetic\n")
    fan = w / "fan"
    fan.mkdir()
    for i in range(5):
        (fan / f"n{i}.yaml").write_text(f"defaults: [{', '.join([f'n{i + 1}.yaml'] * 8)}]\n")
    (fan / "n5.yaml").write_text("grpo: {normalize_rewards: true}\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([json.loads(GOOD_ROW)] * 4), w / "data.parquet")


CASES: list[tuple[str, list[str], object, str]] = []


def case(cid: str, argv: list[str], setup=None, expect: str = "one-line") -> None:
    CASES.append((cid, argv, setup, expect))


# ---- NeMo RL files: reading (limits, interpolation, resolvers) and translation (refused features)
for cid, name in [
    ("nemo/billion-laughs", "nemo_bomb"), ("nemo/alias-of-itself", "nemo_self_alias"),
    ("nemo/nested-deep", "nemo_deep"),
    ("nemo/too-many-values", "nemo_values"), ("nemo/interp-doubling", "nemo_doubling"),
    ("nemo/interp-chain-deep", "nemo_chain"), ("nemo/interp-no-key", "nemo_no_key"),
    ("nemo/interp-cycle", "nemo_interp_cycle"), ("nemo/resolver-unknown", "nemo_oc_env"),
    ("nemo/resolver-words", "nemo_mul_words"), ("nemo/resolver-one-argument", "nemo_mul_one"),
    ("nemo/resolver-divide-by-zero", "nemo_div_zero"), ("nemo/resolver-beyond-64-bits", "nemo_mul_huge"),
    ("nemo/yaml-syntax", "nemo_syntax"), ("nemo/duplicate-key", "nemo_dup"), ("nemo/megatron-on", "nemo_megatron"),
    ("nemo/optimizer-sgd", "nemo_sgd"), ("nemo/scheduler-steplr", "nemo_sched"),
    ("nemo/precision-fp16", "nemo_fp16"), ("nemo/kv-cache-fp8", "nemo_kv_fp8"), ("nemo/backend-sglang", "nemo_sglang"),
    ("nemo/batch-multiplier-fraction", "nemo_batch_mult"), ("nemo/optimizer-unknown-kwarg", "nemo_optimizer_kwarg"),
    ("nemo/list-defaults-missing", "nemo_list_defaults_missing"),
]:
    case(cid, ["train", "-c", f"{{w}}/{name}.yaml", *NEMO_OK])
# Tensor parallelism is read as FSDP2 data parallelism over the same devices (a note says what differs): it runs.
case("nemo/tensor-parallel-2", ["train", "-c", "{w}/nemo_tp2.yaml", *NEMO_OK], expect="runs")
case("nemo/defaults-chain-too-long", ["train", "-c", "{w}/chain/c0.yaml", *T])
case("nemo/defaults-fan-out", ["train", "-c", "{w}/fan/n0.yaml", *NEMO_OK])
OVERRIDE_BOMB = "[&a [1,1,1,1,1,1,1,1,1], " + ", ".join(["[*a,*a,*a,*a,*a,*a,*a,*a,*a]"] * 200) + "]"
case("nemo/hydra-override-bomb", ["train", "-c", str(NEMO_FIXTURES / "grpo_math_tiny.yaml"), *NEMO_OK,
                                  f"+grpo.x={OVERRIDE_BOMB}"])
case("nemo/runs-tiny-recipe", ["train", "-c", str(NEMO_FIXTURES / "grpo_math_tiny.yaml"), *NEMO_OK], expect="runs")
case("nemo/show-config-child", ["show-config", "-c", str(NEMO_FIXTURES / "grpo_math_tiny_child.yaml"),
                                "data.dataset=arithmetic"], expect="runs")

# ---- config limits, in rlplane's own format and in overrides
for cid, cfg in [("limits/billion-laughs", "{w}/rl_bomb.yaml"), ("limits/file-3-gb", "{w}/sparse_big.yaml"),
                 ("limits/config-is-fifo", "{w}/prompt.fifo"), ("limits/config-is-dev-zero", "/dev/zero"),
                 ("limits/defaults-a-list", "{w}/rl_defaults_list.yaml"),
                 ("limits/nested-40-deep", "{w}/rl_deep_key.yaml")]:
    case(cid, ["train", "-c", cfg, *T])
case("limits/override-bomb", ["train", *T, f"grpo.x={OVERRIDE_BOMB}"])
case("limits/override-key-5000-deep", ["train", *T, "a" + ".a" * 5000 + "=1"])
case("limits/override-int-5000-digits", ["train", *T, "grpo.seed=" + "9" * 5000])
case("limits/override-self-alias", ["train", *T, "grpo.x=&a [*a]"])
case("limits/show-config-bomb", ["show-config", "-c", "{w}/nemo_bomb.yaml"])

# ---- per-task data specs (data.tasks.<task>): processors, prompt files, templates
DT = "data.tasks.arithmetic"
for cid, ov in [
    ("tasks/processor-unknown", [f"{DT}.processor=nope"]),
    ("tasks/processor-no-module", [f"{DT}.processor=no_such_module_q:fn"]),
    ("tasks/processor-raises-on-import", [f"{DT}.processor=proc_raises:fn"]),
    ("tasks/processor-exits-on-import", [f"{DT}.processor=proc_exits:fn"]),
    ("tasks/processor-syntax-error", [f"{DT}.processor=proc_syntax:fn"]),
    ("tasks/processor-no-such-function", [f"{DT}.processor=proc_ok:nope"]),
    ("tasks/processor-not-callable", [f"{DT}.processor=proc_ok:CONSTANT"]),
    ("tasks/prompt-file-missing", [f"{DT}.prompt_file={{t}}/nope.txt"]),
    ("tasks/prompt-file-directory", [f"{DT}.prompt_file={{w}}/emptydir"]),
    ("tasks/prompt-file-fifo", [f"{DT}.prompt_file={{w}}/prompt.fifo"]),
    ("tasks/prompt-file-dev-zero", [f"{DT}.prompt_file=/dev/zero"]),
    ("tasks/prompt-file-2-mib", [f"{DT}.prompt_file={{w}}/prompt_big.txt"]),
    ("tasks/prompt-file-not-utf8", [f"{DT}.prompt_file={{w}}/prompt_latin1.txt"]),
    ("tasks/prompt-file-no-placeholder", [f"{DT}.prompt_file={{w}}/prompt_no_slot.txt"]),
    ("tasks/template-no-placeholder", [f"{DT}.template=Compute it."]),
    ("tasks/template-and-prompt-file", [f"{DT}.template=Q: {{problem}}", f"{DT}.prompt_file={{w}}/prompt_ok.txt"]),
    ("tasks/system-prompt-file-missing", [f"{DT}.system_prompt_file={{t}}/nope.txt"]),
    ("tasks/unknown-key", [f"{DT}.nope=1"]), ("tasks/not-a-mapping", [f"{DT}=5"]),
    ("tasks/chat-template-maybe", [f"{DT}.chat_template=maybe"]),
    ("tasks/prompt-file-fifo-everywhere", ["data.prompt.prompt_file={w}/prompt.fifo"]),
]:
    case(cid, ["train", *T, *ov])
case("tasks/runs-template", ["train", *T, f"{DT}.template=Q: {{problem}} A:"], expect="runs")
case("tasks/runs-prompt-file", ["train", *T, f"{DT}.prompt_file={{w}}/prompt_ok.txt"], expect="runs")
case("tasks/template-unquoted-colon", ["train", *T, "data.tasks.calculator.template=Use it: {problem}"])
case("tasks/runs-other-task-spec", ["train", *T, "data.tasks.calculator.template='Use it: {problem}'"], expect="runs")

# ---- data files: limits on lines, nesting, rows; files that are not files
J = ["data.dataset=jsonl"]
for cid, ov in [
    ("data/line-17-mib", ["data.train.path={w}/data_no_newline.jsonl"]),
    ("data/row-nested-40", ["data.train.path={w}/data_deep.jsonl"]),
    ("data/row-nested-100000", ["data.train.path={w}/data_past_parser.jsonl"]),
    ("data/max-rows-exceeded", ["data.train.path={w}/good.jsonl", "data.max_rows=3"]),
    ("data/max-rows-zero", ["data.train.path={w}/good.jsonl", "data.max_rows=0"]),
    ("data/validation-max-rows", ["data.train.path={w}/good.jsonl", "data.validation.path={w}/good.jsonl",
                                  "data.max_rows=3"]),
    ("data/train-path-fifo", ["data.train.path={w}/fifo.jsonl"]),
    ("data/train-path-dev-zero", ["data.train.path=/dev/zero"]),
]:
    case(cid, ["train", *T, *J, *ov])
for cid, ov in [("data/hf-csv-max-rows", ["data.train.path={w}/data_csv.csv", "data.max_rows=3"]),
                ("data/hf-parquet-max-rows", ["data.train.path={w}/data.parquet", "data.max_rows=3"]),
                ("data/hf-fifo", ["data.train.path={w}/fifo.jsonl"])]:
    case(cid, ["train", *T, "data.dataset=hf", *ov])
case("data/runs-max-rows-null", ["train", *T, *J, "data.train.path={w}/good.jsonl", "data.max_rows=null"],
     expect="runs")
case("data/runs-max-rows-exact", ["train", *T, *J, "data.train.path={w}/good.jsonl", "data.max_rows=4"],
     expect="runs")
