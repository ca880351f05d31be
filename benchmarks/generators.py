"""Rollout throughput with 1 vs 2 generators (``policy.generation.num_generators``) under Ray.

The same GRPO rollout (the same prompts, group size, weights and per-sample seeds, so the same
samples: tests/functional/test_generators.py) is run by N rollout actors through the session's
:class:`~rlplane.training.generators.Generators`, which spreads the prompt groups across them and
waits for all; each writes its samples to the ``ray`` data plane. The cores are shared fairly:
with N generators each gets ``cores // N`` torch threads (``policy.threads_per_worker``), so the
comparison is one engine on all cores against N engines on a share each.

One untimed rollout per setting, then ``--repeats`` timed ones, interleaved; medians reported.
samples/s = prompts × group size / wall time of one rollout (generation, environment scoring and
the data-plane write included). The load average is printed: on a shared machine, compare only
numbers taken at similar load.

    python benchmarks/generators.py                       # tiny model, 32 prompts x 8 samples x 16 tokens
    python benchmarks/generators.py --model packaged:smollm2-135m-instruct --prompts 16 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def build(num_generators: int, args, data_plane, weights):
    """N rollout actors with the policy's weights, as the session builds them."""
    from rlplane.config.loading import load_config
    from rlplane.runtime.groups import make_group
    from rlplane.training.generators import Generators
    from rlplane.training.plan import RAY_CPUS, rollout_options
    from rlplane.workers.environments import EnvBlock
    from rlplane.workers.rollout import RolloutWorker

    cfg = config(args, num_generators, load_config)
    group = make_group("ray", RolloutWorker, [dict(options=rollout_options(cfg), env=EnvBlock(cfg.env),
                                                   data_plane=data_plane, seed=cfg.loop.seed + j)
                                              for j in range(num_generators)], num_cpus=RAY_CPUS["generator"])
    gens = Generators(group)
    gens.update_weights(weights)
    return gens


def config(args, num_generators: int, load_config):
    threads = max(1, args.cores // num_generators)
    return load_config(None, [
        "runtime=ray", "data_plane.backend=ray", f"policy.model_name={args.model}",
        f"grpo.num_prompts_per_step={args.prompts}", f"grpo.num_generations_per_prompt={args.group}",
        f"policy.train_global_batch_size={args.prompts * args.group}", "policy.train_micro_batch_size=8",
        f"policy.generation.max_new_tokens={args.max_new_tokens}", f"policy.max_total_sequence_length={args.max_len}",
        f"policy.generation.num_generators={num_generators}", f"policy.threads_per_worker={threads}",
    ])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="embedded:tiny-llama")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores shared by the generators")
    args = p.parse_args()

    from rlplane.config.loading import load_config
    from rlplane.dataplane import make_data_plane
    from rlplane.datasets import build_datasets
    from rlplane.models.configured import load_configured_policy
    from rlplane.runtime.groups import init_ray
    from rlplane.training.rollouts import TRAIN_PARTITION

    init_ray(num_cpus=args.cores)
    cfg = config(args, 1, load_config)
    model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    datums = next(loader)  # the same prompts for every setting
    import ray

    weights = ray.put({k: v.detach().clone() for k, v in model.state_dict().items()})
    dp = make_data_plane("ray")
    samples = args.prompts * args.group
    settings = {n: build(n, args, dp, weights) for n in (1, 2)}
    times: dict[int, list[float]] = {n: [] for n in settings}
    print(f"model {args.model}: {args.prompts} prompts x {args.group} samples x <= {args.max_new_tokens} new tokens, "
          f"{args.cores} cores; load average {os.getloadavg()[0]:.2f}", flush=True)
    for rep in range(args.repeats + 1):
        for n, gens in settings.items():
            dp.register_partition(TRAIN_PARTITION, ["input_ids", "token_mask", "generation_logprobs"], samples)
            t0 = time.perf_counter()
            meta, _, _ = gens.rollout(datums, group_size=args.group, partition_id=TRAIN_PARTITION)
            elapsed = time.perf_counter() - t0
            dp.clear_samples(None, TRAIN_PARTITION)
            if rep:  # the first is untimed (warm caches, lazy imports)
                times[n].append(elapsed)
    rate = {n: samples / statistics.median(t) for n, t in times.items()}
    for n in settings:
        print(f"{n} generator(s), {max(1, args.cores // n)} threads each: {rate[n]:.1f} samples/s "
              f"(median of {args.repeats}: {statistics.median(times[n]):.2f} s per rollout)")
    print(f"2 / 1 generators: {rate[2] / rate[1]:.2f}x; load average {os.getloadavg()[0]:.2f}")
    for gens in settings.values():
        gens.close()


if __name__ == "__main__":
    main()
