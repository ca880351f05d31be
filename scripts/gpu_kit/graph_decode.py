"""The CUDA-graph decode against ``model.generate`` (check.sh part graph_decode).

On a model of SmolLM2-135M's shape with random weights (``parts._smollm2_dir``: 30 layers from a LlamaConfig,
rlplane's char tokenizer), bf16 where the GPU has it, for each batch size: tokens/s of rlplane's ``hf`` backend
with the CUDA-graph decoder (``hf_decode: graph``), with the fused decoder without graphs (``fused``) and of
transformers' ``model.generate`` on a plain copy in the same dtype; every row samples 128 tokens (temperature 1,
no stop token), the median of 3 calls after a first one (where the graphs are captured: its time is reported
apart). Without a GPU: 8 rows x 8 tokens and the graph decoder's step run eagerly (a check of the kit).

    python scripts/gpu_kit/graph_decode.py WORK_DIR ["64 256"]
"""

from __future__ import annotations

import copy
import statistics
import sys
import time

import torch
from parts import CUDA, DEVICE, _emit, _peak_mib, _smollm2_dir

NEW_TOKENS = 128 if CUDA else 8
REPS = 3


def _sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def _measure(fn) -> dict:
    """Seconds of a first call, then the median of REPS calls; tokens/s from the median."""
    _sync()
    t = time.perf_counter()
    tokens = fn(0)
    _sync()
    first = time.perf_counter() - t
    times = []
    for rep in range(1, REPS + 1):
        t = time.perf_counter()
        tokens = fn(rep)
        _sync()
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    return {"tokens": tokens, "first_call_s": round(first, 4), "median_s": round(median, 4),
            "tokens_per_s": round(tokens / median, 1)}


def compare(model, tok, precision: str, batch: int) -> dict:
    from rlplane.generation import HFGenerationBackend
    from rlplane.models.precision import set_precision

    prompts = [tok(f"{a}+{a + 7}=")["input_ids"] for a in range(batch // 8) for _ in range(8)]
    result = {"batch": batch, "max_new_tokens": NEW_TOKENS, "precision": precision}
    for decode in ("graph", "fused"):
        backend = HFGenerationBackend(model, tok, decode=decode)

        def ours(seed, backend=backend):
            out = backend.generate(prompts, max_new_tokens=NEW_TOKENS, temperature=1.0, stop_token_ids=[], seed=seed)
            return sum(len(o) for o in out.output_ids)

        try:
            result[f"rlplane_{decode}"] = {**_measure(ours), "decode": backend.last_decode}
            if backend._static is not None:
                result[f"rlplane_{decode}"]["graphs_captured"] = backend._static.captures
        except Exception as e:  # one contender failing still reports the others
            result[f"rlplane_{decode}"] = {"error": f"{type(e).__name__}: {e}"[:600]}
        del backend
    plain = copy.deepcopy(model)
    set_precision(plain, "fp32")
    plain = plain.to(torch.bfloat16 if precision == "bf16" else torch.float32)
    pad = tok.pad_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=DEVICE)
    mask = (ids != pad).long()

    def theirs(seed):
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = plain.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=pad)
        return out[:, width:].numel()

    try:
        result["model_generate"] = _measure(theirs)
    except Exception as e:
        result["model_generate"] = {"error": f"{type(e).__name__}: {e}"[:600]}
    rate = {k: result[k].get("tokens_per_s") for k in ("rlplane_graph", "rlplane_fused", "model_generate")}
    if rate["rlplane_graph"] and rate["model_generate"]:
        result["graph_vs_model_generate"] = round(rate["rlplane_graph"] / rate["model_generate"], 2)
    if rate["rlplane_graph"] and rate["rlplane_fused"]:
        result["graph_vs_fused"] = round(rate["rlplane_graph"] / rate["rlplane_fused"], 2)
    return result


def main(work: str, batches: str = "64 256") -> None:
    from transformers import AutoModelForCausalLM

    from rlplane.models.precision import apply_precision
    from rlplane.models.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(_smollm2_dir(work)).to(DEVICE).eval()
    precision = apply_precision(model, "auto")
    sizes = [int(b) for b in batches.split()] if CUDA else [8]
    results = []
    for batch in sizes:
        results.append(compare(model, tok, precision, batch))
        print(results[-1], flush=True)
    _emit({"model": "SmolLM2-135M shape, random weights" + ("" if CUDA else " (2 layers on CPU; graph step eager)"),
           "results": results, "peak_memory_mib": _peak_mib()})
    failed = [r for r in results for k in ("rlplane_graph", "model_generate") if "error" in r[k]]
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main(*sys.argv[1:])
