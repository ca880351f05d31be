"""Generation throughput: rlplane's ``hf`` backend beside transformers' ``model.generate`` and the FLOP limit.

Same prompts, weights and settings for every contender. Prompts are GRPO-shaped: ``batch /
group_size`` distinct prompts (chat-formatted arithmetic questions for SmolLM2, ``Question: ... Answer:``
text for the Gemma 3 270M base model, which has no chat template), each repeated
``group_size`` times; sampling at temperature 1 with eos ignored, so every contender generates
exactly ``batch × max_new_tokens`` tokens (equal work). Contenders:

- ``rlplane``: :class:`rlplane.generation.HFGenerationBackend` on the policy as rlplane loads it
  (fp32 master weights, ``policy.precision`` resolved as in training, ``auto`` by default), with the
  fused decode forward where it applies (Llama family, Gemma 3; ``--decode hf``: the model's own forward);
- ``model.generate``: transformers' own sampler on the same weights cast to the same compute dtype
  (``from_pretrained(dtype=bfloat16)`` is what a user would run), ``min_new_tokens`` = ``max_new_tokens``;
- ``vllm`` (``--vllm``, where installed): :class:`VLLMGenerationBackend`;
- the FLOP limit: a ``(batch, hidden) @ (hidden, 4·hidden)``-sized matmul in the compute dtype,
  timed on this machine with the same threads, divided by the model's matmul FLOPs per token
  (2 × the parameters of its linear layers, lm_head included; attention adds < 3% at these lengths).

Each contender gets one untimed call, then ``--repeats`` timed calls, interleaved; medians are
reported. tokens/s = generated tokens / wall time of one call. The machine's load average is
printed before and after: on a shared machine, compare only numbers taken at similar load.

    python benchmarks/generation.py                              # SmolLM2, 64 sequences x 32 tokens
    python benchmarks/generation.py --batch-sizes 64,256 --repeats 5
    python benchmarks/generation.py --models smollm2,gemma3
    python benchmarks/generation.py --models tiny --precision fp32
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


PACKAGED = {"smollm2": "packaged:smollm2-135m-instruct", "gemma3": "packaged:gemma3-270m"}


def load(name: str, precision: str):
    """``(model, tokenizer, prompts, precision)``: rlplane's policy for ``name`` and distinct prompts."""
    import numpy as np

    from rlplane.data.arithmetic import ArithmeticSpec, draw_problem
    from rlplane.models import load_policy
    from rlplane.models.precision import apply_precision

    rng = np.random.default_rng(0)
    problems = [draw_problem(rng,
                             ArithmeticSpec(operators=("+",), operand_min=0, operand_max=99))[0] for _ in range(256)]
    if name == "tiny":
        model, tok = load_policy("embedded:tiny-llama", model_kwargs=dict(hidden_size=128, num_layers=2, num_heads=4,
                                                                         intermediate_size=256))
        prompts = [tok(p)["input_ids"] for p in problems]
    else:
        model, tok = load_policy(PACKAGED[name])
        questions = [f"What is {p[:-1]}? Think step by step, then give the answer." for p in problems]
        if tok.chat_template:
            prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False) for q in questions]
        else:  # a base model: the data.prompt.processor=base text
            prompts = [tok(f"Question: {q}\nAnswer:")["input_ids"] for q in questions]
    chosen = apply_precision(model, precision)
    return model, tok, prompts, chosen


def matmul_flops_per_token(model) -> float:
    """2 × parameters of every ``nn.Linear`` (lm_head included, tied or not): one multiply-add each."""
    import torch

    return 2.0 * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def measured_gflops(rows: int, hidden: int, dtype, seconds: float = 0.5) -> float:
    """GFLOP/s of a decode-shaped ``(rows, hidden) @ (hidden, 4·hidden)`` matmul (median of timed repeats)."""
    import torch

    a, b = torch.randn(rows, hidden).to(dtype), torch.randn(hidden, 4 * hidden).to(dtype)
    for _ in range(3):
        a @ b
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * rows * hidden * 4 * hidden / statistics.median(times) / 1e9


class ModelGenerate:
    """transformers' ``model.generate`` with rlplane's interface: left-padded batch, eos ignored."""

    def __init__(self, model, tok, dtype):
        import copy

        from rlplane.models.precision import set_precision

        self.model = copy.deepcopy(model)
        set_precision(self.model, "fp32")  # a plain transformers model: no rlplane autocast, plain lm_head
        self.model = self.model.to(dtype).eval()
        self.tok = tok

    def generate(self, prompts, *, max_new_tokens, seed, **_):
        import torch

        pad = self.tok.pad_token_id
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, pad_token_id=pad,
            )
        return out[:, width:].tolist()


def run(name: str, args) -> list[dict]:
    import torch

    from rlplane.generation import HFGenerationBackend

    torch.set_num_threads(args.threads)
    model, tok, prompts, precision = load(name, args.precision)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    rl = HFGenerationBackend(model, tok, decode=args.decode)
    contenders = {"rlplane": lambda p, seed: rl.generate(p, max_new_tokens=args.max_new_tokens, temperature=1.0,
                                                          stop_token_ids=[], seed=seed).output_ids}
    if not args.skip_generate:
        mg = ModelGenerate(model, tok, dtype)
        contenders["model.generate"] = lambda p, seed: mg.generate(p, max_new_tokens=args.max_new_tokens, seed=seed)
    if args.vllm:
        from rlplane.generation.vllm_backend import VLLMGenerationBackend, vllm_available

        if not vllm_available():
            sys.exit("--vllm: vllm is not installed in this Python; see docs/vllm.md for the vllm venv")
        vl = VLLMGenerationBackend(model, tok, max_model_len=512, max_num_seqs=max(args.batch_sizes))
        contenders["vllm"] = lambda p, seed: vl.generate(p, max_new_tokens=args.max_new_tokens, temperature=1.0,
                                                          stop_token_ids=[], seed=seed).output_ids
    flops_per_token = matmul_flops_per_token(model)
    rows = []
    for batch in args.batch_sizes:
        n_prompts = max(1, batch // args.group_size)
        batch_prompts = [prompts[i % len(prompts)] for i in range(n_prompts) for _ in range(args.group_size)][:batch]
        tokens = len(batch_prompts) * args.max_new_tokens
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for rep in range(args.repeats + 1):
            for key, gen in contenders.items():
                t0 = time.perf_counter()
                out = gen(batch_prompts, rep)
                elapsed = time.perf_counter() - t0
                assert sum(len(o) for o in out) == tokens, (key, sum(len(o) for o in out))
                if rep:  # the first call warms up (allocations, kernel selection)
                    times[key].append(elapsed)
        gflops = measured_gflops(len(batch_prompts), model.config.hidden_size, dtype)
        row = {"model": name, "precision": precision, "decode": rl.last_decode, "batch": len(batch_prompts),
               "tokens": tokens,
               "prompt_len": statistics.mean(len(p) for p in batch_prompts), "gflops": gflops,
               "limit_tok_s": gflops * 1e9 / flops_per_token}
        for key, ts in times.items():
            row[key] = tokens / statistics.median(ts)
            row[key + "_all"] = [tokens / t for t in ts]
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2", help="comma list of: smollm2, gemma3, tiny")
    ap.add_argument("--batch-sizes", default="64", help="comma list: sequences per generate "
                                                        "call (GRPO: prompts × group)")
    ap.add_argument("--group-size", type=int, default=8, help="each distinct prompt is repeated this many times")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"], help="policy.precision")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads "
                                                                                      "(default: all cores)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per contender (after one warm-up call)")
    ap.add_argument("--decode", default="auto", choices=["auto", "hf", "fused"],
                    help="rlplane's forward: the fused one where it applies (auto), or the model's own (hf)")
    ap.add_argument("--skip-generate", action="store_true", help="time rlplane only (no model.generate)")
    ap.add_argument("--vllm", action="store_true", help="also time the vllm backend (its venv: docs/vllm.md)")
    args = ap.parse_args()
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cpus)  "
          f"threads={args.threads}  max_new_tokens={args.max_new_tokens} (eos ignored: equal work)  "
          f"group_size={args.group_size}  repeats={args.repeats} (median)  temperature=1.0", flush=True)
    ratios = []
    for name in args.models.split(","):
        for row in run(name, args):
            line = (f"{row['model']} {row['precision']} batch {row['batch']} (prompt {row['prompt_len']:.0f} tokens): "
                    f"rlplane ({row['decode']} decode) {row['rlplane']:.0f} tok/s")
            if "model.generate" in row:
                line += f", model.generate {row['model.generate']:.0f} tok/s"
                ratios.append(row["rlplane"] / row["model.generate"])
            if "vllm" in row:
                line += f", vllm {row['vllm']:.0f} tok/s"
            line += (f", FLOP limit {row['limit_tok_s']:.0f} tok/s ({row['gflops']:.0f} GFLOP/s matmul; "
                     f"rlplane at {row['rlplane'] / row['limit_tok_s']:.0%})")
            print(line, flush=True)
            print("  every timed call, tok/s: " + "; ".join(
                f"{k[:-4]} {' '.join(f'{x:.0f}' for x in row[k])}" for k in row if k.endswith("_all")), flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    if ratios:
        if len(ratios) > 1:
            print(f"(geometric mean of {len(ratios)} ratios: {', '.join(f'{r:.2f}' for r in ratios)})")
        print(f"ratio rlplane / model.generate: {math.exp(statistics.mean(math.log(r) for r in ratios)):.2f}")


if __name__ == "__main__":
    main()
