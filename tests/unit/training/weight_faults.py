"""Weight-sync faults, injected by a test-only wrapper around one generator's generation backend.

``faulty_worker(schedule)`` is a :class:`RolloutWorker` whose generator ``generator`` (told apart by
its seed: the session gives generator j the run's seed + j) wraps its backend in :class:`FaultyBackend`;
``schedule`` maps a refit's index (0: the one at start) to the fault it suffers. Tests put the class in
place of ``rlplane.training.workers.RolloutWorker``; under Ray it travels by value (:func:`ship_to_ray`).
"""

from __future__ import annotations

import sys

import torch

from rlplane.workers.rollout import RolloutWorker

# What each fault does to a refit (or, for "restart", to the generation after it).
KINDS = {
    "skip": "the refit never reaches the engine",
    "wrong": "two tensors of one shape land under each other's names",
    "corrupt": "one tensor loads with noise added",
    "restart": "the engine comes back with fresh weights and no version before its next rollout",
    "lora_twice": "the LoRA update is merged into the base twice",
    "lora_none": "the LoRA update is not merged (the base weights load)",
}
# The refit (counted from the one at start) at which a fault shows: a restart after refit n shows at n + 1.
DETECTED_AFTER = {"restart": 1}
PLAIN, LORA = ["skip", "wrong", "corrupt", "restart"], ["lora_twice", "lora_none"]  # LORA: with policy.lora
# A GRPO run of a few seconds a step on the tiny model, two generators (generator 1 is the faulted one).
SMALL = [
    "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=8", "policy.logprob_batch_size=8", "policy.generation.max_new_tokens=4",
    "grpo.val_at_start=false", "grpo.val_period=0", "grpo.val_at_end=false", "warmup.enabled=false",
    "checkpointing.enabled=false", "logger.progress_bar=false", "logger.tensorboard_enabled=false",
    "policy.generation.num_generators=2",
]
# Split placement under Ray: colocated generators free their weights between steps, so a skipped refit
# leaves one with none and the rollout after it fails (the check has already named it by then).
RUNTIMES = {"local": [], "ray": ["runtime=ray", "data_plane.backend=ray", "policy.generation.colocated.enabled=false"]}


def schedule(kinds: list[str], trials: int = 1, offset: int = 0) -> dict[int, str]:
    """Every trial of every kind at its own refit, ``offset`` + an odd one, a clean refit between two (where a
    restart shows)."""
    return {offset + 2 * (t * len(kinds) + j) + 1: kind for t in range(trials) for j, kind in enumerate(kinds)}


class FaultyBackend:
    """Delegates to ``inner`` except where ``schedule`` (refit index -> fault kind) says otherwise."""

    def __init__(self, inner, schedule: dict[int, str], initial: dict | None = None):
        """``initial``: the fresh weights, where ``inner`` keeps no module of its own (vllm)."""
        self.inner, self.schedule, self.refits = inner, dict(schedule), 0
        if initial is None:
            initial = inner.model.state_dict()
        self.initial = {k: v.detach().clone() for k, v in initial.items()}
        self._restart = False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def update_weights(self, state_dict, version=None):
        kind = self.schedule.get(self.refits)
        self.refits += 1
        if kind == "skip":
            return None
        if kind == "restart":
            self._restart = True
        return self.inner.update_weights(self._faulted(dict(state_dict), kind), version)

    def _faulted(self, sd: dict, kind: str | None) -> dict:
        if kind == "wrong":
            a, b = [k for k, v in sd.items() if v.shape == sd[_first_matrix(sd)].shape][:2]
            sd[a], sd[b] = sd[b], sd[a]
        elif kind == "corrupt":
            k = _first_matrix(sd)
            sd[k] = sd[k] + 1e-3 * torch.randn(sd[k].shape, generator=torch.Generator().manual_seed(0))
        elif kind in ("lora_twice", "lora_none"):
            if all(torch.equal(v, self.initial[k]) for k, v in sd.items() if k in self.initial):
                # Δ = 0 (an adapter that never trained): the fault would change nothing, the trial would mean nothing
                raise AssertionError(f"{kind}: the sent weights equal the base's, the LoRA adapter has not trained")
            if kind == "lora_twice":  # W + 2Δ, Δ = sent - base (the base is frozen: the fresh weights)
                sd = {k: 2 * v - self.initial[k] if k in self.initial else v for k, v in sd.items()}
            else:
                sd = {k: self.initial.get(k, v) for k, v in sd.items()}
        return sd

    def generate(self, *args, **kwargs):
        if self._restart and not kwargs.get("greedy"):  # the first rollout after the refit, not its probe
            self._restart = False
            if hasattr(self.inner, "model"):
                self.inner.model.load_state_dict(self.initial)
            else:  # a fresh engine: its own weights, no refit on record
                self.inner._load_weights(self.initial)
            self.inner._swap.version = None
        return self.inner.generate(*args, **kwargs)


def _first_matrix(sd: dict) -> str:
    return next(k for k, v in sd.items() if v.dim() == 2 and "embed" not in k and "lm_head" not in k)


class OddFirstDigit:
    """Reward 1 when the response starts with an odd digit: rewards vary even from random weights, so the
    policy (and a LoRA adapter) trains."""

    def step(self, message_logs, metadata):
        from rlplane.envs import EnvironmentReturn, last_assistant_content

        texts = [last_assistant_content(m) for m in message_logs]
        rewards = torch.tensor([float(t[:1] in "13579" and t[:1] != "") for t in texts])
        n = len(texts)
        return EnvironmentReturn([{}] * n, [None] * n, [None] * n, rewards, torch.ones(n, dtype=torch.bool), None)


def faulty_worker(schedule: dict[int, str], generator: int = 1, varied_rewards: bool = False) -> type:
    """A rollout worker class whose generator ``generator`` suffers ``schedule``; ``varied_rewards`` scores
    the arithmetic task with :class:`OddFirstDigit` in every generator's process and in this one (whose
    registry the environment actors of ``runtime: ray`` get; the test session restores it after each test)."""
    if varied_rewards:
        from rlplane.envs import register_env

        register_env("arithmetic", OddFirstDigit)

    class FaultyRolloutWorker(RolloutWorker):
        def __init__(self, options, env, data_plane, model=None, tokenizer=None, seed=0, shared_paths=None):
            if varied_rewards:
                from rlplane.envs import register_env

                register_env("arithmetic", OddFirstDigit)
            super().__init__(options, env, data_plane, model, tokenizer, seed, shared_paths)
            if seed == options.seed + generator:
                initial = None
                if not hasattr(self.backend, "model"):  # the fresh weights it was built from (the same seed)
                    from rlplane.models.configured import load_configured_policy

                    initial = load_configured_policy(options.policy, options.seed)[0].state_dict()
                self.backend = FaultyBackend(self.backend, schedule, initial)

    return FaultyRolloutWorker


def ship_to_ray() -> None:
    """Ray actors get this module's classes by value (the tests directory is not on their path)."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
