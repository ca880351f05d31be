"""Bad-input matrix, the newest surfaces: ``rlplane sweep`` and its controls (seeds, variants, ``--control``,
``<loop>.reward_control``, the directory it writes), NeMo RL's registry datasets by name (config mistakes, and
reads from a Hugging Face cache of stand-ins), and files and directories closed to an unprivileged user.

``CASES``: (id, argv, setup or None, expected "one-line" | "runs"), run in-process like the readers' cases.
``HUB_CASES``: (id, argv, expected), run in-process over a cache of hub stand-ins (``tests/fixtures/nemo``).
``unprivileged_cases(dir)``: (id, argv, expected, words the error must hold), run in one interpreter as a fresh
unprivileged user. Run and judged by ``test_bad_input_matrix.py``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import matrix_cases as C
import matrix_cases_readers as READERS
import matrix_running as R

T, TINY = C.T, C.TINY
S = ["--quiet", *TINY]  # a sweep's overrides (the sweep sets run_dir and the seed)
CASES: list[tuple[str, list[str], object, str]] = []


def case(cid: str, argv: list[str], setup=None, expect: str = "one-line") -> None:
    CASES.append((cid, argv, setup, expect))


# ---- rlplane sweep: seeds --------------------------------------------------------------------------------
OUT = ["--out", "{t}/s"]
for cid, opts in [
    ("sweep/seeds-0", ["--seeds", "0"]), ("sweep/seeds-negative", ["--seeds", "-2"]),
    ("sweep/seeds-words", ["--seeds", "five"]), ("sweep/seeds-a-trillion", ["--seeds", "1000000000000"]),
    ("sweep/seed-list-duplicate", ["--seed-list", "1,2,1"]),
    ("sweep/seed-list-range-overlaps", ["--seed-list", "1-3,2"]),
    ("sweep/seed-list-backwards", ["--seed-list", "9-3"]), ("sweep/seed-list-empty", ["--seed-list", ""]),
    ("sweep/seed-list-words", ["--seed-list", "one,two"]),
    ("sweep/seed-list-range-huge", ["--seed-list", "1-99999999999999"]),
    ("sweep/seed-past-64-bits", ["--seed-list", "18446744073709551616"]),
    ("sweep/seeds-and-seed-list", ["--seeds", "2", "--seed-list", "3"]),
]:
    case(cid, ["sweep", *opts, *S, *OUT])

# ---- controls: --control and <loop>.reward_control ----------------------------------------------------------
D = ["sweep", "-c", "distill_arithmetic", "--quiet", "--seeds", "1", *OUT]
for cid, argv in [
    ("control/unknown-kind", ["sweep", "--control", "flip", *S, *OUT]),
    ("control/coin-on-distillation", [*D, "--control", "coin"]),  # a recipe without a reward
    ("control/distillation-teacher-untrained-already", [*D, "--control", "teacher.warmup.enabled=false"]),
    ("control/distillation-pretrained-teacher", [*D, "--control", "teacher.model_name=packaged:smollm2-135m-instruct"]),
    ("control/reward-control-set-too", ["sweep", "--control", *S, "grpo.reward_control=coin", *OUT]),
    ("control/control-seeds-0", ["sweep", "--control", "--control-seeds", "0", *S, *OUT]),
    ("control/control-seeds-past-seeds", ["sweep", "--control", "--control-seeds", "3", "--seeds", "2", *S, *OUT]),
    ("control/reward-control-word", ["train", *T, "grpo.reward_control=maybe"]),
    ("control/reward-control-distillation", ["train", "-c", "distill_arithmetic", "--quiet", "run_dir={t}/r",
                                             "distillation.reward_control=permute"]),
    ("control/reward-control-ppo-word", ["train", "-c", "ppo_arithmetic", "--quiet", "run_dir={t}/r",
                                         "ppo.reward_control=shuffle"]),
    ("control/positive-example-nll", ["train", *T, "loss_fn.positive_example_nll_weight=0.5"]),
    ("control/expected-not-a-number", ["train", *T, "expected.gain_low=abc", "expected.gain_high=0.3"]),
    ("control/expected-half-a-range", ["train", *T, "expected.gain_low=0.1", "expected.gain_high=null"]),
    ("control/expected-range-backwards", ["train", *T, "expected.gain_low=0.5", "expected.gain_high=0.1"]),
]:
    case(cid, argv)
case("control/runs-permute", ["train", *T, "grpo.reward_control=permute"], expect="runs")
case("control/runs-coin", ["train", *T, "grpo.reward_control=coin"], expect="runs")

# ---- variants ----------------------------------------------------------------------------------------------
for cid, variants in [
    ("variant/unknown-name", ["faster"]), ("variant/empty", [""]), ("variant/twice", ["fp32", "fp32"]),
    ("variant/key-without-section", ["lr=1e-3"]), ("variant/unknown-key", ["grpo.nope=1"]),
    ("variant/bad-value", ["policy.precision=fp64"]), ("variant/sets-the-seed", ["grpo.seed=3"]),
    ("variant/sets-run-dir", ["run_dir=x"]), ("variant/sets-checkpoint-dir", ["checkpointing.checkpoint_dir=/tmp/x"]),
]:
    case(cid, ["sweep", *[a for v in variants for a in ("--variant", v)], "--seeds", "1", *S, *OUT])

# ---- what the sweep sets itself, given as an override ----------------------------------------------------
for cid, argv in [
    ("sweep/override-run-dir", ["sweep", *S, "run_dir=x", *OUT]),
    ("sweep/override-seed", ["sweep", *S, "grpo.seed=3", *OUT]),
    ("sweep/override-seed-spaced", ["sweep", *S, " grpo.seed =3", *OUT]),
    ("sweep/override-seed-plus", ["sweep", *S, "+grpo.seed=3", *OUT]),
    ("sweep/override-ppo-seed", ["sweep", "-c", "ppo_arithmetic", "--quiet", "ppo.seed=3", *OUT]),
    ("sweep/override-log-dir", ["sweep", *S, "logger.log_dir={t}/logs", *OUT]),
    ("sweep/override-unknown-key", ["sweep", *S, "grpo.nope=1", *OUT]),
]:
    case(cid, argv)


# ---- the sweep's directory ---------------------------------------------------------------------------------
def _other_sweep(world, t):
    from rlplane.config.loading import load_config
    from rlplane.sweeps.runner import claim_directory, identity

    other = ["grpo.max_num_steps=9"]
    claim_directory(t / "s", identity(None, other, load_config(None, other).model_dump(mode="json"), "grpo"))


def _held_by_another_sweep(world, t):
    (t / "s").mkdir()
    fd = os.open(t / "s" / ".rlplane.lock", os.O_RDWR | os.O_CREAT)
    os.write(fd, json.dumps({"pid": 4242, "host": "elsewhere", "started": "earlier"}).encode())
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description: as another process holds it
    R.AFTER.append(lambda: os.close(fd))


def _plan(text: str | None = None, size: int = 0, fifo: bool = False):
    def setup(world, t):
        (t / "s").mkdir()
        if fifo:
            os.mkfifo(t / "s" / "sweep.json")
        elif size:
            with open(t / "s" / "sweep.json", "wb") as f:
                f.truncate(size)
        else:
            (t / "s" / "sweep.json").write_text(text)
    return setup


for cid, out, setup in [
    ("sweep/out-holds-a-run", "{w}/run", None), ("sweep/out-holds-another-sweep", "{t}/s", _other_sweep),
    ("sweep/out-held-by-another-sweep", "{t}/s", _held_by_another_sweep),
    ("sweep/out-is-a-file", "{w}/afile", None), ("sweep/out-not-empty", "{w}/full", None),
    ("sweep/out-plan-damaged", "{t}/s", _plan("{not json")), ("sweep/out-plan-a-list", "{t}/s", _plan("[1]")),
    ("sweep/out-plan-3-gb", "{t}/s", _plan(size=3 << 30)), ("sweep/out-plan-a-fifo", "{t}/s", _plan(fifo=True)),
    ("sweep/out-under-proc", "/proc/nope/s", None), ("sweep/out-run-inside-it", "{w}/run/logs", None),
]:
    case(cid, ["sweep", "--seeds", "1", *S, "--out", out], setup)

# A NeMo RL file over two seeds and its control: each run keeps its checkpoints and logs in its own run directory
# (the file names shared ones), so all three finish (three interpreters: the sweep's one correct run here).
NEMO_SWEEP = [a for a in READERS.NEMO_OK if not a.startswith(("run_dir=", "checkpointing.checkpoint_dir=",
                                                                  "logger.log_dir="))]
case("sweep/runs-nemo-file-seeds-and-control",
     ["sweep", "-c", str(READERS.NEMO_FIXTURES / "grpo_math_tiny.yaml"), "--quiet", "--seed-list", "2,3", "--control",
      *NEMO_SWEEP, *OUT], expect="runs")

# ---- NeMo RL's registry datasets: what the config says (checked with the config, before any import) -----------
REG = ["data.dataset=registry"]
for cid, ov in [
    ("registry/name-unknown", ["data.train.name=no_such_dataset"]),
    ("registry/name-misspelt", ["data.train.name=gsm8"]),
    ("registry/multimodal", ["data.train.name=clevr-cogent"]), ("registry/multimodal-audio", ["data.train.name=mmau"]),
    ("registry/nemo-gym", ["data.train.name=NemoGymDataset"]), ("registry/no-name", []),
    ("registry/name-a-number", ["data.train.name=5"]),
    ("registry/validation-name-unknown", ["data.train.name=gsm8k", "data.validation.name=nope"]),
    ("registry/option-unknown", ["data.train.name=gsm8k", "data.train.options.output_key=x"]),
    ("registry/options-not-a-mapping", ["data.train.name=gsm8k", "data.train.options=5"]),
    ("registry/option-flag-a-word", ["data.train.name=gsm8k", "data.train.options.extract_answer=maybe"]),
    ("registry/option-count-negative", ["data.train.name=tulu3_sft_mixture", "data.train.options.max_samples=-1"]),
    ("registry/option-count-words", ["data.train.name=tulu3_sft_mixture", "data.train.options.max_samples=many"]),
    ("registry/option-seed-words", ["data.train.name=gpqa", "data.train.options.seed=abc"]),
    ("registry/option-text-a-list", ["data.train.name=openai_format", "data.train.path={w}/good.jsonl",
                                     "data.train.options.chat_key=[a,b]"]),
    ("registry/split-not-there", ["data.train.name=OpenMathInstruct-2", "data.train.split=test"]),
    ("registry/split-fixed", ["data.train.name=AIME2024", "data.train.split=test"]),
    ("registry/subset-fixed", ["data.train.name=DeepScaler", "data.train.subset=hard"]),
    ("registry/local-file-entry-without-path", ["data.train.name=openai_format"]),
    ("registry/held-out-negative", ["data.train.name=gsm8k", "data.train.split_validation_size=-1"]),
    ("registry/repeat-0", ["data.train.name=gsm8k", "data.train.repeat=0"]),
]:
    case(cid, ["train", *T, *REG, *ov])
for cid, ov in [("registry/name-on-jsonl", ["data.dataset=jsonl", "data.train.path={w}/good.jsonl",
                                            "data.train.name=gsm8k"]),
                ("registry/options-on-hf", ["data.dataset=hf", "data.train.path={w}/data.parquet",
                                            "data.train.options.split=train"])]:
    case(cid, ["train", *T, *ov])
for cid, ov in [("registry/path-missing", ["data.train.path={t}/nope"]),
                ("registry/path-a-fifo", ["data.train.path={w}/fifo.jsonl"]),
                ("registry/path-a-device", ["data.train.path=/dev/zero"])]:
    case(cid, ["train", *T, *REG, "data.train.name=gsm8k", *ov])
for cid, body in [("registry/nemo-file-multimodal", "data: {train: {dataset_name: clevr-cogent}}\n"),
                  ("registry/nemo-file-unknown-name", "data: {train: {dataset_name: no_such_dataset}}\n")]:
    def _nemo_file(world, t, body=body):
        (t / "n.yaml").write_text(READERS.nemo(body))
    case(cid, ["train", "-c", "{t}/n.yaml", *[a for a in READERS.NEMO_OK if not a.startswith("data.dataset=")]],
         _nemo_file)

# ---- registry datasets read from a Hugging Face cache of stand-ins (offline) -----------------------------
HUB_REPOS = ["openai/gsm8k"]  # DeepScaler's repo is not there: the uncached case
HUB_ROWS = 40
GSM = [*REG, "data.train.name=gsm8k", "data.train.default_task_name=math", "env.math.num_workers=1",
       "policy.max_total_sequence_length=96", "policy.generation.max_new_tokens=4"]
HUB_CASES: list[tuple[str, list[str], str]] = [
    ("registry/uncached-offline", ["train", *T, *REG, "data.train.name=DeepScaler"], "one-line"),
    ("registry/local-copy-not-parquet", ["train", *T, *GSM, "data.train.path={t}/bad.parquet"], "one-line"),
    ("registry/local-copy-not-json", ["train", *T, *GSM, "data.train.path={t}/bad.jsonl"], "one-line"),
    ("registry/local-copy-binary-csv", ["train", *T, *GSM, "data.train.path={t}/bad.csv"], "one-line"),
    ("registry/local-copy-no-data-files", ["train", *T, *GSM, "data.train.path={t}/nodata"], "one-line"),
    ("registry/held-out-every-row", ["train", *T, *GSM, f"data.train.split_validation_size={HUB_ROWS}"], "one-line"),
    ("registry/subset-not-in-the-copy", ["train", *T, *GSM, "data.train.options.subset=nope"], "one-line"),
    ("registry/max-rows-exceeded", ["train", *T, *GSM, "data.max_rows=10"], "one-line"),
    ("registry/validation-split-not-there", ["train", *T, *GSM, "data.validation.name=gsm8k",
                                             "data.validation.split=nope"], "one-line"),
    ("registry/runs-held-out", ["train", *T, *GSM, "data.train.split_validation_size=0.25", "grpo.val_at_start=true",
                                "grpo.max_val_samples=4"], "runs"),
    ("registry/runs-local-copy", ["train", *T, *GSM, "data.train.path={t}/copy.parquet"], "runs"),
]


def hub_setup(t: Path) -> None:
    """Damaged local copies of gsm8k, a directory without data, and a good copy (its columns), in the case's own
    directory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (t / "bad.parquet").write_bytes(b"PAR1 this is no parquet file PAR1")
    (t / "bad.jsonl").write_text("not json at all\n{\"a\": \n")
    (t / "bad.csv").write_bytes(bytes(range(256)) * 8)
    (t / "nodata").mkdir()
    (t / "nodata" / "README.md").write_text("notes, no data\n")
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} and 1\n#### {i + 1}"} for i in range(8)]
    pq.write_table(pa.Table.from_pylist(rows), t / "copy.parquet")


# ---- files and directories closed to an unprivileged user (one interpreter, run as that user) ----------------
def closed_world(p: Path, world: Path) -> None:
    """Under ``p`` (root's): ``closed/`` (0700: its files out of reach), ``ro/`` (0555), ``secret.*`` (0600),
    ``rootrun`` (a finished run of root's, readable, not writable), ``good.jsonl`` (readable), ``work/`` (their
    working directory, with a module of root's in it)."""
    os.chmod(p, 0o755)
    (p / "closed").mkdir()
    for name in ("x.yaml", "x.jsonl", "x.parquet"):
        shutil.copy(world / "good.jsonl", p / "closed" / name)
    shutil.copytree(world / "run", p / "closed" / "run")
    os.chmod(p / "closed", 0o700)
    (p / "ro").mkdir(mode=0o555)
    os.chmod(p / "ro", 0o555)
    (p / "secret.yaml").write_text("defaults: grpo_arithmetic\n")
    (p / "secret.jsonl").write_text(C.GOOD_ROW * 4)
    for name in ("secret.yaml", "secret.jsonl"):
        os.chmod(p / name, 0o600)
    shutil.copytree(world / "run", p / "rootrun")
    shutil.copy(world / "good.jsonl", p / "good.jsonl")
    for dirpath, dirs, files in os.walk(p / "rootrun"):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    (p / "work").mkdir()
    os.chmod(p / "work", 0o777)  # the user's working directory (importable), with a module of root's they cannot read
    (p / "work" / "secretmod.py").write_text("def fn(row, spec, tokenizer, max_len, idx):\n    return None\n")
    os.chmod(p / "work" / "secretmod.py", 0o600)


def unprivileged_cases(p: Path) -> list[tuple[str, list[str], str, str]]:
    """(id, argv, expected, words the one line holds) over :func:`closed_world` ``p``."""
    run = ["--quiet", *TINY, "grpo.max_num_steps=1"]
    train = ["train", *run, f"run_dir={p}/work/r"]
    j, reg = ["data.dataset=jsonl"], [*REG, "data.train.name=gsm8k"]
    return [
        ("perm/sweep-out-in-closed-dir", ["sweep", *S, "--out", f"{p}/closed/s"], "one-line", "Permission denied"),
        ("perm/sweep-out-closed-dir", ["sweep", *S, "--out", f"{p}/closed"], "one-line", "Permission denied"),
        ("perm/sweep-out-read-only", ["sweep", *S, "--out", f"{p}/ro/s"], "one-line", "Permission denied"),
        ("perm/config-in-closed-dir", ["train", "-c", f"{p}/closed/x.yaml"], "one-line", "Permission denied"),
        ("perm/config-unreadable", ["show-config", "-c", f"{p}/secret.yaml"], "one-line", "Permission denied"),
        ("perm/data-unreadable", [*train, *j, f"data.train.path={p}/secret.jsonl"], "one-line", "Permission denied"),
        ("perm/data-in-closed-dir", [*train, *j, f"data.train.path={p}/closed/x.jsonl"], "one-line",
         "Permission denied"),
        ("perm/hf-data-unreadable", [*train, "data.dataset=hf", f"data.train.path={p}/secret.jsonl"], "one-line",
         "Permission denied"),
        ("perm/hf-dir-closed", [*train, "data.dataset=hf", f"data.train.path={p}/closed"], "one-line",
         "Permission denied"),
        ("perm/registry-copy-unreadable", [*train, *reg, f"data.train.path={p}/secret.jsonl"], "one-line",
         "Permission denied"),
        ("perm/registry-copy-in-closed-dir", [*train, *reg, f"data.train.path={p}/closed/x.parquet"], "one-line",
         "Permission denied"),
        ("perm/prompt-file-unreadable", [*train, f"data.prompt.prompt_file={p}/secret.jsonl"], "one-line",
         "Permission denied"),
        ("perm/processor-module-unreadable", [*train, "data.tasks.arithmetic.processor=secretmod:fn"], "one-line",
         "secretmod"),
        ("perm/run-dir-read-only", ["train", *run, f"run_dir={p}/ro/r"], "one-line", "Permission denied"),
        ("perm/run-dir-closed", ["train", *run, f"run_dir={p}/closed"], "one-line", "Permission denied"),
        ("perm/resume-roots-run", ["train", *run, f"run_dir={p}/rootrun", "checkpointing.resume=true",
                                   "grpo.max_num_steps=3"], "one-line", "Permission denied"),
        ("perm/overwrite-roots-run", ["train", *run, f"run_dir={p}/rootrun", "--overwrite"], "one-line",
         "Permission denied"),
        ("perm/eval-checkpoint-closed", ["eval", "--checkpoint", f"{p}/closed/run", "-n", "2"], "one-line",
         "Permission denied"),
        ("perm/export-from-closed", ["export", "--checkpoint", f"{p}/closed/run", "-o", f"{p}/work/m"], "one-line",
         "Permission denied"),
        ("perm/export-into-read-only", ["export", "--checkpoint", f"{p}/rootrun", "-o", f"{p}/ro/m"], "one-line",
         "Permission denied"),
        ("perm/plot-roots-run", ["plot", f"{p}/rootrun"], "one-line", "Permission denied"),
        ("perm/runs-readable-data", [*train, *j, f"data.train.path={p}/good.jsonl"], "runs", ""),
        ("perm/runs-eval-roots-run", ["eval", "--checkpoint", f"{p}/rootrun", "-n", "2", "-o",
                                      f"{p}/work/eval.json"], "runs", ""),
    ]
