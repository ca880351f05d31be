"""The policy worker's training step and logprob forward with micro-batches fixed, by token budget
(``policy.dynamic_batching``) and packed (``policy.sequence_packing``), on one fixed batch.

One process; a worker per mode built from the same weights and config (``grpo_smollm2`` where it
exists: SmolLM2-135M-Instruct, 64 samples, micro-batches of 16); the batch has the preset's shape:
prompts of 45-55 tokens and responses of 1 to ``policy.generation.max_new_tokens`` tokens, uniform
(seeded), so padding is what a GRPO step on it pads. The modes run interleaved, round after round, so
load on a shared machine hits them alike; each round is one ``train`` (forward+backward of every
micro-batch, one AdamW step) and one ``compute_logprobs``. Prints the median seconds per mode, the
tokens each computes (padding included) and the ratio to the fixed micro-batches.

    python benchmarks/packing_step.py [--rounds 3] [--config grpo_smollm2] [KEY=VALUE overrides...]

Measured 2026-11-24 (2 cores, load average 8-12 from other jobs, so +-15% noise: packing at the longest
width computes as many tokens as fixed yet timed 0.86x), grpo_smollm2 with 16 samples, micro-batches of 4:
train 42.2 s fixed, 34.4 s dynamic batching (0.81x, 1310 of 1488 tokens), 36.2 s packing (0.86x), 41.4 s
packing rows 256 (0.98x, 1536 tokens); logprobs 12.6 / 8.9 / 10.5 / 12.7 s. On the 64-sample preset batch
the planners compute 6592 tokens fixed, 5491 dynamic (-17%), 6386 packed, 5376 packed rows 256 (-18%),
5012 real: at most ~20% to gain, inside this machine's noise, so both stay off by default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from rlplane.config.loading import load_config  # noqa: E402
from rlplane.dataplane import make_data_plane  # noqa: E402
from rlplane.recipes.grpo import TRAIN_COLUMNS  # noqa: E402
from rlplane.workers.packing import microbatch_planner  # noqa: E402
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker  # noqa: E402

MODES = {
    "fixed": [],
    "dynamic_batching": ["policy.dynamic_batching.enabled=true"],
    "sequence_packing": ["policy.sequence_packing.enabled=true"],
    "sequence_packing rows 256": ["policy.sequence_packing.enabled=true", "policy.sequence_packing.row_tokens=256"],
}


def make_batch(client, n: int, max_new: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(45, 56, (n,), generator=g).tolist()
    responses = torch.randint(1, max_new + 1, (n,), generator=g).tolist()
    lengths = [p + r for p, r in zip(prompts, responses)]
    client.register_partition("train", TRAIN_COLUMNS, n)
    meta = client.put_samples([f"s{i}_g0" for i in range(n)], "train", {
        "input_ids": [torch.randint(10, vocab, (k,), generator=g) for k in lengths],
        "token_mask": [torch.cat([torch.zeros(p), torch.ones(r)]).to(torch.int8) for p, r in zip(prompts, responses)],
        "generation_logprobs": [torch.full((k,), -2.0) for k in lengths],
        "advantages": [torch.full((k,), float(torch.randn(1, generator=g))) for k in lengths]})
    return meta


def computed_tokens(cfg, lengths: torch.Tensor, train: bool, width: int) -> int:
    """Tokens a mode runs through the model, padding included (fixed: every row at the batch's width)."""
    total = 0
    for mb in microbatch_planner(cfg.policy, train)(torch.arange(len(lengths)), lengths):
        if mb.packing is not None:
            total += mb.packing.num_rows * mb.packing.width
        elif cfg.policy.dynamic_batching.enabled:
            total += len(mb.rows) * int(lengths[mb.rows].max())
        else:
            total += len(mb.rows) * width
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (one untimed round first)")
    ap.add_argument("--config", default="grpo_smollm2", help="a preset, or `default` (the embedded model)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    base = [*args.overrides, "checkpointing.enabled=false"]
    workers, metas, cfgs = {}, {}, {}
    init = None
    for name, extra in MODES.items():
        cfg = load_config(None if args.config == "default" else args.config, [*base, *extra])
        w = PolicyWorker(cfg, make_data_plane("memory"), init_state=init)
        init = init if init is not None else {k: v.clone() for k, v in w.model.state_dict().items()}
        metas[name] = make_batch(w.dp, cfg.policy.train_global_batch_size, cfg.policy.generation.max_new_tokens,
                                 len(w.tokenizer))
        workers[name], cfgs[name] = w, cfg
    cfg = cfgs["fixed"]
    lengths = torch.tensor(metas["fixed"].seq_lens)
    width = int(lengths.max())
    print(f"config {args.config} {' '.join(args.overrides)}: {len(lengths)} sequences, {int(lengths.sum())} tokens, "
          f"longest {width}; train micro-batch {cfg.policy.train_micro_batch_size}, logprob batch "
          f"{cfg.policy.logprob_batch_size}; {torch.get_num_threads()} threads; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    times: dict[str, dict[str, list[float]]] = {n: {"train": [], "logprobs": []} for n in MODES}
    for r in range(args.rounds + 1):
        for name, w in workers.items():
            meta = metas[name]
            t0 = time.perf_counter()
            w.compute_logprobs(meta, out_field="prev_logprobs")
            t1 = time.perf_counter()
            w.train(meta, ClippedPGLoss(cfgs[name].loss_fn.options(), reference=False))
            t2 = time.perf_counter()
            if r > 0:
                times[name]["logprobs"].append(t1 - t0)
                times[name]["train"].append(t2 - t1)
            print(f"round {r}{' (untimed)' if r == 0 else ''} {name}: logprobs {t1 - t0:.2f} s, train {t2 - t1:.2f} s "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    ref = {k: statistics.median(v) for k, v in times["fixed"].items()}
    print(f"median of {args.rounds} rounds     train s  (x fixed)  tokens   logprobs s  (x fixed)  tokens")
    for name in MODES:
        med = {k: statistics.median(v) for k, v in times[name].items()}
        print(f"  {name:26s} {med['train']:7.2f}  ({med['train'] / ref['train']:.2f})  "
              f"{computed_tokens(cfgs[name], lengths, True, width):6d}   {med['logprobs']:7.2f}     "
              f"({med['logprobs'] / ref['logprobs']:.2f})  {computed_tokens(cfgs[name], lengths, False, width):6d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
